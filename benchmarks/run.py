"""The benchmark suite: TASO's workloads, optimized by tvm-taso and measured side by side.

    python -m benchmarks.run [--models NAME ...] [--target llvm|cuda] [--cost auto|analytic|measure|learned]
        [--tune-trials N] [--repeats N] [--quick] [--no-guard] [--out DIR] [--readme]

For every model of :mod:`benchmarks.models`, in one run:

1. build the ONNX model (``onnx.checker`` full check) and import it through TVM (``tvm_taso.io.onnx_import.import_relax``);
2. search (``tvm_taso.optimize`` for the target, with the chosen cost model; unless
   ``--no-guard``, each rewritten region is timed against the original region and kept only
   when faster, and an end-to-end timing has the last word): search seconds, rules applied,
   regions kept and dropped, estimated cost;
   and the kernels TVM launches before and after; then TVM's own TASO-like passes in place of
   the search (:mod:`benchmarks.peer`), priced by the same cost model;
3. compile the original, the optimized and the peer module with the same Relax pipeline (the target's
   default one; with ``--tune-trials N`` each module first gets N MetaSchedule trials and its
   tuned schedules) and time them alternating on the device, ``--repeats`` rounds;
4. export the optimized module (``tvm_taso.export_onnx``) and time the original and the
   exported ONNX in onnxruntime the same way;
5. check outputs on one random input: TVM without and with TasoOptimize and onnxruntime on the
   exported model, each against onnxruntime on the original (max relative error <= 1e-4).

Latencies are medians over rounds; speedups are medians of the per-round ratios, with their
quartiles as the noise band. Writes ``results.json`` (all numbers), ``results.md`` (the table)
and ``results.png`` (the chart) to ``--out``; ``--readme`` also rewrites the results section of
``benchmarks/README.md`` and the summary table of ``README.md``. ``--quick`` builds tiny models
(seconds; run by the tests).
"""

from __future__ import annotations

import argparse
import datetime
import json
import logging
import os
import platform
import re
import sys
import tempfile
import time
import warnings
from pathlib import Path

import numpy as np
import onnx

import tvm_taso
from tvm_taso import output_check
from tvm_taso import target as targets
from tvm_taso.cost.factory import make_cost_model
from tvm_taso.cost.kernel_build import launched_kernels
from tvm_taso.cost.latency import CompiledModule, side_by_side, speedup
from tvm_taso.guard import verdict
from tvm_taso.io.onnx_export import relax_to_onnx
from tvm_taso.io.onnx_import import import_relax
from tvm_taso.numerics import TOLERANCE, relative_error
from tvm_taso.ort.runtime import OrtRuntime, OrtSession
from tvm_taso.runtime import inputs_for

from . import models
from .peer import apply_peer_passes, price

log = logging.getLogger("benchmarks.run")

ROOT = Path(__file__).resolve().parents[1]
TARGETS = {"llvm": {"kind": "llvm", "num-cores": os.cpu_count() or 1}, "cuda": "cuda"}
# Search seconds in TENSAT's table (MLSys'21), its TASO column against its TENSAT column: TASO's
# backtracking search as TENSAT's authors ran it, and TENSAT, on their machine with their
# budgets; not rerun here
PUBLISHED_SEARCH_SECONDS = {
    "bert-base": (13.6, 1.4),
    "resnext50": (25.3, 0.7),
    "nasnet-a": (1226.0, 10.6),
    "nasrnn": (177.3, 0.5),
    "inception-v3": (68.6, 5.1),
    "squeezenet1.1": (16.4, 0.3),
    "vgg19": (8.9, 0.4),
}
README_START, README_END = "<!-- results:start -->", "<!-- results:end -->"  # benchmarks/README.md
SUMMARY_START, SUMMARY_END = "<!-- summary:start -->", "<!-- summary:end -->"  # README.md


# -- one model ---------------------------------------------------------------------------------


def relax_ops(mod) -> int:
    from tvm import relax

    return sum(len(b.bindings) for b in mod["main"].body.blocks if isinstance(b, relax.DataflowBlock))


