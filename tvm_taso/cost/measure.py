"""Measured cost: build each kernel with TVM for the target, time it, remember it forever.

* :func:`run_measurement` builds a kernel (:mod:`.kernel_build`) and times it on this machine's
  device with ``relax.VirtualMachine`` and ``time_evaluator``; :func:`measure_kernel` runs it in
  a :class:`~tvm_taso.cost.worker.Worker` process with a timeout and returns a
  :class:`~tvm_taso.cost.database.Record` (a failure is a record with its status: an infinite
  cost to the search, which goes on).
* A *measurer* is what :class:`MeasuredCost` measures through: :class:`LocalMeasurer` (this
  machine) or :class:`~tvm_taso.cost.rpc.RPCMeasurer` / :class:`~tvm_taso.cost.rpc.RPCPool`
  (remote devices), all called like :func:`measure_kernel`.
* :class:`MeasuredCost` is the cost model: a hit in the
  :class:`~tvm_taso.cost.database.MeasurementDB` or a new measurement (recorded), with a
  per-search budget after which it falls back to another model (analytic by default), scaled
  to the measured times.
"""

from __future__ import annotations

import logging
import math
import os
import statistics
import time

from tvm_taso import target as targets
from tvm_taso.cost.analytic import AnalyticCost
from tvm_taso.cost.database import MeasurementDB, Record, db_target
from tvm_taso.cost.kernel_build import MeasureError, build_kernel, kernel_inputs
from tvm_taso.cost.model import CostModel, Kernel, kernels
from tvm_taso.cost.worker import Worker, resolve, shared_worker, short_error

log = logging.getLogger("tvm_taso.cost.measure")

RUN_MEASUREMENT = "tvm_taso.cost.measure:run_measurement"


def run_measurement(request: dict, progress=lambda phase: None, build=build_kernel) -> dict:
    """Build and time one kernel in this process. ``request``: ``kernel`` (Kernel.to_json()),
    ``target`` (canonical string), ``repeats``, ``warmup``, ``min_repeat_ms``, ``database``.
    Returns ``{"status", "median_us", "samples_us", "error"}``. ``build(kernel, target,
    database)`` makes the executable (a built one is loaded instead: :func:`run_built`)."""
    import tvm
    from tvm import relax

    kernel = Kernel.from_json(request["kernel"])
    try:
        ex = build(kernel, request["target"], request.get("database"))
    except Exception as err:  # noqa: BLE001
        return {"status": "build_error", "error": short_error(err)}
    progress("built")
    try:
        dev = targets.device(request["target"])
        if dev is None:
            return {"status": "runtime_error", "error": f"no {targets.kind(request['target'])} device on this machine"}
        vm = relax.VirtualMachine(ex, dev)
        args = [tvm.runtime.tensor(a, dev) for a in kernel_inputs(kernel, target=request["target"])]
        for _ in range(max(1, int(request.get("warmup", 3)))):
            vm["main"](*args)
        dev.sync()
        timer = vm.time_evaluator(
            "main", dev, number=1, repeat=max(1, int(request.get("repeats", 10))),
            min_repeat_ms=int(request.get("min_repeat_ms", 1)),
        )
        samples = [float(s) * 1e6 for s in timer(*args).results]
    except Exception as err:  # noqa: BLE001
        return {"status": "runtime_error", "error": short_error(err)}
    return {"status": "ok", "median_us": statistics.median(samples), "samples_us": samples, "error": ""}


def run_build(request: dict, progress=lambda phase: None) -> dict:
    """Build one kernel in this process and export it to ``request["path"]`` (a builder's half of
    a measurement): ``{"status": "built"}`` or a ``build_error`` result."""
    kernel = Kernel.from_json(request["kernel"])
    try:
        ex = build_kernel(kernel, request["target"], request.get("database"))
        ex.export_library(request["path"])
    except MeasureError as err:
        return {"status": "build_error", "error": f"MeasureError: {err}"}
    except Exception as err:  # noqa: BLE001
        return {"status": "build_error", "error": short_error(err)}
    return {"status": "built", "error": ""}


def run_built(request: dict, progress=lambda phase: None) -> dict:
    """Time a kernel :func:`run_build` exported to ``request["path"]`` (the runner's half):
    :func:`run_measurement`'s result dict."""
    import tvm

    def load(kernel, target, database):
        return tvm.runtime.load_module(request["path"])

    return run_measurement(request, progress, build=load)


