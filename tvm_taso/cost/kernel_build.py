"""A :class:`~tvm_taso.cost.model.Kernel` as a Relax module: built for a target with its build
pipeline (:func:`build_pipeline`: the target's default, default schedules on a CPU, the tuned
schedules of a MetaSchedule database when given), with inputs to run it.

Used wherever a kernel is timed: locally (:mod:`.measure`, inside a :mod:`.worker` process) and
remotely (:mod:`.rpc`, built here and uploaded).
"""

from __future__ import annotations

import importlib

import numpy as np

from tvm_taso import target as targets
from tvm_taso.cost.model import Kernel


class MeasureError(Exception):
    """A kernel that cannot be expressed as a module (not a failure of the target)."""


def kernel_module(kernel: Kernel):
    """A Relax ``main`` whose params are the kernel's external inputs (weights too: a kernel is
    timed on its shapes, not its values) and whose body is its ops in order.

    The function returns the kernel's outputs (a tuple when there are several)."""
    from tvm import relax

    from tvm_taso.ir import ops

    params: list = []
    bb = relax.BlockBuilder()
    # Which op outputs are read inside the kernel: the others must be outputs.
    consumed = {(o[1], o[2]) for _, _, operands in kernel.ops for o in operands if o[0] == "op"}
    for _, _, operands in kernel.ops:
        for o in operands:
            if o[0] == "in" and o[1] is None:
                raise MeasureError("kernel reads a tuple-valued input")
    for _, _, operands in kernel.ops:
        for o in operands:
            if o[0] == "in":
                params.append(relax.Var(f"p{len(params)}", relax.TensorType(tuple(o[1].shape), o[1].dtype)))
    with bb.function("main", params):
        with bb.dataflow():
            pit = iter(params)
            values: list[list] = []  # per op: its output expressions
            types: list[list] = []
            for op, attrs, operands in kernel.ops:
                spec = ops.OPS[op]
                args = [next(pit) if o[0] == "in" else values[o[1]][o[2]] for o in operands]
                otypes = spec.infer(
                    [o[1] if o[0] == "in" else types[o[1]][o[2]] for o in operands], dict(attrs)
                )
                values.append(_emit_op(bb, op, args, dict(attrs)))
                types.append(list(otypes))
            results = select_outputs(kernel, values, types, consumed)
            out = bb.emit_output(results[0] if len(results) == 1 else relax.Tuple(results))
        bb.emit_func_output(out)
    return _main_module(bb)


def select_outputs(kernel, values, types, consumed) -> list:
    """Match ``kernel.outputs`` (types only) to op outputs: every output no op of the kernel
    reads must be one; the rest are read inside and outside, taken in order by type."""
    wanted = list(kernel.outputs)
    order = [(k, i) for k in range(len(values)) for i in range(len(values[k]))]
    leaves = [ki for ki in order if ki not in consumed]
    extra = len(wanted) - len(leaves)
    chosen, p = [], 0
    for k, i in order:
        leaf = (k, i) not in consumed
        t = types[k][i] if i < len(types[k]) else None
        if p < len(wanted) and t == wanted[p] and (leaf or extra > 0):
            chosen.append(values[k][i])
            p += 1
            extra -= 0 if leaf else 1
    if p != len(wanted) or not chosen:
        chosen = [values[k][i] for k, i in leaves] or [values[-1][0]]
    return chosen


def kernel_inputs(kernel: Kernel, seed: int = 0) -> list[np.ndarray]:
    """Random arrays for the kernel's external inputs, in parameter order."""
    return random_inputs([o[1] for _, _, operands in kernel.ops for o in operands if o[0] == "in"], seed)


def random_inputs(types, seed: int = 0) -> list[np.ndarray]:
    """Random arrays of the given tensor types (small integers for integer types, so that
    index-like operands stay in range)."""
    rng = np.random.default_rng(seed)
    arrays = []
    for ty in types:
        shape, dtype = tuple(ty.shape), ty.dtype
        kind = np.dtype(dtype).kind
        if kind == "f":
            arrays.append(rng.standard_normal(shape).astype(dtype))
        elif kind == "b":
            arrays.append(rng.integers(0, 2, shape).astype(dtype))
        else:
            arrays.append(rng.integers(0, 4, shape).astype(dtype))
    return arrays