def tuned_pipeline(mod, target, trials: int, work_dir: Path):
    """Tune ``mod``'s kernels with ``trials`` MetaSchedule trials in ``work_dir``
    (:func:`tvm_taso.cost.tuning.tune`: split by share of the work); the target's pipeline
    with the tuned schedules applied."""
    from tvm_taso.cost.kernel_build import build_pipeline
    from tvm_taso.cost.tuning import tune

    tune(mod, target, work_dir, trials)
    return build_pipeline(targets.with_cores(target), database=work_dir)


class TunedGuard:
    """The guard of :func:`tvm_taso.optimize` on tuned builds: tune the original and the
    rewritten module with the same trial budget, time them side by side, keep the rewrite
    only if it won at least three rounds in four. Keeps the builds for the benchmark itself."""

    __name__ = "tuned"

    def __init__(self, target, inputs, trials: int, repeats: int, min_repeat_ms: int, work_dir: Path):
        self.target, self.inputs, self.trials = targets.with_cores(target), inputs, trials  # as tuned
        self.repeats, self.min_repeat_ms, self.work_dir = repeats, min_repeat_ms, work_dir
        self.built: dict[str, CompiledModule] = {}
        self.tune_seconds = 0.0

    def build(self, mod, key: str) -> CompiledModule:
        t0 = time.perf_counter()
        pipeline = tuned_pipeline(mod, self.target, self.trials, self.work_dir / key)
        self.tune_seconds += time.perf_counter() - t0
        self.built[key] = CompiledModule(mod, self.target, self.inputs, pipeline)
        return self.built[key]

    def __call__(self, before, after) -> dict:
        pair = {"before": self.build(before, "without"), "after": self.build(after, "with")}
        result = verdict(pair, self.repeats, self.min_repeat_ms, how=f"{self.trials} MetaSchedule trials per module")
        if not result["kept"]:
            self.built["with"] = self.built["without"]  # the optimizer returns the original module
        return result


def ort_model(proto: onnx.ModelProto, inputs: list[np.ndarray], optimized: bool = True):
    """``proto`` in an onnxruntime session on fixed feeds: all graph optimizations (none when not
    ``optimized``), one thread per core, no spinning -- a session's idle threads spin for a
    while after each run, taking the cores from whichever session runs next: measured, that
    skewed side-by-side ratios by up to 14%."""
    runtime = OrtRuntime("cpu", session_options={
        "intra_op_num_threads": os.cpu_count() or 1, "session.intra_op.allow_spinning": 0,
        "graph_optimization_level": "all" if optimized else "disable"})
    return OrtSession(runtime, proto, dict(zip(output_check.graph_input_names(proto, len(inputs)), inputs)))


def tvm_peer(mod, target, cost_name: str) -> tuple[object, dict]:
    """TVM's own TASO-like passes on ``mod`` (:mod:`benchmarks.peer`), priced by the search's
    cost model and counted in kernels: the module to time and the row's ``peer`` entry."""
    peer_mod, priced_mod, info = apply_peer_passes(mod)
    cost = make_cost_model(cost_name, target)
    info.update(cost_before_us=price(mod, cost), cost_after_us=price(priced_mod, cost),
                kernels_after=launched_kernels(peer_mod, target))
    return peer_mod, info


def build_peer(peer_mod, target, inputs, tuned, built, reference, info):
    """The peer module built as the others are (tuned when they are; the original's build when
    the passes changed nothing), with its output error in ``info``; None, with the error in
    ``info``, when it does not build or run."""
    try:
        if not info["changed"]:
            peer = built["without"]
        elif tuned is not None:
            peer = tuned.build(peer_mod, "peer")
        else:
            peer = CompiledModule(peer_mod, target, inputs)
        info["max_relative_error"] = relative_error(reference, peer.run())
        return peer
    except Exception as err:  # noqa: BLE001 - the peer failing is a result, not a crash
        info["error"] = f"{type(err).__name__}: {str(err).strip().splitlines()[-1] if str(err).strip() else ''}"[:200]
        log.warning("TVM passes: %s", info["error"])
        return None


