"""Equality saturation (TENSAT's search) on the same rules and cost model, one region at a time.

Laid out as egg is: each region (:func:`tvm_taso.search.regions.regions`) becomes an e-graph in
egglog (:mod:`.egraph`), and a :class:`.runner.Runner` saturates it. Every round matches the
rules on a snapshot (:mod:`.ematch`), adds their targets and unions in one batch, and stops when
nothing changes or at a limit (a :class:`.runner.RunReport`: why, and a record per round). The cheapest acyclic graph under the real cost model is then extracted (:mod:`.extract`),
refined by a few steps of backtracking from it (``refine_budget``: extraction works on
per-e-node prices, and a rewrite that pays only through fusion can escape it), and kept only
if it costs less than the region did.

The rules are compiled to egglog rules (:func:`.ematch.compile_rules`): egglog matches their
patterns' structure (ops, operands, shared variables) relationally and incrementally, and
records each match in a relation; egglog also keeps the e-nodes, union-find and congruence
closure. Python reads each round's new matches and checks what egglog cannot state here
(attributes, conditions on shapes: the checks named in :mod:`.ematch`), drops the multi-output
sites that would close a cycle or only repeat a merge (:class:`.runner.Dependencies`, since merges
are where e-graphs explode), and applies the rest in a :class:`.runner.Scheduler`'s order (egg's
backoff). Extraction (:mod:`.extract`) is apart from saturation, its strategies apart from each
other; :class:`.region.EqsatRegion` puts them together for one region, and what they did is
counted in :class:`~tvm_taso.search.stats.EqsatStats`.

``search="auto"`` runs eqsat on every region and, on regions of at most ``AUTO_BOTH_OPS`` ops (where
backtracking is cheap), backtracking too, keeping the cheaper graph.
"""

from __future__ import annotations

from tvm_taso.search.eqsat.region import AUTO_BOTH_OPS, EqsatRegion, load, require_egglog
from tvm_taso.search.eqsat.runner import BackoffScheduler, Iteration, RuleSet, Runner, RunReport, Scheduler

__all__ = ["AUTO_BOTH_OPS", "BackoffScheduler", "EqsatRegion", "Iteration", "RuleSet", "RunReport", "Runner",
           "Scheduler", "load", "require_egglog"]
