"""The operators tvm-taso understands: one table, one entry per Relax op.

Each :class:`OpSpec` says how to read the op from a Relax call, how to build it back, its
output types (shape inference), its numpy reference semantics (used to fold weights and to
check rules), its FLOPs, how TVM's FuseOps treats it (``kind``), which attributes a rule must
give and which ones Relax stores differently, and how the verifier's algebra models it. Rule
files use the short names (``conv2d``, ``matmul``, ...). An op missing here is *opaque*: the
optimizer keeps it as it is and never rewrites through it.
"""

from __future__ import annotations

import math
from dataclasses import dataclass, field
from typing import Callable

import numpy as np

from tvm_taso.errors import OpError
from tvm_taso.ir import dims, group_merge

# Kinds, in the order of TVM's OpPatternKind: what FuseOps may fold into what.
ELEMWISE = "elemwise"  # fuses into its producer's kernel
INJECTIVE = "injective"  # concat/split/transpose: a kernel unless fused with elementwise neighbours
KERNEL = "kernel"  # conv2d/matmul/pool: always a kernel; elementwise consumers fuse into it
REDUCE = "reduce"  # softmax/layer_norm/mean: a kernel of its own
VIEW = "view"  # reshape: a runtime view, no kernel


@dataclass(frozen=True)
class TensorType:
    """Shape and dtype of one tensor. A dimension is an ``int`` or a symbolic size
    (:class:`~tvm_taso.ir.dims.SymDim`: ``seq_len``, ``seq_len * 2``)."""

    shape: tuple
    dtype: str

    @property
    def symbolic(self) -> bool:
        return dims.is_symbolic(self.shape)

    def at(self, point) -> "TensorType":
        """This type with its symbols at the sizes ``point`` (see :func:`dims.value`)."""
        return TensorType(dims.value(self.shape, point), self.dtype) if self.symbolic else self

    @property
    def size(self):
        return math.prod(self.shape, start=1)

    @property
    def nbytes(self) -> int:
        return self.size * np.dtype(self.dtype).itemsize

    def __str__(self) -> str:
        return f"{self.dtype}{list(self.shape)}"


# How the verifier's algebra models an attribute that is not one of its sorts
# ("Int", "Real", "Bool", "Tup", or "Ints": a list of Ints whose length counts outputs).
FIXED = "fixed"  # only the default value is modeled
IGNORED = "ignored"  # does not change the value computed


@dataclass(frozen=True)
class AlgebraOp:
    """How the verifier (:mod:`tvm_taso.verify`) models an op."""

    function: str | None  # its function symbol in the algebra; None: encoded by others (split: slices)
    attrs: dict  # attribute -> sort, FIXED or IGNORED, in the function's argument order

    @property
    def sorts(self) -> tuple[str, ...]:
        """Sorts of the attribute arguments of ``function``."""
        return tuple(s for s in self.attrs.values() if s not in (FIXED, IGNORED))


@dataclass(frozen=True)
class OpSpec:
    name: str
    relax_name: str
    kind: str
    build: Callable  # (args: list[relax.Expr], attrs: dict) -> relax.Expr
    infer: Callable  # (types: list[TensorType], attrs: dict) -> list[TensorType]
    evaluate: Callable  # (arrays: list[np.ndarray], attrs: dict) -> list[np.ndarray]
    defaults: dict = field(default_factory=dict)
    flops: Callable = None  # (types, out_types, attrs) -> float
    arity: int | None = 1  # None: variadic (concat)
    read: Callable = None  # (call) -> (tensor args, attrs); default: args as is, attrs by field
    required: frozenset = frozenset()  # attributes without a default, which a rule's target must give
    # Attributes Relax does not store under that name and value (a rule cannot match them with
    # ``has_attr``): split keeps ``indices_or_sections`` (a count or int64 cut points), reshape
    # takes its shape as an operand, permute_dims stores ``axes=None`` for the full reversal.
    not_relax_attrs: frozenset = frozenset()
    # operands Relax's call takes after the tensors, given by attributes here (reshape's shape)
    trailing_operands: int = 0
    algebra: AlgebraOp | None = None  # None: outside the verifier's algebra

    @property
    def attribute_names(self) -> set[str]:
        """Every attribute a rule may give."""
        return set(self.defaults) | self.required


