"""The documentation pages hold together: every relative link names a file that exists and, with
``#anchor``, a heading of that page (GitHub's anchors: lower case, punctuation dropped, spaces as
hyphens); the README stays one screen's worth of sections; the results tables on the pages are
what their benchmarks render from their files in ``benchmarks/results/``."""

from __future__ import annotations

import re
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parent.parent
PAGES = [ROOT / "README.md", *sorted(ROOT.glob("*/README.md")), *sorted(ROOT.glob("tutorials/*.md"))]
LINK = re.compile(r"\]\(([^)\s]+)\)")


def _anchors(page: Path) -> set[str]:
    text, anchors, fenced = page.read_text(), set(), False
    for line in text.splitlines():
        if line.startswith("```"):
            fenced = not fenced
        elif not fenced and line.startswith("#"):
            title = line.lstrip("#").strip().lower()
            anchors.add(re.sub(r"[^\w\- ]", "", title).replace(" ", "-"))
    return anchors


def _broken(page: Path, root: Path = ROOT) -> list[str]:
    """The links of ``page`` that name no file, or no heading of the page they name."""
    broken = []
    for target in LINK.findall(page.read_text()):
        if re.match(r"[a-z]+:", target):  # https:, mailto:
            continue
        path, _, anchor = target.partition("#")
        linked = (page.parent / path).resolve() if path else page
        if not linked.exists():
            broken.append(f"{page.relative_to(root)}: {target} (no such file)")
        elif anchor and linked.suffix == ".md" and anchor not in _anchors(linked):
            broken.append(f"{page.relative_to(root)}: {target} (no such heading)")
    return broken


def test_every_relative_link_and_anchor_resolves():
    assert len(PAGES) >= 6
    broken = [b for page in PAGES for b in _broken(page)]
    assert not broken, "\n".join(broken)


def test_a_broken_link_is_found(tmp_path):
    page = tmp_path / "README.md"
    (tmp_path / "other.md").write_text("# Other\n\n## A section, with (punctuation)\n\n```\n# not a heading\n```\n")
    page.write_text("# x\n\n## Here\n\n[ok](other.md#a-section-with-punctuation) [ok](#here) [ok](https://x.org/a#b)\n"
                    "[bad](other.md#nothing) [bad](gone.md) [bad](other.md#not-a-heading)\n")
    assert _broken(page, tmp_path) == ["README.md: other.md#nothing (no such heading)", "README.md: gone.md (no such file)",
                             "README.md: other.md#not-a-heading (no such heading)"]


def test_the_readme_is_one_screen_of_sections():
    lines = (ROOT / "README.md").read_text().splitlines()
    assert len(lines) <= 200, len(lines)
    assert lines[0] == "# tvm-taso" and "pip install" in lines[3] and "pytest" in lines[4]


def _rows_or_result(data):
    return data["rows"] if isinstance(data, dict) and "rows" in data and "summary" in data else data


# (benchmark module, its renderer, results file, page): the page holds the table the file renders
TABLES = [
    ("dynamic", "markdown", "dynamic.json", "tvm_taso/README.md"),
    ("memory", "table", "memory.json", "tvm_taso/README.md"),
    ("torch_paths", "markdown", "torch_paths.json", "benchmarks/README.md"),
    ("ort_runtime", "markdown", "ort_runtime.json", "tvm_taso/README.md"),
    ("learned_accuracy", "table", "learned_accuracy.json", "tvm_taso/README.md"),
    ("search_ab", "markdown", "eqsat_speed.json", "tvm_taso/README.md"),
    ("search_ab", "markdown", "backtrack_lookahead.json", "tvm_taso/README.md"),
    ("search_compare", "markdown", "search_compare_full.json", "tvm_taso/README.md"),
    ("tuned", "table", "tuned.json", "benchmarks/README.md"),
    ("tuned", "table", "tuned_bert.json", "benchmarks/README.md"),
    ("tuned", "table", "tuned_bert_gpu_rewrites.json", "benchmarks/README.md"),
    ("tuned", "table", "tuned_blas_resnet50.json", "benchmarks/README.md"),
    ("tuned", "table", "tuned_blas_bert.json", "benchmarks/README.md"),
    ("tuned", "table", "tuned_blas_bert_first.json", "benchmarks/README.md"),
    ("tuned", "table", "tuned_blas_bert_gpu_rewrites.json", "benchmarks/README.md"),
    ("tuned", "table", "tuned_blas_resnext50_gpu_rewrites.json", "benchmarks/README.md"),
    ("torch_tuned", "table", "torch_tuned_blas.json", "benchmarks/README.md"),
    ("kernel_profile", "table", "kernel_profile.json", "benchmarks/README.md"),
    ("default_schedules", "table", "default_schedules.json", "benchmarks/README.md"),
    ("default_schedules", "table", "default_schedules_cnns.json", "benchmarks/README.md"),
    ("default_schedules", "table", "default_schedules_host_cpu.json", "benchmarks/README.md"),
]


@pytest.mark.parametrize("module, renderer, results, page", TABLES, ids=[t[2] for t in TABLES])
def test_the_results_tables_are_what_their_files_render(module, renderer, results, page):
    """A table on a page is its benchmark's rendering of its results file (regenerate it with the
    benchmark's renderer rather than editing the page)."""
    import importlib
    import json

    render = getattr(importlib.import_module(f"benchmarks.{module}"), renderer)
    data = json.loads((ROOT / "benchmarks" / "results" / results).read_text())
    table = "\n".join(line for line in render(_rows_or_result(data)).splitlines() if line.startswith("|"))
    assert table.count("\n") >= 2 and table in (ROOT / page).read_text(), f"{page} differs from what {results} renders"
