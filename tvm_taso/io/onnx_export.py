"""Relax → ONNX: ``relax_to_onnx(mod)`` writes one Relax function as an ONNX model.

The exporter walks the function's binding blocks (dataflow or not) in order. Parameters become
graph inputs with their static shapes and dtypes (weights kept as parameters by
``from_onnx(..., keep_params_in_input=True)`` become initializers again, read from the
function's ``params`` attribute); constants become deduplicated initializers; each binding
becomes one or more ONNX nodes through ``CONVERTERS``, a table from Relax op name to a small
converter; tuples, ``TupleGetItem`` and variable aliases only rename. The returned tensor, or
each tensor of a returned tuple, becomes a graph output ``output_<i>``.

``call_tir`` bindings that ``BlockBuilder.emit_te`` made from the TOPI functions in
``TE_FUNCTIONS`` (the ONNX importer emits Pad and Clip that way) are exported too: the exporter
guesses the TOPI arguments, rebuilds the TIR function and accepts the call only when it is
structurally equal to the one in the module.

Anything else raises :class:`ExportError`, which names the op and where it is, e.g.
``cannot export relax.nn.conv3d at @main/lv12``. Shapes must be static.
"""

from __future__ import annotations

import hashlib
from typing import Callable

import numpy as np
import onnx
import tvm_ffi
from onnx import TensorProto, helper, numpy_helper
from tvm import ir, relax, tirx, topi
from tvm.relax.utils import gen_call_tir_inputs

from tvm_taso.files import write_atomically
from tvm_taso.io import onnx_opset
from tvm_taso.ir.ops import OpError, _py

MIN_OPSET = onnx_opset.LAYER_NORMALIZATION_OP_SINCE  # layer_norm is written as the op


class ExportError(ValueError):
    """A Relax function, or a part of it, that has no ONNX equivalent here."""


DTYPES = {
    "bool": TensorProto.BOOL,
    "int8": TensorProto.INT8,
    "int16": TensorProto.INT16,
    "int32": TensorProto.INT32,
    "int64": TensorProto.INT64,
    "uint8": TensorProto.UINT8,
    "uint16": TensorProto.UINT16,
    "uint32": TensorProto.UINT32,
    "uint64": TensorProto.UINT64,
    "float16": TensorProto.FLOAT16,
    "bfloat16": TensorProto.BFLOAT16,
    "float32": TensorProto.FLOAT,
    "float64": TensorProto.DOUBLE,
}


def _onnx_dtype(dtype) -> int:
    if str(dtype) not in DTYPES:
        raise ExportError(f"dtype {dtype} has no ONNX equivalent here")
    return DTYPES[str(dtype)]


def _tensor(ty) -> tuple[tuple[int, ...], str]:
    """(static shape, dtype) of a Relax tensor type, else ExportError."""
    if not isinstance(ty, relax.TensorType) or ty.shape is None:
        raise ExportError(f"{ty} is not a tensor of known shape")
    dims = ty.shape.values if hasattr(ty.shape, "values") else ty.shape
    try:
        return tuple(int(d) for d in dims), str(ty.dtype)
    except (TypeError, ValueError):
        raise ExportError(f"{ty} has a symbolic shape; ONNX export needs static shapes") from None


def _shape(expr) -> tuple[int, ...]:
    return _tensor(expr.ty)[0]


def _dtype(expr) -> str:
    return _tensor(expr.ty)[1]


