"""Equality saturation (TENSAT's search) on the same rules and cost model, one region at a time.

Each region (:func:`tvm_taso.search.regions.regions`) becomes an e-graph in egglog
(:mod:`.egraph`). Every round matches the rules on a snapshot (:mod:`.ematch`), adds their
targets and unions in one batch, and stops when nothing changes or at a limit (:class:`Stop`).
The cheapest acyclic graph under the real cost model is then extracted (:mod:`.extract`),
refined by a few steps of backtracking from it (``refine_budget``: extraction works on
per-e-node prices, and a rewrite that pays only through fusion can escape it), and kept only
if it costs less than the region did.

The rules are compiled to egglog rules (:func:`.ematch.compile_rules`): egglog matches their
patterns' structure (ops, operands, shared variables) relationally and incrementally, and
records each match in a relation; egglog also keeps the e-nodes, union-find and congruence
closure. Python reads each round's new matches and checks what egglog cannot state here
(attributes, conditions on shapes: the checks named in :mod:`.ematch`), drops the multi-output
sites that would close a cycle or only repeat a merge (:class:`Dependencies`, since merges are
where e-graphs explode), and applies the rest in the :class:`Scheduler`'s order.

``search="auto"`` runs eqsat on every region and, on regions of at most ``AUTO_BOTH_OPS`` ops
(where backtracking is cheap), backtracking too, keeping the cheaper graph.
"""

from __future__ import annotations

import logging
import time
from dataclasses import dataclass, field
from functools import partial

from tvm_taso.cost.model import CostModel
from tvm_taso.ir.graph import LEAVES, Graph
from tvm_taso.rewrite.rule import Rule
from tvm_taso.search import backtrack, ematch
from tvm_taso.search.egraph import MISSING, OP_NUMBERS, EGraph, EGraphView, Matching, available
from tvm_taso.search.ematch import Applier
from tvm_taso.search.extract import Extractor
from tvm_taso.search.options import EqsatLimits, SearchOptions
from tvm_taso.search.regions import Found
from tvm_taso.search.stats import SearchStats, Stop

log = logging.getLogger(__name__)

