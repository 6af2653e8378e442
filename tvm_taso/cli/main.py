"""The ``tvm-taso`` command line: the parser, dispatch to the command groups, and errors as one
line each (exit status 1: ``--check`` failed, 2: bad input, 3: anything else)."""

from __future__ import annotations

import argparse
import logging
import sys

from tvm_taso.cli.checking import CheckFailed
from tvm_taso.io.onnx_import import InputError
from tvm_taso.target import TargetError


def build_parser() -> argparse.ArgumentParser:
    from tvm_taso.cli.cost import add_cost_command
    from tvm_taso.cli.model_commands import add_model_commands
    from tvm_taso.cli.rules import add_rules_commands

    p = argparse.ArgumentParser(
        prog="tvm-taso",
        description="TASO's graph substitutions for Apache TVM: rewrite a model's graph with "
        "verified rules chosen by a cost-based search.",
    )
    p.add_argument("-v", "--verbose", action="store_true", help="log what the search does; show tracebacks")
    sub = p.add_subparsers(dest="command", required=True)
    add_model_commands(sub)
    add_rules_commands(sub)
    add_cost_command(sub)
    return p


def main(argv=None) -> int:
    args = build_parser().parse_args(argv)
    logging.basicConfig(level=logging.INFO if args.verbose else logging.WARNING, format="%(levelname)s %(message)s")
    try:
        return args.func(args)
    except (InputError, TargetError, CheckFailed) as err:
        if args.verbose:
            raise
        print(f"tvm-taso: error: {err}", file=sys.stderr)
        return 1 if isinstance(err, CheckFailed) else 2
    except Exception as err:  # noqa: BLE001 - one clear line unless --verbose
        if args.verbose:
            raise
        print(f"tvm-taso: error: {type(err).__name__}: {err} (run with --verbose for details)", file=sys.stderr)
        return 3
