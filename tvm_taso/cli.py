"""The ``tvm-taso`` command line."""

from __future__ import annotations

import argparse
import json
import logging
import sys
import time
from collections import Counter

from tvm_taso.onnx_import import InputError


class CheckFailed(RuntimeError):
    """--check found different outputs."""


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
    print(f"model            {args.model} ({len(mod['main'].body.blocks[0].bindings)} bindings), "
          f"priced for {args.target}")
    _print_summary(report)
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


def _step(msg: str) -> None:
    print(f"tvm-taso: {msg}", file=sys.stderr, flush=True)


def _shapes(args) -> dict:
    from tvm_taso.onnx_import import parse_shape

    return dict(parse_shape(s) for s in args.shape or [])


def _cost_model(name: str, target=None):
    if name in ("auto", "analytic", "measure"):
        return name
    from tvm_taso.learned import LearnedCost

    model = LearnedCost.load_for(target)
    if model is None:
        raise InputError(f"--cost learned: no model trained for {target}; run `tvm-taso cost train` first")
    return model


def _write_atomically(path: str, write) -> None:
    """Call ``write(tmp_path)`` and move the result to ``path``; never leaves a partial file."""
    import os
    import tempfile

    directory = os.path.dirname(os.path.abspath(path))
    fd, tmp = tempfile.mkstemp(prefix=".tvm-taso-", suffix=os.path.splitext(path)[1], dir=directory)
    os.close(fd)
    try:
        write(tmp)
        os.replace(tmp, path)
    finally:
        if os.path.exists(tmp):
            os.unlink(tmp)


def cmd_optimize(args) -> int:
    import tvm_taso
    from tvm_taso import checking
    from tvm_taso.onnx_import import load_onnx, read_model

    proto, name = read_model(args.input)
    _step(f"importing {name}")
    mod = load_onnx(proto, shapes=_shapes(args), name=name)
    rules = tvm_taso.default_rules() if args.rules is None else tvm_taso.load_rules(args.rules)
    _step(f"searching ({len(rules)} rules, time limit {args.time_limit:g} s)")
    new, report = tvm_taso.optimize(
        mod,
        target=args.target,
        rules=rules,
        cost_model=_cost_model(args.cost, args.target),
        alpha=args.alpha,
        budget=args.budget,
        time_limit=args.time_limit,
        progress=True,
        guard=args.guard,
    )
    from tvm_taso.onnx_export import export_onnx

    _step("exporting")
    out_proto = export_onnx(new, None)
    if args.check:
        _step("checking outputs on random inputs")
        result = checking.compare_onnx(proto, out_proto, mod)
        report["check"] = result
        if not result["ok"]:
            raise CheckFailed(
                f"--check: optimized model differs from the original (max relative error "
                f"{result['max_relative_error']:.3g} > {result['tolerance']:g}); nothing written"
            )
    import onnx

    _write_atomically(args.output, lambda tmp: onnx.save(out_proto, tmp))
    _print_summary(report)
    if args.check:
        print(f"check            max relative error {report['check']['max_relative_error']:.2e} "
              f"via {report['check']['runtime']} (ok)")
    print(f"written          {args.output}")
    _write_reports(args, report, mod, new)
    return 0


def _print_summary(report: dict) -> None:
    print(f"estimated cost   {report['cost_before']:.2f} us -> {report['cost_after']:.2f} us "
          f"({report['speedup_estimate']:.2f}x, {report['cost_model']['name']})")
    print(f"search           {report['search_seconds']:.3f} s, {report['expanded']} graphs expanded, "
          f"{report['candidates']} candidates, {report['regions']} regions")
    print("rules applied    " + (", ".join(f"{k} x{v}" for k, v in report["applied"].items()) or "none"))
    for s in report["skipped"]:
        print(f"left as is       {s['what']} (x{s['count']})")
    guard = report.get("guard")
    if guard and guard.get("measured"):
        print(f"guard            {guard['ratio']:.3f}x measured through TVM "
              f"({'kept' if guard['kept'] else 'not faster: original kept'})")
    elif guard:
        print(f"guard            not measured ({guard['reason']})")


