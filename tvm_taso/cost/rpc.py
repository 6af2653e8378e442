"""Remote and parallel measurement through TVM's RPC, the way MetaSchedule's ``RPCRunner`` does.

A kernel is built *here* for the remote's target (``tvm.compile`` of
:func:`~tvm_taso.cost.kernel_build.kernel_module`), exported (``export_library``: a ``.tar`` of object
files that the remote links with its own compiler -- MetaSchedule's default -- or a ``.so``
linked here, with a cross compiler if the remote is another architecture), uploaded to an RPC
server (``tvm.rpc.connect(host, port)``, or a session from a tracker:
``tvm.rpc.connect_tracker(host, port).request(key)``), loaded there
(``session.load_module``), and timed with a Relax VM on the remote device
(``relax.VirtualMachine(remote_module, session.device(...))``; the inputs are set once with
``set_input`` and ``time_evaluator("invoke_stateful")`` times the calls on the remote, the
stateful form TVM's docs recommend over RPC -- checked with 0.27 on loopback: a kernel returning
a tuple times correctly, and calling ``vm["main"]`` remotely works too).

* :class:`RPCMeasurer` is a *measurer* for :class:`~tvm_taso.cost.measure.MeasuredCost`, called
  like :func:`~tvm_taso.cost.measure.measure_kernel` (``(kernel, target, repeats, timeout, ...)
  -> Record``). Build and remote run happen in a :class:`~tvm_taso.cost.worker.Worker` process
  bounded by ``timeout``, so a crash or a hang is a record, as with local measurement. An
  unreachable server is *not* the kernel's fault: it raises :class:`RPCUnavailable` and nothing
  is recorded.
* :class:`RPCPool` measures on several devices at once (several servers, or several sessions
  from one tracker key), one kernel per device at a time.
* :class:`RPCMeasuredCost` is :class:`~tvm_taso.cost.measure.MeasuredCost` handed one of them.
* :class:`LocalServer` / :class:`LocalTracker` start an RPC server / tracker in a child process
  (``python -m tvm_taso.cost.rpc server|tracker``). Unlike ``tvm.rpc.Server`` they do not need
  ``cloudpickle``; the tracker needs ``tornado`` (as TVM's does). They bind to 127.0.0.1 unless
  told otherwise: a TVM RPC server runs any code its clients send.
"""

from __future__ import annotations

import json
import logging
import os
import queue
import shutil
import signal
import statistics
import subprocess
import sys
import tempfile
import time
from concurrent.futures import ThreadPoolExecutor

from tvm_taso import target as targets
from tvm_taso.cost.database import MeasurementDB, Record
from tvm_taso.cost.kernel_build import MeasureError, build_kernel, kernel_inputs
from tvm_taso.cost.measure import MeasuredCost, db_target, measurement_request, result_record, run_request
from tvm_taso.cost.model import Kernel
from tvm_taso.cost.worker import Worker, import_path, short_error

log = logging.getLogger("tvm_taso.cost.rpc")

UNAVAILABLE = "RPCUnavailable"


class RPCUnavailable(RuntimeError):
    """The RPC server or tracker could not be reached (nothing is recorded for the kernel)."""


# --------------------------------------------------------------------------------------------
# Inside the worker process: build, export, upload, time
# --------------------------------------------------------------------------------------------


def _export(ex, directory: str, export: str, cc: str | None) -> str:
    """Write the built executable for upload; returns the local file path."""
    if export == "tar":
        from tvm.support import tar

        path = os.path.join(directory, "kernel.tar")
        ex.export_library(path, fcompile=tar.tar)
    elif export == "so":
        path = os.path.join(directory, "kernel.so")
        if cc:
            from tvm.support import cc as _cc

            ex.export_library(path, fcompile=_cc.cross_compiler(cc))
        else:
            ex.export_library(path)
    else:
        raise ValueError(f"export must be 'tar' or 'so', not {export!r}")
    return path


def connect(rpc: dict, session_timeout: float = 0):
    """An RPC session from a config dict: ``{"tracker": [host, port], "key": ...}`` or
    ``{"host": ..., "port": ..., "key": ...}``."""
    from tvm import rpc as _rpc

    if rpc.get("tracker"):
        host, port = rpc["tracker"]
        tracker = _rpc.connect_tracker(host, int(port))
        return tracker.request(rpc.get("key") or "", priority=int(rpc.get("priority", 1)),
                               session_timeout=session_timeout, max_retry=int(rpc.get("max_retry", 3)))
    return _rpc.connect(rpc["host"], int(rpc["port"]), rpc.get("key") or "", session_timeout=session_timeout)


