"""A :class:`~tvm_taso.cost.model.Kernel` as a Relax module: built for a target with its build
pipeline (:func:`build_pipeline`: the target's default, default schedules on a CPU, the tuned
schedules of a MetaSchedule database when given), with inputs to run it.

Used wherever a kernel is timed: locally (:mod:`.measure`, inside a :mod:`.worker` process) and
remotely (:mod:`.rpc`, built here and uploaded).
"""

from __future__ import annotations

import importlib
import logging

import numpy as np

from tvm_taso import target as targets
from tvm_taso.cost.model import Kernel
from tvm_taso.ir import ops

log = logging.getLogger("tvm_taso.kernel_build")


class MeasureError(Exception):
    """A kernel that cannot be expressed as a module (not a failure of the target)."""


def kernel_module(kernel: Kernel):
    """A Relax ``main`` whose params are the kernel's external inputs (weights too: a kernel is
    timed on its shapes, not its values) and whose body is its ops in order.

    The function returns the kernel's outputs (a tuple when there are several)."""
    from tvm import relax

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


def target_kernel_module(kernel: Kernel, target):
    """:func:`kernel_module` as a model's build for ``target`` holds the kernel: its
    convolutions in the target's layouts (:func:`~tvm_taso.target.conv_layouts`), and its
    params and outputs in them too. In a model the layout transforms sit at the model's inputs
    and outputs, not around each kernel, so the ones the conversion puts at the kernel's
    boundary are dropped (:func:`without_boundary_transforms`): the kernel is priced, measured
    and tuned as the model runs it."""
    mod = kernel_module(kernel)
    layouts = targets.conv_layouts(target)
    if not layouts:
        return mod
    return without_boundary_transforms(mod, convert_layouts(layouts)(mod))


def without_boundary_transforms(original, converted):
    """``converted``'s ``main`` (``original``'s after :func:`convert_layouts`) without the
    ``permute_dims`` the conversion put on its params and outputs: such a param is taken, and
    such an output given, in the permuted layout. A param or output ``original`` itself
    permutes (a transpose kernel) keeps its transform."""
    from tvm import relax

    def operand_if_permute(value):
        return (value.args[0] if isinstance(value, relax.Call)
                and getattr(value.op, "name", "") == "relax.permute_dims" else None)

    def outputs(func, values):  # the returned values, one per output
        result = values.get(func.body.body, func.body.body)
        return list(result.fields) if isinstance(result, relax.Tuple) else [func.body.body]

    before, func = original["main"], converted["main"]
    before_values = {b.var: b.value for block in before.body.blocks for b in block.bindings}
    values = {b.var: b.value for block in func.body.blocks for b in block.bindings}
    own = {i for i, p in enumerate(before.params)
           for v in before_values.values() if (x := operand_if_permute(v)) is not None and x.same_as(p)}
    uses: dict = {}
    for value in values.values():
        for v in relax.analysis.free_vars(value):
            uses[v] = uses.get(v, 0) + 1
    rename, params = {}, []
    for i, p in enumerate(func.params):
        head = next((var for var, v in values.items() if (x := operand_if_permute(v)) is not None and x.same_as(p)), None)
        if head is None or i in own or uses.get(p, 0) != 1:
            params.append(p)
        else:
            params.append(relax.Var(p.name, head.ty))
            rename[head] = params[-1]
    results = []
    for out, was in zip(outputs(func, values), outputs(before, before_values)):
        inner = operand_if_permute(values.get(out))
        results.append(out if inner is None or operand_if_permute(before_values.get(was)) is not None else inner)
    if not rename and results == outputs(func, values):
        return converted
    bb = relax.BlockBuilder()
    with bb.function("main", params, attrs=dict(func.attrs) if func.attrs is not None else None):
        with bb.dataflow():
            for block in func.body.blocks:
                for b in block.bindings:
                    if b.var not in rename and b.var is not func.body.body:
                        rename[b.var] = bb.emit(_substituted(b.value, rename), name_hint=b.var.name)
            fields = [rename.get(r, r) for r in results]
            out = bb.emit_output(fields[0] if len(fields) == 1 else relax.Tuple(fields))
        bb.emit_func_output(out)
    return relax.transform.DeadCodeElimination()(_main_module(bb))


def _substituted(expr, mapping):
    """``expr`` with the variables of ``mapping`` replaced."""
    from tvm import relax

    @relax.expr_functor.mutator
    class _Substitute(relax.PyExprMutator):
        def visit_var_(self, var):
            return mapping.get(var, var)

        def visit_dataflow_var_(self, var):
            return mapping.get(var, var)

    return _Substitute().visit_expr(expr)


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


def kernel_inputs(kernel: Kernel, seed: int = 0, target=None) -> list[np.ndarray]:
    """Random arrays for the kernel's external inputs, in parameter order: of
    :func:`kernel_module` (the kernel's own layouts), or with ``target`` of
    :func:`target_kernel_module` (what :func:`build_kernel` built for it)."""
    types = [o[1] for _, _, operands in kernel.ops for o in operands if o[0] == "in"]
    if target is not None and targets.conv_layouts(target):
        params = target_kernel_module(kernel, targets.parse(target))["main"].params
        types = [ops.TensorType(tuple(int(d) for d in p.ty.shape.values), str(p.ty.dtype)) for p in params]
    return random_inputs(types, seed)


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


