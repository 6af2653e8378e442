"""What a search did: :class:`SearchStats`, and why each region's search stopped (:class:`Stop`)."""

from __future__ import annotations

import enum
from collections import Counter
from dataclasses import dataclass, field, fields


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
    egraph_nodes: int = field(default=0, metadata={"merge": "max"})  # largest e-graph of a region
    egraph_classes: int = field(default=0, metadata={"merge": "max"})
    extraction_seconds: float = 0.0
    refined: int = 0  # eqsat regions whose extracted graph a few backtracking steps improved
    worker_regions: int = 0  # regions whose search ran in a worker process (:mod:`.pool`)
    seconds: float = 0.0  # in the search proper: regions searched and spliced, weights folded between them
    extraction_methods: Counter = field(default_factory=Counter)  # which extraction candidate won
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
        for f in fields(self):
            if f.metadata.get("kept") and not kept:
                continue
            mine, theirs = getattr(self, f.name), getattr(other, f.name)
            if isinstance(mine, Counter):
                mine.update(theirs)
            elif isinstance(mine, list):
                mine.extend(theirs)
            elif f.metadata.get("merge") == "max":
                setattr(self, f.name, max(mine, theirs))
            else:
                setattr(self, f.name, mine + theirs)

    def forget_results(self) -> None:
        """Drop the results (rules applied, curve, rewrites): the search's graph was not used."""
        self.applied, self.rewrites, self.curve = Counter(), [], []
