"""Writing the verifier's verdicts back into rule files."""

from __future__ import annotations

import importlib.resources
import os
import re
from pathlib import Path

from tvm_taso.files import write_atomically
from tvm_taso.verify.prover import VerifyResult


def write_proofs(path: str | Path, results: list[VerifyResult]) -> int:
    """Set ``[PROVENANCE, proved]`` in the file's header of every rule proved here (found by the
    ``file:line`` of its result); every other byte stays as it was. Written atomically; returns
    the number of headers changed."""
    path = Path(path)
    text = path.read_bytes().decode("utf-8")
    starts = [0]
    for line in text.splitlines(keepends=True):
        starts.append(starts[-1] + len(line))
    edits = []
    for res in results:
        if res.status != "proved" or res.proof == "proved":
            continue
        line = int(res.where.rsplit(":", 1)[1])
        header = re.compile(r"(" + re.escape(res.name) + r"\s*\[\s*(?:hand|generated)\s*,\s*)(\w+)(\s*\])")
        m = header.match(text, starts[line - 1])
        if not m:
            raise ValueError(f"{res.where}: cannot find the header of rule {res.name!r}")
        edits.append((m.start(2), m.end(2)))
    if not edits:
        return 0
    for a, b in sorted(edits, reverse=True):
        text = text[:a] + "proved" + text[b:]
    mode = path.stat().st_mode & 0o7777

    def write(tmp: str) -> None:
        Path(tmp).write_bytes(text.encode("utf-8"))
        os.chmod(tmp, mode)  # the rule file keeps its permissions

    write_atomically(path, write)
    return len(edits)


def shipped_path(where: str) -> Path:
    """The file behind a shipped rule's ``rules/NAME.rules:LINE``."""
    name = where.rsplit(":", 1)[0].split("/")[-1]
    return Path(str(importlib.resources.files("tvm_taso.rules") / name))

