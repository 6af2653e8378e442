"""The ``tvm-taso`` command line."""

from __future__ import annotations

import argparse
import json
import logging
import sys
import time
from collections import Counter


def _target(text: str):
    """A target given as a name (``llvm``, ``cuda``) or as JSON (``{"kind": "llvm", ...}``)."""
    text = text.strip()
    return json.loads(text) if text.startswith("{") else text


def cmd_example(args) -> int:
    import numpy as np

    import tvm_taso
    from tvm_taso import examples

    mod = examples.EXAMPLES[args.model]()
    rules = tvm_taso.default_rules() if args.rules is None else tvm_taso.load_rules(args.rules)
    new, report = tvm_taso.optimize(
        mod,
        target=args.target,
        rules=rules,
        alpha=args.alpha,
        budget=args.budget,
        time_limit=args.time_limit,
        progress=True,
    )
    print(f"model            {args.model} ({len(mod['main'].body.blocks[0].bindings)} bindings)")
    print(f"cost model       {report['cost_model']['name']} for {args.target}")
    print(f"estimated cost   {report['cost_before']:.2f} us -> {report['cost_after']:.2f} us "
          f"({report['speedup_estimate']:.2f}x)")
    print(f"search           {report['search_seconds']:.3f} s, {report['expanded']} graphs expanded, "
          f"{report['candidates']} candidates")
    print("rules applied    " + (", ".join(f"{k} x{v}" for k, v in report["applied"].items()) or "none"))
    inputs = examples.random_inputs(mod)
    t0 = time.perf_counter()
    before = examples.run(mod, inputs)
    after = examples.run(new, inputs)
    err = max(float(np.abs(a - b).max() / (np.abs(a).max() + 1e-30)) for a, b in zip(before, after))
    report["check"] = {"max_relative_error": err, "seconds": time.perf_counter() - t0}
    ok = err <= 1e-4
    print(f"outputs on llvm  max relative error {err:.2e} ({'ok' if ok else 'MISMATCH'})")
    if args.show:
        print(new.script(show_meta=False))
    if args.json:
        with open(args.json, "w") as f:
            json.dump(report, f, indent=2)
        print(f"report           {args.json}")
    return 0 if ok else 1


def cmd_rules_list(args) -> int:
    import tvm_taso

    rules = tvm_taso.load_rules(args.file) if args.file else tvm_taso.default_rules(include_unverified=True)
    for r in rules:
        print(f"{r.name:40s} {r.provenance:9s} {r.proof:10s} {' + '.join(r.root_ops):30s} {r.where}")
    by = Counter((r.provenance, r.proof) for r in rules)
    print(f"{len(rules)} rules: " + ", ".join(f"{n} {p}/{s}" for (p, s), n in sorted(by.items())))
    return 0


def build_parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(
        prog="tvm-taso",
        description="TASO's graph substitutions for Apache TVM: rewrite a model's graph with "
        "verified rules chosen by a cost-based search.",
    )
    p.add_argument("-v", "--verbose", action="store_true", help="log what the search does; show tracebacks")
    sub = p.add_subparsers(dest="command", required=True)

    from tvm_taso.examples import EXAMPLES

    ex = sub.add_parser("example", help="optimize a built-in example model and check its outputs on llvm")
    ex.add_argument("model", nargs="?", default="inception", choices=sorted(EXAMPLES))
    ex.add_argument("--target", type=_target, default="cuda", help="target the cost model prices for (default cuda)")
    ex.add_argument("--rules", help="a rule file to use instead of the shipped library")
    ex.add_argument("--alpha", type=float, default=1.05, help="search relaxation (default 1.05)")
    ex.add_argument("--budget", type=int, default=200, help="graphs expanded per region (default 200)")
    ex.add_argument("--time-limit", type=float, default=60.0, help="seconds for the search (default 60)")
    ex.add_argument("--json", help="write the report as JSON to this file")
    ex.add_argument("--show", action="store_true", help="print the optimized Relax module")
    ex.set_defaults(func=cmd_example)

    rules = sub.add_parser("rules", help="inspect rule files")
    rsub = rules.add_subparsers(dest="rules_command", required=True)
    ls = rsub.add_parser("list", help="list rules with provenance and proof status")
    ls.add_argument("file", nargs="?", help="a rule file (default: the shipped library)")
    ls.set_defaults(func=cmd_rules_list)
    return p


def main(argv=None) -> int:
    args = build_parser().parse_args(argv)
    logging.basicConfig(level=logging.INFO if args.verbose else logging.WARNING, format="%(levelname)s %(message)s")
    try:
        return args.func(args)
    except Exception as err:  # noqa: BLE001 - one clear line unless --verbose
        if args.verbose:
            raise
        print(f"tvm-taso: error: {err}", file=sys.stderr)
        return 2


if __name__ == "__main__":
    sys.exit(main())
