"""Optimized for onnxruntime, timed in onnxruntime: ``python -m benchmarks.ort_runtime``.

Each model (the eight benchmark models at full size, and a dozen of the model zoo's PyTorch
exports) is optimized with ``target="ort"`` (kernels priced by timing them in onnxruntime's CPU
provider, each rewritten region timed against the original region and kept only if faster, the
whole model timed last), then three sessions are timed side by side in one run, alternating:
the original, the original again (A/A: the noise of this machine for this model) and the
optimized model. Speedup and A/A are medians of pairwise ratios, with quartiles. A model is
*slower* when its speedup's median is below the A/A lower quartile.

Results go to ``benchmarks/results/ort_runtime.json`` (and ``--markdown OUT``). Measurements
start from an empty database (``TVM_TASO_CACHE`` in a temporary directory) unless ``--cache``.
"""

from __future__ import annotations

import argparse
import json
import logging
import os
import shutil
import tempfile
import time
import warnings
from pathlib import Path

import numpy as np

from tvm_taso.files import write_text_atomically

log = logging.getLogger("benchmarks.ort_runtime")

RESULTS = Path(__file__).parent / "results" / "ort_runtime.json"
# a dozen of the zoo's models: CNN families, transformers for text and vision
ZOO = ("resnet18", "resnext50_32x4d", "inception_v3", "googlenet", "mobilenet_v2", "densenet121", "efficientnet_b0",
       "vit_b_32", "distilbert", "roberta", "bart", "swin")


def load(name: str, work: Path):
    """``(OnnxModel, source)`` for a benchmark model or a zoo model (exported here, batch 1)."""
    import tvm_taso

    from . import models

    if name in models.MODELS:
        return tvm_taso.load_onnx(models.build(name), name=name), "benchmark"
    from .zoo import export

    path = work / f"{name}.onnx"
    try:
        export(name, "classic", "static", path)
    except Exception:  # noqa: BLE001 - an op the classic exporter lacks (ViT's fused attention)
        log.info("%s: the classic exporter failed; exporting with dynamo", name)
        export(name, "dynamo", "static", path)
    return tvm_taso.load_onnx(str(path), name=name), "zoo"


def time_side_by_side(original, optimized, rounds: int, min_repeat_ms: int) -> dict:
    """The original, the original again and the optimized model, timed alternating in one run."""
    from tvm_taso.io.onnx_feeds import integer_ranges, random_feeds
    from tvm_taso.cost.latency import side_by_side, speedup
    from tvm_taso.ort.runtime import OrtRuntime, OrtSession

    runtime = OrtRuntime("cpu")
    feeds = random_feeds(original, original.dims, integer_ranges(original))
    sessions = {"original": OrtSession(runtime, original.proto, feeds),
                "original_again": OrtSession(runtime, original.proto, feeds),
                "optimized": OrtSession(runtime, optimized.proto, feeds)}
    samples = side_by_side({k: (lambda s=s: s.time_ms(min_repeat_ms)) for k, s in sessions.items()}, rounds)
    result = {"speedup": speedup(samples["original"], samples["optimized"]),
              "a_a": speedup(samples["original"], samples["original_again"]), "samples_ms": samples}
    result["slower"] = result["speedup"]["ratio"] < result["a_a"]["ratio_low"]
    return result


def run_model(name: str, work: Path, time_limit: float, rounds: int, min_repeat_ms: int) -> dict:
    import tvm_taso

    t0 = time.perf_counter()
    model, source = load(name, work)
    load_seconds = time.perf_counter() - t0
    t0 = time.perf_counter()
    new, report = tvm_taso.optimize(model, target="ort", time_limit=time_limit)
    optimize_seconds = time.perf_counter() - t0
    timing = time_side_by_side(model, new, rounds, min_repeat_ms)
    regions = report.get("region_guard") or {"regions": 0, "kept": 0, "dropped": 0, "decisions": [], "seconds": 0}
    kept = [d for d in regions["decisions"] if d["kept"]]
    guard = report.get("guard")
    return {
        "model": name, "source": source, "load_seconds": load_seconds, "optimize_seconds": optimize_seconds,
        "search_seconds": report["search_seconds"], "regions_cut_short": report.get("regions_cut_short", 0),
        "kernels_measured": report["cost_model"].get("measured"),
        "kernel_measure_seconds": report["cost_model"].get("measure_seconds"),
        "estimated_speedup": report["speedup_estimate"],
        "regions_timed": regions["regions"], "regions_kept": regions["kept"], "regions_dropped": regions["dropped"],
        "region_seconds": regions["seconds"],
        "kept_ratio_low_min": min((d["ratio_low"] for d in kept), default=None),
        "guard": None if guard is None else {k: guard.get(k) for k in ("kept", "ratio", "ratio_low", "ratio_high",
                                                                       "reason")},
        "applied": report["applied"], "rewritten": bool(report["applied"]),
        **{k: v for k, v in timing.items() if k != "samples_ms"}, "samples_ms": timing["samples_ms"],
    }