def run_remote_measurement(request: dict, progress=lambda phase: None) -> dict:
    """Build ``request["kernel"]`` for ``request["target"]`` here, run it on the RPC device in
    ``request["rpc"]``; the result dict of :func:`~tvm_taso.cost.measure.run_measurement`.
    Runs inside a :class:`~tvm_taso.cost.worker.Worker` (``fn="tvm_taso.cost.rpc:run_remote_measurement"``)."""
    import tvm
    from tvm import relax

    kernel = Kernel.from_json(request["kernel"])
    rpc_cfg = request["rpc"]
    with tempfile.TemporaryDirectory(prefix="tvm-taso-rpc-") as tmp:
        try:
            ex = build_kernel(kernel, request["target"], request.get("database"))
            path = _export(ex, tmp, rpc_cfg.get("export", "tar"), rpc_cfg.get("cc"))
        except MeasureError as err:
            return {"status": "build_error", "error": f"MeasureError: {err}"}
        except Exception as err:  # noqa: BLE001
            return {"status": "build_error", "error": short_error(err)}
        progress("built")
        try:
            sess = connect(rpc_cfg, session_timeout=float(rpc_cfg.get("session_timeout") or 0))
        except Exception as err:  # noqa: BLE001
            return {"status": "runtime_error", "error": f"{UNAVAILABLE}: {short_error(err)}"}
        name = f"tvm-taso-{os.getpid()}-{time.monotonic_ns()}{os.path.splitext(path)[1]}"
        try:
            sess.upload(path, name)
            rmod = sess.load_module(name)
            dev = sess.device(rpc_cfg.get("device") or targets.device_type(request["target"]),
                              int(rpc_cfg.get("device_id", 0)))
            vm = relax.VirtualMachine(rmod, dev)
            vm.set_input("main", *[tvm.runtime.tensor(a, dev) for a in kernel_inputs(kernel)])
            for _ in range(max(1, int(request.get("warmup", 3)))):
                vm.invoke_stateful("main")
            dev.sync()
            timer = vm.time_evaluator(
                "invoke_stateful", dev, number=1, repeat=max(1, int(request.get("repeats", 10))),
                min_repeat_ms=int(request.get("min_repeat_ms", 1)),
            )
            samples = [float(s) * 1e6 for s in timer("main").results]
        except Exception as err:  # noqa: BLE001
            text = short_error(err)
            if "RPCSessionTimeoutError" in text:  # the server ended a session that ran too long
                return {"status": "timeout", "error": text}
            return {"status": "runtime_error", "error": text}
        finally:
            try:
                sess.remove(name)
            except Exception:  # noqa: BLE001
                pass
    return {"status": "ok", "median_us": statistics.median(samples), "samples_us": samples, "error": ""}


# --------------------------------------------------------------------------------------------
# In this process: the measurers
# --------------------------------------------------------------------------------------------


