"""The guard: keep a rewrite only when it is measured faster.

A cost model is a prediction; the guard makes "never slower than before" a measured fact, at
the price of two builds. :func:`guard` compiles the original and the rewritten module for the
target, times them side by side on this machine's device and keeps the rewrite only if it won
at least three rounds in four (:func:`is_faster`). :func:`verdict` is that decision on builds
made elsewhere (the benchmark harness passes MetaSchedule-tuned ones).

:class:`RegionGuard` makes the same decision region by region, during the search: each
rewritten region is built and timed against the original region, and only the regions that
measure faster are spliced in, so one rewrite that does not pay no longer costs the model every
rewrite that does. The whole-module guard stays the last word. For an ``ort`` target
(:mod:`tvm_taso.ort`) both regions are written as ONNX models and timed in onnxruntime instead
(:mod:`tvm_taso.ort.guard` holds the whole-model guard in onnxruntime).
"""

from __future__ import annotations

import hashlib
import logging
import time
from pathlib import Path

from tvm_taso import target as targets
from tvm_taso.cost.database import MeasurementDB, Record, db_target
from tvm_taso.cost.kernel_build import build_target, graph_module, random_inputs
from tvm_taso.cost.latency import CompiledModule, compare_builds, compare_modules
from tvm_taso.files import cache_dir
from tvm_taso.ir.graph import Graph, fold_constants
from tvm_taso.runtime import check_sizes, inputs_for

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


def guard(before, after, target, repeats: int = 7, database: str | None = None) -> dict:
    """Compile both modules with the target's build pipeline
    (:func:`~tvm_taso.cost.kernel_build.build_pipeline`; with ``database``, a MetaSchedule work
    dir, its tuned schedules: tuned against tuned) and :func:`decide` by timing them ``repeats``
    rounds. Without a device for the target the rewrite is kept unmeasured; a module that does
    not build or run is not faster (the original is kept)."""
    target = build_target(target, database)
    if targets.device(target) is None:
        log.warning("guard: no %s device here to time on; keeping the rewrite unmeasured", target.kind.name)
        return {"kept": True, "measured": False, "reason": f"no {target.kind.name} device on this machine"}
    t0 = time.perf_counter()
    verdicts = []
    for sizes in check_sizes(before):  # a module with symbolic sizes: kept only if faster at each
        try:
            result = compare_modules(before, after, target, inputs_for(before, sizes=sizes), repeats=repeats,
                                     database=database, min_repeat_ms=50)
        except Exception as err:  # noqa: BLE001 - a module that does not build is not faster
            log.warning("guard: timing failed (%s: %s); keeping the original", type(err).__name__, err)
            return {"kept": False, "measured": False, "reason": f"timing failed: {type(err).__name__}: {err}"}
        verdicts.append(dict(decide(result), sizes=sizes) if sizes else decide(result))
    worst = min(verdicts, key=lambda v: (v["kept"], v.get("ratio", 0.0)))
    extra = {"at_sizes": [{k: v[k] for k in ("sizes", "kept", "ratio") if k in v} for v in verdicts]} \
        if len(verdicts) > 1 else {}
    return dict(worst, seconds=time.perf_counter() - t0, **extra)


