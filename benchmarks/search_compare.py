"""Backtracking (TASO) against equality saturation (TENSAT) on the eight benchmark models.

For each model, in one run, alternating: ``tvm_taso.optimize`` with ``search="backtrack"`` and
with ``search="eqsat"``, ``--repeats`` times each, under one cost model (analytic, priced for
cuda), recording the seconds in the search proper (``report["search"]["seconds"]``: regions
searched, spliced and their weights folded; not reading the module in, folding weights
afterwards nor writing it back, which both searches pay alike), their median and quartiles, the
estimated cost each finds, the e-graph's size, why saturation stopped and the extraction time.
Ratios to TENSAT's published
search times are labelled as published (other hardware: TENSAT's own machine, not this one).

    python -m benchmarks.search_compare --quick     # tiny models: results/search_compare_quick.json
    python -m benchmarks.search_compare             # full sizes: results/search_compare_full.json
    python -m benchmarks.search_compare -j 1 -o benchmarks/results/search_compare_full_j1.json
"""

from __future__ import annotations

import argparse
import logging
import statistics
import sys
import warnings
from pathlib import Path

import tvm_taso
from tvm_taso.io.onnx_import import import_relax
from tvm_taso.search.pool import default_workers

from .cli import chosen_models, write_result
from .models import build

log = logging.getLogger(__name__)

RESULTS = Path(__file__).parent / "results"
# TENSAT's published search times (seconds; Yang et al., MLSys 2021), on their hardware.
TENSAT_PUBLISHED = {"bert-base": 1.4, "resnext50": 0.7, "nasnet-a": 10.6, "nasrnn": 0.5, "inception-v3": 5.1,
                    "squeezenet1.1": 0.3, "vgg19": 0.4}
SEARCHES = ("backtrack", "eqsat")


def _spread(times: list[float]) -> dict:
    q = statistics.quantiles(times, n=4) if len(times) > 1 else [times[0]] * 3
    return {"median": statistics.median(times), "q1": q[0], "q3": q[2], "all": times}


def compare(name: str, quick: bool, time_limit: float, target: str, repeats: int, workers: int | None = None) -> dict:
    mod = import_relax(build(name, quick=quick))  # the Relax path (as benchmarks.run)
    row: dict = {"model": name}
    times: dict = {kind: [] for kind in SEARCHES}
    for _ in range(repeats):
        for kind in SEARCHES:  # alternating, so that a slow spell of the machine hits both
            with warnings.catch_warnings():
                warnings.simplefilter("ignore")
                _, report = tvm_taso.optimize(mod, target=target, cost_model="analytic", time_limit=time_limit,
                                              search=kind, workers=workers)
            times[kind].append(report["search"]["seconds"])
            if kind in row and row[kind]["cost_after"] != report["cost_after"]:
                row[kind]["cost_differs_between_repeats"] = True
            row.setdefault(kind, {
                "cost_before": report["cost_before"],
                "cost_after": report["cost_after"],
                "regions_stopped": report["regions_stopped"],
                "regions_reused": report["regions_reused"],
                "cut_short": report["regions_cut_short"],
                "applied": sum(report["applied"].values()),
                "search": report["search"],
            })
    for kind in SEARCHES:
        row[kind]["seconds"] = _spread(times[kind])
    b, e = row["backtrack"], row["eqsat"]
    e_s, b_s = e["seconds"]["median"], b["seconds"]["median"]
    row["eqsat_cost_vs_backtrack"] = e["cost_after"] / b["cost_after"] if b["cost_after"] else 1.0
    row["eqsat_speedup_vs_backtrack"] = b_s / e_s if e_s else None
    if name in TENSAT_PUBLISHED:
        row["tensat_published_seconds"] = TENSAT_PUBLISHED[name]
        row["eqsat_vs_tensat_published"] = e_s / TENSAT_PUBLISHED[name]
    return row


