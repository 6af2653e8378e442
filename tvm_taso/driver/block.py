"""The block driver: one graph searched, its weights folded, and the result kept only if cheaper.

Both front ends call :func:`search_written` on each graph they read (a Relax dataflow block,
:mod:`.relax`; an ONNX model's graph, :mod:`.onnx`): it searches (:func:`search_block`) and
writes back what the search keeps, searching again when the result cannot be written (the one
retry loop; what a front end can leave out and search without is its :class:`Writable`'s).
"""

from __future__ import annotations

import logging
from dataclasses import dataclass, field
from typing import Callable, Protocol

from tvm_taso.cost.model import CostModel, no_size_costlier
from tvm_taso.ir.graph import Graph, fold_constants
from tvm_taso.ir.merged_weights import order_merged_blocks, reuse_merged_weights
from tvm_taso.rewrite.rule import Rule
from tvm_taso.search import Judge, SearchOptions, SearchStats, search
from tvm_taso.search.pool import RegionPool

log = logging.getLogger("tvm_taso")

WEIGHT_FLOOR = 1 << 20  # bytes: lighter weights may grow to max_weight_growth times this
MAX_ATTEMPTS = 6  # searches of one graph whose results could not be written


@dataclass
class Result:
    """What a front end made of a model: the new one (the same object when nothing was
    applied), the costs before and after, the weight expressions folded, facts for the report
    and the kernels before and after when the front end counts them (the ONNX one's)."""

    model: object
    cost_before: float = 0.0
    cost_after: float = 0.0
    folded: int = 0
    facts: dict = field(default_factory=dict)
    kernels: tuple[int, int] | None = None


class Writable(Protocol):
    """A graph read from a model, and how to write a searched graph back into it."""

    name: str  # what the log calls it

    @property
    def graph(self) -> Graph:
        """The graph to search (it changes when :meth:`leave_out` leaves something out)."""

    def write(self, graph: Graph):
        """The model with ``graph`` written back; raises when it cannot be."""

    def leave_out(self, graph: Graph, err: Exception) -> bool | None:
        """After ``write(graph)`` raised ``err``: True when what could not be written is now
        left out of :attr:`graph` (search again), False when nothing more can be (give up), None
        when ``err`` is not such a refusal (search again, each region's result written as it is
        found, so that only the regions that cannot be written are left out)."""


@dataclass
class SearchRun:
    """What one ``optimize`` call searches every graph with: the rules, the cost model, the
    options, the deadline all of its searches share (a ``time.perf_counter()`` value), the region
    ``judge`` if any, ``progress()``, called after each region, the
    :class:`~tvm_taso.search.pool.RegionPool` its searches share, if any, and the sizes the user
    gave for symbols (``shapes``, :func:`tvm_taso.ir.dims.priced_points`)."""

    rules: list[Rule]
    cost: CostModel
    options: SearchOptions
    deadline: float
    judge: Judge | None = None
    progress: Callable[[], None] | None = None
    pool: RegionPool | None = None
    shapes: dict = field(default_factory=dict)  # symbol -> the sizes it is priced at, given by the user


@dataclass
class Outcome:
    """One graph's search: ``graph`` is the result, weights folded (the graph searched when
    nothing was ``kept``); costs by the run's cost model, and at each priced size of a graph
    with symbolic sizes (``costs_before``, ``costs_after``: one per point of ``graph.sizes``)."""

    graph: Graph
    cost_before: float
    cost_after: float
    folded: int
    kept: bool
    stats: SearchStats = field(default_factory=SearchStats)
    costs_before: tuple = ()
    costs_after: tuple = ()


def _costs(cost: CostModel, graph: Graph) -> tuple:
    return cost.cost(graph), *cost.costs_at(graph)


