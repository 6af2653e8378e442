"""Equality saturation (TENSAT's search) on the same rules and cost model, region by region.

Each region (the backtracking search's regions, :func:`tvm_taso.search.backtrack.regions`)
becomes an e-graph in egglog (:mod:`.egraph`). Every round matches all rules on a snapshot
(:mod:`.ematch`: single-output rules every round, multi-output rules -- which grow the e-graph
fastest -- in the first ``multi_rounds`` rounds only, as TENSAT does), adds their targets and
unions in one batch, and stops when nothing changes (``saturated``) or at the node limit, the
round limit or the deadline. The cheapest acyclic graph under the real cost model is then
extracted (:mod:`.extract`) and kept only if it costs less than the region did.

Design: Python drives the e-graph. The rule language computes attributes and checks shapes
(``dim``, ``rank``, ``shape``), which egglog rules could only do with a shape analysis encoded in
egglog; instead egglog keeps the e-nodes, union-find and congruence closure, and Python matches
the same :class:`Rule` data on each round's snapshot. Measured here (2 shared cores): Python
e-matching is most of the time (about 60% on the quick SqueezeNet), then egglog's per-command
cost (each added e-node or union is one top-level action, compiled as a rule: 0.3-0.5 ms),
then extraction. At most ``match_limit`` sites per rule and round may change the e-graph,
so one exploding rule (pairwise merges) does not starve the others (egg's backoff, simplified).

``search="auto"`` runs eqsat on every region and, on regions of at most ``AUTO_BOTH_OPS`` ops
(where backtracking is cheap), backtracking too, keeping the cheaper graph.
"""

from __future__ import annotations

import logging
import time
from dataclasses import dataclass

from tvm_taso.cost.model import CostModel
from tvm_taso.ir.graph import LEAVES, Graph
from tvm_taso.rewrite.rule import Rule
from tvm_taso.search import backtrack
from tvm_taso.search.backtrack import SearchStats
from tvm_taso.search.egraph import EGraph, available, MISSING
from tvm_taso.search.ematch import Applier, Matcher
from tvm_taso.search.extract import Extractor

log = logging.getLogger(__name__)

SEARCHES = ("backtrack", "eqsat", "auto")
AUTO_BOTH_OPS = 12


@dataclass
class EqsatLimits:
    node_limit: int = 2000  # e-nodes per region
    rounds: int = 6  # matching rounds per region
    multi_rounds: int = 3  # rounds in which multi-output rules run
    match_limit: int = 24  # sites applied per rule and round
    extraction_share: float = 0.3  # of the region's time left for extraction
    ilp: bool = False  # TENSAT's ILP candidate (slow in HiGHS beyond a few hundred e-nodes)


def require_egglog() -> None:
    if not available():
        raise ImportError(MISSING)


def _load(eg: EGraph, sub: Graph) -> tuple[list[int], dict]:
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
        if len(node.types) == 1:
            ref[(nid, 0)] = cid
        else:
            tuples[nid] = cid
    for src, i in sub.outputs:
        if (src, i) not in ref:
            ref[(src, i)] = eg.add_get(tuples[src], i, sub.nodes[src].types[i])
    view = eg.commit()
    roots = [view.find(ref[r]) for r in sub.outputs]
    original: dict = {}
    for enode, cid in view.class_of.items():
        original[cid] = enode  # the loaded graph has one e-node per class
    return roots, original


def saturate(eg: EGraph, rules: list[Rule], limits: EqsatLimits, deadline: float, creator: dict) -> tuple[str, int]:
    """Run the rules to saturation or a limit; (why it stopped, rounds run)."""
    single = [r for r in rules if len(r.src) == 1]
    multi = [r for r in rules if len(r.src) > 1]
    view = eg.view
    attribute_memo: dict = {}
    for k in range(limits.rounds):
        matcher = Matcher(eg, view, attribute_memo)
        applier = Applier(eg, view, matcher.shapes, creator)
        cut = False  # a rule's sites were left for a later round (limit or deadline)
        for rule in single + (multi if k < limits.multi_rounds else []):
            if time.perf_counter() > deadline or view.size + eg.pending > limits.node_limit:
                cut = True
                break
            if any(op not in view.by_op for op in rule.root_ops):
                continue
            applied = 0
            for roots, env in matcher.matches(rule):
                # at most match_limit changing sites per rule and round (egg's backoff,
                # simplified), so that one exploding rule (parallel merges) does not starve the rest
                if applied >= limits.match_limit or view.size + eg.pending > limits.node_limit:
                    cut = True
                    break
                before = applier.changes
                applier.apply(rule, roots, env)
                applied += applier.changes > before
        if applier.changes == 0 and not cut:
            return "saturated", k + 1
        view = eg.commit()
        if view.size >= limits.node_limit:
            return "node limit", k + 1
        if time.perf_counter() > deadline:
            return "deadline", k + 1
    return "round limit", limits.rounds


