"""Measured cost: the measurement database, out-of-process measurement with fault isolation,
``cost_model="measure"`` / ``"auto"`` and ``tvm-taso cost show``."""

from __future__ import annotations

import json
import logging
import math
import os
import subprocess
import sys
import textwrap
import time

import pytest
import tvm

import tvm_taso
from tvm_taso import examples
from tvm_taso.cli.cost import add_cost_command
from tvm_taso.cost.database import MeasurementDB, Record, measured_target
from tvm_taso.cost.schedules import DEFAULT_SCHEDULE
from tvm_taso.cost.factory import make_cost_model
from tvm_taso.cost.kernel_build import kernel_module
from tvm_taso.cost.measure import MeasuredCost, measure_kernel
from tvm_taso.cost.model import Kernel
from tvm_taso.cost.worker import Worker
from tvm_taso.ir.ops import TensorType
from tvm_taso.target import canonical as canonical_target

F32 = "float32"


def _matmul_kernel(m=4, k=8, n=4, k2=None) -> Kernel:
    a, b = TensorType((m, k), F32), TensorType((k if k2 is None else k2, n), F32)
    return Kernel((("matmul", (("out_dtype", "void"),), (("in", a), ("in", b))),), (TensorType((m, n), F32),))


def _record(i: int, target: str = '{"kind":"llvm"}', status: str = "ok") -> Record:
    ok = status == "ok"
    return Record(key=f"k{i}", target=target, kernel={"ops": [], "outputs": []}, status=status,
                  median_us=float(i) if ok else None, samples_us=[float(i)] if ok else [], error="" if ok else "x")


@pytest.fixture(scope="module")
def worker():
    w = Worker()
    yield w
    w.close()


# --- injected measurement functions (run inside the worker: this module is importable there) ---

def fake_measure(request, progress):
    """Cost = number of ops; softmax fails to build, one permute_dims hangs."""
    anchors = [op[0] for op in request["kernel"]["ops"]]
    if "softmax" in anchors:
        return {"status": "build_error", "error": "injected build failure"}
    progress("built")
    if anchors == ["permute_dims"] and request["kernel"]["ops"][0][2][0][1] == [1, 8, 16]:
        time.sleep(60)  # the original graph's transpose of K hangs (only that one: each costs a restart)
    return {"status": "ok", "median_us": float(len(anchors)), "samples_us": [float(len(anchors))]}


def fake_ok(request, progress):
    n = len(request["kernel"]["ops"])
    return {"status": "ok", "median_us": 10.0 * n, "samples_us": [10.0 * n]}


def crash_while_building(request, progress):
    os.abort()


def sleep_forever(request, progress):
    time.sleep(60)


# --- the database --------------------------------------------------------------------------

def test_record_and_db_round_trip(tmp_path):
    k = _matmul_kernel()
    rec = Record(key=k.key(), target=canonical_target("llvm"), kernel=k.to_json(), status="ok",
                 median_us=3.5, samples_us=[3.0, 3.5, 4.0])
    assert Record.from_json(json.loads(json.dumps(rec.to_json()))) == rec
    db = MeasurementDB(tmp_path)  # a folder: measurements.jsonl inside
    assert db.path == tmp_path / "measurements.jsonl"
    db.add(rec)
    db.add(_record(1, status="timeout"))
    again = MeasurementDB(db.path)
    got = again.get(k.key(), rec.target)
    assert got == rec and Kernel.from_json(got.kernel) == k
    assert again.get("k1", '{"kind":"llvm"}').cost == math.inf
    assert again.get("nope", rec.target) is None
    s = again.summary()
    assert s["records"] == 2 and s["status"] == {"ok": 1, "timeout": 1} and s["file_bytes"] > 0
    assert s["median_of_medians_us"] == 3.5
    # a reader sees lines another writer appended after its first read
    db.add(_record(2))
    assert len(again.records()) == 3


def test_default_path_follows_env(tmp_path, monkeypatch):
    monkeypatch.setenv("TVM_TASO_CACHE", str(tmp_path / "cache"))
    db = MeasurementDB()
    assert db.path == tmp_path / "cache" / "measurements.jsonl" and db.path.parent.is_dir()


@pytest.mark.heavy
def test_two_processes_append_concurrently(tmp_path):
    path = tmp_path / "m.jsonl"
    script = textwrap.dedent(f"""
        import importlib.util, sys
        spec = importlib.util.spec_from_file_location("database", {str(tvm_taso.cost.database.__file__)!r})
        db_mod = importlib.util.module_from_spec(spec); sys.modules["database"] = db_mod
        spec.loader.exec_module(db_mod)
        db = db_mod.MeasurementDB({str(path)!r})
        w = sys.argv[1]
        for i in range(200):
            db.add(db_mod.Record(key=f"{{w}}-{{i}}", target="t", kernel={{"ops": [], "pad": "x" * 3000}},
                                 status="ok", median_us=float(i + 1), samples_us=[float(i + 1)] * 50))
    """)
    procs = [subprocess.Popen([sys.executable, "-c", script, w]) for w in ("a", "b")]
    assert [p.wait(timeout=60) for p in procs] == [0, 0]
    lines = path.read_bytes().split(b"\n")
    assert lines[-1] == b"" and all(json.loads(line) for line in lines[:-1])
    keys = {r.key for r in MeasurementDB(path).records()}
    assert keys == {f"{w}-{i}" for w in "ab" for i in range(200)}


