"""The ``"taso"`` pipeline: ``TasoOptimize``, then the build pipeline of the target."""

from __future__ import annotations

import tvm
from tvm import relax

from tvm_taso import target as targets

from .taso_optimize import TasoOptimize


def taso_pipeline(**taso_options) -> tvm.transform.Pass:
    """``TasoOptimize`` followed by the default build pipeline ``tvm.compile`` would use for
    the target (the target's own pipeline on GPUs, the generic one on CPUs)."""

    @tvm.transform.module_pass(opt_level=0, name="TasoPipeline")
    def _pipeline(mod: tvm.IRModule, ctx: tvm.transform.PassContext) -> tvm.IRModule:
        target = tvm.target.Target.current(allow_none=True)
        mod = TasoOptimize(target=target, **taso_options)(mod)
        if target is not None and targets.is_gpu(target):
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
    relax.pipeline.PIPELINE_MAP.setdefault("taso", taso_pipeline)
