"""Relax → ONNX export: ONNX models imported with ``from_onnx`` and exported again compute what
the originals compute in onnxruntime (also after tvm-taso's rewrites), a Relax model using every
converter computes in onnxruntime what TVM computes, and what cannot be exported is named."""

import os
import warnings

import numpy as np
import onnx
import pytest
import tvm
from onnx import TensorProto, helper, numpy_helper
from tvm import relax, topi
from tvm.relax.frontend.onnx import from_onnx

import tvm_taso
from tvm_taso.io.onnx_export import CONVERTERS, ExportError, relax_to_onnx
from tvm_taso.numerics import relative_error
from tvm_taso.runtime import run

ort = pytest.importorskip("onnxruntime")

# -- ONNX models built with onnx.helper ------------------------------------------------------


class _OnnxBuilder:
    def __init__(self, seed):
        self.rng = np.random.default_rng(seed)
        self.nodes, self.inits = [], []

    def w(self, *shape, scale=None, value=None):
        if value is None:
            fan_in = int(np.prod(shape[1:])) if len(shape) > 1 else shape[0]
            value = self.rng.standard_normal(shape) * (scale or 1 / np.sqrt(fan_in))
        value = np.asarray(value)
        value = value.astype("float32") if value.dtype == np.float64 else value
        name = f"w{len(self.inits)}"
        self.inits.append(numpy_helper.from_array(value, name))
        return name

    def op(self, op_type, *inputs, outputs=1, **attrs):
        outs = [f"t{len(self.nodes)}_{i}" for i in range(outputs)]
        self.nodes.append(helper.make_node(op_type, list(inputs), outs, **attrs))
        return outs[0] if outputs == 1 else outs

    def model(self, inputs, outputs, opset=17):
        graph = helper.make_graph(
            self.nodes,
            "g",
            [helper.make_tensor_value_info(n, TensorProto.FLOAT, s) for n, s in inputs.items()],
            [helper.make_tensor_value_info(o, TensorProto.FLOAT, None) for o in outputs],
            self.inits,
        )
        model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", opset)])
        model = onnx.shape_inference.infer_shapes(model)
        onnx.checker.check_model(model, full_check=True)
        return model