def graph_module(g) -> tuple:
    """A search graph (a region) as a Relax ``main``: ``(module, the ref each parameter
    stands for)``. Every leaf
    is a parameter (weights too: a region is timed on its shapes; fold the weight-only ops
    first, as TVM will), and so is every output of an opaque node -- it is the same call
    before and after a rewrite, so it is left out of the timing. The function returns the
    graph's outputs (a tuple when there are several)."""
    from tvm import relax

    from tvm_taso.ir.graph import LEAVES

    params: list = []
    refs: list = []
    values: dict = {}
    bb = relax.BlockBuilder()

    def param(ref, ty):
        if ty is None:
            raise MeasureError("the region reads a tuple-valued input")
        var = relax.Var(f"p{len(params)}", relax.TensorType(tuple(ty.shape), ty.dtype))
        params.append(var)
        refs.append(ref)
        values[ref] = var

    order = g.topo_order()
    external = {nid for nid in order if g.nodes[nid].op in LEAVES or g.nodes[nid].op == "opaque"}
    read = [r for nid in order if nid not in external for r in g.nodes[nid].inputs] + list(g.outputs)
    for ref in dict.fromkeys(r for r in read if r[0] in external):
        param(ref, g.nodes[ref[0]].types[ref[1]] if ref[1] >= 0 else None)
    with bb.function("main", params):
        with bb.dataflow():
            for nid in order:
                n = g.nodes[nid]
                if n.op in LEAVES or n.op == "opaque":
                    continue
                if any(r not in values for r in n.inputs):
                    raise MeasureError(f"{n.op} reads a tuple-valued input")
                for i, out in enumerate(_emit_op(bb, n.op, [values[r] for r in n.inputs], n.attr)):
                    values[(nid, i)] = out
            if any(r not in values for r in g.outputs):
                raise MeasureError("the region writes a tuple-valued output")
            results = [values[r] for r in g.outputs]
            out = bb.emit_output(results[0] if len(results) == 1 else relax.Tuple(results))
        bb.emit_func_output(out)
    return _main_module(bb), refs


def _emit_op(bb, op: str, args: list, attrs: dict) -> list:
    """Emit one op of the table into ``bb``'s dataflow block: its output expressions (one per
    element when it returns a tuple)."""
    from tvm import relax

    from tvm_taso.ir import ops

    call = bb.emit(ops.OPS[op].build(args, attrs))
    if isinstance(call.ty, relax.TupleType):
        return [bb.emit(relax.TupleGetItem(call, i)) for i in range(len(call.ty.fields))]
    return [call]


def _main_module(bb):
    """The module ``bb`` built, holding its ``main`` alone."""
    import tvm

    mod = bb.get()
    return tvm.IRModule({"main": mod["main"]}) if len(mod.functions) > 1 else mod


def _backend(target):
    kind = target.kind.name
    return importlib.import_module(
        "tvm.relax.backend." + ("cuda" if kind == "cuda" else "gpu_generic" if "gpu" in target.keys else "cpu_generic")
        + ".pipeline"
    )


def _split_at_fusion(target) -> tuple[list, list]:
    """The target's dispatch + legalize passes, cut right after ``FuseTIR``: MetaSchedule's
    workloads are the fused TIR functions at that point. Layouts of constants are folded first
    (:func:`fold_constant_layouts`)."""
    legalize = list(_backend(target).legalize_passes(target))
    at = next((i for i, p in enumerate(legalize) if p.info.name == "FuseTIR"), len(legalize) - 1) + 1
    head = [fold_constant_layouts()] + list(_backend(target).library_dispatch_passes(target))
    return head + legalize[:at], legalize[at:]


# how numpy computes a layout op of a constant, given the output shape TVM inferred for the call
_CONSTANT_LAYOUTS = {
    "relax.reshape": lambda value, shape, _attrs: value.reshape(shape),
    "relax.expand_dims": lambda value, shape, _attrs: value.reshape(shape),
    "relax.squeeze": lambda value, shape, _attrs: value.reshape(shape),
    "relax.permute_dims": lambda value, _shape, attrs: np.transpose(
        value, None if attrs.axes is None else [int(a) for a in attrs.axes]),
}


