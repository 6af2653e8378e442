"""Measured cost: build each kernel with TVM for the target, time it, remember it forever.

* :func:`kernel_module` turns a :class:`~tvm_taso.cost.Kernel` into a Relax module whose
  parameters are the kernel's external inputs (weights too: a kernel is timed on its shapes,
  not its values) and whose body is the kernel's ops in order.
* :func:`measure_kernel` builds it with the target's default Relax pipeline (legalize, fuse;
  dlight schedules on GPUs; optionally a MetaSchedule database of the user's tuning records),
  runs it with ``relax.VirtualMachine`` and ``time_evaluator``, and returns a
  :class:`~tvm_taso.database.Record`. It runs in a separate worker process with a timeout, so a
  build error, a hang or a crash (a segfault) becomes a record with that status — an infinite
  cost to the search, which goes on. The worker stays alive between measurements (starting
  one and importing TVM costs about 1.3 s).
* :class:`MeasuredCost` is the cost model: a hit in the :class:`~tvm_taso.database.MeasurementDB`
  or a new measurement (recorded), with a per-search budget after which it falls back to
  another model (analytic by default), scaled to the measured times.

``python -m tvm_taso.measure --worker`` is the worker; ``python -m tvm_taso.measure show``
summarizes the database (``tvm-taso cost show``).
"""

from __future__ import annotations

import atexit
import importlib
import json
import logging
import os
import select
import signal
import statistics
import subprocess
import sys
import threading
import time
import traceback

from .cost import AnalyticCost, CostModel, Kernel
from .database import MeasurementDB, Record, canonical_target

log = logging.getLogger("tvm_taso.measure")

GPU_KINDS = ("cuda", "rocm", "vulkan", "metal", "opencl")


class MeasureError(Exception):
    """A kernel that cannot be expressed as a module (not a failure of the target)."""


# --------------------------------------------------------------------------------------------
# Building and timing (these run inside the worker process)
# --------------------------------------------------------------------------------------------


def kernel_module(kernel: Kernel):
    """A Relax ``main`` whose params are the kernel's external inputs and whose body is its ops.

    The function returns the kernel's outputs (a tuple when there are several)."""
    import tvm
    from tvm import relax

    from . import ops

    params: list = []
    bb = relax.BlockBuilder()
    # Which op outputs are read inside the kernel: the others must be outputs.
    consumed = {(o[1], o[2]) for _, _, operands in kernel.ops for o in operands if o[0] == "op"}
    for _, _, operands in kernel.ops:
        for o in operands:
            if o[0] == "in" and o[1] is None:
                raise MeasureError("kernel reads a tuple-valued input")
    for _, _, operands in kernel.ops:
        for o in operands:
            if o[0] == "in":
                params.append(relax.Var(f"p{len(params)}", relax.TensorType(tuple(o[1].shape), o[1].dtype)))
    with bb.function("main", params):
        with bb.dataflow():
            pit = iter(params)
            values: list[list] = []  # per op: its output expressions
            types: list[list] = []
            for op, attrs, operands in kernel.ops:
                spec = ops.OPS[op]
                args = [next(pit) if o[0] == "in" else values[o[1]][o[2]] for o in operands]
                call = bb.emit(spec.build(args, dict(attrs)))
                otypes = spec.infer(
                    [o[1] if o[0] == "in" else types[o[1]][o[2]] for o in operands], dict(attrs)
                )
                if isinstance(call.ty, relax.TupleType):
                    outs = [bb.emit(relax.TupleGetItem(call, i)) for i in range(len(call.ty.fields))]
                else:
                    outs = [call]
                values.append(outs)
                types.append(list(otypes))
            results = _select_outputs(kernel, values, types, consumed)
            out = bb.emit_output(results[0] if len(results) == 1 else relax.Tuple(results))
        bb.emit_func_output(out)
    mod = bb.get()
    return tvm.IRModule({"main": mod["main"]}) if len(mod.functions) > 1 else mod


