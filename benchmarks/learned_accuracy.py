"""How well does the learned cost model predict kernel times on this machine?

    python -m benchmarks.learned_accuracy [--model resnet50|bert] [--quick] [--db PATH]
        [--target llvm] [--max-kernels N] [--max-seconds S] [--repeats N] [--seeds N]
        [--save] [--json OUT]

1. Builds one mid-sized model from :mod:`benchmarks.models` (default: ResNet-50-shaped at
   224x224; ``--model bert``: a 2-layer BERT-base-shaped encoder, seq 128) and collects the
   distinct kernels a search over it prices (:func:`tvm_taso.cost.training.search_kernels`: the
   model's own kernels and every candidate's -- what a cost model is asked about).
2. Measures them on the target through :func:`tvm_taso.cost.measure.measure_kernel` (out of
   process, one at a time), filling the measurement database (``--db``; default the user's
   database, so a second run measures nothing new). The model's own kernels go first, then
   the candidates in a seeded random order; ``--max-kernels`` / ``--max-seconds`` stop early.
3. Trains :func:`tvm_taso.cost.training.train` on those records and reports the held-out Spearman
   rank correlation and median relative error (25 % held out, seed 0), their mean and spread
   over ``--seeds`` random splits, and the same for the roofline (``AnalyticCost``, scaled).

Untuned llvm kernels (no MetaSchedule) are what is measured, as ``cost_model="measure"`` does.
"""

from __future__ import annotations

import argparse
import json
import logging
import statistics
import sys
import time
import warnings

import numpy as np

from tvm_taso import target as targets
from tvm_taso.cost.database import MeasurementDB
from tvm_taso.cost.measure import measure_kernel
from tvm_taso.cost.training import model_kernels, search_kernels, train
from tvm_taso.io.onnx_import import import_relax

from . import models

log = logging.getLogger("benchmarks.learned_accuracy")

CONFIGS = {"resnet50": {}, "bert": {"layers": 2}}  # model -> keyword arguments of its builder
BUILDERS = {"resnet50": "resnet50", "bert": "bert-base"}


def collect(model: str, quick: bool, target) -> tuple[list, int]:
    mod = import_relax(models.build(BUILDERS[model], quick, **CONFIGS[model]))
    own = model_kernels(mod)
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        seen = search_kernels(mod, target=target, time_limit=60)
    rest = [k for k in seen if k not in set(own)]
    rng = np.random.default_rng(0)
    rest = [rest[i] for i in rng.permutation(len(rest))]
    return own + rest, len(own)


def run(args) -> dict:
    target = targets.canonical(args.target)
    t0 = time.perf_counter()
    kernels, n_own = collect(args.model, args.quick, target)
    collect_s = time.perf_counter() - t0
    db = MeasurementDB(args.db)
    measured = cached = failed = 0
    t1 = time.perf_counter()
    for i, k in enumerate(kernels[: args.max_kernels]):
        if db.get(k.key(), target) is not None:
            cached += 1
            continue
        if time.perf_counter() - t1 > args.max_seconds:
            log.warning("stopping after %.0f s (--max-seconds); %d kernels not measured",
                        time.perf_counter() - t1, len(kernels) - i)
            break
        rec = measure_kernel(k, target, repeats=args.repeats, timeout=args.timeout, warmup=1)
        db.add(rec)
        measured += 1
        failed += not rec.ok
        log.info("[%d/%d] %s %s: %s %s", i + 1, len(kernels), "+".join(o[0] for o in k.ops),
                 [list(t.shape) for t in k.outputs], rec.status,
                 f"{rec.median_us:.1f} us" if rec.ok else rec.error.splitlines()[0][:120])
    measure_s = time.perf_counter() - t1
    keys = {k.key() for k in kernels}
    records = [r for r in db.records(target) if r.key in keys]
    t2 = time.perf_counter()
    model, m = train(records, target, test_fraction=0.25, seed=0)
    splits = [m] + [train(records, target, test_fraction=0.25, seed=s, refit=False)[1] for s in range(1, args.seeds)]
    train_s = time.perf_counter() - t2
    t3 = time.perf_counter()
    model.predict(kernels)
    predict_s = time.perf_counter() - t3

    def spread(name):
        vals = [s[name] for s in splits if s.get(name) is not None]
        if not vals:
            return None
        return {"mean": statistics.fmean(vals), "min": min(vals), "max": max(vals)}

    result = {
        "model": args.model + (" (quick)" if args.quick else ""),
        "target": target,
        "kernels": len(kernels),
        "model_kernels": n_own,
        "candidate_kernels": len(kernels) - n_own,
        "measured": measured,
        "db_hits": cached,
        "failed": failed,
        "records_used": m["records_used"],
        "collect_seconds": round(collect_s, 1),
        "measure_seconds": round(measure_s, 1),
        "seconds_per_measurement": round(measure_s / measured, 2) if measured else None,
        "train_seconds": round(train_s, 1),
        "predict_us_per_kernel": round(1e6 * predict_s / max(1, len(kernels)), 1),
        "held_out": m["test"],
        "spearman": m["spearman"],
        "median_rel_error": m["median_rel_error"],
        "analytic_spearman": m.get("analytic_spearman"),
        "analytic_median_rel_error": m.get("analytic_median_rel_error"),
        "splits": len(splits),
        "spearman_over_splits": spread("spearman"),
        "median_rel_error_over_splits": spread("median_rel_error"),
        "analytic_spearman_over_splits": spread("analytic_spearman"),
        "db": str(db.path),
    }
    if args.save:
        result["saved"] = str(model.save())
    return result


