"""Tuned kernels on this CPU: each model built untuned, tuned without TasoOptimize, tuned with it,
and run in onnxruntime, all timed side by side in one run.

    python -m benchmarks.tuned [--models resnet50 bert-base] [--trials 2000] [--time-limit S] [--quick]
    python -m benchmarks.tuned --models bert-base --rewrites-for cuda   # a GPU's rewrites, tuned here

Per model: the optimized module (TasoOptimize with the analytic cost model for this CPU, or for
``--rewrites-for``'s target: what the search chooses there, built and tuned for this CPU, which
says whether those rewrite families pay under tuned CPU kernels) is
tuned with ``--trials`` MetaSchedule trials (:func:`tvm_taso.cost.tuning.tune`, split by share
of the work, within ``--time-limit`` seconds), then the original into the same database with as
many, where the kernels the rewrites left as they were are tuned already. Then five variants are timed alternating, ``--repeats``
rounds: TVM untuned, TVM tuned (original), TVM tuned (optimized), the tuned original built a
second time (the A/A row: its ratio to the first is the noise), and onnxruntime on the ONNX
model (all graph optimizations, one thread per core). Ratios are medians of per-round ratios
with quartiles. Writes ``benchmarks/results/tuned.json`` (``--json``) and prints a table.
"""

from __future__ import annotations

import argparse
import logging
import sys
import tempfile
from pathlib import Path

import numpy as np

from benchmarks import models
from benchmarks.run import each_model, model_table, ort_model, ratio_text

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
        "tuned": CompiledModule(original, target, inputs, tuned),
        "tuned + taso": CompiledModule(optimized, target, inputs, tuned),
        "tuned (A/A)": CompiledModule(original, target, inputs, build_pipeline(target, db)),
        "onnxruntime": ort_model(proto, inputs),
    }
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
    for summary in (*row["vs_onnxruntime"].values(), row["taso_over_tuned"], row["a_a"]):
        summary.pop("samples", None)
    return row


def table(result: dict) -> str:
    def cells(r):
        t, m = r["tuning"], r["median_ms"]
        held = [t[k].get("trials_held", 0) for k in ("original", "optimized")]
        return [f"{t['original']['trials_run']} + {t['optimized']['trials_run']}"
                + (f" (held before: {held[0]} + {held[1]})" if any(held) else ""),
                f"{t['original']['seconds'] + t['optimized']['seconds']:.0f}",
                f"{m['untuned']:.4g}" if "untuned" in m else "—",
                f"{m['tuned']:.4g}", f"{m['tuned + taso']:.4g}", f"{m['onnxruntime']:.4g}",
                ratio_text(r["vs_onnxruntime"]["tuned + taso"]), ratio_text(r["taso_over_tuned"]), ratio_text(r["a_a"])]

    return model_table(["model", "trials (original + optimized)", "tuning s", "untuned ms", "tuned ms", "tuned + taso ms",
                        "onnxruntime ms", "tuned + taso vs onnxruntime", "taso gain when tuned", "A/A"],
                       result["rows"], cells)


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(prog="python -m benchmarks.tuned", description=__doc__.split("\n\n")[0])
    ap.add_argument("--models", nargs="+", default=["resnet50", "bert-base"], choices=list(models.MODELS))
    ap.add_argument("--trials", type=int, default=2000, help="MetaSchedule trials per module (default 2000)")
    ap.add_argument("--time-limit", type=float, help="seconds of tuning per module: no new kernel is started after")
    ap.add_argument("--repeats", type=int, default=10, help="timing rounds (default 10)")
    ap.add_argument("--min-repeat-ms", type=int, default=200, help="each sample averages calls for this long")
    ap.add_argument("--quick", action="store_true", help="the models' tiny versions")
    ap.add_argument("--skip-untuned", action="store_true", help="do not time the untuned build (tens of seconds "
                    "a call for BERT-base)")
    ap.add_argument("--rewrites-for", metavar="TARGET", help="optimize for this target's analytic costs (e.g. cuda) and "
                    "build and tune the result for this CPU (default: optimize for this CPU)")
    ap.add_argument("--work-dir", type=Path, help="the database folder (default: a temporary one)")
    ap.add_argument("--json", type=Path, default=RESULTS)
    args = ap.parse_args(argv)
    logging.basicConfig(level=logging.INFO, format="%(asctime)s %(name)s: %(message)s", datefmt="%H:%M:%S")
    logging.getLogger("tvm.s_tir.meta_schedule").setLevel(logging.WARNING)
    work_dir = args.work_dir or Path(tempfile.mkdtemp(prefix="tvm-taso-tuned-"))
    result = each_model("benchmarks.tuned", args, argv, lambda name: bench_model(name, args, work_dir), args.json)
    print(table(result))
    return 0 if all("error" not in r for r in result["rows"]) else 1


if __name__ == "__main__":
    sys.exit(main())
