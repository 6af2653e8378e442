"""The cost model prices the kernels TVM really builds: its partition of a graph
(:mod:`tvm_taso.cost.fusion`) launches exactly as many kernels as TVM's own passes (LegalizeOps,
AnnotateTIROpPattern, FoldConstant, FuseOps, FuseTIR, RewriteDataflowReshape) leave, on the
benchmark models and on models shaped like PyTorch exports, before and after optimization, for
cuda and llvm."""

import sys
from collections import Counter
from pathlib import Path

import numpy as np
import pytest
from onnx import TensorProto, helper, numpy_helper
from tvm import relax

import tvm_taso
from tvm_taso import examples
from tvm_taso.cost.kernel_build import tvm_kernel_count
from tvm_taso.io.onnx_import import import_relax
from tvm_taso.cost.model import groups, kernel_count, kernels
from tvm_taso.ir.relax_bridge import BlockGraph

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))  # benchmarks/ is not installed
from benchmarks import models  # noqa: E402

TARGETS = ("llvm", "cuda")


def as_graphs(mod):
    """``mod`` with every dataflow block written back from its graph (what the cost model sees:
    the graph shares identical expressions, TVM's default pipeline does not), and the graphs."""
    graphs, new = [], mod.clone()
    for gvar, func in mod.functions.items():
        if not isinstance(func, relax.Function):
            continue
        blocks = []
        for block in func.body.blocks:
            if isinstance(block, relax.DataflowBlock):
                bg = BlockGraph(block, Counter())
                graphs.append(bg.graph)
                block = bg.to_block(bg.graph)
            blocks.append(block)
        body = relax.BlockBuilder().normalize(relax.SeqExpr(blocks, func.body.body))
        new.update_func(gvar, relax.Function(func.params, body, func.ret_ty, func.is_pure, func.attrs, func.span))
    return new, graphs


def assert_counts_agree(mod, target, what, launched=None):
    """The partition of ``mod``'s graphs launches as many kernels as TVM builds from them;
    returns TVM's count for ``mod`` itself (``launched``, when already known)."""
    built, graphs = as_graphs(mod)
    ours = sum(kernel_count(g) for g in graphs)
    assert ours == tvm_kernel_count(built, target), what
    launched = tvm_kernel_count(mod, target) if launched is None else launched
    assert launched >= ours, what  # sharing identical expressions only removes kernels
    return launched


# -- the partition on small graphs -------------------------------------------------------------


def test_batch_norm_fuses_with_what_follows_not_with_its_conv():
    g = examples_graph(examples.conv_bn_relu(size=8, channels=8))
    parts = [tuple(g.nodes[n].op for n in grp.members) for grp in groups(g) if grp.launches]
    assert ("conv2d",) in parts and ("batch_norm", "relu") in parts
    assert kernel_count(g) == len(kernels(g)) == len(parts)


def test_two_anchors_into_one_add_fuse_only_the_first():
    g = examples_graph(examples.inception_block(size=8, channels=8))
    for grp in groups(g):
        anchors = [n for n in grp.members if g.nodes[n].op in ("conv2d", "matmul", "max_pool2d", "avg_pool2d")]
        assert len(anchors) <= 1  # FuseTIR never puts two reductions in one kernel


def test_ops_without_operands_are_folded_like_constants():
    """Position embeddings as PyTorch's frontend writes them (``arange``, plus an offset, into a
    ``take`` of the table): TVM's FoldConstant evaluates all of it, so only the add is a kernel."""
    x = relax.Var("x", relax.TensorType((16, 8), "float32"))
    table = relax.const(np.random.default_rng(0).standard_normal((32, 8)).astype("float32"))
    bb = relax.BlockBuilder()
    with bb.function("main", [x]):
        with bb.dataflow():
            ids = bb.emit(relax.op.arange(0, 16, 1, "int64"))
            ids = bb.emit(relax.op.add(ids, relax.const(0, "int64")))
            pos = bb.emit(relax.op.take(table, ids, axis=0))
            out = bb.emit_output(relax.op.add(x, pos))
        bb.emit_func_output(out)
    mod = bb.get()
    for target in TARGETS:
        assert assert_counts_agree(mod, target, f"position embeddings for {target}") == 1


