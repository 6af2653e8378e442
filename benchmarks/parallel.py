"""The search in one process against two: ``python -m benchmarks.parallel``.

For each of the eight benchmark models (full size unless ``--quick``), in one run, alternating:
``tvm_taso.optimize`` with each search (backtracking, eqsat) at ``workers=1`` and at
``workers=2``, ``--repeats`` times each, under one cost model (analytic, priced for cuda), on
the Relax path (as ``benchmarks.search_compare``). Recorded: the seconds in the search proper
(``report["search"]["seconds"]``), their medians and quartiles, the speedup of two workers over
one, and whether the results are identical (the printed module, the cost, the rules applied and
the report apart from timings). TENSAT's published search times are on other hardware, with one
thread.

    python -m benchmarks.parallel             # results/parallel_full.json
    python -m benchmarks.parallel --quick     # tiny models: results/parallel_quick.json
"""

from __future__ import annotations

import argparse
import json
import logging
import statistics
import sys
import warnings
from pathlib import Path

import tvm_taso
from tvm_taso.io.onnx_import import import_relax

from .cli import chosen_models, write_result
from .models import build
from .search_compare import TENSAT_PUBLISHED, _spread

RESULTS = Path(__file__).parent / "results"
SEARCHES = ("backtrack", "eqsat")
WORKERS = (1, 2)


def _result(new_mod, report: dict) -> str:
    """What must not depend on the number of workers, as one string."""
    return json.dumps([new_mod.script(show_meta=False), report["cost_after"], report["applied"], report["regions"],
                       report["regions_reused"], report["regions_stopped"], report["kernels_after"]], sort_keys=True)


def compare(name: str, quick: bool, time_limit: float, target: str, repeats: int) -> dict:
    mod = import_relax(build(name, quick=quick))
    times = {(kind, w): [] for kind in SEARCHES for w in WORKERS}
    results: dict = {}
    row: dict = {"model": name}
    for _ in range(repeats):
        for kind in SEARCHES:
            for workers in WORKERS:  # alternating, so that a slow spell of the machine hits both
                with warnings.catch_warnings():
                    warnings.simplefilter("ignore")
                    new, report = tvm_taso.optimize(mod, target=target, cost_model="analytic", time_limit=time_limit,
                                                    search=kind, workers=workers)
                times[(kind, workers)].append(report["search"]["seconds"])
                results.setdefault(kind, {}).setdefault(workers, set()).add(_result(new, report))
                row.setdefault("regions", report["regions"])
                row.setdefault("cut_short", 0)
                row["cut_short"] += report["regions_cut_short"]
    for kind in SEARCHES:
        one, two = (statistics.median(times[(kind, w)]) for w in WORKERS)
        same = len(results[kind][1] | results[kind][2]) == 1
        row[kind] = {f"workers_{w}": _spread(times[(kind, w)]) for w in WORKERS}
        row[kind].update(speedup=one / two if two else None, identical=same)
    if name in TENSAT_PUBLISHED:
        row["tensat_published_seconds"] = TENSAT_PUBLISHED[name]
    return row


def summary(rows: list[dict]) -> dict:
    many = [r for r in rows if r["regions"] >= 8]
    tensat = [r for r in rows if "tensat_published_seconds" in r]
    return {
        "identical": all(r[k]["identical"] for r in rows for k in SEARCHES),
        "speedup_8_regions_or_more": {f"{r['model']} {k}": round(r[k]["speedup"], 3) for r in many for k in SEARCHES},
        "min_speedup_8_regions_or_more": min((r[k]["speedup"] for r in many for k in SEARCHES), default=None),
        "eqsat_median_seconds_tensat_models": {f"workers_{w}": statistics.median(
            r["eqsat"][f"workers_{w}"]["median"] for r in tensat) for w in WORKERS} if tensat else None,
        "tensat_published_median_seconds": statistics.median(r["tensat_published_seconds"] for r in tensat)
        if tensat else None,
        "cut_short": sum(r["cut_short"] for r in rows),
    }


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--quick", action="store_true", help="tiny model sizes (default: full sizes)")
    parser.add_argument("--time-limit", type=float, default=600.0, help="seconds per model and search (no cut)")
    parser.add_argument("--repeats", type=int, default=3, help="runs of each setting per model (median quoted)")
    parser.add_argument("--target", default="cuda")
    parser.add_argument("--only", nargs="*", help="model names (default all eight)")
    parser.add_argument("-o", "--output", help="default: results/parallel_{quick,full}.json")
    args = parser.parse_args(argv)
    logging.basicConfig(level=logging.WARNING)
    from tqdm import tqdm

    sizes = "quick" if args.quick else "full"
    rows = []
    for name in tqdm(chosen_models(parser, args.only), desc="parallel", unit="model"):
        row = compare(name, args.quick, args.time_limit, args.target, args.repeats)
        rows.append(row)
        tqdm.write(f"{name:14s} {row['regions']:3d} regions | " + " | ".join(
            f"{k} {row[k]['workers_1']['median']:6.2f} s -> {row[k]['workers_2']['median']:6.2f} s "
            f"({row[k]['speedup']:.2f}x, {'identical' if row[k]['identical'] else 'DIFFERENT'})" for k in SEARCHES))
    result = {"sizes": sizes, "target": args.target, "cost_model": "analytic", "time_limit": args.time_limit,
              "repeats": args.repeats, "workers": list(WORKERS),
              "note": "search seconds: medians of the repeats on this 2-core machine, settings alternating; "
                      "TENSAT's are as published, on other hardware, one thread",
              "models": rows, "summary": summary(rows)}
    write_result(args.output or str(RESULTS / f"parallel_{sizes}.json"), result)
    return 0 if result["summary"]["identical"] else 1


if __name__ == "__main__":
    sys.exit(main())
