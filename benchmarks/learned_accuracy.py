"""Does the learned cost model predict kernel times of a model it has never seen?

    python -m benchmarks.learned_accuracy [--models NAME ...] [--full] [--target llvm] [--db PATH]
        [--max-kernels N] [--max-seconds S] [--search-budget N] [--search-seconds S]
        [--repeats N] [--timeout S] [--seed N] [--json OUT] [-v]

1. **Kernels.** For each benchmark model (:mod:`benchmarks.models`; default all eight, at their
   quick sizes, ``--full`` for the real ones) the distinct kernels a search over it prices
   (:func:`tvm_taso.driver.kernels.search_kernels`, the analytic model steering, bounded by
   ``--search-budget`` graphs per region so that a rerun finds the same kernels;
   ``--search-seconds`` is a safety bound, reported when reached): the model's own kernels
   first, then its candidates' in a seeded random order (``--seed``).
2. **Measurements.** The first ``--max-kernels`` of them are built and timed on the target
   (:func:`tvm_taso.cost.measure.measure_kernel`: out of process, untuned llvm code as
   ``cost_model="measure"`` times it), at most ``--max-seconds`` of measuring per model. Every
   result goes to the measurement database (``--db``, default the user's), so a rerun measures
   nothing new; the report says which bound cut a model short.
3. **Leave one model out.** For each model M, :func:`tvm_taso.cost.training.score_split` fits the
   learned model on the measured kernels of the *other* models and scores it on M's measured
   kernels. A kernel that is also one of M's chosen kernels (same fingerprint,
   :meth:`Kernel.key`: quick-size models share many) is dropped from the training side, whether
   or not M's copy was measured, so the model has seen no kernel of M (``dropped_shared`` counts
   them). Leave-one-out rather
   than a fixed partition: every model is tested once, each time with the most training data
   the others give, and no choice of partition colours the result.
4. **Scores**, per held-out model and overall (all held-out predictions pooled, and the mean over
   models): Spearman rank correlation of predicted and measured times (what the search needs)
   and median relative error |pred - measured| / measured (what reported costs need), for the
   learned model and for the roofline :class:`~tvm_taso.cost.analytic.AnalyticCost` on the same
   kernels. The roofline's relative error is taken after one scale factor (median of
   measured/estimated) fitted on that fold's *training* kernels only; its Spearman needs none.
   For contrast, a random 25 % split of all measured kernels (:func:`~tvm_taso.cost.training.train`,
   ignoring models): what within-distribution accuracy looks like.

Results: a Markdown table on stdout, the whole report as JSON (``--json``, default
``benchmarks/results/learned_accuracy.json``); the defaults made the table in tvm_taso/README.md (Cost models). To train and save the model that
``cost_model="auto"`` uses from these measurements: ``tvm-taso cost train``.
"""

from __future__ import annotations

import argparse
import json
import logging
import statistics
import sys
import time
import warnings
from pathlib import Path

import numpy as np
from tqdm import tqdm

from tvm_taso import target as targets
from tvm_taso.cost.database import MeasurementDB, Record, measured_target
from tvm_taso.cost.measure import measure_kernel
from tvm_taso.cost.model import Kernel
from tvm_taso.cost.training import (
    median_rel_error,
    model_kernels,
    score_split,
    spearman,
    train,
)
from tvm_taso.driver.kernels import search_kernels
from tvm_taso.files import write_text_atomically
from tvm_taso.io.onnx_import import import_relax

from . import models

log = logging.getLogger("benchmarks.learned_accuracy")

DEFAULT_JSON = Path(__file__).parent / "results" / "learned_accuracy.json"
METRICS = ("spearman", "median_rel_error", "analytic_spearman", "analytic_median_rel_error")