def _weights_shared(graph: Graph, run: SearchRun, accept, stats: SearchStats) -> Graph:
    """``graph`` with its merged weights in one order and one split each (:func:`order_merged_blocks`;
    kept where no costlier at any priced size, or where it writes fewer weight bytes) and used
    wherever their blocks are (:func:`reuse_merged_weights`, where no costlier); each step kept
    only if the front end can write it back."""
    searched = _costs(run.cost, graph)
    ordered = graph.copy()
    candidates = []
    if order_merged_blocks(ordered) and (ordered.weight_bytes() < graph.weight_bytes()
                                         or no_size_costlier(_costs(run.cost, ordered), searched)):
        candidates.append((ordered, 0))
    reused = (candidates[0][0] if candidates else graph).copy()
    sites = reuse_merged_weights(reused)
    if sites and no_size_costlier(_costs(run.cost, reused), searched):
        candidates.insert(0, (reused, sites))
    for candidate, sites in candidates:
        try:
            if accept is not None:
                accept(candidate)
        except Exception:  # noqa: BLE001 - as a region the writer refuses: left as it was
            continue
        stats.merges_reused += sites
        return candidate
    return graph


def search_written(source: Writable, run: SearchRun, stats: SearchStats) -> tuple[Outcome, object] | None:
    """``source``'s graph searched and written back: ``(outcome, written)``, where ``written`` is
    None when the search kept nothing; None when no result could be written in
    :data:`MAX_ATTEMPTS` searches. Each search's statistics go to ``stats``."""
    checked = False  # each region's result written as it is found
    for _ in range(MAX_ATTEMPTS):
        outcome = search_block(source.graph, run, source.write if checked else None)
        if not outcome.kept:
            stats.absorb(outcome.stats, kept=False)
            return outcome, None
        try:
            written = source.write(outcome.graph)
        except Exception as err:  # noqa: BLE001 - search again without what cannot be written
            stats.absorb(outcome.stats, kept=False)
            left_out = source.leave_out(outcome.graph, err)
            if left_out is False:
                return None
            if left_out is None:
                if checked:
                    raise
                log.warning("%s: the search's result could not be written back (%s: %s); searching again, "
                            "leaving out the regions that cannot be", source.name, type(err).__name__, err)
                checked = True
            continue
        stats.absorb(outcome.stats, kept=True)
        return outcome, written
    return None


def search_block(graph: Graph, run: SearchRun, accept=None) -> Outcome:
    """Search ``graph``, fold the weights the rewrites combined, and keep the result only if it
    is cheaper by more than ``run.options.min_gain`` (a fraction of its cost), no costlier at any
    of its priced sizes, and not the same graph. ``accept(graph)``, when given, is called on each
    region's result and raises if the front end could not write it back (that region is then
    left as it was)."""
    before, before_at = run.cost.cost(graph), run.cost.costs_at(graph)
    stats = SearchStats()
    g = search(graph, run.rules, run.cost, run.options, deadline=run.deadline, stats=stats, progress=run.progress,
               judge=run.judge, accept=accept, pool=run.pool)
    folded = fold_constants(g)
    g = _weights_shared(g, run, accept, stats)
    growth = g.weight_bytes() / max(graph.weight_bytes(), WEIGHT_FLOOR)
    if growth > run.options.max_weight_growth:
        log.warning("the rewrites would make the weights %.1fx larger (max_weight_growth=%g): the graph is left "
                    "as it was", growth, run.options.max_weight_growth)
        reason = f"weights {growth:.1f}x larger"
        stats.dropped.append({"region": None, "rules": sorted(stats.applied), "reason": reason})
        return Outcome(graph, before, before, 0, False, stats, before_at, before_at)
    after, after_at = run.cost.cost(g), run.cost.costs_at(g)
    if (not after < before * (1.0 - run.options.min_gain) or not no_size_costlier(after_at, before_at)
            or g.structural_hash() == graph.structural_hash()):
        return Outcome(graph, before, before, 0, False, stats, before_at, before_at)
    return Outcome(g, before, after, folded, True, stats, before_at, after_at)