class RPCMeasurer:
    """Measure kernels on one RPC device: ``RPCMeasurer(host, port)`` for a server, or
    ``RPCMeasurer(tracker=(host, port), key="rpi4")`` for a device registered with a tracker.

    Calling it has :func:`~tvm_taso.cost.measure.measure_kernel`'s signature and returns a
    :class:`~tvm_taso.cost.database.Record`; hand it to :class:`~tvm_taso.cost.measure.MeasuredCost`
    (``measurer=``) to price kernels with it. ``export`` is ``"tar"`` (the remote links the objects:
    it needs a C compiler, as for MetaSchedule) or ``"so"`` (linked here; ``cc`` names a cross
    compiler such as ``aarch64-linux-gnu-g++`` when the remote is another architecture).
    ``device`` overrides the remote device type (default: from the target kind).

    The records' target is the target string plus ``"taso:device": tag`` when ``tag`` is given
    (default: the tracker key), so that timings of one target on different boards stay apart;
    :meth:`record_target` maps a target string the same way."""

    def __init__(
        self,
        host: str | None = None,
        port: int | None = None,
        *,
        tracker: tuple[str, int] | None = None,
        key: str = "",
        tag: str | None = None,
        export: str = "tar",
        cc: str | None = None,
        device: str | None = None,
        device_id: int = 0,
        priority: int = 1,
        isolate: bool = True,
        worker: Worker | None = None,
    ):
        if tracker is None and (host is None or port is None):
            raise ValueError("RPCMeasurer needs host and port, or tracker=(host, port) and key")
        if tracker is not None and not key:
            raise ValueError("a tracker hands out devices by key: give key=")
        if export not in ("tar", "so"):
            raise ValueError(f"export must be 'tar' or 'so', not {export!r}")
        self.host, self.port = host, port
        self.tracker = (tracker[0], int(tracker[1])) if tracker is not None else None
        self.key = key
        self.tag = tag if tag is not None else (key or None)
        self.export, self.cc, self.device, self.device_id, self.priority = export, cc, device, device_id, priority
        self.isolate = isolate
        self._worker = worker
        self.measured = 0
        self.seconds = 0.0

    @property
    def worker(self) -> Worker:
        if self._worker is None:
            self._worker = Worker()
        return self._worker

    def close(self) -> None:
        if self._worker is not None:
            self._worker.close()

    def __enter__(self):
        return self

    def __exit__(self, *exc):
        self.close()

    def __repr__(self) -> str:
        where = f"tracker={self.tracker[0]}:{self.tracker[1]} key={self.key}" if self.tracker else f"{self.host}:{self.port}"
        return f"RPCMeasurer({where})"

    def config(self, timeout: float) -> dict:
        return {
            "host": self.host, "port": self.port, "tracker": list(self.tracker) if self.tracker else None,
            "key": self.key, "priority": self.priority, "export": self.export, "cc": self.cc,
            "device": self.device, "device_id": self.device_id,
            # the server kills a session that outlives this (a hung kernel must not block it)
            "session_timeout": max(1, int(timeout) + 1) if timeout else 0,
        }

    def describe(self) -> dict:
        """What :meth:`MeasuredCost.describe <tvm_taso.cost.measure.MeasuredCost.describe>` adds."""
        return {"remote": repr(self)}

    def record_target(self, target_string: str) -> str:
        if not self.tag:
            return target_string
        data = json.loads(target_string)
        data["taso:device"] = self.tag
        return json.dumps(data, sort_keys=True, separators=(",", ":"))

    def __call__(
        self,
        kernel: Kernel,
        target=None,
        repeats: int = 10,
        timeout: float = 60.0,
        *,
        warmup: int = 3,
        min_repeat_ms: int = 1,
        database: str | None = None,
        **_ignored,
    ) -> Record:
        tstr = targets.canonical(target)
        request = measurement_request(kernel, tstr, repeats, warmup, min_repeat_ms, database,
                                      "tvm_taso.cost.rpc:run_remote_measurement")
        request["rpc"] = self.config(timeout)
        t0 = time.perf_counter()
        result = run_request(request, timeout, self.worker if self.isolate else None, run_remote_measurement)
        self.seconds += time.perf_counter() - t0
        error = str(result.get("error") or "")
        if error.startswith(UNAVAILABLE):
            raise RPCUnavailable(f"{self!r}: {error[len(UNAVAILABLE) + 2:]}")
        if error.startswith("MeasureError"):
            raise MeasureError(error)
        self.measured += 1
        return result_record(kernel, self.record_target(db_target(tstr, database)), result)


class RPCPool:
    """Several :class:`RPCMeasurer` s used at once: one kernel per device at a time.

    ``RPCPool([RPCMeasurer(h1, p1), RPCMeasurer(h2, p2)])`` for servers, or
    ``RPCPool.from_tracker((host, port), key, n)`` for ``n`` devices registered under one key.
    Calling the pool measures one kernel on whichever device is free (thread-safe, same
    signature as :class:`RPCMeasurer`); :meth:`measure` measures many in parallel."""

    def __init__(self, measurers):
        self.measurers = list(measurers)
        if not self.measurers:
            raise ValueError("RPCPool needs at least one measurer")
        self._free: queue.Queue = queue.Queue()
        for m in self.measurers:
            self._free.put(m)
        tags = {m.tag for m in self.measurers}
        self.tag = tags.pop() if len(tags) == 1 else None

    @classmethod
    def from_tracker(cls, tracker: tuple[str, int], key: str, n: int, **kw) -> "RPCPool":
        return cls([RPCMeasurer(tracker=tracker, key=key, **kw) for _ in range(n)])

    def record_target(self, target_string: str) -> str:
        return self.measurers[0].record_target(target_string)

    def describe(self) -> dict:
        return {"remote": repr(self)}

    def __repr__(self) -> str:
        return f"RPCPool({', '.join(map(repr, self.measurers))})"

    def __call__(self, kernel: Kernel, target=None, repeats: int = 10, timeout: float = 60.0, **kw) -> Record:
        m = self._free.get()
        try:
            return m(kernel, target, repeats, timeout, **kw)
        finally:
            self._free.put(m)

    def measure(self, kernel_list, target=None, *, db: MeasurementDB | None = None, skip_known: bool = True,
                repeats: int = 10, timeout: float = 60.0, **kw) -> list[Record | None]:
        """Measure ``kernel_list`` on all devices at once; one record per kernel, in order
        (None where the device was unreachable). With ``db``, kernels it already holds are not
        measured again (their record is returned) and new records are added to it."""
        tstr = targets.canonical(target)
        rt = self.record_target(db_target(tstr, kw.get("database")))

        def one(k):
            if db is not None and skip_known:
                rec = db.get(k.key(), rt)
                if rec is not None:
                    return rec
            try:
                rec = self(k, tstr, repeats, timeout, **kw)
            except (RPCUnavailable, MeasureError) as err:
                log.warning("%s: %s", k.anchor, err)
                return None
            if db is not None:
                db.add(rec)
            return rec

        with ThreadPoolExecutor(max_workers=len(self.measurers)) as pool:
            return list(pool.map(one, list(kernel_list)))

    def close(self) -> None:
        for m in self.measurers:
            m.close()

    def __enter__(self):
        return self

    def __exit__(self, *exc):
        self.close()


