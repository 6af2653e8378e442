"""MetaSchedule tuning: ``tvm-taso tune`` (budgets split by share of the work, a database reused),
builds that apply the database, the ``tuned`` cost model, and the untuned notice."""

from __future__ import annotations

import fcntl
import inspect
import json
import os

import numpy as np
import onnx
import pytest
from onnx import TensorProto, helper, numpy_helper
from tvm_ffi import structural_equal, structural_hash

from tvm_taso import examples
from tvm_taso import target as targets
from tvm_taso.cli.main import main
from tvm_taso.cost import tuning
from tvm_taso.cost.schedules import default_schedules
from tvm_taso.cost.database import measured_target
from tvm_taso.cost.factory import make_cost_model
from tvm_taso.cost.model import Kernel
from tvm_taso.ir.ops import TensorType


def _relu_of(path, op: str, const: np.ndarray, rows: int, width: int):
    """An ONNX model ``relu(op(x, const))`` of one (rows, width) input, saved at ``path``."""
    c = numpy_helper.from_array(const.astype(np.float32), "c")
    graph = helper.make_graph(
        [helper.make_node(op, ["x", "c"], ["m"]), helper.make_node("Relu", ["m"], ["y"])], "tiny",
        [helper.make_tensor_value_info("x", TensorProto.FLOAT, (rows, width))],
        [helper.make_tensor_value_info("y", TensorProto.FLOAT, (rows, width))], [c])
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)])
    model.ir_version = 8
    onnx.save(model, path)
    return path


def _matmul_relu(path, rows: int = 16, width: int = 64):
    return _relu_of(path, "MatMul", np.random.default_rng(0).standard_normal((width, width)), rows, width)


def _add_relu(path, rows: int, width: int):
    return _relu_of(path, "Add", np.random.default_rng(1).standard_normal((width,)), rows, width)


@pytest.fixture(scope="module")
def tuned(tmp_path_factory):
    """A one-kernel model tuned with 8 trials (MetaSchedule's builder, runner and XGBoost model),
    then tuned again into the same database: once per test run, shared by the xdist workers
    (the first to get the lock tunes, the others read its results)."""
    base = tmp_path_factory.getbasetemp()
    tmp = (base.parent if os.environ.get("PYTEST_XDIST_WORKER") else base) / "tuned"
    tmp.mkdir(exist_ok=True)
    model, db = tmp / "tiny.onnx", tmp / "db"
    with open(tmp / "lock", "w") as lock:
        fcntl.flock(lock, fcntl.LOCK_EX)
        if not (tmp / "second.json").exists():
            _matmul_relu(model)
            args = ["tune", str(model), "-o", str(db), "--trials", "8", "--min-trials", "8", "--no-taso"]
            assert main(args + ["--json", str(tmp / "first.json")]) == 0
            assert main(args + ["--json", str(tmp / "second.json")]) == 0
    first, second = (json.loads((tmp / f"{k}.json").read_text())["original"] for k in ("first", "second"))
    mine = tmp_path_factory.mktemp("mine")  # what a test writes stays its worker's own
    return {"model": model, "db": db, "first": first, "second": second, "tmp": mine}


@pytest.mark.heavy
def test_a_tiny_model_is_tuned_and_a_second_run_tunes_nothing(tuned):
    first, second = tuned["first"], tuned["second"]
    assert first["trials_run"] == 8 and first["stopped"] is None
    (task,) = first["tasks"]
    assert task["trials"] == 8 and not task["in_database"] and task["best_us"] > 0 and task["share"] == 1.0
    # the database is reused: the kernel it holds gets no trial, and its best time is read back
    assert second["trials_run"] == 0
    (again,) = second["tasks"]
    assert again["in_database"] and again["trials"] == 0 and again["best_us"] == task["best_us"]
    assert (first["trials_held"], second["trials_held"], again["recorded"]) == (0, 8, 8)
    assert (tuned["db"] / "database_workload.json").is_file() and (tuned["db"] / "database_tuning_record.json").is_file()