def _norm_axis(axis: int, rank: int) -> int:
    if not -rank <= axis < rank:
        raise OpError(f"axis {axis} out of range for rank {rank}")
    return axis % rank


def _broadcast(types: list[TensorType], attrs: dict) -> list[TensorType]:
    a, b = types
    if a.dtype != b.dtype:
        raise OpError(f"dtype mismatch {a.dtype} vs {b.dtype}")
    return [TensorType(dims.broadcast_shapes(a.shape, b.shape), a.dtype)]


def _same(types, attrs):
    return [types[0]]


def _elementwise_flops(types, outs, attrs):
    return float(outs[0].size)


def _matmul_infer(types, attrs):
    a, b = types
    if a.dtype != b.dtype or len(a.shape) < 1 or len(b.shape) < 1:
        raise OpError("matmul operands")
    sa, sb = list(a.shape), list(b.shape)
    if len(sa) == 1 or len(sb) == 1:
        raise OpError("matmul with vectors is not handled")
    if sa[-1] != sb[-2]:
        raise OpError(f"matmul reduction dims {sa[-1]} != {sb[-2]}")
    batch = dims.broadcast_shapes(tuple(sa[:-2]), tuple(sb[:-2]))
    return [TensorType(batch + (sa[-2], sb[-1]), a.dtype)]


def _matmul_flops(types, outs, attrs):
    return 2.0 * outs[0].size * types[0].shape[-1]


def _conv2d_infer(types, attrs):
    x, w = types
    if len(x.shape) != 4 or len(w.shape) != 4 or x.dtype != w.dtype:
        raise OpError("conv2d needs NCHW data and OIHW weights of one dtype")
    n, c, h, wd = x.shape
    o, i, kh, kw = w.shape
    g = attrs["groups"]
    if min(attrs["padding"]) < 0:
        raise OpError("negative padding")
    if c != i * g or o % g:
        raise OpError(f"conv2d channels: data {c}, weight {i}x{g} groups")
    st, pad, dil = attrs["strides"], attrs["padding"], attrs["dilation"]
    oh = (h + pad[0] + pad[2] - dil[0] * (kh - 1) - 1) // st[0] + 1
    ow = (wd + pad[1] + pad[3] - dil[1] * (kw - 1) - 1) // st[1] + 1
    if oh <= 0 or ow <= 0:
        raise OpError("conv2d output is empty")
    return [TensorType((n, o, oh, ow), x.dtype)]


def _conv2d_flops(types, outs, attrs):
    _, i, kh, kw = types[1].shape
    return 2.0 * outs[0].size * i * kh * kw


def windows(x: np.ndarray, kh, kw, strides, dilation):
    """View of x (N,C,H,W) as (N,C,OH,OW,kh,kw) sliding windows."""
    n, c, h, w = x.shape
    oh = (h - dilation[0] * (kh - 1) - 1) // strides[0] + 1
    ow = (w - dilation[1] * (kw - 1) - 1) // strides[1] + 1
    s = x.strides
    return np.lib.stride_tricks.as_strided(
        x,
        shape=(n, c, oh, ow, kh, kw),
        strides=(s[0], s[1], s[2] * strides[0], s[3] * strides[1], s[2] * dilation[0], s[3] * dilation[1]),
        writeable=False,
    )


def pad_hw(x, padding, value=0.0):
    """x (N,C,H,W) padded by (top, left, bottom, right) with ``value``."""
    t, l, b, r = padding
    n, c, h, w = x.shape
    # np.pad costs ~10x this on the tiny tensors the rule generator evaluates by the million
    out = np.full((n, c, h + t + b, w + l + r), value, dtype=x.dtype)
    out[:, :, t : t + h, l : l + w] = x
    return out