def bench_model(name: str, args) -> dict:
    target = targets.parse(TARGETS.get(args.target, args.target))
    row: dict = {"model": name, "size": "quick" if args.quick else "full", "target": args.target}
    t0 = time.perf_counter()
    proto = models.build(name, args.quick)
    onnx.checker.check_model(proto, full_check=True)
    row["build_seconds"] = time.perf_counter() - t0
    row["onnx_nodes"] = len(proto.graph.node)
    row["params"] = int(sum(np.prod(t.dims, dtype=np.int64) for t in proto.graph.initializer))

    t0 = time.perf_counter()
    mod = import_relax(proto)
    row["import_seconds"] = time.perf_counter() - t0
    inputs = inputs_for(mod, seed=0)

    has_device = targets.device(target) is not None
    tuned = None
    if args.tune_trials > 0 and has_device:
        tuned = TunedGuard(target, inputs, args.tune_trials, args.repeats, args.min_repeat_ms,
                           Path(tempfile.mkdtemp(prefix=f"tvm-taso-tune-{name}-")))
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always", tvm_taso.TasoSkippedWarning)
        new, report = tvm_taso.optimize(mod, target=target, cost_model=args.cost, time_limit=args.time_limit,
                                        guard=(tuned or True) if args.guard else False, region_guard=args.guard,
                                        guard_repeats=args.repeats)
    for w in caught:
        log.warning("%s: %s", name, w.message)
    row.update(
        relax_ops_before=relax_ops(mod),
        relax_ops_after=relax_ops(new),
        cost_model=report["cost_model"]["name"],
        search_seconds=report["search_seconds"],
        regions=report["regions"],
        expanded=report["expanded"],
        applied=report["applied"],
        rules_applied=sum(report["applied"].values()),
        cost_before_us=report["cost_before"],
        cost_after_us=report["cost_after"],
        search_cost_after_us=report["search_cost_after"],
        kernels_before=report["kernels_before"],
        kernels_after=report["kernels_after"],
        guard={k: v for k, v in report.get("guard", {}).items() if k != "reverted"}
        | {"reverted_rules": sum(report.get("guard", {}).get("reverted", {}).values())},
        region_guard=report.get("region_guard"),
        skipped=report["skipped"],
        unchanged=new is mod,
    )
    if name in PUBLISHED_SEARCH_SECONDS:
        taso, tensat = PUBLISHED_SEARCH_SECONDS[name]
        row.update(taso_search_seconds=taso, tensat_search_seconds=tensat,
                   search_vs_taso=row["search_seconds"] / taso, search_vs_tensat=row["search_seconds"] / tensat)
    log.info("%s: imported in %.1f s, searched in %.1f s, %d rewrites kept, est. cost %.3gx", name,
             row["import_seconds"], row["search_seconds"], row["rules_applied"],
             row["cost_before_us"] / row["cost_after_us"] if row["cost_after_us"] else 1.0)

    peer_mod, row["peer"] = tvm_peer(mod, target, args.cost)
    reference = ort_model(proto, inputs, optimized=False).run()
    errors = {}
    if has_device:
        if tuned is None:
            built = {k: CompiledModule(m, target, inputs) for k, m in (("without", mod), ("with", new))}
        else:  # the guard tuned and built both unless the search changed nothing or was not guarded
            if "without" not in tuned.built:
                tuned.build(mod, "without")
            if "with" not in tuned.built:
                tuned.built["with"] = tuned.built["without"] if new is mod else tuned.build(new, "with")
            built = dict(tuned.built)
            row["tune_seconds"] = tuned.tune_seconds
        for k, m in built.items():
            errors[f"tvm_{k}"] = relative_error(reference, m.run())
        peer_build = build_peer(peer_mod, target, inputs, tuned, built, reference, row["peer"])
        samplers = {k: (lambda m=m: m.time_ms(args.min_repeat_ms)) for k, m in built.items()}
        if peer_build is not None:
            samplers["peer"] = lambda: peer_build.time_ms(args.min_repeat_ms)
        samples = side_by_side(samplers, args.repeats, args.timing_limit)
        row["tvm"] = speedup(samples["without"], samples["with"])
        row["tvm"]["compile_seconds"] = {k: m.compile_seconds for k, m in built.items()}
        row["tvm"]["samples_ms"] = samples
        if peer_build is not None:
            row["peer"]["tvm"] = speedup(samples["without"], samples["peer"])
        del built, peer_build
        log.info("%s: TVM %.2f -> %.2f ms, %.3fx (quartiles %.3f-%.3f)", name, row["tvm"]["before_ms"],
                 row["tvm"]["after_ms"], row["tvm"]["ratio"], row["tvm"]["ratio_low"], row["tvm"]["ratio_high"])
    else:
        row["tvm"] = None
        log.warning("%s: no %s device here; TVM latency not measured", name, target.kind.name)

    exported = relax_to_onnx(new)
    onnx.checker.check_model(exported, full_check=True)
    errors["ort_exported"] = relative_error(reference, ort_model(exported, inputs, optimized=False).run())
    # the round trip alone (import, export, no rewrite) changes how onnxruntime runs a model; its
    # own column keeps that apart from what the rewrites buy
    ort = {"original": ort_model(proto, inputs), "round trip": ort_model(relax_to_onnx(mod), inputs),
           "optimized": ort_model(exported, inputs)}
    samples = side_by_side({k: (lambda m=m: m.time_ms(args.min_repeat_ms)) for k, m in ort.items()},
                           args.ort_repeats or 3 * args.repeats, args.timing_limit)
    row["ort"] = speedup(samples["original"], samples["optimized"])
    row["ort"]["rewrites_only"] = speedup(samples["round trip"], samples["optimized"])
    row["ort"]["samples_ms"] = samples
    row["check"] = {"max_relative_error": errors, "tolerance": TOLERANCE,
                    "ok": all(e <= TOLERANCE for e in errors.values())}
    (log.info if row["check"]["ok"] else log.error)("%s: max relative errors %s", name,
                                                     {k: f"{v:.2e}" for k, v in errors.items()})
    return row


