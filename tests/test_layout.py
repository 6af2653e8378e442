"""The package's shape, checked: folders as layers with no upward import, and no function with
more than 7 positional parameters (options travel as keywords or one object)."""

from __future__ import annotations

import ast
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent

# lowest first; a unit imports only from its own layer or those below
LAYERS = [
    {"errors", "files", "numerics", "progress", "target", "examples", "ort", "ort.runtime"},
    {"ir", "runtime"},  # runtime reads parameter shapes, symbolic sizes included, as the engine does
    {"blas"},  # a Relax pass over the IR's functions
    {"io", "output_check"},  # the output check runs models through runtime and onnxruntime
    {"rewrite"},
    {"verify", "generate"},
    {"cost", "ort.pricing", "ort.bench"},
    {"search"},
    {"guard", "ort.guard"},
    {"driver"},
    {"passes", "rules"},
    {"cli"},
]
RANK = {unit: k for k, layer in enumerate(LAYERS) for unit in layer}
# packages whose modules sit on different layers (onnxruntime's: one home, each piece on the layer
# of what it serves); each module is its own unit, ``package.module``
SPLIT = {"ort"}
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
    if parts[1] in SPLIT:
        return parts[1] if parts[2] == "__init__.py" else f"{parts[1]}.{parts[2][:-3]}"
    return parts[1]


def _split_unit(module: str) -> str:
    """The unit of the module ``tvm_taso.x[.y...]``: ``x``, or ``x.y`` in a split package."""
    parts = module.split(".")
    return f"{parts[1]}.{parts[2]}" if parts[1] in SPLIT and len(parts) > 2 else parts[1]


def _imported_units(tree: ast.AST):
    for node in ast.walk(tree):
        names = []
        if isinstance(node, ast.ImportFrom) and node.level == 0 and node.module:
            if node.module == "tvm_taso":
                names = [a.name for a in node.names]
            elif node.module.removeprefix("tvm_taso.") in SPLIT:  # from tvm_taso.ort import runtime
                names = [f"{node.module.removeprefix('tvm_taso.')}.{a.name}" for a in node.names]
            elif node.module.startswith("tvm_taso."):
                names = [_split_unit(node.module)]
        elif isinstance(node, ast.Import):
            names = [_split_unit(a.name) for a in node.names if a.name.startswith("tvm_taso.")]
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


def _module_name(path: Path) -> str:
    name = ".".join(path.with_suffix("").parts)
    return name.removesuffix(".__init__")


def _module_imports() -> dict[str, set[str]]:
    """Each module of the package -> the package's modules it imports, at the top or inside a
    function (a lazy import is an import all the same). ``from pkg import name`` counts as
    ``pkg.name`` when that is a module, else as ``pkg``. The package's ``__init__`` (the public
    API over every layer) is left out."""
    sources = {_module_name(path): (path, tree) for path, tree in _sources() if path.parts[0] == "tvm_taso"}
    graph: dict[str, set[str]] = {}
    for name, (path, tree) in sources.items():
        package = name if path.name == "__init__.py" else name.rpartition(".")[0]
        found = set()
        for node in ast.walk(tree):
            if isinstance(node, ast.ImportFrom):
                base = package.split(".")[: len(package.split(".")) - node.level + 1] if node.level else []
                module = ".".join(base + ([node.module] if node.module else []))
                for alias in node.names:
                    found.add(f"{module}.{alias.name}" if f"{module}.{alias.name}" in sources else module)
            elif isinstance(node, ast.Import):
                found |= {alias.name for alias in node.names}
        graph[name] = {m for m in found if m in sources and m not in (name, "tvm_taso")}
    graph.pop("tvm_taso", None)
    return graph


def _cycles(graph: dict[str, set[str]]) -> list[list[str]]:
    """The strongly connected components of more than one module (Tarjan's algorithm)."""
    index: dict[str, int] = {}
    low: dict[str, int] = {}
    stack: list[str] = []
    found = []

    def visit(v: str) -> None:
        index[v] = low[v] = len(index)
        stack.append(v)
        for w in graph.get(v, ()):
            if w not in index:
                visit(w)
                low[v] = min(low[v], low[w])
            elif w in stack:
                low[v] = min(low[v], index[w])
        if low[v] == index[v]:
            component = []
            while not component or component[-1] != v:
                component.append(stack.pop())
            if len(component) > 1:
                found.append(sorted(component))

    for v in sorted(graph):
        if v not in index:
            visit(v)
    return found