@pytest.mark.heavy
def test_a_build_with_the_database_runs_the_tuned_kernel(tuned, capsys):
    from tvm import relax

    from tvm_taso.cost.kernel_build import fused_module
    from tvm_taso.io.onnx_import import import_relax

    out = tuned["tmp"] / "tiny.so"
    assert main(["compile", str(tuned["model"]), "-o", str(out), "--database", str(tuned["db"])]) == 0
    assert out.stat().st_size > 0 and "untuned" not in capsys.readouterr().err
    # what the build applies: the database's schedule for the model's one kernel
    target = targets.with_cores("llvm")
    with target:
        applied = relax.transform.MetaScheduleApplyDatabase(work_dir=str(tuned["db"]))(
            fused_module(import_relax(str(tuned["model"])), target))
    kernels = [f for f in applied.functions.values() if hasattr(f, "body") and "tirx.is_scheduled" in (f.attrs or {})]
    assert len(kernels) == 1


@pytest.mark.heavy
def test_the_tuned_cost_model_prices_from_the_database_and_scales_what_it_lacks(tuned):
    from tvm_taso.cost.analytic import AnalyticCost
    from tvm_taso.cost.model import kernels
    from tvm_taso.io.onnx_bridge import OnnxGraph

    import tvm_taso

    cost = make_cost_model("tuned", "llvm", database=str(tuned["db"]))
    assert cost.name == "tuned" and cost.scale > 0
    (kernel,) = kernels(OnnxGraph(tvm_taso.load_onnx(str(tuned["model"]))).graph)
    assert cost.kernel_cost(kernel) == pytest.approx(tuned["first"]["tasks"][0]["best_us"])
    # a kernel the database does not hold: the analytic price times the database's efficiency
    (wider,) = kernels(OnnxGraph(tvm_taso.load_onnx(str(_matmul_relu(tuned["tmp"] / "wide.onnx", 32, 48)))).graph)
    assert cost.kernel_cost(wider) == pytest.approx(AnalyticCost(targets.with_cores("llvm")).kernel_cost(wider)
                                                   * cost.scale)
    assert cost.describe()["from_database"] == 1 and cost.describe()["fallback"] == 1
    # the one tuned kernel's best time against its FLOPs (the matmul's and the relu's) at the analytic peak
    peak = AnalyticCost(targets.with_cores("llvm")).roof.peak_flops
    flops = 16 * 64 * 64 * 2 + 16 * 64
    assert cost.scale == pytest.approx(tuned["first"]["tasks"][0]["best_us"] * 1e-6 / (flops / peak))