def examples_graph(mod):
    return as_graphs(mod)[1][0]


# -- the benchmark models ----------------------------------------------------------------------


@pytest.mark.heavy
@pytest.mark.parametrize("name", list(models.MODELS))
def test_benchmark_models_agree_before_and_after(name):
    mod = import_relax(models.build(name, quick=True))
    before = assert_counts_agree(mod, "llvm", f"{name} as imported")
    for target in TARGETS:
        new, report = tvm_taso.optimize(mod, target=target, cost_model="analytic", budget=8, time_limit=4)
        assert report["kernels_before"] == before  # the passes up to FuseTIR are the same on cuda and llvm
        assert_counts_agree(new, target, f"{name} optimized for {target}", report["kernels_after"])


# -- models shaped like PyTorch exports --------------------------------------------------------


def _const(name, array):
    return numpy_helper.from_array(np.asarray(array), name)


def _model(nodes, inputs, outputs, inits):
    graph = helper.make_graph(nodes, "torch_export", inputs, outputs, inits)
    return helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)])


def _layer_norm(x, prefix, hidden, rng):
    """LayerNorm as torch.onnx exports it below opset 17: ReduceMean, Sub, Pow, Sqrt, Div."""
    p = prefix
    return [
        helper.make_node("ReduceMean", [x], [f"{p}_mu"], axes=[-1]),
        helper.make_node("Sub", [x, f"{p}_mu"], [f"{p}_d"]),
        helper.make_node("Pow", [f"{p}_d", "two"], [f"{p}_sq"]),
        helper.make_node("ReduceMean", [f"{p}_sq"], [f"{p}_var"], axes=[-1]),
        helper.make_node("Add", [f"{p}_var", "eps"], [f"{p}_ve"]),
        helper.make_node("Sqrt", [f"{p}_ve"], [f"{p}_sd"]),
        helper.make_node("Div", [f"{p}_d", f"{p}_sd"], [f"{p}_n"]),
        helper.make_node("Mul", [f"{p}_n", f"{p}_g"], [f"{p}_s"]),
        helper.make_node("Add", [f"{p}_s", f"{p}_b"], [f"{p}_out"]),
    ], [_const(f"{p}_g", rng.standard_normal(hidden).astype("float32")),
        _const(f"{p}_b", rng.standard_normal(hidden).astype("float32"))]


def torch_mlp(rng):
    """nn.Sequential(Linear, ReLU, Linear) + softmax: Gemm with transB=1."""
    nodes = [helper.make_node("Gemm", ["x", "w1", "b1"], ["h"], transB=1), helper.make_node("Relu", ["h"], ["r"]),
             helper.make_node("Gemm", ["r", "w2", "b2"], ["y"], transB=1),
             helper.make_node("Softmax", ["y"], ["p"], axis=-1)]
    inits = [_const("w1", rng.standard_normal((32, 16)).astype("float32")), _const("b1", np.zeros(32, "float32")),
             _const("w2", rng.standard_normal((10, 32)).astype("float32")), _const("b2", np.zeros(10, "float32"))]
    return _model(nodes, [helper.make_tensor_value_info("x", TensorProto.FLOAT, [4, 16])],
                  [helper.make_tensor_value_info("p", TensorProto.FLOAT, [4, 10])], inits)


