"""The graph searches, run region by region behind one :func:`search`: TASO's cost-based
backtracking (:mod:`.backtrack`) and equality saturation, TENSAT's (:mod:`.eqsat`)."""

from __future__ import annotations

from tvm_taso.cost.model import CostModel
from tvm_taso.ir.graph import Graph
from tvm_taso.rewrite.rule import Rule
from tvm_taso.search import backtrack
from tvm_taso.search.backtrack import SearchStats
from tvm_taso.search.eqsat import EqsatLimits, EqsatRegion, require_egglog

SEARCHES = ("backtrack", "eqsat", "auto")

__all__ = ["SEARCHES", "SearchStats", "check_search", "search"]


def check_search(kind: str) -> None:
    """ValueError for an unknown search; ImportError when eqsat is asked for without egglog."""
    if kind not in SEARCHES:
        raise ValueError(f"search must be one of {', '.join(SEARCHES)}, got {kind!r}")
    if kind != "backtrack":
        require_egglog()


def search(g: Graph, rules: list[Rule], cost: CostModel, alpha: float = 1.05, budget: int = 200,
           time_limit: float = 60.0, region_size: int = 32, stats: SearchStats | None = None, progress=None,
           patience: int = 64, min_gain: float = 1e-6, kind: str = "backtrack",
           limits: EqsatLimits | None = None, judge=None, accept=None) -> Graph:
    """:func:`tvm_taso.search.backtrack.search` (regions, reuse of identical regions, the
    ``judge``'s last word on each) with the region search ``kind``: ``"backtrack"``, ``"eqsat"``
    (:class:`~tvm_taso.search.eqsat.EqsatRegion` within ``limits``) or ``"auto"`` (eqsat, and
    backtracking too on small regions, the cheaper kept); ``accept`` checks each region's
    result can be written back."""
    check_search(kind)
    region_search = None
    if kind != "backtrack":
        region_search = EqsatRegion(rules, cost, limits, auto=kind == "auto", alpha=alpha, budget=budget,
                                    patience=patience)
    return backtrack.search(g, rules, cost, alpha, budget, time_limit, region_size, stats, progress, patience,
                            region_search=region_search, min_gain=min_gain, judge=judge, accept=accept)
