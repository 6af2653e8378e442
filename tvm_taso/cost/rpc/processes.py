"""TVM RPC servers and trackers in child processes, for tests and for measuring on this machine.

Each child runs ``python -m tvm_taso.cost.rpc server|tracker`` (:mod:`tvm_taso.cost.rpc.__main__`)
and prints one JSON line (``{"port": ...}``) once it has bound its port. Unlike
``tvm.rpc.Server`` they do not need ``cloudpickle``; the tracker needs ``tornado`` (as TVM's
does). They bind to 127.0.0.1 unless told otherwise: a TVM RPC server runs any code its clients
send.
"""

from __future__ import annotations

import json
import logging
import os
import shutil
import signal
import subprocess
import sys
import tempfile
import time

from tvm_taso.cost.worker import import_path

log = logging.getLogger("tvm_taso.cost.rpc")


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