def _select_outputs(kernel, values, types, consumed) -> list:
    """Match ``kernel.outputs`` (types only) to op outputs: every output no op of the kernel
    reads must be one; the rest are read inside and outside, taken in order by type."""
    wanted = list(kernel.outputs)
    order = [(k, i) for k in range(len(values)) for i in range(len(values[k]))]
    leaves = [ki for ki in order if ki not in consumed]
    extra = len(wanted) - len(leaves)
    chosen, p = [], 0
    for k, i in order:
        leaf = (k, i) not in consumed
        t = types[k][i] if i < len(types[k]) else None
        if p < len(wanted) and t == wanted[p] and (leaf or extra > 0):
            chosen.append(values[k][i])
            p += 1
            extra -= 0 if leaf else 1
    if p != len(wanted) or not chosen:
        chosen = [values[k][i] for k, i in leaves] or [values[-1][0]]
    return chosen


def _backend(target):
    import importlib

    kind = target.kind.name
    return importlib.import_module(
        "tvm.relax.backend." + ("cuda" if kind == "cuda" else "gpu_generic" if "gpu" in target.keys else "cpu_generic")
        + ".pipeline"
    )


def _split_at_fusion(target) -> tuple[list, list]:
    """The target's dispatch + legalize passes, cut right after ``FuseTIR``: MetaSchedule's
    workloads are the fused TIR functions at that point."""
    legalize = list(_backend(target).legalize_passes(target))
    at = next((i for i, p in enumerate(legalize) if p.info.name == "FuseTIR"), len(legalize) - 1) + 1
    return list(_backend(target).library_dispatch_passes(target)) + legalize[:at], legalize[at:]


def fused_module(mod, target):
    """``mod`` after the target pipeline's passes up to ``FuseTIR`` (what MetaSchedule tunes)."""
    import tvm

    with target:
        return tvm.transform.Sequential(_split_at_fusion(target)[0])(mod)


def build_pipeline(target, database: str | None = None):
    """The target's default Relax pipeline (legalize, fuse, dlight on GPUs), with the tuned
    schedules of a MetaSchedule database (a work dir holding ``database_workload.json`` and
    ``database_tuning_record.json``) applied after fusion when ``database`` is given."""
    import tvm
    from tvm import relax

    if database is None:
        return relax.get_default_pipeline(target)
    backend = _backend(target)
    head, tail = _split_at_fusion(target)

    @tvm.transform.module_pass(opt_level=0)
    def _pipeline(mod, _ctx):
        with target:  # MetaScheduleApplyDatabase reads the target from the context when created
            apply = relax.transform.MetaScheduleApplyDatabase(work_dir=str(database))
            seq = tvm.transform.Sequential(
                head + [apply] + tail + list(backend.dataflow_lower_passes(target))
                + list(backend.finalize_passes(target))
            )
            return seq(mod)

    return _pipeline


def _target(target_json: str):
    import tvm

    data = json.loads(target_json) if isinstance(target_json, str) and target_json.startswith("{") else target_json
    if isinstance(data, dict):
        data = {k: v for k, v in data.items() if not k.startswith("taso:")}
    return tvm.target.Target(data)


def build_kernel(kernel: Kernel, target, database: str | None = None):
    """``tvm.compile`` of :func:`kernel_module` for ``target`` (no device needed)."""
    import tvm

    target = _target(target) if isinstance(target, (str, dict)) else target
    mod = kernel_module(kernel)
    with target:
        return tvm.compile(mod, target=target, relax_pipeline=build_pipeline(target, database))


