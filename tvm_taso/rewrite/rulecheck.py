"""Numeric check of a rule on a model where it applies: every site is rewritten and the
result compared with the original on random inputs, using the numpy reference semantics of
:mod:`tvm_taso.ir.ops`."""

from __future__ import annotations

import numpy as np

from tvm_taso.ir.graph import Graph
from tvm_taso.ir.relax_bridge import block_graphs
from tvm_taso.numerics import TOLERANCE, relative_error
from tvm_taso.rewrite import match
from tvm_taso.rewrite.rule import Rule


def compare(before: Graph, after: Graph, trials: int = 3, seed: int = 0) -> float:
    """Largest relative difference of the two graphs' outputs over random inputs (the graphs
    must share their input nodes, as a graph and its rewrite do)."""
    rng = np.random.default_rng(seed)
    worst = 0.0
    inputs = [nid for nid, n in before.nodes.items() if n.op == "input"]
    for _ in range(trials):
        feeds = {nid: rng.standard_normal(before.nodes[nid].types[0].shape) for nid in inputs}
        a, b = before.evaluate(feeds), after.evaluate(feeds)
        worst = max(worst, relative_error([a[r] for r in before.outputs], [b[r] for r in after.outputs]))
    return worst


def check_rule(rule: Rule, mod_or_graph, trials: int = 3, seed: int = 0) -> list[dict]:
    """One result per site of ``rule`` in the model: ``{"site", "max_relative_error", "ok"}``."""
    graphs = [mod_or_graph] if isinstance(mod_or_graph, Graph) else block_graphs(mod_or_graph)
    results = []
    for g in graphs:
        for site in match.find_matches(g, rule):
            new = match.apply(g, site)
            if new is None:
                continue
            err = compare(g, new, trials, seed)
            results.append({"site": list(site.roots), "max_relative_error": err, "ok": err <= TOLERANCE})
    return results