def markdown(rows: list[dict]) -> str:
    head = ("| model | source | speedup (quartiles) | A/A (quartiles) | slower than A/A noise | regions timed / kept "
            "| whole model kept | rules applied | optimize s |\n|---|---|---|---|---|---|---|---|---|\n")
    lines = []
    for r in rows:
        if "error" in r:
            lines.append(f"| {r['model']} | {r.get('source', '')} | failed: {r['error']} | | | | | | |")
            continue
        s, a = r["speedup"], r["a_a"]
        guard = r["guard"]
        lines.append(
            f"| {r['model']} | {r['source']} | {s['ratio']:.3f} ({s['ratio_low']:.3f}–{s['ratio_high']:.3f}) "
            f"| {a['ratio']:.3f} ({a['ratio_low']:.3f}–{a['ratio_high']:.3f}) | {'**yes**' if r['slower'] else 'no'} "
            f"| {r['regions_timed']} / {r['regions_kept']} | "
            f"{'—' if guard is None else ('yes' if guard['kept'] else 'no (not faster)')} "
            f"| {', '.join(f'{k} ×{v}' for k, v in r['applied'].items()) or 'none'} | {r['optimize_seconds']:.0f} |")
    return head + "\n".join(lines)


def summary(rows: list[dict]) -> str:
    ok = [r for r in rows if "error" not in r]
    rewritten = [r for r in ok if r["rewritten"]]
    speedups = [r["speedup"]["ratio"] for r in rewritten]
    return (f"{len(ok)} models timed ({len(rows) - len(ok)} failed), {sum(r['slower'] for r in ok)} slower than "
            f"their A/A noise; {len(rewritten)} rewritten"
            + (f" (median speedup {np.median(speedups):.3f}, range {min(speedups):.3f}–{max(speedups):.3f})"
               if speedups else "")
            + f"; {sum(r['regions_kept'] for r in ok)} of {sum(r['regions_timed'] for r in ok)} regions kept")


def main(argv=None) -> int:
    from . import models

    ap = argparse.ArgumentParser(prog="python -m benchmarks.ort_runtime", description=__doc__.split("\n\n")[0])
    ap.add_argument("--only", nargs="+", metavar="NAME", help="only these models (default all)")
    ap.add_argument("--time-limit", type=float, default=60.0, help="seconds for each search (default 60)")
    ap.add_argument("--rounds", type=int, default=15, help="alternating timing rounds (default 15)")
    ap.add_argument("--min-repeat-ms", type=int, default=200, help="milliseconds per sample (default 200)")
    ap.add_argument("--cache", action="store_true", help="use the measurement database in TVM_TASO_CACHE")
    ap.add_argument("--json", default=str(RESULTS))
    ap.add_argument("--markdown", metavar="OUT")
    args = ap.parse_args(argv)
    logging.basicConfig(level=logging.INFO, format="%(name)s: %(message)s")
    for noisy in ("tvm_taso.search", "tvm_taso.cost", "tvm_taso.guard", "tvm_taso"):
        logging.getLogger(noisy).setLevel(logging.WARNING)
    warnings.simplefilter("ignore")  # what each search left as is is in its report
    names = [n for n in list(models.MODELS) + list(ZOO) if not args.only or n in args.only]
    work = Path(tempfile.mkdtemp(prefix="tvm-taso-ort-"))
    if not args.cache:
        os.environ["TVM_TASO_CACHE"] = str(work / "cache")
    rows, t0 = [], time.perf_counter()
    try:
        for k, name in enumerate(names, 1):
            log.info("[%d/%d] %s", k, len(names), name)
            try:
                row = run_model(name, work, args.time_limit, args.rounds, args.min_repeat_ms)
            except Exception as err:  # noqa: BLE001 - one model's failure is a row
                log.exception("%s failed", name)
                row = {"model": name, "error": f"{type(err).__name__}: {err}".splitlines()[0]}
            else:
                log.info("  speedup %.3f (%.3f-%.3f), A/A %.3f (%.3f-%.3f), %d/%d regions kept, %.0f s",
                         row["speedup"]["ratio"], row["speedup"]["ratio_low"], row["speedup"]["ratio_high"],
                         row["a_a"]["ratio"], row["a_a"]["ratio_low"], row["a_a"]["ratio_high"],
                         row["regions_kept"], row["regions_timed"], row["optimize_seconds"])
            rows.append(row)
            Path(args.json).parent.mkdir(parents=True, exist_ok=True)
            write_text_atomically(args.json, json.dumps(
                {"runtime": f"onnxruntime {__import__('onnxruntime').__version__} CPUExecutionProvider", "time_limit": args.time_limit, "rounds": args.rounds,
                 "seconds": time.perf_counter() - t0, "summary": summary(rows), "rows": rows}, indent=1))
    finally:
        shutil.rmtree(work, ignore_errors=True)
    table = markdown(rows)
    print(table)
    print(summary(rows) + f" ({time.perf_counter() - t0:.0f} s)")
    if args.markdown:
        write_text_atomically(args.markdown, f"{summary(rows)}\n\n{table}\n")
    return 1 if any("error" in r or r["slower"] for r in rows) else 0


if __name__ == "__main__":
    raise SystemExit(main())
