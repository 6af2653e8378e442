"""Models as PyTorch's exporters write them: shape code computed at run time (evaluated to see
the shapes, written back as it was), nodes no rewrite replaced given back byte for byte, and
reduced torchvision graphs (tests/data/make_reduced_exports.py) that used to crash the search."""

from __future__ import annotations

import collections
import warnings
from pathlib import Path

import numpy as np
import onnx
import pytest
from onnx import TensorProto, helper, numpy_helper

import tvm_taso
from tvm_taso.output_check import check_onnx, integer_ranges, random_feeds
from tvm_taso.cli.main import main as cli
from tvm_taso.io.onnx_bridge import OnnxGraph

pytest.importorskip("onnxruntime")
pytest.importorskip("onnxsim")

DATA = Path(__file__).parent / "data"
D = 32


def shape_code_projections(batch="batch") -> onnx.ModelProto:
    """Q, K and V projections (MatMul + Add) of ``h = Reshape(x, target)``, where ``target`` is
    computed at run time as PyTorch writes it (Shape -> Gather -> Div -> Mul -> Unsqueeze ->
    Concat): ONNX's data propagation stops at the Div, so without evaluating the shape code
    the projections' shapes are unknown."""
    rng = np.random.default_rng(0)
    inits = [numpy_helper.from_array(np.array(v, np.int64), name) for name, v in
             (("one", 1), ("two", 2), ("zero_axis", [0]), ("width", [D]), ("seq_axis", 1), ("batch_axis", 0))]
    nodes = [
        helper.make_node("Shape", ["x"], ["x_shape"], name="shape"),
        helper.make_node("Gather", ["x_shape", "batch_axis"], ["n"], name="gather_batch"),
        helper.make_node("Gather", ["x_shape", "seq_axis"], ["s"], name="gather_seq"),
        helper.make_node("Div", ["s", "two"], ["half"], name="div"),
        helper.make_node("Mul", ["half", "two"], ["s2"], name="mul"),
        helper.make_node("Unsqueeze", ["n", "zero_axis"], ["n1"], name="unsqueeze_batch"),
        helper.make_node("Unsqueeze", ["s2", "zero_axis"], ["s1"], name="unsqueeze_seq"),
        helper.make_node("Concat", ["n1", "s1", "width"], ["target"], name="concat", axis=0),
        helper.make_node("Reshape", ["x", "target"], ["h"], name="reshape"),
    ]
    outputs = []
    for k in "qkv":
        inits.append(numpy_helper.from_array((rng.standard_normal((D, D)) * 0.2).astype("float32"), f"w{k}"))
        inits.append(numpy_helper.from_array((rng.standard_normal(D) * 0.2).astype("float32"), f"b{k}"))
        nodes.append(helper.make_node("MatMul", ["h", f"w{k}"], [f"{k}_mm"], name=f"{k}_matmul"))
        nodes.append(helper.make_node("Add", [f"{k}_mm", f"b{k}"], [k], name=f"{k}_add"))
        outputs.append(helper.make_tensor_value_info(k, TensorProto.FLOAT, [batch, 16, D]))
    graph = helper.make_graph(nodes, "projections", [helper.make_tensor_value_info("x", TensorProto.FLOAT, [batch, 16, D])],
                              outputs, inits)
    return helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)])


def optimize(model, **kw):
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        loaded = tvm_taso.load_onnx(model, **kw)
        new, report = tvm_taso.optimize(loaded, target="cuda", cost_model="analytic")
    return loaded, new, report


def node_bytes(model: onnx.ModelProto) -> collections.Counter:
    return collections.Counter(n.SerializeToString() for n in model.graph.node)


