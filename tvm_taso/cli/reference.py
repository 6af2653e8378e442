"""The command-line reference as Markdown, generated from the argument parser itself, so that the
page cannot drift from the options: ``python -m tvm_taso.cli.reference tutorials/cli.md``
(without a path: to stdout). Help is formatted 100 columns wide whatever the terminal."""

from __future__ import annotations

import argparse
import sys
from pathlib import Path

WIDTH = 100


def _commands(parser: argparse.ArgumentParser, path: tuple[str, ...] = ()):
    """``(command words, parser)`` for ``parser`` and every subcommand below it, depth first."""
    yield path, parser
    for action in parser._actions:  # argparse keeps subparsers only here
        if isinstance(action, argparse._SubParsersAction):
            for name, sub in action.choices.items():
                yield from _commands(sub, path + (name,))


def _help(parser: argparse.ArgumentParser) -> str:
    kind = parser.formatter_class
    parser.formatter_class = lambda prog: kind(prog, width=WIDTH)
    try:
        return parser.format_help().rstrip()
    finally:
        parser.formatter_class = kind


def render() -> str:
    from tvm_taso.cli.main import build_parser

    parser = build_parser()
    lines = ["# Command-line reference", "",
             "Generated from the argument parser (`python -m tvm_taso.cli.reference tutorials/cli.md`); "
             "`tvm-taso COMMAND --help` prints the same. Back to the [user guide](README.md).", ""]
    for words, sub in _commands(parser):
        lines += [f"## `{' '.join(('tvm-taso',) + words)}`", "", "```text", _help(sub), "```", ""]
    return "\n".join(lines)


def main(argv: list[str] | None = None) -> int:
    args = sys.argv[1:] if argv is None else argv
    text = render()
    if args:
        Path(args[0]).write_text(text)
    else:
        sys.stdout.write(text)
    return 0


if __name__ == "__main__":
    sys.exit(main())
