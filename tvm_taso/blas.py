"""BLAS in CPU builds: matrix products and convolutions handed to the BLAS numpy links.

TVM 0.27's wheels carry no BLAS or oneDNN codegen (``USE_DNNL``/``USE_BLAS`` are off), and ResNet-50
and BERT-base with every op TVM's kernel, tuned for about an hour, run 2.0-2.3x slower here than
with numpy's OpenBLAS doing their GEMMs (``benchmarks/README.md``, "Tuned kernels on this CPU").
So, as TVM's own ``-libs=cblas`` did for Relay, a CPU build for this machine (:func:`used_for`)
gives them to a library: :func:`dispatch_blas` rewrites

- ``matmul(a, b)`` (float32 or float64, both of rank 2 or more, numpy's semantics, broadcast
  batches included) into ``call_dps_packed("tvm_taso.blas.matmul", a, b)``;
- ``conv2d`` in NHWC/HWIO with one group into an im2col kernel and that matmul: ``(N*OH*OW,
  KH*KW*C) @ (KH*KW*C, O)``; a 1x1 convolution with unit strides and no padding needs no im2col,
  its input is already the matrix. The im2col kernel is TVM's, kept out of fusion: fused with
  what computes its input (the layout transpose before ResNet-50's first convolution), its
  schedules were far slower than the copy alone;

each when it does at least :data:`MIN_FLOPS` of work (or has symbolic sizes): below that the
call costs more than TVM's kernel. Bias adds and activations after them stay TVM's, fused.

:data:`FUNCTION` runs in the process that runs the module, registered by ``import tvm_taso``
(:func:`register`): a library exported from such a build needs ``import
tvm_taso`` before it is loaded, which a target for another machine (an ``mtriple`` or ``mcpu``
naming another CPU) or ``"libs": ["tvm"]`` avoids (:func:`~tvm_taso.target.wants_blas`).
"""

from __future__ import annotations

import functools
import logging

import numpy as np

log = logging.getLogger("tvm_taso.blas")

FUNCTION = "tvm_taso.blas.matmul"
MIN_FLOPS = 1 << 20  # ~1 MFLOP: ~10 us at a BLAS's rate, about what calling into it costs
DTYPES = ("float32", "float64")


def _matmul(a, b, out) -> None:
    np.matmul(np.from_dlpack(a), np.from_dlpack(b), out=np.from_dlpack(out))


@functools.cache
def available() -> bool:
    """Whether numpy was built with a BLAS (its wheels bundle OpenBLAS; without one its matmul
    is plain loops, slower than TVM's kernels) and writes into TVM's tensors in place (through
    DLPack, as :data:`FUNCTION` does)."""
    import tvm

    blas = _numpy_blas()
    if not blas.get("found") or blas.get("name") in (None, "", "none"):
        return False
    try:
        return bool(np.from_dlpack(tvm.runtime.tensor(np.zeros(1, "float32"))).flags.writeable)
    except (TypeError, ValueError, BufferError, AttributeError):
        return False


def name() -> str:
    """The BLAS numpy links, with its version (``"scipy-openblas 0.3.31.188.0"``): measurements
    of builds that call it are marked with it (:func:`~tvm_taso.cost.database.db_target`)."""
    blas = _numpy_blas()
    return f"{blas.get('name')} {blas.get('version', '')}".strip()


def _numpy_blas() -> dict:
    """numpy's build configuration of its BLAS (empty when numpy does not say)."""
    try:
        return dict(np.__config__.CONFIG["Build Dependencies"]["blas"])
    except (AttributeError, KeyError, TypeError):
        return {}


def used_for(target=None) -> bool:
    """Whether a build for ``target`` hands its matmuls and convolutions to the BLAS: the target
    wants it (:func:`~tvm_taso.target.wants_blas`) and numpy has one (:func:`available`)."""
    from tvm_taso import target as targets

    return targets.wants_blas(target) and available()


def register() -> None:
    """Register :data:`FUNCTION` in this process (idempotent)."""
    import tvm

    tvm.register_global_func(FUNCTION, _matmul, override=True)


