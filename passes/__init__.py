"""TVM integration: the ``TasoOptimize`` Relax pass and the ``"taso"`` pipeline.

Installed as ``tvm_taso.passes``. Importing :mod:`tvm_taso` registers the pipeline, so
``tvm.compile(mod, target, relax_pipeline=relax.get_pipeline("taso"))`` works.
"""

from __future__ import annotations

import logging

import tvm
from tvm import relax

log = logging.getLogger("tvm_taso")


@tvm.transform.module_pass(opt_level=0, name="TasoOptimize")
class TasoOptimize:
    """Rewrite the module's dataflow blocks with TASO substitutions chosen by cost.

    Every Relax function's dataflow blocks are split into regions and searched (best-first,
    TASO's backtracking search) with the rule library; the cheapest graph under the cost model
    replaces each block, and weight-only subexpressions are folded to constants. Code the
    optimizer does not understand (unknown ops, symbolic shapes, non-dataflow blocks) is left
    as it was, with one :class:`~tvm_taso.optimize.TasoSkippedWarning` naming it; an internal
    failure keeps the original function, so the pass never fails a pipeline.

    Parameters
    ----------
    target : the target to price candidates for; default the enclosing ``with target:``
        (``tvm.compile`` sets it), else the CPU.
    rules : list of :class:`~tvm_taso.rules.Rule`; default the shipped library.
    cost_model : a :class:`~tvm_taso.cost.CostModel` or ``"analytic"`` / ``"auto"``.
    alpha : relaxation of the search (TASO's alpha, default 1.05).
    budget : graphs expanded per search region.
    time_limit : seconds for the whole search.
    guard : time the rewritten module against the original on this machine's device and keep
        it only when measured faster (two extra builds; see :func:`tvm_taso.optimize`).

    The report of the last run is kept in ``last_report`` (JSON-serializable dict).
    """

    def __init__(self, target=None, rules=None, cost_model=None, alpha=1.05, budget=200, time_limit=60.0, guard=False):
        self.target = target
        self.rules = rules
        self.cost_model = cost_model
        self.alpha = alpha
        self.budget = budget
        self.time_limit = time_limit
        self.guard = guard
        self.last_report = None

    def transform_module(self, mod: tvm.IRModule, ctx: tvm.transform.PassContext) -> tvm.IRModule:
        from tvm_taso.optimize import optimize

        new_mod, self.last_report = optimize(
            mod,
            target=self.target,
            rules=self.rules,
            cost_model=self.cost_model,
            alpha=self.alpha,
            budget=self.budget,
            time_limit=self.time_limit,
            guard=self.guard,
        )
        return new_mod


def taso_pipeline(**taso_options) -> tvm.transform.Pass:
    """``TasoOptimize`` followed by the default build pipeline ``tvm.compile`` would use for
    the target (the target's own pipeline on GPUs, the generic one on CPUs)."""

    @tvm.transform.module_pass(opt_level=0, name="TasoPipeline")
    def _pipeline(mod: tvm.IRModule, ctx: tvm.transform.PassContext) -> tvm.IRModule:
        target = tvm.target.Target.current(allow_none=True)
        mod = TasoOptimize(target=target, **taso_options)(mod)
        if target is not None and "gpu" in target.keys:
            try:
                rest = relax.get_default_pipeline(target)
            except (ValueError, AttributeError):
                rest = relax.get_pipeline("default")
        else:
            rest = relax.get_pipeline("default")
        return rest(mod)

    return _pipeline


def register() -> None:
    """Register ``relax.get_pipeline("taso")`` (idempotent)."""
    from tvm.relax import pipeline

    pipeline.PIPELINE_MAP.setdefault("taso", taso_pipeline)


__all__ = ["TasoOptimize", "taso_pipeline", "register"]
