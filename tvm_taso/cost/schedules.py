"""Default schedules: what a CPU kernel no database tuned is built with.

TVM 0.27's CPU pipeline legalizes and fuses but schedules no kernel: plain loops, on one core,
unvectorized (full ResNet-50 on this 2-core machine: 4.0 s a run, against 1.5 s with the default
here; ``python -m benchmarks.default_schedules``). :func:`default_schedules` gives each such
kernel MetaSchedule's design-space default instead, with no measurement: the first design space
of the target's CPU rules (tiled, parallelized, vectorized, unrolled) whose postprocessors accept
it, its sampled decisions drawn from a fixed seed, so every build of a kernel is the same
(:data:`DEFAULT_SCHEDULE` marks the measurements of such builds). A kernel with no such space
(symbolic extents a tiling cannot split) stays loops. Tuning (:mod:`.tuning`) does better per
kernel; this is what the kernels it did not reach get.
"""

from __future__ import annotations

import logging

from tvm_taso import target as targets

log = logging.getLogger("tvm_taso.schedules")

DEFAULT_SEED = 0  # of the decisions a design space draws
DEFAULT_SCHEDULE = f"metaschedule-design-space-{DEFAULT_SEED}"  # what a measurement of such a build is marked with


def default_schedules(target):
    """A pass giving every kernel of a CPU build that has no schedule yet (``tirx.is_scheduled``:
    not from a database) its design-space default (:func:`design_space_default`)."""
    import tvm

    from tvm_taso.ir.relax_bridge import with_functions

    sizing = targets.with_cores(target)  # the parallel extents follow the cores

    @tvm.transform.module_pass(opt_level=0, name="TasoDefaultSchedule")
    def _schedule(mod, _ctx):
        scheduled, kept = {}, 0
        for gvar, func in mod.functions_items():
            if not isinstance(func, tvm.tirx.PrimFunc) or (func.attrs is not None and func.attrs.get("tirx.is_scheduled")):
                continue
            new = design_space_default(func, sizing)
            if new is None:
                kept += 1
            else:
                scheduled[gvar] = new
        log.debug("default schedules: %d kernels scheduled, %d kept as loops", len(scheduled), kept)
        return with_functions(mod, scheduled)

    return _schedule


def design_space_default(func, target, seed: int = DEFAULT_SEED):
    """``func`` with the first design space of ``target``'s rules that its postprocessors accept,
    or None when none does (or TVM fails on it: the kernel stays loops)."""
    import tvm

    try:
        context = design_space_context(tvm.IRModule({"main": _without_custom_rules(func)}), target, seed)
        for space in context.generate_design_space():
            if all(postproc.apply(space) for postproc in context.space_generator.postprocs):
                return space.mod["main"].with_attr("tirx.is_scheduled", True)
    except Exception as err:  # noqa: BLE001 - TVM raises several types; the kernel stays plain loops
        log.debug("no default schedule for a kernel: %s", str(err).strip().splitlines()[-1:] or err)
    return None


def design_space_context(mod, target, seed: int = DEFAULT_SEED):
    """MetaSchedule's ``TuneContext`` of ``mod`` with the target's default design space, made
    as ``TuneContext.__init__`` makes it but for one step: that imports TVM's tensor intrinsics
    (:func:`.tuning.tensor_intrinsics`, 4-6 s per process here), which the CPU rules of a design space
    do not use, and every process that builds a kernel (each measurement worker) would pay it."""
    from tvm.s_tir import meta_schedule as ms
    from tvm.s_tir.meta_schedule import tune_context
    from tvm.s_tir.meta_schedule.logging import get_logger, get_logging_func

    context = tune_context.TuneContext.__new__(tune_context.TuneContext)
    context.__init_handle_by_constructor__(
        tune_context._ffi_api.TuneContext, mod, target, ms.space_generator.SpaceGenerator.create("post-order-apply"),
        None, "default", 1, seed, get_logging_func(get_logger(__name__)))
    tune_context._ffi_api.TuneContextInitialize(context)
    return context


def _without_custom_rules(func):
    """``func`` without its blocks' ``schedule_rule`` annotations: TOPI marks pools with custom
    rules that TVM registers for no CPU (each would print a warning and be skipped)."""
    from tvm import s_tir

    sch = s_tir.Schedule(func)

    def blocks(parent):
        for block in sch.get_child_blocks(parent):
            yield block
            yield from blocks(block)

    for block in list(blocks(sch.get_sblock("root"))):
        if "schedule_rule" in sch.get(block).annotations:
            sch.unannotate(block, "schedule_rule")
    return sch.mod["main"]
