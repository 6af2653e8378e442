"""``optimize(mod)``: run the search on every dataflow block of every Relax function."""

from __future__ import annotations

import logging
import time
import warnings
from collections import Counter

import tvm
from tvm import relax

from tvm_taso.cost.factory import make_cost_model
from tvm_taso.cost.model import CostModel
from tvm_taso.guard import guard as measured_guard
from tvm_taso.ir.graph import fold_constants
from tvm_taso.ir.ops import OpError
from tvm_taso.ir.relax_bridge import BlockGraph
from tvm_taso.rewrite.rule import Rule, default_rules
from tvm_taso.search.backtrack import SearchStats, search

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
) -> tuple[tvm.IRModule, dict]:
    """Rewrite every Relax function of ``mod`` with the substitutions that lower its cost.

    Parameters
    ----------
    mod : the Relax IRModule (e.g. from ``relax.frontend.onnx.from_onnx``).
    target : the TVM target the cost model prices for (str, dict or Target); default CPU.
    rules : the substitutions; default the shipped library (proved or checked rules).
    cost_model : a :class:`~tvm_taso.cost.model.CostModel`, or ``"auto"``, ``"analytic"``,
        ``"measure"`` or ``"learned"`` (see :func:`~tvm_taso.cost.factory.make_cost_model`).
    alpha : keep exploring graphs up to ``alpha`` times the best cost (TASO's relaxation).
    budget : graphs expanded per region of the search.
    time_limit : wall-clock bound for the whole search, in seconds.
    region_size : ops per search region (the graph is split so time grows linearly).
    guard : compile the original and the rewritten module for ``target``, time them side by
        side on this machine's device (``guard_repeats`` rounds), and keep the rewrite only if
        it was faster in at least three rounds out of four (:func:`tvm_taso.guard.guard`);
        otherwise return ``mod`` unchanged. Without a device for the target the rewrite is
        kept and the report says so. A callable
        ``guard(before, after) -> dict`` (with at least ``"kept"``) decides instead, e.g. on
        MetaSchedule-tuned builds; its dict becomes ``report["guard"]``.

    Returns ``(new_mod, report)``; the report is JSON-serializable: ``cost_before``,
    ``cost_after`` (microseconds, by the cost model), ``search_seconds``, ``expanded``,
    ``applied`` (rule name -> count), ``skipped`` (what was left alone and why) and more.
    """
    if target is None:
        target = tvm.target.Target.current(allow_none=True)
    rules = default_rules() if rules is None else list(rules)
    cost = make_cost_model(cost_model, target)
    stats = SearchStats()
    skipped: Counter = Counter()
    cost_before = cost_after = 0.0
    folded = 0
    t0 = time.perf_counter()
    deadline = t0 + time_limit
    bar = _progress_bar(mod) if progress else None
    new_mod = mod
    for gvar, func in mod.functions.items():
        if not isinstance(func, relax.Function):
            continue
        fname = gvar.name_hint
        fstats = SearchStats()
        try:
            new_func, before, after, nfold = _optimize_function(
                func, fname, rules, cost, alpha, budget, deadline, region_size, fstats, skipped, bar
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
    if bar is not None:
        bar.close()
    seconds = time.perf_counter() - t0
    report = {
        "cost_model": cost.describe(),
        "target": str(target) if target is not None else None,
        "cost_before": cost_before,
        "cost_after": cost_after,
        "speedup_estimate": (cost_before / cost_after) if cost_after else 1.0,
        "search_seconds": seconds,
        "expanded": stats.expanded,
        "candidates": stats.candidates,
        "regions": stats.regions,
        "regions_cut_short": stats.regions_cut_short,
        "regions_reused": stats.reused,
        "regions_stopped": dict(sorted(stats.stopped.items())),
        "applied": dict(sorted(stats.applied.items())),
        "constants_folded": folded + stats.folded,
        "skipped": [{"what": what, "count": n} for what, n in sorted(skipped.items())],
        "curve": _curve(t0, cost_before, stats.curve),
        "rewrites": stats.rewrites,
        "settings": {"alpha": alpha, "budget": budget, "time_limit": time_limit, "region_size": region_size,
                     "guard": guard if isinstance(guard, bool) else getattr(guard, "__name__", type(guard).__name__)},
    }
    if guard and new_mod is not mod:
        report["guard"] = guard(mod, new_mod) if callable(guard) else measured_guard(mod, new_mod, target, guard_repeats)
        if not report["guard"]["kept"]:
            new_mod = mod
            report["guard"]["reverted"] = report["applied"]
            report["applied"] = {}
            report["cost_after"] = report["cost_before"]
            report["speedup_estimate"] = 1.0
    if skipped:
        warnings.warn(
            "tvm-taso left parts of the module as they were: "
            + "; ".join(f"{what} (x{n})" for what, n in sorted(skipped.items())),
            TasoSkippedWarning,
            stacklevel=2,
        )
    log.info(
        "tvm-taso: cost %.1f -> %.1f us in %.2f s, applied %s",
        cost_before,
        cost_after,
        seconds,
        dict(stats.applied),
    )
    return new_mod, report


def _optimize_function(func, fname, rules, cost, alpha, budget, deadline, region_size, stats, skipped, bar):
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
        remaining = max(0.0, deadline - time.perf_counter())
        bstats = SearchStats()
        g = search(
            g0,
            rules,
            cost,
            alpha,
            budget,
            remaining,
            region_size,
            bstats,
            progress=bar.update if bar is not None else None,
        )
        nfold = fold_constants(g)
        c1 = cost.cost(g)
        if c1 >= c0 or g.structural_hash() == g0.structural_hash():
            stats.absorb(bstats, kept=False)
            blocks.append(block)
            before += c0
            after += c0
            continue
        stats.absorb(bstats, kept=True)
        folded += nfold
        blocks.append(bg.to_block(g))
        before += c0
        after += c1
        changed = True
    if not changed:
        return func, before, after, folded
    seq = relax.BlockBuilder().normalize(relax.SeqExpr(blocks, body.body))
    new_func = relax.Function(func.params, seq, func.ret_ty, func.is_pure, func.attrs, func.span)
    return new_func, before, after, folded


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


def _progress_bar(mod):
    try:
        from tqdm import tqdm
    except ImportError:
        return None
    return tqdm(desc="tvm-taso search", unit="region", leave=False)