def test_shape_code_is_evaluated_to_see_the_projections_and_written_back_as_it_was():
    model = shape_code_projections(batch=1)
    inferred = onnx.shape_inference.infer_shapes(model, data_prop=True)
    (h,) = [v for v in inferred.graph.value_info if v.name == "h"]
    assert not h.type.tensor_type.shape.dim[1].HasField("dim_value")  # ONNX alone leaves it unknown
    original, new, report = optimize(model)
    assert original.known_values["target"].tolist() == [1, 16, D]
    assert report["applied"].get("merge-matmul-bias-shared-lhs", 0) == 2
    out = new.proto
    assert sum(n.op_type == "MatMul" for n in out.graph.node) == 1
    shape_code = [n for n in model.graph.node if n.op_type not in ("MatMul", "Add")]
    kept = node_bytes(out)
    assert all(kept[n.SerializeToString()] for n in shape_code)  # Shape ... Reshape, byte for byte
    assert check_onnx(original, new)["ok"]


def test_shape_code_that_follows_a_symbolic_dimension_bakes_nothing_in():
    """With a symbolic batch the reshape's target changes with the input: it is not a known
    value, the reshape stays as it is, and the model still runs at every batch."""
    original, new, report = optimize(shape_code_projections(), shapes={"x": (2, 16, D)})
    assert "target" not in original.known_values
    assert "n" not in original.known_values and original.known_values["s2"].tolist() == 16
    out = new.proto
    assert [i.SerializeToString() for i in out.graph.input] == [i.SerializeToString() for i in original.proto.graph.input]
    result = check_onnx(original, new)
    assert result["ok"] and len(result["runs"]) == 2


def with_classifier_head(model: onnx.ModelProto) -> onnx.ModelProto:
    """``model`` with a second input through a torchvision-style head nothing rewrites: Conv,
    Relu, GlobalAveragePool, Flatten, an Identity and a Gemm."""
    rng = np.random.default_rng(1)
    out = onnx.ModelProto()
    out.CopyFrom(model)
    g = out.graph
    for name, shape in (("cw", (8, 3, 3, 3)), ("cb", (8,)), ("fw", (10, 8)), ("fb", (10,))):
        g.initializer.append(numpy_helper.from_array(rng.standard_normal(shape).astype("float32"), name))
    g.node.extend([
        helper.make_node("Conv", ["image", "cw", "cb"], ["c"], name="/features/conv", pads=[1, 1, 1, 1]),
        helper.make_node("Relu", ["c"], ["r"], name="/features/relu"),
        helper.make_node("GlobalAveragePool", ["r"], ["p"], name="/avgpool"),
        helper.make_node("Flatten", ["p"], ["f"], name="/flatten", axis=1),
        helper.make_node("Identity", ["f"], ["f2"], name="/dropout"),
        helper.make_node("Gemm", ["f2", "fw", "fb"], ["logits"], name="/fc", transB=1),
    ])
    g.input.append(helper.make_tensor_value_info("image", TensorProto.FLOAT, [1, 3, 8, 8]))
    g.output.append(helper.make_tensor_value_info("logits", TensorProto.FLOAT, [1, 10]))
    return out


def test_untouched_nodes_come_back_byte_for_byte():
    """Where only some nodes are rewritten (the projections merge), every other node (op type,
    domain, attributes, name, inputs: its whole proto) is given back as it was, in its order:
    the head's Gemm is no MatMul + Add, Flatten no Reshape, GlobalAveragePool no ReduceMean,
    and the Identity is still there."""
    model = with_classifier_head(shape_code_projections(batch=1))
    original, new, report = optimize(model)
    assert report["applied"].get("merge-matmul-bias-shared-lhs", 0) == 2
    before, after = node_bytes(model), node_bytes(new.proto)
    replaced = {onnx.NodeProto.FromString(b).name for b in before - after}
    assert replaced == {f"{k}_{op}" for k in "qkv" for op in ("matmul", "add")}
    kept = [n.SerializeToString() for n in model.graph.node if n.name not in replaced]
    assert [n.SerializeToString() for n in new.proto.graph.node if n.SerializeToString() in before] == kept
    assert check_onnx(original, new)["ok"]


