"""What the benchmark commands share: the models an ``--only`` list names, and writing a result."""

from __future__ import annotations

import argparse
import json

from tvm_taso.files import write_text_atomically

from .models import MODELS


def chosen_models(parser: argparse.ArgumentParser, only: list[str] | None) -> list[str]:
    """The benchmark models ``--only`` names, in the suite's order (all of them without it); an
    unknown name is a usage error."""
    unknown = sorted(set(only or ()) - set(MODELS))
    if unknown:
        parser.error(f"unknown model(s) {', '.join(unknown)}; choose from {', '.join(MODELS)}")
    return [n for n in MODELS if not only or n in only]


def write_result(output: str, result: dict) -> None:
    """Write ``result`` as JSON (atomically), print its summary and where it went."""
    write_text_atomically(output, json.dumps(result, indent=1) + "\n")
    print(json.dumps(result["summary"], indent=1))
    print(f"wrote {output}")
