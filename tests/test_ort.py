"""Optimizing an ONNX model for onnxruntime (``target="ort"``): kernels priced by timing them in
onnxruntime, each rewritten region timed there against the original and kept only if faster,
the whole model timed last; every measurement remembered."""

import json
import subprocess
import sys

import numpy as np
import onnx
import pytest
from onnx import TensorProto, helper

import tvm_taso
from tvm_taso import target as targets
from tvm_taso.ort import pricing as ort_cost, runtime as ort
from tvm_taso.cost.analytic import AnalyticCost
from tvm_taso.cost.factory import make_cost_model
from tvm_taso.cost.model import Kernel, kernels
from tvm_taso.cli.html_report import render
from tvm_taso.guard import RegionGuard
from tvm_taso.io.onnx_bridge import OnnxGraph
from tvm_taso.search import SearchOptions

pytest.importorskip("onnxruntime")


def _matmul_chains():
    """Two independent chains of two MatMuls on runtime inputs.

    ``a``: (x @ y) @ z with x 64x4, y 4x2048, z 2048x2048: reassociated, x @ (y @ z) does a
    sixteenth of the multiplications. ``b``: (p @ q) @ r with p 64x1024, q 1024x16, r 16x1000: reassociated,
    p @ (q @ r) does forty times the work."""
    shapes = {"x": (64, 4), "y": (4, 2048), "z": (2048, 2048), "p": (64, 1024), "q": (1024, 16), "r": (16, 1000)}
    nodes = [helper.make_node("MatMul", ["x", "y"], ["xy"]), helper.make_node("MatMul", ["xy", "z"], ["a"]),
             helper.make_node("MatMul", ["p", "q"], ["pq"]), helper.make_node("MatMul", ["pq", "r"], ["b"])]
    graph = helper.make_graph(
        nodes, "chains", [helper.make_tensor_value_info(n, TensorProto.FLOAT, s) for n, s in shapes.items()],
        [helper.make_tensor_value_info("a", TensorProto.FLOAT, (64, 2048)),
         helper.make_tensor_value_info("b", TensorProto.FLOAT, (64, 1000))])
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)])
    model.ir_version = 8
    return tvm_taso.load_onnx(model, name="chains")


class Misled(AnalyticCost):
    """The analytic model, except that it takes p @ q (a 64x16 result) for very slow: a cost
    model wrong about one region, as any estimate can be."""

    def kernel_cost(self, kernel: Kernel) -> float:
        if any(tuple(t.shape) == (64, 16) for t in kernel.outputs):
            return 1e9
        return super().kernel_cost(kernel)


def test_a_region_that_pays_in_onnxruntime_is_kept_and_one_that_does_not_is_dropped(tmp_path):
    model = _matmul_chains()
    options = SearchOptions(region_size=2, time_limit=60)
    db = tmp_path / "regions.jsonl"
    guard = RegionGuard("ort", db=db, opset=model.opset)
    new, report = tvm_taso.optimize(model, target="ort", cost_model=Misled("llvm"), options=options,
                                    region_guard=guard, guard=False)
    decisions = {d["region"]: d for d in report["region_guard"]["decisions"]}
    assert len(decisions) == 2, decisions
    first, second = (decisions[k] for k in sorted(decisions))
    # x @ (y @ z) measured faster: kept
    assert first["kept"] and first["ratio_low"] > 1.0 and "matmul-assoc-right" in first["rules"]
    # p @ (q @ r), which only the misled model liked, measured slower: dropped
    assert not second["kept"] and second["ratio"] < 1.0
    assert report["applied"] == {"matmul-assoc-right": 1}
    page = render(report)  # --html lists each region's verdict
    assert "Regions timed (ort:cpu)" in page
    assert page.count("kept (faster in at least 3 rounds of 4") == 1
    assert page.count("dropped (not measurably faster") == 1
    # the model written computes what the original computes
    proto = new.proto
    ops = [n.op_type for n in proto.graph.node]
    assert ops.count("MatMul") == 4
    session = ort.OrtRuntime("cpu")
    feeds = ort_cost.feeds_for(model.proto)
    want = session.session(model.proto).run(None, feeds)
    got = session.session(proto).run(None, feeds)
    for w, g in zip(want, got):
        np.testing.assert_allclose(g, w, rtol=1e-3, atol=1e-3 * np.abs(w).max())

    # a second run measures nothing: both verdicts come from the database
    again = RegionGuard("ort", db=db, opset=model.opset)
    _, report2 = tvm_taso.optimize(model, target="ort", cost_model=Misled("llvm"), options=options,
                                   region_guard=again, guard=False)
    assert report2["region_guard"]["from_database"] == 2 and again.seconds == 0.0
    assert [d["kept"] for d in report2["region_guard"]["decisions"]] == [True, False]