def fold_constant_layouts():
    """A pass replacing each reshape, expand_dims, squeeze or permute_dims of a constant (with a
    static shape) by the constant it gives, computed by numpy. TVM's ``FoldConstant`` computes
    the same by building and running an LLVM kernel for each, and an ONNX model's conv biases
    are reshapes of constants: one kernel build per convolution."""
    import tvm
    from tvm import relax

    from tvm_taso.ir.relax_bridge import with_functions

    @relax.expr_functor.mutator
    class _Folder(relax.PyExprMutator):
        def visit_call_(self, call):
            call = super().visit_call_(call)
            fold = _CONSTANT_LAYOUTS.get(getattr(call.op, "name", None))
            value = call.args[0] if fold is not None and call.args else None
            if isinstance(value, relax.Var):  # a chain: the variable an earlier fold bound to a constant
                value = self.lookup_binding(value)
            if not isinstance(value, tvm.ir.expr.GenericConst):
                return call
            ty = call.ty
            if not (isinstance(ty, relax.TensorType) and isinstance(ty.shape, relax.ShapeExpr)
                    and all(isinstance(d, tvm.tirx.IntImm) for d in ty.shape.values)):
                return call
            shape = tuple(int(d) for d in ty.shape.values)
            return relax.const(fold(value.value.numpy(), shape, call.attrs), ty.dtype)

    @tvm.transform.module_pass(opt_level=0, name="TasoFoldConstantLayouts")
    def _fold(mod, _ctx):
        return with_functions(mod, {gvar: _Folder().visit_expr(func) for gvar, func in mod.functions_items()
                                    if isinstance(func, relax.Function)})

    return _fold


def fused_module(mod, target):
    """``mod`` after the target pipeline's passes up to ``FuseTIR`` (what MetaSchedule tunes)."""
    import tvm

    with target:
        return tvm.transform.Sequential(_split_at_fusion(target)[0])(mod)


def build_target(target, database: str | None = None):
    """``target`` parsed for a build; with ``database``, with the cores it was tuned for
    (:func:`~tvm_taso.target.with_cores`: a database is applied for the target it was tuned for)."""
    return targets.with_cores(target) if database else targets.parse(target)


def build_pipeline(target, database: str | None = None):
    """The Relax pipeline a model is built with for ``target``: the target's default (legalize,
    fuse, dlight on GPUs); on a CPU, whose default schedules no kernel, each kernel is given
    MetaSchedule's design-space default after fusion (:func:`.schedules.default_schedules`). With
    ``database`` (a work dir holding ``database_workload.json`` and
    ``database_tuning_record.json``) its tuned schedules come first; on a CPU the kernels it
    lacks get the default."""
    import tvm
    from tvm import relax

    from tvm_taso.cost.schedules import default_schedules

    gpu = targets.is_gpu(target)
    if database is None and gpu:
        try:
            return relax.get_default_pipeline(target)
        except (ValueError, AttributeError):  # a GPU kind TVM has no pipeline of its own for
            return relax.get_pipeline("default")
    backend = _backend(target)
    head, tail = _split_at_fusion(target)

    @tvm.transform.module_pass(opt_level=0, name="TasoBuildPipeline")
    def _pipeline(mod, _ctx):
        with target:  # MetaScheduleApplyDatabase reads the target from the context when created
            scheduling = [relax.transform.MetaScheduleApplyDatabase(work_dir=str(database))] if database else []
            scheduling += [] if gpu else [default_schedules(target)]
            seq = tvm.transform.Sequential(
                head + scheduling + tail + list(backend.dataflow_lower_passes(target))
                + list(backend.finalize_passes(target))
            )
            return seq(mod)

    return _pipeline


def build_kernel(kernel: Kernel, target, database: str | None = None):
    """``tvm.compile`` of :func:`kernel_module` for ``target`` (any target form; no device needed)."""
    import tvm

    target = targets.parse(target)
    mod = kernel_module(kernel)
    with target:
        return tvm.compile(mod, target=target, relax_pipeline=build_pipeline(target, database))


def launched_kernels(mod, target) -> int | None:
    """:func:`tvm_kernel_count` for a report: None for what is not a Relax module (an ONNX model)
    or does not get through the passes; the host CPU's pipeline when there is no target (the
    passes up to FuseTIR are the same for cuda and llvm)."""
    import tvm

    if not isinstance(mod, tvm.IRModule):
        return None
    try:
        return tvm_kernel_count(mod, target if target is not None else "llvm")
    except Exception:  # noqa: BLE001 - a count for the report must not fail the optimization
        return None


def tvm_kernel_count(mod, target) -> int:
    """Kernels TVM launches for ``mod``'s Relax functions when built for ``target``: the
    ``call_tir`` and ``call_dps_packed`` calls left after the target pipeline's passes up to
    ``FuseTIR`` and ``RewriteDataflowReshape`` (library calls included)."""
    import tvm
    from tvm import relax

    target = targets.parse(target)
    fused = relax.transform.RewriteDataflowReshape()(fused_module(mod, target))
    count = 0

    def visit(e):
        nonlocal count
        if isinstance(e, relax.Call) and isinstance(e.op, tvm.ir.Op) and e.op.name in (
                "relax.call_tir", "relax.call_dps_packed"):
            count += 1

    for func in fused.functions.values():
        if isinstance(func, relax.Function):
            relax.analysis.post_order_visit(func, visit)
    return count
