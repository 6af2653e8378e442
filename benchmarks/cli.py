"""What the benchmark commands share: the models an ``--only`` list names, their dataflow blocks
as graphs, and writing a result."""

from __future__ import annotations

import argparse
import json
import logging
from collections import Counter

from tvm import relax

from tvm_taso.files import write_text_atomically
from tvm_taso.io.onnx_import import import_relax
from tvm_taso.ir.graph import Graph
from tvm_taso.ir.ops import OpError
from tvm_taso.ir.relax_bridge import BlockGraph

from .models import MODELS, build

log = logging.getLogger(__name__)


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


def print_markdown(text: str, path=None) -> None:
    """Print a result's markdown table, and write it to ``path`` (``--markdown``) when given."""
    print(text)
    if path:
        write_text_atomically(path, text)


def block_graphs(name: str, quick: bool) -> list[tuple[int, Graph]]:
    """(index, graph) of each dataflow block of the model's ``main`` that the optimizer reads; a
    block it leaves alone is left out here too, with a warning."""
    mod = import_relax(build(name, quick=quick))
    found = []
    blocks = [b for b in mod["main"].body.blocks if isinstance(b, relax.DataflowBlock)]
    for k, block in enumerate(blocks):
        try:
            found.append((k, BlockGraph(block, Counter()).graph))
        except OpError as err:
            log.warning("%s: block %d not read (%s)", name, k, err)
    return found