class RPCMeasuredCost(MeasuredCost):
    """:class:`~tvm_taso.cost.measure.MeasuredCost` handed ``measurer`` (an :class:`RPCMeasurer`
    or :class:`RPCPool`): the database, budget and fallback work the same. Records are kept
    under the measurer's :meth:`~RPCMeasurer.record_target`."""

    def __init__(self, measurer, target=None, db=None, **kw):
        super().__init__(target, db, measurer=measurer, **kw)


# --------------------------------------------------------------------------------------------
# Local servers and trackers (child processes)
# --------------------------------------------------------------------------------------------


class _Child:
    """A ``python -m tvm_taso.cost.rpc ...`` child that prints one JSON line when it is ready;
    started like a :class:`~tvm_taso.cost.worker.Worker` (an empty private directory, the
    parent's import path without the current directory)."""

    def __init__(self, argv: list[str], timeout: float = 120.0, wait: bool = True):
        self.argv, self.timeout, self.info = argv, timeout, None
        env = dict(os.environ, PYTHONPATH=import_path())
        self._cwd = tempfile.mkdtemp(prefix="tvm-taso-rpc-")
        self.proc = subprocess.Popen(
            [sys.executable, "-m", "tvm_taso.cost.rpc", *argv], cwd=self._cwd, stdout=subprocess.PIPE,
            stderr=None if log.isEnabledFor(logging.DEBUG) else subprocess.DEVNULL,
            env=env, start_new_session=True, close_fds=True,
        )
        if wait:
            self.ready()

    def ready(self) -> dict:
        """Wait until the child has bound its port (started with ``wait=False``)."""
        if self.info is None:
            line = _readline(self.proc, self.timeout) if self.proc is not None else ""
            if not line:
                code = self.proc.poll() if self.proc is not None else None
                self.close()
                hint = " (the tracker needs tornado: pip install tornado)" if self.argv[0] == "tracker" and code == 2 else ""
                raise RuntimeError(f"tvm_taso.cost.rpc {self.argv[0]} did not start{hint}")
            self.info = json.loads(line)
            self._on_ready()
        return self.info

    def _on_ready(self) -> None:
        pass

    def close(self) -> None:
        proc, self.proc = self.proc, None
        if proc is None:
            return
        shutil.rmtree(self._cwd, ignore_errors=True)
        try:
            os.killpg(proc.pid, signal.SIGKILL)  # the process and the session children it forked
        except (ProcessLookupError, PermissionError):
            pass
        try:
            proc.wait(timeout=10)
        except subprocess.TimeoutExpired:
            pass
        if proc.stdout:
            proc.stdout.close()

    def __enter__(self):
        return self

    def __exit__(self, *exc):
        self.close()

    def __del__(self):
        try:
            self.close()
        except Exception:  # noqa: BLE001
            pass


def _readline(proc, timeout: float) -> str:
    import select

    fd = proc.stdout.fileno()
    deadline = time.monotonic() + timeout
    buf = b""
    while b"\n" not in buf:
        left = deadline - time.monotonic()
        if left <= 0 or proc.poll() is not None and not select.select([fd], [], [], 0)[0]:
            return ""
        ready, _, _ = select.select([fd], [], [], min(left, 0.5))
        if ready:
            chunk = os.read(fd, 4096)
            if not chunk:
                return ""
            buf += chunk
    return buf.split(b"\n", 1)[0].decode()


