"""``optimize(mod)``: run the search on every dataflow block of every Relax function."""

from __future__ import annotations

import logging
import math
import time
import warnings
from collections import Counter

import tvm
import tvm_ffi
from tvm import relax

from tvm_taso import target as targets

from tvm_taso.cost.factory import make_cost_model
from tvm_taso.cost.kernel_build import launched_kernels
from tvm_taso.cost.model import CostModel
from tvm_taso.guard import RegionGuard
from tvm_taso.guard import guard as measured_guard
from tvm_taso.io.onnx_import import InputError
from tvm_taso.io.onnx_model import OnnxModel
from tvm_taso.io.onnx_search import guard_onnx, optimize_onnx
from tvm_taso.ir.graph import fold_constants
from tvm_taso.ir.ops import OpError
from tvm_taso.ir.relax_bridge import BlockGraph, foreign_function
from tvm_taso.progress import progress_bar
from tvm_taso.rewrite.rule import Rule, default_rules
from tvm_taso.search.backtrack import SearchStats
from tvm_taso.search import check_search, search
from tvm_taso.search.options import validate
from tvm_taso.verify.admit import admit

log = logging.getLogger("tvm_taso")


class TasoSkippedWarning(UserWarning):
    """Parts of the module were left as they were (unknown ops, symbolic shapes, ...)."""