def torch_encoder_layer(rng, seq=8, hidden=32, heads=4):
    """A BERT layer as exported: MatMul+Add projections, Reshape/Transpose heads, a Where mask,
    decomposed LayerNorm, Erf GELU."""
    d = hidden // heads
    w = lambda *s: rng.standard_normal(s).astype("float32") * 0.1  # noqa: E731
    nodes, inits = [], [_const("two", np.float32(2.0)), _const("eps", np.float32(1e-5)),
                        _const("scale", np.float32(np.sqrt(d))), _const("neg", np.float32(-1e4)),
                        _const("heads_shape", np.array([1, seq, heads, d])), _const("flat", np.array([1, seq, hidden])),
                        _const("half", np.float32(0.5)), _const("one", np.float32(1.0)),
                        _const("sqrt2", np.float32(np.sqrt(2.0)))]
    for name in "qkv":
        nodes += [helper.make_node("MatMul", ["x", f"w{name}"], [f"{name}0"]),
                  helper.make_node("Add", [f"{name}0", f"b{name}"], [f"{name}1"]),
                  helper.make_node("Reshape", [f"{name}1", "heads_shape"], [f"{name}2"]),
                  helper.make_node("Transpose", [f"{name}2"], [f"{name}3"],
                                   perm=[0, 2, 3, 1] if name == "k" else [0, 2, 1, 3])]
        inits += [_const(f"w{name}", w(hidden, hidden)), _const(f"b{name}", w(hidden))]
    nodes += [
        helper.make_node("MatMul", ["q3", "k3"], ["s0"]), helper.make_node("Div", ["s0", "scale"], ["s1"]),
        helper.make_node("Where", ["mask", "s1", "neg"], ["s2"]), helper.make_node("Softmax", ["s2"], ["a"], axis=-1),
        helper.make_node("MatMul", ["a", "v3"], ["c0"]), helper.make_node("Transpose", ["c0"], ["c1"], perm=[0, 2, 1, 3]),
        helper.make_node("Reshape", ["c1", "flat"], ["c2"]), helper.make_node("MatMul", ["c2", "wo"], ["o0"]),
        helper.make_node("Add", ["o0", "bo"], ["o1"]), helper.make_node("Add", ["o1", "x"], ["r1"]),
    ]
    ln, ln_w = _layer_norm("r1", "ln1", hidden, rng)
    nodes += ln
    nodes += [
        helper.make_node("MatMul", ["ln1_out", "wf"], ["f0"]), helper.make_node("Add", ["f0", "bf"], ["f1"]),
        helper.make_node("Div", ["f1", "sqrt2"], ["g0"]), helper.make_node("Erf", ["g0"], ["g1"]),
        helper.make_node("Add", ["g1", "one"], ["g2"]), helper.make_node("Mul", ["f1", "g2"], ["g3"]),
        helper.make_node("Mul", ["g3", "half"], ["g4"]), helper.make_node("MatMul", ["g4", "wd"], ["d0"]),
        helper.make_node("Add", ["d0", "bd"], ["d1"]), helper.make_node("Add", ["d1", "ln1_out"], ["y"]),
    ]
    inits += ln_w + [_const("wo", w(hidden, hidden)), _const("bo", w(hidden)), _const("wf", w(hidden, 2 * hidden)),
                     _const("bf", w(2 * hidden)), _const("wd", w(2 * hidden, hidden)), _const("bd", w(hidden))]
    return _model(nodes, [helper.make_tensor_value_info("x", TensorProto.FLOAT, [1, seq, hidden]),
                          helper.make_tensor_value_info("mask", TensorProto.BOOL, [1, 1, 1, seq])],
                  [helper.make_tensor_value_info("y", TensorProto.FLOAT, [1, seq, hidden])], inits)


def torch_embedding(rng, seq=8, vocab=50, hidden=16):
    """Token and position embeddings (Gather), added, then a decomposed LayerNorm."""
    nodes = [helper.make_node("Gather", ["tok", "ids"], ["e0"]), helper.make_node("Gather", ["pos", "pos_ids"], ["e1"]),
             helper.make_node("Add", ["e0", "e1"], ["e2"])]
    ln, ln_w = _layer_norm("e2", "ln", hidden, rng)
    inits = [_const("tok", rng.standard_normal((vocab, hidden)).astype("float32")),
             _const("pos", rng.standard_normal((seq, hidden)).astype("float32")),
             _const("pos_ids", np.arange(seq).reshape(1, seq)), _const("two", np.float32(2.0)),
             _const("eps", np.float32(1e-5))] + ln_w
    return _model(nodes + ln, [helper.make_tensor_value_info("ids", TensorProto.INT64, [1, seq])],
                  [helper.make_tensor_value_info("ln_out", TensorProto.FLOAT, [1, seq, hidden])], inits)