def resnet_block():
    g = _OnnxBuilder(0)

    def conv_bn(x, cin, cout, k, stride=1, relu=True):
        y = g.op("Conv", x, g.w(cout, cin, k, k), kernel_shape=[k, k], strides=[stride] * 2, pads=[k // 2] * 4)
        gamma = g.w(cout, value=1 + 0.1 * g.rng.standard_normal(cout))
        var = g.w(cout, value=0.5 + g.rng.random(cout))
        y = g.op("BatchNormalization", y, gamma, g.w(cout, scale=0.1), g.w(cout, scale=0.1), var, epsilon=1e-5)
        return g.op("Relu", y) if relu else y

    x = conv_bn("x", 3, 16, 3, stride=2)
    x = g.op("MaxPool", x, kernel_shape=[3, 3], strides=[2, 2], pads=[1, 1, 1, 1])
    y = conv_bn(conv_bn(x, 16, 16, 3), 16, 16, 3, relu=False)
    x = g.op("GlobalAveragePool", g.op("Relu", g.op("Add", x, y)))
    x = g.op("Gemm", g.op("Flatten", x, axis=1), g.w(10, 16), g.w(10, scale=0.1), transB=1)
    return g.model({"x": [1, 3, 32, 32]}, [x])


def _encoder_layer(g, x, seq, d, heads):
    dh = d // heads

    def linear(t, n_in, n_out):
        return g.op("Add", g.op("MatMul", t, g.w(n_in, n_out)), g.w(n_out, scale=0.1))

    def heads_first(t):
        t = g.op("Reshape", t, g.w(value=np.array([1, seq, heads, dh], "int64")))
        return g.op("Transpose", t, perm=[0, 2, 1, 3])

    def layer_norm(t):
        gamma = g.w(d, value=1 + 0.1 * g.rng.standard_normal(d))
        return g.op("LayerNormalization", t, gamma, g.w(d, scale=0.1), axis=-1, epsilon=1e-5)

    q, k, v = (heads_first(linear(x, d, d)) for _ in range(3))
    scores = g.op("Div", g.op("MatMul", q, g.op("Transpose", k, perm=[0, 1, 3, 2])), g.w(value=np.float32(np.sqrt(dh))))
    att = g.op("MatMul", g.op("Softmax", scores, axis=-1), v)
    att = g.op("Reshape", g.op("Transpose", att, perm=[0, 2, 1, 3]), g.w(value=np.array([1, seq, d], "int64")))
    x = layer_norm(g.op("Add", x, linear(att, d, d)))
    h = linear(x, d, 4 * d)
    erf = g.op("Erf", g.op("Div", h, g.w(value=np.float32(np.sqrt(2)))))
    gelu = g.op("Mul", g.op("Mul", h, g.op("Add", erf, g.w(value=np.float32(1)))), g.w(value=np.float32(0.5)))
    return layer_norm(g.op("Add", x, linear(gelu, 4 * d, d)))


def bert_layer(seq=16, d=64, heads=4):
    g = _OnnxBuilder(1)
    return g.model({"x": [1, seq, d]}, [_encoder_layer(g, "x", seq, d, heads)])


def vit(img=32, patch=8, d=64, heads=4):
    g = _OnnxBuilder(2)
    n = (img // patch) ** 2
    x = g.op("Conv", "x", g.w(d, 3, patch, patch), g.w(d, scale=0.1), kernel_shape=[patch] * 2, strides=[patch] * 2)
    x = g.op("Transpose", g.op("Reshape", x, g.w(value=np.array([1, d, n], "int64"))), perm=[0, 2, 1])
    x = g.op("Add", g.op("Concat", g.w(1, 1, d, scale=0.02), x, axis=1), g.w(1, n + 1, d, scale=0.02))
    return g.model({"x": [1, 3, img, img]}, [_encoder_layer(g, x, n + 1, d, heads)])


def inception_block():
    """Sibling 1x1/3x3/5x5 convs with bias and ReLU, concatenated: tvm-taso merges them."""
    g = _OnnxBuilder(3)
    branches = []
    for k, cout in ((1, 8), (3, 16), (5, 8)):
        y = g.op("Conv", "x", g.w(cout, 16, k, k), g.w(cout, scale=0.1), kernel_shape=[k, k], pads=[k // 2] * 4)
        branches.append(g.op("Relu", y))
    return g.model({"x": [1, 16, 14, 14]}, [g.op("Concat", *branches, axis=1)])


def importer_ops():
    """ONNX ops that from_onnx lowers to shape helpers, where/isnan chains or emit_te call_tir."""
    g = _OnnxBuilder(4)
    x = g.op("Pad", "x", g.w(value=np.array([0, 0, 1, 2, 0, 0, 3, 0], "int64")), g.w(value=np.float32(0.5)))
    x = g.op("Clip", x, g.w(value=np.float32(-1)), g.w(value=np.float32(1.5)))
    x = g.op("Conv", x, g.w(8, 4, 3, 3), auto_pad="SAME_UPPER", strides=[2, 2])  # emit_te pad + conv
    x = g.op("Clip", x, g.w(value=np.float32(0)))  # max only
    x = g.op("AveragePool", x, kernel_shape=[3, 3], strides=[2, 2], pads=[1, 1, 1, 1], count_include_pad=0, ceil_mode=1)
    x = g.op("Max", x, g.op("Gather", x, g.w(value=np.array([-1], "int64")), axis=1))
    a, b = g.op("Split", x, g.w(value=np.array([3, 5], "int64")), axis=1, outputs=2)
    a = g.op("Slice", a, *[g.w(value=np.array(v, "int64")) for v in ([0, -1], [2, -100], [1, 3], [1, -1])])
    a = g.op("Expand", g.op("ReduceMean", a, axes=[1], keepdims=1), g.w(value=np.array([1, 5, 1, 1], "int64")))
    c = g.op("Where", g.op("Greater", b, a), b, g.op("Neg", a))
    c = g.op("Squeeze", g.op("Unsqueeze", c, g.w(value=np.array([0], "int64"))), g.w(value=np.array([0], "int64")))
    y = g.op("ReduceSum", g.op("Cast", c, to=TensorProto.DOUBLE), g.w(value=np.array([2, 3], "int64")), keepdims=0)
    y = g.op("Cast", y, to=TensorProto.FLOAT)
    dims = g.op("Cast", g.op("Gather", g.op("Shape", c), g.w(value=np.array([1, 3], "int64"))), to=TensorProto.FLOAT)
    return g.model({"x": [1, 4, 11, 13]}, [y, g.op("ReduceMax", c, axes=[1], keepdims=0), dims])


ONNX_MODELS = {"resnet": resnet_block, "bert": bert_layer, "vit": vit, "importer-ops": importer_ops}


def random_feeds(model, seed=0):
    rng = np.random.default_rng(seed)
    return {
        i.name: rng.standard_normal([d.dim_value for d in i.type.tensor_type.shape.dim]).astype("float32")
        for i in model.graph.input
    }


def ort_run(model, feeds):
    options = ort.SessionOptions()
    options.log_severity_level = 3
    session = ort.InferenceSession(model.SerializeToString(), options, providers=["CPUExecutionProvider"])
    return session.run(None, feeds)


def check_matches_onnx(original, exported):
    onnx.checker.check_model(exported, full_check=True)
    feeds = random_feeds(original)
    expected, got = ort_run(original, feeds), ort_run(exported, feeds)
    assert [e.shape for e in expected] == [o.shape for o in got]
    assert relative_error(expected, got) <= 1e-4


def import_onnx(model, **kw):
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        return from_onnx(model, **kw)


@pytest.fixture(scope="module", params=sorted(ONNX_MODELS))
def onnx_model(request):
    return ONNX_MODELS[request.param]()


def test_imported_models_round_trip(onnx_model):
    exported = relax_to_onnx(import_onnx(onnx_model))
    check_matches_onnx(onnx_model, exported)
    assert [o.name for o in exported.graph.output] == [f"output_{i}" for i in range(len(onnx_model.graph.output))]
    assert [i.name for i in exported.graph.input] == [i.name for i in onnx_model.graph.input]


def test_emit_te_pad_and_clip_become_onnx_ops():
    model = importer_ops()
    mod = import_onnx(model)
    calls = [b.value for b in mod["main"].body.blocks[0].bindings if isinstance(b.value, relax.Call)]
    assert sum(c.op.name == "relax.call_tir" for c in calls) >= 5  # 2 pads, 2 maximum, 1 minimum
    op_types = [n.op_type for n in relax_to_onnx(mod).graph.node]
    assert op_types.count("Pad") == 2 and op_types.count("Max") >= 2 and "Min" in op_types


def test_emit_te_function_is_checked_not_its_name():
    x = relax.Var("x", relax.TensorType((2, 3), "float32"))
    y = relax.Var("y", relax.TensorType((2, 3), "float32"))
    mod = _function([x, y], lambda bb: bb.emit_te(topi.add, x, y, primfunc_name_hint="maximum"))
    with pytest.raises(ExportError, match=r"relax\.call_tir\(maximum\) at @main/lv: its TIR function is not"):
        relax_to_onnx(mod)


@pytest.mark.parametrize("name", ["resnet", "bert", "vit"])
def test_weights_kept_as_params_become_initializers(name):
    model = ONNX_MODELS[name]()
    exported = relax_to_onnx(import_onnx(model, keep_params_in_input=True))
    check_matches_onnx(model, exported)
    assert [i.name for i in exported.graph.input] == [i.name for i in model.graph.input]


def test_optimized_modules_export(onnx_model):
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", tvm_taso.TasoSkippedWarning)
        new, _ = tvm_taso.optimize(import_onnx(onnx_model), target="cuda")
    check_matches_onnx(onnx_model, relax_to_onnx(new))


def test_optimized_inception_exports_merged_conv():
    model = inception_block()
    new, report = tvm_taso.optimize(import_onnx(model), target="cuda")
    assert report["applied"], report
    exported = relax_to_onnx(new)
    check_matches_onnx(model, exported)
    op_types = [n.op_type for n in exported.graph.node]
    assert op_types.count("Conv") < 3 and "Split" in op_types


# -- every converter, checked against TVM itself ---------------------------------------------


def _f32(rng, *shape, scale=1.0):
    return relax.const((rng.standard_normal(shape) * scale).astype("float32"))


def relax_zoo() -> tvm.IRModule:
    """One Relax function that uses every converter in CONVERTERS at least once."""
    rng = np.random.default_rng(5)
    op = relax.op
    bb = relax.BlockBuilder()
    x = relax.Var("x", relax.TensorType((2, 4, 9, 10), "float32"))
    s = relax.Var("s", relax.TensorType((2, 6, 8), "float32"))
    outs = []
    with bb.function("main", [x, s]):
        with bb.dataflow():
            e = bb.emit
            # kernels with asymmetric padding, strides, dilation, groups; pooling; ceil_mode
            w = _f32(rng, 6, 2, 3, 2, scale=0.3)
            c = e(op.nn.conv2d(x, w, strides=(2, 1), padding=(0, 1, 2, 3), dilation=(1, 2), groups=2))
            outs.append(e(op.nn.max_pool2d(c, (3, 2), strides=(2, 2), padding=(1, 0, 1, 1), ceil_mode=True)))
            outs.append(e(op.nn.avg_pool2d(c, (2, 3), strides=(2, 2), padding=(1, 1, 0, 1), ceil_mode=True)))
            outs.append(e(op.nn.avg_pool2d(c, (3, 3), padding=(1, 1, 1, 1), count_include_pad=True)))
            outs.append(e(op.nn.adaptive_avg_pool2d(x, (1, 1))))
            outs.append(e(op.nn.adaptive_avg_pool2d(x, (3, 5))))
            c1 = e(op.nn.conv1d(s, _f32(rng, 4, 6, 3, scale=0.3), padding=(2, 0), strides=2))
            outs.append(e(op.nn.max_pool1d(c1, 2, padding=(1, 0))))
            outs.append(e(op.nn.avg_pool1d(c1, 2, strides=2)))
            # elementwise
            y = e(op.add(x, _f32(rng, 4, 1, 1)))
            y = e(op.multiply(op.subtract(y, _f32(rng, 10)), _f32(rng, 1, 4, 9, 1)))
            y = e(op.divide(y, relax.const(np.float32(1.7))))
            pos = e(op.add(op.abs(y), relax.const(np.float32(0.1))))
            outs.append(e(op.power(pos, relax.const(np.float32(0.7)))))
            outs.append(e(op.maximum(y, x)))
            outs.append(e(op.minimum(y, x)))
            for fn in (op.nn.relu, op.sigmoid, op.nn.silu, op.tanh, op.erf, op.nn.gelu, op.nn.gelu_tanh, op.exp,
                       op.negative, op.floor, op.ceil, op.square):  # fmt: skip
                outs.append(e(fn(y)))
            outs.append(e(op.nn.leakyrelu(y, 0.15)))
            for fn in (op.log, op.sqrt, op.rsqrt):
                outs.append(e(fn(pos)))
            z = e(op.clip(y, -0.5, 0.75))
            outs.append(z)
            compare = (op.equal, op.not_equal, op.less, op.less_equal, op.greater, op.greater_equal)
            comparisons = [e(fn(y, z)) for fn in compare]
            mask = e(op.logical_or(op.logical_and(comparisons[2], op.logical_not(comparisons[0])), op.isnan(y)))
            outs.append(e(op.where(mask, y, x)))
            outs.append(e(op.astype(comparisons[4], "float32")))
            # normalizations and reductions
            outs.append(e(op.nn.softmax(y, axis=1)))
            outs.append(e(op.nn.log_softmax(y)))
            outs.append(e(op.nn.layer_norm(y, _f32(rng, 9, 10), _f32(rng, 9, 10), axes=[-2, -1], epsilon=1e-3)))
            gamma, beta, mean = _f32(rng, 4), _f32(rng, 4), _f32(rng, 4)
            var = relax.const((0.5 + rng.random(4)).astype("float32"))
            bn = e(op.nn.batch_norm(y, gamma, beta, mean, var, axis=1, epsilon=1e-3, training=False))
            outs += [e(relax.TupleGetItem(bn, 0)), e(relax.TupleGetItem(bn, 2))]
            bn = e(op.nn.batch_norm(y, gamma, beta, mean, var, axis=1, center=False, scale=False, training=False))
            outs.append(e(relax.TupleGetItem(bn, 0)))
            outs.append(e(op.mean(y, axis=[2, 3], keepdims=True)))
            outs.append(e(op.sum(y, axis=None)))
            outs.append(e(op.max(y, axis=[1])))
            outs.append(e(op.min(y, axis=[-1], keepdims=True)))
            outs.append(e(op.prod(op.sigmoid(y), axis=[0])))
            outs.append(e(op.variance(y, axis=[1, 3])))
            outs.append(e(op.astype(op.argmax(y, axis=2), "float32")))
            outs.append(e(op.astype(op.argmin(y, axis=None, keepdims=True), "float32")))
            # data movement
            outs.append(e(op.matmul(s, _f32(rng, 8, 5))))
            ints = e(op.astype(op.multiply(s, relax.const(np.float32(10))), "int32"))
            outs.append(e(op.astype(op.matmul(ints, op.permute_dims(ints, [0, 2, 1]), out_dtype="int64"), "float32")))
            outs.append(e(op.matmul(op.permute_dims(s, [0, 2, 1]), s)))
            outs.append(e(op.permute_dims(y)))
            parts = e(op.split(y, [1, 3], axis=1))
            halves = e(op.split(y, 2, axis=3))
            outs.append(e(op.concat([e(relax.TupleGetItem(halves, 0)), e(relax.TupleGetItem(halves, 1))], axis=1)))
            outs.append(e(op.stack([e(relax.TupleGetItem(parts, 0)), e(relax.TupleGetItem(parts, 2))], axis=4)))
            outs.append(e(op.strided_slice(y, axes=[1, 3], begin=[3, -2], end=[0, 1], strides=[-1, -3])))
            outs.append(e(op.strided_slice(y, axes=[2], begin=[1], end=[100])))
            for mode, index in (("fast", [3, 0, 9]), ("wrap", [5, -7]), ("clip", [[-3, 1], [2, 11]])):
                outs.append(e(op.take(y, relax.const(np.array(index, "int64")), axis=3, mode=mode)))
            flat = e(op.flatten(y))
            outs += [flat, e(op.take(flat, relax.const(np.array([7, 300], "int32")), axis=None, mode="clip"))]
            outs.append(e(op.reshape(y, (8, -1, 5))))
            outs.append(e(op.squeeze(op.expand_dims(y, [0, 3]), [0])))
            outs.append(e(op.broadcast_to(_f32(rng, 1, 9, 1), (3, 9, 4))))
            outs.append(e(op.nn.pad(y, [0, 0, 1, 0, 2, 1, 0, 3], pad_value=-2.0)))
            outs.append(e(op.nn.pad(y, [0, 0, 0, 0, 2, 1, 1, 3], pad_mode="reflect")))
            outs.append(e(op.nn.pad(y, [0, 0, 1, 1, 2, 1, 1, 0], pad_mode="replicate")))
            outs.append(e(op.astype(op.shape_to_tensor(op.shape_of(y)), "float32")))
            out = bb.emit_output(relax.Tuple(outs))
        bb.emit_func_output(out)
    return bb.get()


@pytest.fixture(scope="module")
def zoo():
    mod = relax_zoo()
    rng = np.random.default_rng(6)
    inputs = [rng.standard_normal((2, 4, 9, 10)).astype("float32"), rng.standard_normal((2, 6, 8)).astype("float32")]
    return mod, inputs, run(mod, inputs)


def test_zoo_uses_every_converter(zoo):
    bindings = [b for block in zoo[0]["main"].body.blocks for b in block.bindings]
    used = {b.value.op.name for b in bindings if isinstance(b.value, relax.Call)}
    assert set(CONVERTERS) <= used, set(CONVERTERS) - used


@pytest.mark.parametrize("opset", [17, 18, 20])
def test_every_converter_matches_tvm(zoo, opset):
    mod, inputs, expected = zoo
    exported = relax_to_onnx(mod, opset=opset)
    onnx.checker.check_model(exported, full_check=True)
    got = ort_run(exported, {"x": inputs[0], "s": inputs[1]})
    assert len(got) == len(expected)
    for i, (e, g) in enumerate(zip(expected, got)):
        assert e.shape == g.shape and e.dtype == g.dtype, (i, e.shape, g.shape, e.dtype, g.dtype)
        assert np.allclose(e, g, rtol=1e-4, atol=1e-4 * np.abs(e).max()), (i, float(np.abs(e - g).max()))
    op_types = {n.op_type for n in exported.graph.node}
    assert ("Gelu" in op_types) == (opset >= 20)


# -- outputs, constants, files ---------------------------------------------------------------


def _function(params, body_fn):
    bb = relax.BlockBuilder()
    with bb.function("main", params):
        with bb.dataflow():
            out = bb.emit_output(body_fn(bb))
        bb.emit_func_output(out)
    return bb.get()


def test_tuple_outputs_constants_and_aliases():
    x = relax.Var("x", relax.TensorType((2, 3), "float32"))
    w = np.arange(6, dtype="float32").reshape(2, 3)

    def body(bb):
        a = bb.emit(relax.op.add(x, relax.const(w)))
        b = bb.emit(relax.op.multiply(a, relax.const(w.copy())))  # same content: one initializer
        return relax.Tuple([b, x, a, b, relax.const(w)])

    exported = relax_to_onnx(_function([x], body))
    onnx.checker.check_model(exported, full_check=True)
    assert len(exported.graph.initializer) == 1
    assert [o.name for o in exported.graph.output] == [f"output_{i}" for i in range(5)]
    feed = np.ones((2, 3), "float32")
    got = ort_run(exported, {"x": feed})
    np.testing.assert_allclose(got[0], (feed + w) * w)
    np.testing.assert_allclose(got[1], feed)
    np.testing.assert_allclose(got[2], feed + w)
    np.testing.assert_allclose(got[3], got[0])
    np.testing.assert_allclose(got[4], w)


def test_plain_binding_blocks_and_match_cast():
    x = relax.Var("x", relax.TensorType((2, 3), "float32"))
    bb = relax.BlockBuilder()
    with bb.function("main", [x]):
        a = bb.emit(relax.op.exp(x))
        b = bb.match_cast(a, relax.TensorType((2, 3), "float32"))
        bb.emit_func_output(bb.emit(relax.op.sum(b, axis=[1])))
    mod = bb.get()
    assert not isinstance(mod["main"].body.blocks[0], relax.DataflowBlock)
    feed = np.random.default_rng(0).standard_normal((2, 3)).astype("float32")
    np.testing.assert_allclose(ort_run(relax_to_onnx(mod), {"x": feed})[0], np.exp(feed).sum(1), rtol=1e-6)


def test_writes_file_atomically(tmp_path):
    mod = import_onnx(resnet_block())
    path = tmp_path / "model.onnx"
    model = relax_to_onnx(mod, path)
    assert onnx.load(path) == model
    assert os.listdir(tmp_path) == ["model.onnx"]


# -- what cannot be exported -----------------------------------------------------------------


def test_unsupported_op_is_named_with_its_place(tmp_path):
    x = relax.Var("x", relax.TensorType((1, 2, 4, 4, 4), "float32"))
    w = relax.const(np.ones((2, 2, 1, 1, 1), "float32"))

    def body(bb):
        y = bb.emit(relax.op.nn.relu(x))
        return bb.emit(relax.op.nn.conv3d(y, w))

    with pytest.raises(ExportError, match=r"^cannot export relax\.nn\.conv3d at @main/lv1: "):
        relax_to_onnx(_function([x], body), tmp_path / "m.onnx")
    assert os.listdir(tmp_path) == []


def test_unrecognized_tir_function_is_named():
    g = _OnnxBuilder(7)
    y = g.op("Pad", "x", g.w(value=np.array([0, 0, 1, 1, 0, 0, 1, 1], "int64")), mode="reflect")
    mod = import_onnx(g.model({"x": [1, 2, 4, 4]}, [y]))
    with pytest.raises(ExportError, match=r"cannot export relax\.call_tir\(mirror_pad\) at @main/"):
        relax_to_onnx(mod)


def test_symbolic_shapes_are_refused():
    n = tvm.tirx.Var("n", "int64")
    x = relax.Var("x", relax.TensorType((n, 4), "float32"))
    with pytest.raises(ExportError, match=r"parameter x: .*symbolic shape"):
        relax_to_onnx(_function([x], lambda bb: bb.emit(relax.op.nn.relu(x))))


def test_shapes_computed_from_kept_params_are_refused():
    # with keep_params_in_input=True the Expand target shape is a tensor input: symbolic shapes
    g = _OnnxBuilder(8)
    y = g.op("Expand", g.op("Relu", "x"), g.w(value=np.array([3, 2, 4], "int64")))
    mod = import_onnx(g.model({"x": [2, 1]}, [y]), keep_params_in_input=True)
    message = r"vm\.builtin\.tensor_to_shape.* at @main/lv\d*: only calls to Relax operators"
    with pytest.raises(ExportError, match=message):
        relax_to_onnx(mod)


def test_layer_norm_without_affine_is_refused():
    x = relax.Var("x", relax.TensorType((2, 8), "float32"))
    c = relax.const(np.ones(8, "float32"))
    body = lambda bb: bb.emit(relax.op.nn.layer_norm(x, c, c, axes=[-1], scale=False))
    with pytest.raises(ExportError, match=r"relax\.nn\.layer_norm at @main/lv: scale=False or center=False"):
        relax_to_onnx(_function([x], body))


def test_training_batch_norm_is_refused():
    x = relax.Var("x", relax.TensorType((2, 3, 4, 4), "float32"))
    c = relax.const(np.ones(3, "float32"))
    def body(bb):
        return bb.emit(relax.TupleGetItem(bb.emit(relax.op.nn.batch_norm(x, c, c, c, c, axis=1, training=True)), 0))

    with pytest.raises(ExportError, match=r"relax\.nn\.batch_norm at @main/lv: training-mode"):
        relax_to_onnx(_function([x], body))


def test_bad_opset_and_function():
    mod = import_onnx(bert_layer())
    with pytest.raises(ValueError, match="opset 13"):
        relax_to_onnx(mod, opset=13)
    with pytest.raises(ExportError, match="no Relax function @encoder"):
        relax_to_onnx(mod, func="encoder")