def _write_reports(args, report: dict, before, after) -> None:
    if getattr(args, "report", None):
        _write_atomically(args.report, lambda tmp: open(tmp, "w").write(json.dumps(report, indent=2)))
        print(f"report           {args.report}")
    if getattr(args, "html", None):
        from tvm_taso.html_report import render

        _write_atomically(args.html, lambda tmp: open(tmp, "w").write(render(report)))
        print(f"html report      {args.html}")


def cmd_compile(args) -> int:
    import tvm
    from tvm import relax

    import tvm_taso  # noqa: F401 - registers the "taso" pipeline
    from tvm_taso.onnx_import import load_onnx

    mod = load_onnx(args.input, shapes=_shapes(args))
    pipeline = "default" if args.no_taso else relax.get_pipeline("taso")
    _step(f"compiling for {args.target}" + ("" if args.no_taso else " with TasoOptimize"))
    ex = tvm.compile(mod, target=tvm.target.Target(args.target), relax_pipeline=pipeline)
    _write_atomically(args.output, ex.export_library)
    print(f"written          {args.output}")
    return 0


def cmd_bench(args) -> int:
    from tvm_taso import checking
    from tvm_taso.onnx_import import load_onnx

    mod = load_onnx(args.input, shapes=_shapes(args))
    inputs = checking.inputs_for(mod, dict(_input_file(s) for s in args.input_file or []))
    _step(f"compiling and timing on {args.target} (with and without TasoOptimize)")
    result = checking.bench(mod, inputs, args.target, repeat=args.repeat, time_limit=args.time_limit)
    print(f"{'pipeline':24s} {'median ms':>10s} {'min ms':>10s}")
    for key in ("default", "taso"):
        r = result[key]
        print(f"{r['label']:24s} {r['median_ms']:10.3f} {r['min_ms']:10.3f}")
    low, high = result["speedup_quartiles"]
    print(f"speedup (default / taso) {result['speedup']:.3f}x (median of {args.repeat} pairwise ratios, "
          f"quartiles {low:.3f}-{high:.3f})")
    if args.json:
        _write_atomically(args.json, lambda tmp: open(tmp, "w").write(json.dumps(result, indent=2)))
    return 0


def _input_file(text: str):
    import numpy as np

    name, sep, path = text.partition("=")
    if not sep:
        raise InputError(f"--input {text!r}: expected NAME=FILE.npy")
    try:
        return name, np.load(path)
    except (OSError, ValueError) as err:
        raise InputError(f"--input {text!r}: cannot read {path}: {err}") from None


def rule_family(name: str) -> str:
    """``gen-merge-conv-12-rev`` -> ``merge-conv``; ``merge-matmul-shared-lhs`` -> ``merge``."""
    import re

    if name.startswith("gen-"):
        return re.sub(r"(-\d+)?(-rev)?$", "", name[4:])
    return name.split("-")[0]


