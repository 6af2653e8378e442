"""The ONNX workflow keeps the user's model: load_onnx -> optimize -> export_onnx rewrites only
what the search rewrote, keeps the interface (names, types, symbolic dims) and opaque nodes
verbatim, keeps dynamic models dynamic, and ``--check`` compares by name and cannot be fooled."""

import logging
import math
import sys
import warnings
from pathlib import Path

import numpy as np
import onnx
import pytest
from onnx import TensorProto, helper, numpy_helper

import tvm_taso
from tvm_taso import output_check as checking
from tvm_taso.io import onnx_model
from tvm_taso.io.onnx_bridge import OnnxGraph, RewriteRejected
from tvm_taso.ir.graph import Node
from tvm_taso.numerics import array_relative_error, relative_error, tolerance

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))  # benchmarks/ is not installed
ort = pytest.importorskip("onnxruntime")

D, HEADS = 32, 4


def attention(batch="batch", seq="seq", extra=(), prefix="") -> onnx.ModelProto:
    """A BERT-like attention block: LayerNorm, Q/K/V projections (MatMul + Add), heads by
    Reshape with 0 (copy) dims, softmax attention, output projection, residual."""
    rng = np.random.default_rng(0)
    inits, nodes = [], []

    def w(name, *shape):
        inits.append(numpy_helper.from_array((rng.standard_normal(shape) * 0.2).astype("float32"), prefix + name))
        return prefix + name

    def n(op, ins, outs, **attrs):
        nodes.append(helper.make_node(op, ins, outs, name=f"{prefix}{op}_{len(nodes)}", **attrs))
        return outs[0]

    inits.append(numpy_helper.from_array(np.array([0, 0, HEADS, D // HEADS], np.int64), "heads_shape"))
    inits.append(numpy_helper.from_array(np.array([0, 0, D], np.int64), "merge_shape"))
    h = n("LayerNormalization", ["x", w("g", D), w("b", D)], ["h"], axis=-1)
    proj = {}
    for k in "qkv":
        mm = n("MatMul", [h, w(f"w{k}", D, D)], [f"{k}_mm"])
        added = n("Add", [mm, w(f"b{k}", D)], [f"{k}_lin"])
        heads = n("Reshape", [added, "heads_shape"], [f"{k}_heads"])
        proj[k] = n("Transpose", [heads], [f"{k}_t"], perm=[0, 2, 1, 3] if k != "k" else [0, 2, 3, 1])
    scores = n("MatMul", [proj["q"], proj["k"]], ["scores"])
    scaled = n("Mul", [scores, w("scale", 1)], ["scaled"])
    probs = n("Softmax", [scaled], ["probs"], axis=-1)
    ctx = n("MatMul", [probs, proj["v"]], ["ctx"])
    merged = n("Reshape", [n("Transpose", [ctx], ["ctx_t"], perm=[0, 2, 1, 3]), "merge_shape"], ["ctx_m"])
    out = n("Add", [n("MatMul", [merged, w("wo", D, D)], ["o_mm"]), "x"], ["y"])
    outputs = [helper.make_tensor_value_info("y", TensorProto.FLOAT, [batch, seq, D])]
    for op, ins, outs, attrs in extra:
        n(op, ins, outs, **attrs)
    graph = helper.make_graph(nodes, "attention", [helper.make_tensor_value_info("x", TensorProto.FLOAT, [batch, seq, D])],
                              outputs, inits, doc_string="a block")
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)], producer_name="tests")
    model.metadata_props.add(key="owner", value="me")
    assert out == "y"
    return model


def optimize(model, **kw):
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        return tvm_taso.optimize(tvm_taso.load_onnx(model, **kw), target="cuda", cost_model="analytic")


def run(model, feeds):
    sess = ort.InferenceSession(model.SerializeToString(), providers=["CPUExecutionProvider"])
    return dict(zip([o.name for o in sess.get_outputs()], sess.run(None, feeds)))


def interface(model):
    return [v.SerializeToString() for v in list(model.graph.input) + list(model.graph.output)]


def test_qkv_merge_keeps_interface_and_stays_dynamic():
    model = attention()
    new, report = optimize(model, shapes={"x": (1, 64, D)})
    out = new.proto
    onnx.checker.check_model(out, full_check=True)
    assert report["applied"].get("merge-matmul-bias-shared-lhs", 0) >= 1
    assert sum(n.op_type == "MatMul" for n in out.graph.node) == sum(n.op_type == "MatMul" for n in model.graph.node) - 2
    assert interface(out) == interface(model)  # names, element types, symbolic dims
    assert out.graph.input[0].type.tensor_type.shape.dim[0].dim_param == "batch"
    assert out.metadata_props == model.metadata_props and out.producer_name == "tests"
    assert out.graph.doc_string == "a block" and out.opset_import == model.opset_import
    for shape in [(1, 64, D), (3, 5, D)]:  # another batch and sequence than priced
        x = np.random.default_rng(1).standard_normal(shape).astype("float32")
        a, b = run(model, {"x": x}), run(out, {"x": x})
        assert array_relative_error(a["y"], b["y"]) <= 1e-5
    names = [o for node in out.graph.node for o in node.output] + [i.name for i in out.graph.initializer]
    assert len(names) == len(set(names))  # new names never collide


def test_untouched_nodes_and_initializers_are_verbatim():
    model = attention()
    new, _ = optimize(model, shapes={"x": (1, 64, D)})
    def without_inputs(node):
        node = onnx.NodeProto.FromString(node.SerializeToString())
        del node.input[:]
        return node.SerializeToString()

    before = {n.name: n for n in model.graph.node}
    after = {n.name: n for n in new.proto.graph.node}
    assert len(set(before) - set(after)) >= 4  # the Q/K/V MatMul and Add nodes went
    for name in set(before) & set(after):  # every other node as it was; only a changed operand renamed
        assert without_inputs(after[name]) == without_inputs(before[name])
        readers_of_merged = before[name].input[0] in ("q_lin", "k_lin", "v_lin")
        assert readers_of_merged or list(after[name].input) == list(before[name].input), name
    inits = {i.name: i.SerializeToString() for i in model.graph.initializer}
    for i in new.proto.graph.initializer:
        assert i.name.startswith("taso_") or inits[i.name] == i.SerializeToString()


def test_round_trip_without_rewrite_is_byte_identical():
    model = attention()
    bridge = OnnxGraph(tvm_taso.load_onnx(model, shapes={"x": (1, 8, D)}))
    assert bridge.write(bridge.graph).SerializeToString() == model.SerializeToString()
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        new, report = tvm_taso.optimize(tvm_taso.load_onnx(model), target="cuda", rules=[])
    assert report["applied"] == {} and new.proto.SerializeToString() == model.SerializeToString()


def test_opaque_nodes_verbatim_and_named_once_in_skipped():
    extra = [("Gelu", ["y"], ["z0"], {"domain": "com.example", "flavour": "odd"}),
             ("Shape", ["y"], ["s"], {}), ("Shape", ["x"], ["s2"], {})]
    model = attention(extra=extra)
    model.graph.output.append(helper.make_tensor_value_info("z0", TensorProto.FLOAT, ["batch", "seq", D]))
    model.opset_import.append(helper.make_opsetid("com.example", 1))
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        new, report = tvm_taso.optimize(tvm_taso.load_onnx(model, shapes={"x": (1, 64, D)}), target="cuda")
    whats = [s["what"] for s in report["skipped"]]
    assert "ONNX op com.example.Gelu" in whats and whats.count("ONNX op Shape") == 1
    assert {s["what"]: s["count"] for s in report["skipped"]}["ONNX op Shape"] == 2
    originals = {n.name: n.SerializeToString() for n in model.graph.node if n.op_type in ("Gelu", "Shape")}
    kept = {n.name: n.SerializeToString() for n in new.proto.graph.node if n.name in originals}
    assert kept == originals
    assert [o.name for o in new.proto.graph.output] == ["y", "z0"]  # dead ends kept too


def _split_and_join_input(bridge):
    """The bridge's graph with every use of ``x`` reading concat(split(x, axis 0)), the split's
    index and types those of the priced sizes (as an engine without symbolic sizes made it)."""
    from tvm_taso.ir import ops

    g = bridge.graph.copy()
    x = bridge.refs["x"]
    priced = g.type_of(x).at(bridge.sizes.a)
    split = {"indices": (priced.shape[0] // 2,), "axis": 0}
    halves = g.add_typed("split", (x,), tuple(sorted(split.items())), tuple(ops.infer("split", [priced], split)))
    joined = (g.add_typed("concat", ((halves, 0), (halves, 1)), (("axis", 0),), (g.type_of(x),)), 0)
    g.replace_uses({x: joined})
    split = g.nodes[halves]
    g.nodes[halves] = Node(split.op, (x,), split.attrs, split.types, split.payload)  # the split still reads x
    g._derived = {}
    return g


def test_rewrite_fixing_a_symbolic_size_is_rejected():
    """A split along the symbolic batch axis at the priced size would bake that size into the
    graph: the engine does not make one (the split point against ``batch`` is undecided), and
    one made anyway is rejected when written (inferred again at twice the priced sizes)."""
    from tvm_taso.ir.dims import Undecidable

    bridge = OnnxGraph(tvm_taso.load_onnx(attention(), shapes={"x": (2, 8, D)}))
    with pytest.raises(Undecidable, match="batch"):
        bridge.graph.copy().add("split", [bridge.refs["x"]], {"indices": (1,), "axis": 0})
    with pytest.raises(RewriteRejected, match="symbolic"):
        bridge.write(_split_and_join_input(bridge))
    static = OnnxGraph(tvm_taso.load_onnx(attention(batch=2, seq=8)))  # on a static model the split is fine
    written = static.write(_split_and_join_input(static))
    onnx.checker.check_model(written, full_check=True)
    assert [n.op_type for n in written.graph.node].count("Split") == 1


def test_default_sizes_are_said_once(caplog):
    with caplog.at_level(logging.WARNING, logger="tvm_taso.io"):
        model = tvm_taso.load_onnx(attention())
    assert model.dims == {"batch": 1, "seq": 128}
    assert len([r for r in caplog.records if "priced at batch=1, seq=128" in r.message]) == 1


def test_large_model_saved_with_external_data(tmp_path, monkeypatch):
    monkeypatch.setattr(onnx_model, "LARGE_MODEL_BYTES", 1000)
    model = tvm_taso.load_onnx(attention())
    path = tmp_path / "m.onnx"
    tvm_taso.export_onnx(model, path)
    assert (tmp_path / "m.onnx.data").exists()
    loaded = onnx.load(path)
    assert loaded.graph.node == attention().graph.node
    for a, b in zip(loaded.graph.initializer, attention().graph.initializer):
        assert a.name == b.name and np.array_equal(numpy_helper.to_array(a), numpy_helper.to_array(b))


# -- --check ------------------------------------------------------------------------------------


def test_check_catches_a_wrong_model_and_compares_by_name():
    model = attention(batch=1, seq=8)
    good = tvm_taso.load_onnx(model)
    assert checking.check_onnx(good, good)["ok"]
    wrong = onnx.ModelProto.FromString(model.SerializeToString())
    wo = next(i for i in wrong.graph.initializer if i.name == "wo")
    wo.CopyFrom(numpy_helper.from_array(numpy_helper.to_array(wo) * 1.001, "wo"))
    result = checking.check_onnx(good, good.with_proto(wrong))
    assert not result["ok"] and result["worst_output"] == "y" and result["max_relative_error"] > 1e-4


def _two_outputs(swap_inputs=False, swap_outputs=False, swap_values=False):
    x = helper.make_tensor_value_info("x", TensorProto.FLOAT, [2, 3])
    y = helper.make_tensor_value_info("y", TensorProto.FLOAT, [2, 3])
    a = helper.make_tensor_value_info("a", TensorProto.FLOAT, [2, 3])
    b = helper.make_tensor_value_info("b", TensorProto.FLOAT, [2, 3])
    nodes = [helper.make_node("Sub", ["x", "y"], ["b" if swap_values else "a"]),
             helper.make_node("Relu", ["x"], ["a" if swap_values else "b"])]
    inputs, outputs = [y, x] if swap_inputs else [x, y], [b, a] if swap_outputs else [a, b]
    graph = helper.make_graph(nodes, "two", inputs, outputs)
    return tvm_taso.load_onnx(helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)]))