# -- reports -----------------------------------------------------------------------------------


def ratio_text(r: dict | None) -> str:
    """A side-by-side ratio with its quartiles, as the tables print it."""
    if not r:
        return "—"
    return f"{r['ratio']:.3f} ({r['ratio_low']:.2f}–{r['ratio_high']:.2f})"


def _ms(r: dict | None) -> str:
    return f"{r['before_ms']:.4g} → {r['after_ms']:.4g}" if r else "—"


def _peer(r: dict) -> str:
    """TVM's own passes: estimated speedup, kernels, measured speedup, and what failed."""
    peer = r.get("peer")
    if not peer:
        return "—"
    est = peer["cost_before_us"] / peer["cost_after_us"] if peer.get("cost_after_us") else 1.0
    cell = f"est. {est:.3f}, {peer.get('kernels_after', '?')} kernels, {ratio_text(peer.get('tvm'))}"
    problems = [f"{name} failed ({err})" for name, err in peer.get("failed", {}).items()]
    if peer.get("error"):
        problems.append(f"build failed ({peer['error']})")
    return cell + ("; " + "; ".join(problems) if problems else "")


def _guard_seconds(r: dict) -> str:
    """Seconds spent timing regions during the search, then the whole model."""
    regions, model = (r.get("region_guard") or {}).get("seconds"), (r.get("guard") or {}).get("seconds")
    if regions is None and model is None:
        return "—"
    return f"{regions or 0:.0f} + {model or 0:.0f}"


