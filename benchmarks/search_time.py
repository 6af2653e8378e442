"""Search-time benchmark: how long ``tvm_taso.optimize`` takes on a 12-layer BERT-base-shaped
and a ResNet-50-shaped Relax module (TASO needed 13.6 s on BERT; the aim is lower).

    python -m benchmarks.search_time [--models bert resnet50] [--target cuda|llvm]
        [--budget N] [--time-limit S] [--region-size N] [--quick] [--check] [--json OUT]

For each model it times building the module, then the search, and prints a markdown table
(to stdout) with the search seconds, the number of ops (bindings of the dataflow block) before
and after, regions searched, graphs expanded, candidates priced, the cost model's estimate
before and after and their ratio, and the rules applied. ``--quick`` uses tiny sizes (seconds
in all; what a test runs). ``--check`` also compiles the original and the optimized module for
llvm, runs both on the same random input and reports the max relative error (must be <= 1e-4;
the exit status is 1 otherwise). Diagnostics go through ``logging`` (``-v`` for more).
"""

from __future__ import annotations

import argparse
import json
import logging
import sys
import time
import warnings

import numpy as np
from tvm import relax

import tvm_taso
from tvm_taso import examples

from . import models

log = logging.getLogger("benchmarks.search_time")

MAX_REL_ERR = 1e-4
TARGETS = {"cuda": "cuda", "llvm": {"kind": "llvm", "num-cores": 2}}


def count_ops(mod) -> int:
    """Bindings in the dataflow blocks of ``main``."""
    body = mod["main"].body
    return sum(len(b.bindings) for b in body.blocks if isinstance(b, relax.DataflowBlock))


def rel_err(before: list[np.ndarray], after: list[np.ndarray]) -> float:
    if len(before) != len(after):
        return float("inf")
    err = 0.0
    for a, b in zip(before, after):
        if a.shape != b.shape:
            return float("inf")
        err = max(err, float(np.abs(a - b).max() / (np.abs(a).max() + 1e-30)))
    return err


def check(mod, new, seed: int = 1) -> float:
    """Max relative error between ``mod`` and ``new`` compiled for llvm on one random input."""
    inputs = examples.random_inputs(mod, seed=seed)
    return rel_err(examples.run(mod, inputs, target="llvm"), examples.run(new, inputs, target="llvm"))


def bench_model(name: str, target: str, quick: bool, budget, time_limit, region_size, do_check: bool) -> dict:
    kwargs = dict(models.QUICK_SIZES[name]) if quick else {}
    t0 = time.perf_counter()
    mod = models.MODELS[name](**kwargs)
    build_s = time.perf_counter() - t0
    ops_before = count_ops(mod)
    log.info("%s %s: built in %.2f s, %d ops", name, kwargs or "full size", build_s, ops_before)

    opts = {k: v for k, v in (("budget", budget), ("time_limit", time_limit), ("region_size", region_size)) if v is not None}
    t1 = time.perf_counter()
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always", tvm_taso.TasoSkippedWarning)
        new, report = tvm_taso.optimize(mod, target=TARGETS.get(target, target), **opts)
    optimize_s = time.perf_counter() - t1
    for w in caught:
        log.warning("%s: %s", name, w.message)
    row = {
        "model": name,
        "size": "quick" if quick else "full",
        "sizes": kwargs,
        "target": target,
        "build_seconds": build_s,
        "search_seconds": report["search_seconds"],
        "optimize_seconds": optimize_s,
        "ops_before": ops_before,
        "ops_after": count_ops(new),
        "regions": report["regions"],
        "regions_cut_short": report["regions_cut_short"],
        "expanded": report["expanded"],
        "candidates": report["candidates"],
        "cost_before_us": report["cost_before"],
        "cost_after_us": report["cost_after"],
        "cost_ratio": (report["cost_after"] / report["cost_before"]) if report["cost_before"] else 1.0,
        "speedup_estimate": report["speedup_estimate"],
        "applied": report["applied"],
        "constants_folded": report["constants_folded"],
        "skipped": report["skipped"],
        "settings": report["settings"],
    }
    if do_check:
        if not quick:
            log.warning("%s: --check at full size compiles two untuned llvm modules; this can take minutes", name)
        t2 = time.perf_counter()
        err = check(mod, new)
        row["max_rel_err"] = err
        row["check_ok"] = bool(err <= MAX_REL_ERR)
        row["check_seconds"] = time.perf_counter() - t2
        (log.info if row["check_ok"] else log.error)("%s: max relative error %.3g", name, err)
    row["wall_seconds"] = time.perf_counter() - t0
    return row


def markdown(rows: list[dict]) -> str:
    cols = [
        "model", "size", "target", "build s", "search s", "ops before→after", "regions", "expanded",
        "candidates", "cost before (us)", "cost after (us)", "after/before", "max rel err", "applied",
    ]  # fmt: skip
    lines = ["| " + " | ".join(cols) + " |", "|" + "---|" * len(cols)]
    for r in rows:
        applied = ", ".join(f"{k} ×{v}" for k, v in r["applied"].items()) or "—"
        err = f"{r['max_rel_err']:.2e}" if "max_rel_err" in r else "—"
        cells = [
            r["model"], r["size"], r["target"], f"{r['build_seconds']:.2f}", f"{r['search_seconds']:.2f}",
            f"{r['ops_before']}→{r['ops_after']}", str(r["regions"]), str(r["expanded"]), str(r["candidates"]),
            f"{r['cost_before_us']:.1f}", f"{r['cost_after_us']:.1f}", f"{r['cost_ratio']:.3f}", err, applied,
        ]  # fmt: skip
        lines.append("| " + " | ".join(cells) + " |")
    return "\n".join(lines)


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(prog="python -m benchmarks.search_time", description=__doc__.split("\n\n")[0])
    ap.add_argument("--models", nargs="+", choices=sorted(models.MODELS), default=["bert", "resnet50"])
    ap.add_argument("--target", default="cuda", help="cuda or llvm (the analytic cost model's roofline); default cuda")
    ap.add_argument("--budget", type=int, default=None, help="graphs expanded per region (optimize's default if unset)")
    ap.add_argument("--time-limit", type=float, default=None, help="search wall-clock bound in seconds")
    ap.add_argument("--region-size", type=int, default=None, help="ops per search region")
    ap.add_argument("--quick", action="store_true", help="tiny sizes (2-layer BERT, hidden 64; ResNet at 32x32, width 8)")
    ap.add_argument("--check", action="store_true", help=f"compile both modules for llvm; relative error must be <= {MAX_REL_ERR:g}")
    ap.add_argument("--json", metavar="OUT", help="also write the rows as JSON to OUT")
    ap.add_argument("-v", "--verbose", action="store_true")
    args = ap.parse_args(argv)
    logging.basicConfig(level=logging.DEBUG if args.verbose else logging.INFO, format="%(levelname)s %(name)s: %(message)s")
    if not args.verbose:
        logging.getLogger("tvm_taso").setLevel(logging.WARNING)

    rows = [
        bench_model(m, args.target, args.quick, args.budget, args.time_limit, args.region_size, args.check)
        for m in args.models
    ]
    print(markdown(rows))
    if args.json:
        with open(args.json, "w") as f:
            json.dump({"rows": rows, "argv": sys.argv[1:] if argv is None else argv}, f, indent=2)
        log.info("wrote %s", args.json)
    return 0 if all(r.get("check_ok", True) for r in rows) else 1


if __name__ == "__main__":
    sys.exit(main())
