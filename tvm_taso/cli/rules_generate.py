"""``tvm-taso rules generate``: run the rule generator (:mod:`tvm_taso.generate`) and write the
rule file."""

from __future__ import annotations

import argparse
import sys
from pathlib import Path

from tvm_taso.files import check_output_path, write_text_atomically
from tvm_taso.generate.driver import GenConfig, generate
from tvm_taso.generate.output import render
from tvm_taso.generate.search_space import ALL_GROUPS


def add_generate_command(subparsers) -> argparse.ArgumentParser:
    """Add ``generate`` to the ``tvm-taso rules`` subcommands."""
    p = subparsers.add_parser(
        "generate",
        help="generate rules by enumerating small graphs (TASO's generator)",
        description="Enumerate graphs of up to --max-ops operators, pair those with equal integer "
        "fingerprints, confirm on float data, prune (renamings, common sub/supergraphs, implied "
        "rules) and write the rules, each checked by the rule engine.",
    )
    p.add_argument("--max-ops", type=int, default=3, choices=[1, 2, 3, 4], help="operators per graph (default 3)")
    p.add_argument("--ops", default=",".join(ALL_GROUPS),
                   help=f"comma-separated operator groups (default all: {','.join(ALL_GROUPS)})")
    p.add_argument("--time-limit", type=float, default=600.0, help="seconds; stops with what it has (default 600)")
    p.add_argument("--workers", type=int, default=2, help="processes (default 2)")
    p.add_argument("--seed", type=int, default=0, help="seed of the fingerprint and test data (default 0)")
    p.add_argument("--no-implied", action="store_true", help="keep rules implied by smaller ones")
    p.add_argument("--implied-by", action="append", metavar="FILE", default=[],
                   help="also drop rules that this rule file implies (e.g. rules/core.rules); repeatable")
    p.add_argument("--one-direction", action="store_true",
                   help="one rule per pair, from the smaller graph to the larger (as TASO loads them); "
                   "default: both directions")
    p.add_argument("-o", "--output", help="rule file to write (default: standard output)")
    p.set_defaults(func=cmd_generate)
    return p


def cmd_generate(args) -> int:
    if args.output:
        check_output_path(args.output, "-o")
    groups = tuple(g.strip() for g in args.ops.split(",") if g.strip())
    unknown = [g for g in groups if g not in ALL_GROUPS]
    if unknown:
        print(f"tvm-taso: error: unknown --ops {', '.join(unknown)} (known: {', '.join(ALL_GROUPS)})", file=sys.stderr)
        return 2
    cfg = GenConfig(max_ops=args.max_ops, groups=groups, seed=args.seed, time_limit=args.time_limit,
                    workers=max(1, args.workers), implied=not args.no_implied,
                    both_directions=not args.one_direction,
                    implied_by=tuple(Path(f).read_text() for f in args.implied_by))
    result = generate(cfg)
    text = render(result)
    if args.output:
        write_text_atomically(args.output, text)
    else:
        sys.stdout.write(text)
    for k, v in result.stats.items():
        print(f"{k:48s} {v}", file=sys.stderr)
    print(f"{'families':48s} " + ", ".join(f"{k} {v}" for k, v in result.families.items()), file=sys.stderr)
    print(f"{'seconds':48s} {result.seconds:.1f}" + (" (stopped at the time limit)" if result.truncated else ""),
          file=sys.stderr)
    if args.output:
        print(f"written {args.output} ({len(result.rules)} rules)", file=sys.stderr)
    return 0