def dispatch_blas():
    """A pass handing the matmuls and NHWC convolutions of the module's Relax functions to the
    BLAS (the module docstring says which); functions marked ``Primitive``, ``Composite`` or
    ``Codegen`` are left alone. The module calls :data:`FUNCTION`, which ``import tvm_taso``
    registers (:func:`register`) in every process that builds one."""
    import tvm

    @tvm.transform.module_pass(opt_level=0, name="TasoDispatchBLAS")
    def _dispatch(mod, _ctx):
        return _dispatcher()(mod).transform()

    return _dispatch


def library_calls(mod) -> list[tuple[tuple, tuple, str]]:
    """``(shape of a, shape of b, dtype)`` of each call to :data:`FUNCTION` in ``mod``'s Relax
    functions, in order (shapes as given: ints, or ``tirx`` expressions where symbolic)."""
    from tvm import relax

    calls = []

    def visit(expr):
        if (isinstance(expr, relax.Call) and getattr(expr.op, "name", None) == "relax.call_dps_packed"
                and isinstance(expr.args[0], relax.ExternFunc) and expr.args[0].global_symbol == FUNCTION):
            a, b = (_tensor(x) for x in expr.args[1].fields)
            calls.append((_shape(a.shape), _shape(b.shape), str(a.dtype)))

    for func in mod.functions.values():
        if isinstance(func, relax.Function):
            relax.analysis.post_order_visit(func, visit)
    return calls


def _shape(shape) -> tuple:
    static = _static(shape.values)
    return static if static is not None else tuple(shape.values)


@functools.lru_cache(maxsize=4096)
def matmul_seconds(a_shape: tuple, b_shape: tuple, dtype: str, min_seconds: float = 0.02) -> float:
    """The median seconds of ``numpy.matmul`` on random arrays of these (static) shapes, as the
    library call of a build runs it (into a preallocated output), timed here: calls are repeated
    for at least ``min_seconds`` after a warm-up call."""
    import time

    rng = np.random.default_rng(0)
    a = rng.standard_normal(a_shape).astype(dtype)
    b = rng.standard_normal(b_shape).astype(dtype)
    out = np.matmul(a, b)
    times: list[float] = []
    spent = 0.0
    while spent < min_seconds or len(times) < 5:
        start = time.perf_counter()
        np.matmul(a, b, out=out)
        times.append(time.perf_counter() - start)
        spent += times[-1]
    return float(np.median(times))


def _static(dims) -> tuple | None:
    """``dims`` (``tirx`` expressions) as ints, or None when one is symbolic."""
    import tvm

    if not all(isinstance(d, tvm.tirx.IntImm) for d in dims):
        return None
    return tuple(int(d) for d in dims)


def _tensor(expr):
    """The :class:`relax.TensorType` of an expression, when it is a tensor with a known shape
    (else None)."""
    from tvm import relax

    ty = expr.ty
    if not isinstance(ty, relax.TensorType) or ty.shape is None or not hasattr(ty.shape, "values"):
        return None
    return ty


def _product(*shapes) -> int | None:
    """The product of the sizes of the given shapes (None when one is symbolic: None)."""
    total = 1
    for shape in shapes:
        if shape is None:
            return None
        for d in shape:
            total *= d
    return total


def _im2col(data, kernel_hw, strides, dilation, padding, out_hw):
    """The TE of an NHWC input's patches: ``(N, OH, OW, KH, KW, C)``, zero outside the input."""
    import tvm
    from tvm import te

    _, height, width, _ = data.shape
    (stride_h, stride_w), (dilation_h, dilation_w), (pad_top, pad_left) = strides, dilation, padding[:2]
    (kernel_h, kernel_w), (out_h, out_w) = kernel_hw, out_hw

    def patch(n, i, j, r, s, c):
        y = i * stride_h + r * dilation_h - pad_top
        x = j * stride_w + s * dilation_w - pad_left
        inside = tvm.tirx.all(y >= 0, y < height, x >= 0, x < width)
        return tvm.tirx.if_then_else(inside, data[n, y, x, c], tvm.tirx.const(0, data.dtype))

    return te.compute((data.shape[0], out_h, out_w, kernel_h, kernel_w, data.shape[3]), patch, name="im2col")