def markdown(result: dict) -> str:
    cols = ["model", "cost model", "rounds (TVM, ORT)", "params", "import s", "search s (this run)",
            "TASO / TENSAT search s (TENSAT's table)", "guard s",
            "rewrites kept", "est. speedup (search)", "kernels before → after", "TVM ms without → with",
            "TVM speedup", "TVM's own passes instead", "ORT ms original → exported", "ORT speedup",
            "ORT, rewrites only", "max rel. err", "ok"]  # fmt: skip
    lines = ["| " + " | ".join(cols) + " |", "|" + "---|" * len(cols)]
    for r in result["rows"]:
        if "error" in r:
            lines.append(f"| {r['model']} | failed: {r['error']} |" + " |" * (len(cols) - 2))
            continue
        search_after = r.get("search_cost_after_us", r["cost_after_us"])
        est = f"{r['cost_before_us'] / search_after:.3f}" if search_after else "—"
        taso, tensat = PUBLISHED_SEARCH_SECONDS.get(r["model"], (None, None))
        published = f"{taso:g} / {tensat:g}" if taso is not None else "—"
        guard = r.get("guard") or {}
        kept = str(r["rules_applied"]) + (f" ({guard['reverted_rules']} reverted)" if guard.get("reverted_rules") else "")
        regions = r.get("region_guard")
        if regions and regions["regions"]:
            kept += f"; regions {regions['kept']} kept, {regions['dropped']} dropped of {regions['regions']} timed"
        if r.get("unchanged"):
            kept += ", model unchanged"
            if guard.get("reverted_rules"):
                est += " (reverted by the guard)"
        kernels = f"{r['kernels_before']} → {r['kernels_after']}" if r.get("kernels_before") is not None else "—"
        cost_model = r["cost_model"]["name"] if isinstance(r["cost_model"], dict) else r["cost_model"]
        rounds = f"{r['tvm'].get('rounds', '—')}, {r['ort'].get('rounds', '—')}"
        cells = [
            r["model"], f"`{cost_model}`", rounds, f"{r['params'] / 1e6:.1f} M", f"{r['import_seconds']:.1f}", f"{r['search_seconds']:.2f}",
            published, _guard_seconds(r), kept, est, kernels, _ms(r["tvm"]),
            ratio_text(r["tvm"]), _peer(r), _ms(r["ort"]), ratio_text(r["ort"]), ratio_text(r["ort"].get("rewrites_only")),
            f"{max(r['check']['max_relative_error'].values()):.1e}", "yes" if r["check"]["ok"] else "**NO**",
        ]  # fmt: skip
        lines.append("| " + " | ".join(cells) + " |")
    return "\n".join(lines)


def describe_run(result: dict) -> str:
    """The paragraph above the table: when, where, how, and what the columns mean (plus the
    run's ``notes``, e.g. a row taken from a rerun)."""
    return " ".join([_describe_settings(result), *result.get("notes", [])])


def _describe_settings(result: dict) -> str:
    s = result["settings"]
    tuning = f"{s['tune_trials']} MetaSchedule trials per module" if s["tune_trials"] else "no tuning"
    return (
        f"{result['date']}, {result['machine']}; target {s['target']}, cost model asked for `{s['cost']}` "
        f"(the one used is in each row), {tuning}, guard {'on' if s['guard'] else 'off'}, up to {s['repeats']} "
        f"timing rounds (a model's timing limit can stop it earlier: the rounds each row ran are in it); "
        f"`{result['command']}`. Speedups are "
        "medians of per-round ratios (without / with), quartiles in brackets; an unchanged model is "
        "compiled twice and timed against itself, so its ratio shows the noise. *est. speedup (search)*: "
        "the cost model's estimate for what the search chose, shown even when the guard then reverted it. "
        "*kernels*: the kernels TVM launches (call_tir after fusion, opaque ones included). *TVM's own "
        "passes instead*: the Relax passes of TVM 0.27 that make TASO-style rewrites (batch norm into "
        "conv, parallel matmul merge, matmul expansion and reordering, permute/take reordering, "
        "transpose-matmul fusion; `benchmarks/peer.py`) applied in place of TasoOptimize, priced by "
        "the same cost model (before the transpose-matmul fusion, whose kernels it cannot see) and "
        "timed in the same rounds; a pass that failed is named. ORT: the original ONNX against the exported optimized one; *rewrites only*: "
        "the exported unoptimized import against the exported optimized one. Search seconds: this "
        "run's search, bounded by its time limit and budget on this machine, beside the seconds of "
        "TENSAT's table (MLSys'21): its TASO column (TASO's search as TENSAT's authors ran it) and its "
        "TENSAT column, on their hardware (not rerun here; not a like-for-like comparison). guard s: the timing of each rewritten region "
        "against the original region during the search (only regions faster in 3 rounds of 4 are kept; "
        "a comparison already in the database costs nothing), plus the end-to-end timing that has the "
        "last word on the whole model."
    )


