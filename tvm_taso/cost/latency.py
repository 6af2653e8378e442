"""Latency measured side by side: several variants of one computation timed in the same run,
alternating (the order flips every round so that neither variant always runs on a warmer
machine), and each ratio computed pair by pair before taking medians -- machines drift, and a
ratio of two medians taken minutes apart mixes the drift into the result.

Used by the guard (:mod:`tvm_taso.guard`: keep a rewrite only when it is measured faster), by
``tvm-taso bench`` and by the benchmark harness (``python -m benchmarks.run``).
"""

from __future__ import annotations

import logging
import time
from collections import OrderedDict
from typing import Callable

import numpy as np

from tvm_taso import target as targets
from tvm_taso.runtime import flatten

log = logging.getLogger(__name__)


# the last builds of a module for a target with a named pipeline: (target, pipeline, MetaSchedule
# database, structural hash) -> (module, executable, seconds its build took). A guard builds the modules it times, and
# a benchmark then builds the same ones again to run them (or the original twice, when the guard
# kept nothing); a custom pipeline (a Pass) is built every time.
_BUILT: OrderedDict = OrderedDict()
BUILDS_KEPT = 8


def _compiled(mod, target, pipeline, database: str | None = None) -> tuple[object, float]:
    """``mod`` compiled for ``target`` (a ``tvm.target.Target``; with no ``pipeline``, the build
    pipeline with ``database``'s tuned schedules): the executable and the seconds its build took,
    taken from the last builds when one of them is the same module."""
    import tvm
    import tvm_ffi

    from tvm_taso.cost.kernel_build import build_pipeline

    key = None
    if pipeline is None or isinstance(pipeline, str):
        key = (str(target), pipeline, database, tvm_ffi.structural_hash(mod))
        found = _BUILT.get(key)
        if found is not None and tvm_ffi.structural_equal(found[0], mod):
            _BUILT.move_to_end(key)
            return found[1], found[2]
    t0 = time.perf_counter()
    with target:
        exe = tvm.compile(mod, target=target,
                          relax_pipeline=build_pipeline(target, database) if pipeline is None else pipeline)
    seconds = time.perf_counter() - t0
    if key is not None:
        _BUILT[key] = (mod, exe, seconds)
        while len(_BUILT) > BUILDS_KEPT:
            _BUILT.popitem(last=False)
    return exe, seconds


class CompiledModule:
    """``mod`` compiled for ``target`` with a Relax pipeline (None: what a user's build runs,
    :func:`~tvm_taso.cost.kernel_build.build_pipeline`, with ``database``'s tuned schedules when
    given; a name or a Pass), loaded on the device with its inputs. The same module built again for the same
    target and named pipeline takes the last build's executable (``compile_seconds`` is that
    build's)."""

    def __init__(self, mod, target, inputs: list[np.ndarray], pipeline=None, database: str | None = None):
        import tvm
        from tvm import relax

        self.target = targets.parse(target)
        self.dev = targets.device(self.target)
        if self.dev is None:
            raise RuntimeError(f"no {self.target.kind.name} device on this machine to run on")
        if pipeline is not None and database is not None:
            raise ValueError("a MetaSchedule database is applied by the build pipeline: give a pipeline or a database")
        exe, self.compile_seconds = _compiled(mod, self.target, pipeline, database)
        self.vm = relax.VirtualMachine(exe, self.dev)
        self.args = [tvm.runtime.tensor(a, self.dev) for a in inputs]

    def run(self) -> list[np.ndarray]:
        return flatten(self.vm["main"](*self.args))

    def time_ms(self, min_repeat_ms: int = 100) -> float:
        """One sample: mean milliseconds per call over at least ``min_repeat_ms``."""
        timer = self.vm.time_evaluator("main", self.dev, number=1, repeat=1, min_repeat_ms=min_repeat_ms)
        return float(timer(*self.args).mean) * 1e3


def side_by_side(samplers: dict[str, Callable[[], float]], repeats: int, time_limit: float | None = None) -> dict:
    """Call every sampler (each returns one latency sample, in ms) once per round, rotating
    the order (A B, B A for two; A B C, B C A, C A B for three) so that every variant runs in
    every position equally often, for ``repeats`` rounds (fewer, but at least 2, if
    ``time_limit`` seconds pass). Returns ``{name: [ms, ...]}``; sample ``i`` of every variant
    comes from round ``i``."""
    for sample in samplers.values():
        sample()  # warm up: first calls pay for page faults and lazy initialisation
    names = list(samplers)
    samples: dict[str, list[float]] = {n: [] for n in names}
    t0 = time.perf_counter()
    for r in range(max(1, repeats)):
        k = r % len(names)
        for name in names[k:] + names[:k]:
            samples[name].append(samplers[name]())
        if time_limit is not None and r >= 1 and time.perf_counter() - t0 > time_limit:
            log.info("stopped timing after %d rounds (%.0f s)", r + 1, time.perf_counter() - t0)
            break
    return samples


def speedup(before_ms: list[float], after_ms: list[float]) -> dict:
    """``before / after`` pair by pair: the median ratio and its quartiles (the noise band)."""
    ratios = np.asarray(before_ms, dtype=float) / np.asarray(after_ms, dtype=float)
    low, median, high = np.percentile(ratios, [25, 50, 75])
    return {
        "ratio": float(median),
        "ratio_low": float(low),
        "ratio_high": float(high),
        "before_ms": float(np.median(before_ms)),
        "after_ms": float(np.median(after_ms)),
        "rounds": len(ratios),
    }


def compare_builds(builds: dict[str, CompiledModule], repeats: int = 10, min_repeat_ms: int = 100,
                   time_limit: float | None = None) -> dict:
    """Time ``builds["before"]`` and ``builds["after"]`` side by side. Returns :func:`speedup`'s
    summary plus ``compile_seconds`` and the raw samples."""
    samples = side_by_side({k: (lambda m=m: m.time_ms(min_repeat_ms)) for k, m in builds.items()}, repeats, time_limit)
    result = speedup(samples["before"], samples["after"])
    result["compile_seconds"] = {k: m.compile_seconds for k, m in builds.items()}
    result["samples_ms"] = samples
    return result


def compare_modules(before, after, target, inputs: list[np.ndarray], *, repeats: int = 10, pipeline=None,
                    database: str | None = None, min_repeat_ms: int = 100, time_limit: float | None = None) -> dict:
    """Compile both modules with the same pipeline (or ``database``, :class:`CompiledModule`) and
    time them side by side on ``target`` (:func:`compare_builds`)."""
    builds = {"before": CompiledModule(before, target, inputs, pipeline, database),
              "after": CompiledModule(after, target, inputs, pipeline, database)}
    return compare_builds(builds, repeats, min_repeat_ms, time_limit)