def optimize(
    mod: tvm.IRModule,
    target=None,
    rules: list[Rule] | None = None,
    cost_model: CostModel | str | None = None,
    alpha: float = 1.05,
    budget: int = 200,
    time_limit: float = 60.0,
    region_size: int = 32,
    progress: bool = False,
    guard=False,
    guard_repeats: int = 7,
    min_gain: float = 1e-6,
    search: str = "backtrack",
    region_guard=None,
) -> tuple[tvm.IRModule, dict]:
    """Rewrite every Relax function of ``mod`` with the substitutions that lower its cost.

    Parameters
    ----------
    mod : the Relax IRModule (e.g. from ``relax.frontend.onnx.from_onnx``), or an ONNX model
        from :func:`tvm_taso.load_onnx`: then ``new_mod`` is an ONNX model too, the same one
        with only what the search rewrote replaced (:mod:`tvm_taso.io.onnx_search`).
    target : the TVM target the cost model prices for (str, dict or Target); default CPU.
    rules : the substitutions; default the shipped library (proved or checked rules). Rules
        from anywhere else are proved or checked before the search uses them, and refused
        (left out, with a warning naming the counterexample) when they fail
        (:func:`tvm_taso.verify.admit.admit`; ``load_rules(path, trust=True)`` skips this).
    cost_model : a :class:`~tvm_taso.cost.model.CostModel`, or ``"auto"``, ``"analytic"``,
        ``"measure"`` or ``"learned"`` (see :func:`~tvm_taso.cost.factory.make_cost_model`).
    alpha : keep exploring graphs up to ``alpha`` times the best cost (TASO's relaxation).
    budget : graphs expanded per region of the search.
    time_limit : wall-clock bound for the whole search, in seconds.
    region_size : ops per search region (the graph is split so time grows linearly).
    min_gain : a rewritten region or block is kept only when it is cheaper by more than this
        fraction of its cost (default 1e-6: float rounding is not a gain); otherwise the module
        is returned untouched.
    search : ``"backtrack"`` (TASO's search), ``"eqsat"`` (equality saturation with egglog,
        TENSAT's search; needs ``pip install 'tvm-taso[eqsat]'``) or ``"auto"`` (eqsat, plus
        backtracking on small regions, the cheaper kept); see :mod:`tvm_taso.search.eqsat`.
        ``report["search"]`` says which ran per region, the seconds in the search proper
        (``search_seconds`` also counts reading the module in, folding weights after the
        search and writing it back), the largest e-graph and extraction time;
        ``report["regions_stopped"]`` why each region stopped (``saturated``, ``node limit``,
        ``round limit``, ``deadline``).
    guard : compile the original and the rewritten module for ``target``, time them side by
        side on this machine's device (``guard_repeats`` rounds), and keep the rewrite only if
        it was faster in at least three rounds out of four (:func:`tvm_taso.guard.guard`);
        otherwise return ``mod`` unchanged. Without a device for the target the rewrite is
        kept and the report says so. A callable
        ``guard(before, after) -> dict`` (with at least ``"kept"``) decides instead, e.g. on
        MetaSchedule-tuned builds; its dict becomes ``report["guard"]``.
    region_guard : decide region by region, during the search, from measurements: each
        rewritten region is built and timed against the original region side by side on this
        machine's device (``guard_repeats`` rounds), and only the regions measured faster are kept
        (:class:`tvm_taso.guard.RegionGuard`; comparisons are stored, so a second run measures
        nothing new). ``None`` (default): on when ``guard=True`` or the cost model measures
        (``"measure"``) and the target's device is here; ``True``/``False`` force it; a
        ``RegionGuard`` is used as is. ``report["region_guard"]`` lists every region's verdict
        (speedup with quartiles, kept or dropped); the whole-module ``guard`` still has the last word.

    Returns ``(new_mod, report)``; the report is strict JSON (``json.dumps(report,
    allow_nan=False)`` works): ``cost_before``, ``cost_after`` (microseconds, by the cost model;
    ``None`` with a line in ``notes`` when not finite), ``search_seconds``, ``expanded``,
    ``applied`` (rule name -> count, only rewrites present in ``new_mod``), ``skipped`` (what was
    left alone and why), ``rules_refused``, ``kernels_before`` and ``kernels_after`` (kernels
    TVM launches for the module's Relax functions, opaque ones included; for an ONNX model, the
    fusion model's count on its graph, :func:`tvm_taso.cost.model.kernel_count`),
    ``regions_dropped`` (rewritten regions that could not be spliced back, with their rules and
    why) and more. Functions marked ``Primitive``, ``Composite`` or ``Codegen`` (BYOC partitions) are
    left alone.

    Raises ValueError (one line) for an option out of range and
    :class:`~tvm_taso.target.TargetError` for a target TVM does not know.
    """
    validate(alpha=alpha, budget=budget, time_limit=time_limit, region_size=region_size, min_gain=min_gain,
             guard_repeats=guard_repeats)
    check_search(search)
    if target is None:
        target = tvm.target.Target.current(allow_none=True)
    else:
        targets.parse(target)  # an unknown target: one line listing what is accepted
    refused: list = []
    t0 = time.perf_counter()
    deadline = t0 + time_limit  # checking a user's rules counts in it
    rules = default_rules() if rules is None else admit(list(rules), refused=refused, deadline=deadline,
                                                         progress=progress)
    rules_seconds = time.perf_counter() - t0
    cost = make_cost_model(cost_model, target)
    judge = _region_guard(region_guard, guard, cost, target, guard_repeats)
    stats = SearchStats()
    skipped: Counter = Counter()
    cost_before = cost_after = 0.0
    folded = 0
    bar = progress_bar("tvm-taso search", "region") if progress else None
    extra = {}
    try:
        if isinstance(mod, OnnxModel):
            try:
                new_mod, cost_before, cost_after, folded, extra = optimize_onnx(
                    mod, rules, cost, alpha, budget, deadline, region_size, stats, skipped, bar, min_gain, search,
                    judge
                )
            except InputError:
                raise
            except Exception as err:  # noqa: BLE001 - the pass's promise: an internal failure keeps the model
                log.debug("optimizing %s failed", mod.name, exc_info=True)
                skipped[f"{mod.name}: left as is after an internal error ({type(err).__name__}: {err})"] += 1
                new_mod = mod
                stats.applied, stats.rewrites, stats.curve = Counter(), [], []
        else:
            new_mod, cost_before, cost_after, folded = _optimize_module(
                mod, rules, cost, alpha, budget, deadline, region_size, stats, skipped, bar, min_gain, search, judge
            )
    finally:  # an interrupted search too: the bar's line is cleared before anything else is printed
        if bar is not None:
            bar.close()
    if new_mod is not mod and not isinstance(mod, OnnxModel) and tvm_ffi.structural_equal(new_mod, mod):
        # every rewrite was undone by a later one: the module is the same, so say nothing was applied
        new_mod, cost_after = mod, cost_before
        stats.applied, stats.rewrites, stats.curve = Counter(), [], []
    seconds = time.perf_counter() - t0
    report = {
        "cost_model": cost.describe(),
        "target": str(target) if target is not None else None,
        "cost_before": cost_before,
        "cost_after": cost_after,
        "speedup_estimate": (cost_before / cost_after) if cost_after else 1.0,
        "search_cost_after": cost_after,  # the search's estimate, kept when a guard reverts
        "search_seconds": seconds,
        "expanded": stats.expanded,
        "candidates": stats.candidates,
        "regions": stats.regions,
        "regions_cut_short": stats.regions_cut_short,
        "regions_reused": stats.reused,
        "regions_stopped": dict(sorted(stats.stopped.items())),
        "regions_dropped": stats.dropped,
        "search": {"kind": search, "seconds": stats.seconds, "regions": dict(stats.engines),
                   "egraph_nodes": stats.egraph_nodes, "egraph_classes": stats.egraph_classes,
                   "extraction_seconds": stats.extraction_seconds, "extraction": dict(stats.extraction_methods),
                   "refined": stats.refined},
        "applied": dict(sorted(stats.applied.items())),
        "constants_folded": folded + stats.folded,
        "skipped": [{"what": what, "count": n} for what, n in sorted(skipped.items())],
        "curve": _curve(t0, cost_before, stats.curve),
        "rewrites": stats.rewrites,
        "rules_refused": [r.to_json() for r in refused],
        "rules_check_seconds": rules_seconds,
        **extra,
        **({"region_guard": judge.summary(stats.decisions)} if judge is not None else {}),
        "settings": {"alpha": alpha, "budget": budget, "time_limit": time_limit, "region_size": region_size,
                     "min_gain": min_gain, "search": search, "region_guard": judge is not None,
                     "guard": guard if isinstance(guard, bool) else getattr(guard, "__name__", type(guard).__name__)},
    }
    if guard and new_mod is not mod:
        if callable(guard):
            report["guard"] = guard(mod, new_mod)
        elif isinstance(mod, OnnxModel):
            report["guard"] = guard_onnx(mod, new_mod, target, guard_repeats)
        else:
            report["guard"] = measured_guard(mod, new_mod, target, guard_repeats)
        if not report["guard"]["kept"]:
            new_mod = mod
            report["guard"]["reverted"] = report["applied"]
            report["applied"] = {}
            report["cost_after"] = report["cost_before"]
            report["speedup_estimate"] = 1.0
    if isinstance(mod, OnnxModel):  # counted on the engine graph: TVM's importer refuses many exports
        report.setdefault("kernels_before", None)
        report["kernels_after"] = report["kernels_before"] if new_mod is mod else report.get("kernels_after")
    else:
        report["kernels_before"] = launched_kernels(mod, target)
        report["kernels_after"] = report["kernels_before"] if new_mod is mod else launched_kernels(new_mod, target)
    if stats.regions_cut_short:
        log.warning("time_limit=%gs cut the search short in %d region(s); the result may differ "
                    "from run to run (raise time_limit, or bound the search by budget)",
                    time_limit, stats.regions_cut_short)
    _strict_json(report)
    if skipped:
        warnings.warn(
            "tvm-taso left parts of the module as they were: "
            + "; ".join(f"{what} (x{n})" for what, n in sorted(skipped.items())),
            TasoSkippedWarning,
            stacklevel=2,
        )
    log.info(
        "cost %.1f -> %.1f us in %.2f s, applied %s",
        cost_before,
        cost_after,
        seconds,
        dict(stats.applied),
    )
    return new_mod, report


