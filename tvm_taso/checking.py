"""Running models to compare and time them: the ``--check`` of ``tvm-taso optimize`` and the
side-by-side latency of ``tvm-taso bench``."""

from __future__ import annotations

import numpy as np

from .onnx_import import InputError

TOLERANCE = 1e-4


def relative_error(expected: list[np.ndarray], got: list[np.ndarray]) -> float:
    """Largest ``max|a-b| / max|a|`` over the outputs (inf on a count or shape mismatch)."""
    if len(expected) != len(got):
        return float("inf")
    worst = 0.0
    for a, b in zip(expected, got):
        a, b = np.asarray(a, np.float64), np.asarray(b, np.float64)
        if a.shape != b.shape:
            return float("inf")
        worst = max(worst, float(np.abs(a - b).max(initial=0.0) / (np.abs(a).max(initial=0.0) + 1e-30)))
    return worst


def inputs_for(mod, given: dict | None = None, seed: int = 0) -> list[np.ndarray]:
    """Arrays for ``mod["main"]``'s parameters: ``given`` by name (shapes checked), else random."""
    rng = np.random.default_rng(seed)
    given = dict(given or {})
    arrays = []
    params = mod["main"].params
    names = {p.name for p in params}
    if set(given) - names:
        raise InputError(f"no input named {', '.join(sorted(set(given) - names))} (inputs: {', '.join(sorted(names))})")
    for p in params:
        shape = tuple(int(d) for d in p.ty.shape)
        dtype = str(p.ty.dtype)
        if p.name in given:
            a = np.asarray(given[p.name])
            if a.shape != shape:
                raise InputError(f"input {p.name!r} must have shape {'x'.join(map(str, shape))}, "
                                 f"got {'x'.join(map(str, a.shape))}")
            arrays.append(a.astype(dtype))
        elif dtype.startswith("float"):
            arrays.append(rng.standard_normal(shape).astype(dtype))
        else:
            arrays.append(rng.integers(0, 2, size=shape).astype(dtype))
    return arrays


def _onnxruntime_outputs(proto, feeds: dict) -> list[np.ndarray]:
    import onnxruntime as ort

    opts = ort.SessionOptions()
    opts.graph_optimization_level = ort.GraphOptimizationLevel.ORT_DISABLE_ALL
    sess = ort.InferenceSession(proto.SerializeToString(), opts, providers=["CPUExecutionProvider"])
    return sess.run(None, feeds)


def compare_onnx(original, optimized, mod, seed: int = 0) -> dict:
    """Run both ONNX models on the same random inputs (onnxruntime when installed, else TVM on
    llvm) and report the largest relative error."""
    from .examples import run
    from .onnx_import import load_onnx

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
    import tvm

    from . import passes
    from .latency import CompiledModule, device_for, side_by_side, speedup

    t = tvm.target.Target(target)
    if device_for(t) is None:
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