def _conv2d_eval(arrays, attrs):
    x, w = arrays
    g = attrs["groups"]
    xp = pad_hw(x, attrs["padding"])
    o, i, kh, kw = w.shape
    win = windows(xp, kh, kw, attrs["strides"], attrs["dilation"])
    n, _, oh, ow = win.shape[:4]
    outs = []
    og = o // g
    for k in range(g):
        wg = w[k * og : (k + 1) * og]
        xg = win[:, k * i : (k + 1) * i]
        outs.append(np.einsum("nchwij,ocij->nohw", xg, wg, optimize=True))
    return [np.concatenate(outs, axis=1)]


def _pool_infer(types, attrs):
    (x,) = types
    if len(x.shape) != 4:
        raise OpError("pool2d needs NCHW data")
    n, c, h, w = x.shape
    kh, kw = attrs["pool_size"]
    st, pad, dil = attrs["strides"], attrs["padding"], attrs["dilation"]
    if attrs["ceil_mode"]:
        raise OpError("ceil_mode pooling is not handled")
    if min(attrs["padding"]) < 0 or kh <= 0 or kw <= 0:
        raise OpError("negative padding or empty pooling window")
    oh = (h + pad[0] + pad[2] - dil[0] * (kh - 1) - 1) // st[0] + 1
    ow = (w + pad[1] + pad[3] - dil[1] * (kw - 1) - 1) // st[1] + 1
    if oh <= 0 or ow <= 0:
        raise OpError("pool2d output is empty")
    return [TensorType((n, c, oh, ow), x.dtype)]


def _pool_flops(types, outs, attrs):
    kh, kw = attrs["pool_size"]
    return float(outs[0].size * kh * kw)


def _max_pool_eval(arrays, attrs):
    (x,) = arrays
    kh, kw = attrs["pool_size"]
    xp = pad_hw(x, attrs["padding"], -np.inf)
    return [windows(xp, kh, kw, attrs["strides"], attrs["dilation"]).max(axis=(4, 5))]


def _avg_pool_eval(arrays, attrs):
    (x,) = arrays
    kh, kw = attrs["pool_size"]
    xp = pad_hw(x, attrs["padding"])
    total = windows(xp, kh, kw, attrs["strides"], attrs["dilation"]).sum(axis=(4, 5))
    if attrs["count_include_pad"]:
        return [total / (kh * kw)]
    ones = pad_hw(np.ones((1, 1) + x.shape[2:], dtype=x.dtype), attrs["padding"])
    count = windows(ones, kh, kw, attrs["strides"], attrs["dilation"]).sum(axis=(4, 5))
    return [total / count]


def _concat_infer(types, attrs):
    if len(types) < 1:
        raise OpError("concat of nothing")
    rank = len(types[0].shape)
    axis = _norm_axis(attrs["axis"], rank)
    for t in types[1:]:
        if len(t.shape) != rank or t.dtype != types[0].dtype:
            raise OpError("concat operands differ in rank or dtype")
        if any(t.shape[d] != types[0].shape[d] for d in range(rank) if d != axis):
            raise OpError("concat operands differ off the axis")
    shape = list(types[0].shape)
    shape[axis] = sum(t.shape[axis] for t in types)
    return [TensorType(tuple(shape), types[0].dtype)]


def _split_infer(types, attrs):
    (x,) = types
    axis = _norm_axis(attrs["axis"], len(x.shape))
    points = (0,) + tuple(attrs["indices"]) + (x.shape[axis],)
    if any(b <= a for a, b in zip(points, points[1:])):
        raise OpError(f"split indices {attrs['indices']} do not cut dim {x.shape[axis]}")
    outs = []
    for a, b in zip(points, points[1:]):
        shape = list(x.shape)
        shape[axis] = b - a
        outs.append(TensorType(tuple(shape), x.dtype))
    return outs


def _permute_infer(types, attrs):
    (x,) = types
    axes = attrs["axes"]
    if sorted(axes) != list(range(len(x.shape))):
        raise OpError(f"axes {axes} are not a permutation of rank {len(x.shape)}")
    return [TensorType(tuple(x.shape[a] for a in axes), x.dtype)]


def _reshape_infer(types, attrs):
    (x,) = types
    shape = tuple(attrs["shape"])
    if any(d <= 0 for d in shape) or math.prod(shape) != x.size:
        raise OpError(f"reshape {x} to {shape}")
    return [TensorType(shape, x.dtype)]