def test_only_rewritten_nodes_of_a_reduced_googlenet_change():
    """The same on a torchvision export: what differs is the convolutions the merges replaced,
    their activations and concatenations, and the Identity aliases of weights no node reads
    any more; the rest keeps its proto and its order."""
    model = onnx.load(DATA / "googlenet_reduced.onnx")
    original, new, report = optimize(model)
    assert report["applied"]
    before, after = node_bytes(model), node_bytes(new.proto)
    gone = [onnx.NodeProto.FromString(b) for b in before - after]
    assert gone and {n.op_type for n in gone} <= {"Conv", "Relu", "Concat", "Identity"}
    read = {name for n in new.proto.graph.node for name in n.input}
    assert not [n for n in gone if n.op_type == "Identity" and n.output[0] in read]
    kept = [n.SerializeToString() for n in model.graph.node if n.SerializeToString() in after]
    assert [n.SerializeToString() for n in new.proto.graph.node if n.SerializeToString() in before] == kept
    assert check_onnx(original, new)["ok"]


@pytest.mark.heavy
@pytest.mark.parametrize("model", ["googlenet_reduced", "shufflenet_v2_reduced"])
@pytest.mark.parametrize("search", ["backtrack", "eqsat"])
def test_reduced_torchvision_exports_optimize_and_check(model, search):
    """The graphs that made GoogLeNet and ShuffleNet V2 exit with CycleError, at region sizes
    that used to straddle their opaque nodes: optimized, and computing what they computed."""
    loaded = tvm_taso.load_onnx(DATA / f"{model}.onnx")
    for size in (16, 64):
        with warnings.catch_warnings():
            warnings.simplefilter("ignore")
            new, report = tvm_taso.optimize(loaded, target="cuda", cost_model="analytic", search=search,
                                            region_size=size)
        assert report["regions_dropped"] == [] and not [s for s in report["skipped"] if "internal" in s["what"]]
        assert check_onnx(loaded, new)["ok"]


def test_the_cli_optimizes_a_reduced_googlenet(tmp_path):
    out, report = tmp_path / "out.onnx", tmp_path / "report.json"
    assert cli(["optimize", str(DATA / "googlenet_reduced.onnx"), "-o", str(out), "--target", "cuda", "--check",
                "--report", str(report)]) == 0
    assert onnx.load(out).graph.output[0].name == "output"


def test_kernels_are_counted_on_the_onnx_path():
    original, new, report = optimize(shape_code_projections(batch=1))
    assert report["kernels_before"] > report["kernels_after"] > 0


def test_attribute_inputs_stay_in_the_graph():
    """The shape code a Reshape reads as its target is kept alive in the engine graph (after the
    outputs), so its opaque nodes are rewired with the rest and written back."""
    model = shape_code_projections(batch=1)
    bridge = OnnxGraph(tvm_taso.load_onnx(model))
    assert bridge.attribute_inputs == ["target"]
    assert len(bridge.graph.outputs) == len(bridge.required) + 1


def test_check_feeds_a_mask_summed_into_positions_as_zeros_and_ones():
    """OPT counts positions as the running sum of its attention mask and indexes a table with
    them: a mask drawn above 1 runs past the table, and --check blamed the original. An integer
    input a CumSum sums is drawn as 0 or 1."""
    model = shape_code_projections(batch=1)
    table = numpy_helper.from_array(np.zeros((18, D), np.float32), "positions")
    model.graph.initializer.append(table)
    model.graph.input.append(helper.make_tensor_value_info("attention_mask", TensorProto.INT64, [1, 16]))
    model.graph.node.extend([
        helper.make_node("CumSum", ["attention_mask", "seq_axis"], ["counted"], name="cumsum"),
        helper.make_node("Gather", ["positions", "counted"], ["position_embeddings"], name="embed_positions"),
    ])
    model.graph.output.append(helper.make_tensor_value_info("position_embeddings", TensorProto.FLOAT, [1, 16, D]))
    loaded = tvm_taso.load_onnx(model)
    assert integer_ranges(loaded) == {"attention_mask": (0, 2)}
    feeds = random_feeds(loaded, {}, integer_ranges(loaded))
    assert set(np.unique(feeds["attention_mask"])) == {0, 1}
    assert check_onnx(loaded, loaded)["ok"]


