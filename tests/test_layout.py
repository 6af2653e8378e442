"""The package's shape, checked: folders as layers with no upward import, and no function with
more than 7 positional parameters (options travel as keywords or one object)."""

from __future__ import annotations

import ast
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent

# lowest first; a unit imports only from its own layer or those below
LAYERS = [
    {"errors", "files", "numerics", "progress", "target", "examples", "ort"},
    {"ir", "runtime"},  # runtime reads parameter shapes, symbolic sizes included, as the engine does
    {"io"},
    {"rewrite"},
    {"verify", "generate"},
    {"cost"},
    {"search"},
    {"guard"},
    {"driver"},
    {"passes", "rules"},
    {"cli"},
]
RANK = {unit: k for k, layer in enumerate(LAYERS) for unit in layer}
MAX_POSITIONAL = 7
# the axiom statements are data: one function per axiom, its tensors as parameters
DATA_MODULES = {Path("tvm_taso/verify/axioms.py")}


def _sources():
    for folder in ("tvm_taso", "passes"):
        for path in sorted((ROOT / folder).rglob("*.py")):
            yield path.relative_to(ROOT), ast.parse(path.read_text(), str(path))


def _unit(path: Path) -> str | None:
    """The layer unit of a source file: its folder under tvm_taso, or its module name for a
    top-level module (the package's ``__init__`` is the public API over every layer: None)."""
    parts = path.parts
    if parts[0] == "passes":
        return "passes"
    if len(parts) == 2:
        return None if parts[1] == "__init__.py" else parts[1][:-3]
    return parts[1]


def _imported_units(tree: ast.AST):
    for node in ast.walk(tree):
        names = []
        if isinstance(node, ast.ImportFrom) and node.level == 0 and node.module:
            if node.module == "tvm_taso":
                names = [a.name for a in node.names]
            elif node.module.startswith("tvm_taso."):
                names = [node.module.split(".")[1]]
        elif isinstance(node, ast.Import):
            names = [a.name.split(".")[1] for a in node.names if a.name.startswith("tvm_taso.")]
        for name in names:
            yield name, node.lineno


def test_every_unit_has_a_layer():
    units = {_unit(path) for path, _ in _sources()} - {None}
    assert units <= set(RANK), sorted(units - set(RANK))


def test_no_module_imports_from_a_layer_above_its_own():
    upward = []
    for path, tree in _sources():
        unit = _unit(path)
        if unit is None:
            continue
        for name, line in _imported_units(tree):
            if name in RANK and RANK[name] > RANK[unit]:
                upward.append(f"{path}:{line} ({unit}) imports {name}")
    assert not upward, "\n".join(upward)


def test_no_function_takes_more_than_seven_positional_parameters():
    found = []
    for path, tree in _sources():
        if path in DATA_MODULES:
            continue
        for node in ast.walk(tree):
            if isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef)):
                params = [a.arg for a in node.args.posonlyargs + node.args.args]
                if params and params[0] in ("self", "cls"):
                    params = params[1:]
                if len(params) > MAX_POSITIONAL:
                    found.append(f"{path}:{node.lineno} {node.name} ({len(params)})")
    assert not found, "\n".join(found)