def measure_kernel(
    kernel: Kernel,
    target=None,
    repeats: int = 10,
    timeout: float = 60.0,
    *,
    warmup: int = 3,
    min_repeat_ms: int = 1,
    database: str | None = None,
    isolate: bool = True,
    worker: Worker | None = None,
    fn: str | None = None,
) -> Record:
    """Build and time ``kernel`` on ``target``; never raises for the kernel's own failures.

    ``isolate`` (default) runs it in a worker process bounded by ``timeout`` seconds (build and
    run together); ``fn`` ("module:function", taking ``(request, progress)``) replaces
    :func:`run_measurement` (tests inject failures with it)."""
    tstr = targets.canonical(target)
    request = measurement_request(kernel, tstr, repeats, warmup, min_repeat_ms, database, fn or RUN_MEASUREMENT)
    result = run_request(request, timeout, (worker or shared_worker()) if isolate else None,
                         lambda r: resolve(r["fn"])(r, lambda phase: None))
    return result_record(kernel, db_target(tstr, database), result)


def measurement_request(kernel: Kernel, tstr: str, repeats: int, warmup: int, min_repeat_ms: int,
                        database: str | None, fn: str) -> dict:
    """What a worker needs to build and time ``kernel`` for the canonical target ``tstr``."""
    return {
        "kernel": kernel.to_json(), "target": tstr, "repeats": repeats, "warmup": warmup,
        "min_repeat_ms": min_repeat_ms, "database": os.path.abspath(database) if database else None,
        "fn": fn,
    }


def run_request(request: dict, timeout: float, worker: Worker | None, run_inline) -> dict:
    """``request``'s result dict: from ``worker`` (bounded by ``timeout``) when given, else from
    ``run_inline(request)`` in this process, an exception becoming a ``runtime_error`` result."""
    if worker is not None:
        return worker.request(request, timeout)
    try:
        return run_inline(request)
    except Exception as err:  # noqa: BLE001 - the kernel's failure is a record, not an error
        return {"status": "runtime_error", "error": short_error(err)}


def result_record(kernel: Kernel, target: str, result: dict) -> Record:
    """The database record of a measurement ``result`` (a worker's result dict)."""
    status = result.get("status", "runtime_error")
    median = result.get("median_us") if status == "ok" else None
    return Record(
        key=kernel.key(), target=target, kernel=kernel.to_json(), status=status,
        median_us=None if median is None else float(median),
        samples_us=[float(s) for s in result.get("samples_us") or []] if status == "ok" else [],
        error=str(result.get("error") or ""),
        measured_on=str(result.get("measured_on") or ""),
    )


class LocalMeasurer:
    """Measures on this machine with :func:`measure_kernel` (``isolate``, ``worker`` and ``fn``
    as there). With ``builders`` > 1, :meth:`measure` builds many kernels at once in that many
    worker processes and times them one at a time (MetaSchedule's builder / runner split)."""

    def __init__(self, isolate: bool = True, worker: Worker | None = None, fn: str | None = None,
                 builders: int = 1):
        self.isolate, self.worker, self.fn = isolate, worker, fn
        self.builders = builders
        self._builder_workers: list[Worker] = []
        self.build_seconds = 0.0  # wall time of the build phases of :meth:`measure`
        if builders > 1:
            self.measure = self._build_then_time

    def _build_then_time(self, kernel_list, target=None, *, db=None, repeats: int = 10, timeout: float = 60.0,
                         warmup: int = 3, min_repeat_ms: int = 1, database=None, progress=None,
                         skip_known: bool = True) -> list[Record | None]:
        """Build ``kernel_list`` in :attr:`builders` processes at once, then time each built one
        in the measurement worker; one record per kernel, in order (None for a kernel with no
        module form). ``db`` gets the new records."""
        import tempfile
        from concurrent.futures import ThreadPoolExecutor

        tstr = targets.canonical(target)
        record_target = db_target(tstr, database)
        while len(self._builder_workers) < self.builders:
            self._builder_workers.append(Worker())
        free = list(self._builder_workers)
        results: list[Record | None] = [None] * len(kernel_list)
        with tempfile.TemporaryDirectory(prefix="tvm-taso-build-") as tmp:
            requests = []
            for k, kernel in enumerate(kernel_list):
                request = measurement_request(kernel, tstr, repeats, warmup, min_repeat_ms, database,
                                              "tvm_taso.cost.measure:run_build")
                request["path"] = os.path.join(tmp, f"kernel{k}.so")
                requests.append(request)

            def build(request):
                worker = free.pop()
                try:
                    return worker.request(request, timeout)
                finally:
                    free.append(worker)

            t0 = time.perf_counter()
            with ThreadPoolExecutor(self.builders) as pool:
                built = list(pool.map(build, requests))
            self.build_seconds += time.perf_counter() - t0
            for k, (kernel, request, result) in enumerate(zip(kernel_list, requests, built)):
                if result.get("status") == "built":
                    request["fn"] = "tvm_taso.cost.measure:run_built"
                    result = run_request(request, timeout, (self.worker or shared_worker()), None)
                if str(result.get("error", "")).startswith("MeasureError"):
                    continue
                rec = result_record(kernel, record_target, result)
                if db is not None:
                    db.add(rec)
                results[k] = rec
                if progress is not None:
                    progress()
        return results

    def close(self) -> None:
        for worker in self._builder_workers:
            worker.close()
        self._builder_workers = []

    def __call__(self, kernel: Kernel, target=None, repeats: int = 10, timeout: float = 60.0, **kw) -> Record:
        return measure_kernel(kernel, target, repeats, timeout, isolate=self.isolate, worker=self.worker,
                              fn=self.fn, **kw)

    def record_target(self, target_string: str) -> str:
        """The target string its records are kept under (a local one is the target itself)."""
        return target_string

    def describe(self) -> dict:
        return {"builders": self.builders, "build_seconds": round(self.build_seconds, 3)} if self.builders > 1 else {}