def test_check_runs_a_model_that_branches_on_a_rank_0_bool_both_ways():
    """A rank-0 bool input (an If's condition) was fed as a numpy.bool, which onnxruntime
    refuses ("Unable to handle object of type numpy.bool"), and --check blamed the original."""
    then = helper.make_graph([helper.make_node("Relu", ["x"], ["t"])], "then", [],
                             [helper.make_tensor_value_info("t", TensorProto.FLOAT, [4])])
    other = helper.make_graph([helper.make_node("Neg", ["x"], ["e"])], "else", [],
                              [helper.make_tensor_value_info("e", TensorProto.FLOAT, [4])])
    graph = helper.make_graph(
        [helper.make_node("If", ["flag"], ["y"], then_branch=then, else_branch=other)], "branch",
        [helper.make_tensor_value_info("flag", TensorProto.BOOL, []),
         helper.make_tensor_value_info("x", TensorProto.FLOAT, [4])],
        [helper.make_tensor_value_info("y", TensorProto.FLOAT, [4])])
    loaded = tvm_taso.load_onnx(helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)]))
    result = check_onnx(loaded, loaded)
    assert result["ok"] and len(result["runs"]) == 2  # the flag one way, then the other


def test_check_says_the_largest_error_per_dtype_and_what_was_skipped():
    from tvm_taso.output_check import check_line

    result = {"max_relative_error_by_dtype": {"float32": 3e-7, "int64": 0.0}, "runtime": "onnxruntime",
              "skipped": ["{'batch': 2}: the original does not run at these sizes: bad"]}
    line = check_line(result)
    assert "3.00e-07 (float32)" in line and "0.00e+00 (int64)" in line
    assert "skipped: {'batch': 2}: the original does not run" in line and not line.endswith("(ok)")


def qdq_model() -> onnx.ModelProto:
    """A QDQ model as onnxruntime's quantizer writes one: activations and weights quantized to
    int8 and dequantized before each MatMul, two MatMuls sharing the dequantized input (which
    merge-matmul-shared-lhs would merge), and ``Add(DQ(w1), DQ(w2))`` feeding a third."""
    rng = np.random.default_rng(0)
    inits = [numpy_helper.from_array(np.array(0.05, np.float32), "s"), numpy_helper.from_array(np.array(0, np.int8), "z")]
    nodes = [helper.make_node("QuantizeLinear", ["x", "s", "z"], ["xq"], name="q_x"),
             helper.make_node("DequantizeLinear", ["xq", "s", "z"], ["xd"], name="dq_x")]
    for k in range(4):
        inits.append(numpy_helper.from_array(rng.integers(-20, 20, (D, D)).astype(np.int8), f"w{k}"))
        nodes.append(helper.make_node("DequantizeLinear", [f"w{k}", "s", "z"], [f"w{k}d"], name=f"dq_w{k}"))
    nodes += [helper.make_node("MatMul", ["xd", "w0d"], ["a"], name="matmul_a"),
              helper.make_node("MatMul", ["xd", "w1d"], ["b"], name="matmul_b"),
              helper.make_node("Add", ["w2d", "w3d"], ["w23"], name="add_weights"),
              helper.make_node("MatMul", ["xd", "w23"], ["c"], name="matmul_c")]
    outputs = [helper.make_tensor_value_info(n, TensorProto.FLOAT, [4, D]) for n in "abc"]
    graph = helper.make_graph(nodes, "qdq", [helper.make_tensor_value_info("x", TensorProto.FLOAT, [4, D])],
                              outputs, inits)
    return helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)])


def test_quantized_ops_are_not_rewritten_across_their_q_dq_pairs():
    """A MatMul that no longer reads DequantizeLinear outputs is no int8 kernel in the runtimes
    that consume QDQ models: nothing is rewritten through Q/DQ, every node is kept as it was."""
    model = qdq_model()
    original, new, report = optimize(model)
    assert report["applied"] == {}
    assert node_bytes(new.proto) == node_bytes(model)
    assert "quantized kernel" in " ".join(report["opaque_reasons"].values())


