"""Symbolic sizes: a dimension that is a symbol (``seq_len``) or an integer expression of
symbols (``seq_len * 2``), as Relax (a ``tirx.Var`` in a shape), ``torch.export`` (a ``Dim``)
and ONNX (a ``dim_param``) write them.

A size in a :class:`~tvm_taso.ir.ops.TensorType` is an ``int`` or a :class:`SymDim`: a TVM
integer expression over one variable per symbol name (:func:`symbol`), kept in the form TVM's
analyzer (``tvm.sym.Analyzer``) simplifies it to. The analyzer decides every question asked of
a SymDim, knowing that each symbol is a size of at least 1:

- ``a == b`` is True only when it holds for every value of the symbols: a shape check that
  cannot be proved fails, so the op is not read or the rewrite is not applied;
- ``<``, ``<=``, ``>``, ``>=``, ``bool(d)``, :func:`equal` and :func:`differ` raise
  :class:`Undecidable` (an :class:`~tvm_taso.ir.ops.OpError`) when the answer depends on the
  symbols' values: a rule condition that cannot be decided is false, never guessed;
- ``int(d)`` raises Undecidable too: what needs a number asks at a priced size (:func:`value`).

A graph with symbols is priced at representative sizes (:func:`priced_points`), and its cost
is the sum of its costs there (:mod:`tvm_taso.cost.model`).
"""

from __future__ import annotations

import functools
import itertools
import logging
import math
import operator

import numpy as np

from tvm_taso.errors import OpError

log = logging.getLogger(__name__)

MAX_SIZE = 2**40  # the analyzer's upper bound on a symbol (a size, not an overflow)
DEFAULT_SIZES = (1, 128)  # a symbol with no size given and no bounds: one item, and a typical length
MIDDLE_SIZE = 128  # priced between a symbol's bounds when they are far apart
MAX_POINTS = 16  # combinations of several symbols' sizes priced; beyond, the i-th size of each


class Undecidable(OpError):
    """A question about symbolic sizes whose answer depends on the symbols' values."""


_VARS: dict = {}  # symbol name -> its tirx.Var (one per process, so that n - n simplifies)
_analyzer_instance = None


def _analyzer():
    global _analyzer_instance
    if _analyzer_instance is None:
        import tvm.sym

        _analyzer_instance = tvm.sym.Analyzer()
    return _analyzer_instance


def _var(name: str):
    var = _VARS.get(name)
    if var is None:
        import tvm.sym
        from tvm import tirx

        var = _VARS[name] = tirx.Var(name, "int64")
        _analyzer().update(var, tvm.sym.ConstIntBound(1, MAX_SIZE))
    return var


# -- expressions as trees ------------------------------------------------------------------------
# A size's expression as plain data: an int, ("var", name), or (op, left, right) with op one of
# + - * // % min max. TVM's expressions are read into trees and built from them, so that a size
# pickles without TVM, renders readably and names the variables of the function it is written to.

_BINARY = {"Add": "+", "Sub": "-", "Mul": "*", "FloorDiv": "//", "FloorMod": "%", "Min": "min", "Max": "max"}
EXPRESSIONS = ("IntImm", "Var", "SizeVar", *_BINARY)  # the TVM expression types a size may be


def _tree(expr):
    """The tree of the TVM integer expression ``expr``; OpError for one the engine does not model."""
    kind = type(expr).__name__
    if kind == "IntImm":
        return int(expr.value)
    if kind in ("Var", "SizeVar"):
        if "int" not in str(getattr(expr, "ty", "int")):
            raise OpError(f"size {expr} is not an integer")
        return ("var", str(expr.name))
    if kind in _BINARY:
        return (_BINARY[kind], _tree(expr.a), _tree(expr.b))
    raise OpError(f"size expression {expr} ({kind}) is not one the engine models")


def _fold_tree(tree, constant, variable, ops: dict):
    """``tree`` computed bottom-up: ints through ``constant``, symbols through ``variable``,
    operators through ``ops``."""
    if isinstance(tree, int):
        return constant(tree)
    if tree[0] == "var":
        return variable(tree[1])
    return ops[tree[0]](_fold_tree(tree[1], constant, variable, ops), _fold_tree(tree[2], constant, variable, ops))


_INT_OPS = {"+": operator.add, "-": operator.sub, "*": operator.mul, "//": operator.floordiv, "%": operator.mod,
            "min": min, "max": max}


def _build(tree, var_of):
    """The TVM expression of ``tree``, its symbols the variables ``var_of(name)`` gives."""
    from tvm import tirx

    ops = dict(_INT_OPS, **{"//": tirx.floordiv, "%": tirx.floormod, "min": tirx.min, "max": tirx.max})
    return _fold_tree(tree, lambda n: tirx.IntImm("int64", n), var_of, ops)