def test_the_tuned_cost_model_predicts_what_the_database_lacks_from_its_tuned_kernels(tmp_path):
    """A database of two families whose tuned times sit at different distances from their FLOPs
    at the analytic peak (matmuls 2x, adds 50x): a kernel of either family that the database
    lacks is predicted near its own family's time, where the one scale of the fallback (their
    median) would be far from both."""
    from tvm import s_tir
    from tvm.s_tir import meta_schedule as ms
    from tvm.s_tir.analysis import estimate_tir_flops

    import tvm_taso
    from tvm_taso.cost.model import kernels
    from tvm_taso.cost.tuned import MIN_WORKLOADS
    from tvm_taso.io.onnx_bridge import OnnxGraph
    from tvm_taso.io.onnx_import import import_relax

    target = targets.with_cores("llvm")
    ratio = {"matmul": 2.0, "add": 50.0}
    make = {"matmul": _matmul_relu, "add": _add_relu}
    sizes = [(8, 32), (16, 48), (32, 64), (64, 96), (16, 128)]
    tuning.tensor_intrinsics()
    (tmp_path / "db").mkdir()
    db = tuning.open_database(tmp_path / "db")
    cost = None
    for family, build in make.items():
        for rows, width in sizes:
            (task,) = tuning.tasks_of(import_relax(str(build(tmp_path / f"{family}{rows}x{width}.onnx", rows, width))),
                                      target)
            workload = task.dispatched[0]
            cost = cost or make_cost_model("analytic", target)
            seconds = ratio[family] * float(estimate_tir_flops(workload)) / cost.roof.peak_flops
            prim = next(iter(workload.functions.values()))  # an empty trace: the record's schedule is not read here
            db.commit_tuning_record(ms.database.TuningRecord(
                s_tir.Schedule(workload).trace, db.commit_workload(workload), [seconds], target,
                ms.arg_info.ArgInfo.from_prim_func(prim)))
    tuned = make_cost_model("tuned", "llvm", database=str(tmp_path / "db"))
    assert 2 * len(sizes) >= MIN_WORKLOADS and tuned.describe()["predictor_workloads"] == 2 * len(sizes)
    assert 2.0 < tuned.scale < 50.0  # the fallback's one scale: neither family's
    for family, build in make.items():
        (kernel,) = kernels(OnnxGraph(tvm_taso.load_onnx(str(build(tmp_path / f"new-{family}.onnx", 24, 80)))).graph)
        (task,) = tuning.tasks_of(import_relax(str(tmp_path / f"new-{family}.onnx")), target)
        truth = ratio[family] * float(estimate_tir_flops(task.dispatched[0])) / cost.roof.peak_flops * 1e6
        assert tuned.kernel_cost(kernel) == pytest.approx(truth, rel=0.5), family
    assert tuned.describe()["predicted"] == 2 and tuned.describe()["fallback"] == 0


@pytest.mark.heavy
def test_the_guards_time_what_the_tuned_cost_model_priced(tuned, monkeypatch):
    """With the ``tuned`` cost model, the region guard and the whole-model guard build both sides
    with its database (tuned against tuned), and keep their verdicts under a target marked with
    it; without one, under the default schedules' mark (plain-loop verdicts are not reused)."""
    import tvm_taso
    from tvm_taso import guard as guards
    from tvm_taso.cost.schedules import DEFAULT_SCHEDULE
    from tvm_taso.io.onnx_import import import_relax

    monkeypatch.setenv("TVM_TASO_CACHE", str(tuned["tmp"] / "cache"))
    db = str(tuned["db"])
    assert json.loads(guards.RegionGuard("llvm").target_key)["taso:schedule"] == DEFAULT_SCHEDULE
    assert json.loads(guards.RegionGuard("llvm", database=db).target_key)["taso:ms_database"] == os.path.abspath(db)
    from collections import OrderedDict

    from tvm_taso.cost import kernel_build, latency

    built_with = []
    real = kernel_build.build_pipeline
    monkeypatch.setattr(latency, "_BUILT", OrderedDict())  # every build of this test is made, none reused
    monkeypatch.setattr(kernel_build, "build_pipeline", lambda target, database=None: built_with.append(database)
                        or real(target, database))
    mod = import_relax(str(tuned["model"]))
    _, report = tvm_taso.optimize(mod, target="llvm", cost_model=make_cost_model("tuned", "llvm", database=db),
                                  region_guard=True)
    assert json.loads(report["region_guard"]["target"])["taso:ms_database"] == os.path.abspath(db)
    verdict = guards.guard(mod, mod, "llvm", repeats=2, database=db)
    assert verdict["measured"] and verdict["rounds"] == 2
    assert built_with and set(built_with) == {db}


def test_trials_are_split_by_share_of_the_work_largest_first():
    tasks = tuning.tasks_of(examples.parallel_matmuls(seq=16, hidden=64), "llvm")
    plan = tuning.plan(tasks, trials=48, min_trials=8)
    shares = [b.share for b in plan]
    assert shares == sorted(shares, reverse=True) and sum(shares) == pytest.approx(1.0)
    assert sum(b.trials for b in plan) == 48
    assert all(b.trials == 0 for b in plan if b.flops == 0)  # a transpose gets none
    given = [b.trials for b in plan if b.trials]
    assert plan[0].trials == round(48 * plan[0].share) and all(n >= 8 for n in given[:-1])  # the last: what is left
    small = tuning.plan(tasks, trials=8, min_trials=8)  # a budget for one task: the largest
    assert [b.trials for b in small] == [8] + [0] * (len(small) - 1)


