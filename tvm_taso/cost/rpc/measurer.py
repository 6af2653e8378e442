"""Measuring kernels on one remote device through TVM's RPC.

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

:class:`RPCMeasurer` is a *measurer* for :class:`~tvm_taso.cost.measure.MeasuredCost`, called
like :func:`~tvm_taso.cost.measure.measure_kernel` (``(kernel, target, repeats, timeout, ...)
-> Record``). Build and remote run (:func:`run_remote_measurement`) happen in a
:class:`~tvm_taso.cost.worker.Worker` process bounded by ``timeout``, so a crash or a hang is a
record, as with local measurement. An unreachable server is *not* the kernel's fault: it raises
:class:`RPCUnavailable` and nothing is recorded.
"""

from __future__ import annotations

import json
import os
import statistics
import tempfile
import time

from tvm_taso import target as targets
from tvm_taso.cost.database import Record, db_target
from tvm_taso.cost.kernel_build import MeasureError, build_kernel, kernel_inputs
from tvm_taso.cost.measure import measurement_request, result_record, run_request
from tvm_taso.cost.model import Kernel
from tvm_taso.cost.worker import Worker, short_error

# the error prefix by which the worker's result tells an unreachable remote from a failed kernel
UNAVAILABLE = "RPCUnavailable"


class RPCUnavailable(RuntimeError):
    """The RPC server or tracker could not be reached (nothing is recorded for the kernel)."""


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
    ``{"host": ..., "port": ..., "key": ...}``; its ``server`` attribute is the address of the
    server it reached (through a tracker, the one the tracker handed out)."""
    from tvm import rpc as _rpc
    from tvm.rpc import client

    if rpc.get("tracker"):
        host, port = rpc["tracker"]
        tracker = _rpc.connect_tracker(host, int(port))
        reached = []
        direct = client.connect

        def connect_and_note(url, server_port, *args, **kwargs):
            reached.append(f"{url}:{server_port}")
            return direct(url, server_port, *args, **kwargs)

        client.connect = connect_and_note  # the tracker's request names the server only to this call
        try:
            sess = tracker.request(rpc.get("key") or "", priority=int(rpc.get("priority", 1)),
                                   session_timeout=session_timeout, max_retry=int(rpc.get("max_retry", 3)))
        finally:
            client.connect = direct
        sess.server = reached[-1] if reached else "?"
        return sess
    sess = _rpc.connect(rpc["host"], int(rpc["port"]), rpc.get("key") or "", session_timeout=session_timeout)
    sess.server = f"{rpc['host']}:{rpc['port']}"
    return sess


def run_remote_measurement(request: dict, progress=lambda phase: None) -> dict:
    """Build ``request["kernel"]`` for ``request["target"]`` here, run it on the RPC device in
    ``request["rpc"]``; the result dict of :func:`~tvm_taso.cost.measure.run_measurement`.
    Runs inside a :class:`~tvm_taso.cost.worker.Worker` (``fn="tvm_taso.cost.rpc.measurer:run_remote_measurement"``)."""
    import tvm
    from tvm import relax

    kernel = Kernel.from_json(request["kernel"])
    rpc_cfg = request["rpc"]
    with tempfile.TemporaryDirectory(prefix="tvm-taso-rpc-") as tmp:
        try:
            # the BLAS runs in the process that runs the module: not in the RPC server
            ex = build_kernel(kernel, targets.without_blas(request["target"]), request.get("database"))
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
        where = sess.server
        try:
            sess.upload(path, name)
            rmod = sess.load_module(name)
            dev = sess.device(rpc_cfg.get("device") or targets.device_type(request["target"]),
                              int(rpc_cfg.get("device_id", 0)))
            vm = relax.VirtualMachine(rmod, dev)
            vm.set_input("main", *[tvm.runtime.tensor(a, dev) for a in kernel_inputs(kernel, target=request["target"])])
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
    return {"status": "ok", "median_us": statistics.median(samples), "samples_us": samples, "error": "",
            "measured_on": where}






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
        """The target string of this device's records: kernels are built here without the BLAS
        (:func:`run_remote_measurement`), and marked with the device's tag."""
        data = json.loads(target_string)
        if "taso:blas" not in data and not self.tag:
            return target_string
        data.pop("taso:blas", None)
        if self.tag:
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
                                      "tvm_taso.cost.rpc.measurer:run_remote_measurement")
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