def summary(rows: list[dict]) -> dict:
    published = [r for r in rows if "tensat_published_seconds" in r]
    out = {
        "eqsat_never_costlier": all(r["eqsat"]["cost_after"] <= r["backtrack"]["cost_after"] * (1 + 1e-9) for r in rows),
        "eqsat_costlier_on": {r["model"]: r["eqsat_cost_vs_backtrack"] for r in rows
                              if r["eqsat"]["cost_after"] > r["backtrack"]["cost_after"] * (1 + 1e-9)},
        "eqsat_speedup_vs_backtrack": {r["model"]: r["eqsat_speedup_vs_backtrack"] for r in rows},
    }
    if published:
        out.update({
            "median_eqsat_seconds_tensat_models": statistics.median(r["eqsat"]["seconds"]["median"] for r in published),
            "median_tensat_published_seconds": statistics.median(TENSAT_PUBLISHED[r["model"]] for r in published),
            "median_ratio_to_tensat_published": statistics.median(r["eqsat_vs_tensat_published"] for r in published),
        })
    return out


def markdown(result: dict) -> str:
    """The table of a run: per model each search's median seconds (quartiles), TENSAT's published
    seconds (other hardware), both costs (analytic, microseconds: estimates), the sweeps, and the
    regions eqsat reused of all it searched."""
    def seconds(r):
        s = r["seconds"]
        return f"{s['median']:.2f} ({s['q1']:.2f}–{s['q3']:.2f})"

    lines = ["| model | eqsat s | backtracking s | TENSAT s (published) | eqsat cost | backtracking cost | "
             "sweeps (eqsat, backtracking) | regions reused (eqsat) |", "|---|---|---|---|---|---|---|---|"]
    for row in result["models"]:
        e, b = row["eqsat"], row["backtrack"]
        tensat = f"{row['tensat_published_seconds']:g}" if "tensat_published_seconds" in row else "—"
        lines.append(f"| {row['model']} | {seconds(e)} | {seconds(b)} | {tensat} | {e['cost_after']:.2f} | "
                     f"{b['cost_after']:.2f} | {e['search']['sweeps']}, {b['search']['sweeps']} | "
                     f"{e['regions_reused']} of {sum(e['regions_stopped'].values())} |")
    return "\n".join(lines)


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--quick", action="store_true", help="tiny model sizes (default: full sizes)")
    parser.add_argument("--time-limit", type=float, default=120.0, help="seconds per model and search")
    parser.add_argument("--repeats", type=int, default=3, help="runs of each search per model (median quoted)")
    parser.add_argument("--target", default="cuda")
    parser.add_argument("--only", nargs="*", help="model names (default all eight)")
    parser.add_argument("-j", "--workers", type=int, help="processes searching regions (default: as optimize, the cores)")
    parser.add_argument("-o", "--output", help="default: results/search_compare_{quick,full}.json")
    args = parser.parse_args(argv)
    logging.basicConfig(level=logging.WARNING)
    from tqdm import tqdm

    sizes = "quick" if args.quick else "full"
    output = args.output or str(RESULTS / f"search_compare_{sizes}.json")
    names = chosen_models(parser, args.only)
    rows = []
    for name in tqdm(names, desc="search_compare", unit="model"):
        row = compare(name, args.quick, args.time_limit, args.target, args.repeats, args.workers)
        rows.append(row)
        b, e = row["backtrack"], row["eqsat"]
        cut = " (cut short by --time-limit)" if b["cut_short"] or e["cut_short"] else ""
        tensat = f" | TENSAT published {row['tensat_published_seconds']:4.1f} s" if "tensat_published_seconds" in row else ""
        tqdm.write(f"{name:14s} backtrack {b['seconds']['median']:7.2f} s {b['cost_after']:10.4f} us | "
                   f"eqsat {e['seconds']['median']:7.2f} s {e['cost_after']:10.4f} us "
                   f"({e['search']['eqsat']['egraph_nodes']} e-nodes max){tensat}{cut}")
    result = {"sizes": sizes, "target": args.target, "cost_model": "analytic", "time_limit": args.time_limit,
              "repeats": args.repeats, "workers": args.workers or default_workers(),
              "note": "search seconds: medians of the repeats on this 2-core machine; TENSAT's are as published, "
                      "on other hardware", "models": rows, "summary": summary(rows)}
    write_result(output, result)
    return 0


if __name__ == "__main__":
    sys.exit(main())