def _pad_infer(types, attrs):
    (x,) = types
    pw = attrs["pad_width"]
    if len(pw) != 2 * len(x.shape) or any(p < 0 for p in pw):
        raise OpError(f"pad_width {pw} for rank {len(x.shape)}")
    return [TensorType(tuple(d + pw[2 * i] + pw[2 * i + 1] for i, d in enumerate(x.shape)), x.dtype)]


def _batch_norm_infer(types, attrs):
    x = types[0]
    axis = _norm_axis(attrs["axis"], len(x.shape))
    for t in types[1:]:
        if t.shape != (x.shape[axis],) or t.dtype != x.dtype:
            raise OpError("batch_norm parameter shapes")
    return [x, types[3], types[4]]


def _batch_norm_eval(arrays, attrs):
    x, gamma, beta, mean, var = arrays
    if attrs["training"]:
        raise OpError("training-mode batch_norm is not evaluated")
    axis = _norm_axis(attrs["axis"], x.ndim)
    shape = [1] * x.ndim
    shape[axis] = -1
    y = (x - mean.reshape(shape)) / np.sqrt(var.reshape(shape) + attrs["epsilon"])
    if attrs["scale"]:
        y = y * gamma.reshape(shape)
    if attrs["center"]:
        y = y + beta.reshape(shape)
    return [y, mean, var]


def _layer_norm_eval(arrays, attrs):
    x, gamma, beta = arrays
    axes = tuple(attrs["axes"])
    mean = x.mean(axis=axes, keepdims=True)
    var = x.var(axis=axes, keepdims=True)
    y = (x - mean) / np.sqrt(var + attrs["epsilon"])
    if attrs["scale"]:
        y = y * gamma
    if attrs["center"]:
        y = y + beta
    return [y]


def _rms_norm_eval(arrays, attrs):
    x, gamma = arrays
    axes = tuple(attrs["axes"])
    return [x / np.sqrt(np.mean(x * x, axis=axes, keepdims=True) + attrs["epsilon"]) * gamma]


def _softmax_eval(arrays, attrs):
    (x,) = arrays
    e = np.exp(x - x.max(axis=attrs["axis"], keepdims=True))
    return [e / e.sum(axis=attrs["axis"], keepdims=True)]


def _erf(x):
    from scipy.special import erf

    return erf(x)


def _gelu(x):
    return 0.5 * x * (1.0 + _erf(x / math.sqrt(2.0)))


def _mean_infer(types, attrs):
    (x,) = types
    axes = {_norm_axis(a, len(x.shape)) for a in attrs["axis"]}
    if attrs["keepdims"]:
        shape = tuple(1 if i in axes else d for i, d in enumerate(x.shape))
    else:
        shape = tuple(d for i, d in enumerate(x.shape) if i not in axes)
    return [TensorType(shape, x.dtype)]


# -- reading and building Relax calls --------------------------------------------------------


def _py(value):
    """A Relax attribute value as a plain, hashable Python value."""
    from tvm import tirx

    if value is None or isinstance(value, (bool, int, float, str)):
        return value
    if isinstance(value, tirx.IntImm):
        return bool(value.value) if str(value.ty.dtype) == "bool" else int(value.value)
    if isinstance(value, tirx.FloatImm):
        return float(value.value)
    if isinstance(value, (list, tuple)) or type(value).__name__ == "Array":
        return tuple(_py(v) for v in value)
    if isinstance(value, np.dtype) or type(value).__name__ in ("DataType", "dtype"):
        return str(value)
    if isinstance(value, tirx.Var) or type(value).__name__ in dims.EXPRESSIONS:
        return dims.from_prim(value)  # a symbolic size (a reshape's target, split points)
    raise OpError(f"attribute value {value!r} of type {type(value).__name__}")


def _attr_reader(*fields):
    def read(call):
        return list(call.args), {f: _py(getattr(call.attrs, f)) for f in fields}

    return read


def _relax_op():
    from tvm import relax

    return relax.op


