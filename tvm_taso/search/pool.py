"""Regions searched ahead, in worker processes: :class:`RegionPool`.

The regions of a pass are independent searches. :func:`tvm_taso.search.regions.search_regions`
hands every region of a pass to the pool as the graph stands at the start of the pass, then
settles them in order as before; a region whose content an earlier region's splice changed
(another shape, another constant) is searched again in order, so the result is the serial
run's. Regions alike in shape are handed over once (the later ones take the first one's result,
as in a serial run). A region is handed over only when a worker is started and idle, and one
not handed over when its turn comes is searched in this process: a pool still starting costs
the search nothing.

Workers start once per pool, from a fork server that imported TVM once per process, and are
handed the rules, the cost model and the options once, when they start. A worker that dies
breaks the pool: the regions it had are searched in this process, and the pool is not used again.
"""

from __future__ import annotations

import concurrent.futures
import contextlib
import logging
import multiprocessing
import os
import pickle
import sys
import threading
import time
import types
from concurrent.futures import Future, ProcessPoolExecutor
from concurrent.futures.process import BrokenProcessPool

from tvm_taso.cost.model import CostModel
from tvm_taso.target import available_cores
from tvm_taso.ir.graph import Graph
from tvm_taso.search.stats import SearchStats

log = logging.getLogger(__name__)

_search = None  # the worker's region search, made once from what the pool handed it


def default_workers() -> int:
    """``$TVM_TASO_WORKERS``, else the cores this process may use: the processes searching
    regions when ``workers`` is not given (a test runner that already runs one process per core
    sets 1). A value that is not a count of processes is said, once, and the cores used."""
    given = os.environ.get("TVM_TASO_WORKERS", "").strip()
    if given.isdigit() and int(given) > 0:
        return int(given)
    if given and given not in _warned:
        _warned.add(given)
        log.warning("TVM_TASO_WORKERS=%s is not a count of processes (an integer >= 1): searching with %d, "
                    "the cores this process may use", given, available_cores())
    return available_cores()


_warned: set = set()  # worker counts already said to be unusable or more than the cores


def _start_worker(payload: bytes) -> None:
    global _search
    from tvm_taso.search.engines import region_search

    rules, cost, options = pickle.loads(payload)
    _search = region_search(rules, cost, options)


def _ready() -> int:
    return os.getpid()


def _search_region(sub: Graph, seconds: float, deadline: float):
    from tvm_taso.search.regions import Found, collector_paused

    stats = SearchStats()
    with collector_paused():
        found = Found(*_search(sub, min(deadline, time.perf_counter() + seconds), stats))
    return found, stats


@contextlib.contextmanager
def _main_module_hidden():
    """Workers started meanwhile do not import the user's main script: multiprocessing would run
    an unguarded script again in each (without ``if __name__ == "__main__"``), and workers need
    nothing from it (a cost model defined there does not unpickle: the pool breaks, and the
    search goes on in this process)."""
    main = sys.modules.get("__main__")
    sys.modules["__main__"] = types.ModuleType("__main__")
    try:
        yield
    finally:
        if main is not None:
            sys.modules["__main__"] = main


def _importable(cls) -> bool:
    """Whether a worker can unpickle an instance of ``cls``: a class of an importable module (not
    the user's script, which workers do not run, nor a function's local class)."""
    import importlib

    if cls.__module__ == "__main__" or "<locals>" in cls.__qualname__:
        return False
    try:
        found = importlib.import_module(cls.__module__)
        for part in cls.__qualname__.split("."):
            found = getattr(found, part)
    except (ImportError, AttributeError):
        return False
    return found is cls


