"""Running models to compare and time them: the ``--check`` of ``tvm-taso optimize`` and the
side-by-side latency of ``tvm-taso bench``."""

from __future__ import annotations

import logging
import time

import numpy as np

from .onnx_import import InputError

log = logging.getLogger(__name__)

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

        feeds = dict(zip(_graph_input_names(original, len(names)), inputs))
        expected = _onnxruntime_outputs(original, feeds)
        feeds = dict(zip(_graph_input_names(optimized, len(names)), inputs))
        got = _onnxruntime_outputs(optimized, feeds)
        runtime = "onnxruntime"
    except ImportError:
        expected = run(mod, inputs)
        got = run(load_onnx(optimized), inputs)
        runtime = "tvm (llvm)"
    err = relative_error(expected, got)
    return {"ok": err <= TOLERANCE, "max_relative_error": err, "tolerance": TOLERANCE, "runtime": runtime}


def _graph_input_names(proto, count: int) -> list[str]:
    inits = {i.name for i in proto.graph.initializer}
    names = [i.name for i in proto.graph.input if i.name not in inits]
    return names[:count]


def bench(mod, inputs, target, repeat: int = 10, time_limit: float = 60.0) -> dict:
    """Latency of ``mod`` compiled for ``target`` with the default pipeline and with the
    ``"taso"`` pipeline, measured in one run, alternating, and their ratio (median over median)."""
    import tvm
    from tvm import relax

    from . import passes

    t = tvm.target.Target(target)
    dev = tvm.cpu() if t.kind.name == "llvm" else tvm.device(t.kind.name, 0)
    if not dev.exist:
        raise InputError(f"no {t.kind.name} device on this machine to time on")
    builds = {}
    for key, pipeline in (("default", "default"), ("taso", passes.taso_pipeline(time_limit=time_limit))):
        t0 = time.perf_counter()
        ex = tvm.compile(mod, target=t, relax_pipeline=pipeline)
        vm = relax.VirtualMachine(ex, dev)
        args = [tvm.runtime.tensor(a, dev) for a in inputs]
        vm["main"](*args)  # warm up
        builds[key] = (vm, args, time.perf_counter() - t0)
    samples = {"default": [], "taso": []}
    for _ in range(repeat):
        for key, (vm, args, _) in builds.items():
            timer = vm.time_evaluator("main", dev, number=1, repeat=1, min_repeat_ms=50)
            samples[key].append(timer(*args).median * 1e3)
    result = {}
    labels = {"default": "TVM default pipeline", "taso": "TVM + TasoOptimize"}
    for key, values in samples.items():
        result[key] = {
            "label": labels[key],
            "median_ms": float(np.median(values)),
            "min_ms": float(np.min(values)),
            "samples_ms": values,
            "compile_seconds": builds[key][2],
        }
    result["speedup"] = result["default"]["median_ms"] / result["taso"]["median_ms"]
    result["target"] = str(target)
    return result