def test_corrupt_and_torn_lines_are_skipped_with_one_warning(tmp_path, caplog):
    db = MeasurementDB(tmp_path / "m.jsonl")
    db.add(_record(1))
    with open(db.path, "a") as f:
        f.write("{this is not json}\n")
        f.write('{"key": "k9", "target": "t", "sta')  # a writer died mid-line
    db.add(_record(2))  # starts on a fresh line
    caplog.set_level(logging.WARNING, logger="tvm_taso.cost.database")
    reader = MeasurementDB(db.path)
    assert sorted(r.key for r in reader.records()) == ["k1", "k2"]
    reader.records()
    warnings = [r for r in caplog.records if "corrupt" in r.getMessage()]
    assert len(warnings) == 2  # one per bad line, not one per read
    assert str(db.path) in warnings[0].getMessage() and ":2:" in warnings[0].getMessage()
    assert ":3:" in warnings[1].getMessage()


# --- measuring -----------------------------------------------------------------------------

def test_kernel_module_params_are_the_inputs():
    from tvm_taso.cost.model import kernels
    from tvm_taso.ir.relax_bridge import BlockGraph
    from collections import Counter

    mod = examples.parallel_matmuls(seq=8, hidden=16)
    g = BlockGraph(mod["main"].body.blocks[0], Counter()).graph
    ks = kernels(g)
    k = next(k for k in ks if [o[0] for o in k.ops] == ["matmul", "add"])
    m = kernel_module(k)
    params = m["main"].params
    assert [tuple(int(d) for d in p.ty.shape) for p in params] == [(1, 8, 16), (16, 16), (16,)]
    assert tuple(int(d) for d in m["main"].ret_ty.shape) == (1, 8, 16)


@pytest.mark.heavy
def test_measure_in_and_out_of_process(worker):
    k = _matmul_kernel()
    inside = measure_kernel(k, "llvm", repeats=3, isolate=False)
    outside = measure_kernel(k, "llvm", repeats=3, worker=worker)
    for rec in (inside, outside):
        assert rec.status == "ok" and 0 < rec.median_us < 1e4 and len(rec.samples_us) == 3
        assert rec.key == k.key() and rec.target == measured_target("llvm")


def test_metaschedule_database_applies_tuned_schedules(tmp_path):
    """``database=`` (a MetaSchedule work dir) gives the timings of the tuned kernels."""
    from tvm import relax
    from tvm import s_tir
    from tvm.s_tir import meta_schedule as ms

    k = _matmul_kernel(m=64, k=128, n=128)
    target = tvm.target.Target({"kind": "llvm", "num-cores": 1})
    with target:
        fused = tvm.transform.Sequential([
            relax.transform.LegalizeOps(), relax.transform.AnnotateTIROpPattern(),
            relax.transform.FuseOps(), relax.transform.FuseTIR(),
        ])(kernel_module(k))
    (task,) = ms.relax_integration.extract_tasks(fused, target)
    workload_mod = task.dispatched[0]
    sch = s_tir.Schedule(workload_mod)  # a hand-written "tuned" schedule: vectorize the columns
    i, j, r = sch.get_loops(sch.get_sblock("matmul"))
    j0, j1 = sch.split(j, [None, 16])
    sch.reorder(i, j0, r, j1)
    sch.vectorize(j1)
    prim = next(iter(workload_mod.functions.values()))
    # a slow schedule as the other database's record: loops in (j, r, i) order, the innermost one
    # striding through rows (TVM's plain loops were the slow record, but built for this machine's
    # CPU LLVM vectorizes them itself, and their time came within 1.5x of the tuned one's)
    slow = s_tir.Schedule(workload_mod)
    i, j, r = slow.get_loops(slow.get_sblock("matmul"))
    slow.reorder(j, r, i)
    for folder, trace in ((tmp_path / "tuned", sch.trace), (tmp_path / "plain", slow.trace)):
        folder.mkdir()
        db = ms.database.JSONDatabase(work_dir=str(folder))
        db.commit_tuning_record(ms.database.TuningRecord(
            trace, db.commit_workload(workload_mod), [1e-5], target, ms.arg_info.ArgInfo.from_prim_func(prim)))
    llvm = {"kind": "llvm", "num-cores": 1, "libs": ["tvm"]}  # the matmul is TVM's kernel, not the BLAS's
    plain = measure_kernel(k, llvm, repeats=3, isolate=False, database=tmp_path / "plain")
    tuned = measure_kernel(k, llvm, repeats=3, isolate=False, database=tmp_path / "tuned")
    default = measure_kernel(k, llvm, repeats=3, isolate=False)
    assert plain.status == tuned.status == default.status == "ok"
    assert tuned.median_us < plain.median_us / 1.5
    assert tuned.target != plain.target and "taso:ms_database" in json.loads(tuned.target)
    assert json.loads(default.target)["taso:schedule"] == DEFAULT_SCHEDULE and "taso:ms_database" not in default.target