def _optimize_module(mod, rules, cost, alpha, budget, deadline, region_size, stats, skipped, bar, min_gain, kind,
                     judge=None):
    """Search every Relax function of ``mod`` with the search ``kind``: (new module, cost before,
    cost after, folded)."""
    cost_before = cost_after = 0.0
    folded = 0
    new_mod = mod
    for gvar, func in mod.functions.items():
        if not isinstance(func, relax.Function):
            continue
        if foreign_function(func):
            log.debug("@%s has the %s attribute: left alone", gvar.name_hint, foreign_function(func))
            continue
        fname = gvar.name_hint
        fstats = SearchStats()
        try:
            new_func, before, after, nfold = _optimize_function(
                func, fname, rules, cost, alpha, budget, deadline, region_size, fstats, skipped, bar, min_gain,
                kind, judge
            )
        except Exception as err:  # noqa: BLE001 - never fail the user's pipeline
            log.debug("optimizing %s failed", fname, exc_info=True)
            skipped[f"@{fname}: left as is after an internal error ({type(err).__name__}: {err})"] += 1
            stats.absorb(fstats, kept=False)
            continue
        kept = new_func is not func
        if kept:
            candidate = _with_function(new_mod, gvar, new_func)
            if not relax.analysis.check_well_formed(candidate):
                skipped[f"@{fname}: rewritten function was not well formed; kept the original"] += 1
                after, kept = before, False
            else:
                new_mod = candidate
                folded += nfold
        stats.absorb(fstats, kept)
        cost_before += before
        cost_after += after
    return new_mod, cost_before, cost_after, folded


