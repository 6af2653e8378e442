"""``tvm-taso bench``'s TVM side: a model compiled with the target's build pipeline and with
TasoOptimize, timed side by side."""

from __future__ import annotations

import numpy as np

from tvm_taso.errors import InputError


def bench(mod, inputs, target, repeat: int = 10, options=None, database=None) -> dict:
    """Latency of ``mod`` compiled for ``target`` with its build pipeline
    (:func:`~tvm_taso.cost.kernel_build.build_pipeline`) and with the
    ``"taso"`` pipeline (its search settings ``options``, a :class:`SearchOptions`), both with
    the tuned kernels of the MetaSchedule ``database`` when given, timed side by side in one run;
    ``speedup`` is the median of the pairwise ratios (default / taso)."""
    from tvm_taso import passes
    from tvm_taso import target as targets
    from tvm_taso.cost.kernel_build import build_target
    from tvm_taso.cost.latency import CompiledModule, side_by_side, speedup

    t = build_target(target, database)
    if targets.device(t) is None:
        raise InputError(f"no {t.kind.name} device on this machine to time on")
    builds = {
        "default": CompiledModule(mod, t, inputs, database=database),
        "taso": CompiledModule(mod, t, inputs, passes.taso_pipeline(options=options, database=database)),
    }
    samples = side_by_side({k: (lambda m=m: m.time_ms(50)) for k, m in builds.items()}, repeat)
    result = {}
    labels = {"default": "TVM build pipeline", "taso": "TVM + TasoOptimize"}
    for key, values in samples.items():
        result[key] = {
            "label": labels[key],
            "median_ms": float(np.median(values)),
            "min_ms": float(np.min(values)),
            "samples_ms": values,
            "compile_seconds": builds[key].compile_seconds,
        }
    summary = speedup(samples["default"], samples["taso"])
    result["speedup"] = summary["ratio"]
    result["speedup_quartiles"] = [summary["ratio_low"], summary["ratio_high"]]
    result["target"] = str(target)
    result["database"] = database
    return result