def test_a_value_an_if_branch_reads_keeps_its_name_when_its_producer_is_rewritten():
    """``a`` and ``b`` (two MatMuls of one input, which merge) are read by the branches of an If
    from the enclosing graph: the writer crashed with KeyError when ``a``'s producer was
    rewritten. The branches still read ``a`` and ``b`` by name, with the same values."""
    rng = np.random.default_rng(0)
    inits = [numpy_helper.from_array((rng.standard_normal((D, D)) * 0.2).astype("float32"), f"w{k}") for k in "ab"]
    then = helper.make_graph([helper.make_node("Relu", ["a"], ["t"])], "then", [],
                             [helper.make_tensor_value_info("t", TensorProto.FLOAT, [4, D])])
    other = helper.make_graph([helper.make_node("Neg", ["b"], ["e"])], "else", [],
                              [helper.make_tensor_value_info("e", TensorProto.FLOAT, [4, D])])
    nodes = [helper.make_node("MatMul", ["x", "wa"], ["a"], name="matmul_a"),
             helper.make_node("MatMul", ["x", "wb"], ["b"], name="matmul_b"),
             helper.make_node("If", ["flag"], ["y"], name="branch", then_branch=then, else_branch=other)]
    graph = helper.make_graph(nodes, "if", [helper.make_tensor_value_info("flag", TensorProto.BOOL, []),
                                            helper.make_tensor_value_info("x", TensorProto.FLOAT, [4, D])],
                              [helper.make_tensor_value_info("y", TensorProto.FLOAT, [4, D])], inits)
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)])
    original, new, report = optimize(model)
    assert report["applied"].get("merge-matmul-shared-lhs") == 1
    produced = {o for n in new.proto.graph.node for o in n.output}
    assert {"a", "b"} <= produced
    assert check_onnx(original, new)["ok"]


def scaled_fp16_matmul() -> onnx.ModelProto:
    """``(x · W) · 300`` in float16 with W near 300 and x small: the product is about 1441, but
    W · 300 (what fold-scalar-mul-into-matmul folds into the weight) is past float16's 65504."""
    rng = np.random.default_rng(0)
    w = (300 + rng.standard_normal((8, 8))).astype(np.float16)
    graph = helper.make_graph(
        [helper.make_node("MatMul", ["x", "w"], ["xw"], name="matmul"),
         helper.make_node("Mul", ["xw", "scale"], ["y"], name="scale")], "fp16",
        [helper.make_tensor_value_info("x", TensorProto.FLOAT16, [4, 8])],
        [helper.make_tensor_value_info("y", TensorProto.FLOAT16, [4, 8])],
        [numpy_helper.from_array(w, "w"), numpy_helper.from_array(np.array(300, np.float16), "scale")])
    return helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)])


def test_a_fold_that_overflows_half_precision_is_not_applied():
    """The optimized model returned inf where the original returned 1441: a rewrite whose folded
    weights do not fit their dtype is dropped at that site, with its rule named."""
    from tvm_taso.ir.graph import fits

    assert not fits(np.array([90000.0]), np.float16) and fits(np.array([1441.0]), np.float16)
    assert fits(np.array([1.0, 1e-9]), np.float16)  # lost to zero: less than rounding 1.0 loses
    assert not fits(np.array([1e-9, 2e-9]), np.float16)  # the whole tensor underflows
    model = scaled_fp16_matmul()
    original, new, report = optimize(model)
    assert any("float16" in d["reason"] for d in report["regions_dropped"])
    assert all(d["rules"] for d in report["regions_dropped"])
    import onnxruntime as ort

    x = np.full((4, 8), 0.002, np.float16)
    got = ort.InferenceSession(new.proto.SerializeToString(), providers=["CPUExecutionProvider"]).run(None, {"x": x})[0]
    want = ort.InferenceSession(model.SerializeToString(), providers=["CPUExecutionProvider"]).run(None, {"x": x})[0]
    assert np.isfinite(got).all() and np.allclose(got, want, rtol=1e-2)