def _evaluate(tree, values) -> int:
    return _fold_tree(tree, int, values.__getitem__, _INT_OPS)


_PRECEDENCE = {"+": 1, "-": 1, "*": 2, "//": 2, "%": 2}


def _render(tree, outer: int = 0) -> str:
    if isinstance(tree, int):
        return str(tree)
    if tree[0] == "var":
        return tree[1]
    op = tree[0]
    if op in ("min", "max"):
        return f"{op}({_render(tree[1])}, {_render(tree[2])})"
    level = _PRECEDENCE[op]
    text = f"{_render(tree[1], level)} {op} {_render(tree[2], level + 1)}"
    return f"({text})" if level < outer else text


def _names(tree) -> frozenset:
    if isinstance(tree, int):
        return frozenset()
    if tree[0] == "var":
        return frozenset((tree[1],))
    return _names(tree[1]) | _names(tree[2])


# -- sizes ---------------------------------------------------------------------------------------


def _operator(op: str):
    """The method pair (``__add__``, ``__radd__``) of a size for the binary ``op``."""
    return (lambda self, other: _arith(op, self, other)), (lambda self, other: _arith(op, other, self))


class SymDim:
    """A symbolic size (see the module docstring). Made by :func:`symbol`, :func:`from_prim` and
    arithmetic on sizes; an expression that simplifies to a constant is an ``int`` instead."""

    __slots__ = ("tree", "key", "expr", "_hash")

    def __init__(self, tree, expr):
        self.tree, self.expr = tree, expr
        self.key = _render(tree)
        self._hash = hash(self.key)

    # arithmetic (a size and a size or an int, either way round): another size, simplified
    __add__, __radd__ = _operator("+")
    __sub__, __rsub__ = _operator("-")
    __mul__, __rmul__ = _operator("*")
    __floordiv__, __rfloordiv__ = _operator("//")
    __mod__, __rmod__ = _operator("%")

    def __neg__(self):
        return _arith("*", self, -1)

    # questions: proved, or Undecidable
    def __eq__(self, other):
        other = _size(other)
        if other is NotImplemented:
            return NotImplemented
        return equal_proved(self, other)

    def __ne__(self, other):  # not proved equal: a shape check that refuses on it is safe
        result = self.__eq__(other)
        return result if result is NotImplemented else not result

    def __hash__(self):
        return self._hash

    def __lt__(self, other):
        return _decide(self, other, "<")

    def __le__(self, other):
        return _decide(self, other, "<=")

    def __gt__(self, other):
        return _decide(self, other, ">")

    def __ge__(self, other):
        return _decide(self, other, ">=")

    def __bool__(self):
        return _decide(self, 0, "!=")

    def __int__(self):
        raise Undecidable(f"size {self.key} is symbolic")

    __index__ = __int__

    def __repr__(self):
        return self.key

    __str__ = __repr__

    def __reduce__(self):
        return (_from_tree, (self.tree,))


def symbol(name: str) -> SymDim:
    """The size named ``name`` (at least 1)."""
    return SymDim(("var", name), _var(name))


def _size(x):
    """``x`` as a size (int or SymDim), or NotImplemented."""
    if isinstance(x, SymDim):
        return x
    if isinstance(x, (int, np.integer)) and not isinstance(x, bool):
        return int(x)
    return NotImplemented


def _expr(x):
    from tvm import tirx

    return x.expr if isinstance(x, SymDim) else tirx.IntImm("int64", x)


def _from_tree(tree):
    """The size of ``tree``, simplified: an int when it is a constant."""
    return _simplified(_build(tree, _var))


def _simplified(expr):
    simple = _analyzer().canonical_simplify(expr)
    tree = _ordered(_tree(simple))
    return tree if isinstance(tree, int) else SymDim(tree, simple)


def _ordered(tree):
    """``tree`` with the terms of every sum and the factors of every product in one order (by
    their text), so that equal sizes the analyzer wrote in another order (``m * n``, ``n * m``)
    render, hash and compare alike."""
    if isinstance(tree, int) or tree[0] == "var":
        return tree
    if tree[0] not in ("+", "*"):
        return (tree[0], _ordered(tree[1]), _ordered(tree[2]))
    parts, stack = [], [tree]
    while stack:
        t = stack.pop()
        if not isinstance(t, int) and t[0] == tree[0]:
            stack += [t[1], t[2]]
        else:
            parts.append(_ordered(t))
    parts.sort(key=lambda t: (isinstance(t, int), _render(t)))
    out = parts[0]
    for t in parts[1:]:
        out = (tree[0], out, t)
    return out