def _split_at_fusion(target, model_layouts: bool = False) -> tuple[list, list]:
    """The target's dispatch + legalize passes, cut right after ``FuseTIR``: MetaSchedule's
    workloads are the fused TIR functions at that point. Convolutions are first given the
    target's layouts (:func:`convert_layouts`; not with ``model_layouts``), matmuls and
    convolutions handed to the BLAS where the target uses it (:func:`~tvm_taso.blas.used_for`;
    not with ``model_layouts``), then layouts of constants are folded
    (:func:`fold_constant_layouts`: the weights' transforms become new weights)."""
    from tvm_taso.blas import dispatch_blas, used_for

    legalize = list(_backend(target).legalize_passes(target))
    at = next((i for i, p in enumerate(legalize) if p.info.name == "FuseTIR"), len(legalize) - 1) + 1
    layouts = None if model_layouts else targets.conv_layouts(target)
    head = [convert_layouts(layouts)] if layouts else []
    head += [dispatch_blas()] if not model_layouts and used_for(target) else []
    head += [fold_constant_layouts()]
    head += list(_backend(target).library_dispatch_passes(target))
    return head + legalize[:at], legalize[at:]


def convert_layouts(layouts: dict):
    """A pass giving the ops in ``layouts`` (op name: desired layouts, as Relax's
    ``ConvertLayout`` takes them) those layouts: a convolution's operands are transformed before
    it and its result after (``permute_dims`` for the layouts :func:`~tvm_taso.target.conv_layouts`
    gives, which :func:`fold_constant_layouts` folds into the weights); transforms that meet
    (one conv's output, through elementwise ops and pools, into the next conv) cancel, so a chain
    of convolutions runs in the new layout from its first input to its last output. A module TVM
    cannot convert is built as it is, with a warning."""
    import tvm
    from tvm import relax

    # ConvertLayout transforms an input once per conv that reads it: common subexpressions
    # merged, each branch of an Inception block reads one transposed input
    convert = tvm.transform.Sequential([relax.transform.ConvertLayout(layouts),
                                        relax.transform.EliminateCommonSubexpr()])

    def converts(mod) -> bool:
        """Whether ``mod`` has one of the ops, and no TIR function yet: TVM 0.27's ConvertLayout
        crashes the process (a segfault, nothing to catch) on a module whose Relax calls TIR it
        holds, as TVM's FuseTransposeMatmul leaves one; such a module keeps its layouts."""
        if any(isinstance(func, tvm.tirx.PrimFunc) for func in mod.functions.values()):
            log.debug("convolutions keep the model's layouts: the module already holds TIR functions")
            return False
        found = []
        for func in mod.functions.values():
            if isinstance(func, relax.Function):
                relax.analysis.post_order_visit(func, lambda e: found.append(1) if isinstance(e, relax.Call)
                                                and getattr(e.op, "name", None) in layouts else None)
        return bool(found)

    @tvm.transform.module_pass(opt_level=0, name="TasoConvertLayouts")
    def _convert(mod, _ctx):
        if not converts(mod):
            return mod
        try:
            return convert(mod)
        except Exception as err:  # noqa: BLE001 - TVM raises several types; the model's layouts still build
            log.warning("convolutions keep the model's layouts: TVM could not convert them (%s)",
                        str(err).strip().splitlines()[-1] if str(err).strip() else type(err).__name__)
            return mod

    return _convert


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


def fused_module(mod, target, model_layouts: bool = False):
    """``mod`` after the target pipeline's passes up to ``FuseTIR`` (what MetaSchedule tunes);
    with ``model_layouts``, in the model's layouts (no :func:`convert_layouts`)."""
    import tvm

    with target:
        return tvm.transform.Sequential(_split_at_fusion(target, model_layouts)[0])(mod)


def build_target(target, database: str | None = None):
    """``target`` parsed for a build; with ``database``, with the cores it was tuned for
    (:func:`~tvm_taso.target.with_cores`: a database is applied for the target it was tuned for)."""
    return targets.with_cores(target) if database else targets.parse(target)


def build_pipeline(target, database: str | None = None, *, model_layouts: bool = False):
    """The Relax pipeline a model is built with for ``target``: the target's default (legalize,
    fuse, dlight on GPUs); on a CPU, whose default schedules no kernel, convolutions channels
    last (:func:`convert_layouts`; not with ``model_layouts``) and each kernel given
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
    head, tail = _split_at_fusion(target, model_layouts)

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
    """``tvm.compile`` of :func:`target_kernel_module` for ``target`` (any target form; no
    device needed); :func:`kernel_inputs` with the same target gives its inputs."""
    import tvm

    target = targets.parse(target)
    mod = target_kernel_module(kernel, target)
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
    ``FuseTIR`` and ``RewriteDataflowReshape`` (library calls included). Counted in the
    model's layouts: the transposes a CPU build adds where its channels-last convolutions meet
    the model's layouts (:func:`convert_layouts`; at a CNN's input and before its classifier)
    are not the graph's kernels."""
    import tvm
    from tvm import relax

    target = targets.parse(target)
    fused = relax.transform.RewriteDataflowReshape()(fused_module(mod, target, model_layouts=True))
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