def run_measurement(request: dict, progress=lambda phase: None) -> dict:
    """Build and time one kernel in this process. ``request``: ``kernel`` (Kernel.to_json()),
    ``target`` (canonical string), ``repeats``, ``warmup``, ``min_repeat_ms``, ``database``.
    Returns ``{"status", "median_us", "samples_us", "error"}``."""
    import numpy as np
    import tvm
    from tvm import relax

    kernel = Kernel.from_json(request["kernel"])
    try:
        target = _target(request["target"])
        ex = build_kernel(kernel, target, request.get("database"))
    except Exception as err:  # noqa: BLE001
        return {"status": "build_error", "error": _short_error(err)}
    progress("built")
    try:
        dev = tvm.cpu(0) if target.kind.name in ("llvm", "c") else tvm.device(target.kind.name, 0)
        if not dev.exist:
            return {"status": "runtime_error", "error": f"no {target.kind.name} device on this machine"}
        vm = relax.VirtualMachine(ex, dev)
        rng = np.random.default_rng(0)
        args = []
        for shape, dtype in _param_types(kernel):
            if np.dtype(dtype).kind == "f":
                a = rng.standard_normal(shape).astype(dtype)
            elif np.dtype(dtype).kind == "b":
                a = rng.integers(0, 2, shape).astype(dtype)
            else:
                a = rng.integers(0, 4, shape).astype(dtype)
            args.append(tvm.runtime.tensor(a, dev))
        for _ in range(max(1, int(request.get("warmup", 3)))):
            vm["main"](*args)
        dev.sync()
        timer = vm.time_evaluator(
            "main", dev, number=1, repeat=max(1, int(request.get("repeats", 10))),
            min_repeat_ms=int(request.get("min_repeat_ms", 1)),
        )
        samples = [float(s) * 1e6 for s in timer(*args).results]
    except Exception as err:  # noqa: BLE001
        return {"status": "runtime_error", "error": _short_error(err)}
    return {"status": "ok", "median_us": statistics.median(samples), "samples_us": samples, "error": ""}


def _param_types(kernel: Kernel) -> list:
    return [(tuple(o[1].shape), o[1].dtype) for _, _, operands in kernel.ops for o in operands if o[0] == "in"]


