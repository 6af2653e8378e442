"""Remote measurement through TVM's RPC, on loopback only (127.0.0.1): a server in a child
process, a tracker with a server registered under a key, a pool over both, and the cost model
measuring through them. Every server here binds to 127.0.0.1."""

from __future__ import annotations

import math
import os
import socket

import pytest

import tvm_taso
from tvm_taso import examples
from tvm_taso.cost.database import MeasurementDB, measured_target
from tvm_taso.cost.model import Kernel
from tvm_taso.cost.rpc import (LocalServer, LocalTracker, RPCMeasuredCost, RPCMeasurer, RPCPool,
                               RPCUnavailable)
from tvm_taso.cost.worker import Worker
from tvm_taso.ir.ops import TensorType

F32 = "float32"
LOOPBACK = "127.0.0.1"
BASE_PORT = 20000 + (os.getpid() * 7) % 20000  # apart from other test runs on this machine


def _matmul(m=16, k=16, n=16, k2=None) -> Kernel:
    a, b = TensorType((m, k), F32), TensorType((k if k2 is None else k2, n), F32)
    return Kernel((("matmul", (("out_dtype", "void"),), (("in", a), ("in", b))),), (TensorType((m, n), F32),))


def _matmul_split() -> Kernel:
    """Two outputs: the VM returns a tuple (timed through invoke_stateful on the remote)."""
    a, b = TensorType((16, 16), F32), TensorType((16, 16), F32)
    half = TensorType((16, 8), F32)
    return Kernel((("matmul", (("out_dtype", "void"),), (("in", a), ("in", b))),
                   ("split", (("axis", 1), ("indices", (8,))), (("op", 0, 0),))), (half, half))


def _free_port() -> int:
    with socket.socket() as s:
        s.bind((LOOPBACK, 0))
        return s.getsockname()[1]


@pytest.fixture(scope="module")
def worker():
    w = Worker()
    yield w
    w.close()


@pytest.fixture(scope="module")
def server():
    """A plain RPC server on 127.0.0.1."""
    with LocalServer(LOOPBACK, BASE_PORT) as s:
        yield s


@pytest.fixture(scope="module")
def tracker():
    """A tracker on 127.0.0.1 with one server registered under the key "loop"."""
    pytest.importorskip("tornado", reason="TVM's RPC tracker needs tornado")
    with LocalTracker(LOOPBACK, BASE_PORT + 200) as t:
        with LocalServer(LOOPBACK, BASE_PORT + 400, tracker=(LOOPBACK, t.port), key="loop"):
            t.wait_for("loop", 1)
            yield t


@pytest.mark.heavy
def test_loopback_server_measurement(server, worker):
    assert server.host == LOOPBACK
    m = RPCMeasurer(LOOPBACK, server.port, worker=worker)
    k = _matmul_split()
    rec = m(k, "llvm", repeats=3, timeout=120)
    assert rec.status == "ok", rec.error
    assert math.isfinite(rec.median_us) and 0 < rec.median_us < 1e5 and len(rec.samples_us) == 3
    assert rec.key == k.key() and rec.target == m.record_target(measured_target("llvm"))
    # no tag for a bare server; built without the BLAS (it runs in the process that runs the module)
    assert "taso:device" not in rec.target and "taso:blas" not in rec.target
    big = m(_matmul(128, 128, 128), "llvm", repeats=3, timeout=120)  # a BLAS-sized matmul: TVM's kernel there
    assert big.status == "ok", big.error


@pytest.mark.heavy
def test_tracker_pool_and_database(server, tracker, worker, tmp_path):
    tracked = RPCMeasurer(tracker=(LOOPBACK, tracker.port), key="loop", worker=worker)
    direct = RPCMeasurer(LOOPBACK, server.port, tag="loop", worker=worker)
    db = MeasurementDB(tmp_path)
    kernels = [_matmul(8, 8, 8), _matmul(8, 16, 8)]
    with RPCPool([tracked, direct]) as pool:
        recs = pool.measure(kernels, "llvm", db=db, repeats=2, timeout=120)
        assert [r.status for r in recs] == ["ok", "ok"], [r.error for r in recs]
        assert all('"taso:device":"loop"' in r.target for r in recs)
        assert tracked.measured + direct.measured == 2
        again = pool.measure(kernels, "llvm", db=db, repeats=2, timeout=120)  # all known: nothing measured
        assert tracked.measured + direct.measured == 2 and [r.key for r in again] == [k.key() for k in kernels]
    assert len(MeasurementDB(db.path).records()) == 2


@pytest.mark.heavy
def test_unreachable_server_records_nothing_build_errors_do(worker, tmp_path):
    port = _free_port()
    m = RPCMeasurer(LOOPBACK, port, worker=worker)
    with pytest.raises(RPCUnavailable):
        m(_matmul(4, 4, 4), "llvm", repeats=1, timeout=60)
    bad = m(_matmul(4, 4, 4, k2=5), "llvm", timeout=60)  # cannot be built: fails before connecting
    assert bad.status == "build_error" and bad.median_us is None
    cost = RPCMeasuredCost(m, "llvm", db=tmp_path)
    c = cost.kernel_cost(_matmul(4, 4, 4))
    assert math.isfinite(c) and c > 0 and cost.fallbacks == 1 and cost.measured == 0
    assert len(cost.db.records()) == 0