class _HeldTrials:
    """A database as :func:`tuning.plan` reads it, holding ``held[task name]`` trials of tasks."""

    def __init__(self, tasks, held: dict):
        self._held = {structural_hash(t.dispatched[0]): n
                      for t in tasks for name, n in held.items() if t.task_name == name}

    def has_workload(self, mod):
        return structural_hash(mod) in self._held

    def commit_workload(self, mod):
        return structural_hash(mod)

    def get_top_k(self, workload, top_k):
        return [object()] * min(top_k, self._held[workload])


def test_trials_a_database_holds_count_towards_a_tasks_share():
    tasks = tuning.tasks_of(examples.parallel_matmuls(seq=16, hidden=64), "llvm")
    fresh = tuning.plan(tasks, trials=64, min_trials=8)
    largest, second, third = fresh[:3]
    assert largest.trials > 8 and second.trials == 8 and 0 < third.trials < 8
    # tuned before with the same budget: nothing to do (a rerun tunes nothing)
    again = tuning.plan(tasks, trials=64, min_trials=8,
                        database=_HeldTrials(tasks, {b.name: b.trials for b in fresh if b.trials}))
    assert all(b.trials == 0 for b in again) and sum(b.recorded for b in again) == 64
    assert [b.in_database for b in again] == [b.trials > 0 for b in fresh]
    # a larger budget tops each task up to its larger share; a task not held gets its whole share
    bigger = tuning.plan(tasks, trials=256, min_trials=8,
                         database=_HeldTrials(tasks, {largest.name: largest.trials, second.name: second.trials}))
    assert [b.name for b in bigger[:3]] == [largest.name, second.name, third.name]
    assert [b.recorded for b in bigger[:3]] == [largest.trials, 8, 0]
    shares = [max(8, round(256 * b.share)) for b in bigger[:3]]
    assert [b.trials for b in bigger[:3]] == [shares[0] - largest.trials, shares[1] - 8, shares[2]]
    assert sum(b.trials + b.recorded for b in bigger) == 256
    # a top-up under min_trials is not a round's worth
    near = tuning.plan(tasks, trials=64, min_trials=8,
                       database=_HeldTrials(tasks, {largest.name: largest.trials - 7}))
    assert near[0].trials == 0 and near[0].recorded == largest.trials - 7