def test_the_ort_cost_model_times_kernels_once_and_the_database_serves_the_second_run(tmp_path, monkeypatch):
    monkeypatch.setenv("TVM_TASO_CACHE", str(tmp_path))
    model = _matmul_chains()
    _, report = tvm_taso.optimize(model, target="ort", time_limit=60, guard=False)
    cost = report["cost_model"]
    assert cost["name"] == "ort" and cost["runtime"] == "ort:cpu"
    assert cost["measured"] > 0 and cost["failed"] == 0
    assert json.loads(cost["target"])["provider"] == "CPUExecutionProvider"
    assert report["region_guard"]["runtime"] == "ort:cpu"
    _, again = tvm_taso.optimize(model, target="ort", time_limit=60, guard=False)
    assert again["cost_model"]["measured"] == 0 and again["cost_model"]["cached"] > 0
    assert again["region_guard"]["from_database"] == again["region_guard"]["regions"]
    assert again["cost_after"] == report["cost_after"]


def test_a_kernel_as_an_onnx_model_has_its_weights_as_initializers():
    model = tvm_taso.load_onnx(_conv_model(), name="conv")
    graph = OnnxGraph(model).graph
    (kernel,) = [k for k in kernels(graph) if k.anchor == "conv2d"]
    proto = ort_cost.kernel_model(kernel)
    assert [i.name for i in proto.graph.input] == ["p0"]  # the data; the kernel and bias are weights
    assert len(proto.graph.initializer) == 2
    session = ort.OrtSession(ort.OrtRuntime(), proto, ort_cost.feeds_for(proto))
    (out,) = session.run()
    assert out.shape == (1, 8, 16, 16)


def test_a_region_is_written_by_the_onnx_paths_own_emitters():
    """A region is timed as the ONNX path would write it (its emitters, not Relax's exporter):
    the user's ops, the weights as initializers, the values the original computes."""
    model = tvm_taso.load_onnx(_conv_model(), name="conv")
    graph = OnnxGraph(model).graph
    proto = ort_cost.region_model(graph, opset=13)
    assert [n.op_type for n in proto.graph.node] == ["Conv", "Add", "Relu"]  # the engine reads the bias as an add
    assert proto.opset_import[0].version == 13
    assert [i.name for i in proto.graph.input] == ["p0"] and len(proto.graph.initializer) == 2
    feeds = ort_cost.feeds_for(model.proto)
    (want,) = ort.REFERENCE.session(model.proto).run(None, feeds)
    (got,) = ort.REFERENCE.session(proto).run(None, {"p0": feeds["x"]})
    np.testing.assert_allclose(got, want, rtol=1e-5, atol=1e-5)
    session = ort_cost.region_session(ort.OrtRuntime(), graph)  # what the region guard times
    assert session.run()[0].shape == (1, 8, 16, 16)


def test_session_configuration_entries_are_session_options():
    t = targets.resolve("ort:cpu,session.intra_op.allow_spinning=0,intra_op_num_threads=1")
    assert t.runtime.session_options == {"session.intra_op.allow_spinning": 0, "intra_op_num_threads": 1}
    assert t.runtime.provider_options == {}
    t.runtime.check()
    session = t.runtime.session(_conv_model())
    assert session.get_session_options().get_session_config_entry("session.intra_op.allow_spinning") == "0"


def _conv_model():
    rng = np.random.default_rng(0)
    w = helper.make_tensor("w", TensorProto.FLOAT, (8, 4, 3, 3), rng.standard_normal(288).astype(np.float32))
    b = helper.make_tensor("b", TensorProto.FLOAT, (8,), rng.standard_normal(8).astype(np.float32))
    graph = helper.make_graph(
        [helper.make_node("Conv", ["x", "w", "b"], ["c"], pads=[1, 1, 1, 1]), helper.make_node("Relu", ["c"], ["y"])],
        "conv", [helper.make_tensor_value_info("x", TensorProto.FLOAT, (1, 4, 16, 16))],
        [helper.make_tensor_value_info("y", TensorProto.FLOAT, (1, 8, 16, 16))], [w, b])
    proto = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)])
    proto.ir_version = 8
    return proto


