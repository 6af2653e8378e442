"""Equality saturation (TENSAT's search) on the same rules and cost model, region by region.

Each region (the backtracking search's regions, :func:`tvm_taso.search.backtrack.regions`)
becomes an e-graph in egglog (:mod:`.egraph`). Every round matches the rules on a snapshot
(:mod:`.ematch`), adds their targets and unions in one batch, and stops when nothing changes
(``saturated``) or at the node limit, the round limit or the deadline. The cheapest acyclic
graph under the real cost model is then extracted (:mod:`.extract`), refined by a few steps
of backtracking from it (``refine_budget``: extraction works on per-e-node prices, and a rewrite
that pays only through fusion can escape it), and kept only if it costs less than the region
did (the region's own graph is always a candidate, so never more). With ``search_tries``,
extraction also runs backtracking over the rule applications saturation recorded, and both its
graphs are refined.

Design: Python drives the e-graph. The rule language computes attributes and checks shapes
(``dim``, ``rank``, ``shape``), which egglog rules could only do with a shape analysis encoded in
egglog; instead egglog keeps the e-nodes, union-find and congruence closure, and Python matches
the same :class:`Rule` data on each round's snapshot. What keeps it fast (measured on the quick
benchmark models, 2 shared cores; see README):

- incremental matching: a rule whose every site was applied is matched again only at roots
  near a class that changed (:func:`saturate`);
- joined matching: a multi-output rule's root patterns are each matched once per round and
  joined on the variables they share through a hash index (:meth:`.ematch.Matcher.matches`),
  not matched again for every choice of the roots before;
- multi-output rules (merges) are where e-graphs explode: a site is dropped before it is
  applied when it would close a cycle, when its roots are symmetric and in the other order,
  or when the merge is redundant -- merges grow one input-graph value at a time, in class
  order, so each set of merged values is built once (:class:`Dependencies`);
- scheduling: multi-output rules run in the first ``multi_rounds`` rounds (a k-way merge
  needs k - 1), first, with ``multi_share`` of the e-nodes left; a rule that changes more than
  ``match_limit`` sites in a round is banned for 1, 2, 4, ... rounds (egg's backoff); rules
  the node limit stopped run first in the next round;
- egglog programs of a few dozen commands (:mod:`.egraph`), and an extraction that prices a
  bounded number of graphs, each distinct one once (:mod:`.extract`);
- limits measured on the quick benchmark models (:class:`EqsatLimits`): a node limit of 1,500
  instead of 1,000 took 1.5-2x the time and found a cheaper graph on one model of eight, by
  0.1%; 6 rounds, not 8, since a 5-way merge and the rewrites after it take 6.

``search="auto"`` runs eqsat on every region and, on regions of at most ``AUTO_BOTH_OPS`` ops
(where backtracking is cheap), backtracking too, keeping the cheaper graph.
"""

from __future__ import annotations

import logging
import time
from dataclasses import dataclass
from functools import partial

from tvm_taso.cost.model import CostModel
from tvm_taso.ir.graph import LEAVES, Graph
from tvm_taso.rewrite.rule import Rule
from tvm_taso.search import backtrack, ematch
from tvm_taso.search.backtrack import SearchStats
from tvm_taso.search.egraph import MISSING, EGraph, EGraphView, available
from tvm_taso.search.ematch import Applier, Matcher
from tvm_taso.search.extract import Extractor

log = logging.getLogger(__name__)

AUTO_BOTH_OPS = 12


@dataclass
class EqsatLimits:
    node_limit: int = 1000  # e-nodes per region
    rounds: int = 6  # matching rounds per region
    multi_rounds: int = 6  # rounds in which multi-output rules run (a k-way merge takes k - 1)
    match_limit: int = 24  # sites applied per rule and round
    multi_share: float = 0.5  # of the e-nodes the node limit leaves, what multi-output rules may add per round
    extraction_share: float = 0.3  # of the region's time left for extraction
    ilp: bool = False  # TENSAT's ILP candidate (slow in HiGHS beyond a few hundred e-nodes)
    improve_tries: int = 96  # graphs extraction's local improvement builds and prices in vain before it stops
    refine_budget: int = 4  # graphs backtracking expands from the extracted one (0: no refinement)
    # graphs extraction's search over rule applications prices in vain before it stops (0: not run;
    # 100: cheaper graphs on 4 of the 16 benchmark models, at a median 1.6x eqsat's time)
    search_tries: int = 0


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
        eg.node_ids.setdefault(cid, nid)
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