def _short_error(err: BaseException, limit: int = 2000) -> str:
    text = f"{type(err).__name__}: {err}"
    return text if len(text) <= limit else text[: limit // 2] + " ... " + text[-limit // 2:]


def _resolve(name: str):
    module, _, attr = name.partition(":")
    fn = importlib.import_module(module)
    for part in attr.split("."):
        fn = getattr(fn, part)
    return fn


# --------------------------------------------------------------------------------------------
# The worker process
# --------------------------------------------------------------------------------------------


def _worker_main() -> int:
    """Serve measurement requests: one JSON line in on stdin, JSON lines out on the original
    stdout (TVM's own prints go to stderr)."""
    proto = os.fdopen(os.dup(1), "w", buffering=1)
    os.dup2(2, 1)
    sys.stdout = sys.stderr
    import tvm  # noqa: F401  (pay the import before saying ready)

    proto.write(json.dumps({"ready": True, "pid": os.getpid()}) + "\n")
    for line in sys.stdin:
        if not line.strip():
            continue
        try:
            request = json.loads(line)
            fn = _resolve(request["fn"]) if request.get("fn") else run_measurement

            def progress(phase):
                proto.write(json.dumps({"phase": phase}) + "\n")

            result = fn(request, progress)
        except Exception as err:  # noqa: BLE001
            result = {"status": "runtime_error", "error": _short_error(err) + "\n" + traceback.format_exc()[-1500:]}
        proto.write(json.dumps({"result": result}) + "\n")
    return 0


class Worker:
    """A long-lived ``python -m tvm_taso.measure --worker`` process; restarted after a timeout or
    a crash. Not thread-safe: one measurement at a time (timings must not overlap anyway)."""

    STARTUP_TIMEOUT = 120.0

    def __init__(self, env: dict | None = None):
        self.env = env
        self.proc: subprocess.Popen | None = None
        self.starts = 0
        self.broken: str | None = None  # why the worker could not start (then no more tries)
        self._buf = b""
        self._lock = threading.Lock()

    def _start(self) -> None:
        env = dict(os.environ if self.env is None else self.env)
        # The parent's import path (so a test's injected ``fn`` is importable there too).
        paths = [os.path.abspath(p or os.curdir) for p in sys.path]
        paths = [p for p in paths if os.path.isdir(p)]
        env["PYTHONPATH"] = os.pathsep.join(dict.fromkeys(paths + env.get("PYTHONPATH", "").split(os.pathsep)))
        env.setdefault("PYTHONUNBUFFERED", "1")
        self.proc = subprocess.Popen(
            [sys.executable, "-m", "tvm_taso.measure", "--worker"],
            stdin=subprocess.PIPE, stdout=subprocess.PIPE, stderr=subprocess.DEVNULL if not log.isEnabledFor(logging.DEBUG) else None,
            env=env, start_new_session=True, close_fds=True,
        )
        self.starts += 1
        self._buf = b""
        msg = self._read(time.monotonic() + self.STARTUP_TIMEOUT)
        if not msg or not msg.get("ready"):
            code = self.proc.poll() if self.proc is not None else None
            self.close()
            self.broken = f"the measurement worker did not start ({_describe_exit(code)})"
            raise RuntimeError(self.broken)

    def _read(self, deadline: float) -> dict | None:
        """The next protocol message, or None on timeout / end of file."""
        fd = self.proc.stdout.fileno()
        while b"\n" not in self._buf:
            left = deadline - time.monotonic()
            if left <= 0:
                return None
            ready, _, _ = select.select([fd], [], [], left)
            if not ready:
                return None
            chunk = os.read(fd, 65536)
            if not chunk:
                return None
            self._buf += chunk
        line, self._buf = self._buf.split(b"\n", 1)
        try:
            return json.loads(line)
        except ValueError:
            return {"garbage": line[:200].decode(errors="replace")}

    def request(self, request: dict, timeout: float) -> dict:
        """Run one request; a result dict with a ``status`` in every case."""
        with self._lock:
            if self.broken:
                raise RuntimeError(self.broken)
            if self.proc is None or self.proc.poll() is not None:
                self._start()
            try:
                self.proc.stdin.write((json.dumps(request) + "\n").encode())
                self.proc.stdin.flush()
            except (BrokenPipeError, OSError):
                self.close()
                self._start()
                self.proc.stdin.write((json.dumps(request) + "\n").encode())
                self.proc.stdin.flush()
            deadline = time.monotonic() + timeout
            phase = "building"
            while True:
                msg = self._read(deadline)
                if msg is None:
                    if self.proc.poll() is None and time.monotonic() >= deadline:
                        self.close()
                        return {"status": "timeout", "error": f"no result within {timeout:g} s ({phase})"}
                    code = self._reap()
                    status = "build_error" if phase == "building" else "runtime_error"
                    return {"status": status, "error": f"worker died while {phase} ({_describe_exit(code)})"}
                if "phase" in msg:
                    phase = "running" if msg["phase"] == "built" else msg["phase"]
                elif "result" in msg:
                    return msg["result"]

    def _reap(self):
        proc, self.proc = self.proc, None
        if proc is None:
            return None
        try:
            return proc.wait(timeout=5)
        except subprocess.TimeoutExpired:
            self._kill(proc)
            return proc.wait()

    @staticmethod
    def _kill(proc) -> None:
        try:
            os.killpg(proc.pid, signal.SIGKILL)  # the worker and its compilers (nvcc)
        except (ProcessLookupError, PermissionError):
            try:
                proc.kill()
            except ProcessLookupError:
                pass

    def close(self) -> None:
        proc, self.proc = self.proc, None
        if proc is None:
            return
        if proc.poll() is None:
            self._kill(proc)
        try:
            proc.wait(timeout=5)
        except subprocess.TimeoutExpired:
            pass
        for f in (proc.stdin, proc.stdout):
            try:
                f.close()
            except OSError:
                pass


def _describe_exit(code) -> str:
    if code is None:
        return "exit status unknown"
    if code < 0:
        try:
            return f"killed by {signal.Signals(-code).name}"
        except ValueError:
            return f"killed by signal {-code}"
    return f"exit status {code}"


_WORKER: Worker | None = None


def shared_worker() -> Worker:
    """The process-wide worker (started on first use, closed at exit)."""
    global _WORKER
    if _WORKER is None:
        _WORKER = Worker()
        atexit.register(_WORKER.close)
    return _WORKER


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
    run together); ``fn`` ("module:function", taking ``(request, progress)``) replaces the
    measurement function there (tests inject failures with it)."""
    tstr = canonical_target(target)
    request = {
        "kernel": kernel.to_json(), "target": tstr, "repeats": repeats, "warmup": warmup,
        "min_repeat_ms": min_repeat_ms, "database": str(database) if database else None, "fn": fn,
    }
    if isolate:
        result = (worker or shared_worker()).request(request, timeout)
    else:
        try:
            result = (_resolve(fn) if fn else run_measurement)(request, lambda phase: None)
        except Exception as err:  # noqa: BLE001
            result = {"status": "runtime_error", "error": _short_error(err)}
    status = result.get("status", "runtime_error")
    median = result.get("median_us") if status == "ok" else None
    return Record(
        key=kernel.key(), target=db_target(tstr, database), kernel=request["kernel"], status=status,
        median_us=None if median is None else float(median),
        samples_us=[float(s) for s in result.get("samples_us") or []] if status == "ok" else [],
        error=str(result.get("error") or ""),
    )


def db_target(tstr: str, database: str | None) -> str:
    """The database's target string: the canonical target, marked with the MetaSchedule database
    when tuned schedules were applied (tuned and untuned timings are different facts)."""
    if not database:
        return tstr
    data = json.loads(tstr)
    data["taso:ms_database"] = os.path.abspath(str(database))
    return json.dumps(data, sort_keys=True, separators=(",", ":"))


# --------------------------------------------------------------------------------------------
# The cost model
# --------------------------------------------------------------------------------------------


class MeasuredCost(CostModel):
    """Kernel cost = its measured median time on the target, in microseconds.

    Each distinct kernel is looked up in the :class:`MeasurementDB` (``db``: a DB, a path, or
    None for the default file) and measured only on a miss; failed kernels (build error,
    runtime error, timeout) cost infinity. ``max_measurements`` and ``time_limit`` (seconds
    spent measuring) bound the new measurements of one search (:meth:`reset_budget` starts a
    new one; ``optimize`` does); past them, kernels are priced by ``fallback`` (default
    :class:`AnalyticCost` of the target) scaled by the median ratio measured/fallback of the
    target's recorded kernels, so the two stay comparable. ``database`` is a MetaSchedule work
    dir whose tuned schedules are applied before timing (CPU timings of untuned kernels
    mislead)."""

    name = "measure"

    def __init__(
        self,
        target=None,
        db: MeasurementDB | str | os.PathLike | None = None,
        *,
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
    ):
        super().__init__()
        self.target = canonical_target(target)
        self.database = str(database) if database else None
        self.db_target = db_target(self.target, self.database)
        self.db = db if isinstance(db, MeasurementDB) else MeasurementDB(db)
        self.repeats, self.warmup, self.min_repeat_ms, self.timeout = repeats, warmup, min_repeat_ms, timeout
        self.max_measurements, self.time_limit = max_measurements, time_limit
        self.fallback = fallback if fallback is not None else AnalyticCost(json.loads(self.target))
        self.isolate, self.worker, self.fn = isolate, worker, fn
        self.measured = self.cached = self.failed = self.fallbacks = 0
        self.measure_seconds = 0.0
        self._budget_used = 0
        self._budget_seconds = 0.0
        self._scale: float | None = None

    def reset_budget(self) -> None:
        """Start a new search: the measurement budget and time limit count from here."""
        self._budget_used = 0
        self._budget_seconds = 0.0

    def _budget_left(self) -> bool:
        if self.max_measurements is not None and self._budget_used >= self.max_measurements:
            return False
        if self.time_limit is not None and self._budget_seconds >= self.time_limit:
            return False
        return True

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
            rec = measure_kernel(
                kernel, self.target, self.repeats, self.timeout, warmup=self.warmup,
                min_repeat_ms=self.min_repeat_ms, database=self.database, isolate=self.isolate,
                worker=self.worker, fn=self.fn,
            )
        except MeasureError:
            return self._fallback_cost(kernel)
        except Exception as err:  # noqa: BLE001 - the worker itself failed (not the kernel)
            log.warning("cannot measure (%s); pricing kernels with the %s cost model instead", err, self.fallback.name)
            self.max_measurements = self._budget_used  # stop trying for this search
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
        self.fallbacks += 1
        try:
            return self.fallback.kernel_cost(kernel) * self.scale()
        except Exception:  # noqa: BLE001
            log.debug("fallback cost failed", exc_info=True)
            return 0.0

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
        }


# --------------------------------------------------------------------------------------------
# Command line: ``tvm-taso cost show`` and the worker
# --------------------------------------------------------------------------------------------


def cost_subparsers(subparsers):
    """The subcommands of the CLI's ``cost`` command, creating the command on first use (``cost
    show`` and ``cost train`` come from two modules, in either order)."""
    import argparse

    cost = subparsers.choices.get("cost") if hasattr(subparsers, "choices") else None
    if cost is None:
        cost = subparsers.add_parser("cost", help="the measurement database and cost models")
        return cost.add_subparsers(dest="cost_command", required=True)
    return next(a for a in cost._actions if isinstance(a, argparse._SubParsersAction))


def add_cost_show_command(subparsers) -> None:
    """Add ``cost show [--db PATH] [--json]`` to a CLI's subparsers (see :func:`cost_subparsers`)."""
    show = cost_subparsers(subparsers).add_parser("show", help="summarize the measurement database")
    show.add_argument("--db", default=None, help="database file or folder (default $TVM_TASO_CACHE or ~/.cache/tvm-taso)")
    show.add_argument("--json", action="store_true", help="print the summary as JSON")
    show.set_defaults(func=cmd_cost_show)