@functools.lru_cache(maxsize=65536)
def _arith_cached(op: str, a, b):
    return _simplified(_build((op, _tree_of(a), _tree_of(b)), _var))


def _tree_of(x):
    return x.tree if isinstance(x, SymDim) else x


def _arith(op: str, a, b):
    a, b = _size(a), _size(b)
    if a is NotImplemented or b is NotImplemented:
        return NotImplemented
    if op in ("//", "%") and b == 0:
        raise ZeroDivisionError("size divided by zero")
    if isinstance(a, int) and isinstance(b, int):
        return _evaluate((op, a, b), {})
    return _arith_cached(op, a, b)


def equal_proved(a, b) -> bool:
    """Whether sizes ``a`` and ``b`` are equal for every value of the symbols."""
    if isinstance(a, int) and isinstance(b, int):
        return a == b
    if isinstance(a, SymDim) and isinstance(b, SymDim) and a.key == b.key:
        return True
    return bool(_analyzer().can_prove_equal(_expr(a), _expr(b)))


_COMPARE = {"<": lambda a, b: a < b, "<=": lambda a, b: a <= b, ">": lambda a, b: a > b,
            ">=": lambda a, b: a >= b, "==": lambda a, b: a == b, "!=": lambda a, b: a != b}
_NEGATION = {"<": ">=", "<=": ">", ">": "<=", ">=": "<", "==": "!=", "!=": "=="}


def _decide(a, b, op: str) -> bool:
    """``a op b`` when the analyzer proves it or its negation; Undecidable otherwise."""
    a, b = _size(a), _size(b)
    if a is NotImplemented or b is NotImplemented:
        raise TypeError(f"cannot compare a size with {type(b).__name__}")
    if isinstance(a, int) and isinstance(b, int):
        return _COMPARE[op](a, b)
    analyzer = _analyzer()
    ea, eb = _expr(a), _expr(b)
    if analyzer.can_prove(_COMPARE[op](ea, eb)):
        return True
    if analyzer.can_prove(_COMPARE[_NEGATION[op]](ea, eb)):
        return False
    raise Undecidable(f"{_text(a)} {op} {_text(b)} depends on the sizes")


def _text(x) -> str:
    return x.key if isinstance(x, SymDim) else str(x)


def equal(a, b) -> bool:
    """``a == b`` for sizes or tuples of sizes, decided: True when it holds for every value of
    the symbols, False when it holds for none, Undecidable otherwise (a rule's ``=``)."""
    if type(a) is int and type(b) is int:  # static sizes: most of what conditions compare
        return a == b
    if isinstance(a, tuple) or isinstance(b, tuple):
        if not (isinstance(a, tuple) and isinstance(b, tuple)) or len(a) != len(b):
            return False
        answers = [equal(x, y) for x, y in zip(a, b)]
        return all(answers)
    if _size(a) is NotImplemented or _size(b) is NotImplemented:
        return a == b
    return _decide(a, b, "==")


def differ(a, b) -> bool:
    """``a != b``, decided as :func:`equal` (a rule's ``!=``)."""
    return not equal(a, b)


def is_symbolic(x) -> bool:
    """Whether ``x`` (a size, or a tuple or list of them, nested) holds a symbol."""
    if isinstance(x, SymDim):
        return True
    return isinstance(x, (tuple, list)) and any(is_symbolic(v) for v in x)


def symbols_of(x) -> frozenset:
    """The names of the symbols in ``x`` (a size, or a tuple of them, nested)."""
    if isinstance(x, SymDim):
        return _names(x.tree)
    if isinstance(x, tuple):
        return frozenset().union(*(symbols_of(v) for v in x)) if x else frozenset()
    return frozenset()


def value(x, point):
    """``x`` (a size or a tuple of them, nested; anything else as it is) with the symbols at
    ``point`` (``{name: size}``, or sorted (name, size) pairs)."""
    if isinstance(x, SymDim):
        return _evaluate(x.tree, dict(point))
    if isinstance(x, tuple):
        return tuple(value(v, point) for v in x)
    return x


def from_prim(expr):
    """A TVM integer expression (a dimension of a Relax shape) as a size; OpError for an
    expression the engine does not model (a cast, a call, a select...)."""
    tree = _tree(expr)
    return tree if isinstance(tree, int) else _from_tree(tree)