def chart(result: dict, path: Path) -> bool:
    try:
        import matplotlib

        matplotlib.use("Agg")
        import matplotlib.pyplot as plt
    except ImportError:
        log.warning("matplotlib is not installed (pip install 'tvm-taso[bench]'); no chart written")
        return False
    rows = [r for r in result["rows"] if "error" not in r]
    names = [r["model"] for r in rows]
    x = np.arange(len(rows))
    fig, (ax1, ax2) = plt.subplots(1, 2, figsize=(13, 4.5))
    for i, (key, label) in enumerate((("tvm", "TVM + TasoOptimize"), ("ort", "onnxruntime, exported model"))):
        vals = [r[key]["ratio"] if r.get(key) else np.nan for r in rows]
        low = [r[key]["ratio"] - r[key]["ratio_low"] if r.get(key) else 0 for r in rows]
        high = [r[key]["ratio_high"] - r[key]["ratio"] if r.get(key) else 0 for r in rows]
        ax1.bar(x + (i - 0.5) * 0.38, vals, 0.38, yerr=[low, high], capsize=3, label=label)
    ax1.axhline(1.0, color="black", linewidth=0.8)
    ax1.set_xticks(x, names, rotation=30, ha="right")
    ax1.set_ylabel("speedup over the original (median, quartiles)")
    ax1.legend(fontsize=8)
    ax1.set_title(f"latency, {result['settings']['target']}")
    ours = [r["search_seconds"] for r in rows]
    taso = [PUBLISHED_SEARCH_SECONDS.get(r["model"], (np.nan, np.nan))[0] for r in rows]
    tensat = [PUBLISHED_SEARCH_SECONDS.get(r["model"], (np.nan, np.nan))[1] for r in rows]
    for i, (vals, label) in enumerate(((ours, "tvm-taso (this run)"), (taso, "TASO (TENSAT's table)"),
                                       (tensat, "TENSAT (TENSAT's table)"))):
        ax2.bar(x + (i - 1) * 0.27, vals, 0.27, label=label)
    ax2.set_yscale("log")
    ax2.set_xticks(x, names, rotation=30, ha="right")
    ax2.set_ylabel("search seconds (log)")
    ax2.legend(fontsize=8)
    ax2.set_title("search time")
    fig.tight_layout()
    fig.savefig(path, dpi=110)
    plt.close(fig)
    return True


def update_readme(result: dict, page: Path, chart_path: Path | None) -> None:
    """Replace the text between the results markers of ``page`` (``benchmarks/README.md``) with
    this run's table."""
    body = [describe_run(result), "", markdown(result), ""]
    if chart_path is not None:
        body += [f"![benchmark chart]({os.path.relpath(chart_path, page.parent)})", ""]
    _rewrite_between(page, README_START, README_END, body)


def update_summary(result: dict, readme: Path) -> None:
    """Replace the text between the summary markers of ``readme`` (the top-level README) with
    this run's one-table summary (:func:`summary`)."""
    _rewrite_between(readme, SUMMARY_START, SUMMARY_END, [summary(result), ""])


def _rewrite_between(page: Path, start: str, end: str, body: list[str]) -> None:
    text = page.read_text()
    if start not in text or end not in text:
        raise SystemExit(f"{page} has no {start} ... {end} section to rewrite")
    pattern = re.compile(re.escape(start) + ".*?" + re.escape(end), re.S)
    page.write_text(pattern.sub(lambda _: "\n".join([start, "", *body, end]), text, count=1))


def summary(result: dict) -> str:
    """The README's table: per model what the search kept, its estimated speedup and the measured
    ones, with the run's date, machine and target."""
    s = result["settings"]
    lines = [f"Measured {result['date']} on {result['machine']}, target {s['target']}, "
             f"{'untuned kernels' if not s['tune_trials'] else str(s['tune_trials']) + ' MetaSchedule trials'}, "
             f"guard {'on' if s['guard'] else 'off'} (`benchmarks/results/results.json`). *est.*: the cost model's "
             "estimate for the search's graph (an estimate, not a timing); *TVM* and *onnxruntime*: medians of "
             "per-round ratios, original over optimized, quartiles in brackets (an unchanged model is timed "
             "against itself: its ratio is the noise).", "",
             "| model | rewrites kept | est. speedup | TVM speedup (measured) | onnxruntime speedup, exported model (measured) |",
             "|---|---|---|---|---|"]
    for r in result["rows"]:
        if "error" in r:
            lines.append(f"| {r['model']} | failed: {r['error']} | | | |")
            continue
        search_after = r.get("search_cost_after_us", r["cost_after_us"])
        est = f"{r['cost_before_us'] / search_after:.3f}" if search_after else "—"
        reverted = (r.get("guard") or {}).get("reverted_rules")
        kept = str(r["rules_applied"])
        if r.get("unchanged"):
            kept = f"none ({reverted} reverted by the guard)" if reverted else "none"
        lines.append(f"| {r['model']} | {kept} | {est} | {ratio_text(r['tvm'])} | {ratio_text(r['ort'])} |")
    return "\n".join(lines)