def _optimize_function(func, fname, rules, cost, alpha, budget, deadline, region_size, stats, skipped, bar,
                       min_gain, kind, judge=None):
    body = func.body
    if not isinstance(body, relax.SeqExpr):
        skipped[f"@{fname}: body is not a sequence of blocks"] += 1
        return func, 0.0, 0.0, 0
    blocks = []
    changed = False
    before = after = 0.0
    folded = 0
    for block in body.blocks:
        if not isinstance(block, relax.DataflowBlock):
            if len(block.bindings):
                skipped[f"@{fname}: non-dataflow block"] += 1
            blocks.append(block)
            continue
        local = Counter()
        try:
            bg = BlockGraph(block, local)
        except OpError as err:
            skipped[f"@{fname}: dataflow block ({err})"] += 1
            blocks.append(block)
            continue
        for what, n in local.items():
            skipped[f"@{fname}: {what}"] += n
        g0 = bg.graph
        c0 = cost.cost(g0)
        for accept in (None, bg.to_block):
            remaining = max(0.0, deadline - time.perf_counter())
            bstats = SearchStats()
            g = search(g0, rules, cost, alpha, budget, remaining, region_size, bstats,
                       progress=bar.update if bar is not None else None, min_gain=min_gain, kind=kind, judge=judge,
                       accept=accept)
            nfold = fold_constants(g)
            c1 = cost.cost(g)
            if not c1 < c0 * (1.0 - min_gain) or g.structural_hash() == g0.structural_hash():
                new_block = None
                break
            try:
                new_block = bg.to_block(g)
                break
            except Exception as err:  # noqa: BLE001 - search again, each region's result written as it is found
                if accept is not None:
                    raise
                log.warning("@%s: the search's result could not be written back (%s: %s); searching again, "
                            "leaving out the regions that cannot be", fname, type(err).__name__, err)
                stats.absorb(bstats, kept=False)
        if new_block is None:
            stats.absorb(bstats, kept=False)
            blocks.append(block)
            before += c0
            after += c0
            continue
        stats.absorb(bstats, kept=True)
        folded += nfold
        blocks.append(new_block)
        before += c0
        after += c1
        changed = True
    if not changed:
        return func, before, after, folded
    seq = relax.BlockBuilder().normalize(relax.SeqExpr(blocks, body.body))
    new_func = relax.Function(func.params, seq, func.ret_ty, func.is_pure, func.attrs, func.span)
    return new_func, before, after, folded


def _region_guard(region_guard, guard, cost, target, repeats: int) -> RegionGuard | None:
    """The region judge ``optimize`` was asked for (see its ``region_guard``), or None."""
    if isinstance(region_guard, RegionGuard):
        return region_guard
    if region_guard not in (None, True, False):
        raise ValueError(f"region_guard must be None, True, False or a RegionGuard, got {region_guard!r}")
    if region_guard is False:
        return None
    if region_guard is None and not (guard is True or cost.name == "measure"):
        return None
    target = targets.parse(target if target is not None else "llvm")
    if targets.device(target) is None:
        if region_guard:
            log.warning("region_guard: no %s device here to time regions on; deciding by the cost model",
                        target.kind.name)
        return None
    return RegionGuard(target, repeats=repeats)


def _strict_json(report: dict) -> None:
    """Make ``report`` strict JSON in place: a cost that is not a finite number (a kernel that
    failed to build or run costs infinity under ``measure``) becomes None, with one line in
    ``report["notes"]`` per field."""
    notes = []

    def clean(x, path):
        if isinstance(x, float) and not math.isfinite(x):
            notes.append(f"{path} was {x!r} (a kernel that failed to build or run, or no time measured); "
                         "written as null")
            return None
        if isinstance(x, dict):
            return {k: clean(v, f"{path}.{k}" if path else str(k)) for k, v in x.items()}
        if isinstance(x, (list, tuple)):
            return [clean(v, f"{path}[{i}]") for i, v in enumerate(x)]
        return x

    cleaned = clean(report, "")
    report.clear()
    report.update(cleaned)
    if notes:
        report["notes"] = report.get("notes", []) + notes


def _curve(t0: float, start: float, changes: list) -> list:
    """Best total cost against seconds since the search started."""
    points, total = [[0.0, start]], start
    for t, delta in changes:
        total += delta
        points.append([round(t - t0, 6), total])
    return points


def _with_function(mod: tvm.IRModule, gvar, func) -> tvm.IRModule:
    new = mod.clone()
    new.update_func(gvar, func)
    return new
