"""Fingerprints of ``optimize``'s results, to show that a refactoring changed no behaviour.

For each benchmark model (quick sizes) and each built-in example (the tutorials' models), for
``cuda`` and ``llvm`` under the analytic cost model, with each search (backtracking bounded by
its budget, equality saturation by its limits; neither by time), record the optimized module's structural hash, the rules applied and the estimated
costs. ``--write`` stores them as the reference; the default compares with the reference and
exits non-zero on any difference.

    python -m benchmarks.identity --write     # before a refactoring
    python -m benchmarks.identity             # after it: "identical" or the differences
"""

from __future__ import annotations

import argparse
import json
import sys
import warnings
from pathlib import Path

import tvm_ffi

import tvm_taso
from tvm_taso import examples
from tvm_taso.io.onnx_import import import_relax

from .models import MODELS, build

REFERENCE = Path(__file__).parent / "results" / "identity.json"
TARGETS = ("cuda", "llvm")
SEARCHES = ("backtrack", "eqsat")


def _modules():
    for name in MODELS:
        yield name, lambda name=name: import_relax(build(name, quick=True))
    for name, make in examples.EXAMPLES.items():
        yield f"example:{name}", make


def fingerprints(only: list[str] | None = None) -> dict:
    result = {}
    for name, make in _modules():
        if only and name not in only:
            continue
        mod = make()
        for target, search in ((t, s) for s in SEARCHES for t in TARGETS):
            with warnings.catch_warnings():
                warnings.simplefilter("ignore")
                new, report = tvm_taso.optimize(
                    mod, target=target, cost_model="analytic", budget=100, time_limit=1e9, search=search
                )
            key = f"{name}/{target}" + ("" if search == "backtrack" else f"/{search}")
            result[key] = {
                "structural_hash": int(tvm_ffi.structural_hash(new)),
                "applied": dict(sorted(report["applied"].items())),
                "cost_before": round(report["cost_before"], 6),
                "cost_after": round(report["cost_after"], 6),
            }
            print(f"{key:32s} {result[key]['cost_before']:12.3f} -> {result[key]['cost_after']:12.3f}", flush=True)
    return result


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--write", action="store_true", help="store the fingerprints as the reference")
    parser.add_argument("--only", nargs="*", help="model names (default all)")
    args = parser.parse_args(argv)
    found = fingerprints(args.only)
    if args.write:
        REFERENCE.parent.mkdir(parents=True, exist_ok=True)
        REFERENCE.write_text(json.dumps(found, indent=1, sort_keys=True) + "\n")
        print(f"wrote {REFERENCE} ({len(found)} results)")
        return 0
    reference = json.loads(REFERENCE.read_text())
    differ = [k for k in found if reference.get(k) != found[k]]
    for key in differ:
        print(f"DIFFERS {key}: reference {reference.get(key)} now {found[key]}")
    print("identical" if not differ else f"{len(differ)} of {len(found)} differ")
    return 1 if differ else 0


if __name__ == "__main__":
    sys.exit(main())
