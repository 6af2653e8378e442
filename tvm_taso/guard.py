"""The guard: keep a rewrite only when it is measured faster end to end.

A cost model is a prediction; the guard makes "never slower than before" a measured fact, at
the price of two builds. :func:`guard` compiles the original and the rewritten module for the
target, times them side by side on this machine's device and keeps the rewrite only if it won
at least three rounds in four (:func:`is_faster`). :func:`verdict` is that decision on builds
made elsewhere (the benchmark harness passes MetaSchedule-tuned ones).
"""

from __future__ import annotations

import logging
import time

from tvm_taso import target as targets
from tvm_taso.cost.latency import CompiledModule, compare_builds, compare_modules
from tvm_taso.runtime import inputs_for

log = logging.getLogger("tvm_taso.guard")

KEPT = "faster in at least 3 rounds of 4"
REVERTED = "not measurably faster"


def is_faster(summary: dict) -> bool:
    """The guard's rule: the rewrite won at least three rounds in four (lower quartile of the
    pairwise speedups above 1), so one lucky round cannot keep a rewrite that is not faster."""
    return summary["ratio_low"] > 1.0


def decide(result: dict, how: str = "") -> dict:
    """The guard's verdict on a side-by-side timing (:func:`~tvm_taso.cost.latency.compare_builds`):
    the timing summary without its raw samples, plus ``kept``, ``measured`` and ``reason``
    (``how`` the modules were built, prefixed to it)."""
    result = {k: v for k, v in result.items() if k != "samples_ms"}
    kept = is_faster(result)
    reason = KEPT if kept else REVERTED
    log.info("guard: %.3fx faster (quartiles %.3f-%.3f over %d rounds): %s", result["ratio"], result["ratio_low"],
             result["ratio_high"], result["rounds"], "kept" if kept else "reverted to the original")
    return dict(result, kept=kept, measured=True, reason=f"{how}; {reason}" if how else reason)


def verdict(builds: dict[str, CompiledModule], repeats: int, min_repeat_ms: int, how: str = "") -> dict:
    """Time ``builds["before"]`` and ``builds["after"]`` side by side and :func:`decide`."""
    t0 = time.perf_counter()
    result = decide(compare_builds(builds, repeats, min_repeat_ms), how)
    result["seconds"] = time.perf_counter() - t0
    return result


def guard(before, after, target, repeats: int = 7) -> dict:
    """Compile both modules with the target's default pipeline and :func:`decide` by timing
    them ``repeats`` rounds. Without a device for the target the rewrite is kept unmeasured; a
    module that does not build or run is not faster (the original is kept)."""
    target = targets.parse(target)
    if targets.device(target) is None:
        log.warning("guard: no %s device here to time on; keeping the rewrite unmeasured", target.kind.name)
        return {"kept": True, "measured": False, "reason": f"no {target.kind.name} device on this machine"}
    t0 = time.perf_counter()
    try:
        result = compare_modules(before, after, target, inputs_for(before), repeats=repeats, min_repeat_ms=50)
    except Exception as err:  # noqa: BLE001 - a module that does not build is not faster
        log.warning("guard: timing failed (%s: %s); keeping the original", type(err).__name__, err)
        return {"kept": False, "measured": False, "reason": f"timing failed: {type(err).__name__}: {err}"}
    return dict(decide(result), seconds=time.perf_counter() - t0)
