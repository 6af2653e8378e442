"""The measurement database: one JSON line per measured kernel, shared by every process.

Each distinct kernel (its :meth:`~tvm_taso.cost.model.Kernel.key` on a canonical target string) is
measured once, ever: :class:`MeasurementDB` is an append-only JSON-lines file. Writers take an
exclusive ``fcntl.flock`` on the file, append one line, flush and fsync, so two processes may
write at once; readers re-read whatever others appended since their last read. A torn or corrupt
line (a crash mid-write, a hand edit) is skipped with one warning naming the file and line.

The file lives at ``$TVM_TASO_CACHE/measurements.jsonl``, else
``~/.cache/tvm-taso/measurements.jsonl``. A cache directory that cannot be created, read or
written (a file, read-only) is named in one warning, and the database then lives in memory for
the rest of the run: measuring goes on, nothing fails.
"""

from __future__ import annotations

import fcntl
import json
import math
import logging
import os
import statistics
import time
from collections import Counter, defaultdict
from dataclasses import asdict, dataclass, field
from pathlib import Path

from tvm_taso import blas, target as targets
from tvm_taso.cost.schedules import DEFAULT_SCHEDULE
from tvm_taso.files import cache_dir

log = logging.getLogger("tvm_taso.cost.database")

_warned_unusable: set[str] = set()  # cache directories already named in a warning (once per run)


def default_path() -> Path:
    """``measurements.jsonl`` in :func:`tvm_taso.files.cache_dir`."""
    return cache_dir() / "measurements.jsonl"


def _tvm_version() -> str:
    import sys

    tvm = sys.modules.get("tvm")
    if tvm is not None:
        return getattr(tvm, "__version__", "")
    try:
        from importlib.metadata import version

        return version("apache-tvm")
    except Exception:  # noqa: BLE001
        return ""


def db_target(tstr: str, database: str | None) -> str:
    """The database's target string: the canonical target, marked with the MetaSchedule database
    when tuned schedules were applied, and on a CPU without one with the default schedules
    kernels are built with (:func:`~tvm_taso.cost.kernel_build.build_pipeline`): tuned,
    default-scheduled and plain-loop timings are different facts. A CPU's are also marked with
    the layouts its convolutions are built in (:func:`~tvm_taso.target.conv_layouts`): timings
    of kernels built in the model's layouts, from before, are not reused; and with the BLAS its
    matmuls and convolutions are handed to (:func:`~tvm_taso.blas.used_for`)."""
    data = json.loads(tstr)
    if database:
        data["taso:ms_database"] = os.path.abspath(str(database))
    elif not targets.is_gpu(tstr):
        data["taso:schedule"] = DEFAULT_SCHEDULE
    else:
        return tstr
    layouts = targets.conv_layouts(tstr)
    if layouts:
        data["taso:conv_layouts"] = layouts
    if blas.used_for(tstr):
        data["taso:blas"] = blas.name()
    return json.dumps(data, sort_keys=True, separators=(",", ":"))


def measured_target(target) -> str:
    """The target string of measurements of ``target``'s own builds (no MetaSchedule database):
    :func:`db_target` of its canonical string."""
    return db_target(targets.canonical(target), None)


@dataclass
class Record:
    """One measurement of one kernel on one target."""

    key: str  # Kernel.key()
    target: str  # tvm_taso.target.canonical(...)
    kernel: dict  # Kernel.to_json()
    status: str  # "ok" | "build_error" | "runtime_error" | "timeout"
    median_us: float | None = None
    samples_us: list = field(default_factory=list)
    error: str = ""
    created: float = field(default_factory=time.time)
    tvm_version: str = field(default_factory=_tvm_version)
    measured_on: str = ""  # the remote that measured it ("" for this machine)

    @property
    def ok(self) -> bool:
        return self.status == "ok" and self.median_us is not None

    @property
    def cost(self) -> float:
        """Microseconds, infinite when the kernel failed to build or run."""
        return float(self.median_us) if self.ok else float("inf")

    def to_json(self) -> dict:
        return asdict(self)

    def problem(self) -> str | None:
        """Why this record cannot be a measurement (a "good" median that is NaN, infinite,
        zero or negative), or None."""
        if self.status != "ok" or self.median_us is None:
            return None
        m = self.median_us
        if not math.isfinite(m) or m <= 0:
            return f"median_us {m!r} is not a positive, finite time"
        return None

    @staticmethod
    def from_json(data: dict) -> "Record":
        if not isinstance(data, dict) or "key" not in data or "target" not in data or "status" not in data:
            raise ValueError("not a measurement record")
        median = data.get("median_us")
        rec = Record(
            key=str(data["key"]),
            target=str(data["target"]),
            kernel=data.get("kernel") or {},
            status=str(data["status"]),
            median_us=None if median is None else float(median),
            samples_us=[float(x) for x in data.get("samples_us") or []],
            error=str(data.get("error") or ""),
            created=float(data.get("created") or 0.0),
            tvm_version=str(data.get("tvm_version") or ""),
            measured_on=str(data.get("measured_on") or ""),
        )
        problem = rec.problem()
        if problem:
            raise ValueError(f"kernel {rec.key}: {problem}")
        return rec


