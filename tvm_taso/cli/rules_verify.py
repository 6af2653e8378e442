"""``tvm-taso rules verify``: prove rules with the Z3 verifier, report, and mark them proved."""

from __future__ import annotations

import json
import os
import sys
import time
from collections import Counter
from dataclasses import asdict
from pathlib import Path

from tvm_taso.files import check_output_path, write_text_atomically
from tvm_taso.verify import axioms, prover, soundness, status


def add_verify_command(subparsers) -> None:
    """Add ``verify`` to the ``tvm-taso rules`` subcommands."""
    p = subparsers.add_parser(
        "verify",
        help="prove rules from the operator axioms with Z3 (pip install 'tvm-taso[verify]')",
        description="Prove each rule (source = target under TASO-style operator axioms, which are "
        "first checked numerically against the reference semantics) and report the result per rule.",
    )
    p.add_argument("file", nargs="?", help="a rule file (default: the shipped library, unverified rules included)")
    p.add_argument("--timeout", type=float, default=10.0, help="seconds per rule (default 10)")
    p.add_argument("--time-limit", type=float, default=None, help="seconds for the whole run (default: none)")
    p.add_argument("--jobs", type=int, default=0, help="parallel processes (default: CPU count)")
    p.add_argument("--write", action="store_true", help="mark proved rules [..., proved] in their rule files")
    p.add_argument("--json", metavar="OUT", help="write the results as JSON")
    p.set_defaults(func=cmd_rules_verify)


def cmd_rules_verify(args) -> int:
    if args.json:
        check_output_path(args.json, "--json")
    if not prover.z3_available():
        print(f"tvm-taso: error: the verifier needs z3: {prover.INSTALL_HINT}", file=sys.stderr)
        return 2
    import tvm_taso

    rules = tvm_taso.load_rules(args.file) if args.file else tvm_taso.default_rules(include_unverified=True)
    t0 = time.perf_counter()
    try:
        soundness.ensure_checked()
    except soundness.AxiomError as err:
        print(f"tvm-taso: error: {err}", file=sys.stderr)
        return 1
    t_check = time.perf_counter() - t0
    jobs = args.jobs or os.cpu_count() or 1
    results = prover.verify_rules(rules, args.timeout, progress=True, time_limit=args.time_limit, jobs=jobs, isolate=True)
    total = time.perf_counter() - t0
    width = max([len(r.name) for r in results] + [4])
    print(f"{'rule':{width}s} {'status':11s} {'seconds':>7s}  reason")
    for r in results:
        print(f"{r.name:{width}s} {r.status:11s} {r.seconds:7.2f}  {r.reason}")
    counts = Counter(r.status for r in results)
    print(
        f"{len(results)} rules: " + ", ".join(f"{counts.get(s, 0)} {s}" for s in prover.STATUSES)
        + f"; {len(axioms.AXIOMS)} axioms checked numerically in {t_check:.1f} s; total {total:.1f} s"
    )
    summary = {
        "rules": [asdict(r) for r in results],
        "counts": {s: counts.get(s, 0) for s in prover.STATUSES},
        "axioms": len(axioms.AXIOMS),
        "timeout": args.timeout,
        "seconds": total,
    }
    if args.json:
        write_text_atomically(args.json, json.dumps(summary, indent=2, allow_nan=False))
        print(f"report           {args.json}")
    if args.write:
        by_file: dict[Path, list] = {}
        for r in results:
            path = Path(r.where.rsplit(":", 1)[0]) if args.file else status.shipped_path(r.where)
            by_file.setdefault(path, []).append(r)
        for path, rs in by_file.items():
            n = status.write_proofs(path, rs)
            if n:
                print(f"written          {path}: {n} rule(s) marked proved")
    stale = [r.name for r in results if r.proof == "proved" and r.status != "proved"]
    if stale:
        print(f"warning: marked proved but not proved here: {', '.join(stale)}", file=sys.stderr)
    wrong = [r.name for r in results if r.reason.startswith("counterexample")]
    if wrong:
        print(f"error: counterexamples found for: {', '.join(wrong)}", file=sys.stderr)
    return 1 if wrong else 0
