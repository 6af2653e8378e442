"""eqsat's extraction settings side by side: greedy + local switches (the default), with TENSAT's
ILP candidate, and with the search over rule applications.

For each model (both sizes by default), in one run, one after the other: ``tvm_taso.search.search`` with
``kind="eqsat"`` under ``EqsatLimits()``, ``EqsatLimits(ilp=True)`` and
``EqsatLimits(search_tries=N)`` (``--settings`` picks), on every dataflow block of ``main``,
under one cost model (analytic, priced for cuda): the seconds in the search and the estimated
cost of the graph each finds, with backtracking's cost for reference.

    python -m benchmarks.extraction_search                  # results/extraction_search.json
    python -m benchmarks.extraction_search --settings default ilp -o results/extraction_ilp.json
    python -m benchmarks.extraction_search --quick --only nasnet-a nasrnn
"""

from __future__ import annotations

import argparse
import logging
import statistics
import time
from pathlib import Path

from tvm_taso.cost.factory import make_cost_model
from tvm_taso.rewrite.rule import default_rules
from tvm_taso.search import EqsatLimits, SearchOptions, eqsat, search

from .cli import block_graphs, chosen_models, write_result

RESULTS = Path(__file__).parent / "results"


def run_search(gs: list, rules, cost, kind: str, limits: EqsatLimits | None, time_limit: float):
    seconds = total = 0.0
    for g in gs:
        t0 = time.perf_counter()
        new = search(g, rules, cost, SearchOptions(time_limit=time_limit, kind=kind, eqsat=limits or EqsatLimits()))
        seconds += time.perf_counter() - t0
        total += cost.cost(new)
    return seconds, total


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--quick", action="store_true", help="tiny model sizes only (default: both sizes)")
    parser.add_argument("--only", nargs="*", help="model names (default all eight)")
    parser.add_argument("--search-tries", type=int, default=100)
    parser.add_argument("--settings", nargs="+", choices=("default", "ilp", "search"), default=["default", "search"],
                        help="extraction settings to compare, the first against the others (default: default search)")
    parser.add_argument("--time-limit", type=float, default=300.0, help="seconds per model and search")
    parser.add_argument("--target", default="cuda")
    parser.add_argument("-o", "--output", help="default: results/extraction_search.json")
    args = parser.parse_args(argv)
    logging.basicConfig(level=logging.WARNING)
    eqsat.require_egglog()
    from tqdm import tqdm

    rules, cost = default_rules(), make_cost_model("analytic", args.target)
    known = {"default": ("default", EqsatLimits()), "ilp": ("ilp", EqsatLimits(ilp=True)),
             "search": (f"search_tries={args.search_tries}", EqsatLimits(search_tries=args.search_tries))}
    settings = dict(known[k] for k in args.settings)
    rows = []
    pairs = [(size, n) for size in (("quick",) if args.quick else ("quick", "full"))
             for n in chosen_models(parser, args.only)]
    for size, name in tqdm(pairs, desc="extraction_search", unit="model"):
        gs = [g for _, g in block_graphs(name, size == "quick")]
        row = {"size": size, "model": name,
               "backtrack_cost": run_search(gs, rules, cost, "backtrack", None, args.time_limit)[1]}
        for label, limits in settings.items():
            seconds, total = run_search(gs, rules, cost, "eqsat", limits, args.time_limit)
            row[label] = {"seconds": seconds, "cost": total, "vs_backtrack": total / row["backtrack_cost"]}
        rows.append(row)
        tqdm.write(f"{size:5s} {name:14s} " + " | ".join(
            f"{k} {row[k]['seconds']:6.2f} s {row[k]['cost']:10.3f} ({row[k]['vs_backtrack']:.4f} of backtracking)"
            for k in settings))
    a_key, b_key = list(settings)[:2]
    ratios = [r[b_key]["seconds"] / r[a_key]["seconds"] for r in rows]
    result = {
        "target": args.target, "cost_model": "analytic", "settings": list(settings),
        "note": "one run of each setting per model, one after the other, on this machine; costs are the whole blocks' "
                "estimates after the search (weights not folded)",
        "rows": rows,
        "summary": {
            "median_time_ratio": statistics.median(ratios), "time_ratio_range": [min(ratios), max(ratios)],
            "compared": [a_key, b_key],
            "cheaper_than_first": [f"{r['size']} {r['model']}" for r in rows
                                   if r[b_key]["cost"] < r[a_key]["cost"] - 1e-9],
            "costlier_than_backtracking": {k: [f"{r['size']} {r['model']}" for r in rows
                                               if r[k]["cost"] > r["backtrack_cost"] * (1 + 1e-9)] for k in settings},
        },
    }
    output = args.output or str(RESULTS / "extraction_search.json")
    write_result(output, result)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
