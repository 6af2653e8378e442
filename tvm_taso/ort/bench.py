"""An original ONNX model and its optimized twin timed side by side in onnxruntime (``tvm-taso
bench`` with an ``ort`` target)."""

from __future__ import annotations

import numpy as np

from tvm_taso import target as targets
from tvm_taso.cost.latency import side_by_side, speedup
from tvm_taso.errors import InputError
from tvm_taso.io.onnx_feeds import integer_ranges, random_feeds
from tvm_taso.ort.runtime import OrtSession


def bench_in_runtime(original, optimized, runtime, given: dict | None = None, repeat: int = 10,
                     min_repeat_ms: int = 100) -> dict:
    """Latency of the ONNX models ``original`` and ``optimized`` (:class:`~tvm_taso.io.onnx_model.OnnxModel`)
    in onnxruntime (``runtime``: an ``ort`` target spelling or :class:`~tvm_taso.ort.runtime.OrtRuntime`),
    timed side by side in one run on the same inputs (``given`` by name, the rest random at the
    priced sizes); ``speedup`` is the median of the pairwise ratios (original / optimized)."""
    runtime = targets.resolve(runtime).runtime
    feeds = random_feeds(original, original.dims, integer_ranges(original))
    unknown = set(given or {}) - set(feeds)
    if unknown:
        raise InputError(f"no input named {', '.join(sorted(unknown))} (inputs: {', '.join(sorted(feeds))})")
    for name, value in (given or {}).items():
        if np.shape(value) != feeds[name].shape:
            shape = "x".join(map(str, feeds[name].shape))
            raise InputError(f"input {name!r} must have shape {shape} (the sizes the model is priced at; --shape "
                             f"sets them), got {'x'.join(map(str, np.shape(value)))}")
    feeds.update({k: np.asarray(v).astype(feeds[k].dtype) for k, v in (given or {}).items()})
    sessions = {"original": OrtSession(runtime, original.proto, feeds),
                "optimized": OrtSession(runtime, optimized.proto, feeds)}
    samples = side_by_side({k: (lambda s=s: s.time_ms(min_repeat_ms)) for k, s in sessions.items()}, repeat)
    ratio = speedup(samples["original"], samples["optimized"])
    result = {"runtime": str(runtime), "rounds": ratio["rounds"], "speedup": ratio["ratio"],
              "speedup_quartiles": [ratio["ratio_low"], ratio["ratio_high"]], "samples_ms": samples}
    for key, ms in samples.items():
        low, median, high = np.percentile(ms, [25, 50, 75])
        result[key] = {"median_ms": float(median), "low_ms": float(low), "high_ms": float(high)}
    return result