class MeasuredCost(CostModel):
    """Kernel cost = its measured median time on the target, in microseconds.

    Each distinct kernel is looked up in the :class:`MeasurementDB` (``db``: a DB, a path, or
    None for the default file) and measured through ``measurer`` only on a miss (default a
    :class:`LocalMeasurer` made from ``isolate``, ``worker`` and ``fn``; an
    :class:`~tvm_taso.cost.rpc.RPCMeasurer` measures remotely); failed kernels (build error,
    runtime error, timeout) cost infinity. ``max_measurements`` and ``time_limit`` (seconds
    spent measuring) bound the new measurements of one search (:meth:`reset_budget` starts a
    new one; ``optimize`` does); past them, or when the measurer cannot measure at all, kernels
    are priced by ``fallback`` (default :class:`AnalyticCost` of the target) scaled by the
    median ratio measured/fallback of the target's recorded kernels, so the two stay
    comparable. ``database`` is a MetaSchedule work dir whose tuned schedules are applied
    before timing (CPU timings of untuned kernels mislead). ``builders`` > 1 builds a graph's new
    kernels in that many processes at once and times them one at a time."""

    name = "measure"
    measures = True

    def __init__(
        self,
        target=None,
        db: MeasurementDB | str | os.PathLike | None = None,
        *,
        measurer=None,
        repeats: int = 10,
        warmup: int = 3,
        min_repeat_ms: int = 1,
        timeout: float = 60.0,
        database: str | os.PathLike | None = None,
        max_measurements: int | None = None,
        time_limit: float | None = None,
        fallback: CostModel | None = None,
        isolate: bool = True,
        worker: Worker | None = None,
        fn: str | None = None,
        builders: int = 1,
    ):
        super().__init__()
        self.target = targets.canonical(target)
        self.measurer = measurer if measurer is not None else LocalMeasurer(isolate, worker, fn, builders)
        self.database = str(database) if database else None
        self.db_target = self.measurer.record_target(db_target(self.target, self.database))
        self.db = db if isinstance(db, MeasurementDB) else MeasurementDB(db)
        self.repeats, self.warmup, self.min_repeat_ms, self.timeout = repeats, warmup, min_repeat_ms, timeout
        self.max_measurements, self.time_limit = max_measurements, time_limit
        self.fallback = fallback if fallback is not None else AnalyticCost(self.target)
        self.measured = self.cached = self.failed = self.fallbacks = 0
        self.measure_seconds = 0.0
        self._budget_used = 0
        self._budget_seconds = 0.0
        self._cannot_measure = False  # the measurer itself failed: stop trying for this search
        self._scale: float | None = None

    def reset_budget(self) -> None:
        """Start a new search: the measurement budget and time limit count from here."""
        self._budget_used = 0
        self._budget_seconds = 0.0
        self._cannot_measure = False

    def _budget_left(self) -> bool:
        if self._cannot_measure:
            return False
        if self.max_measurements is not None and self._budget_used >= self.max_measurements:
            return False
        if self.time_limit is not None and self._budget_seconds >= self.time_limit:
            return False
        return True

    def _graph_cost(self, g) -> float:
        """The graph's cost; with a measurer that measures many kernels at once (an
        :class:`~tvm_taso.cost.rpc.RPCPool`: one per device), the graph's kernels not yet known
        are measured together first, within the budget."""
        batch = getattr(self.measurer, "measure", None)
        if batch is not None and self._budget_left():
            missing = [k for k in dict.fromkeys(kernels(g)) if k not in self._memo and self._known(k) is None]
            if self.max_measurements is not None:
                missing = missing[:max(0, self.max_measurements - self._budget_used)]
            if len(missing) > 1:
                self._measure_together(batch, missing)
        return super()._graph_cost(g)

    def _known(self, kernel: Kernel) -> Record | None:
        try:
            return self.db.get(kernel.key(), self.db_target)
        except Exception:  # noqa: BLE001
            return None

    def _measure_together(self, batch, missing: list[Kernel]) -> None:
        t0 = time.perf_counter()
        try:
            records = batch(missing, self.target, db=self.db, repeats=self.repeats, timeout=self.timeout,
                            warmup=self.warmup, min_repeat_ms=self.min_repeat_ms, database=self.database)
        except Exception as err:  # noqa: BLE001 - the devices failed, not the kernels: one at a time from here
            log.warning("cannot measure kernels together (%s); measuring them one at a time", err)
            return
        finally:
            dt = time.perf_counter() - t0
            self.measure_seconds += dt
            self._budget_seconds += dt
        for kernel, rec in zip(missing, records):
            if rec is None or rec.error.startswith("MeasureError"):
                continue  # unreachable device or no module form: kernel_cost decides, one at a time
            self._budget_used += 1
            self.measured += 1
            self.failed += not rec.ok
            self._memo[kernel] = rec.cost
        self._scale = None

    def kernel_cost(self, kernel: Kernel) -> float:
        try:
            key = kernel.key()
            rec = self.db.get(key, self.db_target)
        except Exception:  # noqa: BLE001
            log.debug("database lookup failed", exc_info=True)
            rec, key = None, None
        if rec is not None:
            self.cached += 1
            return rec.cost
        if key is None or not self._budget_left():
            return self._fallback_cost(kernel)
        t0 = time.perf_counter()
        try:
            rec = self.measurer(kernel, self.target, self.repeats, self.timeout, warmup=self.warmup,
                                min_repeat_ms=self.min_repeat_ms, database=self.database)
        except MeasureError:
            return self._fallback_cost(kernel)
        except Exception as err:  # noqa: BLE001 - the worker or the device failed, not the kernel
            log.warning("cannot measure (%s); pricing kernels with the %s cost model instead", err, self.fallback.name)
            self._cannot_measure = True
            return self._fallback_cost(kernel)
        finally:
            dt = time.perf_counter() - t0
            self.measure_seconds += dt
            self._budget_seconds += dt
        self._budget_used += 1
        if rec.error.startswith("MeasureError"):
            return self._fallback_cost(kernel)
        self.measured += 1
        if not rec.ok:
            self.failed += 1
            log.info("kernel %s (%s): %s: %s", rec.key, kernel.anchor, rec.status, rec.error.splitlines()[0] if rec.error else "")
        try:
            self.db.add(rec)
        except Exception:  # noqa: BLE001
            log.warning("could not record a measurement in %s", self.db.path, exc_info=True)
        self._scale = None
        return rec.cost

    def _fallback_cost(self, kernel: Kernel) -> float:
        """The fallback's price, scaled; infinity (with a warning) if it cannot price the kernel
        either: an unpriceable kernel must never look free to the search."""
        self.fallbacks += 1
        try:
            return self.fallback.kernel_cost(kernel) * self.scale()
        except Exception as err:  # noqa: BLE001
            log.warning("kernel %s (%s) has no price (%s cost model: %s); counting it as infinitely slow",
                        kernel.key(), kernel.anchor, self.fallback.name, short_error(err, 300))
            return math.inf

    def scale(self) -> float:
        """Median of measured / fallback over (up to 200 of) this target's recorded kernels."""
        if self._scale is None:
            ratios = []
            for rec in self.db.records(self.db_target)[-200:]:
                if not rec.ok:
                    continue
                try:
                    est = self.fallback.kernel_cost(Kernel.from_json(rec.kernel))
                except Exception:  # noqa: BLE001
                    continue
                if est > 0:
                    ratios.append(rec.median_us / est)
            self._scale = statistics.median(ratios) if ratios else 1.0
        return self._scale

    def describe(self) -> dict:
        looked_up = self.measured + self.cached
        return {
            "name": self.name,
            "target": self.db_target,
            "db": str(self.db.path),
            "measured": self.measured,
            "cached": self.cached,
            "failed": self.failed,
            "fallback": self.fallbacks,
            "hit_rate": (self.cached / looked_up) if looked_up else None,
            "measure_seconds": round(self.measure_seconds, 3),
            "fallback_model": self.fallback.name,
            "ms_database": self.database,
            **self.measurer.describe(),
        }