def test_ort_targets_parse_with_session_and_provider_options():
    t = targets.resolve("ort:cpu,intra_op_num_threads=1,graph_optimization_level=all")
    assert t.runtime.provider == "CPUExecutionProvider" and t.kind == "llvm"
    assert t.runtime.session_options == {"intra_op_num_threads": 1, "graph_optimization_level": "all"}
    assert targets.resolve("ort:tensorrt,trt_fp16_enable=1").runtime.provider_options == {"trt_fp16_enable": 1}
    assert targets.resolve("ort:cuda").kind == "cuda"  # the analytic model that stands in is cuda's
    assert targets.resolve("llvm").runtime is None
    t.runtime.check()
    key = json.loads(t.runtime.key)
    assert key["session_options"]["intra_op_num_threads"] == 1 and key["runtime"] == "onnxruntime"


def test_a_provider_that_is_not_here_is_one_line_listing_what_is(tmp_path):
    import onnxruntime

    if "CUDAExecutionProvider" in onnxruntime.get_available_providers():
        pytest.skip("this onnxruntime has the CUDA provider")
    with pytest.raises(targets.TargetError, match="no CUDAExecutionProvider here; available: .*CPUExecutionProvider"):
        tvm_taso.optimize(_matmul_chains(), target="ort:cuda")
    path = tmp_path / "m.onnx"
    onnx.save(_conv_model(), path)
    out = subprocess.run([sys.executable, "-m", "tvm_taso.cli", "optimize", str(path), "--target", "ort:cuda", "-o",
                          str(tmp_path / "o.onnx")], capture_output=True, text=True)
    assert out.returncode == 2
    assert out.stderr.strip().splitlines() == [out.stderr.strip().splitlines()[-1]]
    assert "available: " in out.stderr and "Traceback" not in out.stderr
    assert not (tmp_path / "o.onnx").exists()


def test_ort_is_for_onnx_models_and_refuses_tvm_cost_models():
    from tvm_taso import examples

    with pytest.raises(targets.TargetError, match="times ONNX models in onnxruntime"):
        tvm_taso.optimize(examples.inception_block(size=8, channels=8), target="ort")
    with pytest.raises(ValueError, match="prices TVM's kernels"):
        make_cost_model("measure", "ort")
    with pytest.raises(ValueError, match="give an ort target"):
        make_cost_model("ort", "llvm")
    assert make_cost_model("analytic", "ort").name == "analytic"


@pytest.mark.heavy
def test_bench_runtime_times_both_models_in_onnxruntime(tmp_path):
    path = tmp_path / "m.onnx"
    onnx.save(_matmul_chains().proto, path)
    out = subprocess.run([sys.executable, "-m", "tvm_taso.cli", "bench", str(path), "--runtime", "ort", "--repeat", "3",
                          "--time-limit", "30", "--json", str(tmp_path / "b.json")],
                         capture_output=True, text=True, env={**__import__("os").environ,
                                                              "TVM_TASO_CACHE": str(tmp_path / "cache")})
    assert out.returncode == 0, out.stderr
    assert "speedup (original / optimized)" in out.stdout and "regions timed" in out.stdout
    result = json.loads((tmp_path / "b.json").read_text())
    assert result["runtime"] == "ort:cpu" and result["rounds"] == 3
    samples = result["samples_ms"]
    assert len(samples["original"]) == len(samples["optimized"]) == 3
    ratios = sorted(a / b for a, b in zip(samples["original"], samples["optimized"]))
    assert result["speedup"] == pytest.approx(ratios[1])
    # a rewritten model was timed whole in onnxruntime too, which had the last word
    guard = result["report"].get("guard")
    if guard is not None:
        assert guard["measured"] and guard["runtime"] == "ort:cpu"
        assert "whole-model guard" in render(result["report"]) and "measured in ort:cpu" in render(result["report"])
    assert bool(result["report"]["applied"]) == bool(guard and guard["kept"])


def test_commands_that_build_with_tvm_refuse_an_onnxruntime_target(tmp_path):
    path = tmp_path / "m.onnx"
    onnx.save(_conv_model(), path)
    out = subprocess.run([sys.executable, "-m", "tvm_taso.cli", "compile", str(path), "--target", "ort", "-o",
                          str(tmp_path / "m.so")], capture_output=True, text=True)
    assert out.returncode == 2 and "Traceback" not in out.stderr
    assert "this command builds with TVM" in out.stderr and not (tmp_path / "m.so").exists()
