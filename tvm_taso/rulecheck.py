"""Numeric check of a rule on a model where it applies: every site is rewritten and the
result compared with the original on random inputs, using the numpy reference semantics of
:mod:`tvm_taso.ops`."""

from __future__ import annotations

from collections import Counter

import numpy as np

from . import match
from .graph import Graph
from .relax_bridge import BlockGraph
from .rule import Rule

TOLERANCE = 1e-4


def graphs_of(mod) -> list[Graph]:
    """The graphs of the dataflow blocks of every Relax function in ``mod``."""
    from tvm import relax

    graphs = []
    for _, func in mod.functions.items():
        if isinstance(func, relax.Function) and isinstance(func.body, relax.SeqExpr):
            for block in func.body.blocks:
                if isinstance(block, relax.DataflowBlock):
                    graphs.append(BlockGraph(block, Counter()).graph)
    return graphs


def compare(before: Graph, after: Graph, trials: int = 3, seed: int = 0) -> float:
    """Largest relative difference of the two graphs' outputs over random inputs (the graphs
    must share their input nodes, as a graph and its rewrite do)."""
    rng = np.random.default_rng(seed)
    worst = 0.0
    inputs = [nid for nid, n in before.nodes.items() if n.op == "input"]
    for _ in range(trials):
        feeds = {nid: rng.standard_normal(before.nodes[nid].types[0].shape) for nid in inputs}
        a, b = before.evaluate(feeds), after.evaluate(feeds)
        for ra, rb in zip(before.outputs, after.outputs):
            x, y = np.asarray(a[ra], np.float64), np.asarray(b[rb], np.float64)
            worst = max(worst, float(np.abs(x - y).max() / (np.abs(x).max() + 1e-30)))
    return worst


def check_rule(rule: Rule, mod_or_graph, trials: int = 3, seed: int = 0) -> list[dict]:
    """One result per site of ``rule`` in the model: ``{"site", "max_relative_error", "ok"}``."""
    graphs = [mod_or_graph] if isinstance(mod_or_graph, Graph) else graphs_of(mod_or_graph)
    results = []
    for g in graphs:
        for site in match.find_matches(g, rule):
            new = match.apply(g, site)
            if new is None:
                continue
            err = compare(g, new, trials, seed)
            results.append({"site": list(site.roots), "max_relative_error": err, "ok": err <= TOLERANCE})
    return results