class Dependencies:
    """Which multi-output sites of one snapshot are applied (:meth:`allowed`): none that would
    close a cycle (:meth:`cycle`, TENSAT's pre-filter) and no redundant merge (:meth:`redundant`).

    Cycles are looked for in the input graph, through its own e-nodes only: rules like ``x =
    concat(split(x))`` soon make every class read every other through some e-node, and a filter
    over all e-nodes then blocks the merges that pay; sites with a class the rules made are left
    to extraction's cycle check."""

    def __init__(self, view: EGraphView, original: dict):
        self.view = view
        self.reads: dict[int, tuple] = {}
        for cid, e in original.items():
            self.reads.setdefault(view.find(cid), tuple(view.find(c) for c in e[2]))
        self._below: dict[int, set[int]] = {}
        self._sliced: dict[int, set[int]] = {}
        self._covered: dict[int, list[int]] | None = None
        self._allowed: dict[tuple, bool] = {}

    def below(self, cid: int) -> set[int]:
        """The input graph's classes ``cid`` reads, transitively, in the input graph."""
        found = self._below.get(cid)
        if found is None:
            found, stack = set(), list(self.reads[cid])
            while stack:
                c = stack.pop()
                if c not in found and c in self.reads:
                    found.add(c)
                    known = self._below.get(c)
                    if known is not None:
                        found |= known
                    else:
                        stack.extend(self.reads[c])
            self._below[cid] = found
        return found

    def accepts(self, classes: tuple[int, ...], ordered: bool, merge: bool) -> bool:
        """:meth:`allowed`, and for a symmetric rule (``ordered``) the roots in increasing order."""
        return not (ordered and classes[0] > classes[1]) and self.allowed(classes, merge)

    def allowed(self, classes: tuple[int, ...], merge: bool) -> bool:
        """Whether a multi-output site on ``classes`` is applied: no :meth:`cycle`, and for a
        merge, not :meth:`redundant` (memoized: the merge rules share their pairs of roots)."""
        key = (classes, merge)
        found = self._allowed.get(key)
        if found is None:
            found = self._allowed[key] = not (self.cycle(classes) or (merge and self.redundant(classes)))
        return found

    def cycle(self, classes: tuple[int, ...]) -> bool:
        """Whether one of ``classes`` reads another in the input graph (one op computing both
        would read itself)."""
        if not all(c in self.reads for c in classes):
            return False
        return any(a != b and a in self.below(b) for a in classes for b in classes)

    def sliced_from(self, cid: int) -> set[int]:
        """The classes ``cid`` is a slice of: ``x`` for ``get(split(x))``, transitively."""
        found = self._sliced.get(cid)
        if found is None:
            found, stack = set(), [cid]
            self._sliced[cid] = found  # a cycle of slices ends here
            while stack:
                for e in self.view.classes[stack.pop()]:
                    if e[0] != "get":
                        continue
                    for inner in self.view.classes[e[2][0]]:
                        if inner[0] == "node" and inner[2] and inner[2][0] not in found:
                            found.add(inner[2][0])
                            stack.append(inner[2][0])
        return found

    def covered(self, cid: int) -> list[int]:
        """The input graph's classes that are slices of ``cid`` (what a merge computes)."""
        if self._covered is None:
            self._covered = {}
            for c in self.reads:
                for x in self.sliced_from(c):
                    self._covered.setdefault(x, []).append(c)
        return self._covered.get(cid, [])

    def redundant(self, classes: tuple[int, ...]) -> bool:
        """Whether a merge of ``classes`` would only fill the e-graph: two of them made by the
        rules (two merges merged: ``qk`` with ``qv`` computes ``q`` twice), one of them a slice
        of another (``q = get(split(qk))`` merged with ``qk``), or a merge growing out of
        order. Merges grow one input-graph value at a time, in increasing class order (``qk``
        with ``v``, not ``qv`` with ``k`` nor ``kv`` with ``q``), so that each set of merged
        values is built once, not once per order."""
        made = [c for c in classes if c not in self.reads]
        if len(made) > 1:
            return True
        if any(a != b and b in self.sliced_from(a) for a in classes for b in classes):
            return True
        if made:
            last = max(self.covered(made[0]), default=-1)
            return any(c < last for c in classes if c in self.reads)
        return False