class LocalServer(_Child):
    """A TVM RPC server in a child process, on ``host`` (default 127.0.0.1) and the first free
    port from ``port``; registered with ``tracker`` under ``key`` if given. ``.port``."""

    def __init__(self, host: str = "127.0.0.1", port: int = 9090, port_end: int | None = None, *,
                 tracker: tuple[str, int] | None = None, key: str = "", wait: bool = True):
        port_end = port + 100 if port_end is None else port_end
        argv = ["server", "--host", host, "--port", str(port), "--port-end", str(port_end)]
        if tracker:
            argv += ["--tracker", f"{tracker[0]}:{tracker[1]}", "--key", key]
        self.host, self.port = host, None
        super().__init__(argv, wait=wait)

    def _on_ready(self) -> None:
        self.port = int(self.info["port"])


class LocalTracker(_Child):
    """A TVM RPC tracker in a child process (needs ``tornado``). ``.port``;
    :meth:`summary` lists its servers."""

    def __init__(self, host: str = "127.0.0.1", port: int = 9190, port_end: int | None = None, wait: bool = True):
        port_end = port + 100 if port_end is None else port_end
        self.host, self.port = host, None
        super().__init__(["tracker", "--host", host, "--port", str(port), "--port-end", str(port_end)], wait=wait)

    def _on_ready(self) -> None:
        self.port = int(self.info["port"])

    def summary(self) -> dict:
        from tvm import rpc as _rpc

        return _rpc.connect_tracker(self.host, self.port).summary()

    def wait_for(self, key: str, n: int = 1, timeout: float = 30.0) -> None:
        """Until ``n`` servers are registered under ``key``."""
        deadline = time.monotonic() + timeout
        while True:
            try:
                queue_info = self.summary().get("queue_info", {}).get(key, {})
                if int(queue_info.get("free", 0)) >= n:
                    return
            except Exception:  # noqa: BLE001
                pass
            if time.monotonic() > deadline:
                raise TimeoutError(f"fewer than {n} servers registered under {key!r}")
            time.sleep(0.2)


def _serve(args) -> int:
    from tvm.rpc.server import PopenRPCServerState

    tracker = None
    if args.tracker:
        h, _, p = args.tracker.rpartition(":")
        tracker = (h, int(p))
    state = PopenRPCServerState(args.host, args.port, args.port_end or args.port + 100, tracker_addr=tracker, key=args.key,
                                silent=not args.verbose)
    print(json.dumps({"port": state.port}), flush=True)
    state.thread.join()
    return 0


def _track(args) -> int:
    try:
        from tvm.rpc.tracker import PopenTrackerServerState
    except ImportError as err:
        print(f"the RPC tracker needs tornado ({err}); pip install tornado", file=sys.stderr)
        return 2
    state = PopenTrackerServerState(args.host, args.port, args.port_end or args.port + 100, silent=not args.verbose)
    print(json.dumps({"port": state.port}), flush=True)
    state.thread.join()
    return 0


def main(argv=None) -> int:
    import argparse

    p = argparse.ArgumentParser(prog="python -m tvm_taso.cost.rpc",
                                description="A TVM RPC server or tracker (prints its port as JSON, then serves).")
    sub = p.add_subparsers(dest="command", required=True)
    s = sub.add_parser("server", help="an RPC server (runs whatever its clients send: keep it on a trusted network)")
    s.add_argument("--host", default="127.0.0.1")
    s.add_argument("--port", type=int, default=9090)
    s.add_argument("--port-end", type=int, default=None, help="last port to try + 1 (default port + 100)")
    s.add_argument("--tracker", help="register with this tracker (host:port)")
    s.add_argument("--key", default="", help="device key at the tracker")
    s.add_argument("-v", "--verbose", action="store_true")
    s.set_defaults(func=_serve)
    t = sub.add_parser("tracker", help="an RPC tracker")
    t.add_argument("--host", default="127.0.0.1")
    t.add_argument("--port", type=int, default=9190)
    t.add_argument("--port-end", type=int, default=None, help="last port to try + 1 (default port + 100)")
    t.add_argument("-v", "--verbose", action="store_true")
    t.set_defaults(func=_track)
    args = p.parse_args(argv)
    return args.func(args)


if __name__ == "__main__":
    sys.exit(main())