def torch_resnet_block(rng, c=8, size=16):
    """conv-BN-ReLU, max pool, a residual block, global average pool, Flatten, Linear."""
    w = lambda *s: rng.standard_normal(s).astype("float32") * 0.1  # noqa: E731
    nodes, inits = [], []
    for k, (src, dst, cin) in enumerate((("x", "a", 3), ("p", "b", c), ("b", "c", c))):
        nodes += [helper.make_node("Conv", [src, f"cw{k}"], [f"conv{k}"], pads=[1, 1, 1, 1]),
                  helper.make_node("BatchNormalization", [f"conv{k}", f"g{k}", f"be{k}", f"m{k}", f"v{k}"], [f"bn{k}"])]
        nodes.append(helper.make_node("Relu", [f"bn{k}"], [dst]) if k < 2 else
                     helper.make_node("Add", [f"bn{k}", "p"], [dst]))
        if k == 0:
            nodes.append(helper.make_node("MaxPool", ["a"], ["p"], kernel_shape=[2, 2], strides=[2, 2]))
        inits += [_const(f"cw{k}", w(c, cin, 3, 3)), _const(f"g{k}", 1 + w(c)), _const(f"be{k}", w(c)),
                  _const(f"m{k}", w(c)), _const(f"v{k}", 1 + np.abs(w(c)))]
    nodes += [helper.make_node("Relu", ["c"], ["r"]), helper.make_node("GlobalAveragePool", ["r"], ["gp"]),
              helper.make_node("Flatten", ["gp"], ["f"]), helper.make_node("Gemm", ["f", "fw", "fb"], ["y"], transB=1)]
    inits += [_const("fw", w(10, c)), _const("fb", w(10))]
    return _model(nodes, [helper.make_tensor_value_info("x", TensorProto.FLOAT, [1, 3, size, size])],
                  [helper.make_tensor_value_info("y", TensorProto.FLOAT, [1, 10])], inits)


@pytest.mark.parametrize("build", [torch_mlp, torch_encoder_layer, torch_embedding, torch_resnet_block])
def test_pytorch_shaped_models_agree_before_and_after(build):
    mod = import_relax(build(np.random.default_rng(0)))
    assert_counts_agree(mod, "llvm", f"{build.__name__} as imported")
    for target in TARGETS:
        new, report = tvm_taso.optimize(mod, target=target, cost_model="analytic", budget=16, time_limit=4)
        assert_counts_agree(new, target, f"{build.__name__} optimized for {target}", report["kernels_after"])


# -- models exported by PyTorch ----------------------------------------------------------------


def torch_mlp_export():
    """A GELU MLP with LayerNorm and a residual, as ``torch.onnx.export`` writes it."""
    import io

    import onnx
    import torch

    torch.manual_seed(0)

    class Block(torch.nn.Module):
        def __init__(self, d=32):
            super().__init__()
            self.norm, self.up, self.down = torch.nn.LayerNorm(d), torch.nn.Linear(d, 4 * d), torch.nn.Linear(4 * d, d)

        def forward(self, x):
            return x + self.down(torch.nn.functional.gelu(self.up(self.norm(x))))

    f = io.BytesIO()
    torch.onnx.export(Block().eval(), (torch.randn(2, 8, 32),), f, dynamo=False, opset_version=17,
                      input_names=["x"], output_names=["y"])
    return onnx.load_from_string(f.getvalue())


@pytest.mark.heavy
@pytest.mark.parametrize("name", ["torch-resnet18", "torch-bert", "torch-vit", "torch-mlp"])
def test_pytorch_exported_models_agree_before_and_after(name):
    pytest.importorskip("torch")
    from benchmarks.roundtrip import TORCH_SIZES, export_torch

    proto = torch_mlp_export() if name == "torch-mlp" else export_torch(name, TORCH_SIZES[name][1])
    mod = import_relax(proto)
    assert_counts_agree(mod, "llvm", f"{name} as imported")
    for target in TARGETS:
        new, report = tvm_taso.optimize(mod, target=target, cost_model="analytic", budget=16, time_limit=4)
        assert_counts_agree(new, target, f"{name} optimized for {target}", report["kernels_after"])