def cmd_cost_show(args) -> int:
    db = MeasurementDB(args.db)
    s = db.summary()
    if getattr(args, "json", False):
        print(json.dumps(s, indent=2))
        return 0
    print(f"{s['path']}: {s['records']} kernels, {s['file_bytes']} bytes")
    if not s["records"]:
        return 0
    for t, info in s["targets"].items():
        mm = info["median_of_medians_us"]
        statuses = ", ".join(f"{k} {v}" for k, v in info["status"].items())
        print(f"  {info['kind']:<6} {info['records']:>6} kernels ({statuses}); median kernel "
              f"{'-' if mm is None else f'{mm:.1f} us'}")
        print(f"         {t}")
    return 0


def main(argv=None) -> int:
    argv = list(sys.argv[1:] if argv is None else argv)
    if argv[:1] == ["--worker"]:
        return _worker_main()
    import argparse

    p = argparse.ArgumentParser(prog="python -m tvm_taso.measure")
    sub = p.add_subparsers(dest="command", required=True)
    show = sub.add_parser("show", help="summarize the measurement database")
    show.add_argument("--db", default=None)
    show.add_argument("--json", action="store_true")
    show.set_defaults(func=cmd_cost_show)
    args = p.parse_args(argv)
    return args.func(args)


if __name__ == "__main__":
    sys.exit(main())
