"""The graph searches, run region by region (:mod:`.regions`) behind one :func:`search`: TASO's
cost-based backtracking (:mod:`.backtrack`) and equality saturation, TENSAT's (:mod:`.eqsat`)."""

from __future__ import annotations

import time

from tvm_taso.cost.model import CostModel
from tvm_taso.ir.graph import Graph
from tvm_taso.rewrite.rule import Rule
from tvm_taso.search.engines import check_search, region_search
from tvm_taso.search.options import SEARCHES, EqsatLimits, OptionError, SearchOptions
from tvm_taso.search.pool import RegionPool
from tvm_taso.search.regions import Judge, search_regions
from tvm_taso.search.stats import SearchStats, Stop

__all__ = ["SEARCHES", "EqsatLimits", "OptionError", "SearchOptions", "SearchStats", "Stop", "check_search",
           "region_search", "search"]


def search(g: Graph, rules: list[Rule], cost: CostModel, options: SearchOptions | None = None, *,
           deadline: float | None = None, stats: SearchStats | None = None, progress=None,
           judge: Judge | None = None, accept=None, pool: RegionPool | None = None) -> Graph:
    """``g`` optimized region by region (:func:`tvm_taso.search.regions.search_regions`) with the
    search ``options.kind``: ``"backtrack"``, ``"eqsat"`` or ``"auto"`` (eqsat, and backtracking
    too on small regions, the cheaper kept). The search ends by ``deadline`` (a
    ``time.perf_counter()`` value; default ``options.time_limit`` from now). ``judge`` has the
    last word on each region's rewrite; ``accept`` checks each region's result can be written
    back. Regions are searched ahead in ``options.workers`` processes (:mod:`.pool`; ``pool``:
    one started for the whole run, else one for this call); the result is the serial run's."""
    options = options or SearchOptions()
    check_search(options.kind)
    if deadline is None:
        deadline = time.perf_counter() + options.time_limit
    own = pool is None
    if own:
        pool = RegionPool.for_run(rules, cost, options)
    try:
        return search_regions(g, region_search(rules, cost, options), cost, options, deadline=deadline,
                              stats=stats if stats is not None else SearchStats(), progress=progress, judge=judge,
                              accept=accept, pool=pool)
    finally:
        if own and pool is not None:
            pool.close()