def collect(name: str, quick: bool, target, budget: int, time_limit: float, seed: int) -> dict:
    """Model ``name``'s kernels to measure (its own, then its search candidates' in a seeded
    random order) and how the search went."""
    mod = import_relax(models.build(name, quick))
    own = model_kernels(mod)
    t0 = time.perf_counter()
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        seen = search_kernels(mod, target=target, budget=budget, time_limit=time_limit)
    seconds = time.perf_counter() - t0
    rest = sorted(set(seen) - set(own), key=Kernel.key)  # a discovery-order-free start for the shuffle
    rest = [rest[i] for i in np.random.default_rng(seed).permutation(len(rest))]
    return {"kernels": own + rest, "model_kernels": len(own), "candidate_kernels": len(rest),
            "search_seconds": round(seconds, 1),
            "search_reached_time_limit": seconds >= time_limit}


def measure(name: str, chosen: list[Kernel], db: MeasurementDB, target: str, args) -> dict:
    """Measure the kernels of ``chosen`` that the database lacks, in order, within
    ``args.max_seconds``; counts, and whether that bound cut the model short."""
    counts = {"measured": 0, "db_hits": 0, "failed": 0, "not_measured": 0}
    cut = []
    t0 = time.perf_counter()
    record_target = measured_target(target)
    for i, k in enumerate(tqdm(chosen, desc=f"measuring {name}", unit="kernel", leave=False)):
        rec = db.get(k.key(), record_target)
        if rec is None:
            if time.perf_counter() - t0 > args.max_seconds:
                counts["not_measured"] = len(chosen) - i
                cut.append("max-seconds")
                log.warning("%s: --max-seconds %.0f reached; %d of its %d kernels not measured",
                            name, args.max_seconds, len(chosen) - i, len(chosen))
                break
            rec = measure_kernel(k, target, repeats=args.repeats, timeout=args.timeout, warmup=1)
            db.add(rec)
            counts["measured"] += 1
        else:
            counts["db_hits"] += 1
        counts["failed"] += not rec.ok
    counts["measure_seconds"] = round(time.perf_counter() - t0, 1)
    counts["cut_short_by"] = cut
    return counts


def _round(v):
    return None if v is None else round(float(v), 4)


def split_by_model(keys: dict[str, set], measured: set, held_out: str) -> tuple[list, list, int]:
    """(training keys, test keys, kernels dropped as shared) for holding out model ``held_out``:
    test on its measured kernels, train on the other models' measured kernels except any that
    ``held_out`` also has (``keys``: model -> its kernels' keys; ``measured``: keys with an ok
    measurement)."""
    others = set().union(*(keys[m] & measured for m in keys if m != held_out))
    shared = others & keys[held_out]
    return sorted(others - shared), sorted(keys[held_out] & measured), len(shared)


def leave_one_model_out(kernels_by_model: dict[str, list[Kernel]], records: dict[str, Record], target,
                        seed: int = 0) -> dict:
    """Per held-out model M (:func:`split_by_model`), the learned model fitted on the other
    models' kernels and both models scored on M's (``records``: key -> ok record; a kernel
    without one was not measured). Returns ``{"per_model": {M: {...}}, "pooled": {...},
    "mean_over_models": {...}}``."""
    keys = {m: {k.key() for k in ks} for m, ks in kernels_by_model.items()}
    per_model, pooled = {}, {"measured_us": [], "predicted_us": [], "analytic_us": []}
    for held_out in tqdm(kernels_by_model, desc="leave one model out", unit="model", leave=False):
        train_keys, test_keys, dropped = split_by_model(keys, records.keys(), held_out)
        row = {"train": None, "test": None, "dropped_shared": dropped}
        try:
            s = score_split([records[k] for k in train_keys], [records[k] for k in test_keys], target, seed=seed)
        except ValueError as err:  # too few measured kernels on one side
            row["skipped"] = str(err)
            per_model[held_out] = row
            continue
        row.update(train=s["train"], test=s["test"], test_keys=s["keys"])
        row.update({m: _round(s.get(m)) for m in METRICS})
        row["analytic_scale"] = _round(s.get("analytic_scale"))
        per_model[held_out] = row
        pooled["measured_us"].append(s["measured_us"])
        pooled["predicted_us"].append(s["predicted_us"])
        pooled["analytic_us"].append(s["analytic_us"] if s["analytic_us"] is not None
                                     else np.full(len(s["measured_us"]), np.nan))
    return {"per_model": per_model, "pooled": _pooled(pooled), "mean_over_models": _mean(per_model)}