class RegionPool:
    """``workers`` processes searching regions with ``rules``, ``cost`` and ``options``, beside
    the one that settles them (which searches too: ``options.workers`` counts it).
    :meth:`start` starts them (in the background: the search goes on in this process meanwhile);
    :meth:`free` says how many are started and idle, :meth:`submit` hands one a region;
    :meth:`close` stops them."""

    def __init__(self, rules, cost: CostModel, options, workers: int):
        self.workers = workers
        self._payload = pickle.dumps((rules, cost, options))
        self._executor: ProcessPoolExecutor | None = None
        self._starter: threading.Thread | None = None
        self._lock = threading.Lock()
        self._closed = False
        self._started: list[Future] = []  # one trivial task per worker: done once workers run
        self._busy: list[Future] = []
        self.broken = False

    @staticmethod
    def for_run(rules, cost: CostModel, options) -> RegionPool | None:
        """The pool ``options.workers`` asks for, not started yet (None: one process, or a cost model
        that measures on this machine, whose timings must not share its cores with searches)."""
        workers = options.workers or default_workers()
        if workers > available_cores():  # more processes than cores only share them, and cost memory
            if workers not in _warned:
                _warned.add(workers)
                log.warning("workers=%d is more than the %d cores this process may use: searching with %d",
                            workers, available_cores(), available_cores())
            workers = available_cores()
        if workers <= 1:
            return None
        if cost.measures:
            log.info("searching regions in one process: the %s cost model times kernels on this machine", cost.name)
            return None
        if not _importable(type(cost)):
            log.warning("searching regions in one process: the cost model %s is defined where worker processes "
                        "cannot import it (%s); define it in a module to search with %d", type(cost).__qualname__,
                        type(cost).__module__, workers)
            return None
        return RegionPool(rules, cost, options, workers - 1)  # this process searches too

    def start(self) -> None:
        """Start the workers, in the background (a fork server imports the search once per
        process, and a worker's start waits for it: seconds of importing TVM, during which this
        process searches on; each worker is handed the rules, the cost model and the options
        once)."""
        if self._starter is not None or self.broken:
            return
        self._starter = threading.Thread(target=self._start, name="tvm-taso-region-pool", daemon=True)
        self._starter.start()

    def _start(self) -> None:
        try:
            context = multiprocessing.get_context("forkserver")
            context.set_forkserver_preload(["tvm"])  # not egglog: it starts a thread, and workers are forked
            executor = ProcessPoolExecutor(self.workers, mp_context=context, initializer=_start_worker,
                                           initargs=(self._payload,))
            with _main_module_hidden():  # each submit starts a worker while there is none idle
                self._started = [executor.submit(_ready) for _ in range(self.workers)]
        except Exception:  # noqa: BLE001 - no worker: the regions are searched in this process
            log.debug("the region workers did not start", exc_info=True)
            self._broke()
            return
        with self._lock:  # handed over last: the pool is used once it is whole
            if self._closed:  # the search ended while the workers started
                executor.shutdown(wait=False, cancel_futures=True)
            else:
                self._executor = executor

    def wait(self, timeout: float | None = None) -> None:
        """Until the workers :meth:`start` started run (or ``timeout`` seconds pass)."""
        deadline = None if timeout is None else time.perf_counter() + timeout
        if self._starter is not None:
            self._starter.join(timeout)
        left = None if deadline is None else max(0.0, deadline - time.perf_counter())
        concurrent.futures.wait(self._started, left)

    def free(self) -> int:
        """Workers started and idle: a region handed to one now starts at once."""
        if self.broken or self._executor is None:
            return 0
        if any(f.done() and f.exception() is not None for f in self._started):
            self._broke()
            return 0
        running = len({f.result() for f in self._started if f.done()})
        self._busy = [f for f in self._busy if not f.done()]
        return max(0, running - len(self._busy))

    def submit(self, sub: Graph, seconds: float, deadline: float) -> Future | None:
        """The search of ``sub`` (given ``seconds``, within ``deadline``), as a future of
        ``(Found, SearchStats)``; None when the pool is broken."""
        if self.broken or self._executor is None:
            return None
        try:
            future = self._executor.submit(_search_region, sub, seconds, deadline)
        except BrokenProcessPool:
            self._broke()
            return None
        self._busy.append(future)
        return future

    def result(self, future: Future):
        """``(Found, SearchStats)`` of a submitted search; None if its worker died (the pool is then
        not used again) or the search failed there (it is then searched in this process, where
        its error, if any, is the serial run's)."""
        try:
            return future.result()
        except BrokenProcessPool:
            self._broke()
            return None
        except Exception:  # noqa: BLE001 - searched again here, in order
            log.debug("a region search failed in a worker", exc_info=True)
            return None

    def _broke(self) -> None:
        if not self.broken:
            log.warning("a region search worker died; searching the remaining regions in this process")
        self.broken = True

    def close(self) -> None:
        with self._lock:  # a pool still starting is stopped by its starter once started
            self._closed = True
        if self._executor is not None:
            self._executor.shutdown(wait=False, cancel_futures=True)
            self._executor = None
