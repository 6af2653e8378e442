"""How well does the ``tuned`` cost model price a kernel its database lacks?

    python -m benchmarks.tuned_prediction --database DIR [--target llvm] [--json OUT]

Each task the MetaSchedule database in ``DIR`` tuned for the target (with arithmetic) is left out
in turn and priced from the others two ways: by
:class:`~tvm_taso.cost.tuned.TunedTimePredictor` (XGBoost over MetaSchedule's per-store
features of the untuned task), and by the fallback's one scale (the median, over the others, of
tuned time over FLOPs at the analytic peak). Scores over all tasks: Spearman rank correlation of
predicted and tuned times (what a search needs) and median relative error (what reported costs
need). A database from ``python -m benchmarks.tuned --models resnet50 --work-dir DIR`` holds the
original's and the rewritten model's tasks. Writes ``benchmarks/results/tuned_prediction.json``.
"""

from __future__ import annotations

import argparse
import datetime
import json
import logging
import sys
import time
from pathlib import Path

import numpy as np

from benchmarks.run import machine
from tvm_taso.files import write_text_atomically

ROOT = Path(__file__).resolve().parent.parent
RESULTS = ROOT / "benchmarks" / "results" / "tuned_prediction.json"
log = logging.getLogger("benchmarks.tuned_prediction")


def leave_one_out(database: str, target: str) -> dict:
    from tvm_taso import target as targets
    from tvm_taso.cost import tuning
    from tvm_taso.cost.analytic import AnalyticCost
    from tvm_taso.cost.training import median_rel_error, spearman
    from tvm_taso.cost.tuned import TunedTimePredictor, efficiency_scale, tuned_workloads, workload_features

    target = targets.with_cores(target)
    tuning.tensor_intrinsics()
    workloads = tuned_workloads(tuning.open_database(tuning.check_database(database)), target)
    peak = AnalyticCost(target).roof.peak_flops
    t0 = time.perf_counter()
    features = np.stack([workload_features(mod, target, flops) for _, flops, mod in workloads])
    feature_seconds = time.perf_counter() - t0
    truth = np.array([seconds for seconds, _, _ in workloads])
    predicted, scaled = [], []
    for k in range(len(workloads)):
        rest = [w for j, w in enumerate(workloads) if j != k]
        predictor = TunedTimePredictor(rest, target, peak, np.delete(features, k, axis=0))
        predicted.append(predictor.seconds(workloads[k][2]))
        scaled.append(efficiency_scale(rest, peak) * workloads[k][1] / peak)
    predicted, scaled = np.array(predicted), np.array(scaled)
    return {
        "tasks": len(workloads), "feature_seconds": feature_seconds,
        "predictor": {"spearman": spearman(predicted, truth), "median_rel_error": median_rel_error(predicted, truth)},
        "scaled_fallback": {"spearman": spearman(scaled, truth), "median_rel_error": median_rel_error(scaled, truth)},
        "per_task_us": [{"tuned": t * 1e6, "predictor": p * 1e6, "scaled_fallback": s * 1e6}
                        for t, p, s in zip(truth, predicted, scaled)],
    }


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(prog="python -m benchmarks.tuned_prediction", description=__doc__.split("\n\n")[0])
    ap.add_argument("--database", required=True, help="a MetaSchedule work dir (tvm-taso tune -o DIR)")
    ap.add_argument("--target", default="llvm")
    ap.add_argument("--json", type=Path, default=RESULTS)
    args = ap.parse_args(argv)
    logging.basicConfig(level=logging.INFO, format="%(asctime)s %(name)s: %(message)s", datefmt="%H:%M:%S")
    result = {"date": datetime.date.today().isoformat(), "machine": machine(),
              "command": " ".join(["python -m benchmarks.tuned_prediction",
                                   *(argv if argv is not None else sys.argv[1:])]),
              "kind": "leave-one-out estimate of tuned times (no timing run)", "target": args.target,
              **leave_one_out(args.database, args.target)}
    write_text_atomically(args.json, json.dumps(result, indent=2) + "\n")
    for name in ("predictor", "scaled_fallback"):
        score = result[name]
        print(f"{name}: Spearman {score['spearman']:.3f}, median relative error {score['median_rel_error']:.3f} "
              f"over {result['tasks']} tasks")
    return 0


if __name__ == "__main__":
    sys.exit(main())
