"""ONNX nodes <-> the engine's ops (:mod:`tvm_taso.ir.ops`), one small function per direction.

``READERS[op_type]`` reads one ONNX node of the default domain into engine nodes through a
:class:`~tvm_taso.io.onnx_bridge.ReadContext` and returns the ref of each ONNX output; it
raises :class:`~tvm_taso.ir.ops.OpError` with the reason when the node's form is not one the
engine models (the node then stays opaque). ``EMITTERS[op]`` writes one engine node created by
the search as ONNX nodes through a :class:`~tvm_taso.io.onnx_bridge.WriteContext`, in the form
the model's opset defines; one it cannot write raises OpError (the rewrite is not applied).
Readers never create weight-only ops: a transposed or scaled weight becomes a constant leaf.
"""

from __future__ import annotations

import math

import numpy as np

from tvm_taso.io import onnx_opset
from tvm_taso.ir import dims
from tvm_taso.ir.ops import OpError

FLOATS = ("float16", "float32", "float64")


# -- reading ------------------------------------------------------------------------------------


def _unary(op):
    def read(r, node, at):
        return [r.add(op, [r.ref(node.input[0])], {})]

    return read


def _binary(op):
    def read(r, node, at):
        return [r.add(op, [r.ref(node.input[0]), r.ref(node.input[1])], {})]

    return read


def _gelu(r, node, at):
    if at.get("approximate", b"none") not in (b"none", "none"):
        raise OpError("tanh-approximated Gelu")
    return [r.add("gelu", [r.ref(node.input[0])], {})]


def _matmul(r, node, at):
    return [r.add("matmul", [r.ref(node.input[0]), r.ref(node.input[1])], {})]


def _operand_t(r, name: str, transpose: bool, scale: float = 1.0):
    """``name`` (transposed, scaled): a constant leaf when ``name`` is a constant."""
    value = r.const(name)
    if value is not None:
        if not transpose and scale == 1.0:
            return r.ref(name)
        array = value.T if transpose else value  # a view: copied only if a rewrite writes it
        if scale != 1.0:
            array = (array * np.asarray(scale, value.dtype)).astype(value.dtype)
        return r.leaf(array, (name, "T" if transpose else "", scale))
    ref = r.ref(name)
    if transpose:
        ref = r.add("permute_dims", [ref], {"axes": (1, 0)})
    if scale != 1.0:
        ref = r.add("multiply", [ref, r.leaf(np.asarray(scale, r.ty(name).dtype), ("scalar", scale))], {})
    return ref


def _gemm(r, node, at):
    alpha, beta = float(at.get("alpha", 1.0)), float(at.get("beta", 1.0))
    a = _operand_t(r, node.input[0], bool(at.get("transA", 0)))
    b = _operand_t(r, node.input[1], bool(at.get("transB", 0)), alpha if r.const(node.input[1]) is not None else 1.0)
    y = r.add("matmul", [a, b], {})
    if alpha != 1.0 and r.const(node.input[1]) is None:
        y = r.add("multiply", [y, r.leaf(np.asarray(alpha, r.ty(node.input[0]).dtype), ("scalar", alpha))], {})
    if len(node.input) > 2 and node.input[2]:
        y = r.add("add", [y, _operand_t(r, node.input[2], False, beta)], {})
    return [y]


