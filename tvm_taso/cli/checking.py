"""Running models to compare and time them: the ``--check`` of ``tvm-taso optimize`` and the
side-by-side latency of ``tvm-taso bench``."""

from __future__ import annotations

import numpy as np

from tvm_taso.io.onnx_import import InputError
from tvm_taso.numerics import TOLERANCE, relative_error
from tvm_taso.runtime import inputs_for, run


class CheckFailed(RuntimeError):
    """``--check`` found different outputs."""


def _onnxruntime_outputs(proto, feeds: dict) -> list[np.ndarray]:
    import onnxruntime as ort

    opts = ort.SessionOptions()
    opts.graph_optimization_level = ort.GraphOptimizationLevel.ORT_DISABLE_ALL
    sess = ort.InferenceSession(proto.SerializeToString(), opts, providers=["CPUExecutionProvider"])
    return sess.run(None, feeds)


def compare_onnx(original, optimized, mod, seed: int = 0) -> dict:
    """Run both ONNX models on the same random inputs (onnxruntime when installed, else TVM on
    llvm) and report the largest relative error."""
    from tvm_taso.io.onnx_import import load_onnx

    inputs = inputs_for(mod, seed=seed)
    names = [p.name for p in mod["main"].params]
    try:
        import onnxruntime  # noqa: F401

        feeds = dict(zip(graph_input_names(original, len(names)), inputs))
        expected = _onnxruntime_outputs(original, feeds)
        feeds = dict(zip(graph_input_names(optimized, len(names)), inputs))
        got = _onnxruntime_outputs(optimized, feeds)
        runtime = "onnxruntime"
    except ImportError:
        expected = run(mod, inputs)
        got = run(load_onnx(optimized), inputs)
        runtime = "tvm (llvm)"
    err = relative_error(expected, got)
    return {"ok": err <= TOLERANCE, "max_relative_error": err, "tolerance": TOLERANCE, "runtime": runtime}


def graph_input_names(proto, count: int) -> list[str]:
    """The first ``count`` graph inputs of ``proto`` that are not initializers."""
    inits = {i.name for i in proto.graph.initializer}
    names = [i.name for i in proto.graph.input if i.name not in inits]
    return names[:count]


def bench(mod, inputs, target, repeat: int = 10, time_limit: float = 60.0) -> dict:
    """Latency of ``mod`` compiled for ``target`` with the default pipeline and with the
    ``"taso"`` pipeline, timed side by side in one run; ``speedup`` is the median of the
    pairwise ratios (default / taso)."""
    from tvm_taso import passes
    from tvm_taso import target as targets
    from tvm_taso.cost.latency import CompiledModule, side_by_side, speedup

    t = targets.parse(target)
    if targets.device(t) is None:
        raise InputError(f"no {t.kind.name} device on this machine to time on")
    builds = {
        "default": CompiledModule(mod, t, inputs, "default"),
        "taso": CompiledModule(mod, t, inputs, passes.taso_pipeline(time_limit=time_limit)),
    }
    samples = side_by_side({k: (lambda m=m: m.time_ms(50)) for k, m in builds.items()}, repeat)
    result = {}
    labels = {"default": "TVM default pipeline", "taso": "TVM + TasoOptimize"}
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
    return result