@pytest.mark.heavy
def test_tasks_are_tuned_in_two_rounds_so_a_time_limit_leaves_none_untouched(tmp_path, monkeypatch):
    """Under a time limit every task gets min_trials first (largest first), then the rest of its
    trials, so a limit reached after the first round leaves every task tuned a little; without
    one, each task is tuned once, largest first."""
    from tvm.s_tir import meta_schedule as ms

    mod = examples.parallel_matmuls(seq=16, hidden=64)
    planned = [(b.name, b.trials) for b in tuning.plan(tuning.tasks_of(mod, "llvm"), 64, min_trials=8) if b.trials]
    clock = [0.0]
    steps = []

    def tune_tasks(*, tasks, max_trials_per_task, **_):
        steps.append((tasks[0].task_name, max_trials_per_task))
        clock[0] += 10.0

    monkeypatch.setattr(ms, "tune_tasks", tune_tasks)
    monkeypatch.setattr(tuning.time, "perf_counter", lambda: clock[0])
    # a handler without a name on MetaSchedule's logger (an application's) must not break tuning
    import logging

    unnamed = logging.NullHandler()
    ms_log = logging.getLogger("tvm.s_tir.meta_schedule")
    monkeypatch.setattr(ms_log, "handlers", [*ms_log.handlers, unnamed])
    report = tuning.tune(mod, "llvm", tmp_path / "db", 64, min_trials=8)
    assert steps == planned and report["trials_run"] == 64 and report["stopped"] is None
    assert unnamed in ms_log.handlers
    steps.clear()
    report = tuning.tune(mod, "llvm", tmp_path / "db1", 64, min_trials=8, time_limit=1e9)
    first = [(name, min(n, 8)) for name, n in planned]
    assert steps == first + [(name, n - 8) for name, n in planned if n > 8]
    assert report["trials_run"] == 64 and report["stopped"] is None
    steps.clear()
    cut = tuning.tune(mod, "llvm", tmp_path / "db2", 64, min_trials=8, time_limit=10.0 * len(planned) - 5)
    assert steps == first and cut["stopped"] == "time limit" and cut["trials_run"] == sum(n for _, n in first)
    # a task tuned before is topped up in one step: no first round for it
    largest = planned[0][0]
    held = next(t for t in tuning.tasks_of(mod, "llvm") if t.task_name == largest).dispatched[0]
    monkeypatch.setattr(tuning, "recorded_trials", lambda db, func: 8 if structural_equal(func, held) else 0)
    steps.clear()
    tuning.tune(mod, "llvm", tmp_path / "db3", 64, min_trials=8, time_limit=1e9)
    assert steps[0][0] != largest and (largest, planned[0][1] - 8) in steps and steps.count((largest, 8)) == 0


def test_cpu_builds_without_a_database_say_once_that_kernels_are_untuned(tmp_path, caplog):
    model = _matmul_relu(tmp_path / "tiny.onnx")
    tuning.untuned_notice.said = False
    assert main(["compile", str(model), "-o", str(tmp_path / "a.so")]) == 0
    assert main(["compile", str(model), "-o", str(tmp_path / "b.so"), "--no-taso"]) == 0
    said = [r.getMessage() for r in caplog.records if "kernels are untuned" in r.getMessage()]
    assert len(said) == 1 and f"`tvm-taso tune {model} -o DB`, then --database DB" in said[0]
    assert all(r.levelname == "WARNING" for r in caplog.records if "untuned" in r.getMessage())


def _plain_and_default_builds_agree(mod, sizes=None):
    from tvm_taso.cost.kernel_build import build_pipeline
    from tvm_taso.runtime import inputs_for, run

    inputs = inputs_for(mod, sizes=sizes, seed=0)
    plain = run(mod, inputs, "llvm", "default")
    for got, want in zip(run(mod, inputs, "llvm", build_pipeline(targets.parse("llvm"))), plain, strict=True):
        np.testing.assert_allclose(got, want, rtol=1e-4, atol=1e-4)


def test_layouts_of_constants_are_folded_before_tvm_builds_them():
    """A reshape, permute_dims, expand_dims or squeeze of a constant becomes the constant numpy
    computes (TVM's FoldConstant would build an LLVM kernel for each); the build computes what
    TVM's own pipeline computes."""
    import tvm
    from tvm import relax

    from tvm_taso.cost.kernel_build import fold_constant_layouts

    rng = np.random.default_rng(0)
    w, b = rng.standard_normal((6, 4)).astype(np.float32), rng.standard_normal((6,)).astype(np.float32)
    bb = relax.BlockBuilder()
    x = relax.Var("x", relax.TensorType((3, 4), "float32"))
    with bb.function("main", [x]):
        with bb.dataflow():
            wt = bb.emit(relax.op.permute_dims(relax.const(w), [1, 0]))
            y = bb.emit(relax.op.matmul(x, wt))
            bias = bb.emit(relax.op.expand_dims(relax.op.reshape(relax.const(b), (6,)), 0))
            z = bb.emit(relax.op.add(y, bias))
            s = bb.emit(relax.op.squeeze(relax.op.reshape(relax.const(b), (1, 6)), [0]))
            out = bb.emit_output(relax.op.add(z, s))
        bb.emit_func_output(out)
    mod = bb.get()
    given = structural_hash(mod)
    folded = fold_constant_layouts()(mod)
    assert structural_hash(mod) == given  # a new module: the one given stays as it was
    calls = []
    relax.analysis.post_order_visit(folded["main"], lambda e: calls.append(e.op.name) if isinstance(e, relax.Call)
                                    and isinstance(e.op, tvm.ir.Op) else None)
    assert sorted(calls) == ["relax.add", "relax.add", "relax.matmul"]
    constants = []
    relax.analysis.post_order_visit(folded["main"], lambda e: constants.append(e.value.numpy())
                                    if isinstance(e, tvm.ir.expr.GenericConst) else None)
    assert any(c.shape == (4, 6) and np.array_equal(c, w.T) for c in constants)
    assert any(c.shape == (1, 6) and np.array_equal(c, b[None]) for c in constants)
    _plain_and_default_builds_agree(mod)