@functools.cache
def _dispatcher():
    from tvm import relax

    from tvm_taso.ir.relax_bridge import foreign_function

    @relax.expr_functor.mutator
    class Dispatcher(relax.PyExprMutator):
        def __init__(self, mod):
            super().__init__(mod)
            self.mod = mod
            self.dispatched = 0

        def transform(self):
            for gvar, func in self.mod.functions_items():
                if isinstance(func, relax.Function) and foreign_function(func) is None:
                    self.builder_.update_func(gvar, self.visit_expr(func))
            if self.dispatched:
                log.debug("BLAS: %d matmuls and convolutions dispatched", self.dispatched)
            return self.builder_.get()

        def visit_call_(self, call):
            call = super().visit_call_(call)
            name = getattr(call.op, "name", None)
            new = (self.matmul(call) if name == "relax.matmul"
                   else self.conv2d(call) if name == "relax.nn.conv2d" else None)
            if new is None:
                return call
            self.dispatched += 1
            return new

        def library_matmul(self, a, b, out_ty):
            return relax.call_dps_packed(FUNCTION, relax.Tuple([a, b]), out_ty)

        def matmul(self, call):
            a, b, out = _tensor(call.args[0]), _tensor(call.args[1]), _tensor(call)
            if a is None or b is None or out is None or len(a.shape.values) < 2 or len(b.shape.values) < 2:
                return None  # numpy's vector products return scalars, not into an output
            dtype = str(a.dtype)
            if not (dtype == str(b.dtype) and str(out.dtype) in (dtype, "", "void") and dtype in DTYPES):
                return None
            k = _static(list(a.shape.values)[-1:])
            work = _product(_static(out.shape.values), k)
            if work is not None and 2 * work < MIN_FLOPS:
                return None
            return self.library_matmul(call.args[0], call.args[1], relax.TensorType(out.shape, dtype))

        def conv2d(self, call):
            attrs = call.attrs
            if (attrs.data_layout, attrs.kernel_layout, attrs.out_layout) != ("NHWC", "HWIO", "NHWC") or attrs.groups != 1:
                return None
            data, weight, out = _tensor(call.args[0]), _tensor(call.args[1]), _tensor(call)
            if data is None or weight is None or out is None:
                return None
            dtype = str(data.dtype)  # an out_dtype of "void" is the operands'
            if not (dtype == str(weight.dtype) and str(out.dtype) in (dtype, "", "void") and dtype in DTYPES):
                return None
            sizes = _static(weight.shape.values)
            if sizes is None or None in (_static(list(data.shape.values)[1:]), _static(list(out.shape.values)[1:])):
                return None  # a symbolic batch is fine; symbolic images or channels stay TVM's
            kh, kw, c, o = sizes
            work = _product(_static(out.shape.values), (kh * kw * c,))
            if work is not None and 2 * work < MIN_FLOPS:
                return None
            n = out.shape.values[0]
            oh, ow = (int(d) for d in list(out.shape.values)[1:3])
            strides = [int(s) for s in attrs.strides]
            dilation = [int(d) for d in attrs.dilation]
            padding = [int(p) for p in attrs.padding]
            x = call.args[0]
            if not ((kh, kw) == (1, 1) and strides == [1, 1] and not any(padding)):
                x = self.builder_.emit_te(_im2col, x, (kh, kw), strides, dilation, padding, (oh, ow),
                                          primfunc_name_hint="im2col")
                gvar = self.builder_.lookup_binding(x).args[0]
                self.builder_.update_func(gvar, self.builder_.get()[gvar].with_attr("op_pattern", 8))
            rows = relax.op.reshape(x, relax.ShapeExpr([n * oh * ow, kh * kw * c]))
            matrix = relax.op.reshape(call.args[1], relax.ShapeExpr([kh * kw * c, o]))
            product = self.builder_.emit(self.library_matmul(
                self.builder_.emit(rows), self.builder_.emit(matrix),
                relax.TensorType(relax.ShapeExpr([n * oh * ow, o]), dtype)))
            return relax.op.reshape(product, out.shape)

    return Dispatcher