class EqsatRegion:
    """The region search for :func:`tvm_taso.search.backtrack.search`'s ``region_search``."""

    def __init__(self, rules: list[Rule], cost: CostModel, limits: EqsatLimits | None = None,
                 auto: bool = False, alpha: float = 1.05, budget: int = 200, patience: int = 64):
        require_egglog()
        self.rules, self.cost = rules, cost
        self.limits = limits or EqsatLimits()
        self.auto, self.alpha, self.budget, self.patience = auto, alpha, budget, patience
        self.kernel_memo: dict = {}

    def __call__(self, sub: Graph, deadline: float, stats: SearchStats):
        start = time.perf_counter()
        start_cost = self.cost.cost(sub)
        eg = EGraph()
        roots, original = _load(eg, sub)
        creator: dict = {}
        sat_deadline = start + (deadline - start) * (1 - self.limits.extraction_share)
        why, rounds = saturate(eg, self.rules, self.limits, sat_deadline, creator)
        view = eg.view
        stats.stopped[why] += 1
        stats.regions_cut_short += why == "deadline"
        stats.engines["eqsat"] += 1
        stats.egraph_nodes = max(stats.egraph_nodes, view.size)
        stats.egraph_classes = max(stats.egraph_classes, len(view.classes))
        found = Extractor(eg, view, sub, roots, self.cost, creator, original, self.kernel_memo).run(
            max(deadline, time.perf_counter() + 0.05), self.limits.ilp
        )
        stats.extraction_seconds += found.seconds
        stats.extraction_methods[found.method] += 1
        log.debug("eqsat region: %d e-nodes, %d classes, %s after %d rounds, %s extraction %.3f s: %.2f -> %.2f",
                  view.size, len(view.classes), why, rounds, found.method, found.seconds, start_cost, found.cost)
        best, best_cost, path = sub, start_cost, ()
        if found.cost < start_cost - 1e-9:
            best, best_cost, path = found.graph, found.cost, found.rules or ("eqsat",)
            stats.curve.append((time.perf_counter(), best_cost - start_cost))
        if self.auto and backtrack.runtime_ops(sub) <= AUTO_BOTH_OPS:
            stats.engines["backtrack"] += 1
            other = backtrack.search_region(sub, self.rules, self.cost, self.alpha, self.budget,
                                            max(deadline, time.perf_counter() + 0.05), stats, self.patience)
            if other[1] < best_cost - 1e-9:
                best, best_cost, path = other
        return best, best_cost, path


# The search ``optimize`` asked for, so that the block and ONNX drivers, which call
# :func:`search` with backtracking's arguments, need not pass it along.
def check_search(kind: str) -> None:
    """ValueError for an unknown search; ImportError when eqsat is asked for without egglog."""
    if kind not in SEARCHES:
        raise ValueError(f"search must be one of {', '.join(SEARCHES)}, got {kind!r}")
    if kind != "backtrack":
        require_egglog()


def search(g: Graph, rules: list[Rule], cost: CostModel, alpha: float = 1.05, budget: int = 200,
           time_limit: float = 60.0, region_size: int = 32, stats: SearchStats | None = None, progress=None,
           patience: int = 64, min_gain: float = 1e-6, kind: str = "backtrack",
           limits: EqsatLimits | None = None, judge=None) -> Graph:
    """:func:`tvm_taso.search.backtrack.search` with the region search ``kind`` (one of
    :data:`SEARCHES`)."""
    check_search(kind)
    region_search = None
    if kind != "backtrack":
        region_search = EqsatRegion(rules, cost, limits, auto=kind == "auto", alpha=alpha, budget=budget,
                                    patience=patience)
    return backtrack.search(g, rules, cost, alpha, budget, time_limit, region_size, stats, progress, patience,
                            region_search=region_search, min_gain=min_gain, judge=judge)