class RegionGuard:
    """Decide region by region, from measurements, whether a rewrite is kept.

    Called by the search (``judge`` of :func:`tvm_taso.search.backtrack.search`) with the
    original region and the rewrite it chose, as graphs. Both are folded (weight-only ops are
    constants after TVM's FoldConstant), built with the target's build pipeline
    (:func:`~tvm_taso.cost.kernel_build.graph_module`: leaves are parameters, an opaque call is
    left out, being the same on both sides) and timed side by side, ``repeats`` rounds
    alternating (:func:`~tvm_taso.cost.latency.compare_builds`). The rewrite is kept when it won
    at least three rounds in four (:func:`is_faster`); a region that cannot be built or run is
    not faster.

    Every comparison is a :class:`~tvm_taso.cost.database.Record` in ``regions.jsonl`` beside
    the kernel measurements (``db``: a path or a :class:`MeasurementDB`), keyed by the two
    regions' shape hashes: a repeated layer, or a second run, measures nothing new.

    With ``database`` (a MetaSchedule work dir: the ``tuned`` cost model's) both regions are
    built with its tuned schedules, and the verdicts are kept under a target marked with it.

    For an ``ort`` target (``runtime``: its :class:`~tvm_taso.ort.runtime.OrtRuntime`), each region is
    written as a small ONNX model (:func:`~tvm_taso.ort.pricing.region_model`: its weights initializers,
    the model's ``opset``) and timed in onnxruntime with the runtime's provider and options,
    graph optimizations on; records are kept under the runtime's key.
    """

    def __init__(self, target, repeats: int = 7, min_repeat_ms: int = 20, time_limit: float = 20.0,
                 db: MeasurementDB | str | Path | None = None, opset: int | None = None,
                 database: str | None = None):
        resolved = targets.resolve(target)
        self.runtime, self.opset, self.database = resolved.runtime, opset, database
        self.target = build_target(resolved.tvm, database) if self.runtime is None else resolved.tvm
        # what was built is part of the key: tuned, default-scheduled and plain-loop timings differ
        self.target_key = (self.runtime.key if self.runtime is not None
                           else db_target(targets.canonical(self.target), database))
        self.repeats, self.min_repeat_ms, self.time_limit = repeats, min_repeat_ms, time_limit
        self.db = db if isinstance(db, MeasurementDB) else MeasurementDB(
            Path(db) if db is not None else cache_dir() / "regions.jsonl")
        self.seconds = 0.0  # spent measuring

    def __call__(self, before: Graph, after: Graph) -> dict:
        """The verdict on ``after`` against ``before``; regions with symbolic sizes are timed at
        each of their priced sizes (:attr:`Graph.sizes`), and kept only when faster at every one
        (the verdict is the least favourable, with ``at_sizes`` listing each)."""
        if not before.sizes:
            return self._decide(before, after)
        verdicts = [dict(self._decide(before.at(point), after.at(point)), sizes=dict(point))
                    for point in before.sizes]
        worst = min(verdicts, key=lambda v: (v["kept"], v.get("ratio", 0.0)))
        return dict(worst, at_sizes=[{k: v[k] for k in ("sizes", "kept", "ratio") if k in v} for v in verdicts],
                    from_database=all(v["from_database"] for v in verdicts))

    def _decide(self, before: Graph, after: Graph) -> dict:
        key = hashlib.sha256(f"{before.shape_hash()}:{after.shape_hash()}".encode()).hexdigest()[:32]
        record = self.db.get(key, self.target_key)
        cached = record is not None
        if record is None:
            t0 = time.perf_counter()
            record = self._measure(key, before, after)
            self.seconds += time.perf_counter() - t0
            self.db.add(record)
        timing = record.kernel.get("timing") if record.ok else None
        if timing is None:
            decision = {"kept": False, "reason": f"could not be timed: {record.error}"}
        else:
            kept = is_faster(timing)
            decision = dict(timing, kept=kept, reason=KEPT if kept else REVERTED)
        decision["from_database"] = cached
        log.info("region: %s (%s)%s", "kept" if decision["kept"] else "dropped", decision["reason"]
                 if timing is None else f"{timing['ratio']:.3f}x, quartiles {timing['ratio_low']:.3f}-"
                 f"{timing['ratio_high']:.3f}", ", from the database" if cached else "")
        return decision

    def _measure(self, key: str, before: Graph, after: Graph) -> Record:
        regions = {"before": before.copy(), "after": after.copy()}
        data = {name: g.describe() for name, g in regions.items()}
        try:
            builds = {}
            for name, g in regions.items():
                fold_constants(g)
                builds[name] = self._build(g)
            timing = compare_builds(builds, self.repeats, self.min_repeat_ms, self.time_limit)
        except Exception as err:  # noqa: BLE001 - a region that does not build or run is not faster
            log.debug("timing a region failed", exc_info=True)
            return Record(key, self.target_key, {"regions": data}, "build_error",
                          error=f"{type(err).__name__}: {err}".splitlines()[0])
        samples = timing.pop("samples_ms")
        return Record(key, self.target_key, {"regions": data, "timing": timing}, "ok",
                      median_us=timing["after_ms"] * 1e3, samples_us=[ms * 1e3 for ms in samples["after"]])

    def _build(self, g: Graph):
        """The folded region ``g`` ready to time: compiled by TVM, or loaded in onnxruntime."""
        if self.runtime is not None:
            from tvm_taso.ort.pricing import region_session

            return region_session(self.runtime, g, self.opset)
        mod, refs = graph_module(g)
        return CompiledModule(mod, self.target, random_inputs([g.type_of(r) for r in refs]), database=self.database)

    def summary(self, decisions: list[dict]) -> dict:
        """The report's account of the search's ``decisions`` (:attr:`SearchStats.decisions`)."""
        kept = sum(d["kept"] for d in decisions)
        return {"target": self.target_key, "runtime": str(self.runtime) if self.runtime is not None else "tvm",
                "regions": len(decisions), "kept": kept, "dropped": len(decisions) - kept,
                "from_database": sum(d["from_database"] for d in decisions), "seconds": self.seconds,
                "database": str(self.db.path), "decisions": decisions}
