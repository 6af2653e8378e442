"""The measurement worker: a long-lived child process that builds and times kernels, so that a
build error, a hang or a crash (a segfault) of one kernel becomes a result with that status
instead of taking the search down.

The parent writes one JSON request per line to the child's stdin; the child answers with JSON
lines on its original stdout (``{"phase": "built"}`` while it works, then ``{"result": ...}``);
TVM's own prints go to stderr. A request's ``fn`` ("module:function", called as
``fn(request, progress)``) says what to run. The child is ``python -m tvm_taso.cost.worker``,
started in an empty private directory with the parent's import path minus the current
directory, so that a module in the user's working directory (a ``statistics.py``) is never
imported in its place.
"""

from __future__ import annotations

import atexit
import importlib
import json
import logging
import os
import select
import shutil
import signal
import subprocess
import sys
import tempfile
import threading
import time
import traceback

log = logging.getLogger("tvm_taso.cost.worker")


def short_error(err: BaseException, limit: int = 2000) -> str:
    """``Type: message``, cut in the middle past ``limit`` characters (TVM errors run long)."""
    text = f"{type(err).__name__}: {err}"
    return text if len(text) <= limit else text[: limit // 2] + " ... " + text[-limit // 2:]


def resolve(name: str):
    """The function named ``"module:function"``."""
    module, _, attr = name.partition(":")
    fn = importlib.import_module(module)
    for part in attr.split("."):
        fn = getattr(fn, part)
    return fn


def serve() -> int:
    """The child's loop: one JSON request in on stdin, JSON lines out on the original stdout."""
    proto = os.fdopen(os.dup(1), "w", buffering=1)
    os.dup2(2, 1)
    sys.stdout = sys.stderr
    import tvm  # noqa: F401  (pay the import before saying ready)

    proto.write(json.dumps({"ready": True, "pid": os.getpid()}) + "\n")

    def progress(phase):
        proto.write(json.dumps({"phase": phase}) + "\n")

    for line in sys.stdin:
        if not line.strip():
            continue
        try:
            request = json.loads(line)
            result = resolve(request["fn"])(request, progress)
        except Exception as err:  # noqa: BLE001
            result = {"status": "runtime_error", "error": short_error(err) + "\n" + traceback.format_exc()[-1500:]}
        proto.write(json.dumps({"result": result}) + "\n")
    return 0


def import_path() -> str:
    """The parent's import path for the child (so that a test's injected ``fn`` is importable
    there too), without the current directory."""
    here = os.path.abspath(os.curdir)
    paths = [os.path.abspath(p) for p in sys.path if p]
    paths = [p for p in paths if p != here and os.path.isdir(p)]
    inherited = [p for p in os.environ.get("PYTHONPATH", "").split(os.pathsep) if p and os.path.abspath(p) != here]
    return os.pathsep.join(dict.fromkeys(paths + inherited))


class Worker:
    """A long-lived ``python -m tvm_taso.cost.worker`` process; restarted after a timeout or a
    crash. Not thread-safe: one request at a time (timings must not overlap anyway)."""

    STARTUP_TIMEOUT = 120.0

    def __init__(self, env: dict | None = None):
        self.env = env
        self.proc: subprocess.Popen | None = None
        self.starts = 0
        self.broken: str | None = None  # why the worker could not start (then no more tries)
        self._buf = b""
        self._cwd: str | None = None
        self._lock = threading.Lock()

    def _start(self) -> None:
        env = dict(os.environ if self.env is None else self.env)
        env["PYTHONPATH"] = import_path()
        env.setdefault("PYTHONUNBUFFERED", "1")
        self._cwd = tempfile.mkdtemp(prefix="tvm-taso-worker-")  # empty: nothing to import from
        self.proc = subprocess.Popen(
            [sys.executable, "-m", "tvm_taso.cost.worker"], cwd=self._cwd,
            stdin=subprocess.PIPE, stdout=subprocess.PIPE,
            stderr=None if log.isEnabledFor(logging.DEBUG) else subprocess.DEVNULL,
            env=env, start_new_session=True, close_fds=True,
        )
        self.starts += 1
        self._buf = b""
        msg = self._read(time.monotonic() + self.STARTUP_TIMEOUT)
        if not msg or not msg.get("ready"):
            code = self.proc.poll() if self.proc is not None else None
            self.close()
            self.broken = f"the measurement worker did not start ({describe_exit(code)})"
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

    def _send(self, request: dict) -> None:
        self.proc.stdin.write((json.dumps(request) + "\n").encode())
        self.proc.stdin.flush()

    def request(self, request: dict, timeout: float) -> dict:
        """Run one request; a result dict with a ``status`` in every case."""
        with self._lock:
            if self.broken:
                raise RuntimeError(self.broken)
            if self.proc is None or self.proc.poll() is not None:
                self._start()
            try:
                self._send(request)
            except (BrokenPipeError, OSError):
                self.close()
                self._start()
                self._send(request)
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
                    return {"status": status, "error": f"worker died while {phase} ({describe_exit(code)})"}
                if "phase" in msg:
                    phase = "running" if msg["phase"] == "built" else msg["phase"]
                elif "result" in msg:
                    return msg["result"]

    def _reap(self):
        proc, self.proc = self.proc, None
        self._remove_cwd()
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

    def _remove_cwd(self) -> None:
        if self._cwd is not None:
            shutil.rmtree(self._cwd, ignore_errors=True)
            self._cwd = None

    def close(self) -> None:
        proc, self.proc = self.proc, None
        if proc is not None:
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
        self._remove_cwd()


def describe_exit(code) -> str:
    """A child's exit status in words (``killed by SIGABRT``, ``exit status 1``)."""
    if code is None:
        return "exit status unknown"
    if code < 0:
        try:
            return f"killed by {signal.Signals(-code).name}"
        except ValueError:
            return f"killed by signal {-code}"
    return f"exit status {code}"


_SHARED: Worker | None = None


def shared_worker() -> Worker:
    """The process-wide worker (started on first use, closed at exit)."""
    global _SHARED
    if _SHARED is None:
        _SHARED = Worker()
        atexit.register(_SHARED.close)
    return _SHARED


if __name__ == "__main__":
    sys.exit(serve())
