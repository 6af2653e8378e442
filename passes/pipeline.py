"""The ``"taso"`` pipeline: ``TasoOptimize``, then the build pipeline of the target."""

from __future__ import annotations

import tvm
from tvm import relax

from tvm_taso import target as targets

from .taso_optimize import TasoOptimize


def taso_pipeline(database=None, **taso_options) -> tvm.transform.Pass:
    """``TasoOptimize`` followed by the default build pipeline ``tvm.compile`` would use for
    the target (the target's own pipeline on GPUs, the generic one on CPUs); with ``database``
    (a MetaSchedule work dir, ``tvm-taso tune``), its tuned kernels applied after fusion."""

    @tvm.transform.module_pass(opt_level=0, name="TasoPipeline")
    def _pipeline(mod: tvm.IRModule, ctx: tvm.transform.PassContext) -> tvm.IRModule:
        target = tvm.target.Target.current(allow_none=True)
        mod = TasoOptimize(target=target, **taso_options)(mod)
        if database is not None:
            from tvm_taso.cost.kernel_build import build_pipeline as tuned_build

            return tuned_build(targets.parse(target), database)(mod)
        return build_pipeline(target)(mod)

    return _pipeline


def build_pipeline(target) -> tvm.transform.Pass:
    """The Relax pipeline ``tvm.compile`` would use for ``target`` (None: the CPU): the target's
    own on GPUs, the generic one on CPUs."""
    if target is not None and targets.is_gpu(target):
        try:
            return relax.get_default_pipeline(targets.parse(target))
        except (ValueError, AttributeError):
            pass
    return relax.get_pipeline("default")


def register() -> None:
    """Register ``relax.get_pipeline("taso")`` (idempotent)."""
    relax.pipeline.PIPELINE_MAP.setdefault("taso", taso_pipeline)