@pytest.mark.heavy
def test_build_error_crash_and_timeout_become_records(worker):
    bad = _matmul_kernel(k2=5)  # reduction dims disagree: the kernel cannot be built
    rec = measure_kernel(bad, "llvm", repeats=2, worker=worker)
    assert rec.status == "build_error" and rec.median_us is None and rec.cost == math.inf and rec.error
    k = _matmul_kernel()
    crashed = measure_kernel(k, "llvm", worker=worker, fn="test_measure:crash_while_building")
    assert crashed.status == "build_error" and "SIGABRT" in crashed.error
    # the worker comes back after a crash; started here, its start (TVM's import: several seconds
    # on a loaded machine) is not timed as part of the hung request below
    assert measure_kernel(k, "llvm", repeats=2, worker=worker).status == "ok"
    t0 = time.perf_counter()
    hung = measure_kernel(k, "llvm", timeout=1.0, worker=worker, fn="test_measure:sleep_forever")
    assert hung.status == "timeout" and hung.median_us is None and time.perf_counter() - t0 < 10
    # the worker comes back for the next kernel
    assert measure_kernel(k, "llvm", repeats=2, worker=worker).status == "ok"


def test_failures_cost_infinity_and_the_search_goes_on(tmp_path, worker):
    mod = examples.parallel_matmuls(seq=8, hidden=16)
    cost = MeasuredCost("llvm", db=tmp_path, timeout=1.0, worker=worker, fn="test_measure:fake_measure")
    new_mod, report = tvm_taso.optimize(mod, target="llvm", cost_model=cost, time_limit=30)
    d = report["cost_model"]
    assert d["name"] == "measure" and d["failed"] >= 2 and d["measured"] >= d["failed"]
    statuses = {r.status for r in cost.db.records()}
    assert {"ok", "build_error", "timeout"} <= statuses
    # an infinite cost is not strict JSON: the report says None and why
    assert report["cost_before"] is None and any("cost_before" in n for n in report["notes"])
    assert isinstance(new_mod, tvm.IRModule) and tvm.relax.analysis.check_well_formed(new_mod)
    # recorded failures are never retried
    again = MeasuredCost("llvm", db=tmp_path, worker=worker, fn="test_measure:fake_measure")
    tvm_taso.optimize(mod, target="llvm", cost_model=again, time_limit=30)
    assert again.measured == 0 and again.cached > 0


def test_budget_falls_back_to_scaled_analytic(tmp_path, worker):
    mod = examples.parallel_matmuls(seq=8, hidden=16)
    cost = MeasuredCost("llvm", db=tmp_path, max_measurements=3, worker=worker, fn="test_measure:fake_ok")
    tvm_taso.optimize(mod, target="llvm", cost_model=cost, time_limit=30)
    assert cost.measured == 3 and cost.fallbacks > 0
    assert cost.scale() > 0 and math.isfinite(cost.scale())


def test_acceptance_measure_each_kernel_once(tmp_path, monkeypatch):
    """On CPU (llvm), optimize(mod, target=..., cost_model="measure") on a small model measures
    each distinct kernel once (a second run performs zero new measurements) and gives the same
    result twice."""
    monkeypatch.setenv("TVM_TASO_CACHE", str(tmp_path))
    mod = examples.parallel_matmuls(seq=8, hidden=16)
    first_mod, first = tvm_taso.optimize(mod, target="llvm", cost_model="measure")
    second_mod, second = tvm_taso.optimize(mod, target="llvm", cost_model="measure")
    a, b = first["cost_model"], second["cost_model"]
    assert a["name"] == b["name"] == "measure"
    assert a["measured"] > 0 and a["failed"] == 0 and a["fallback"] == 0
    assert b["measured"] == 0 and b["cached"] == a["measured"] + a["cached"]
    assert len(MeasurementDB(tmp_path).records()) == a["measured"]
    assert first["cost_after"] == second["cost_after"] and first["applied"] == second["applied"]
    tvm.ir.assert_structural_equal(first_mod, second_mod)


# --- choosing the model, the CLI -------------------------------------------------------------

