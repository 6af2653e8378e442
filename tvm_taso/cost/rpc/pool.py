"""Measuring kernels on several remote devices at once."""

from __future__ import annotations

import logging
import queue
from concurrent.futures import ThreadPoolExecutor

from tvm_taso import target as targets
from tvm_taso.cost.database import MeasurementDB, Record
from tvm_taso.cost.kernel_build import MeasureError
from tvm_taso.cost.database import db_target
from tvm_taso.cost.model import Kernel
from tvm_taso.cost.rpc.measurer import RPCMeasurer, RPCUnavailable

log = logging.getLogger("tvm_taso.cost.rpc")


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
                repeats: int = 10, timeout: float = 60.0, progress=None, **kw) -> list[Record | None]:
        """Measure ``kernel_list`` on all devices at once; one record per kernel, in order
        (None where the device was unreachable). With ``db``, kernels it already holds are not
        measured again (their record is returned) and new records are added to it.
        ``progress()`` is called after each kernel."""
        tstr = targets.canonical(target)
        rt = self.record_target(db_target(tstr, kw.get("database")))

        def one(k):
            try:
                return measured(k)
            finally:
                if progress is not None:
                    progress()

        def measured(k):
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