def cmd_rules_list(args) -> int:
    import tvm_taso

    rules = tvm_taso.load_rules(args.file) if args.file else tvm_taso.default_rules(include_unverified=True)
    for r in rules:
        print(f"{r.name:40s} {r.provenance:9s} {r.proof:10s} {' + '.join(r.root_ops):30s} {r.where}")
    by = Counter((r.provenance, r.proof) for r in rules)
    families = Counter((r.provenance, rule_family(r.name)) for r in rules)
    print()
    print("by family: " + ", ".join(f"{fam} ({prov}) {n}" for (prov, fam), n in sorted(families.items())))
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

    def model_args(sp):
        sp.add_argument("input", help="the ONNX model")
        sp.add_argument("--target", type=_target, default="llvm", help="llvm, cuda, or a JSON target (default llvm)")
        sp.add_argument("--shape", action="append", metavar="NAME=1x3x224x224",
                        help="static shape for an input with dynamic dimensions (repeatable)")

    opt = sub.add_parser("optimize", help="optimize an ONNX model and write the optimized ONNX model",
                         description="Import IN.onnx through TVM, rewrite its graph with TASO substitutions "
                         "chosen by cost for --target, and export the result as ONNX.")
    model_args(opt)
    opt.add_argument("-o", "--output", required=True, help="where to write the optimized ONNX model")
    opt.add_argument("--cost", default="auto", choices=["auto", "analytic", "measure", "learned"],
                     help="cost model: analytic (roofline), measure (build and time kernels on the target), "
                     "learned (XGBoost trained with `tvm-taso cost train`), auto (default: measure on a local "
                     "GPU, else learned if trained, else analytic)")
    opt.add_argument("--rules", help="a rule file to use instead of the shipped library")
    opt.add_argument("--alpha", type=float, default=1.05, help="search relaxation (default 1.05)")
    opt.add_argument("--budget", type=int, default=200, help="graphs expanded per region (default 200)")
    opt.add_argument("--time-limit", type=float, default=60.0, help="seconds for the search (default 60)")
    opt.add_argument("--check", action="store_true",
                     help="run original and optimized models on random inputs; fail on any mismatch")
    opt.add_argument("--guard", action="store_true",
                     help="time the rewritten model against the original through TVM on --target (this "
                     "machine's device) and keep it only if measured faster")
    opt.add_argument("--report", metavar="REPORT.json", help="write the search report as JSON")
    opt.add_argument("--html", metavar="REPORT.html", help="write a report to open in a browser")
    opt.set_defaults(func=cmd_optimize)

    comp = sub.add_parser("compile", help="compile an ONNX model with TVM (TasoOptimize in the pipeline)")
    model_args(comp)
    comp.add_argument("-o", "--output", required=True, help="the shared library to write (OUT.so)")
    comp.add_argument("--no-taso", action="store_true", help="compile without TasoOptimize")
    comp.set_defaults(func=cmd_compile)

    bench = sub.add_parser("bench", help="latency with and without TasoOptimize, side by side")
    model_args(bench)
    bench.add_argument("--repeat", type=int, default=10, help="timed repeats (default 10)")
    bench.add_argument("--time-limit", type=float, default=60.0, help="seconds for the search (default 60)")
    bench.add_argument("--input-file", action="append", metavar="NAME=FILE.npy",
                       help="use this array for an input instead of random data (repeatable)")
    bench.add_argument("--json", help="write the measurements as JSON")
    bench.set_defaults(func=cmd_bench)

    rules = sub.add_parser("rules", help="inspect rule files")
    rsub = rules.add_subparsers(dest="rules_command", required=True)
    ls = rsub.add_parser("list", help="list rules with provenance and proof status")
    ls.add_argument("file", nargs="?", help="a rule file (default: the shipped library)")
    ls.set_defaults(func=cmd_rules_list)

    from tvm_taso.generate import add_generate_command
    from tvm_taso.learned import add_cost_train_command
    from tvm_taso.measure import add_cost_show_command
    from tvm_taso.verify import add_verify_command

    add_generate_command(rsub)
    add_verify_command(rsub)
    add_cost_show_command(sub)
    add_cost_train_command(sub)
    return p


def main(argv=None) -> int:
    args = build_parser().parse_args(argv)
    logging.basicConfig(level=logging.INFO if args.verbose else logging.WARNING, format="%(levelname)s %(message)s")
    try:
        return args.func(args)
    except (InputError, CheckFailed) as err:
        if args.verbose:
            raise
        print(f"tvm-taso: error: {err}", file=sys.stderr)
        return 1 if isinstance(err, CheckFailed) else 2
    except Exception as err:  # noqa: BLE001 - one clear line unless --verbose
        if args.verbose:
            raise
        print(f"tvm-taso: error: {type(err).__name__}: {err} (run with --verbose for details)", file=sys.stderr)
        return 3


if __name__ == "__main__":
    sys.exit(main())
