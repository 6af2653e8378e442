"""Regions searched in worker processes (``workers=N``, ``-j N``): the same result as one process."""

import logging
import os
import subprocess
import sys
import time

import pytest

import tvm_taso
from tvm_taso.cost.analytic import AnalyticCost
from tvm_taso.cost.model import Kernel
from tvm_taso.io.onnx_bridge import OnnxGraph
from tvm_taso.search import SearchOptions, search
from tvm_taso.search.options import OptionError
from tvm_taso.search.pool import RegionPool

sys.path.insert(0, os.path.join(os.path.dirname(__file__), ".."))
from benchmarks import models  # noqa: E402

def _without_timings(report):
    """The report without what is measured in time (seconds anywhere, the search curve) and
    which process searched which region."""
    if isinstance(report, dict):
        return {k: _without_timings(v) for k, v in report.items()
                if "seconds" not in k and k not in ("curve", "worker_regions")}
    if isinstance(report, list):
        return [_without_timings(v) for v in report]
    return report


def _fork_server_started():
    """The process's fork server up (it imports TVM once, for every pool after it): workers then
    start in well under a second, while the search goes on without them meanwhile."""
    pool = RegionPool([], AnalyticCost("cuda"), SearchOptions(workers=2), 1)
    pool.start()
    pool.wait(120)
    pool.close()


@pytest.mark.heavy
@pytest.mark.parametrize("name, search_kind", [("resnext50", "backtrack"), ("resnet50", "eqsat")])
def test_two_workers_find_what_one_finds(name, search_kind):
    model = tvm_taso.load_onnx(models.build(name, quick=True), name=name)
    _fork_server_started()
    results = {}
    for workers in (1, 2):
        options = SearchOptions(time_limit=600, kind=search_kind, workers=workers, region_size=4)
        new, report = tvm_taso.optimize(model, target="cuda", cost_model="analytic", options=options)
        results[workers] = (new.proto.SerializeToString(), report)
    (one, r1), (two, r2) = results[1], results[2]
    assert r1["regions"] >= 8 and r1["regions_cut_short"] == 0
    assert r1["applied"], "the search should rewrite something"
    assert r1["search"]["worker_regions"] == 0 and r2["search"]["worker_regions"] > 0  # a worker searched
    assert one == two  # the same ONNX model, byte for byte
    assert _without_timings(r1) == _without_timings(r2)


class DiesInWorkers(AnalyticCost):
    """The analytic model, except that it kills any process but the one that made it."""

    def __init__(self, target):
        super().__init__(target)
        self.home = os.getpid()

    def kernel_cost(self, kernel: Kernel) -> float:
        if os.getpid() != self.home:
            os._exit(3)
        return super().kernel_cost(kernel)


@pytest.mark.heavy
def test_a_worker_that_dies_leaves_the_regions_to_this_process(caplog):
    graph = OnnxGraph(
        tvm_taso.load_onnx(models.build("resnext50", quick=True), name="resnext50")).graph
    options = SearchOptions(time_limit=600, workers=1, region_size=4)
    serial = search(graph.copy(), tvm_taso.default_rules(), AnalyticCost("cuda"), options)
    cost = DiesInWorkers("cuda")
    pool = RegionPool(tvm_taso.default_rules(), cost, options, 2)
    pool.start()
    pool.wait(60)  # both workers up: the first regions go to them
    try:
        with caplog.at_level(logging.WARNING, logger="tvm_taso.search.pool"):
            parallel = search(graph.copy(), tvm_taso.default_rules(), cost, options, pool=pool)
    finally:
        pool.close()
    assert pool.broken
    assert "worker died" in caplog.text
    assert parallel.structural_hash() == serial.structural_hash()


def test_measuring_cost_models_search_in_one_process():
    from tvm_taso.cost.measure import MeasuredCost

    options = SearchOptions(workers=2)
    assert RegionPool.for_run([], AnalyticCost("cuda"), options) is not None
    assert RegionPool.for_run([], MeasuredCost("llvm"), options) is None
    assert RegionPool.for_run([], AnalyticCost("cuda"), SearchOptions(workers=1)) is None


def test_workers_out_of_range_are_one_line():
    with pytest.raises(OptionError, match="workers"):
        SearchOptions(workers=0)
    out = subprocess.run([sys.executable, "-m", "tvm_taso.cli", "optimize", "m.onnx", "-o", "o.onnx", "-j", "0"],
                         capture_output=True, text=True)
    assert out.returncode == 2 and "--jobs" in out.stderr and "Traceback" not in out.stderr


def test_a_pool_closed_while_starting_does_not_wait_for_it():
    """A search that ends before its workers are up (the fork server still importing TVM) does
    not wait for them: closing returns at once, and the workers started are stopped."""
    pool = RegionPool([], AnalyticCost("cuda"), SearchOptions(workers=2), 1)
    started = time.perf_counter()
    pool.start()
    assert pool.free() == 0  # nothing is handed to a worker that is not up
    pool.close()
    assert time.perf_counter() - started < 1.0
    pool._starter.join(120)
    assert pool._executor is None
