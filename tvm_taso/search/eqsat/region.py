"""One region searched by equality saturation: :class:`EqsatRegion` (the
:class:`~tvm_taso.search.regions.RegionSearch` of ``search="eqsat"`` and ``"auto"``): the region
loaded into an e-graph (:func:`load`), saturated (:class:`.runner.Runner`), the cheapest graph
extracted (:mod:`.extract`), refined by a few steps of backtracking, kept if cheaper."""

from __future__ import annotations

import logging
import time

from tvm_taso.cost.model import CostModel
from tvm_taso.ir.graph import LEAVES, Graph
from tvm_taso.rewrite.rule import Rule
from tvm_taso.search import backtrack
from tvm_taso.search.eqsat.egraph import MISSING, EGraph, available
from tvm_taso.search.eqsat.extract import Extractor
from tvm_taso.search.eqsat.runner import RuleSet, Runner
from tvm_taso.search.options import SearchOptions
from tvm_taso.search.regions import Found
from tvm_taso.search.stats import SearchStats, Stop

log = logging.getLogger(__name__)

AUTO_BOTH_OPS = 12


def require_egglog() -> None:
    if not available():
        raise ImportError(MISSING)


def load(eg: EGraph, sub: Graph) -> tuple[list[int], dict]:
    """Add ``sub`` to the e-graph; its output classes and, per class, the e-node ``sub`` uses."""
    ref: dict = {}
    tuples: dict[int, int] = {}
    for nid in sub.topo_order():
        node = sub.nodes[nid]
        if node.op in LEAVES:
            ref[(nid, 0)] = eg.add_leaf(node.op, node.types[0], node.payload, node.attr["key"], nid)
            continue
        children = []
        for src, i in node.inputs:
            if (src, i) not in ref:
                ref[(src, i)] = eg.add_get(tuples[src], i, sub.nodes[src].types[i])
            children.append(ref[(src, i)])
        cid = eg.add_node(eg.op_key(node.op, node.attrs), tuple(children), node.types)
        eg.node_ids.setdefault(cid, nid)
        if len(node.types) == 1:
            ref[(nid, 0)] = cid
        else:
            tuples[nid] = cid
    for src, i in sub.outputs:
        if (src, i) not in ref:
            ref[(src, i)] = eg.add_get(tuples[src], i, sub.nodes[src].types[i])
    eg.mark_loaded()
    view = eg.commit()
    roots = [view.find(ref[r]) for r in sub.outputs]
    original: dict = {}
    for enode, cid in view.class_of.items():
        original[cid] = enode  # the loaded graph has one e-node per class
    return roots, original


class EqsatRegion:
    """Equality saturation as the :class:`~tvm_taso.search.regions.RegionSearch` of every region,
    within ``options.eqsat``; with ``options.kind == "auto"``, backtracking too on small regions."""

    def __init__(self, rules: list[Rule], cost: CostModel, options: SearchOptions):
        require_egglog()
        self.rules, self.cost, self.options = rules, cost, options
        self.rule_set = RuleSet.of(rules)
        self.limits = options.eqsat
        self.auto = options.kind == "auto"
        self.kernel_memo: dict = {}

    def __call__(self, sub: Graph, deadline: float, stats: SearchStats):
        start = time.perf_counter()
        with EGraph(self.rule_set.matching()) as eg:
            return self._search(eg, sub, deadline, stats, start)

    def _search(self, eg: EGraph, sub: Graph, deadline: float, stats: SearchStats, start: float) -> Found:
        start_cost = self.cost.cost(sub)
        roots, original = load(eg, sub)
        creator: dict = {}
        # each rule application's targets, only for the extraction search that moves by them
        sites: list | None = [] if self.limits.search_tries else None
        sat_deadline = start + (deadline - start) * (1 - self.limits.extraction_share)
        run = Runner(eg, self.rule_set, self.limits).run(sat_deadline, creator, original, sites)
        view = eg.view
        stats.stop(run.stop)
        stats.regions_cut_short += run.stop is Stop.DEADLINE
        stats.engines["eqsat"] += 1
        stats.eqsat.add_run(run)
        found = Extractor(eg, view, sub, roots, self.cost, creator=creator, original=original,
                          kernel_memo=self.kernel_memo, sites=sites or ()).run(
            max(deadline, time.perf_counter() + 0.05), self.limits.ilp, self.limits.improve_tries,
            self.limits.search_tries, self.options.alpha
        )
        stats.eqsat.extraction_seconds += found.seconds
        stats.eqsat.extraction_methods[found.method] += 1
        log.debug("eqsat region: %d e-nodes, %d classes, %s after %d rounds, %s extraction %.3f s: %.2f -> %.2f",
                  view.size, len(view.classes), run.stop.value, run.rounds, found.method, found.seconds, start_cost, found.cost)
        best, best_cost, path = sub, start_cost, ()
        if found.cost < start_cost - 1e-9:
            best, best_cost, path = found.graph, found.cost, found.rules or ("eqsat",)
            stats.curve.append((time.perf_counter(), best_cost - start_cost))
        if self.limits.refine_budget:
            # extraction chose on per-e-node prices and a bounded local search; a few steps of
            # backtracking from its graph, priced by the real (fusion-aware) model, find the
            # rewrites that pay only through fusion, or only after a step extraction missed
            starts = [(best, best_cost, path)] + [(g, c, r or ("eqsat",)) for g, c, r in found.others
                                                  if c < start_cost - 1e-9]
            refined_better = False
            for graph, graph_cost, graph_path in starts:
                scratch = SearchStats()
                refined = backtrack.search_region(graph, self.rules, self.cost,
                                                  max(deadline, time.perf_counter() + 0.05), scratch,
                                                  alpha=self.options.alpha, budget=self.limits.refine_budget,
                                                  patience=self.limits.refine_budget)
                stats.expanded += scratch.expanded
                stats.candidates += scratch.candidates
                if refined[1] < graph_cost - 1e-9:
                    graph, graph_cost, graph_path = refined[0], refined[1], graph_path + refined[2]
                    refined_better |= graph_cost < best_cost - 1e-9
                if graph_cost < best_cost - 1e-9:
                    stats.curve.append((time.perf_counter(), graph_cost - best_cost))
                    best, best_cost, path = graph, graph_cost, graph_path
            stats.eqsat.refined += refined_better
        if self.auto and backtrack.runtime_ops(sub) <= AUTO_BOTH_OPS:
            stats.engines["backtrack"] += 1
            other = backtrack.Backtrack(self.rules, self.cost, self.options)(
                sub, max(deadline, time.perf_counter() + 0.05), stats)
            if other[1] < best_cost - 1e-9:
                best, best_cost, path = other
        return Found(best, best_cost, path)