def test_the_torch_frontends_linear_layers_merge_and_keep_their_values():
    """TVM's PyTorch frontend writes ``matmul(x, W.T, out_dtype="float32")`` where the ONNX one
    leaves the dtype out: the rules (written with the default) saw no matmul to merge, and a
    torch.export'ed BERT got no Q/K/V merge. An ``out_dtype`` that is the operands' own is the
    default now."""
    torch = pytest.importorskip("torch")
    from tvm_taso import runtime

    class Projections(torch.nn.Module):
        def __init__(self):
            super().__init__()
            self.q, self.k, self.v = (torch.nn.Linear(D, D) for _ in range(3))

        def forward(self, x):
            return self.q(x) + self.k(x) * self.v(x)

    torch.manual_seed(0)
    x = torch.randn(1, 16, D)
    mod = tvm_taso.from_torch(Projections(), (x,))
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        new, report = tvm_taso.optimize(mod, target="cuda", cost_model="analytic")
    assert report["applied"].get("merge-matmul-bias-shared-lhs") == 2
    inputs = [x.numpy()]
    np.testing.assert_allclose(runtime.run(new, inputs)[0], runtime.run(mod, inputs)[0], rtol=1e-4, atol=1e-5)


def test_from_torch_says_in_one_line_what_it_cannot_take():
    torch = pytest.importorskip("torch")

    class DataDependent(torch.nn.Module):
        def forward(self, x):
            return x[x > 0].sum() if x.sum() > 0 else x  # control flow on values: no export

    with pytest.raises(tvm_taso.InputError, match="torch.export could not export DataDependent"):
        tvm_taso.from_torch(DataDependent(), (torch.randn(4),))


def test_check_accepts_an_output_computed_more_exactly_than_the_original():
    """``y = x·A + x·B - x·(A+B)`` is zero; float32 makes it rounding noise, and the rewrite
    (x·A + x·B into x·(A+B)) makes it exactly zero: a relative error of 1 against the original,
    which --check failed. The original's own rounding noise on an output is allowed; a wrong
    model still fails."""
    rng = np.random.default_rng(0)
    a, b = (rng.standard_normal((D, D)).astype(np.float32) for _ in range(2))
    graph = helper.make_graph(
        [helper.make_node("MatMul", ["x", "a"], ["xa"]), helper.make_node("MatMul", ["x", "b"], ["xb"]),
         helper.make_node("MatMul", ["x", "ab"], ["xab"]), helper.make_node("Add", ["xa", "xb"], ["s"]),
         helper.make_node("Sub", ["s", "xab"], ["y"])], "cancel",
        [helper.make_tensor_value_info("x", TensorProto.FLOAT, [4, D])],
        [helper.make_tensor_value_info("y", TensorProto.FLOAT, [4, D])],
        [numpy_helper.from_array(a, "a"), numpy_helper.from_array(b, "b"), numpy_helper.from_array(a + b, "ab")])
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)])
    exact = onnx.ModelProto()
    exact.CopyFrom(model)
    exact.graph.node[0].input[1] = "ab"  # x·(A+B) + 0 - x·(A+B): zero as exactly as float32 gets
    exact.graph.node[1].input[1] = "zero"
    exact.graph.initializer.append(numpy_helper.from_array(np.zeros((D, D), np.float32), "zero"))
    original = tvm_taso.load_onnx(model)
    result = check_onnx(original, original.with_proto(exact))
    assert result["max_relative_error"] > 1e-4 and result["ok"], result["outputs"]
    wrong = onnx.ModelProto()
    wrong.CopyFrom(exact)
    wrong.graph.node[4].input[1] = "xb"  # x·(A+B) + 0 - 0: not zero
    assert not check_onnx(original, original.with_proto(wrong))["ok"]
