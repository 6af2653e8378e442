"""One search on two source trees, side by side: this checkout against another (a worktree of an
earlier commit), to measure what a change did to search time and cost.

For each model, each tree and each worker count, alternating tree by tree so that a slow spell
of the machine hits both, ``tvm_taso.optimize`` runs in a fresh process with that tree first on
``PYTHONPATH`` (the models built by that tree's ``benchmarks.models``), analytic cost for cuda,
and reports the seconds in the search proper (``report["search"]["seconds"]``) and the estimated
cost found. The medians of ``--repeats`` runs are compared as ratios (after / before).

    git worktree add /tmp/before <commit>
    python -m benchmarks.search_ab --before /tmp/before --search eqsat -j 1 2 -o results/eqsat_speed.json
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys
from pathlib import Path

from .cli import chosen_models, write_result
from .search_compare import TENSAT_PUBLISHED

RESULTS = Path(__file__).parent / "results"
HERE = Path(__file__).resolve().parent.parent

# run in the child: optimize one model, print one JSON line
_CHILD = """
import json, sys, warnings
import tvm_taso
from tvm_taso.io.onnx_import import import_relax
from benchmarks.models import build
name, search, workers, quick = sys.argv[1], sys.argv[2], int(sys.argv[3]), sys.argv[4] == "quick"
limit = {} if sys.argv[5] == "default" else {"time_limit": float(sys.argv[5])}
mod = import_relax(build(name, quick=quick))
with warnings.catch_warnings():
    warnings.simplefilter("ignore")
    _, report = tvm_taso.optimize(mod, target="cuda", cost_model="analytic", search=search, workers=workers, **limit)
print(json.dumps({"seconds": report["search"]["seconds"], "cost_after": report["cost_after"],
                  "tvm_taso": tvm_taso.__file__}))
"""


def run_in_tree(tree: Path, code: str, *args: str) -> dict:
    """Run ``code`` (which prints one JSON object with ``tvm_taso.__file__`` as ``"tvm_taso"``
    last) in a fresh process with ``tree`` first on ``PYTHONPATH``; the object, checked to come
    from that tree."""
    env = {**os.environ, "PYTHONPATH": os.pathsep.join([str(tree), os.environ.get("PYTHONPATH", "")])}
    out = subprocess.run([sys.executable, "-c", code, *args], capture_output=True, text=True, env=env, cwd=tree,
                         check=True)
    row = json.loads(out.stdout.strip().splitlines()[-1])
    if not row.pop("tvm_taso").startswith(str(tree)):
        raise RuntimeError(f"the child imported tvm_taso from outside {tree}")
    return row


def commit_of(tree: Path) -> str:
    """The short commit a source tree is checked out at."""
    return subprocess.run(["git", "rev-parse", "--short", "HEAD"], capture_output=True, text=True,
                          cwd=tree).stdout.strip()


def run_once(tree: Path, name: str, search: str, workers: int, quick: bool, time_limit: float | None) -> dict:
    return run_in_tree(tree, _CHILD, name, search, str(workers), "quick" if quick else "full",
                       "default" if time_limit is None else str(time_limit))


def markdown(result: dict) -> str:
    """The table of a run: per model and worker count, the median search seconds before and
    after, their ratio, and the costs found (one column when they are the same everywhere)."""
    same = all(row["same_cost"] for row in result["models"])
    costs = "same cost" if same else "cost before | cost after"
    lines = [f"| model | workers | before s | after s | after / before | {costs} |",
             "|---|---:|---:|---:|---:|" + ("---|" if same else "---:|---:|")]
    for row in result["models"]:
        found = ("yes" if same else f"{row['before']['cost_after']:.2f} | {row['after']['cost_after']:.2f}")
        lines.append(f"| {row['model']} | {row['workers']} | {row['before']['seconds']:.2f} | "
                     f"{row['after']['seconds']:.2f} | {row['time_ratio']:.2f} | {found} |")
    return "\n".join(lines)


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--before", required=True, type=Path, help="the other source tree (a worktree)")
    parser.add_argument("--search", default="eqsat", choices=("eqsat", "backtrack", "auto"))
    parser.add_argument("-j", "--workers", type=int, nargs="+", default=[1], help="worker counts to run each at")
    parser.add_argument("--repeats", type=int, default=1)
    parser.add_argument("--quick", action="store_true")
    parser.add_argument("--time-limit", type=float, help="seconds per search (default: optimize's)")
    parser.add_argument("--only", nargs="*", help="model names (default all eight)")
    parser.add_argument("-o", "--output", default=str(RESULTS / "search_ab.json"))
    args = parser.parse_args(argv)
    trees = {"before": args.before.resolve(), "after": HERE}
    rows = []
    for name in chosen_models(parser, args.only):
        for workers in args.workers:
            runs: dict = {side: [] for side in trees}
            for _ in range(args.repeats):
                for side, tree in trees.items():
                    runs[side].append(run_once(tree, name, args.search, workers, args.quick, args.time_limit))
            row = {"model": name, "workers": workers}
            for side in trees:
                row[side] = {"seconds": statistics.median(r["seconds"] for r in runs[side]),
                             "all_seconds": [r["seconds"] for r in runs[side]],
                             "cost_after": runs[side][0]["cost_after"]}
            row["time_ratio"] = row["after"]["seconds"] / row["before"]["seconds"]
            row["same_cost"] = abs(row["after"]["cost_after"] - row["before"]["cost_after"]) <= 1e-9 * max(
                1.0, abs(row["before"]["cost_after"]))
            rows.append(row)
            print(f"{name:14s} -j {workers}: {row['before']['seconds']:6.2f} s -> {row['after']['seconds']:6.2f} s "
                  f"({row['time_ratio']:.2f}x), cost {'same' if row['same_cost'] else 'differs'}", flush=True)
    summary = {}
    for workers in args.workers:
        mine = [r for r in rows if r["workers"] == workers]
        tensat = [r for r in mine if r["model"] in TENSAT_PUBLISHED]
        summary[f"j{workers}"] = {
            "median_time_ratio": statistics.median(r["time_ratio"] for r in mine),
            "time_ratio_range": [min(r["time_ratio"] for r in mine), max(r["time_ratio"] for r in mine)],
            "all_same_cost": all(r["same_cost"] for r in mine),
            **({"median_seconds_tensat_models": {side: statistics.median(r[side]["seconds"] for r in tensat)
                                                 for side in trees}} if tensat else {}),
        }
    result = {"search": args.search, "sizes": "quick" if args.quick else "full", "repeats": args.repeats,
              "time_limit": args.time_limit,
              "before": f"commit {commit_of(args.before)}", "after": "this checkout",
              "how": "each run a fresh process, the trees alternating per model and worker count; analytic cost "
                     "for cuda; seconds in the search proper; a measurement on this 2-core machine",
              "models": rows, "summary": summary}
    write_result(args.output, result)
    print(markdown(result))
    return 0


if __name__ == "__main__":
    sys.exit(main())
