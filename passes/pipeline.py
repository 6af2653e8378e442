"""The ``"taso"`` pipeline: ``TasoOptimize``, then the build pipeline of the target."""

from __future__ import annotations

import tvm
from tvm import relax

from tvm_taso import target as targets
from tvm_taso.cost.kernel_build import build_pipeline

from .taso_optimize import TasoOptimize


def taso_pipeline(database=None, **taso_options) -> tvm.transform.Pass:
    """``TasoOptimize`` followed by the build pipeline of the target
    (:func:`~tvm_taso.cost.kernel_build.build_pipeline`: the target's own on GPUs, the generic
    one with default schedules on CPUs); with ``database`` (a MetaSchedule work dir, ``tvm-taso
    tune``), its tuned kernels applied after fusion."""

    @tvm.transform.module_pass(opt_level=0, name="TasoPipeline")
    def _pipeline(mod: tvm.IRModule, ctx: tvm.transform.PassContext) -> tvm.IRModule:
        target = tvm.target.Target.current(allow_none=True)
        mod = TasoOptimize(target=target, **taso_options)(mod)
        return build_pipeline(targets.parse(target), database)(mod)

    return _pipeline


def register() -> None:
    """Register ``relax.get_pipeline("taso")`` (idempotent)."""
    relax.pipeline.PIPELINE_MAP.setdefault("taso", taso_pipeline)