def test_check_feeds_inputs_and_reads_outputs_by_name():
    original = _two_outputs()
    assert checking.check_onnx(original, _two_outputs(swap_inputs=True, swap_outputs=True))["ok"]
    assert not checking.check_onnx(original, _two_outputs(swap_values=True))["ok"]


def test_check_runs_dynamic_models_at_two_sizes():
    model = tvm_taso.load_onnx(attention(), shapes={"x": (2, 6, D)})
    runs = checking.check_onnx(model, model)["runs"]
    assert [r["inputs"]["x"] for r in runs] == [[2, 6, D], [1, 3, D]]


def test_integer_inputs_below_the_table_they_index():
    table = numpy_helper.from_array(np.zeros((7, 4), np.float32), "table")
    nodes = [helper.make_node("Cast", ["ids"], ["ids64"], to=TensorProto.INT64),
             helper.make_node("Gather", ["table", "ids64"], ["emb"]),
             helper.make_node("Identity", ["mask"], ["m"])]
    graph = helper.make_graph(nodes, "g", [helper.make_tensor_value_info("ids", TensorProto.INT32, [64]),
                                           helper.make_tensor_value_info("mask", TensorProto.INT64, [64])],
                              [helper.make_tensor_value_info("emb", TensorProto.FLOAT, [64, 4]),
                               helper.make_tensor_value_info("m", TensorProto.INT64, [64])], [table])
    model = tvm_taso.load_onnx(helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)]))
    ranges = checking.integer_ranges(model)
    assert ranges == {"ids": (0, 7)}
    feeds = checking.random_feeds(model, model.dims, ranges)
    assert feeds["ids"].min() >= 0 and feeds["ids"].max() == 6 and feeds["ids"].dtype == np.int32
    assert feeds["mask"].max() > 1  # never only 0 and 1
    assert checking.check_onnx(model, model)["ok"]