class _Exporter:
    """The ONNX graph under construction and the Relax variable → ONNX name environment."""

    def __init__(self, opset: int):
        self.opset = opset
        self.nodes: list[onnx.NodeProto] = []
        self.initializers: list[onnx.TensorProto] = []
        self.inputs: list[onnx.ValueInfoProto] = []
        self.env: dict = {}  # relax.Var -> ONNX name, or a (nested) list of names for tuples
        self.var = None  # the variable of the binding being converted
        self._used: set[str] = set()
        self._consts: dict = {}  # (dtype, shape, digest) -> initializer name

    def fresh(self, base: str) -> str:
        name, k = base, 0
        while name in self._used:
            k += 1
            name = f"{base}_{k}"
        self._used.add(name)
        return name

    def const(self, array, dtype=None) -> str:
        array = np.array(array, dtype=dtype, order="C")  # keeps 0-d arrays 0-d
        key = (str(array.dtype), array.shape, hashlib.sha1(array.tobytes()).digest())
        if key not in self._consts:
            self._consts[key] = name = self.fresh("const")
            self.initializers.append(numpy_helper.from_array(array, name))
        return self._consts[key]

    def node(self, op_type: str, inputs: list[str], outputs: int = 1, **attrs):
        outs = [self.fresh(self.var.name) for _ in range(outputs)]
        self.nodes.append(helper.make_node(op_type, inputs, outs, name=outs[0], **attrs))
        return outs[0] if outputs == 1 else outs

    def value(self, expr):
        """The ONNX name (or list of names, for a tuple) of an operand."""
        if isinstance(expr, relax.Var):
            if expr not in self.env:
                raise ExportError(f"variable {expr.name} is not defined in the function")
            return self.env[expr]
        if isinstance(expr, ir.GenericConst) and isinstance(expr.ty, relax.TensorType):
            return self.const(expr.value.numpy())
        if isinstance(expr, relax.ShapeExpr):
            return self.const(_py(expr.values), "int64")
        if isinstance(expr, relax.Tuple):
            return [self.value(f) for f in expr.fields]
        if isinstance(expr, relax.TupleGetItem):
            return self.value(expr.tuple_value)[expr.index]
        raise ExportError(f"operand {type(expr).__name__}")

    def tensor(self, expr) -> str:
        name = self.value(expr)
        if not isinstance(name, str):
            raise ExportError("a tuple where a tensor is expected")
        return name

    def scalar(self, value, like) -> str:
        """A 0-d constant of the dtype of ``like``."""
        return self.const(np.array(value, dtype=_dtype(like)))

    def int64(self, values) -> str:
        return self.const(np.array(values, dtype="int64").reshape(-1))


# -- converters: (exporter, call) -> ONNX name, or list of names for tuple results ----------


def _op(op_type: str) -> Callable:
    """An op that maps one to one on an ONNX op with the same operands."""
    return lambda ex, call: ex.node(op_type, [ex.tensor(a) for a in call.args])


def _rsqrt(ex, call):
    return ex.node("Reciprocal", [ex.node("Sqrt", [ex.tensor(call.args[0])])])


def _square(ex, call):
    x = ex.tensor(call.args[0])
    return ex.node("Mul", [x, x])


def _silu(ex, call):
    x = ex.tensor(call.args[0])
    return ex.node("Mul", [x, ex.node("Sigmoid", [x])])


def _gelu(approximate: str) -> Callable:
    def convert(ex, call):
        arg = call.args[0]
        x = ex.tensor(arg)
        if onnx_opset.has_gelu(ex.opset):
            return ex.node("Gelu", [x], approximate=approximate)
        if approximate == "none":  # 0.5 x (1 + erf(x / sqrt 2))
            inner = ex.node("Erf", [ex.node("Mul", [x, ex.scalar(1 / np.sqrt(2), arg)])])
        else:  # 0.5 x (1 + tanh(sqrt(2 / pi) (x + 0.044715 x^3)))
            cube = ex.node("Mul", [ex.node("Mul", [x, x]), x])
            poly = ex.node("Add", [x, ex.node("Mul", [cube, ex.scalar(0.044715, arg)])])
            inner = ex.node("Tanh", [ex.node("Mul", [poly, ex.scalar(np.sqrt(2 / np.pi), arg)])])
        half_x = ex.node("Mul", [x, ex.scalar(0.5, arg)])
        return ex.node("Mul", [half_x, ex.node("Add", [inner, ex.scalar(1.0, arg)])])

    return convert