def _default_scheduled(mod) -> dict:
    import tvm

    from tvm_taso.cost.kernel_build import fused_module

    target = targets.parse("llvm")
    with target:
        scheduled = default_schedules(target)(fused_module(mod, target))
    return {gv.name_hint: f for gv, f in scheduled.functions_items() if isinstance(f, tvm.tirx.PrimFunc)}


def test_cpu_builds_give_every_untuned_kernel_the_default_schedule():
    """Without a database, a CPU build schedules each kernel with MetaSchedule's design-space
    default (parallel, vectorized) instead of TVM's plain loops, and computes the same values.
    Pools carry a custom schedule rule TVM has no CPU version of: it is dropped, not warned
    about per kernel."""
    mod = examples.inception_block()
    kernels = _default_scheduled(mod)
    assert kernels and all(f.attrs.get("tirx.is_scheduled") for f in kernels.values()), \
        [name for name, f in kernels.items() if not f.attrs.get("tirx.is_scheduled")]
    text = "\n".join(f.script() for f in kernels.values())
    assert "T.parallel" in text and "T.vectorized" in text and "schedule_rule" not in text
    _plain_and_default_builds_agree(mod)


def _calls(func) -> list:
    import tvm
    from tvm import relax

    calls = []
    relax.analysis.post_order_visit(func, lambda e: calls.append(e) if isinstance(e, relax.Call)
                                    and isinstance(e.op, tvm.ir.Op) else None)
    return calls


def test_cpu_builds_run_convolutions_channels_last():
    """On a CPU every conv becomes NHWC with HWIO weights; the weights are permuted once, when
    building (no transpose of a constant is left to run), and the activations only where the
    convolutions meet the model's layout, each once (a build in the model's layouts has no
    transpose). The build computes what TVM's own pipeline computes. GPUs keep the model's
    layouts."""
    import tvm

    from tvm_taso.cost.kernel_build import convert_layouts, fold_constant_layouts, fused_module

    assert targets.conv_layouts("cuda") is None
    layouts = targets.conv_layouts("llvm")
    assert layouts == {"relax.nn.conv2d": ["NHWC", "HWIO"]}
    mod = examples.inception_block()
    converted = fold_constant_layouts()(convert_layouts(layouts)(mod))
    calls = _calls(converted["main"])
    convs = [c for c in calls if c.op.name == "relax.nn.conv2d"]
    assert len(convs) == len([c for c in _calls(mod["main"]) if c.op.name == "relax.nn.conv2d"]) >= 3
    assert all((c.attrs.data_layout, c.attrs.kernel_layout) == ("NHWC", "HWIO") for c in convs)
    permutes = [c for c in calls if c.op.name == "relax.permute_dims"]
    assert not any(isinstance(c.args[0], tvm.ir.expr.GenericConst) for c in permutes)
    # the input once (not once per branch), the pooled branch (its pool reads the input as
    # the model gives it) and the concat back to NCHW
    assert len(permutes) == 3, [str(c) for c in permutes]
    target = targets.parse("llvm")
    transposes = [sum("transpose" in gv.name_hint for gv, _ in fused_module(mod, target, **kw).functions_items())
                  for kw in ({}, {"model_layouts": True})]
    assert transposes[0] >= 1 and transposes[1] == 0, transposes
    _plain_and_default_builds_agree(mod)