class MeasurementDB:
    """Append-only JSON-lines store of :class:`Record` s, safe for concurrent writers."""

    def __init__(self, path=None):
        self.path = Path(path).expanduser() if path is not None else default_path()
        if self.path.is_dir() or (path is not None and str(path).endswith(os.sep)):
            self.path = self.path / "measurements.jsonl"
        self._by_key: dict[tuple[str, str], Record] = {}
        self._order: list[Record] = []
        self._offset = 0  # bytes of the file already parsed
        self._lineno = 0  # complete lines already parsed
        self._warned: set[int] = set()
        self.in_memory = False  # the file cannot be used: records live in this object only
        try:
            self.path.parent.mkdir(parents=True, exist_ok=True)
        except OSError as err:
            self._use_memory(err)

    def _use_memory(self, err: OSError) -> None:
        """Go on without the file, after one warning naming its directory (and TVM_TASO_CACHE)."""
        self.in_memory = True
        if str(self.path.parent) not in _warned_unusable:  # kernels and regions share the directory
            _warned_unusable.add(str(self.path.parent))
            log.warning("cannot use the measurement cache %s (%s): measurements are kept in memory for this "
                        "run only; set TVM_TASO_CACHE to a writable directory to keep them",
                        self.path.parent, err.strerror or err)

    # -- reading -----------------------------------------------------------------------------
    def refresh(self) -> None:
        """Parse lines appended since the last read (by this or any other process)."""
        if self.in_memory:
            return
        try:
            size = self.path.stat().st_size
        except FileNotFoundError:
            return
        except OSError as err:  # a file where a directory should be, no permission
            self._use_memory(err)
            return
        if size < self._offset:  # truncated or replaced: start over
            self._by_key.clear()
            self._order.clear()
            self._offset = self._lineno = 0
        if size == self._offset:
            return
        try:
            with open(self.path, "rb") as f:
                f.seek(self._offset)
                data = f.read()
        except OSError as err:
            self._use_memory(err)
            return
        end = data.rfind(b"\n")
        if end < 0:
            return  # a line being written (or torn at the end): wait for its newline
        chunk = data[: end + 1]
        self._offset += len(chunk)
        for raw in chunk.split(b"\n")[:-1]:
            self._lineno += 1
            if not raw.strip():
                continue
            try:
                rec = Record.from_json(json.loads(raw))
            except (ValueError, TypeError, UnicodeDecodeError) as err:
                if self._lineno not in self._warned:
                    self._warned.add(self._lineno)
                    log.warning("%s:%d: skipped a corrupt measurement record (%s)", self.path, self._lineno, err)
                continue
            self._by_key[(rec.key, rec.target)] = rec
            self._order.append(rec)

    def get(self, key: str, target: str) -> Record | None:
        rec = self._by_key.get((key, target))
        if rec is None:
            self.refresh()
            rec = self._by_key.get((key, target))
        return rec

    def records(self, target: str | None = None) -> list[Record]:
        """Every record (the latest per kernel and target), optionally for one target."""
        self.refresh()
        latest = {}
        for rec in self._order:
            latest[(rec.key, rec.target)] = rec
        return [r for r in latest.values() if target is None or r.target == target]

    def __len__(self) -> int:
        return len(self.records())

    def __contains__(self, item) -> bool:
        key, target = item
        return self.get(key, target) is not None

    # -- writing -----------------------------------------------------------------------------
    def add(self, record: Record) -> None:
        """Append one record: an exclusive lock, one write, flush and fsync (in memory only when
        the file cannot be written). A record whose median is no time (NaN, infinite, zero,
        negative) is refused with a warning naming it."""
        problem = record.problem()
        if problem:
            log.warning("refused a measurement of kernel %s on %s: %s", record.key, record.target, problem)
            return
        if not self.in_memory:
            try:
                self._append(record)
            except OSError as err:
                self._use_memory(err)
        if self.in_memory:
            self._order.append(record)
        self._by_key[(record.key, record.target)] = record
        # On file, the line is parsed again by the next refresh (it may follow other writers'
        # lines), which is harmless: the same record replaces itself.

    def _append(self, record: Record) -> None:
        line = json.dumps(record.to_json(), sort_keys=True, allow_nan=False, separators=(",", ":"))
        data = (line + "\n").encode()
        fd = os.open(self.path, os.O_WRONLY | os.O_APPEND | os.O_CREAT, 0o644)
        try:
            fcntl.flock(fd, fcntl.LOCK_EX)
            try:
                # A writer that died mid-line left no newline: start on a fresh line so our
                # record is not glued onto its torn bytes.
                size = os.fstat(fd).st_size
                if size:
                    with open(self.path, "rb") as f:
                        f.seek(size - 1)
                        if f.read(1) != b"\n":
                            data = b"\n" + data
                view = memoryview(data)
                while view:
                    n = os.write(fd, view)
                    view = view[n:]
                os.fsync(fd)
            finally:
                fcntl.flock(fd, fcntl.LOCK_UN)
        finally:
            os.close(fd)

    # -- reporting ---------------------------------------------------------------------------
    def summary(self) -> dict:
        recs = self.records()
        by_target: dict[str, Counter] = defaultdict(Counter)
        medians: dict[str, list[float]] = defaultdict(list)
        for r in recs:
            by_target[r.target][r.status] += 1
            if r.ok:
                medians[r.target].append(r.median_us)
        try:
            size = 0 if self.in_memory else self.path.stat().st_size
        except OSError:
            size = 0
        per_target = {}
        for t, counts in sorted(by_target.items()):
            ms = medians.get(t, [])
            try:
                kind = targets.kind(t)
            except targets.TargetError:  # a hand-written target string: still summarized
                kind = "?"
            per_target[t] = {
                "kind": kind,
                "records": sum(counts.values()),
                "status": dict(sorted(counts.items())),
                "median_of_medians_us": statistics.median(ms) if ms else None,
            }
        all_ms = [m for ms in medians.values() for m in ms]
        return {
            "path": str(self.path),
            "file_bytes": size,
            "records": len(recs),
            "status": dict(sorted(Counter(r.status for r in recs).items())),
            "median_of_medians_us": statistics.median(all_ms) if all_ms else None,
            "targets": per_target,
        }