def _pooled(arrays: dict) -> dict:
    """Scores over every held-out prediction of every fold (a kernel counts once per model
    that has it)."""
    if not arrays["measured_us"]:
        return {"test": 0, **{m: None for m in METRICS}}
    y, pred, an = (np.concatenate(arrays[k]) for k in ("measured_us", "predicted_us", "analytic_us"))
    ok = np.isfinite(an)
    return {"test": len(y), "spearman": _round(spearman(pred, y)),
            "median_rel_error": _round(median_rel_error(pred, y)),
            "analytic_spearman": _round(spearman(an[ok], y[ok])),
            "analytic_median_rel_error": _round(median_rel_error(an[ok], y[ok]))}


def _mean(per_model: dict) -> dict:
    out = {}
    for m in METRICS:
        vals = [r[m] for r in per_model.values() if r.get(m) is not None]
        out[m] = _round(statistics.fmean(vals)) if vals else None
    return out


def run(args) -> dict:
    target = targets.canonical(args.target)
    db = MeasurementDB(args.db)
    t0 = time.perf_counter()
    kernels_by_model, per_model = {}, {}
    for name in tqdm(args.models, desc="models", unit="model"):
        c = collect(name, not args.full, target, args.search_budget, args.search_seconds, args.seed)
        listed = c.pop("kernels")
        chosen = kernels_by_model[name] = listed[: args.max_kernels or None]
        counts = measure(name, chosen, db, target, args)
        counts["cut_short_by"] = ((["search-seconds"] if c["search_reached_time_limit"] else [])
                                  + (["max-kernels"] if len(chosen) < len(listed) else []) + counts["cut_short_by"])
        per_model[name] = {"kernels_listed": len(listed), "kernels_chosen": len(chosen), **c, **counts}
    collect_and_measure_seconds = time.perf_counter() - t0
    records, record_target = {}, measured_target(target)
    for ks in kernels_by_model.values():
        for k in ks:
            rec = db.get(k.key(), record_target)
            if rec is not None and rec.ok:
                records[k.key()] = rec
    t1 = time.perf_counter()
    cross = leave_one_model_out(kernels_by_model, records, target, seed=args.seed)
    for name, row in cross["per_model"].items():
        per_model[name].update(row)
    try:
        _, split = train(list(records.values()), target, test_fraction=0.25, seed=args.seed, refit=False)
        random_split = {"train": split["train"], "test": split["test"], **{m: _round(split.get(m)) for m in METRICS}}
    except ValueError as err:
        random_split = {"skipped": str(err)}
    return {
        "what": "leave-one-model-out accuracy of the learned cost model vs the scaled roofline on measured kernels",
        "target": target,
        "sizes": "full" if args.full else "quick",
        "db": str(db.path),
        "settings": {k: getattr(args, k) for k in ("max_kernels", "max_seconds", "search_budget", "search_seconds",
                                                   "repeats", "timeout", "seed")},
        "distinct_kernels_measured_ok": len(records),
        "analytic_scale_fitted_on": "training kernels of each fold (median measured/estimated)",
        "per_model": per_model,
        "pooled": cross["pooled"],
        "mean_over_models": cross["mean_over_models"],
        "random_split_all_models": random_split,
        "cut_short": {m: r["cut_short_by"] for m, r in per_model.items() if r["cut_short_by"]},
        "collect_and_measure_seconds": round(collect_and_measure_seconds, 1),
        "evaluate_seconds": round(time.perf_counter() - t1, 1),
    }