def test_no_import_cycles():
    assert not _cycles(_module_imports())


def test_an_import_cycle_is_found():
    assert _cycles({"a": {"b"}, "b": {"c"}, "c": {"a"}, "d": {"a"}}) == [["a", "b", "c"]]
    graph = _module_imports()
    graph["tvm_taso.errors"] = {"tvm_taso.target"}  # target imports errors: a cycle if errors read target
    assert any({"tvm_taso.errors", "tvm_taso.target"} <= set(c) for c in _cycles(graph))


def test_search_defaults_are_spelled_only_in_search_options():
    """``optimize``, ``TasoOptimize`` and the command line take the search settings with no
    default of their own (None: :class:`SearchOptions`' applies), and the help quotes it."""
    import inspect

    from passes.taso_optimize import TasoOptimize
    from tvm_taso.cli.main import build_parser
    from tvm_taso.driver import optimize
    from tvm_taso.search.options import SearchOptions

    keywords = SearchOptions.keywords() & set(inspect.signature(optimize).parameters)
    assert {"alpha", "budget", "time_limit", "search", "max_weight_growth"} <= keywords
    for function in (optimize, TasoOptimize.__init__):
        parameters = inspect.signature(function).parameters
        assert {name: parameters[name].default for name in keywords} == dict.fromkeys(keywords)
    parser = build_parser()
    commands = parser._subparsers._group_actions[0].choices
    for command in ("example", "optimize", "bench"):
        for action in commands[command]._actions:
            if action.dest in keywords:
                assert action.default is None, (command, action.dest)
                default = SearchOptions.default(action.dest)
                if default is not None:  # workers: the cores, said in words
                    said = default if isinstance(default, str) else f"{default:g}"
                    assert f"default {said}" in action.help, (command, action.dest, action.help)


def test_model_kinds_are_told_apart_in_one_place():
    """``optimize`` asks its model's front end (read, write back, guard, count kernels) and
    does not branch on the kind; the front ends search through the block driver's one retry
    loop (``search_written``), not with loops of their own around ``search_block``."""
    kinds = {"OnnxModel", "IRModule"}
    branching, searching = [], []
    for path, tree in _sources():
        if path.parts[:2] != ("tvm_taso", "driver"):
            continue
        for node in ast.walk(tree):
            if not isinstance(node, ast.Call):
                continue
            name = getattr(node.func, "id", None)
            if name == "isinstance":
                named = {getattr(n, "id", None) or getattr(n, "attr", None) for n in ast.walk(node.args[1])}
                if named & kinds:
                    branching.append(str(path))
            if name == "search_block" and path.name != "block.py":
                searching.append(f"{path}:{node.lineno}")
    assert branching == ["tvm_taso/driver/front_end.py"], branching
    assert not searching, searching


def test_onnxruntime_is_used_from_one_package():
    """Sessions, providers, timings in onnxruntime: ``tvm_taso/ort/`` alone imports onnxruntime
    (the benchmarks too go through it). The one other import is the symbolic shape inference
    onnxruntime ships among its tools, a shape library the ONNX reader uses, not the runtime."""
    shape_inference = "onnxruntime.tools.symbolic_shape_infer"
    found = []
    for folder in ("tvm_taso", "passes", "benchmarks"):
        for path in sorted((ROOT / folder).rglob("*.py")):
            if path.parent == ROOT / "tvm_taso" / "ort":
                continue
            for node in ast.walk(ast.parse(path.read_text(), str(path))):
                names = [a.name for a in node.names] if isinstance(node, ast.Import) else \
                    [node.module] if isinstance(node, ast.ImportFrom) and node.module else []
                found += [f"{path.relative_to(ROOT)}:{node.lineno} imports {name}" for name in names
                          if name.split(".")[0] == "onnxruntime" and name != shape_inference]
    assert not found, "\n".join(found)


def test_every_package_is_installed():
    """A non-editable install ships the packages ``pyproject.toml`` lists, no others: a folder of
    the engine missing there would import here and fail after ``pip install .``."""
    import tomllib

    listed = set(tomllib.loads((ROOT / "pyproject.toml").read_text())["tool"]["setuptools"]["packages"])
    found = {".".join(p.parent.relative_to(ROOT).parts) for p in (ROOT / "tvm_taso").rglob("__init__.py")}
    assert found - listed == set(), sorted(found - listed)
