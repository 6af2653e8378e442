"""What a search did: :class:`SearchStats`, and why each region's search stopped (:class:`Stop`)."""

from __future__ import annotations

import enum
from collections import Counter
from dataclasses import dataclass, field, fields, is_dataclass


class Stop(enum.Enum):
    """Why a region's search ended (``SearchStats.stopped`` counts them by value)."""

    BUDGET = "budget"  # backtracking expanded its budget of graphs
    PATIENCE = "patience"  # backtracking found nothing better for `patience` expansions
    QUEUE_EMPTY = "queue empty"  # backtracking ran out of graphs within alpha of the best
    SATURATED = "saturated"  # equality saturation: a round changed nothing
    NODE_LIMIT = "node limit"
    ROUND_LIMIT = "round limit"
    DEADLINE = "deadline"
    NOT_SEARCHED = "deadline (not searched)"  # the time limit passed before the region's turn
    REUSED = "reused an identical region"


def _kept(**metadata):
    """A field whose additions count only when the search's result is kept (rules, curve, ...)."""
    return dict(metadata, kept=True)


@dataclass
class SearchStats:
    """Counters of one search, merged across regions, blocks and functions by :meth:`absorb`:
    numbers add up (``merge="max"``: the largest), counters and lists are joined."""

    expanded: int = 0
    candidates: int = 0
    regions: int = 0
    regions_cut_short: int = 0
    sweeps: int = field(default=0, metadata={"merge": "max"})  # times both passes ran over a block (the most)
    costlier_in_graph: int = 0  # region rewrites left out: cheaper in the region, not in the graph or at a size
    reused: int = 0  # regions that took the result of an identical region
    folded: int = field(default=0, metadata=_kept())  # weight expressions folded to constants between regions
    stopped: Counter = field(default_factory=Counter)  # Stop values: why each region's search ended
    engines: Counter = field(default_factory=Counter)  # regions searched by each search (eqsat, auto)
    eqsat: EqsatStats = field(default_factory=lambda: EqsatStats())  # equality saturation's own
    worker_regions: int = 0  # regions whose search ran in a worker process (:mod:`.pool`)
    seconds: float = 0.0  # in the search proper: regions searched and spliced, weights folded between them
    decisions: list = field(default_factory=list)  # a judge's verdict on each rewritten region
    dropped: list = field(default_factory=list)  # rewritten regions that could not be spliced back
    applied: Counter = field(default_factory=Counter, metadata=_kept())
    merges_reused: int = field(default=0, metadata=_kept())  # sites given a merged weight another site made
    curve: list = field(default_factory=list, metadata=_kept())  # (perf_counter time, change of the best cost)
    rewrites: list = field(default_factory=list, metadata=_kept())  # one entry per region that changed

    def stop(self, why: Stop) -> None:
        self.stopped[why.value] += 1

    def absorb(self, other: SearchStats, kept: bool) -> None:
        """Add ``other``'s work; its results (rules, curve, rewrites) only if they were ``kept``."""
        _absorb(self, other, kept)

    def forget_results(self) -> None:
        """Drop the results (rules applied, curve, rewrites): the search's graph was not used."""
        self.applied, self.rewrites, self.curve = Counter(), [], []


@dataclass
class EqsatStats:
    """What equality saturation did, over the regions it searched: the largest e-graph, its
    rounds (:class:`~tvm_taso.search.eqsat.runner.Iteration` records summed by round number:
    ``per_round[k]`` is round ``k`` over every region that ran it; the totals are their sums),
    extraction and refinement."""

    egraph_nodes: int = field(default=0, metadata={"merge": "max"})  # largest e-graph of a region
    egraph_classes: int = field(default=0, metadata={"merge": "max"})
    extraction_seconds: float = 0.0
    extraction_methods: Counter = field(default_factory=Counter)  # which extraction candidate won
    refined: int = 0  # regions whose extracted graph a few backtracking steps improved
    per_round: list = field(default_factory=list, metadata={"merge": "by index"})

    def add_run(self, run) -> None:
        """Count one region's saturation (a :class:`~tvm_taso.search.eqsat.runner.RunReport`)."""
        for it in run.iterations:
            self.egraph_nodes = max(self.egraph_nodes, it.egraph_nodes)
            self.egraph_classes = max(self.egraph_classes, it.egraph_classes)
        _add_by_index(self.per_round, [{"regions": 1, "matches": it.matches, "applied": it.applied,
                                        "seconds": it.seconds} for it in run.iterations])

    def _total(self, key: str):
        return sum(r[key] for r in self.per_round)

    @property
    def rounds(self) -> int:
        return self._total("regions")

    @property
    def matches(self) -> int:  # structural matches egglog recorded and Python checked
        return self._total("matches")

    @property
    def applied(self) -> int:  # sites applied
        return self._total("applied")

    @property
    def saturation_seconds(self) -> float:
        return self._total("seconds")

    def to_json(self) -> dict:
        return {"egraph_nodes": self.egraph_nodes, "egraph_classes": self.egraph_classes, "rounds": self.rounds,
                "matches": self.matches, "applied": self.applied, "saturation_seconds": self.saturation_seconds,
                "extraction_seconds": self.extraction_seconds, "extraction": dict(self.extraction_methods),
                "refined": self.refined, "per_round": self.per_round}


def _add_by_index(mine: list[dict], theirs: list[dict]) -> None:
    """Add each of ``theirs`` (counters by name) to the item of ``mine`` at its index (new items
    copied)."""
    for k, entry in enumerate(theirs):
        if k == len(mine):
            mine.append(dict.fromkeys(entry, 0))
        for key, value in entry.items():
            mine[k][key] += value


def _absorb(mine_stats, other, kept: bool) -> None:
    """Add ``other``'s fields to ``mine_stats``'s (numbers add up; ``merge="max"``: the largest;
    ``"by index"``: :func:`_add_by_index`; counters and other lists joined; a nested record
    absorbed alike); fields marked ``kept`` only if ``other``'s results were."""
    for f in fields(mine_stats):
        if f.metadata.get("kept") and not kept:
            continue
        mine, theirs = getattr(mine_stats, f.name), getattr(other, f.name)
        if is_dataclass(mine):
            _absorb(mine, theirs, kept)
        elif isinstance(mine, Counter):
            mine.update(theirs)
        elif f.metadata.get("merge") == "by index":
            _add_by_index(mine, theirs)
        elif isinstance(mine, list):
            mine.extend(theirs)
        elif f.metadata.get("merge") == "max":
            setattr(mine_stats, f.name, max(mine, theirs))
        else:
            setattr(mine_stats, f.name, mine + theirs)
