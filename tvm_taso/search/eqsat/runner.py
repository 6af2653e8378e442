"""Saturation: the rules run on one region's e-graph, round by round, until nothing changes or a
limit (egg's ``Runner``): :class:`Runner` returns a :class:`RunReport`, why it stopped and a
record of each round (:class:`Iteration`).

Matching is egglog's (relational, semi-naive: each round it matches only what is new, the rules
compiled by :func:`.ematch.compile_rules`); Python checks each new site once
(:class:`.ematch.Sites`: what egglog cannot state here), drops the multi-output sites that would
close a cycle or only repeat a merge (:class:`Dependencies`, since merges are where e-graphs
explode), and applies the rest in the order a :class:`Scheduler` gives (egg's backoff,
:class:`BackoffScheduler`, by default).
"""

from __future__ import annotations

import time
from dataclasses import dataclass, field
from functools import partial
from typing import Protocol

from tvm_taso.rewrite.rule import Rule
from tvm_taso.search.eqsat import ematch
from tvm_taso.search.eqsat.egraph import OP_NUMBERS, EGraph, EGraphView, Matching
from tvm_taso.search.eqsat.ematch import Applier
from tvm_taso.search.options import EqsatLimits
from tvm_taso.search.stats import Stop


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


class Scheduler(Protocol):
    """Which rules a round runs, in which order and within which e-graph size; told which rules
    a limit stopped (:meth:`starve`) or that applied too many sites (:meth:`ban`)."""

    def round(self, k: int, size: int) -> list[tuple[Rule, int]]: ...

    def starve(self, rule: Rule) -> None: ...

    def is_banned(self, rule: Rule, k: int) -> bool: ...

    def ban(self, rule: Rule, k: int) -> None: ...


class BackoffScheduler:
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


@dataclass(frozen=True)
class Iteration:
    """One round of saturation: the e-graph after it, the structural matches egglog recorded for
    it to check (new since the round before), the sites it applied and its seconds (checking,
    applying, and egglog's rebuild, matching and read-back)."""

    egraph_nodes: int
    egraph_classes: int
    matches: int
    applied: int
    seconds: float


@dataclass
class RunReport:
    """Why saturation stopped, and each round's record."""

    stop: Stop
    iterations: list[Iteration] = field(default_factory=list)

    @property
    def rounds(self) -> int:
        return len(self.iterations)


class Runner:
    """The rules of ``rules`` run on ``eg`` (an e-graph of ``rules.matching()``, holding the
    region) within ``limits``, in the order a ``scheduler`` gives (default: a
    :class:`BackoffScheduler`)."""

    def __init__(self, eg: EGraph, rules: RuleSet, limits: EqsatLimits, scheduler: Scheduler | None = None):
        self.eg, self.rules, self.limits = eg, rules, limits
        self.scheduler = scheduler if scheduler is not None else BackoffScheduler(rules, limits)

    def run(self, deadline: float, creator: dict, original: dict, sites: list | None = None) -> RunReport:
        """Saturate until ``deadline`` at the latest. ``original``: the input graph's e-node of
        each class (:func:`.region.load`); ``creator``: filled with the rule that made each
        e-node; ``sites``, when given, with each rule application's target e-nodes."""
        eg, rules, limits, scheduler = self.eg, self.rules, self.limits, self.scheduler
        view = eg.view
        found = ematch.Sites(eg, rules.compiled)
        report = RunReport(Stop.ROUND_LIMIT)
        for k in range(limits.rounds):
            started = time.perf_counter()
            dependencies = Dependencies(view, original)
            found.update(view, dependencies.reads)
            matches = sum(len(rows) for rows in view.rows.values())
            applier = Applier(eg, view, found.shapes, creator, sites)
            applied_total = 0
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
                applied_total += applied
            if applier.changes == 0 and not cut:
                report.stop = Stop.SATURATED
            else:
                view = eg.commit()
            report.iterations.append(Iteration(view.size, len(view.classes), matches, applied_total,
                                               time.perf_counter() - started))
            if report.stop is Stop.SATURATED:
                return report
            if view.size >= limits.node_limit:
                report.stop = Stop.NODE_LIMIT
                return report
            if time.perf_counter() > deadline:
                report.stop = Stop.DEADLINE
                return report
        return report