def _spatial(r, node, at, x_name: str, kernel: tuple[int, int], strides, dilations) -> tuple[int, int, int, int]:
    """(top, left, bottom, right) padding of a conv or pool, ``auto_pad`` resolved."""
    auto = at.get("auto_pad", b"NOTSET")
    auto = auto.decode() if isinstance(auto, bytes) else auto
    if auto in ("NOTSET", "VALID"):
        pads = tuple(at.get("pads", (0, 0, 0, 0))) if auto == "NOTSET" else (0, 0, 0, 0)
        if len(pads) != 4:
            raise OpError("not 2-D")
        return pads
    if any(r.symbolic(x_name)[2:]):
        raise OpError("auto_pad on a symbolic spatial size")
    size = r.ty(x_name).shape[2:]
    pads = [0, 0, 0, 0]
    for i in range(2):
        out = -(-size[i] // strides[i])
        total = max(0, (out - 1) * strides[i] + (kernel[i] - 1) * dilations[i] + 1 - size[i])
        small, large = total // 2, total - total // 2
        pads[i], pads[i + 2] = (small, large) if auto == "SAME_UPPER" else (large, small)
    return tuple(pads)


def _conv(r, node, at):
    w_ty = r.ty(node.input[1])
    if len(r.ty(node.input[0]).shape) != 4:
        raise OpError("not 2-D")
    kernel = tuple(w_ty.shape[2:])
    strides = tuple(at.get("strides", (1, 1)))
    dilations = tuple(at.get("dilations", (1, 1)))
    attrs = {"strides": strides, "dilation": dilations, "groups": int(at.get("group", 1)),
             "padding": _spatial(r, node, at, node.input[0], kernel, strides, dilations)}
    y = r.add("conv2d", [r.ref(node.input[0]), r.ref(node.input[1])], attrs)
    if len(node.input) > 2 and node.input[2]:
        bias = r.const(node.input[2])
        if bias is None:
            b = r.add("reshape", [r.ref(node.input[2])], {"shape": (1, w_ty.shape[0], 1, 1)})
        else:
            b = r.leaf(bias.reshape(1, -1, 1, 1), (node.input[2], "bias"), source=node.input[2])
        y = r.add("add", [y, b], {})
    return [y]


def _pool(op):
    def read(r, node, at):
        if len(node.output) > 1 and node.output[1]:
            raise OpError("pool with indices")
        if at.get("ceil_mode", 0) or at.get("storage_order", 0):
            raise OpError("ceil_mode or storage_order")
        kernel = tuple(at["kernel_shape"])
        if len(kernel) != 2:
            raise OpError("not 2-D")
        strides = tuple(at.get("strides", (1, 1)))
        dilations = tuple(at.get("dilations", (1, 1)))
        attrs = {"pool_size": kernel, "strides": strides, "dilation": dilations,
                 "padding": _spatial(r, node, at, node.input[0], kernel, strides, dilations)}
        if op == "avg_pool2d":
            attrs["count_include_pad"] = bool(at.get("count_include_pad", 0))
        return [r.add(op, [r.ref(node.input[0])], attrs)]

    return read


def _global_avg_pool(r, node, at):
    rank = len(r.ty(node.input[0]).shape)
    return [r.add("mean", [r.ref(node.input[0])], {"axis": tuple(range(2, rank)), "keepdims": True})]


def _concat(r, node, at):
    return [r.add("concat", [r.ref(n) for n in node.input], {"axis": int(at["axis"])})]


def _split(r, node, at):
    x = r.ty(node.input[0])
    axis = int(at.get("axis", 0)) % len(x.shape)
    if r.symbolic(node.input[0])[axis]:
        raise OpError("split along a symbolic dimension")
    if len(node.input) > 1 and node.input[1]:
        sizes = r.const(node.input[1])
        if sizes is None:
            raise OpError("split sizes computed at run time")
        sizes = [int(s) for s in sizes]
    elif "split" in at:
        sizes = [int(s) for s in at["split"]]
    else:
        count = int(at.get("num_outputs", len(node.output)))
        chunk = -(-x.shape[axis] // count)
        sizes = [min(chunk, x.shape[axis] - k * chunk) for k in range(count)]
    indices = tuple(int(v) for v in np.cumsum(sizes)[:-1])
    nid = r.add_node("split", [r.ref(node.input[0])], {"indices": indices, "axis": axis})
    return [(nid, i) for i in range(len(node.output))]


def _transpose(r, node, at):
    rank = len(r.ty(node.input[0]).shape)
    perm = tuple(at.get("perm", tuple(reversed(range(rank)))))
    return [r.add("permute_dims", [r.ref(node.input[0])], {"axes": perm})]


def _reshape(r, node, at):
    """A Reshape or Flatten as the engine's reshape, its target in symbolic sizes where the
    input has them: a Flatten's from the input's shape, a Reshape's from its constant target
    (``0`` copies the input's size, ``-1`` takes what is left) or, for a target the model
    computes, from the output's type."""
    x = r.ty(node.input[0])
    if node.op_type == "Flatten":
        axis = int(at.get("axis", 1)) % (len(x.shape) + 1)
        shape = (math.prod(x.shape[:axis], start=1), math.prod(x.shape[axis:], start=1))
    elif r.const(node.input[1]) is not None:
        shape = _reshape_target(x.shape, [int(v) for v in r.const(node.input[1]).reshape(-1)],
                                bool(at.get("allowzero", 0)))
    else:
        shape = r.ty(node.output[0]).shape
    return [r.add("reshape", [r.ref(node.input[0])], {"shape": tuple(shape)})]


def _reshape_target(source: tuple, target: list[int], allowzero: bool) -> tuple:
    """ONNX Reshape's ``target`` for an input of shape ``source``, ``0`` and ``-1`` resolved."""
    shape = [source[k] if v == 0 and not allowzero else v for k, v in enumerate(target)]
    if any(isinstance(d, int) and d < -1 for d in shape) or sum(isinstance(d, int) and d == -1 for d in shape) > 1:
        raise OpError(f"reshape target {target}")
    if -1 in [d for d in shape if isinstance(d, int)]:
        known = math.prod([d for d in shape if not (isinstance(d, int) and d == -1)], start=1)
        total = math.prod(source, start=1)
        if known == 0 or total % known:
            raise OpError(f"reshape target {target} does not divide the input's size")
        shape = [total // known if isinstance(d, int) and d == -1 else d for d in shape]
    return tuple(shape)


def _softmax(r, node, at):
    rank = len(r.ty(node.input[0]).shape)
    axis = int(at.get("axis", onnx_opset.softmax_default_axis(r.opset))) % rank
    if not onnx_opset.softmax_over_axis(r.opset, axis, rank):
        raise OpError(f"opset < {onnx_opset.SOFTMAX_ONE_AXIS_SINCE} softmax over a flattened tail")
    return [r.add("softmax", [r.ref(node.input[0])], {"axis": axis})]


def _layer_norm(r, node, at):
    if len(node.input) < 3 or not node.input[2] or any(node.output[1:]):
        raise OpError("without a bias, or with mean/inv-std outputs")
    rank = len(r.ty(node.input[0]).shape)
    axis = int(at.get("axis", -1)) % rank
    attrs = {"axes": tuple(range(axis, rank)), "epsilon": float(at.get("epsilon", 1e-5))}
    return [r.add("layer_norm", [r.ref(n) for n in node.input[:3]], attrs)]


def _batch_norm(r, node, at):
    if at.get("training_mode", 0) or any(node.output[1:]):
        raise OpError("training mode")
    attrs = {"axis": 1, "epsilon": float(at.get("epsilon", 1e-5))}
    nid = r.add_node("batch_norm", [r.ref(n) for n in node.input[:5]], attrs)
    return [(nid, 0)]


def _reduce_mean(r, node, at):
    rank = len(r.ty(node.input[0]).shape)
    if len(node.input) > 1 and node.input[1]:
        axes = r.const(node.input[1])
        if axes is None:
            raise OpError("axes computed at run time")
    else:
        axes = at.get("axes")
    if axes is None or not len(axes):
        if at.get("noop_with_empty_axes", 0):
            raise OpError("noop_with_empty_axes")
        axes = range(rank)
    attrs = {"axis": tuple(sorted(int(a) % rank for a in axes)), "keepdims": bool(at.get("keepdims", 1))}
    return [r.add("mean", [r.ref(node.input[0])], attrs)]


def _pad(r, node, at):
    mode = at.get("mode", b"constant")
    if mode not in (b"constant", "constant"):
        raise OpError(f"{mode!r} padding")
    if onnx_opset.pad_takes_inputs(r.opset):
        if len(node.input) > 3 and node.input[3]:
            raise OpError("pad with axes")
        pads = r.const(node.input[1])
        value = r.const(node.input[2]) if len(node.input) > 2 and node.input[2] else np.zeros(())
        if pads is None or value is None:
            raise OpError("pads computed at run time")
    else:
        pads, value = np.asarray(at["pads"]), np.asarray(at.get("value", 0.0))
    rank = len(r.ty(node.input[0]).shape)
    pads = [int(p) for p in pads]
    if min(pads) < 0:
        raise OpError("negative pads")
    width = tuple(v for i in range(rank) for v in (pads[i], pads[i + rank]))
    return [r.add("pad", [r.ref(node.input[0])], {"pad_width": width, "pad_value": float(value.reshape(()))})]


# op type -> (reader, the input positions that are tensor operands; None: all)
READERS = {
    "Add": (_binary("add"), None),
    "Sub": (_binary("subtract"), None),
    "Mul": (_binary("multiply"), None),
    "Div": (_binary("divide"), None),
    "Relu": (_unary("relu"), None),
    "Sigmoid": (_unary("sigmoid"), None),
    "Tanh": (_unary("tanh"), None),
    "Sqrt": (_unary("sqrt"), None),
    "Exp": (_unary("exp"), None),
    "Erf": (_unary("erf"), None),
    "Gelu": (_gelu, None),
    "MatMul": (_matmul, None),
    "Gemm": (_gemm, None),
    "Conv": (_conv, None),
    "MaxPool": (_pool("max_pool2d"), None),
    "AveragePool": (_pool("avg_pool2d"), None),
    "GlobalAveragePool": (_global_avg_pool, None),
    "Concat": (_concat, None),
    "Split": (_split, (0,)),
    "Transpose": (_transpose, None),
    "Reshape": (_reshape, (0,)),
    "Flatten": (_reshape, None),
    "Softmax": (_softmax, None),
    "LayerNormalization": (_layer_norm, None),
    "BatchNormalization": (_batch_norm, None),
    "ReduceMean": (_reduce_mean, (0,)),
    "Pad": (_pad, (0,)),
}


# -- writing ------------------------------------------------------------------------------------

_SIMPLE = {"add": "Add", "subtract": "Sub", "multiply": "Mul", "divide": "Div", "relu": "Relu",
           "sigmoid": "Sigmoid", "tanh": "Tanh", "sqrt": "Sqrt", "exp": "Exp", "erf": "Erf", "matmul": "MatMul"}


def _emit_simple(w, node, ins, outs):
    w.node(_SIMPLE[node.op], ins, outs)


def _emit_gelu(w, node, ins, outs):
    if onnx_opset.has_gelu(w.opset):
        w.node("Gelu", ins, outs)
        return
    dtype = node.types[0].dtype
    scaled, erf, plus, prod = (w.fresh("gelu") for _ in range(4))
    w.node("Div", [ins[0], w.constant(np.asarray(math.sqrt(2.0), dtype), "sqrt2")], [scaled])
    w.node("Erf", [scaled], [erf])
    w.node("Add", [erf, w.constant(np.asarray(1.0, dtype), "one")], [plus])
    w.node("Mul", [ins[0], plus], [prod])
    w.node("Mul", [prod, w.constant(np.asarray(0.5, dtype), "half")], outs)


def emit_conv(w, node, ins, outs, bias: str | None = None):
    """Conv of a conv2d node, with ``bias`` (a 1-D tensor name) as its third input when given."""
    at = node.attr
    kernel = list(w.type_of(node.inputs[1]).shape[2:])
    w.node("Conv", ins + ([bias] if bias else []), outs, kernel_shape=kernel, pads=list(at["padding"]),
           strides=list(at["strides"]), dilations=list(at["dilation"]), group=at["groups"])


def _emit_pool(w, node, ins, outs):
    at = node.attr
    if at["ceil_mode"] or at["layout"] != "NCHW":
        raise OpError("pool form")
    op_type = "MaxPool" if node.op == "max_pool2d" else "AveragePool"
    extra = {}
    if tuple(at["dilation"]) != (1, 1):
        if not onnx_opset.has_pool_dilations(w.opset, op_type):
            raise OpError("dilated pooling needs a newer opset")
        extra["dilations"] = list(at["dilation"])
    if node.op == "avg_pool2d":
        extra["count_include_pad"] = int(at["count_include_pad"])
    w.node(op_type, ins, outs, kernel_shape=list(at["pool_size"]), pads=list(at["padding"]),
           strides=list(at["strides"]), **extra)


def _emit_concat(w, node, ins, outs):
    w.node("Concat", ins, outs, axis=node.attr["axis"])


def _emit_split(w, node, ins, outs):
    at = node.attr
    dim = w.type_of(node.inputs[0]).shape[at["axis"]]
    points = (0,) + tuple(at["indices"]) + (dim,)
    sizes = [b - a for a, b in zip(points, points[1:])]
    if dims.is_symbolic(sizes):
        if not all(dims.equal_proved(s, sizes[0]) for s in sizes):
            raise OpError("a split along a symbolic size into unequal parts")
        sizes = len(sizes)  # equal parts: ONNX divides the dimension evenly
    spelling = onnx_opset.split(w.opset, sizes)
    inputs = [ins[0], *(w.constant(sizes, "split") for sizes in spelling.inputs)]
    w.node("Split", inputs, outs, axis=at["axis"], **spelling.attributes)


def _emit_transpose(w, node, ins, outs):
    w.node("Transpose", ins, outs, perm=list(node.attr["axes"]))


def _emit_reshape(w, node, ins, outs):
    """A Reshape to a constant target: a symbolic size is written ``0`` where it is the input's
    size on that axis, and one more ``-1`` (what the others leave); any other target has no
    constant form, and the rewrite is not applied."""
    source = w.type_of(node.inputs[0]).shape
    target = []
    for k, d in enumerate(node.attr["shape"]):
        if not dims.is_symbolic(d):
            target.append(int(d))
        elif k < len(source) and dims.equal_proved(d, source[k]):
            target.append(0)
        elif -1 not in target:
            target.append(-1)
        else:
            raise OpError("a reshape to two symbolic sizes the input does not have in place")
    w.node("Reshape", [ins[0], w.constant(np.asarray(target, np.int64), "shape")], outs)


def _emit_pad(w, node, ins, outs):
    at = node.attr
    if at["pad_mode"] != "constant":
        raise OpError(f"{at['pad_mode']} padding")
    width = at["pad_width"]
    spelling = onnx_opset.pad(w.opset, width[0::2], width[1::2], at["pad_value"], node.types[0].dtype)
    # the value's initializer is made before the pads': fresh names count up, and the models this
    # writer wrote before must come out the same
    operands = reversed(list(zip(spelling.inputs, ("pads", "pad_value"))))
    made = [w.constant(array, hint) for array, hint in operands]
    w.node("Pad", [ins[0], *reversed(made)], outs, mode="constant", **spelling.attributes)


def _emit_batch_norm(w, node, ins, outs):
    at = node.attr
    if at["axis"] != 1 or at["training"]:
        raise OpError("batch_norm form")
    w.node("BatchNormalization", ins, outs[:1], epsilon=float(at["epsilon"]))


def _emit_layer_norm(w, node, ins, outs):
    rank = len(node.types[0].shape)
    axes = tuple(node.attr["axes"])
    if not onnx_opset.has_layer_normalization(w.opset) or axes != tuple(range(axes[0], rank)):
        raise OpError("layer_norm form")
    w.node("LayerNormalization", ins, outs, axis=axes[0], epsilon=float(node.attr["epsilon"]))


def _emit_softmax(w, node, ins, outs):
    axis = node.attr["axis"]
    if not onnx_opset.softmax_over_axis(w.opset, axis, len(node.types[0].shape)):
        raise OpError("softmax form")
    w.node("Softmax", ins, outs, axis=axis)


def _emit_mean(w, node, ins, outs):
    at = node.attr
    spelling = onnx_opset.reduce_axes(w.opset, "ReduceMean", at["axis"])
    inputs = [ins[0], *(w.constant(axes, "axes") for axes in spelling.inputs)]
    w.node("ReduceMean", inputs, outs, keepdims=int(at["keepdims"]), **spelling.attributes)


EMITTERS = {
    **{op: _emit_simple for op in _SIMPLE},
    "gelu": _emit_gelu,
    "conv2d": emit_conv,
    "max_pool2d": _emit_pool,
    "avg_pool2d": _emit_pool,
    "concat": _emit_concat,
    "split": _emit_split,
    "permute_dims": _emit_transpose,
    "reshape": _emit_reshape,
    "pad": _emit_pad,
    "batch_norm": _emit_batch_norm,
    "layer_norm": _emit_layer_norm,
    "softmax": _emit_softmax,
    "mean": _emit_mean,
}


def emit(w, node, ins: list[str], outs: list[str]) -> None:
    """Write the engine ``node`` (operands named ``ins``) as ONNX nodes producing ``outs``."""
    emitter = EMITTERS.get(node.op)
    if emitter is None:
        raise OpError(f"no ONNX form of {node.op}")
    emitter(w, node, ins, outs)
