"""``optimize(mod)``: the search on every dataflow block of every Relax function, or on an ONNX
model's graph, with the options checked once, the target parsed once and one report."""

from __future__ import annotations

import logging
import time
import warnings
from collections import Counter

import tvm

from tvm_taso import target as targets
from tvm_taso.cost.factory import make_cost_model
from tvm_taso.cost.model import CostModel
from tvm_taso.driver.block import SearchRun
from tvm_taso.driver.front_end import front_end_for
from tvm_taso.driver.report import Report
from tvm_taso.guard import RegionGuard
from tvm_taso.ir import dims
from tvm_taso.progress import progress_bar
from tvm_taso.rewrite.rule import Rule, default_rules
from tvm_taso.search import SearchOptions, SearchStats, check_search
from tvm_taso.search.options import check_repeats
from tvm_taso.search.pool import RegionPool
from tvm_taso.verify.admit import admit

log = logging.getLogger("tvm_taso")


REPEATS = 7  # rounds of a guard's side-by-side timing
ORT_REPEATS = 15  # in onnxruntime, where models and regions are cheap to time: false keeps are rarer


class TasoSkippedWarning(UserWarning):
    """Parts of the module were left as they were (unknown ops, symbolic shapes, ...)."""


def optimize(
    mod: tvm.IRModule,
    target=None,
    *,
    rules: list[Rule] | None = None,
    cost_model: CostModel | str | None = None,
    alpha: float | None = None,
    budget: int | None = None,
    time_limit: float | None = None,
    region_size: int | None = None,
    progress: bool = False,
    guard=None,
    guard_repeats: int | None = None,
    min_gain: float | None = None,
    search: str | None = None,
    region_guard=None,
    workers: int | None = None,
    rpc=None,
    options: SearchOptions | None = None,
    shapes: dict | None = None,
    max_weight_growth: float | None = None,
) -> tuple[tvm.IRModule, dict]:
    """Rewrite every Relax function of ``mod`` with the substitutions that lower its cost.

    Parameters
    ----------
    mod : the Relax IRModule (e.g. from ``relax.frontend.onnx.from_onnx``), or an ONNX model
        from :func:`tvm_taso.load_onnx`: then ``new_mod`` is an ONNX model too, the same one
        with only what the search rewrote replaced (:mod:`tvm_taso.driver.onnx`).
    target : the TVM target the cost model prices for (str, dict or Target); default CPU. For an
        ONNX model, ``"ort[:provider][,key=value...]"`` optimizes for onnxruntime instead
        (:mod:`tvm_taso.ort`: ``ort`` is its CPU provider, ``ort:cuda``, ``ort:tensorrt``, keys
        are session or provider options): kernels are priced by timing them in onnxruntime
        (cost model ``"ort"``), every rewritten region is timed there against the original
        region and kept only if faster, and the whole model is timed against the original
        there, which has the last word (``guard`` defaults to on).
    rules : the substitutions; default the shipped library (proved or checked rules). Rules
        from anywhere else are proved or checked before the search uses them, and refused
        (left out, with a warning naming the counterexample) when they fail
        (:func:`tvm_taso.verify.admit.admit`; ``load_rules(path, trust=True)`` skips this).
    cost_model : a :class:`~tvm_taso.cost.model.CostModel`, or ``"auto"``, ``"analytic"``,
        ``"measure"``, ``"learned"``, ``"ort"`` or ``"rpc"`` (see :func:`~tvm_taso.cost.factory.make_cost_model`).
    rpc : the devices ``cost_model="rpc"`` measures on, through TVM's RPC: ``"host:port/key"``
        (a tracker and the key its devices registered under) or ``"host:port,host:port"`` / a
        list (servers); checked before the search starts (one line when unreachable).
    alpha : keep exploring graphs up to ``alpha`` times the best cost (TASO's relaxation). This
        and the search settings below (``budget`` to ``max_weight_growth``, ``search``,
        ``workers``) take :class:`~tvm_taso.search.options.SearchOptions`' defaults when not given.
    budget : graphs expanded per region of the search.
    time_limit : wall-clock bound for the whole search, in seconds.
    region_size : ops per search region (the graph is split so time grows linearly).
    min_gain : a rewritten region or block is kept only when it is cheaper by more than this
        fraction of its cost (float rounding is not a gain); otherwise the module
        is returned untouched.
    max_weight_growth : a graph whose rewrites would make its weights more than this many times
        larger (weights under 1 MiB may grow to this many MiB) is left as it was,
        with a warning and a ``regions_dropped`` entry. Merges alone do not grow the weights
        (layers sharing weights share their merges); ``report["weight_bytes"]`` gives an ONNX
        model's before and after.
    search : ``"backtrack"`` (TASO's search, the default), ``"eqsat"`` (equality saturation with egglog,
        TENSAT's search; needs ``pip install 'tvm-taso[eqsat]'``) or ``"auto"`` (eqsat, plus
        backtracking on small regions, the cheaper kept); see :mod:`tvm_taso.search.eqsat`.
        ``report["search"]`` says which ran per region, the seconds in the search proper
        (``search_seconds`` also counts reading the module in, folding weights after the
        search and writing it back), the largest e-graph and extraction time;
        ``report["regions_stopped"]`` why each region stopped (``saturated``, ``node limit``,
        ``round limit``, ``deadline``).
    guard : compile the original and the rewritten module for ``target``, time them side by
        side on this machine's device (``guard_repeats`` rounds: default 7, 15 for an ``ort``
        target, whose models and regions are cheap to time), and keep the rewrite only if
        it was faster in at least three rounds out of four (:func:`tvm_taso.guard.guard`);
        otherwise return ``mod`` unchanged. Without a device for the target the rewrite is
        kept and the report says so. ``None`` (default): on for an ``ort`` target, else off. A callable
        ``guard(before, after) -> dict`` (with at least ``"kept"``) decides instead, e.g. on
        MetaSchedule-tuned builds; its dict becomes ``report["guard"]``.
    region_guard : decide region by region, during the search, from measurements: each
        rewritten region is built and timed against the original region side by side on this
        machine's device (``guard_repeats`` rounds), and only the regions measured faster are kept
        (:class:`tvm_taso.guard.RegionGuard`; comparisons are stored, so a second run measures
        nothing new). ``None`` (default): on when ``guard=True`` or the cost model measures
        on this machine (``"measure"``) and the target's device is here; ``True``/``False`` force it; a
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

    shapes : for a Relax module whose shapes hold symbolic sizes (``seq_len``), the sizes each
        symbol is priced at, ``{"seq_len": [1, 128, 2048]}``; a symbol left out is priced at its
        function's ``tir_var_lower_bound`` / ``tir_var_upper_bound`` (and 128 between), else at 1
        and 128. A graph with symbols costs the sum of its costs at every combination of its
        symbols' sizes, and a rewrite is kept only when it is no costlier at any of them;
        ``report["priced_sizes"]`` says where each symbol's sizes came from and
        ``report["cost_at_sizes"]`` gives the cost before and after at each. (An ONNX model's
        sizes are given to :func:`tvm_taso.load_onnx`.)
    workers : processes searching regions, each pass's regions ahead of the serial order
        (:mod:`tvm_taso.search.pool`); default: the cores this process may use. The result is
        the same as with one (unless ``time_limit`` cuts regions short); with a cost model that
        times kernels on this machine (``measure``, ``ort``) regions are searched in one process.
    options : a :class:`~tvm_taso.search.options.SearchOptions` instead of ``alpha``, ``budget``,
        ``time_limit``, ``region_size``, ``min_gain``, ``max_weight_growth``, ``search`` and
        ``workers`` (and with more: the backtracking's ``patience``, eqsat's limits, how many
        ``sweeps`` over the graph); a setting given both ways is refused.

    Raises ValueError (one line) for an option out of range and
    :class:`~tvm_taso.errors.TargetError` for a target TVM does not know.
    """
    options = SearchOptions.from_keywords(options, alpha=alpha, budget=budget, time_limit=time_limit,
                                          region_size=region_size, min_gain=min_gain, search=search, workers=workers,
                                          max_weight_growth=max_weight_growth)
    if guard_repeats is not None:
        check_repeats("guard_repeats", guard_repeats)
    check_search(options.kind)
    named = target is not None or tvm.target.Target.current(allow_none=True) is not None
    target = targets.resolve(target)  # an unknown target: one line listing what is accepted
    sizes = dims.checked_sizes(shapes)
    front = front_end_for(mod)
    front.check(target, sizes)
    if target.runtime is not None:
        target.runtime.check()  # no onnxruntime, no such provider or no device: one line
    guard = target.runtime is not None if guard is None else guard
    if guard_repeats is None:
        guard_repeats = ORT_REPEATS if target.runtime is not None else REPEATS
    started = time.perf_counter()
    deadline = started + options.time_limit  # checking a user's rules counts in it
    refused: list = []
    rules = default_rules() if rules is None else admit(list(rules), refused=refused, deadline=deadline,
                                                         progress=progress)
    rules_seconds = time.perf_counter() - started
    cost = make_cost_model(cost_model, target, rpc=rpc)
    judge = _region_guard(region_guard, guard, cost, target, guard_repeats, front.opset)
    report = Report({}, str(target) if named else None, options, guard, SearchStats(), Counter(),
                    started, rules_seconds=rules_seconds, rules_refused=refused)
    bar = progress_bar("tvm-taso search", "region") if progress else None
    pool = RegionPool.for_run(rules, cost, options)
    run = SearchRun(rules, cost, options, deadline, judge, bar.update if bar is not None else None, pool, sizes)
    try:
        result = front.search(run, report)
    finally:  # an interrupted search too: the bar's line is cleared before anything else is printed
        if pool is not None:
            pool.close()
        if bar is not None:
            bar.close()
    new_mod = result.model
    unused = sorted(set(sizes) - set(report.facts.get("priced_sizes", {})))
    if unused:
        log.warning("shapes: no symbolic size named %s in the module (its symbols: %s)", ", ".join(unused),
                    ", ".join(sorted(report.facts.get("priced_sizes", {}))) or "none")
    report.cost_model = cost.describe()  # after the search: it counts what was measured
    report.cost_before, report.cost_after = result.cost_before, result.cost_after
    report.search_cost_after, report.folded = result.cost_after, result.folded
    report.seconds = time.perf_counter() - started
    report.region_guard = judge.summary(report.stats.decisions) if judge is not None else None
    if guard and new_mod is not mod:
        report.judged(guard(mod, new_mod) if callable(guard)
                      else front.guard(new_mod, target, guard_repeats, tuned_database(cost)))
        if report.reverted:
            new_mod = mod
    report.kernels_before, report.kernels_after = front.kernels(result, new_mod, target)
    if report.stats.regions_cut_short:
        log.warning("time_limit=%gs cut the search short in %d region(s); the result may differ "
                    "from run to run (raise time_limit, or bound the search by budget)",
                    options.time_limit, report.stats.regions_cut_short)
    skipped = report.skipped
    if skipped:
        warnings.warn(
            "tvm-taso left parts of the module as they were: "
            + "; ".join(f"{what} (x{n})" for what, n in sorted(skipped.items())),
            TasoSkippedWarning,
            stacklevel=2,
        )
    log.info("cost %.1f -> %.1f us in %.2f s, applied %s", report.cost_before, report.cost_after, report.seconds,
             dict(report.stats.applied))
    return new_mod, report.to_json()


def _region_guard(region_guard, guard, cost, target, repeats: int, opset: int | None) -> RegionGuard | None:
    """The region judge ``optimize`` was asked for (see its ``region_guard``), or None. An
    ``ort`` target times regions in onnxruntime unless ``region_guard=False``."""
    if isinstance(region_guard, RegionGuard):
        return region_guard
    if region_guard not in (None, True, False):
        raise ValueError(f"region_guard must be None, True, False or a RegionGuard, got {region_guard!r}")
    if region_guard is False:
        return None
    if target.runtime is not None:
        return RegionGuard(target, repeats=repeats, opset=opset)
    if region_guard is None and not (guard is True or (cost.name == "measure" and not getattr(cost, "remote", False))):
        return None
    if targets.device(target) is None:
        if region_guard:
            log.warning("region_guard: no %s device here to time regions on; deciding by the cost model",
                        targets.kind(target))
        return None
    return RegionGuard(target, repeats=repeats, database=tuned_database(cost))


def tuned_database(cost) -> str | None:
    """The MetaSchedule database the ``tuned`` cost model prices from, or None: what the guards
    then build with, so that they time what the search priced."""
    return str(cost.path) if cost.name == "tuned" else None