def test_relative_error_is_nan_and_inf_aware():
    a = np.array([1.0, np.nan, np.inf, -np.inf, 2.0])
    assert array_relative_error(a, a.copy()) == 0.0
    assert array_relative_error(a, np.array([1.0, 1.0, np.inf, -np.inf, 2.0])) == math.inf  # NaN lost
    assert array_relative_error(a, np.array([1.0, np.nan, -np.inf, -np.inf, 2.0])) == math.inf  # +inf vs -inf
    assert array_relative_error(np.zeros(3), np.full(3, 1e-9)) == pytest.approx(1e-3)  # all-zero reference
    assert relative_error([np.array([1.0]), a], [np.array([1.0]), np.full(5, np.nan)]) == math.inf
    assert not math.isnan(max(0.0, array_relative_error([np.nan], [np.nan])))
    assert tolerance(np.float16) == 1e-2 and tolerance("bfloat16") == 2e-2 and tolerance(np.int64) == 0.0


def test_check_original_rejected_by_onnxruntime_is_its_own_message():
    node = helper.make_node("Fancy", ["x"], ["y"], domain="com.example")
    graph = helper.make_graph([node], "g", [helper.make_tensor_value_info("x", TensorProto.FLOAT, [2])],
                              [helper.make_tensor_value_info("y", TensorProto.FLOAT, [2])])
    proto = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17), helper.make_opsetid("com.example", 1)])
    model = tvm_taso.load_onnx(proto)
    with pytest.raises(tvm_taso.InputError, match="onnxruntime cannot load the original model"):
        checking.check_onnx(model, model)


# -- models exported by PyTorch (only where torch and transformers are installed) ---------------


@pytest.mark.parametrize("axes", ["static", "dynamic"])
def test_pytorch_bert_classic_export(tmp_path, axes):
    pytest.importorskip("torch")
    pytest.importorskip("transformers")
    from benchmarks.onnx_models import run as run_model

    row = run_model("bert", "classic", axes, "cuda", tmp_path)
    assert row["ok"], row.get("failed")
    assert row["applied"].get("merge-matmul-bias-shared-lhs", 0) >= 1