def to_prim(x, variables: dict):
    """``x`` (a size, or a tuple of them) as TVM expressions over ``variables`` (``{name:
    tirx.Var}``: the function's own, which a rewritten Relax function must use); ints stay ints."""
    if isinstance(x, SymDim):
        def var_of(name):
            if name not in variables:
                raise OpError(f"symbol {name} is not one of the function's")
            return variables[name]

        return _build(x.tree, var_of)
    if isinstance(x, tuple):
        return tuple(to_prim(v, variables) for v in x)
    return x


def broadcast_shapes(a: tuple, b: tuple) -> tuple:
    """NumPy's broadcast of two shapes of sizes; OpError unless each pair is provably equal or
    one of them is 1 (a symbol against another size could be 1 or not: undecided)."""
    rank = max(len(a), len(b))
    a = (1,) * (rank - len(a)) + tuple(a)
    b = (1,) * (rank - len(b)) + tuple(b)
    out = []
    for x, y in zip(a, b):
        if isinstance(x, int) and x == 1:
            out.append(y)
        elif isinstance(y, int) and y == 1 or equal_proved(x, y):
            out.append(x)
        else:
            raise OpError(f"shapes {list(a)} and {list(b)} do not broadcast for every size")
    return tuple(out)


# -- priced sizes ----------------------------------------------------------------------------------


def representative(lower: int | None, upper: int | None) -> tuple[int, ...]:
    """Sizes to price a symbol at from its bounds: the lower one (1 when not given), the upper
    one, and :data:`MIDDLE_SIZE` between them; :data:`DEFAULT_SIZES` without bounds."""
    lo = max(1, int(lower)) if lower is not None else 1
    if upper is None:
        return tuple(sorted({lo, max(lo, DEFAULT_SIZES[-1])}))
    hi = max(lo, int(upper))
    return tuple(sorted({lo, min(max(lo, MIDDLE_SIZE), hi), hi}))


def checked_sizes(shapes) -> dict:
    """The user's sizes for symbols (``{name: size or [sizes]}``) as ``{name: sorted sizes}``;
    ValueError (one line) for anything else."""
    if shapes is None:
        return {}
    if not isinstance(shapes, dict):
        raise ValueError(f"shapes must map symbol names to sizes, e.g. {{'seq_len': [1, 128]}}; got {shapes!r}")
    out = {}
    for name, chosen in shapes.items():
        chosen = (chosen,) if isinstance(chosen, int) and not isinstance(chosen, bool) else chosen
        if (not isinstance(name, str) or not isinstance(chosen, (list, tuple)) or not chosen
                or any(not isinstance(s, int) or isinstance(s, bool) or s < 1 for s in chosen)):
            raise ValueError(f"shapes: {name!r} must be given positive integer sizes, got {shapes[name]!r}")
        out[name] = tuple(sorted(set(chosen)))
    return out


def priced_points(symbols, given: dict | None = None, lower: dict | None = None,
                  upper: dict | None = None) -> tuple[tuple, dict]:
    """The points a graph whose sizes use ``symbols`` is priced at, and where each symbol's
    sizes came from: ``given`` (the user's, :func:`checked_sizes`), else the bounds
    ``lower`` / ``upper`` (a Relax function's ``tir_var_lower_bound`` / ``tir_var_upper_bound``),
    else :data:`DEFAULT_SIZES`. A point is a tuple of sorted (name, size) pairs: every
    combination of the symbols' sizes, or, past :data:`MAX_POINTS`, the i-th size of each."""
    given, lower, upper = given or {}, lower or {}, upper or {}
    names = sorted(symbols)
    sizes, source = {}, {}
    for name in names:
        if name in given:
            sizes[name], source[name] = given[name], "given"
        elif name in lower or name in upper:
            sizes[name], source[name] = representative(lower.get(name), upper.get(name)), "bounds"
        else:
            sizes[name], source[name] = DEFAULT_SIZES, "default"
    if not names:
        return (), {}
    combos = math.prod(len(sizes[n]) for n in names)
    if combos <= MAX_POINTS:
        points = [tuple(zip(names, values)) for values in itertools.product(*(sizes[n] for n in names))]
    else:
        longest = max(len(sizes[n]) for n in names)
        points = [tuple((n, sizes[n][min(i, len(sizes[n]) - 1)]) for n in names) for i in range(longest)]
        log.info("%d combinations of sizes for %s: priced at the %d points that take each symbol's "
                 "i-th size", combos, ", ".join(names), len(points))
    return tuple(points), {n: {"sizes": list(sizes[n]), "from": source[n]} for n in names}


def point_text(point) -> str:
    """A point as people read it: ``seq_len=128, batch=1``."""
    return ", ".join(f"{k}={v}" for k, v in point)