def _unary(fn_name, numpy_fn):
    def build(args, attrs):
        op = _relax_op()
        fn = getattr(op.nn, fn_name, None) or getattr(op, fn_name)
        return fn(*args)

    return dict(build=build, infer=_same, evaluate=lambda a, at: [numpy_fn(a[0])], flops=_elementwise_flops)


def _binary(fn_name, numpy_fn):
    def build(args, attrs):
        return getattr(_relax_op(), fn_name)(*args)

    return dict(
        build=build, infer=_broadcast, evaluate=lambda a, at: [numpy_fn(a[0], a[1])], flops=_elementwise_flops, arity=2
    )


def _build_conv2d(args, attrs):
    return _relax_op().nn.conv2d(args[0], args[1], **attrs)


def _build_pool(name):
    def build(args, attrs):
        return getattr(_relax_op().nn, name)(args[0], **attrs)

    return build


def _read_concat(call):
    from tvm import relax

    (tup,) = call.args
    if not isinstance(tup, relax.Tuple):
        raise OpError("concat of a tuple variable")
    return list(tup.fields), {"axis": _py(call.attrs.axis)}


def _read_split(call):
    x = call.args[0]
    axis = _py(call.attrs.axis)
    ios = _py(call.attrs.indices_or_sections)
    if isinstance(ios, int):
        ty = tensor_type(x.ty)
        dim = ty.shape[_norm_axis(axis, len(ty.shape))]
        if dim % ios:
            raise OpError("uneven split")
        ios = tuple(dim // ios * k for k in range(1, ios))
    return [x], {"indices": tuple(ios), "axis": axis}


def _read_permute(call):
    x = call.args[0]
    axes = _py(call.attrs.axes)
    if axes is None:
        axes = tuple(reversed(range(len(tensor_type(x.ty).shape))))
    return [x], {"axes": tuple(axes)}


def _read_reshape(call):
    from tvm import relax

    x, shape = call.args
    if not isinstance(shape, relax.ShapeExpr):
        raise OpError("reshape to a shape variable")
    return [x], {"shape": tuple(_py(v) for v in shape.values)}


def _split_eval(arrays, attrs):
    return list(np.split(arrays[0], list(attrs["indices"]), axis=attrs["axis"]))


def _pad_eval(arrays, attrs):
    (x,) = arrays
    pw = attrs["pad_width"]
    if attrs["pad_mode"] != "constant":
        raise OpError("only constant padding is evaluated")
    return [np.pad(x, [(pw[2 * i], pw[2 * i + 1]) for i in range(x.ndim)], constant_values=attrs["pad_value"])]


def _merge_groups_infer(types, attrs):
    (w,) = types
    try:
        return [TensorType(group_merge.merged_shape(w.shape, attrs["groups"], attrs["factor"]), w.dtype)]
    except ValueError as err:
        raise OpError(str(err)) from None


def _spec(name, relax_name, kind, **kw) -> OpSpec:
    return OpSpec(name=name, relax_name=relax_name, kind=kind, **kw)


_CONV_DEFAULTS = dict(
    strides=(1, 1),
    padding=(0, 0, 0, 0),
    dilation=(1, 1),
    groups=1,
    data_layout="NCHW",
    kernel_layout="OIHW",
    out_layout="NCHW",
    out_dtype=None,
)
_POOL_DEFAULTS = dict(
    strides=(1, 1),
    padding=(0, 0, 0, 0),
    dilation=(1, 1),
    ceil_mode=False,
    count_include_pad=False,
    layout="NCHW",
    out_layout="NCHW",
)

OPS: dict[str, OpSpec] = {
    s.name: s
    for s in [
        _spec("add", "relax.add", ELEMWISE, **_binary("add", np.add), algebra=AlgebraOp("add", {})),
        _spec("subtract", "relax.subtract", ELEMWISE, **_binary("subtract", np.subtract)),
        _spec(
            "multiply", "relax.multiply", ELEMWISE, **_binary("multiply", np.multiply), algebra=AlgebraOp("multiply", {})
        ),
        _spec("divide", "relax.divide", ELEMWISE, **_binary("divide", np.divide)),
        _spec(
            "relu", "relax.nn.relu", ELEMWISE, **_unary("relu", lambda x: np.maximum(x, 0)), algebra=AlgebraOp("relu", {})
        ),
        _spec("sigmoid", "relax.sigmoid", ELEMWISE, **_unary("sigmoid", lambda x: 1 / (1 + np.exp(-x)))),
        _spec("tanh", "relax.tanh", ELEMWISE, **_unary("tanh", np.tanh)),
        _spec("sqrt", "relax.sqrt", ELEMWISE, **_unary("sqrt", np.sqrt)),
        _spec("exp", "relax.exp", ELEMWISE, **_unary("exp", np.exp)),
        _spec("erf", "relax.erf", ELEMWISE, **_unary("erf", _erf)),
        _spec("gelu", "relax.nn.gelu", ELEMWISE, **_unary("gelu", _gelu)),
        _spec("silu", "relax.nn.silu", ELEMWISE, **_unary("silu", lambda x: x / (1 + np.exp(-x)))),
        _spec(
            "matmul",
            "relax.matmul",
            KERNEL,
            build=lambda a, at: _relax_op().matmul(a[0], a[1], out_dtype=at["out_dtype"]),
            infer=_matmul_infer,
            evaluate=lambda a, at: [np.matmul(a[0], a[1])],
            flops=_matmul_flops,
            arity=2,
            defaults=dict(out_dtype=None),
            read=_attr_reader("out_dtype"),
            algebra=AlgebraOp("matmul", {"out_dtype": FIXED}),
        ),
        _spec(
            "conv2d",
            "relax.nn.conv2d",
            KERNEL,
            build=_build_conv2d,
            infer=_conv2d_infer,
            evaluate=_conv2d_eval,
            flops=_conv2d_flops,
            arity=2,
            defaults=_CONV_DEFAULTS,
            read=_attr_reader(*_CONV_DEFAULTS),
            algebra=AlgebraOp(
                "conv2d",
                {
                    "strides": "Tup", "padding": "Tup", "dilation": "Tup", "groups": "Int",
                    "data_layout": FIXED, "kernel_layout": FIXED, "out_layout": FIXED, "out_dtype": FIXED,
                },
            ),
        ),
        _spec(
            # a weight transform of the search's own (TASO's merge_gconv): folded to a constant
            # after the search, never read from Relax (no Relax op carries its name)
            "merge_groups",
            "tvm_taso.merge_groups",
            INJECTIVE,
            build=lambda a, at: group_merge.build(a[0], at["groups"], at["factor"]),
            infer=_merge_groups_infer,
            evaluate=lambda a, at: [group_merge.merge(a[0], at["groups"], at["factor"])],
            required=frozenset({"groups", "factor"}),
            algebra=AlgebraOp("merge_groups", {"groups": "Int", "factor": "Int"}),
        ),
        _spec(
            "max_pool2d",
            "relax.nn.max_pool2d",
            KERNEL,
            build=_build_pool("max_pool2d"),
            infer=_pool_infer,
            evaluate=_max_pool_eval,
            flops=_pool_flops,
            defaults=_POOL_DEFAULTS,
            read=_attr_reader("pool_size", *_POOL_DEFAULTS),
            required=frozenset({"pool_size"}),
            algebra=AlgebraOp(
                "max_pool2d",
                {
                    "pool_size": "Tup", "strides": "Tup", "padding": "Tup", "dilation": "Tup", "ceil_mode": "Bool",
                    "count_include_pad": IGNORED, "layout": FIXED, "out_layout": FIXED,
                },
            ),
        ),
        _spec(
            "avg_pool2d",
            "relax.nn.avg_pool2d",
            KERNEL,
            build=_build_pool("avg_pool2d"),
            infer=_pool_infer,
            evaluate=_avg_pool_eval,
            flops=_pool_flops,
            defaults=_POOL_DEFAULTS,
            read=_attr_reader("pool_size", *_POOL_DEFAULTS),
            required=frozenset({"pool_size"}),
            algebra=AlgebraOp(
                "avg_pool2d",
                {
                    "pool_size": "Tup", "strides": "Tup", "padding": "Tup", "dilation": "Tup", "ceil_mode": "Bool",
                    "count_include_pad": "Bool", "layout": FIXED, "out_layout": FIXED,
                },
            ),
        ),
        _spec(
            "concat",
            "relax.concat",
            INJECTIVE,
            build=lambda a, at: _relax_op().concat(list(a), axis=at["axis"]),
            infer=_concat_infer,
            evaluate=lambda a, at: [np.concatenate(a, axis=at["axis"])],
            arity=None,
            read=_read_concat,
            required=frozenset({"axis"}),
            algebra=AlgebraOp("concat", {"axis": "Int"}),
        ),
        _spec(
            "split",
            "relax.split",
            INJECTIVE,
            build=lambda a, at: _relax_op().split(a[0], list(at["indices"]), axis=at["axis"]),
            infer=_split_infer,
            evaluate=_split_eval,
            read=_read_split,
            required=frozenset({"indices", "axis"}),
            not_relax_attrs=frozenset({"indices"}),
            algebra=AlgebraOp(None, {"indices": "Ints", "axis": "Int"}),
        ),
        _spec(
            "permute_dims",
            "relax.permute_dims",
            INJECTIVE,
            build=lambda a, at: _relax_op().permute_dims(a[0], list(at["axes"])),
            infer=_permute_infer,
            evaluate=lambda a, at: [np.transpose(a[0], at["axes"])],
            read=_read_permute,
            required=frozenset({"axes"}),
            not_relax_attrs=frozenset({"axes"}),
            algebra=AlgebraOp("transpose", {"axes": "Tup"}),
        ),
        _spec(
            "reshape",
            "relax.reshape",
            VIEW,
            build=lambda a, at: _relax_op().reshape(a[0], tuple(at["shape"])),
            infer=_reshape_infer,
            evaluate=lambda a, at: [np.reshape(a[0], at["shape"])],
            read=_read_reshape,
            required=frozenset({"shape"}),
            not_relax_attrs=frozenset({"shape"}),
            trailing_operands=1,
        ),
        _spec(
            "pad",
            "relax.nn.pad",
            INJECTIVE,
            build=lambda a, at: _relax_op().nn.pad(a[0], list(at["pad_width"]), at["pad_mode"], at["pad_value"]),
            infer=_pad_infer,
            evaluate=_pad_eval,
            defaults=dict(pad_mode="constant", pad_value=0.0),
            read=_attr_reader("pad_width", "pad_mode", "pad_value"),
            required=frozenset({"pad_width"}),
            algebra=AlgebraOp("pad", {"pad_width": "Tup", "pad_mode": FIXED, "pad_value": "Real"}),
        ),
        _spec(
            "batch_norm",
            "relax.nn.batch_norm",
            REDUCE,
            build=lambda a, at: _relax_op().nn.batch_norm(*a, **at),
            infer=_batch_norm_infer,
            evaluate=_batch_norm_eval,
            flops=lambda t, o, at: 4.0 * o[0].size,
            arity=5,
            defaults=dict(axis=1, epsilon=1e-5, center=True, scale=True, momentum=0.1, training=False),
            read=_attr_reader("axis", "epsilon", "center", "scale", "momentum", "training"),
        ),
        _spec(
            "layer_norm",
            "relax.nn.layer_norm",
            REDUCE,
            build=lambda a, at: _relax_op().nn.layer_norm(*a, **at),
            infer=_same,
            evaluate=_layer_norm_eval,
            flops=lambda t, o, at: 8.0 * o[0].size,
            arity=3,
            defaults=dict(axes=(-1,), epsilon=1e-5, center=True, scale=True),
            read=_attr_reader("axes", "epsilon", "center", "scale"),
        ),
        _spec(
            "rms_norm",
            "relax.nn.rms_norm",
            REDUCE,
            build=lambda a, at: _relax_op().nn.rms_norm(*a, **at),
            infer=_same,
            evaluate=_rms_norm_eval,
            flops=lambda t, o, at: 4.0 * o[0].size,
            arity=2,
            defaults=dict(axes=(-1,), epsilon=1e-5),
            read=_attr_reader("axes", "epsilon"),
        ),
        _spec(
            "softmax",
            "relax.nn.softmax",
            REDUCE,
            build=lambda a, at: _relax_op().nn.softmax(a[0], axis=at["axis"]),
            infer=_same,
            evaluate=_softmax_eval,
            flops=lambda t, o, at: 5.0 * o[0].size,
            defaults=dict(axis=-1),
            read=_attr_reader("axis"),
        ),
        _spec(
            "mean",
            "relax.mean",
            REDUCE,
            build=lambda a, at: _relax_op().mean(a[0], list(at["axis"]), keepdims=at["keepdims"]),
            infer=_mean_infer,
            evaluate=lambda a, at: [np.mean(a[0], axis=tuple(at["axis"]), keepdims=at["keepdims"])],
            flops=lambda t, o, at: float(t[0].size),
            read=_attr_reader("axis", "keepdims"),
            required=frozenset({"axis", "keepdims"}),
        ),
    ]
}

BY_RELAX_NAME: dict[str, OpSpec] = {s.relax_name: s for s in OPS.values()}


def tensor_type(ty) -> TensorType:
    """A Relax tensor type with a known shape (static or symbolic sizes) as a :class:`TensorType`,
    else OpError."""
    from tvm import relax

    if not isinstance(ty, relax.TensorType) or ty.shape is None:
        raise OpError(f"not a tensor of known shape: {ty}")
    values = getattr(ty.shape, "values", None)
    if values is None:
        raise OpError(f"not a tensor of known shape: {ty}")
    return TensorType(tuple(dims.from_prim(d) for d in values), str(ty.dtype))


def read_call(call) -> tuple[OpSpec, list, dict]:
    """(spec, tensor args, canonical attrs) of a Relax call to a known op, else OpError."""
    spec = BY_RELAX_NAME.get(getattr(call.op, "name", None))
    if spec is None:
        raise OpError(f"unknown op {getattr(call.op, 'name', call.op)}")
    if spec.read is None:
        args, attrs = list(call.args), {}
    else:
        args, attrs = spec.read(call)
    if spec.name == "conv2d" and (attrs["data_layout"], attrs["kernel_layout"], attrs["out_layout"]) != (
        "NCHW",
        "OIHW",
        "NCHW",
    ):
        raise OpError("conv2d layouts other than NCHW/OIHW")
    if spec.name in ("layer_norm", "batch_norm") and not (attrs["center"] and attrs["scale"]):
        # TVM 0.27 applies gamma and beta even when told not to; leave such calls alone.
        raise OpError(f"{spec.name} with center or scale off")
    if spec.name in ("max_pool2d", "avg_pool2d") and (attrs["layout"], attrs["out_layout"]) != ("NCHW", "NCHW"):
        raise OpError("pool layouts other than NCHW")
    return spec, args, attrs


def canonical_attrs(op: str, types: list[TensorType], attrs: dict) -> dict:
    """``attrs`` with axes made non-negative (``axis=-1`` of a rank-3 tensor is ``axis=2``) and an
    ``out_dtype`` that is the operands' own dtype made the default (TVM's PyTorch frontend spells
    ``matmul(..., out_dtype="float32")`` where the ONNX one leaves it out), so that rules and
    hashing see one spelling."""
    if not types or op not in OPS:
        return attrs
    rank = len(types[0].shape)
    out = dict(attrs)
    if out.get("out_dtype") is not None and str(out["out_dtype"]) in ("", str(np.dtype(types[0].dtype))):
        out["out_dtype"] = None
    for name in ("axis", "axes"):
        value = out.get(name)
        if isinstance(value, int) and not isinstance(value, bool):
            out[name] = _norm_axis(value, rank)
        elif isinstance(value, tuple) and all(isinstance(a, int) for a in value):
            out[name] = tuple(_norm_axis(a, rank) for a in value)
    return out


def infer(op: str, types: list[TensorType], attrs: dict) -> list[TensorType]:
    spec = OPS[op]
    if spec.arity is not None and len(types) != spec.arity:
        raise OpError(f"{op} takes {spec.arity} operands, got {len(types)}")
    return spec.infer(types, attrs)


def evaluate(op: str, arrays: list[np.ndarray], attrs: dict) -> list[np.ndarray]:
    return OPS[op].evaluate(arrays, attrs)