AUTO_BOTH_OPS = 12


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
    rather than per region (the symmetry check alone is costly), and the egglog e-graph that
    matches them (:meth:`matching`, made once per process)."""

    single: list[Rule]
    multi: list[Rule]
    symmetric: set[int]
    merging: set[int]
    compiled: dict[int, ematch.CompiledRule]  # rule id -> its egglog relations and columns
    programs: list[tuple[str, int, str]]  # the egglog rules (:func:`ematch.compile_rules`)
    fits: list  # the op patterns the egglog rules' Fits facts number
    _matching: Matching | None = field(default=None, repr=False)

    @classmethod
    def of(cls, rules: list[Rule]) -> RuleSet:
        multi = [r for r in rules if len(r.src) > 1]
        compiled, programs, fits = ematch.compile_rules(rules, OP_NUMBERS.__getitem__)
        return cls(
            single=[r for r in rules if len(r.src) == 1], multi=multi,
            symmetric={id(r) for r in multi if ematch.symmetric(r)},
            merging={id(r) for r in multi if ematch.merges(r)},
            compiled=compiled, programs=programs, fits=fits,
        )

    def matching(self) -> Matching:
        """The egglog e-graph holding these rules, each region's :class:`EGraph` a push of it
        (made on first use, in the process searching: egglog's objects do not cross processes;
        kept for the next search of the same rules in this process, :data:`_MATCHINGS`)."""
        if self._matching is None:
            key = (tuple(self.programs), tuple(ematch.fit_key(pat) for pat in self.fits))
            self._matching = _MATCHINGS.pop(key, None) or Matching(self.programs, self.fits)
            _MATCHINGS[key] = self._matching
            while len(_MATCHINGS) > 2:
                del _MATCHINGS[next(iter(_MATCHINGS))]
        return self._matching


# the rules' egglog e-graphs of the last searches in this process (registering a library's rules
# takes egglog about a third of a second), by their programs and Fits patterns, the most recent last
_MATCHINGS: dict[tuple, Matching] = {}


class Scheduler:
    """Which rules a round runs, in which order and within which node budget (egg's
    ``BackoffScheduler``, with what merges need):

    - multi-output rules run in the first ``multi_rounds`` rounds (a k-way merge needs k - 1),
      first, with ``multi_share`` of the e-nodes the node limit leaves (their merges pay most,
      but the single-output rules' rewrites must not be starved either);
    - within each kind, the rules the node limit stopped last round come first, so that no rule
      is starved round after round for its place in the library;
    - a rule that changes more than ``match_limit`` sites in a round is banned for 1, 2, 4, ...
      rounds, so that an exploding rule (transposes, pairwise merges) does not starve the rest
      (its sites wait in its backlog, :class:`.ematch.Sites`)."""

    def __init__(self, rules: RuleSet, limits: EqsatLimits):
        self.rules, self.limits = rules, limits
        self.banned: dict[int, tuple[int, int]] = {}  # rule id -> (first round it runs again, times banned)
        self.starved: set[int] = set()  # ids of the rules the node limit stopped in the last round

    def round(self, k: int, size: int) -> list[tuple[Rule, int]]:
        """Round ``k``'s rules in order, each with the e-graph size it may grow to; ``size``:
        the e-graph's size now. Forgets which rules were starved (they are starved again as
        this round finds)."""
        limits, starved = self.limits, self.starved
        multi = self.rules.multi if k < limits.multi_rounds else []
        batch = [r for r in multi if id(r) in starved] + [r for r in multi if id(r) not in starved]
        single = self.rules.single
        share = size + int((limits.node_limit - size) * limits.multi_share)
        order = [(r, share) for r in batch]
        order += [(r, limits.node_limit) for r in single if id(r) in starved]
        order += [(r, limits.node_limit) for r in single if id(r) not in starved]
        self.starved = set()
        return order

    def starve(self, rule: Rule) -> None:
        self.starved.add(id(rule))

    def is_banned(self, rule: Rule, k: int) -> bool:
        return self.banned.get(id(rule), (0, 0))[0] > k

    def ban(self, rule: Rule, k: int) -> None:
        """Banned for 1, 2, 4, ... rounds after round ``k``, by how often it was banned before."""
        times = self.banned.get(id(rule), (0, 0))[1]
        self.banned[id(rule)] = (k + 1 + (1 << times), times + 1)


def saturate(eg: EGraph, rules: RuleSet, limits: EqsatLimits, deadline: float, creator: dict,
             original: dict, sites: list | None = None) -> tuple[Stop, int]:
    """Run the rules to saturation or a limit; (why it stopped, rounds run). ``eg``: an e-graph
    of ``rules.matching()``, on which egglog records each rule's structural matches every round;
    ``original``: the input graph's e-node of each class (:func:`_load`); ``creator``: filled with
    the rule that made each e-node; ``sites``, when given, with each rule application's target
    e-nodes.

    Matching is egglog's (relational, semi-naive: each round it matches only what is new);
    Python checks each new site once (:class:`.ematch.Sites`), filters multi-output sites
    (:class:`Dependencies`) and applies them in the :class:`Scheduler`'s order."""
    view = eg.view
    found = ematch.Sites(eg, rules.compiled)
    scheduler = Scheduler(rules, limits)
    for k in range(limits.rounds):
        dependencies = Dependencies(view, original)
        found.update(view)
        applier = Applier(eg, view, found.shapes, creator, sites)
        cut = False  # a rule's sites were left for a later round (limit, ban or deadline)
        for rule, budget in scheduler.round(k, view.size):
            if time.perf_counter() > deadline or view.size + eg.pending > budget:
                cut = True
                scheduler.starve(rule)
                continue
            if scheduler.is_banned(rule, k):
                cut = True
                continue
            accept = None
            if len(rule.src) > 1:
                accept = partial(dependencies.accepts, ordered=id(rule) in rules.symmetric,
                                 merge=id(rule) in rules.merging)
            applied = 0
            for roots, env in found.of(rules.compiled[id(rule)], accept):
                if applied >= limits.match_limit or view.size + eg.pending > budget:
                    cut = True
                    if applied >= limits.match_limit:
                        scheduler.ban(rule, k)
                    else:
                        scheduler.starve(rule)
                    break
                before = applier.changes
                applier.apply(rule, roots, env)
                applied += applier.changes > before
        if applier.changes == 0 and not cut:
            return Stop.SATURATED, k + 1
        view = eg.commit()
        if view.size >= limits.node_limit:
            return Stop.NODE_LIMIT, k + 1
        if time.perf_counter() > deadline:
            return Stop.DEADLINE, k + 1
    return Stop.ROUND_LIMIT, limits.rounds


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
        roots, original = _load(eg, sub)
        creator: dict = {}
        # each rule application's targets, only for the extraction search that moves by them
        sites: list | None = [] if self.limits.search_tries else None
        sat_deadline = start + (deadline - start) * (1 - self.limits.extraction_share)
        why, rounds = saturate(eg, self.rule_set, self.limits, sat_deadline, creator, original, sites)
        view = eg.view
        stats.stop(why)
        stats.regions_cut_short += why is Stop.DEADLINE
        stats.engines["eqsat"] += 1
        stats.egraph_nodes = max(stats.egraph_nodes, view.size)
        stats.egraph_classes = max(stats.egraph_classes, len(view.classes))
        found = Extractor(eg, view, sub, roots, self.cost, creator=creator, original=original,
                          kernel_memo=self.kernel_memo, sites=sites or ()).run(
            max(deadline, time.perf_counter() + 0.05), self.limits.ilp, self.limits.improve_tries,
            self.limits.search_tries, self.options.alpha
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
            stats.refined += refined_better
        if self.auto and backtrack.runtime_ops(sub) <= AUTO_BOTH_OPS:
            stats.engines["backtrack"] += 1
            other = backtrack.Backtrack(self.rules, self.cost, self.options)(
                sub, max(deadline, time.perf_counter() + 0.05), stats)
            if other[1] < best_cost - 1e-9:
                best, best_cost, path = other
        return Found(best, best_cost, path)