def _fmt(v, pct=False):
    if v is None:
        return "-"
    return f"{100 * v:.0f} %" if pct else f"{v:.2f}"


def table(r: dict) -> str:
    """The report as Markdown: one row per held-out model, then the pooled and mean rows."""
    lines = [(f"Learned model (XGBoost) vs roofline (AnalyticCost, scaled on the training kernels), "
              f"{r['sizes']} sizes, {targets.kind(r['target'])}; leave one model out.\n"),
             ("| held-out model | n train | n test | dropped shared | Spearman learned | Spearman roofline "
              "| med. rel. err. learned | med. rel. err. roofline |"),
             "|---|---:|---:|---:|---:|---:|---:|---:|"]

    def row(name, d, train="", dropped=""):
        return (f"| {name} | {train} | {d.get('test') if d.get('test') is not None else '-'} | {dropped} "
                f"| {_fmt(d.get('spearman'))} | {_fmt(d.get('analytic_spearman'))} "
                f"| {_fmt(d.get('median_rel_error'), True)} | {_fmt(d.get('analytic_median_rel_error'), True)} |")

    for name, d in r["per_model"].items():
        note = f" ({d['skipped']})" if d.get("skipped") else ""
        lines.append(row(name + note, d, d.get("train") if d.get("train") is not None else "-", d["dropped_shared"]))
    lines.append(row("**pooled**", r["pooled"]))
    lines.append(row("**mean over models**", {**r["mean_over_models"], "test": None}))
    rs = r["random_split_all_models"]
    if not rs.get("skipped"):
        lines.append(row("random 25 % split, models mixed (contrast)", rs, rs["train"]))
    if r["cut_short"]:
        lines.append("\ncut short: " + "; ".join(f"{m} by {', '.join(b)}" for m, b in r["cut_short"].items()))
    return "\n".join(lines)


def main(argv=None) -> int:
    p = argparse.ArgumentParser(prog="python -m benchmarks.learned_accuracy", description=__doc__.split("\n\n")[0])
    p.add_argument("--models", nargs="+", choices=list(models.MODELS), default=list(models.MODELS),
                   help="benchmark models (default: all eight)")
    p.add_argument("--full", action="store_true", help="full model sizes (default: the quick sizes)")
    p.add_argument("--target", default="llvm")
    p.add_argument("--db", default=None, help="measurement database (default: the user's, $TVM_TASO_CACHE)")
    p.add_argument("--max-kernels", type=int, default=150, help="kernels per model, own first (default 150; 0: all)")
    p.add_argument("--max-seconds", type=float, default=180.0, help="seconds of measuring per model (default 180)")
    p.add_argument("--search-budget", type=int, default=100, help="graphs expanded per region while listing candidates (default 100)")
    p.add_argument("--search-seconds", type=float, default=300.0, help="time bound of that search (default 300)")
    p.add_argument("--repeats", type=int, default=5, help="timed runs per kernel (default 5)")
    p.add_argument("--timeout", type=float, default=120.0, help="seconds per kernel, build and run (default 120)")
    p.add_argument("--seed", type=int, default=0, help="candidate order and model seed (default 0)")
    p.add_argument("--json", default=str(DEFAULT_JSON), help=f"JSON report (default {DEFAULT_JSON})")
    p.add_argument("-v", "--verbose", action="store_true")
    args = p.parse_args(argv)
    logging.basicConfig(level=logging.INFO if args.verbose else logging.WARNING, format="%(message)s")
    result = run(args)
    print(table(result))
    write_json(result, args.json)
    return 0


def write_json(result: dict, path) -> None:
    """``result`` as indented JSON at ``path``, written atomically."""
    Path(path).parent.mkdir(parents=True, exist_ok=True)
    write_text_atomically(Path(path), json.dumps(result, indent=2) + "\n")


if __name__ == "__main__":
    sys.exit(main())