def _leakyrelu(ex, call):
    return ex.node("LeakyRelu", [ex.tensor(call.args[0])], alpha=_py(call.attrs.alpha))


def _softmax(op_type: str) -> Callable:
    return lambda ex, call: ex.node(op_type, [ex.tensor(call.args[0])], axis=_py(call.attrs.axis))


def _not_equal(ex, call):
    return ex.node("Not", [ex.node("Equal", [ex.tensor(a) for a in call.args])])


def _with_out_dtype(ex, call, name: str) -> str:
    """Cast ``name`` to the binding's dtype where ``out_dtype`` made it differ from the data's."""
    out = _dtype(ex.var)
    return name if out == _dtype(call.args[0]) else ex.node("Cast", [name], to=_onnx_dtype(out))


def _matmul(ex, call):
    return _with_out_dtype(ex, call, ex.node("MatMul", [ex.tensor(a) for a in call.args]))


_LAYOUTS = {1: ("NCW", "OIW"), 2: ("NCHW", "OIHW")}


def _conv(ex, call):
    a = call.attrs
    w_shape = _shape(call.args[1])
    rank = len(w_shape) - 2
    if (_py(a.data_layout), _py(a.kernel_layout), _py(a.out_layout)) != (*_LAYOUTS[rank], _LAYOUTS[rank][0]):
        raise ExportError(f"layouts {a.data_layout}/{a.kernel_layout}/{a.out_layout}")
    name = ex.node(
        "Conv",
        [ex.tensor(call.args[0]), ex.tensor(call.args[1])],
        kernel_shape=list(w_shape[2:]),
        strides=list(_py(a.strides)),
        pads=list(_py(a.padding)),  # (begins..., ends...), as ONNX: (top, left, bottom, right) in 2-D
        dilations=list(_py(a.dilation)),
        group=_py(a.groups),
    )
    return _with_out_dtype(ex, call, name)


def _pool(op_type: str) -> Callable:
    def convert(ex, call):
        a = call.attrs
        pool_size = list(_py(a.pool_size))
        if (_py(a.layout), _py(a.out_layout)) != (_LAYOUTS[len(pool_size)][0],) * 2:
            raise ExportError(f"layout {a.layout}/{a.out_layout}")
        strides, pads, dilation = list(_py(a.strides)), list(_py(a.padding)), list(_py(a.dilation))
        ceil_mode = _ceil_mode(_shape(call.args[0])[2:], _shape(ex.var)[2:], pool_size, strides, pads, dilation)
        attrs = dict(kernel_shape=pool_size, strides=strides, pads=pads, ceil_mode=ceil_mode)
        if op_type == "AveragePool":
            attrs["count_include_pad"] = int(_py(a.count_include_pad))
        if onnx_opset.has_pool_dilations(ex.opset, op_type):
            attrs["dilations"] = dilation
        elif any(d != 1 for d in dilation):  # AveragePool: MaxPool has dilations at every opset exported
            raise ExportError(f"dilated average pooling needs opset >= {onnx_opset.POOL_DILATIONS_SINCE[op_type]}")
        return ex.node(op_type, [ex.tensor(call.args[0])], **attrs)

    return convert


