"""Tuned kernels on this CPU: each model built untuned, tuned without TasoOptimize, tuned with it,
and run in onnxruntime, all timed side by side in one run.

    python -m benchmarks.tuned [--models resnet50 bert-base] [--trials 2000] [--time-limit S] [--quick]
    python -m benchmarks.tuned --models bert-base --rewrites-for cuda   # a GPU's rewrites, tuned here

Per model: the optimized module (TasoOptimize with the analytic cost model for this CPU, or for
``--rewrites-for``'s target: what the search chooses there, built and tuned for this CPU, which
says whether those rewrite families pay under tuned CPU kernels) is
tuned with ``--trials`` MetaSchedule trials (:func:`tvm_taso.cost.tuning.tune`, split by share
of the work, within ``--time-limit`` seconds), then the original into the same database with as
many, where the kernels the rewrites left as they were are tuned already. Then the variants are timed alternating, ``--repeats``
rounds: TVM untuned (TVM's default pipeline), the optimized module as a build without a
database makes it (default schedules, the BLAS), TVM tuned (original), TVM tuned (optimized), the tuned original built a
second time (the A/A row: its ratio to the first is the noise), and onnxruntime on the ONNX
model (all graph optimizations, one thread per core); with ``--without-blas-database DIR``, the
optimized module built without the BLAS too (every matmul and convolution TVM's own kernel,
tuned in ``DIR/MODEL`` by an earlier run: :mod:`tvm_taso.blas` says what a CPU build hands to the
BLAS). Ratios are medians of per-round ratios with quartiles. Writes ``benchmarks/results/tuned.json`` (``--json``) and prints a table.
"""

from __future__ import annotations

import logging
import sys
import tempfile
from pathlib import Path

import numpy as np

from benchmarks import models
from benchmarks.run import harness_parser, run_models, model_table, ort_model, ratio_text

ROOT = Path(__file__).resolve().parent.parent
RESULTS = ROOT / "benchmarks" / "results" / "tuned.json"
log = logging.getLogger("benchmarks.tuned")


def bench_model(name: str, args, work_dir: Path) -> dict:
    import tvm_taso
    from tvm_taso import target as targets
    from tvm_taso.cost.kernel_build import build_pipeline
    from tvm_taso.cost.latency import CompiledModule, side_by_side, speedup
    from tvm_taso.cost.tuning import tune
    from tvm_taso.io.onnx_import import import_relax
    from tvm_taso.runtime import inputs_for

    target = targets.with_cores("llvm")
    proto = models.build(name, args.quick)
    original = import_relax(proto)
    inputs = inputs_for(original, seed=0)
    optimized, report = tvm_taso.optimize(original, target=args.rewrites_for or target, cost_model="analytic",
                                          guard=False)
    db = work_dir / name
    tuning = {"optimized": tune(optimized, target, db, args.trials, time_limit=args.time_limit),
              "original": tune(original, target, db, args.trials, time_limit=args.time_limit)}
    tuned = build_pipeline(target, db)
    variants = {
        **({} if args.skip_untuned else {"untuned": CompiledModule(original, target, inputs, "default")}),
        "taso, no tuning": CompiledModule(optimized, target, inputs, build_pipeline(target)),
        "tuned": CompiledModule(original, target, inputs, tuned),
        "tuned + taso": CompiledModule(optimized, target, inputs, tuned),
        "tuned (A/A)": CompiledModule(original, target, inputs, build_pipeline(target, db)),
        "onnxruntime": ort_model(proto, inputs),
    }
    if args.without_blas_database:  # TVM's own kernels for every op, tuned before into that database
        tvm_only = targets.with_cores(targets.without_blas(target))
        variants["tuned + taso, no BLAS"] = CompiledModule(
            optimized, tvm_only, inputs, build_pipeline(tvm_only, args.without_blas_database / name))
    samples = side_by_side({k: (lambda m=m: m.time_ms(args.min_repeat_ms)) for k, m in variants.items()},
                           args.repeats)
    row = {"model": name, "size": "quick" if args.quick else "full", "rewrites_for": args.rewrites_for or "llvm",
           "rules_applied": report["applied"],
           "est_speedup": report["cost_before"] / report["cost_after"] if report["cost_after"] else 1.0,
           "tuning": {k: {key: v[key] for key in ("trials_run", "trials_held", "tasks_tuned", "seconds", "stopped")}
                      | {"tasks": len(v["tasks"])} for k, v in tuning.items()},
           "median_ms": {k: float(np.median(v)) for k, v in samples.items()}, "samples_ms": samples}
    ort = samples["onnxruntime"]
    row["vs_onnxruntime"] = {k: speedup(ort, samples[k]) for k in samples if k != "onnxruntime"}
    row["taso_over_tuned"] = speedup(samples["tuned"], samples["tuned + taso"])
    row["a_a"] = speedup(samples["tuned"], samples["tuned (A/A)"])
    summaries = [*row["vs_onnxruntime"].values(), row["taso_over_tuned"], row["a_a"]]
    if "tuned + taso, no BLAS" in samples:
        row["blas_gain"] = speedup(samples["tuned + taso, no BLAS"], samples["tuned + taso"])
        summaries.append(row["blas_gain"])
    for summary in summaries:
        summary.pop("samples", None)
    return row