def model_table(header: list[str], rows: list[dict], cells) -> str:
    """A markdown table of one row per model: ``cells(row)`` gives the cells after the model's
    name; a row holding an ``error`` says it in the second cell."""
    lines = ["| " + " | ".join(header) + " |", "|" + "---|" * len(header)]
    for r in rows:
        if "error" in r:
            lines.append(f"| {r['model']} | failed: {r['error']} |" + " |" * (len(header) - 2))
        else:
            lines.append("| " + " | ".join([r["model"], *cells(r)]) + " |")
    return "\n".join(lines)


def machine() -> str:
    cpu = platform.processor() or platform.machine()
    try:
        for line in Path("/proc/cpuinfo").read_text().splitlines():
            if line.startswith("model name"):
                cpu = line.split(":", 1)[1].strip()
                break
    except OSError:
        pass
    return f"{cpu}, {os.cpu_count()} cores, {platform.system()} {platform.release()}"


def each_model(prog: str, args, argv, bench, path: Path) -> dict:
    """The result of ``python -m prog``: ``bench(name)``'s row for each of ``args.models`` (a model
    that fails is a row with its error: one model's failure must not lose the others), written to
    ``path`` after each model and at the end, with the date, machine, command and settings."""
    command = f"python -m {prog} " + " ".join(sys.argv[1:] if argv is None else argv)
    result = {"date": datetime.date.today().isoformat(), "machine": machine(), "command": command.strip(),
              "cores": os.cpu_count(), "settings": {k: str(v) for k, v in vars(args).items()}, "rows": []}
    t0 = time.perf_counter()
    for name in args.models:
        try:
            result["rows"].append(bench(name))
        except Exception as err:  # noqa: BLE001 - a row saying why
            log.exception("%s failed", name)
            result["rows"].append({"model": name, "error": f"{type(err).__name__}: {err}"})
        path.write_text(json.dumps(result, indent=2))
    result["wall_seconds"] = time.perf_counter() - t0
    path.write_text(json.dumps(result, indent=2))
    return result


def harness_parser(prog: str, doc: str, results: Path) -> argparse.ArgumentParser:
    """The command line of a per-model harness (``python -m prog``), with its ``--models``
    (ResNet-50 and BERT-base by default), ``--quick`` and ``--json`` (default ``results``)."""
    ap = argparse.ArgumentParser(prog=f"python -m {prog}", description=doc.split("\n\n")[0])
    ap.add_argument("--models", nargs="+", default=["resnet50", "bert-base"], choices=list(models.MODELS))
    ap.add_argument("--quick", action="store_true", help="the models' tiny versions")
    ap.add_argument("--json", type=Path, default=results)
    return ap


def run_models(prog: str, args, argv, bench, table) -> int:
    """A per-model harness's command (:func:`harness_parser`'s arguments): :func:`each_model`
    into ``args.json``, its ``table`` printed; the exit status (1 when a model failed)."""
    logging.basicConfig(level=logging.INFO, format="%(asctime)s %(name)s: %(message)s", datefmt="%H:%M:%S")
    result = each_model(prog, args, argv, bench, args.json)
    print(table(result))
    return 0 if all("error" not in r for r in result["rows"]) else 1