def test_a_module_tvm_cannot_convert_keeps_its_layouts_with_a_warning(caplog):
    from tvm_taso.cost.kernel_build import convert_layouts

    mod = examples.inception_block()
    with caplog.at_level("WARNING", logger="tvm_taso.kernel_build"):
        kept = convert_layouts({"relax.nn.conv2d": ["NCHW", "NOT-A-LAYOUT"]})(mod)
    assert kept.same_as(mod) or structural_equal(kept, mod)
    assert "keep the model's layouts" in caplog.text
    # a module already holding TIR (as TVM's FuseTransposeMatmul leaves one): TVM's ConvertLayout
    # would crash the process on it, so it is not converted
    from tvm import relax, topi

    bb = relax.BlockBuilder()
    x = relax.Var("x", relax.TensorType((1, 4, 8, 8), "float32"))
    with bb.function("main", [x]):
        with bb.dataflow():
            conv = bb.emit(relax.op.nn.conv2d(x, relax.const(np.ones((4, 4, 3, 3), "float32")), padding=1))
            out = bb.emit_output(bb.emit_te(topi.nn.relu, conv))
        bb.emit_func_output(out)
    with_tir = bb.get()
    assert convert_layouts(targets.conv_layouts("llvm"))(with_tir).same_as(with_tir)


def test_a_kernel_is_priced_in_the_layouts_a_model_build_gives_it():
    """A conv kernel is built, timed and looked up in a database as the model's build runs it:
    channels last, without the transposes the conversion puts around a lone kernel (in a model
    they sit at its input and output only), so its task is the conv the model's tuning tuned. A
    transpose kernel keeps its own transpose; on a GPU a kernel is as the model wrote it. Its
    timings are keyed by the layouts."""
    from tvm_taso.cost.kernel_build import kernel_inputs, kernel_module, target_kernel_module
    from tvm_taso.cost.measure import measure_kernel
    from tvm_taso.cost.model import kernels
    from tvm_taso.ir.relax_bridge import BlockGraph

    from collections import Counter

    graph = BlockGraph(examples.conv_bn_relu(size=8, channels=8)["main"].body.blocks[0], Counter()).graph
    conv = next(k for k in kernels(graph) if k.anchor == "conv2d")
    mod = target_kernel_module(conv, targets.parse("llvm"))
    calls = _calls(mod["main"])
    assert [c.op.name for c in calls if c.op.name in ("relax.nn.conv2d", "relax.permute_dims")] == ["relax.nn.conv2d"]
    (c,) = [c for c in calls if c.op.name == "relax.nn.conv2d"]
    assert (c.attrs.data_layout, c.attrs.kernel_layout) == ("NHWC", "HWIO")
    x, w = (tuple(int(d) for d in p.ty.shape.values) for p in mod["main"].params[:2])
    assert x == (1, 8, 8, 8) and w[:2] == (3, 3), (x, w)
    assert [a.shape for a in kernel_inputs(conv, target="llvm")] == [
        tuple(int(d) for d in p.ty.shape.values) for p in mod["main"].params]
    assert [a.shape for a in kernel_inputs(conv)] == [
        tuple(int(d) for d in p.ty.shape.values) for p in kernel_module(conv)["main"].params]
    tasks = tuning.tasks_of(mod, "llvm")
    assert not any("transpose" in t.task_name for t in tasks), [t.task_name for t in tasks]
    assert structural_equal(target_kernel_module(conv, targets.parse("cuda")), kernel_module(conv))
    record = measure_kernel(conv, "llvm", repeats=2, isolate=False)
    assert record.status == "ok" and record.median_us > 0, record.error
    # timings of kernels built in the model's layouts (from before) are other facts
    assert json.loads(record.target)["taso:conv_layouts"] == targets.conv_layouts("llvm")
    assert "taso:conv_layouts" not in measured_target("cuda")
    transpose = Kernel((("permute_dims", (("axes", (0, 2, 3, 1)),), (("in", TensorType((1, 8, 4, 4), "float32")),)),),
                       (TensorType((1, 4, 4, 8), "float32"),))
    assert structural_equal(target_kernel_module(transpose, targets.parse("llvm")), kernel_module(transpose))