@dataclass
class RuleSet:
    """The rules, with what saturation asks about each (by rule id), worked out once per search
    rather than per region (the symmetry check alone took 0.1 s per region)."""

    single: list[Rule]
    multi: list[Rule]
    reach: dict[int, int]  # how far below its roots a rule's patterns read
    order: dict[int, tuple[int, ...]]  # the order its roots are matched in
    symmetric: set[int]
    merging: set[int]

    @classmethod
    def of(cls, rules: list[Rule]) -> RuleSet:
        multi = [r for r in rules if len(r.src) > 1]
        return cls(
            single=[r for r in rules if len(r.src) == 1], multi=multi,
            reach={id(r): max(ematch.reach(p) for p in r.src) for r in rules},
            order={id(r): ematch.match_order(r) for r in rules},
            symmetric={id(r) for r in multi if ematch.symmetric(r)},
            merging={id(r) for r in multi if ematch.merges(r)},
        )


def saturate(eg: EGraph, rules: RuleSet, limits: EqsatLimits, deadline: float, creator: dict,
             original: dict, sites: list | None = None) -> tuple[str, int]:
    """Run the rules to saturation or a limit; (why it stopped, rounds run). ``original``: the
    input graph's e-node of each class (:func:`_load`); ``creator``: filled with the rule that
    made each e-node; ``sites``, when given, with each rule application's target e-nodes.

    Matching is incremental: a rule whose every site was applied in the previous round it ran is
    matched only at sites with a root within its patterns' reach above a class that changed
    since then; a site elsewhere reads only unchanged classes, so it was found, and applied,
    before. Multi-output sites are filtered before they are applied (:class:`Dependencies`)."""
    single, multi = rules.single, rules.multi
    view = eg.view
    memo: tuple[dict, dict] = ({}, {})
    complete: set[int] = set()  # ids of the rules all of whose sites in the last snapshot were applied
    banned: dict[int, tuple[int, int]] = {}  # rule id -> (first round it runs again, times banned)
    starved: set[int] = set()  # ids of the rules the node limit stopped in the last round
    old = None
    for k in range(limits.rounds):
        changed = view.changed_since(old) if old is not None else None
        near: dict[int, set] = {}
        dependencies = Dependencies(view, original)
        matcher = Matcher(eg, view, memo)
        applier = Applier(eg, view, matcher.shapes, creator, sites)
        cut = False  # a rule's sites were left for a later round (limit or deadline)
        # multi-output rules first, with a share of what the node limit leaves (their merges
        # pay most, but the single-output rules' rewrites must not be starved either); within
        # each, the rules the node limit stopped last round come first, so that no rule is
        # starved round after round for its place in the library
        batch = [r for r in multi if id(r) in starved] + [r for r in multi if id(r) not in starved]
        if k >= limits.multi_rounds:
            batch = []
        share = view.size + int((limits.node_limit - view.size) * limits.multi_share)
        order = batch + [r for r in single if id(r) in starved] + [r for r in single if id(r) not in starved]
        starved = set()
        for n, rule in enumerate(order):
            budget = share if n < len(batch) else limits.node_limit
            if time.perf_counter() > deadline or view.size + eg.pending > budget:
                cut = True
                starved.add(id(rule))
                continue
            was_complete = id(rule) in complete
            complete.discard(id(rule))
            if banned.get(id(rule), (0, 0))[0] > k:
                cut = True
                continue
            if any(op not in view.by_op for op in rule.root_ops):
                complete.add(id(rule))
                continue
            roots_in = None
            if changed is not None and was_complete:
                steps = rules.reach[id(rule)]
                if steps not in near:
                    near[steps] = view.ancestors(changed, steps)
                roots_in = near[steps]
                if not any(matcher.near(op, roots_in) for op in rule.root_ops):
                    complete.add(id(rule))  # none of its root ops near a change: no new site
                    continue
            accept = None
            if len(rule.src) > 1:
                accept = partial(dependencies.accepts, ordered=id(rule) in rules.symmetric,
                                 merge=id(rule) in rules.merging)
            applied, exhausted = 0, True
            for roots, env in matcher.matches(rule, roots_in, accept, rules.order[id(rule)]):
                # at most match_limit changing sites per rule and round, then a ban, so that an
                # exploding rule (transposes, pairwise merges) does not starve the rest
                if applied >= limits.match_limit or view.size + eg.pending > budget:
                    cut, exhausted = True, False
                    if applied >= limits.match_limit:  # egg's backoff: banned 1, 2, 4, ... rounds
                        times = banned.get(id(rule), (0, 0))[1]
                        banned[id(rule)] = (k + 1 + (1 << times), times + 1)
                    else:
                        starved.add(id(rule))
                    break
                before = applier.changes
                applier.apply(rule, roots, env)
                applied += applier.changes > before
            if exhausted:
                complete.add(id(rule))
        if applier.changes == 0 and not cut:
            return "saturated", k + 1
        old, view = view, eg.commit()
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
        self.rule_set = RuleSet.of(rules)
        self.limits = limits or EqsatLimits()
        self.auto, self.alpha, self.budget, self.patience = auto, alpha, budget, patience
        self.kernel_memo: dict = {}

    def __call__(self, sub: Graph, deadline: float, stats: SearchStats):
        start = time.perf_counter()
        start_cost = self.cost.cost(sub)
        eg = EGraph()
        roots, original = _load(eg, sub)
        creator: dict = {}
        # each rule application's targets, only for the extraction search that moves by them
        sites: list | None = [] if self.limits.search_tries else None
        sat_deadline = start + (deadline - start) * (1 - self.limits.extraction_share)
        why, rounds = saturate(eg, self.rule_set, self.limits, sat_deadline, creator, original, sites)
        view = eg.view
        stats.stopped[why] += 1
        stats.regions_cut_short += why == "deadline"
        stats.engines["eqsat"] += 1
        stats.egraph_nodes = max(stats.egraph_nodes, view.size)
        stats.egraph_classes = max(stats.egraph_classes, len(view.classes))
        found = Extractor(eg, view, sub, roots, self.cost, creator, original, self.kernel_memo, sites or ()).run(
            max(deadline, time.perf_counter() + 0.05), self.limits.ilp, self.limits.improve_tries,
            self.limits.search_tries, self.alpha
        )
        stats.extraction_seconds += found.seconds
        stats.extraction_methods[found.method] += 1
        log.debug("eqsat region: %d e-nodes, %d classes, %s after %d rounds, %s extraction %.3f s: %.2f -> %.2f",
                  view.size, len(view.classes), why, rounds, found.method, found.seconds, start_cost, found.cost)
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
                refined = backtrack.search_region(graph, self.rules, self.cost, self.alpha, self.limits.refine_budget,
                                                  max(deadline, time.perf_counter() + 0.05), scratch,
                                                  self.limits.refine_budget)
                stats.expanded += scratch.expanded
                stats.candidates += scratch.candidates
                if refined[1] < graph_cost - 1e-9:
                    graph, graph_cost, graph_path = refined[0], refined[1], graph_path + refined[2]
                    refined_better |= graph_cost < best_cost - 1e-9
                if graph_cost < best_cost - 1e-9:
                    stats.curve.append((time.perf_counter(), graph_cost - best_cost))
                    best, best_cost, path = graph, graph_cost, graph_path
            stats.refined += refined_better
        if self.auto and backtrack.runtime_ops(sub) <= AUTO_BOTH_OPS:
            stats.engines["backtrack"] += 1
            other = backtrack.search_region(sub, self.rules, self.cost, self.alpha, self.budget,
                                            max(deadline, time.perf_counter() + 0.05), stats, self.patience)
            if other[1] < best_cost - 1e-9:
                best, best_cost, path = other
        return best, best_cost, path