# -- command line ------------------------------------------------------------------------------


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(prog="python -m benchmarks.run", description=__doc__.split("\n\n")[0])
    ap.add_argument("--models", nargs="+", choices=list(models.MODELS), default=list(models.MODELS))
    ap.add_argument("--target", default="llvm", help="llvm (this CPU, default) or cuda (needs a GPU to time)")
    ap.add_argument("--cost", default="auto", choices=["auto", "analytic", "measure", "learned"],
                    help="cost model of the search (default auto: see tvm-taso optimize --help)")
    ap.add_argument("--tune-trials", type=int, default=0,
                    help="MetaSchedule trials given to each module before timing (default 0: untuned)")
    ap.add_argument("--repeats", type=int, default=None, help="timing rounds (default 10, 3 with --quick)")
    ap.add_argument("--ort-repeats", type=int, default=None,
                    help="onnxruntime timing rounds (default 3 x --repeats: its runs are short)")
    ap.add_argument("--timing-limit", type=float, default=120.0,
                    help="seconds of timing per model and runtime; stops early after at least 2 rounds")
    ap.add_argument("--min-repeat-ms", type=int, default=200, help="each sample averages calls for this long")
    ap.add_argument("--time-limit", type=float, default=600.0, help="search time limit per model (seconds)")
    ap.add_argument("--no-guard", dest="guard", action="store_false",
                    help="keep whatever the search chose, without the end-to-end timing check")
    ap.add_argument("--quick", action="store_true", help="tiny versions of the models (seconds each)")
    ap.add_argument("--out", type=Path, default=ROOT / "benchmarks" / "results", help="where results go")
    ap.add_argument("--readme", action="store_true",
                    help="rewrite the results section of benchmarks/README.md and the summary table of README.md")
    ap.add_argument("--render", type=Path, metavar="RESULTS.json",
                    help="measure nothing: write the table and chart (and --readme) from an earlier run")
    ap.add_argument("-v", "--verbose", action="store_true")
    args = ap.parse_args(argv)
    if args.repeats is None:
        args.repeats = 3 if args.quick else 10
    logging.basicConfig(level=logging.DEBUG if args.verbose else logging.INFO,
                        format="%(asctime)s %(levelname)s %(name)s: %(message)s", datefmt="%H:%M:%S")
    if not args.verbose:
        logging.getLogger("tvm_taso").setLevel(logging.WARNING)
        logging.getLogger("tvm_taso.guard").setLevel(logging.INFO)  # the guard's verdict

    if args.render is not None:
        result = json.loads(args.render.read_text())
        return report(result, args.render.resolve().parent, args.readme)
    command = "python -m benchmarks.run " + " ".join(sys.argv[1:] if argv is None else argv)
    result = {
        "date": datetime.date.today().isoformat(),
        "machine": machine(),
        "command": command.strip(),
        "settings": {k: (str(v) if isinstance(v, Path) else v) for k, v in vars(args).items() if k != "verbose"},
        "versions": {"tvm": __import__("tvm").__version__, "onnx": onnx.__version__,
                     "onnxruntime": __import__("onnxruntime").__version__},
        "rows": [],
    }
    t_all = time.perf_counter()
    for name in args.models:
        t0 = time.perf_counter()
        try:
            row = bench_model(name, args)
        except Exception as err:  # noqa: BLE001 - one broken model must not lose the others' numbers
            log.exception("%s failed", name)
            row = {"model": name, "error": f"{type(err).__name__}: {err}"}
        row["wall_seconds"] = time.perf_counter() - t0
        result["rows"].append(row)
    result["wall_seconds"] = time.perf_counter() - t_all

    args.out.mkdir(parents=True, exist_ok=True)
    (args.out / "results.json").write_text(json.dumps(result, indent=2, default=str))
    log.info("results in %s (%.0f s)", args.out, result["wall_seconds"])
    return report(result, args.out, args.readme)


def report(result: dict, out: Path, readme: bool) -> int:
    """Write ``results.md`` and ``results.png`` to ``out`` (and, with ``readme``, the results
    section of ``benchmarks/README.md`` and the summary in ``README.md``); print the
    table. The exit status: 0 when every model ran and kept its outputs."""
    table = markdown(result)
    (out / "results.md").write_text(describe_run(result) + "\n\n" + table + "\n")
    has_chart = chart(result, out / "results.png")
    if readme:
        update_readme(result, ROOT / "benchmarks" / "README.md", out / "results.png" if has_chart else None)
        update_summary(result, ROOT / "README.md")
    print(table)
    ok = all("error" not in r and r["check"]["ok"] for r in result["rows"])
    return 0 if ok else 1


if __name__ == "__main__":
    sys.exit(main())