def test_kernels_with_symbolic_extents_stay_loops_and_build():
    """MetaSchedule's spaces tile static extents only: a decoder's kernels over a symbolic
    sequence keep TVM's loops (no space is forced on them), and the build computes the same."""
    mod = examples.llama_decoder()
    kernels = _default_scheduled(mod)
    assert kernels and not any(f.attrs.get("tirx.is_scheduled") for f in kernels.values())
    _plain_and_default_builds_agree(mod, sizes={"seq_len": 8})


@pytest.mark.heavy
def test_a_tuned_kernel_keeps_its_schedule_and_the_others_get_the_default(tuned):
    """With a database, what it tuned is applied as tuned; the default schedules only the rest."""
    import tvm
    from tvm import relax

    from tvm_taso.cost.kernel_build import fused_module
    from tvm_taso.io.onnx_import import import_relax

    target = targets.with_cores("llvm")
    with target:
        applied = relax.transform.MetaScheduleApplyDatabase(work_dir=str(tuned["db"]))(
            fused_module(import_relax(str(tuned["model"])), target))
        both = default_schedules(target)(applied)
    (name,) = [gv for gv, f in applied.functions_items() if isinstance(f, tvm.tirx.PrimFunc)]
    assert structural_equal(both[name], applied[name])


def test_a_database_is_for_the_tuned_cost_model_and_it_needs_one(tmp_path, capsys):
    with pytest.raises(ValueError, match="database"):
        make_cost_model("tuned", "llvm")
    with pytest.raises(ValueError, match="for cost model 'tuned'"):
        make_cost_model("analytic", "llvm", database=str(tmp_path))
    with pytest.raises(ValueError, match="not a MetaSchedule database"):
        make_cost_model("tuned", "llvm", database=str(tmp_path))
    model = _matmul_relu(tmp_path / "tiny.onnx")
    assert main(["compile", str(model), "-o", str(tmp_path / "a.so"), "--database", str(tmp_path)]) == 2
    assert "not a MetaSchedule database" in capsys.readouterr().err


def test_the_fast_intrinsics_import_leaves_inspect_as_it_was():
    stack, outer = inspect.stack, inspect.getouterframes
    tuning.tensor_intrinsics()
    assert inspect.stack is stack and inspect.getouterframes is outer
    import sys

    assert "tvm.s_tir.tensor_intrin" in sys.modules


@pytest.mark.heavy
def test_the_torch_backend_builds_with_a_database(tuned):
    torch = pytest.importorskip("torch")
    from tvm_taso.passes.torch_backend import TasoBackend

    with pytest.raises(ValueError, match="not a MetaSchedule database"):
        TasoBackend(database=tuned["tmp"])
    model = torch.nn.Sequential(torch.nn.Linear(64, 64, bias=False), torch.nn.ReLU()).eval()
    backend = TasoBackend(database=str(tuned["db"]), cost_model="analytic")
    compiled = torch.compile(model, backend=backend)
    x = torch.randn(16, 64)
    with torch.no_grad():
        assert torch.allclose(compiled(x), model(x), atol=1e-5)
    assert len(backend.reports) == 1 and not backend.fallbacks
