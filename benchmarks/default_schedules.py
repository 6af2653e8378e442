"""Untuned CPU builds: TVM's plain loops against MetaSchedule's design-space default
(:func:`tvm_taso.cost.tuning.default_schedules`, what every CPU build now gets for a kernel no
database tuned), with and without TasoOptimize, for this machine's CPU and for TVM's generic one,
beside onnxruntime, timed side by side in one run.

    python -m benchmarks.default_schedules [--models resnet50 bert-base] [--repeats 5] [--quick]

Per model, seven variants timed alternating, ``--repeats`` rounds: TVM's default pipeline as
TVM 0.27 ships it (plain loops), the build pipeline with default schedules, the same on the
module TasoOptimize rewrote (analytic cost for this CPU), the default-schedule build made a
second time (the A/A row: its ratio to the first is the noise), the default-schedule build for
TVM's bare ``llvm`` (a generic x86-64: no ``mcpu``, which tvm-taso's ``llvm`` sets to this
machine's CPU, :mod:`tvm_taso.target`), the default-schedule build with the model's own conv
layouts (no channels-last conversion, :func:`tvm_taso.target.conv_layouts`) and onnxruntime on
the ONNX model (all graph
optimizations, one thread per core). Ratios are medians of per-round ratios with
quartiles; compile seconds are one build each. Writes
``benchmarks/results/default_schedules.json`` (``--json``) and prints a table.
"""

from __future__ import annotations

import logging
import sys
from pathlib import Path

import numpy as np

from benchmarks import models
from benchmarks.run import harness_parser, run_models, model_table, ort_model, ratio_text

ROOT = Path(__file__).resolve().parent.parent
RESULTS = ROOT / "benchmarks" / "results" / "default_schedules.json"
log = logging.getLogger("benchmarks.default_schedules")


def bench_model(name: str, args) -> dict:
    import tvm_taso
    from tvm_taso import target as targets
    from tvm_taso.cost.kernel_build import build_pipeline
    from tvm_taso.cost.latency import CompiledModule, side_by_side, speedup
    from tvm_taso.io.onnx_import import import_relax
    from tvm_taso.runtime import inputs_for

    import tvm

    target = targets.with_cores("llvm")
    generic = tvm.target.Target({k: v for k, v in target.export().items() if k != "mcpu"})  # taken as given
    proto = models.build(name, args.quick)
    original = import_relax(proto)
    inputs = inputs_for(original, seed=0)
    optimized, report = tvm_taso.optimize(original, target=target, cost_model="analytic", guard=False)
    variants = {
        "plain loops": CompiledModule(original, target, inputs, "default"),
        "default schedules": CompiledModule(original, target, inputs, build_pipeline(target)),
        "default schedules + taso": CompiledModule(optimized, target, inputs, build_pipeline(target)),
        "default schedules (A/A)": CompiledModule(original, target, inputs, build_pipeline(target)),
        "default schedules, generic CPU": CompiledModule(original, generic, inputs, build_pipeline(generic)),
        "default schedules, model layouts": CompiledModule(original, target, inputs,
                                                          build_pipeline(target, model_layouts=True)),
        "onnxruntime": ort_model(proto, inputs),
    }
    samples = side_by_side({k: (lambda m=m: m.time_ms(args.min_repeat_ms)) for k, m in variants.items()},
                           args.repeats)
    row = {"model": name, "size": "quick" if args.quick else "full", "cpu": target.attrs.get("mcpu", ""),
           "rules_applied": report["applied"],
           "est_speedup": report["cost_before"] / report["cost_after"] if report["cost_after"] else 1.0,
           "compile_seconds": {k: m.compile_seconds for k, m in variants.items() if hasattr(m, "compile_seconds")},
           "median_ms": {k: float(np.median(v)) for k, v in samples.items()}, "samples_ms": samples}
    row["over_plain_loops"] = speedup(samples["plain loops"], samples["default schedules"])
    row["taso_gain"] = speedup(samples["default schedules"], samples["default schedules + taso"])
    row["a_a"] = speedup(samples["default schedules"], samples["default schedules (A/A)"])
    row["this_cpu_over_generic"] = speedup(samples["default schedules, generic CPU"], samples["default schedules"])
    row["channels_last_over_model_layouts"] = speedup(samples["default schedules, model layouts"],
                                                      samples["default schedules"])
    row["vs_onnxruntime"] = speedup(samples["onnxruntime"], samples["default schedules + taso"])
    for key in ("over_plain_loops", "taso_gain", "a_a", "this_cpu_over_generic", "channels_last_over_model_layouts",
                "vs_onnxruntime"):
        row[key].pop("samples", None)
    return row


def table(result: dict) -> str:
    # files from before have no such columns
    hosted = any("this_cpu_over_generic" in r for r in result["rows"])
    layouts = any("channels_last_over_model_layouts" in r for r in result["rows"])

    def cells(r):
        m, c = r["median_ms"], r["compile_seconds"]
        return [f"{m['plain loops']:.4g}", f"{m['default schedules']:.4g}", f"{m['default schedules + taso']:.4g}",
                f"{m['onnxruntime']:.4g}", ratio_text(r["over_plain_loops"]), ratio_text(r["taso_gain"]),
                ratio_text(r["a_a"])] + ([ratio_text(r.get("this_cpu_over_generic"))] if hosted else []) + (
                [ratio_text(r.get("channels_last_over_model_layouts"))] if layouts else []) + [
                ratio_text(r["vs_onnxruntime"]), f"{c['plain loops']:.1f}, {c['default schedules']:.1f}"]

    return model_table(["model", "plain loops ms", "default schedules ms", "+ taso ms", "onnxruntime ms",
                        "default over plain", "taso gain", "A/A"] + (["this CPU over generic"] if hosted else [])
                       + (["channels last over model layouts"] if layouts else [])
                       + ["+ taso vs onnxruntime", "compile s (plain, default)"],
                       result["rows"], cells)


def main(argv: list[str] | None = None) -> int:
    ap = harness_parser("benchmarks.default_schedules", __doc__, RESULTS)
    ap.add_argument("--repeats", type=int, default=5, help="timing rounds (default 5)")
    ap.add_argument("--min-repeat-ms", type=int, default=200, help="each sample averages calls for this long")
    args = ap.parse_args(argv)
    return run_models("benchmarks.default_schedules", args, argv, lambda name: bench_model(name, args), table)


if __name__ == "__main__":
    sys.exit(main())
