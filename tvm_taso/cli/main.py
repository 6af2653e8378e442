"""The ``tvm-taso`` command line: the parser, dispatch to the command groups, and errors as one
line each (exit status 1: ``--check`` failed, 2: bad input, 3: anything else, 130: interrupted
by SIGINT, 143: terminated by SIGTERM).

A user sees tvm-taso's own lines only: log records and Python warnings are printed as
``tvm-taso: warning: ...`` (no source lines), and tracebacks only with ``--verbose``.
"""

from __future__ import annotations

import argparse
import contextlib
import logging
import signal
import sys
import threading
import traceback
import warnings

from tvm_taso.output_check import CheckFailed
from tvm_taso.errors import InputError
from tvm_taso.files import OutputPathError
from tvm_taso.errors import TargetError

log = logging.getLogger("tvm_taso.cli")


class Terminated(BaseException):
    """SIGTERM, raised like :class:`KeyboardInterrupt` so that cleanup (temporary files) runs."""


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


class _Formatter(logging.Formatter):
    """``tvm-taso: warning: message``; the traceback of a logged exception only with ``--verbose``."""

    def __init__(self, verbose: bool):
        super().__init__()
        self.verbose = verbose

    def format(self, record: logging.LogRecord) -> str:
        text = f"tvm-taso: {record.levelname.lower()}: {record.getMessage()}"
        if self.verbose and record.exc_info:
            text += "\n" + self.formatException(record.exc_info)
        return text


def _log_warning(message, category, filename, lineno, file=None, line=None) -> None:
    """``warnings.showwarning`` for the CLI: the message through logging, without its source line."""
    own = getattr(category, "__module__", "").startswith("tvm_taso")
    log.warning("%s", message if own else f"{category.__name__}: {message}")


@contextlib.contextmanager
def _user_facing_output(verbose: bool):
    """Log records and warnings as one ``tvm-taso:`` line each, for the duration of a command."""
    handler = logging.StreamHandler(sys.stderr)
    handler.setFormatter(_Formatter(verbose))
    logging.basicConfig(level=logging.INFO if verbose else logging.WARNING, handlers=[handler])
    with warnings.catch_warnings():
        warnings.showwarning = _log_warning
        yield


@contextlib.contextmanager
def _signals_as_exceptions():
    """SIGTERM raises :class:`Terminated` (SIGINT raises KeyboardInterrupt, as by default) so
    that ``finally`` blocks remove temporary files; the previous handler is restored after."""
    if threading.current_thread() is not threading.main_thread():
        yield
        return

    def terminate(signum, frame):
        raise Terminated()

    previous = signal.signal(signal.SIGTERM, terminate)
    try:
        yield
    finally:
        signal.signal(signal.SIGTERM, previous)


def main(argv=None) -> int:
    args = build_parser().parse_args(argv)
    with _signals_as_exceptions(), _user_facing_output(args.verbose):
        try:
            return args.func(args)
        except (KeyboardInterrupt, Terminated) as err:
            if args.verbose:
                traceback.print_exc()
            sigint = isinstance(err, KeyboardInterrupt)
            print(f"tvm-taso: {'interrupted (SIGINT)' if sigint else 'terminated (SIGTERM)'}; "
                  "no partial or temporary file left", file=sys.stderr)
            return 130 if sigint else 143
        except (InputError, TargetError, OutputPathError, CheckFailed) as err:
            if args.verbose:
                raise
            print(f"tvm-taso: error: {err}", file=sys.stderr)
            return 1 if isinstance(err, CheckFailed) else 2
        except Exception as err:  # one clear line unless --verbose
            if args.verbose:
                raise
            print(f"tvm-taso: error: {type(err).__name__}: {err} (run with --verbose for details)", file=sys.stderr)
            return 3