def test_make_cost_model_auto_and_measure(monkeypatch, tmp_path):
    monkeypatch.setenv("TVM_TASO_CACHE", str(tmp_path))

    assert make_cost_model("measure", "llvm").name == "measure"
    assert make_cost_model("analytic", "llvm").name == "analytic"
    assert make_cost_model("auto", "llvm").name in ("analytic", "learned")
    monkeypatch.setattr(tvm_taso.target, "device", lambda target=None: None)  # no GPU here
    assert make_cost_model("auto", "cuda").name in ("analytic", "learned")
    monkeypatch.setattr(tvm_taso.target, "device", lambda target=None: object())  # a GPU here
    assert make_cost_model("auto", "cuda").name == "measure"
    assert make_cost_model("auto", {"kind": "llvm"}).name in ("analytic", "learned")
    with pytest.raises(ValueError):
        make_cost_model("nonsense", "llvm")


def test_cost_show(tmp_path, capsys):
    import argparse

    parser = argparse.ArgumentParser(prog="tvm-taso")
    add_cost_command(parser.add_subparsers(dest="command", required=True))

    def main(argv):
        args = parser.parse_args(["cost", *argv])
        return args.func(args)

    db = MeasurementDB(tmp_path)
    for i in range(3):
        db.add(_record(i + 1))
    db.add(_record(9, status="build_error"))
    assert main(["show", "--db", str(tmp_path)]) == 0
    out = capsys.readouterr().out
    assert "4 kernels" in out and "build_error 1" in out and "ok 3" in out
    assert main(["show", "--db", str(tmp_path), "--json"]) == 0
    assert json.loads(capsys.readouterr().out)["records"] == 4


@pytest.mark.heavy
def test_worker_never_imports_from_the_working_directory(tmp_path, monkeypatch):
    """A ``statistics.py`` where the user runs tvm-taso must not replace the standard module in
    the measurement worker (it runs in a private directory, without the cwd on its path)."""
    marker = tmp_path / "imported"
    (tmp_path / "statistics.py").write_text(f"open({str(marker)!r}, 'w').close()\n")
    monkeypatch.chdir(tmp_path)
    w = Worker()
    try:
        rec = measure_kernel(_matmul_kernel(), "llvm", worker=w, fn="test_measure:fake_ok")
    finally:
        w.close()
    assert rec.status == "ok" and not marker.exists()


def test_an_unpriceable_kernel_is_never_free(tmp_path):
    class Broken(MeasuredCost):
        name = "broken"

        def kernel_cost(self, kernel):
            raise ValueError("no idea")

    cost = MeasuredCost("llvm", db=tmp_path, max_measurements=0, fallback=Broken("llvm", db=tmp_path))
    assert cost.kernel_cost(_matmul_kernel()) == math.inf and cost.fallbacks == 1


@pytest.mark.heavy
def test_two_builders_measure_the_same_kernels_as_one(tmp_path):
    from tvm_taso.ir.relax_bridge import block_graphs

    (g,) = block_graphs(examples.inception_block(size=8, channels=8))
    found = {}
    for builders in (1, 2):
        db = tmp_path / f"b{builders}"
        cost = MeasuredCost("llvm", db=db, builders=builders, repeats=2)
        try:
            total = cost.cost(g)
        finally:
            cost.measurer.close()
        records = MeasurementDB(db).records()
        found[builders] = sorted((r.key, r.status) for r in records)
        assert math.isfinite(total) and cost.measured == len(records) > 2 and cost.failed == 0
    assert found[1] == found[2]  # the same kernels, built in two processes at once, timed one at a time
    assert cost.describe()["builders"] == 2 and cost.describe()["build_seconds"] > 0


@pytest.mark.heavy
def test_cost_measure_command_with_two_builders_fills_the_database_once(tmp_path, capsys):
    """``tvm-taso cost measure --builders 2``: every kernel measured, the build phase timed; a
    second run measures nothing; ``--builders 0`` is one line."""
    import onnx
    from test_cli import inception_onnx

    from tvm_taso.cli.main import main

    model, db = tmp_path / "m.onnx", tmp_path / "db"
    onnx.save(inception_onnx(), model)
    args = ["cost", "measure", str(model), "--db", str(db), "--repeats", "2", "--json"]
    assert main([*args, "--builders", "2"]) == 0
    first = json.loads(capsys.readouterr().out)
    assert first["measured"] == first["kernels"] > 2 and first["failed"] == 0
    assert first["builders"] == 2 and first["build_seconds"] > 0
    assert main(args) == 0
    second = json.loads(capsys.readouterr().out)
    assert second["known"] == first["kernels"] and second["measured"] == 0
    assert main([*args, "--builders", "0"]) == 2
    assert "--builders 0: give at least 1" in capsys.readouterr().err
