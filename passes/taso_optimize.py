"""``TasoOptimize``: the Relax pass that runs tvm-taso's cost-based search."""

from __future__ import annotations

import tvm


@tvm.transform.module_pass(opt_level=0, name="TasoOptimize")
class TasoOptimize:
    """Rewrite the module's dataflow blocks with TASO substitutions chosen by cost.

    Every Relax function's dataflow blocks are split into regions and searched (best-first,
    TASO's backtracking search) with the rule library; the cheapest graph under the cost model
    replaces each block, and weight-only subexpressions are folded to constants. Code the
    optimizer does not understand (unknown ops, non-dataflow blocks) is left as it was, with one
    :class:`~tvm_taso.driver.TasoSkippedWarning` naming it; an internal failure keeps the
    original function, so the pass never fails a pipeline. Symbolic shapes (a sequence length)
    stay symbolic: the search prices them at representative sizes (``shapes``) and keeps only
    rewrites that hold for every size and pay at each priced one.

    Parameters
    ----------
    target : the target to price candidates for; default the enclosing ``with target:``
        (``tvm.compile`` sets it), else the CPU.
    rules : list of :class:`~tvm_taso.rewrite.rule.Rule`; default the shipped library.
    cost_model : a :class:`~tvm_taso.cost.model.CostModel` or ``"analytic"`` / ``"auto"``.
    alpha, budget, time_limit, region_size, min_gain, max_weight_growth, search, workers : the
        search settings of :func:`tvm_taso.optimize` (TASO's relaxation, graphs expanded per
        region, seconds for the whole search, ops per region, least relative gain, largest
        growth of the weights, ``"backtrack"``/``"eqsat"``/``"auto"``, processes searching
        regions); one not given takes :class:`~tvm_taso.search.options.SearchOptions`' default.
    options : a :class:`~tvm_taso.search.options.SearchOptions` instead of those settings.
    guard : time the rewritten module against the original on this machine's device and keep
        it only when measured faster (two extra builds; see :func:`tvm_taso.optimize`).
    shapes : sizes to price symbolic dimensions at, ``{"seq_len": [1, 128, 2048]}``; default
        each function's ``tir_var_lower_bound`` / ``tir_var_upper_bound``, else 1 and 128
        (see :func:`tvm_taso.optimize`).

    Options out of range and unknown targets raise ValueError (one line) here, at
    construction; what happens inside a pipeline never fails it.

    The report of the last run is kept in ``last_report`` (JSON-serializable dict).
    """

    def __init__(self, target=None, *, rules=None, cost_model=None, alpha=None, budget=None, time_limit=None,
                 guard=False, region_size=None, min_gain=None, search=None, workers=None, shapes=None,
                 max_weight_growth=None, options=None):
        from tvm_taso import target as targets
        from tvm_taso.ir import dims
        from tvm_taso.search import SearchOptions, check_search

        self.options = SearchOptions.from_keywords(options, alpha=alpha, budget=budget, time_limit=time_limit,
                                                   region_size=region_size, min_gain=min_gain, search=search,
                                                   workers=workers, max_weight_growth=max_weight_growth)
        check_search(self.options.kind)
        self.target = targets.resolve(target) if target is not None else None
        self.rules = rules
        self.cost_model = cost_model
        self.guard = guard
        self.shapes = dims.checked_sizes(shapes)
        self.last_report = None

    def transform_module(self, mod: tvm.IRModule, ctx: tvm.transform.PassContext) -> tvm.IRModule:
        from tvm_taso.driver import optimize

        new_mod, self.last_report = optimize(mod, self.target, rules=self.rules, cost_model=self.cost_model,
                                             guard=self.guard, options=self.options, shapes=self.shapes)
        return new_mod
