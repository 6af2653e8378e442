"""The whole-model guard in onnxruntime: an ONNX model and its rewrite timed side by side with
the target's provider, the rewrite kept only when it measured faster (:func:`tvm_taso.guard.decide`)."""

from __future__ import annotations

import logging
import time

from tvm_taso.cost.latency import compare_builds
from tvm_taso.guard import decide
from tvm_taso.ort.runtime import OrtSession

log = logging.getLogger("tvm_taso.guard")


def guard_in_runtime(before, after, feeds: dict, runtime, repeats: int = 15) -> dict:
    """The guard in onnxruntime: the ONNX models ``before`` and ``after`` loaded with ``runtime``
    (an :class:`~tvm_taso.ort.runtime.OrtRuntime`) and timed side by side on ``feeds`` (inputs by
    name), ``repeats`` rounds of at least 200 ms each; a model that does not load or run is not
    faster."""
    t0 = time.perf_counter()
    try:
        builds = {"before": OrtSession(runtime, before, feeds), "after": OrtSession(runtime, after, feeds)}
        result = compare_builds(builds, repeats, min_repeat_ms=200)
    except Exception as err:  # noqa: BLE001 - a model that does not run is not faster
        log.warning("guard: timing in onnxruntime failed (%s: %s); keeping the original", type(err).__name__, err)
        return {"kept": False, "measured": False, "runtime": str(runtime),
                "reason": f"timing failed: {type(err).__name__}: {err}".splitlines()[0]}
    return dict(decide(result), runtime=str(runtime), seconds=time.perf_counter() - t0)