def _fmt(v, pct=False):
    if v is None:
        return "-"
    return f"{100 * v:.1f} %" if pct else f"{v:.3f}"


def print_table(r: dict) -> None:
    sp, re_, an = r["spearman_over_splits"], r["median_rel_error_over_splits"], r["analytic_spearman_over_splits"]
    print(f"## Learned cost model accuracy: {r['model']} on {r['target']}\n")
    print("| | |\n|---|---|")
    print(f"| distinct kernels (model + search candidates) | {r['kernels']} ({r['model_kernels']} + {r['candidate_kernels']}) |")
    print(f"| measured now / already in the database / failed | {r['measured']} / {r['db_hits']} / {r['failed']} |")
    print(f"| measuring time | {r['measure_seconds']} s ({r['seconds_per_measurement']} s per kernel) |")
    print(f"| training time ({r['splits']} splits) | {r['train_seconds']} s |")
    print(f"| prediction time | {r['predict_us_per_kernel']} us per kernel |")
    print(f"| held-out kernels (seed 0) | {r['held_out']} of {r['records_used']} |")
    print(f"| held-out Spearman, learned (seed 0) | {_fmt(r['spearman'])} |")
    print(f"| held-out Spearman, roofline (seed 0) | {_fmt(r['analytic_spearman'])} |")
    print(f"| held-out median relative error, learned (seed 0) | {_fmt(r['median_rel_error'], True)} |")
    print(f"| held-out median relative error, roofline scaled (seed 0) | {_fmt(r['analytic_median_rel_error'], True)} |")
    if sp:
        print(f"| Spearman over {r['splits']} splits, learned: mean (min-max) | {_fmt(sp['mean'])} ({_fmt(sp['min'])}-{_fmt(sp['max'])}) |")
    if an:
        print(f"| Spearman over {r['splits']} splits, roofline: mean (min-max) | {_fmt(an['mean'])} ({_fmt(an['min'])}-{_fmt(an['max'])}) |")
    if re_:
        print(f"| median relative error over splits, learned: mean | {_fmt(re_['mean'], True)} |")
    if r.get("saved"):
        print(f"\nmodel saved to {r['saved']}")


def main(argv=None) -> int:
    p = argparse.ArgumentParser(prog="python -m benchmarks.learned_accuracy", description=__doc__.split("\n\n")[0])
    p.add_argument("--model", choices=sorted(CONFIGS), default="resnet50")
    p.add_argument("--quick", action="store_true", help="tiny model sizes (seconds; what a test runs)")
    p.add_argument("--target", default="llvm")
    p.add_argument("--db", default=None, help="measurement database (default: the user's, $TVM_TASO_CACHE)")
    p.add_argument("--max-kernels", type=int, default=None, help="measure at most the first N kernels")
    p.add_argument("--max-seconds", type=float, default=480.0, help="stop measuring after this long (default 480)")
    p.add_argument("--repeats", type=int, default=3, help="timed runs per kernel (default 3)")
    p.add_argument("--timeout", type=float, default=120.0, help="seconds per kernel, build and run (default 120)")
    p.add_argument("--seeds", type=int, default=5, help="random train/test splits to report (default 5)")
    p.add_argument("--save", action="store_true", help="save the model where cost_model='auto' finds it")
    p.add_argument("--json", help="write the results as JSON")
    p.add_argument("-v", "--verbose", action="store_true")
    args = p.parse_args(argv)
    logging.basicConfig(level=logging.INFO if args.verbose else logging.WARNING, format="%(message)s")
    result = run(args)
    print_table(result)
    if args.json:
        with open(args.json, "w") as f:
            json.dump(result, f, indent=2)
    return 0


if __name__ == "__main__":
    sys.exit(main())
