"""The searches by name: ``options.kind`` to the search that runs on one region, for the run in
this process and for the region workers (:mod:`.pool`) alike."""

from __future__ import annotations

from tvm_taso.cost.model import CostModel
from tvm_taso.rewrite.rule import Rule
from tvm_taso.search.backtrack import Backtrack
from tvm_taso.search.eqsat import EqsatRegion, require_egglog
from tvm_taso.search.options import SearchOptions, check_kind
from tvm_taso.search.regions import RegionSearch


def check_search(kind: str) -> None:
    """ValueError for an unknown search; ImportError when eqsat is asked for without egglog."""
    check_kind(kind)
    if kind != "backtrack":
        require_egglog()


def region_search(rules: list[Rule], cost: CostModel, options: SearchOptions) -> RegionSearch:
    """The search ``options.kind`` asks for, on one region at a time."""
    if options.kind == "backtrack":
        return Backtrack(rules, cost, options)
    return EqsatRegion(rules, cost, options)