@pytest.mark.heavy
def test_measured_cost_through_rpc_in_optimize(server, worker, tmp_path):
    m = RPCMeasurer(LOOPBACK, server.port, worker=worker)
    cost = RPCMeasuredCost(m, "llvm", db=tmp_path, repeats=2, max_measurements=2)
    mod = examples.parallel_matmuls(seq=8, hidden=16)
    new_mod, report = tvm_taso.optimize(mod, target="llvm", cost_model=cost, time_limit=30)
    d = report["cost_model"]
    assert d["name"] == "measure" and d["measured"] == 2 and d["failed"] == 0 and d["fallback"] > 0
    assert "127.0.0.1" in d["remote"]
    assert all(r.ok for r in cost.db.records())
    assert math.isfinite(report["cost_after"])


def _two_matmuls_onnx(path) -> None:
    """x @ w1 and x @ w2 (different widths: two kernels to measure, and a merge to try)."""
    import numpy as np
    import onnx
    from onnx import TensorProto, helper

    rng = np.random.default_rng(0)
    w1 = helper.make_tensor("w1", TensorProto.FLOAT, (16, 16), rng.standard_normal(256).astype(np.float32))
    w2 = helper.make_tensor("w2", TensorProto.FLOAT, (16, 32), rng.standard_normal(512).astype(np.float32))
    graph = helper.make_graph(
        [helper.make_node("MatMul", ["x", "w1"], ["a"]), helper.make_node("MatMul", ["x", "w2"], ["b"])], "two",
        [helper.make_tensor_value_info("x", TensorProto.FLOAT, (8, 16))],
        [helper.make_tensor_value_info("a", TensorProto.FLOAT, (8, 16)),
         helper.make_tensor_value_info("b", TensorProto.FLOAT, (8, 32))], [w1, w2])
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)])
    model.ir_version = 8
    onnx.save(model, path)


@pytest.mark.heavy
def test_optimize_measures_on_a_tracker_fleet_and_a_second_run_measures_nothing(tmp_path):
    import json
    import subprocess
    import sys

    pytest.importorskip("tornado", reason="TVM's RPC tracker needs tornado")
    model = tmp_path / "two.onnx"
    _two_matmuls_onnx(model)
    env = dict(os.environ, TVM_TASO_CACHE=str(tmp_path / "cache"))
    with LocalTracker(LOOPBACK, BASE_PORT + 600) as t, \
            LocalServer(LOOPBACK, BASE_PORT + 800, tracker=(LOOPBACK, t.port), key="fleet"), \
            LocalServer(LOOPBACK, BASE_PORT + 900, tracker=(LOOPBACK, t.port), key="fleet"):
        t.wait_for("fleet", 2)

        def optimize(report):
            cmd = [sys.executable, "-m", "tvm_taso.cli", "optimize", str(model), "-o", str(tmp_path / "out.onnx"),
                   "--target", "llvm", "--cost", "rpc", "--rpc", f"{LOOPBACK}:{t.port}/fleet", "--budget", "2",
                   "--report", str(report)]
            out = subprocess.run(cmd, capture_output=True, text=True, env=env, timeout=600)
            assert out.returncode == 0, out.stderr
            return json.loads(report.read_text())["cost_model"]

        first = optimize(tmp_path / "first.json")
        assert first["measured"] >= 2 and first["failed"] == 0
        assert f"tracker={LOOPBACK}:{t.port} key=fleet" in first["remote"]
        records = MeasurementDB(tmp_path / "cache").records()
        servers = {r.measured_on for r in records}
        assert len(servers) == 2, servers  # the model's two kernels, measured on both servers at once
        assert all(r.ok and '"taso:device":"fleet"' in r.target for r in records)
        second = optimize(tmp_path / "second.json")
        assert second["measured"] == 0 and second["cached"] >= first["measured"]
        assert len(MeasurementDB(tmp_path / "cache").records()) == len(records)


def test_an_unreachable_tracker_is_one_line_before_any_search(tmp_path):
    import subprocess
    import sys

    model = tmp_path / "two.onnx"
    _two_matmuls_onnx(model)
    port = _free_port()
    out = subprocess.run([sys.executable, "-m", "tvm_taso.cli", "optimize", str(model), "-o", str(tmp_path / "o.onnx"),
                          "--cost", "rpc", "--rpc", f"{LOOPBACK}:{port}/fleet"], capture_output=True, text=True)
    assert out.returncode == 2 and "Traceback" not in out.stderr
    lines = out.stderr.strip().splitlines()
    assert len(lines) == 1 and f"cannot reach the RPC tracker at {LOOPBACK}:{port}" in lines[0]
    assert "searching" not in out.stderr and not (tmp_path / "o.onnx").exists()
