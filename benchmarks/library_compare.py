"""A rule library against the shipped one: does a regenerated library make a search's graphs cheaper?

The shipped library (``tvm_taso.default_rules()``) against the same plus the rules of ``--rules``
that it lacks (by their text; ``tvm-taso rules generate -o FILE`` writes such a file, its rules
taken as proved here, as the verifier found them), on the eight benchmark models at both sizes,
with one search (analytic cost for cuda, one process, bounded by the search's own limits).
Prints and writes each model's cost after both runs and their ratio (above 1: the bigger library is
costlier) and the seconds of each run (one run: noisy).

    tvm-taso rules generate --max-ops 3 -o /tmp/gen.rules
    python -m benchmarks.library_compare --rules /tmp/gen.rules -o benchmarks/results/library_compare.json
"""

from __future__ import annotations

import argparse
import sys
import time
import warnings
from pathlib import Path

import tvm_taso
from tvm_taso.io.onnx_import import import_relax
from tvm_taso.rewrite.rule import default_rules, parse_rules

from .cli import chosen_models, write_result
from .models import build

RESULTS = Path(__file__).parent / "results"


def _body(rule) -> str:
    return rule.text.split(":", 1)[1]  # a rule without its name and labels


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(prog="python -m benchmarks.library_compare", description=__doc__.split("\n\n")[0])
    ap.add_argument("--rules", type=Path, required=True, help="rule file whose new rules join the shipped library")
    ap.add_argument("--search", default="eqsat", choices=("eqsat", "backtrack"))
    ap.add_argument("--only", nargs="*", help="model names (default all eight)")
    ap.add_argument("-o", "--output", default=str(RESULTS / "library_compare.json"))
    args = ap.parse_args(argv)
    names = chosen_models(ap, args.only)
    shipped = default_rules()
    have = {_body(r) for r in shipped}
    extra = [r for r in parse_rules(args.rules.read_text(), str(args.rules)) if _body(r) not in have]
    for r in extra:
        r.proof = "proved"
    print(f"{len(extra)} rules the shipped library lacks: {', '.join(r.name for r in extra)}", flush=True)
    rows = []
    warnings.simplefilter("ignore")
    for quick in (True, False):
        for name in names:
            mod = import_relax(build(name, quick=quick))
            row: dict = {"model": name, "size": "quick" if quick else "full"}
            for label, rules in (("shipped", shipped), ("with_new_rules", shipped + extra)):
                t0 = time.perf_counter()
                _, report = tvm_taso.optimize(mod, target="cuda", cost_model="analytic", search=args.search,
                                              rules=rules, workers=1)
                row[label] = {"cost_before": report["cost_before"], "cost_after": report["cost_after"],
                              "seconds": time.perf_counter() - t0, "applied": report["applied"]}
            row["ratio"] = row["with_new_rules"]["cost_after"] / row["shipped"]["cost_after"]
            print(f"{name} {row['size']}: {row['shipped']['cost_after']:.3f} -> {row['with_new_rules']['cost_after']:.3f}"
                  f" ({row['ratio']:.5f}), {row['shipped']['seconds']:.1f} s / {row['with_new_rules']['seconds']:.1f} s",
                  flush=True)
            rows.append(row)
    costlier = {f"{r['model']} {r['size']}": r["ratio"] for r in rows if r["ratio"] > 1 + 1e-9}
    result = {"how": f"search={args.search}, analytic cost for cuda, workers=1, one run per library and model; "
                     "a cost-model estimate (the seconds are one run each, on this machine)",
              "new_rules": [r.text for r in extra], "rows": rows,
              "summary": {"new_rules": len(extra), "pairs": len(rows), "costlier_with_new_rules": costlier,
                          "cheaper_with_new_rules": {f"{r['model']} {r['size']}": r["ratio"] for r in rows
                                                     if r["ratio"] < 1 - 1e-9},
                          "never_costlier": not costlier}}
    write_result(args.output, result)
    return 0


if __name__ == "__main__":
    sys.exit(main())