def _ceil_mode(size_in, size_out, kernel, strides, pads, dilation) -> int:
    """ONNX's ceil_mode giving Relax's output size (the static type of the binding).

    TVM (like PyTorch and onnxruntime) drops a last ceil_mode window that would start in the
    end padding, where the ONNX spec's formula keeps it. Such a window only exists when the
    ceil formula rounds up, so floor mode then has exactly TVM's windows.
    """
    n = len(size_in)
    spans = [size_in[i] + pads[i] + pads[n + i] - dilation[i] * (kernel[i] - 1) - 1 for i in range(n)]
    for mode, rounded in ((0, lambda a, b: a // b), (1, lambda a, b: -(-a // b))):
        if [rounded(span, s) + 1 for span, s in zip(spans, strides)] == list(size_out):
            return mode
    raise ExportError("ceil_mode pooling whose output size ONNX computes differently on some axis")


def _adaptive_avg_pool2d(ex, call):
    a = call.attrs
    if (_py(a.layout), _py(a.out_layout)) != ("NCHW", "NCHW"):
        raise ExportError(f"layout {a.layout}/{a.out_layout}")
    x = ex.tensor(call.args[0])
    size_in, size_out = _shape(call.args[0])[2:], _shape(ex.var)[2:]
    if size_out == (1, 1):
        return ex.node("GlobalAveragePool", [x])
    if any(i % o for i, o in zip(size_in, size_out)):
        raise ExportError(f"output size {size_out} does not divide the input size {size_in}")
    kernel = [i // o for i, o in zip(size_in, size_out)]
    return ex.node("AveragePool", [x], kernel_shape=kernel, strides=kernel)


def _reduce_node(ex, op_type: str, x: str, axes, keepdims: bool) -> str:
    spelling = onnx_opset.reduce_axes(ex.opset, op_type, axes)
    return ex.node(op_type, [x, *map(ex.const, spelling.inputs)], keepdims=int(keepdims), **spelling.attributes)


def _axes(call) -> list[int]:
    axis = _py(call.attrs.axis)
    return list(range(len(_shape(call.args[0])))) if axis is None else list(axis)


def _reduce(op_type: str) -> Callable:
    return lambda ex, call: _reduce_node(
        ex, op_type, ex.tensor(call.args[0]), _axes(call), _py(call.attrs.keepdims)
    )


def _variance(ex, call):
    x, axes = ex.tensor(call.args[0]), _axes(call)
    diff = ex.node("Sub", [x, _reduce_node(ex, "ReduceMean", x, axes, True)])
    return _reduce_node(ex, "ReduceMean", ex.node("Mul", [diff, diff]), axes, _py(call.attrs.keepdims))


def _arg_reduce(op_type: str) -> Callable:
    def convert(ex, call):
        axis, x = _py(call.attrs.axis), ex.tensor(call.args[0])
        if axis is not None:
            return ex.node(op_type, [x], axis=axis, keepdims=int(_py(call.attrs.keepdims)))
        flat = ex.node(op_type, [ex.node("Reshape", [x, ex.int64([-1])])], axis=0)
        return ex.node("Reshape", [flat, ex.int64(_shape(ex.var))])

    return convert


def _layer_norm(ex, call):
    a = call.attrs
    x, gamma, beta = call.args
    if not (_py(a.scale) and _py(a.center)):
        # the docs say gamma/beta are then skipped; TVM 0.27's legalization applies them anyway
        raise ExportError("scale=False or center=False is ambiguous (TVM applies gamma and beta anyway)")
    rank = len(_shape(x))
    axes = sorted(ax % rank for ax in _py(a.axes))
    if axes != list(range(axes[0], rank)):
        raise ExportError(f"axes {_py(a.axes)} are not the trailing axes")
    inputs = [ex.tensor(x), ex.tensor(gamma), ex.tensor(beta)]
    return ex.node("LayerNormalization", inputs, axis=axes[0], epsilon=_py(a.epsilon))


def _batch_norm(ex, call):
    a = call.attrs
    x, gamma, beta, mean, var = call.args
    if _py(a.training):
        raise ExportError("training-mode batch_norm")
    if _py(a.axis) % len(_shape(x)) != 1:
        raise ExportError(f"axis {_py(a.axis)} (ONNX normalizes axis 1)")
    scale = ex.tensor(gamma) if _py(a.scale) else ex.const(np.ones(_shape(gamma), _dtype(gamma)))
    bias = ex.tensor(beta) if _py(a.center) else ex.const(np.zeros(_shape(beta), _dtype(beta)))
    inputs = [ex.tensor(x), scale, bias, ex.tensor(mean), ex.tensor(var)]
    y = ex.node("BatchNormalization", inputs, epsilon=_py(a.epsilon))
    return [y, ex.tensor(mean), ex.tensor(var)]  # inference mode passes the moving statistics through


def _concat(ex, call):
    axis = _py(call.attrs.axis)
    if axis is None:
        raise ExportError("axis=None")
    return ex.node("Concat", ex.value(call.args[0]), axis=axis)


def _split(ex, call):
    axis = _py(call.attrs.axis)
    sizes = [_tensor(ty)[0][axis] for ty in ex.var.ty.fields]
    spelling = onnx_opset.split(ex.opset, sizes)
    inputs = [ex.tensor(call.args[0]), *map(ex.const, spelling.inputs)]
    return ex.node("Split", inputs, outputs=len(sizes), axis=axis, **spelling.attributes)


def _strided_slice(ex, call):
    x, axes, begin, end, *strides = call.args
    if not all(isinstance(t, relax.Tuple) for t in (axes, begin, end, *strides)):
        raise ExportError("begin/end/strides given as tensors")
    inputs = [ex.tensor(x)] + [ex.int64(_py(t.fields)) for t in (begin, end, axes, *strides)]
    return ex.node("Slice", inputs)


def _take(ex, call):
    data, indices = call.args
    axis = _py(call.attrs.axis) or 0  # Relax takes axis=None from 1-D data only
    idx, dim = ex.tensor(indices), _shape(data)[axis]
    if _py(call.attrs.mode) == "wrap":
        idx = ex.node("Mod", [idx, ex.scalar(dim, indices)])
    elif _py(call.attrs.mode) == "clip":
        idx = ex.node("Clip", [idx, ex.scalar(0, indices), ex.scalar(dim - 1, indices)])
    return ex.node("Gather", [ex.tensor(data), idx], axis=axis)


def _reshape_to_output(ex, call):
    """reshape, flatten, expand_dims, squeeze: a Reshape to the binding's static shape."""
    shape = _shape(ex.var)
    attrs = {"allowzero": 1} if 0 in shape else {}
    return ex.node("Reshape", [ex.tensor(call.args[0]), ex.int64(shape)], **attrs)


def _permute_dims(ex, call):
    axes = _py(call.attrs.axes)
    perm = list(reversed(range(len(_shape(call.args[0]))))) if axes is None else list(axes)
    return ex.node("Transpose", [ex.tensor(call.args[0])], perm=perm)


def _broadcast_to(ex, call):
    return ex.node("Expand", [ex.tensor(call.args[0]), ex.int64(_shape(ex.var))])


def _astype(ex, call):
    return ex.node("Cast", [ex.tensor(call.args[0])], to=_onnx_dtype(_py(call.attrs.dtype)))


def _clip(ex, call):
    x, lo, hi = call.args
    return ex.node("Clip", [ex.tensor(x), ex.scalar(_py(lo), x), ex.scalar(_py(hi), x)])


_PAD_MODES = {"constant": "constant", "reflect": "reflect", "replicate": "edge"}


def _emit_pad(ex, data, before, after, value, mode="constant") -> str:
    x = ex.tensor(data)
    spelling = onnx_opset.pad(ex.opset, before, after, value if mode == "constant" else None, _dtype(data))
    return ex.node("Pad", [x, *map(ex.const, spelling.inputs)], mode=mode, **spelling.attributes)


def _pad(ex, call):
    a = call.attrs
    width, mode = _py(a.pad_width), _py(a.pad_mode)
    if mode not in _PAD_MODES:
        raise ExportError(f"pad_mode {mode}")
    return _emit_pad(ex, call.args[0], width[0::2], width[1::2], _py(a.pad_value), _PAD_MODES[mode])


def _stack(ex, call):
    axis = _py(call.attrs.axis)
    parts = [ex.node("Unsqueeze", [name, ex.int64([axis])]) for name in ex.value(call.args[0])]
    return ex.node("Concat", parts, axis=axis)


def _shape_of(ex, call):
    return ex.int64(_shape(call.args[0]))


def _same(ex, call):
    return ex.value(call.args[0])


CONVERTERS: dict[str, Callable] = {
    # elementwise
    "relax.add": _op("Add"),
    "relax.subtract": _op("Sub"),
    "relax.multiply": _op("Mul"),
    "relax.divide": _op("Div"),
    "relax.power": _op("Pow"),
    "relax.maximum": _op("Max"),
    "relax.minimum": _op("Min"),
    "relax.equal": _op("Equal"),
    "relax.not_equal": _not_equal,
    "relax.less": _op("Less"),
    "relax.less_equal": _op("LessOrEqual"),
    "relax.greater": _op("Greater"),
    "relax.greater_equal": _op("GreaterOrEqual"),
    "relax.logical_and": _op("And"),
    "relax.logical_or": _op("Or"),
    "relax.logical_not": _op("Not"),
    "relax.where": _op("Where"),
    "relax.nn.relu": _op("Relu"),
    "relax.nn.leakyrelu": _leakyrelu,
    "relax.sigmoid": _op("Sigmoid"),
    "relax.nn.silu": _silu,
    "relax.tanh": _op("Tanh"),
    "relax.erf": _op("Erf"),
    "relax.nn.gelu": _gelu("none"),
    "relax.nn.gelu_tanh": _gelu("tanh"),
    "relax.exp": _op("Exp"),
    "relax.log": _op("Log"),
    "relax.sqrt": _op("Sqrt"),
    "relax.rsqrt": _rsqrt,
    "relax.square": _square,
    "relax.negative": _op("Neg"),
    "relax.abs": _op("Abs"),
    "relax.floor": _op("Floor"),
    "relax.ceil": _op("Ceil"),
    "relax.isnan": _op("IsNaN"),
    "relax.clip": _clip,
    "relax.astype": _astype,
    # kernels
    "relax.matmul": _matmul,
    "relax.nn.conv1d": _conv,
    "relax.nn.conv2d": _conv,
    "relax.nn.max_pool1d": _pool("MaxPool"),
    "relax.nn.max_pool2d": _pool("MaxPool"),
    "relax.nn.avg_pool1d": _pool("AveragePool"),
    "relax.nn.avg_pool2d": _pool("AveragePool"),
    "relax.nn.adaptive_avg_pool2d": _adaptive_avg_pool2d,
    # normalizations and reductions
    "relax.nn.softmax": _softmax("Softmax"),
    "relax.nn.log_softmax": _softmax("LogSoftmax"),
    "relax.nn.layer_norm": _layer_norm,
    "relax.nn.batch_norm": _batch_norm,
    "relax.mean": _reduce("ReduceMean"),
    "relax.sum": _reduce("ReduceSum"),
    "relax.max": _reduce("ReduceMax"),
    "relax.min": _reduce("ReduceMin"),
    "relax.prod": _reduce("ReduceProd"),
    "relax.variance": _variance,
    "relax.argmax": _arg_reduce("ArgMax"),
    "relax.argmin": _arg_reduce("ArgMin"),
    # data movement
    "relax.concat": _concat,
    "relax.stack": _stack,
    "relax.split": _split,
    "relax.strided_slice": _strided_slice,
    "relax.take": _take,
    "relax.reshape": _reshape_to_output,
    "relax.flatten": _reshape_to_output,
    "relax.expand_dims": _reshape_to_output,
    "relax.squeeze": _reshape_to_output,
    "relax.permute_dims": _permute_dims,
    "relax.broadcast_to": _broadcast_to,
    "relax.nn.pad": _pad,
    # shapes (static here, so constants)
    "relax.shape_of": _shape_of,
    "relax.shape_to_tensor": _same,
}


# -- call_tir of TOPI functions emitted by BlockBuilder.emit_te ------------------------------


def _guess_pad(func, args, out):
    """topi.nn.pad's arguments, read off its TIR: the load offsets and the fill value."""
    if len(args) != 1:
        return None
    loads, fills = [], []
    tvm_ffi.structural_walk(
        func.body,
        [
            (ir.TensorLoad, loads.append),
            (ir.Call, lambda c: fills.append(c) if getattr(c.op, "name", "") == "prim.if_then_else" else None),
        ],
    )
    if not loads:
        return None
    before = [int(i.b) if isinstance(i, tirx.Sub) and isinstance(i.b, tirx.IntImm) else 0 for i in loads[0].indices]
    after = [o - i - b for o, i, b in zip(_shape(out), _shape(args[0]), before)]
    value = _py(fills[0].args[2]) if fills else 0.0
    return (args[0], before, after, value)


def _guess_same(func, args, out):
    return tuple(args)


# topi function -> (guess of its arguments from (PrimFunc, call_tir args, binding var) or None,
#                   converter taking those arguments)
TE_FUNCTIONS: dict[Callable, tuple[Callable, Callable]] = {
    topi.nn.pad: (_guess_pad, _emit_pad),
    topi.maximum: (_guess_same, lambda ex, a, b: ex.node("Max", [ex.tensor(a), ex.tensor(b)])),
    topi.minimum: (_guess_same, lambda ex, a, b: ex.node("Min", [ex.tensor(a), ex.tensor(b)])),
}


def _call_tir(ex, call, mod):
    gvar, args = call.args[0], call.args[1]
    if len(call.args) > 2 or not isinstance(args, relax.Tuple):
        raise ExportError("call_tir with symbolic arguments")
    func = mod[gvar]
    for te_func, (guess, convert) in TE_FUNCTIONS.items():
        te_args = guess(func, list(args.fields), ex.var)
        if te_args is None:
            continue
        try:
            rebuilt = gen_call_tir_inputs(te_func, *te_args)[0]
        except Exception:  # noqa: BLE001 - a wrong guess may not even build
            continue
        if tvm_ffi.structural_equal(rebuilt.without_attr("global_symbol"), func.without_attr("global_symbol")):
            return convert(ex, *te_args)
    raise ExportError("its TIR function is not one of the TOPI functions tvm-taso recognizes")


# -- the walk ----------------------------------------------------------------------------------


def _what(value) -> str:
    if isinstance(value, relax.Call) and isinstance(value.op, ir.Op):
        if value.op.name == "relax.call_tir" and isinstance(value.args[0], ir.GlobalVar):
            return f"relax.call_tir({value.args[0].name_hint})"
        return value.op.name
    if isinstance(value, relax.Call):
        return f"a call to {value.op}"
    return f"relax.{type(value).__name__}"


def _convert_binding(ex, binding, mod):
    value = binding.value
    if isinstance(binding, relax.MatchCast):
        _tensor(binding.var.ty)
        return ex.value(value)
    if isinstance(value, (relax.Var, ir.GenericConst, relax.ShapeExpr, relax.Tuple, relax.TupleGetItem)):
        return ex.value(value)
    if isinstance(value, relax.Call) and isinstance(value.op, ir.Op):
        if value.op.name == "relax.call_tir":
            return _call_tir(ex, value, mod)
        if value.op.name in CONVERTERS:
            if isinstance(binding.var.ty, relax.TensorType):
                _tensor(binding.var.ty)
            return CONVERTERS[value.op.name](ex, value)
    if isinstance(value, relax.Call) and not isinstance(value.op, ir.Op):
        raise ExportError("only calls to Relax operators are exported")
    raise ExportError("tvm-taso has no ONNX converter for it")


def _flatten(names) -> list[str]:
    return [names] if isinstance(names, str) else [n for x in names for n in _flatten(x)]


def relax_to_onnx(mod, path=None, opset: int = MIN_OPSET, func: str = "main") -> onnx.ModelProto:
    """The Relax function ``func`` of ``mod`` as an ONNX model; also written to ``path`` if given.

    Raises :class:`ExportError` when a binding has no ONNX equivalent or a shape is symbolic.
    The file is written to a temporary name first and renamed, so no partial file is left.
    """
    if not MIN_OPSET <= opset <= onnx.defs.onnx_opset_version():
        raise ValueError(f"opset {opset}: supported are {MIN_OPSET}..{onnx.defs.onnx_opset_version()}")
    if func not in [g.name_hint for g in mod.functions] or not isinstance(mod[func], relax.Function):
        raise ExportError(f"the module has no Relax function @{func}")
    fn = mod[func]
    ex = _Exporter(opset)
    n_outputs = len(_flatten_types(fn.body.body.ty))
    for i in range(n_outputs):
        ex.fresh(f"output_{i}")
    attrs = fn.attrs or {}
    num_input = int(attrs["num_input"]) if "num_input" in attrs and "params" in attrs else len(fn.params)
    for i, param in enumerate(fn.params):
        try:
            shape, dtype = _tensor(param.ty)
        except ExportError as err:
            raise ExportError(f"cannot export @{func}: parameter {param.name}: {err}") from None
        name = ex.env[param] = ex.fresh(param.name)
        if i < num_input:
            ex.inputs.append(helper.make_tensor_value_info(name, _onnx_dtype(dtype), shape))
        else:  # a weight that from_onnx(keep_params_in_input=True) kept in the "params" attribute
            ex.initializers.append(numpy_helper.from_array(attrs["params"][i - num_input].numpy(), name))

    for block in fn.body.blocks:
        for binding in block.bindings:
            ex.var = binding.var
            try:
                ex.env[binding.var] = _convert_binding(ex, binding, mod)
            except (ExportError, OpError) as err:
                where = f"cannot export {_what(binding.value)} at @{func}/{binding.var.name}"
                raise ExportError(f"{where}: {err}") from None

    result = _flatten(ex.value(fn.body.body))
    outputs = _outputs(ex, result, _flatten_types(fn.body.body.ty))
    used = {name for node in ex.nodes for name in node.input}
    initializers = [t for t in ex.initializers if t.name in used]  # drops unused weight params
    graph = helper.make_graph(ex.nodes, func, ex.inputs, outputs, initializers)
    opsets = [helper.make_opsetid("", opset)]
    model = helper.make_model(graph, opset_imports=opsets, producer_name="tvm-taso")
    model.ir_version = helper.find_min_ir_version_for(opsets)
    if path is not None:
        write_atomically(path, lambda tmp: onnx.save_model(model, tmp))
    return model


def _flatten_types(ty) -> list:
    if isinstance(ty, relax.TupleType):
        return [t for field in ty.fields for t in _flatten_types(field)]
    return [ty]


def _outputs(ex, names: list[str], types: list) -> list[onnx.ValueInfoProto]:
    """Graph outputs output_<i>: the producing node's output renamed, else an Identity."""
    produced = {o for n in ex.nodes for o in n.output}
    rename: dict[str, str] = {}
    infos = []
    for i, (name, ty) in enumerate(zip(names, types)):
        out = f"output_{i}"
        if name in produced and name not in rename:
            rename[name] = out
        else:
            ex.nodes.append(helper.make_node("Identity", [name], [out], name=out))
        shape, dtype = _tensor(ty)
        infos.append(helper.make_tensor_value_info(out, _onnx_dtype(dtype), shape))
    for node in ex.nodes:
        for k, n in enumerate(node.input):
            node.input[k] = rename.get(n, n)
        for k, n in enumerate(node.output):
            node.output[k] = rename.get(n, n)
    return infos

