"""Backtracking (TASO) against equality saturation (TENSAT) on the eight benchmark models.

For each model, in one run: ``tvm_taso.optimize`` with ``search="backtrack"`` and with
``search="eqsat"``, under one cost model (analytic, priced for cuda), recording the search time
and the estimated cost each finds, the e-graph's size, why saturation stopped and the
extraction time. Ratios to TENSAT's published search times are labelled as published (other
hardware: TENSAT's own machine, not this one).

    python -m benchmarks.search_compare --quick --time-limit 30   # tiny models (results/ holds this run)
    python -m benchmarks.search_compare --time-limit 120             # full sizes

Results: ``benchmarks/results/search_compare.json`` (and a table on stdout).
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

import tvm_taso
from tvm_taso.files import write_text_atomically
from tvm_taso.io.onnx_import import import_relax

from .models import MODELS, build

log = logging.getLogger(__name__)

RESULT = Path(__file__).parent / "results" / "search_compare.json"
# TENSAT's published search times (seconds; Yang et al., MLSys 2021), on their hardware.
TENSAT_PUBLISHED = {"bert-base": 1.4, "resnext50": 0.7, "nasnet-a": 10.6, "nasrnn": 0.5, "inception-v3": 5.1,
                    "squeezenet1.1": 0.3, "vgg19": 0.4}
SEARCHES = ("backtrack", "eqsat")


def compare(name: str, quick: bool, time_limit: float, target: str) -> dict:
    mod = import_relax(build(name, quick=quick))  # the Relax path (as benchmarks.run)
    row: dict = {"model": name}
    for kind in SEARCHES:
        with warnings.catch_warnings():
            warnings.simplefilter("ignore")
            t0 = time.perf_counter()
            _, report = tvm_taso.optimize(mod, target=target, cost_model="analytic", time_limit=time_limit,
                                          search=kind)
        row[kind] = {
            "seconds": time.perf_counter() - t0,
            "search_seconds": report["search_seconds"],
            "cost_before": report["cost_before"],
            "cost_after": report["cost_after"],
            "regions_stopped": report["regions_stopped"],
            "cut_short": report["regions_cut_short"],
            "applied": sum(report["applied"].values()),
            "search": report["search"],
        }
    b, e = row["backtrack"], row["eqsat"]
    row["eqsat_cost_vs_backtrack"] = e["cost_after"] / b["cost_after"] if b["cost_after"] else 1.0
    row["eqsat_speedup_vs_backtrack"] = b["search_seconds"] / e["search_seconds"] if e["search_seconds"] else None
    if name in TENSAT_PUBLISHED:
        row["tensat_published_seconds"] = TENSAT_PUBLISHED[name]
        row["eqsat_vs_tensat_published"] = e["search_seconds"] / TENSAT_PUBLISHED[name]
    return row


def summary(rows: list[dict]) -> dict:
    published = [r for r in rows if "tensat_published_seconds" in r]
    return {
        "eqsat_never_costlier": all(r["eqsat"]["cost_after"] <= r["backtrack"]["cost_after"] * (1 + 1e-9) for r in rows),
        "eqsat_speedup_vs_backtrack": {r["model"]: r["eqsat_speedup_vs_backtrack"] for r in rows},
        "median_eqsat_seconds_tensat_models": statistics.median(r["eqsat"]["search_seconds"] for r in published)
        if published else None,
        "median_tensat_published_seconds": statistics.median(TENSAT_PUBLISHED[r["model"]] for r in published)
        if published else None,
        "median_ratio_to_tensat_published": statistics.median(r["eqsat_vs_tensat_published"] for r in published)
        if published else None,
    }


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--quick", action="store_true", help="tiny model sizes (default: full sizes)")
    parser.add_argument("--time-limit", type=float, default=120.0, help="seconds per model and search")
    parser.add_argument("--target", default="cuda")
    parser.add_argument("--only", nargs="*", help="model names (default all eight)")
    parser.add_argument("-o", "--output", default=str(RESULT))
    args = parser.parse_args(argv)
    logging.basicConfig(level=logging.WARNING)
    from tqdm import tqdm

    names = [n for n in MODELS if not args.only or n in args.only]
    rows = []
    for name in tqdm(names, desc="search_compare", unit="model"):
        row = compare(name, args.quick, args.time_limit, args.target)
        rows.append(row)
        b, e = row["backtrack"], row["eqsat"]
        cut = " (cut short by --time-limit)" if b["cut_short"] or e["cut_short"] else ""
        tensat = f" | TENSAT published {row['tensat_published_seconds']:4.1f} s" if "tensat_published_seconds" in row else ""
        tqdm.write(f"{name:14s} backtrack {b['search_seconds']:7.2f} s {b['cost_after']:10.4f} us | "
                   f"eqsat {e['search_seconds']:7.2f} s {e['cost_after']:10.4f} us "
                   f"({e['search']['egraph_nodes']} e-nodes max){tensat}{cut}")
    result = {"sizes": "quick" if args.quick else "full", "target": args.target, "cost_model": "analytic",
              "time_limit": args.time_limit, "note": "TENSAT times are as published, on other hardware; "
              "ours on this machine (shared, loaded)", "models": rows, "summary": summary(rows)}
    write_text_atomically(args.output, json.dumps(result, indent=1) + "\n")
    print(json.dumps(result["summary"], indent=1))
    print(f"wrote {args.output}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