def table(result: dict) -> str:
    rows = result["rows"]
    # columns of variants a run times only with some options: shown when one of its rows has them
    no_tuning = any("taso, no tuning" in r.get("median_ms", {}) for r in rows)
    without_blas = any("blas_gain" in r for r in rows)

    def cells(r):
        t, m = r["tuning"], r["median_ms"]
        held = [t[k].get("trials_held", 0) for k in ("original", "optimized")]
        return [f"{t['original']['trials_run']} + {t['optimized']['trials_run']}"
                + (f" (held before: {held[0]} + {held[1]})" if any(held) else ""),
                f"{t['original']['seconds'] + t['optimized']['seconds']:.0f}",
                f"{m['untuned']:.4g}" if "untuned" in m else "—",
                *([f"{m['taso, no tuning']:.4g}" if "taso, no tuning" in m else "—"] if no_tuning else []),
                f"{m['tuned']:.4g}", f"{m['tuned + taso']:.4g}",
                *([f"{m['tuned + taso, no BLAS']:.4g}" if "blas_gain" in r else "—"] if without_blas else []),
                f"{m['onnxruntime']:.4g}",
                ratio_text(r["vs_onnxruntime"]["tuned + taso"]), ratio_text(r["taso_over_tuned"]), ratio_text(r["a_a"]),
                *([ratio_text(r["blas_gain"]) if "blas_gain" in r else "—"] if without_blas else [])]

    return model_table(["model", "trials (original + optimized)", "tuning s", "untuned ms",
                        *(["taso, no tuning ms"] if no_tuning else []), "tuned ms", "tuned + taso ms",
                        *(["tuned + taso, no BLAS ms"] if without_blas else []),
                        "onnxruntime ms", "tuned + taso vs onnxruntime", "taso gain when tuned", "A/A",
                        *(["BLAS gain (over tuned TVM kernels)"] if without_blas else [])],
                       rows, cells)


def main(argv: list[str] | None = None) -> int:
    ap = harness_parser("benchmarks.tuned", __doc__, RESULTS)
    ap.add_argument("--trials", type=int, default=2000, help="MetaSchedule trials per module (default 2000)")
    ap.add_argument("--time-limit", type=float, help="seconds of tuning per module: no new kernel is started after")
    ap.add_argument("--repeats", type=int, default=10, help="timing rounds (default 10)")
    ap.add_argument("--min-repeat-ms", type=int, default=200, help="each sample averages calls for this long")
    ap.add_argument("--skip-untuned", action="store_true", help="do not time the untuned build (tens of seconds "
                    "a call for BERT-base)")
    ap.add_argument("--rewrites-for", metavar="TARGET", help="optimize for this target's analytic costs (e.g. cuda) and "
                    "build and tune the result for this CPU (default: optimize for this CPU)")
    ap.add_argument("--work-dir", type=Path, help="the database folder (default: a temporary one)")
    ap.add_argument("--without-blas-database", type=Path, metavar="DIR",
                    help="also time the optimized module built without the BLAS (every op TVM's), tuned from "
                         "DIR/MODEL (a --work-dir of a run without it): the BLAS's gain over tuned TVM kernels")
    args = ap.parse_args(argv)
    logging.getLogger("tvm.s_tir.meta_schedule").setLevel(logging.WARNING)
    work_dir = args.work_dir or Path(tempfile.mkdtemp(prefix="tvm-taso-tuned-"))
    return run_models("benchmarks.tuned", args, argv, lambda name: bench_model(name, args, work_dir), table)


if __name__ == "__main__":
    sys.exit(main())
