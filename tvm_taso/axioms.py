"""The operator properties the verifier proves rules from (TASO's axioms), in one place.

TASO proves a substitution by showing, with Z3, that its source and target are equal in every
model of a list of operator properties. This module holds that list for tvm-taso's op set.

**The model.** Tensors are an uninterpreted sort ``T`` with one extra element ``bot`` (⊥): the
value of an op application that :mod:`tvm_taso.ops` rejects (bad shapes or attributes). Every
op is total and strict (⊥ in, ⊥ out), so the real semantics of the op table *is* a model, and
an axiom is sound exactly when it holds there — including its ⊥ cases. A tensor's shape is
``shp(t)`` (an uninterpreted ``Shape``) read through ``rank`` and ``dim`` (``dim(k, t)`` indexes
like Python, ``k`` may be negative), its dtype is ``dt(t)``. Tuple attributes (strides, padding,
permutations) are a Z3 datatype ``Tup`` of ints; ``compose``/``inverse``/``identity?``/
``last-two-swapped`` are the rule language's functions, left uninterpreted here (the verifier adds
their values on the concrete tuples a rule mentions, computed by :data:`tvm_taso.rule.FUNCTIONS`).

The rule language's ``split`` is encoded as slices: part ``j`` of ``split(x, indices, axis k)``
is ``slice(k, x, c_j, c_j+1)`` with cut points ``0, indices..., dim(k, x)`` (TASO's ``split0``/
``split1`` are the two slices of a one-index split), and an n-ary ``concat`` is a left-nested
binary one. :data:`ENCODINGS` checks both encodings numerically.

**Three forms of axiom** (each a small Python function over an *algebra*, so the same text is
both the Z3 formula and the numeric test):

- ``Eq(lhs, rhs, guard)``: ``guard → lhs = rhs``, ⊥ included (lhs is ⊥ exactly when rhs is);
- ``Def(lhs, rhs, guard)``: ``guard ∧ lhs ≠ ⊥ → lhs = rhs`` (the right side may be defined on
  more inputs, e.g. ``slice(concat(a, b)) = a`` says nothing about ``b`` when ``a`` alone is
  given);
- ``Fact(then, defined, guard)``: ``guard ∧ every term in defined ≠ ⊥ → then``: shape facts.

The left side is the E-matching trigger (write a second axiom for the other direction).

**Numeric check.** :func:`check_axioms` evaluates every axiom on random small tensors, with the
reference semantics of :mod:`tvm_taso.ops` (``ops.infer`` decides ⊥, ``ops.evaluate`` computes
values), half of the draws shaped to fit and half perturbed (broadcast dims, wrong sizes, ⊥
operands, off-by-one attributes) so that the ⊥ cases are tested too. A wrong axiom is reported
with the values that refute it, and the verifier refuses to run on axioms that fail.
"""

from __future__ import annotations

import inspect
import math
import zlib
from dataclasses import dataclass
from typing import Callable

import numpy as np

from . import ops
from .rule import FUNCTIONS

MAX_TUPLE = 10  # longest tuple attribute the algebra represents (pad_width of a rank-5 tensor)


# -- statements -------------------------------------------------------------------------------


class Eq:
    """``guard → lhs = rhs`` (⊥ on one side exactly when on the other)."""

    kind = "eq"

    def __init__(self, lhs, rhs, guard=True):
        self.lhs, self.rhs, self.guard = lhs, rhs, guard


class Def(Eq):
    """``guard ∧ lhs ≠ ⊥ → lhs = rhs``."""

    kind = "def"


class Fact:
    """``guard ∧ (t ≠ ⊥ for t in defined) → then``; ``patterns`` are the triggers (lists of
    terms; default: all of ``defined``)."""

    kind = "fact"

    def __init__(self, then, defined=(), guard=True, patterns=None):
        self.then, self.defined, self.guard, self.patterns = then, tuple(defined), guard, patterns


# -- variable specs: the sort of an axiom's variable and how to draw it ----------------------


class T:
    """A tensor drawn from a template: ``"* m n"`` — ``*`` a shared batch prefix (0–2 dims),
    lowercase letters sizes 1–3 and uppercase 3–6 (shared across the axiom's tensors),
    digits literal sizes, ``g*c`` a product."""

    sort = "T"

    def __init__(self, template: str):
        self.template = template


class Int:
    sort = "Int"

    def __init__(self, fn):
        self.fn = fn


class Tup:
    sort = "Tup"

    def __init__(self, fn):
        self.fn = fn


class Real:
    sort = "Real"

    def __init__(self, fn):
        self.fn = fn


class Bool:
    sort = "Bool"

    def __init__(self, fn):
        self.fn = fn


class DType:
    """A dtype (an Int code in Z3, the dtype's name numerically)."""

    sort = "Int"

    def __init__(self, fn):
        self.fn = fn


class Sampler:
    """Draws one assignment of an axiom's variables (sizes shared through letters)."""

    def __init__(self, rng: np.random.Generator):
        self.rng = rng
        self.sizes: dict[str, int] = {}
        self.values: dict[str, object] = {}
        self._batch = None

    def int(self, lo: int, hi: int) -> int:
        return int(self.rng.integers(lo, hi + 1))

    def choice(self, items):
        return items[int(self.rng.integers(0, len(items)))]

    def size(self, letter: str) -> int:
        if letter not in self.sizes:
            self.sizes[letter] = self.int(3, 6) if letter.isupper() else self.int(1, 3)
        return self.sizes[letter]

    def batch(self) -> list[int]:
        if self._batch is None:
            self._batch = [self.int(1, 3) for _ in range(self.int(0, 2))]
        return self._batch

    def shape(self, name: str):
        v = self.values[name]
        return None if v is None else v.shape

    def rank(self, name: str) -> int:
        s = self.shape(name)
        return self.int(1, 4) if s is None else len(s)

    def dim(self, name: str, k: int) -> int:
        s = self.shape(name)
        return self.int(1, 4) if s is None or not -len(s) <= k < len(s) else s[k]

    def perm(self, n: int) -> tuple:
        return tuple(int(i) for i in self.rng.permutation(n))

    def pads(self, n: int, lo: int = 0, hi: int = 2) -> tuple:
        return tuple(self.int(lo, hi) for _ in range(n))

    def tensor(self, template: str, perturb: bool):
        rng = self.rng
        dims: list[int] = []
        for tok in template.split():
            if tok == "*":
                b = list(self.batch())
                if perturb and b and rng.random() < 0.3:
                    b = b[self.int(0, len(b)) :]
                dims.extend(b)
            else:
                dims.append(math.prod(int(t) if t.isdigit() else self.size(t) for t in tok.split("*")))
        if perturb:
            if rng.random() < 0.04:
                return None
            out = []
            for d in dims:
                r = rng.random()
                out.append(1 if r < 0.08 else self.int(1, 4) if r < 0.13 else d)
            dims = out
            r = rng.random()
            if r < 0.03 and dims:
                dims = dims[1:]
            elif r < 0.06:
                dims = [self.int(1, 3)] + dims
        return rng.standard_normal(tuple(dims))

    def perturb(self, spec, value):
        rng = self.rng
        r = rng.random()
        if isinstance(spec, Int):
            return value + self.choice((-1, 1)) if r < 0.1 else self.int(-3, 4) if r < 0.15 else value
        if isinstance(spec, Tup):
            if r < 0.12 and value:
                i = self.int(0, len(value) - 1)
                return value[:i] + (value[i] + self.choice((-1, 1)),) + value[i + 1 :]
            if r < 0.16:
                return value[:-1] if value else (0,)
            return value
        if isinstance(spec, Real):
            return self.choice((0.0, 1.0, -1.5, 2.0)) if r < 0.12 else value
        if isinstance(spec, Bool):
            return (not value) if r < 0.2 else value
        if isinstance(spec, DType):
            return "float32" if r < 0.15 else value
        return value


# -- the two algebras -------------------------------------------------------------------------


class _Junk:
    """The arbitrary-but-fixed values a model gives to dim/rank/shape of ⊥ and to out-of-range
    reads: drawn once per (function, argument) within one numeric draw."""

    def __init__(self, rng):
        self.rng = rng
        self.memo: dict = {}

    def __call__(self, key, make):
        if key not in self.memo:
            self.memo[key] = make(self.rng)
        return self.memo[key]


_CATCH = (ops.OpError, KeyError, IndexError, TypeError, ValueError, ZeroDivisionError)


class EvaluationError(RuntimeError):
    """ops.infer accepted an application that ops.evaluate could not compute."""


class Numeric:
    """The algebra on concrete values: numpy arrays or None (⊥), ints, tuples, floats; every op
    goes through ``ops.canonical_attrs``/``ops.infer``/``ops.evaluate`` exactly as
    ``Graph.add`` and the rule checker do."""

    def __init__(self, rng):
        self.junk = _Junk(rng)

    # ops
    def _op(self, name: str, arrays, attrs: dict, out: int = 0):
        if any(a is None for a in arrays):
            return None
        spec = ops.OPS[name]
        full = dict(spec.defaults)
        full.update(attrs)
        types = [ops.TensorType(tuple(int(d) for d in a.shape), str(a.dtype)) for a in arrays]
        try:
            full = ops.canonical_attrs(name, types, full)
            out_types = ops.infer(name, types, full)
        except _CATCH:
            return None
        try:
            with np.errstate(all="ignore"):
                values = ops.evaluate(name, [np.asarray(a) for a in arrays], full)
        except Exception as err:  # noqa: BLE001 - reported as a failed check
            raise EvaluationError(f"{name}{tuple(t.shape for t in types)} {full}: {err}") from err
        v = np.asarray(values[out])
        if tuple(v.shape) != out_types[out].shape:
            raise EvaluationError(f"{name}: evaluate gave {v.shape}, infer said {out_types[out].shape}")
        return v

    def add(self, x, y):
        return self._op("add", [x, y], {})

    def multiply(self, x, y):
        return self._op("multiply", [x, y], {})

    def relu(self, x):
        return self._op("relu", [x], {})

    def matmul(self, a, b):
        return self._op("matmul", [a, b], {})

    @staticmethod
    def _negative(padding) -> bool:
        """ops.infer accepts negative conv/pool padding that ops.evaluate cannot compute; the
        model treats such an application as ⊥ (no real graph has one)."""
        return isinstance(padding, tuple) and any(isinstance(p, int) and p < 0 for p in padding)

    def conv2d(self, strides, padding, dilation, groups, x, w):
        if self._negative(padding):
            return None
        return self._op("conv2d", [x, w], dict(strides=strides, padding=padding, dilation=dilation, groups=groups))

    def max_pool2d(self, size, strides, padding, dilation, ceil, x):
        if self._negative(padding):
            return None
        return self._op(
            "max_pool2d", [x], dict(pool_size=size, strides=strides, padding=padding, dilation=dilation, ceil_mode=ceil)
        )

    def avg_pool2d(self, size, strides, padding, dilation, ceil, include_pad, x):
        if self._negative(padding):
            return None
        return self._op(
            "avg_pool2d",
            [x],
            dict(
                pool_size=size,
                strides=strides,
                padding=padding,
                dilation=dilation,
                ceil_mode=ceil,
                count_include_pad=include_pad,
            ),
        )

    def concat(self, k, *xs):
        out = xs[0]
        for x in xs[1:]:
            out = self._op("concat", [out, x], dict(axis=k))
        return out

    def slice(self, k, x, a, b):
        """The part of ``x`` between cut points ``a`` and ``b`` along axis ``k``: a part of
        ``split`` (see :data:`ENCODINGS`); ⊥ unless ``0 <= a < b <= dim``."""
        if x is None or not -x.ndim <= k < x.ndim:
            return None
        d = x.shape[k]
        if not 0 <= a < b <= d:
            return None
        cuts = tuple(c for c in (a, b) if 0 < c < d)
        return self._op("split", [x], dict(indices=cuts, axis=k), out=1 if a > 0 else 0)

    def transpose(self, p, x):
        return self._op("permute_dims", [x], dict(axes=p))

    def pad(self, width, value, x):
        return self._op("pad", [x], dict(pad_width=width, pad_value=value))

    def scalar(self, value, dtype):
        try:
            return np.array(value, dtype=dtype)
        except _CATCH:
            return None

    # shapes
    def shp(self, t):
        if t is None:
            return self.junk(("shp",), lambda r: tuple(int(d) for d in r.integers(1, 4, size=int(r.integers(0, 4)))))
        return tuple(int(d) for d in t.shape)

    def rank(self, t):
        return len(self.shp(t))

    def dim(self, k, t):
        s = self.shp(t)
        return s[k] if -len(s) <= k < len(s) else self.junk(("dim", k, s), lambda r: int(r.integers(0, 5)))

    def dt(self, t):
        return self.junk(("dt",), lambda r: "bot-dtype") if t is None else str(t.dtype)

    # tuples and the rule language's functions on them
    def tup(self, *items):
        return tuple(items)

    def tnth(self, p, i):
        return p[i] if -len(p) <= i < len(p) else self.junk(("nth", p, i), lambda r: int(r.integers(-1, 4)))

    def tlen(self, p):
        return len(p)

    def _fn(self, name, *args):
        try:
            return tuple(FUNCTIONS[name](*args))
        except _CATCH:
            return self.junk((name,) + args, lambda r: tuple(int(v) for v in r.integers(0, 3, size=2)))

    def compose(self, p, q):
        return self._fn("compose", p, q)

    def inverse(self, p):
        return self._fn("inverse", p)

    def lts(self, n):
        return self._fn("last-two-swapped", n)

    def isid(self, p):
        return bool(FUNCTIONS["identity?"](p))

    # literals and logic
    @staticmethod
    def lit(value, sort: str):
        return float(value) if sort == "Real" else value

    @staticmethod
    def to_real(x):
        return float(x)

    @staticmethod
    def floordiv(a, b):
        return a // b

    def fresh_bool(self, name: str):
        return self.junk(("bool", name), lambda r: bool(r.integers(0, 2)))

    @staticmethod
    def And(*a):
        return all(bool(x) for x in a)

    @staticmethod
    def Or(*a):
        return any(bool(x) for x in a)

    @staticmethod
    def Not(a):
        return not a

    @staticmethod
    def Implies(a, b):
        return (not a) or bool(b)

    @staticmethod
    def If(c, a, b):
        return a if c else b

    @staticmethod
    def max(a, b):
        return max(a, b)


# Ops of the algebra: name -> (attribute sorts, number of tensor operands).
SIGNATURES = {
    "add": ((), 2),
    "multiply": ((), 2),
    "relu": ((), 1),
    "matmul": ((), 2),
    "conv2d": (("Tup", "Tup", "Tup", "Int"), 2),
    "max_pool2d": (("Tup", "Tup", "Tup", "Tup", "Bool"), 1),
    "avg_pool2d": (("Tup", "Tup", "Tup", "Tup", "Bool", "Bool"), 1),
    "concat": (("Int",), 2),
    "transpose": (("Tup",), 1),
    "pad": (("Tup", "Real"), 1),
}


class Z3Algebra:
    """The algebra on Z3 terms: the same method names as :class:`Numeric`."""

    def __init__(self):
        try:
            import z3
        except ImportError:  # pragma: no cover - depends on the install
            raise VerifierUnavailable("the verifier needs z3: install it with pip install 'tvm-taso[verify]'") from None
        self.z3 = z3
        self.T = z3.DeclareSort("T")
        self.Shape = z3.DeclareSort("Shape")
        dt = z3.Datatype("Tup")
        for n in range(MAX_TUPLE + 1):
            dt.declare(f"tup{n}", *[(f"tup{n}_{i}", z3.IntSort()) for i in range(n)])
        self.Tup = dt.create()
        self.sorts = {"T": self.T, "Int": z3.IntSort(), "Real": z3.RealSort(), "Bool": z3.BoolSort(), "Tup": self.Tup}
        self.bot = z3.Const("bot", self.T)
        F = z3.Function
        self.fns = {}
        for name, (attr_sorts, n) in SIGNATURES.items():
            self.fns[name] = F(name, *[self.sorts[s] for s in attr_sorts], *([self.T] * n), self.T)
        I, R, B, Tu, Ts = z3.IntSort(), z3.RealSort(), z3.BoolSort(), self.Tup, self.T
        self.fns["slice"] = F("slice", I, Ts, I, I, Ts)
        self.fns["scalar"] = F("scalar", R, I, Ts)
        self._shp = F("shp", Ts, self.Shape)
        self._srank = F("srank", self.Shape, I)
        self._sdim = F("sdim", I, self.Shape, I)
        self._dt = F("dt", Ts, I)
        self._tnth = F("tnth", Tu, I, I)
        self._tlen = F("tlen", Tu, I)
        self._compose = F("compose", Tu, Tu, Tu)
        self._inverse = F("inverse", Tu, Tu)
        self._isid = F("isid", Tu, B)
        self._lts = F("lts", I, Tu)

    def var(self, name: str, sort: str):
        return self.z3.Const(name, self.sorts[sort])

    # ops
    def add(self, x, y):
        return self.fns["add"](x, y)

    def multiply(self, x, y):
        return self.fns["multiply"](x, y)

    def relu(self, x):
        return self.fns["relu"](x)

    def matmul(self, a, b):
        return self.fns["matmul"](a, b)

    def conv2d(self, strides, padding, dilation, groups, x, w):
        return self.fns["conv2d"](strides, padding, dilation, groups, x, w)

    def max_pool2d(self, size, strides, padding, dilation, ceil, x):
        return self.fns["max_pool2d"](size, strides, padding, dilation, ceil, x)

    def avg_pool2d(self, size, strides, padding, dilation, ceil, include_pad, x):
        return self.fns["avg_pool2d"](size, strides, padding, dilation, ceil, include_pad, x)

    def concat(self, k, *xs):
        out = xs[0]
        for x in xs[1:]:
            out = self.fns["concat"](k, out, x)
        return out

    def slice(self, k, x, a, b):
        return self.fns["slice"](k, x, a, b)

    def transpose(self, p, x):
        return self.fns["transpose"](p, x)

    def pad(self, width, value, x):
        return self.fns["pad"](width, value, x)

    def scalar(self, value, dtype):
        return self.fns["scalar"](value, dtype)

    # shapes
    def shp(self, t):
        return self._shp(t)

    def rank(self, t):
        return self._srank(self._shp(t))

    def dim(self, k, t):
        return self._sdim(k, self._shp(t))

    def dt(self, t):
        return self._dt(t)

    # tuples
    def tup(self, *items):
        if len(items) > MAX_TUPLE:
            raise ValueError(f"tuple of {len(items)} items (at most {MAX_TUPLE})")
        c = getattr(self.Tup, f"tup{len(items)}")
        return c if not items else c(*items)

    def tnth(self, p, i):
        return self._tnth(p, i)

    def tlen(self, p):
        return self._tlen(p)

    def compose(self, p, q):
        return self._compose(p, q)

    def inverse(self, p):
        return self._inverse(p)

    def lts(self, n):
        return self._lts(n)

    def isid(self, p):
        return self._isid(p)

    # literals and logic
    def lit(self, value, sort: str):
        z3 = self.z3
        return {"Int": z3.IntVal, "Real": z3.RealVal, "Bool": z3.BoolVal}[sort](value)

    def to_real(self, x):
        return self.z3.ToReal(x)

    def floordiv(self, a, b):
        z3 = self.z3
        if not (z3.is_int(a) and z3.is_int(b)):
            raise TypeError("// on non-integers")
        return a / b  # Z3's integer division: floor for a positive divisor, like Python's

    def fresh_bool(self, name: str):
        return self.z3.Bool(name)

    def And(self, *a):
        return self.z3.And(*a)

    def Or(self, *a):
        return self.z3.Or(*a)

    def Not(self, a):
        return self.z3.Not(a)

    def Implies(self, a, b):
        return self.z3.Implies(a, b)

    def If(self, c, a, b):
        return self.z3.If(c, a, b)

    def max(self, a, b):
        return self.z3.If(a >= b, a, b)

    # -- the background theory: strictness, tuples --------------------------------------------
    def background(self) -> list:
        """Formulas that define the model rather than state op properties: every op is strict
        (⊥ in any operand gives ⊥, which is how :class:`Numeric` computes), and tuples have
        ``tnth``/``tlen`` (Python indexing, negative indices included)."""
        z3 = self.z3
        out = []
        for name, (attr_sorts, n) in SIGNATURES.items():
            attrs = [z3.Const(f"a{i}", self.sorts[s]) for i, s in enumerate(attr_sorts)]
            xs = [z3.Const(f"x{i}", self.T) for i in range(n)]
            term = self.fns[name](*attrs, *xs)
            out.append(
                z3.ForAll(attrs + xs, z3.Implies(term != self.bot, z3.And(*[x != self.bot for x in xs])), patterns=[term])
            )
        k, a, b = z3.Ints("k a b")
        x = z3.Const("x", self.T)
        term = self.slice(k, x, a, b)
        out.append(z3.ForAll([k, x, a, b], z3.Implies(term != self.bot, x != self.bot), patterns=[term]))
        out.append(self.tlen(self.tup()) == 0)
        for n in range(1, MAX_TUPLE + 1):
            items = [z3.Int(f"i{j}") for j in range(n)]
            t = self.tup(*items)
            facts = [self.tlen(t) == n]
            for j in range(n):
                facts += [self.tnth(t, j) == items[j], self.tnth(t, j - n) == items[j]]
            out.append(z3.ForAll(items, z3.And(*facts), patterns=[t]))
        return out


class VerifierUnavailable(RuntimeError):
    """z3 is not installed."""


# -- axioms -----------------------------------------------------------------------------------


@dataclass
class Axiom:
    name: str
    group: str
    doc: str
    build: Callable  # (algebra, *variables) -> Eq | Def | Fact
    params: tuple
    specs: dict

    def statement(self, alg, values: dict):
        return self.build(alg, *[values[p] for p in self.params])

    def formula(self, alg: Z3Algebra):
        """The Z3 ∀-formula, with the left side (or the defined terms) as trigger."""
        z3 = alg.z3
        vs = {p: alg.var(f"{self.name}.{p}", self.specs[p].sort) for p in self.params}
        st = self.statement(alg, vs)
        bound = list(vs.values())
        if st.kind == "fact":
            body = z3.Implies(z3.And(st.guard, *[t != alg.bot for t in st.defined]), st.then)
            pattern_sets = st.patterns or [list(st.defined)]
        else:
            pre = st.guard if st.kind == "eq" else z3.And(st.guard, st.lhs != alg.bot)
            body = z3.Implies(pre, st.lhs == st.rhs)
            pattern_sets = [[st.lhs]]
            if st.kind == "eq" and _valid_pattern(z3, [st.rhs], bound):
                pattern_sets.append([st.rhs])
        patterns = []
        for ps in pattern_sets:
            if not _valid_pattern(z3, ps, bound):
                raise ValueError(f"axiom {self.name}: trigger {ps} is not a valid pattern over {bound}")
            patterns.append(ps[0] if len(ps) == 1 else z3.MultiPattern(*ps))
        if not bound:
            return body
        return z3.ForAll(bound, body, patterns=patterns, qid=self.name)

    def check(self, trials: int = 60, seed: int = 0, min_exercised: int = 4) -> "AxiomCheck":
        """Evaluate the axiom on ``trials`` random draws with the reference semantics."""
        rng = np.random.default_rng([seed, zlib.crc32(self.name.encode())])
        exercised = skipped = 0
        tensors = [p for p in self.params if isinstance(self.specs[p], T)]
        others = [p for p in self.params if p not in tensors]
        for trial in range(trials):
            perturb = trial % 2 == 1
            s = Sampler(rng)
            for p in tensors:
                s.values[p] = s.tensor(self.specs[p].template, perturb)
            for p in others:
                spec = self.specs[p]
                value = spec.fn(s) if callable(spec.fn) else spec.fn
                s.values[p] = s.perturb(spec, value) if perturb else value
            alg = Numeric(rng)
            try:
                st = self.statement(alg, s.values)
                verdict = _judge(st, alg)
            except EvaluationError as err:  # ops.infer accepted what ops.evaluate cannot compute
                skipped += 1
                if skipped > trials // 4:
                    return AxiomCheck(self.name, False, exercised, trial + 1, f"ops.evaluate failed {skipped} times: {err}")
                continue
            if verdict is True:
                exercised += 1
            elif isinstance(verdict, str):
                return AxiomCheck(self.name, False, exercised, trial + 1, f"{verdict}; with {_describe(s.values)}")
        if exercised < min_exercised:
            return AxiomCheck(
                self.name, False, exercised, trials, f"only {exercised} of {trials} draws met the premise (sampler too loose)"
            )
        return AxiomCheck(self.name, True, exercised, trials, "")


@dataclass
class AxiomCheck:
    name: str
    ok: bool
    exercised: int  # draws that met the premise (guard and definedness) and so tested the conclusion
    trials: int
    message: str


def _judge(st, alg: Numeric):
    """True: premise met and conclusion holds; None: premise not met; str: a refutation."""
    if not st.guard:
        return None
    if st.kind == "fact":
        if any(t is None for t in st.defined):
            return None
        return True if st.then else "the fact is false"
    lhs, rhs = st.lhs, st.rhs
    if st.kind == "def" and lhs is None:
        return None
    if lhs is None or rhs is None:
        if lhs is None and rhs is None:
            return None
        return "left side is ⊥ but right side is defined" if lhs is None else "left side is defined but right side is ⊥"
    if lhs.shape != rhs.shape or lhs.dtype != rhs.dtype:
        return f"shapes differ: {lhs.dtype}{list(lhs.shape)} vs {rhs.dtype}{list(rhs.shape)}"
    scale = max(1.0, float(np.nanmax(np.abs(lhs), initial=0.0)))
    if not np.allclose(lhs, rhs, rtol=1e-9, atol=1e-9 * scale, equal_nan=True):
        return f"values differ by {float(np.abs(lhs - rhs).max()):.3g}"
    return True


def _describe(values: dict) -> str:
    parts = []
    for k, v in values.items():
        if isinstance(v, np.ndarray):
            parts.append(f"{k}: tensor{list(v.shape)}")
        elif v is None:
            parts.append(f"{k}: ⊥")
        else:
            parts.append(f"{k}={v!r}")
    return ", ".join(parts)


def _valid_pattern(z3, terms, bound) -> bool:
    """Z3 triggers: applications of uninterpreted functions (or datatype constructors) over
    bound variables and ground terms, covering every bound variable."""
    seen = set()

    def ok(t, top):
        if z3.is_const(t) and any(t.eq(b) for b in bound):
            seen.add(t.get_id())
            return not top
        if not z3.is_app(t):
            return False
        kind = t.decl().kind()
        if kind not in (z3.Z3_OP_UNINTERPRETED, z3.Z3_OP_DT_CONSTRUCTOR):
            return not top and (z3.is_int_value(t) or z3.is_rational_value(t) or z3.is_true(t) or z3.is_false(t))
        return all(ok(c, False) for c in t.children())

    if not all(ok(t, True) for t in terms):
        return False
    return {b.get_id() for b in bound} <= seen


AXIOMS: list[Axiom] = []
_GROUP = ["?"]


def group(name: str) -> None:
    _GROUP[0] = name


def axiom(**specs):
    """Register the decorated function as an axiom; keyword arguments give each variable's
    spec (a string is a tensor template)."""

    def deco(fn):
        params = tuple(inspect.signature(fn).parameters)[1:]
        missing = [p for p in params if p not in specs]
        if missing:
            raise TypeError(f"axiom {fn.__name__}: no spec for {missing}")
        full = {p: T(specs[p]) if isinstance(specs[p], str) else specs[p] for p in params}
        AXIOMS.append(Axiom(fn.__name__.replace("_", "-"), _GROUP[0], inspect.getdoc(fn) or "", fn, params, full))
        return fn

    return deco


def make_axiom(name: str, build: Callable, group_name: str = "user", **specs) -> Axiom:
    """An axiom that is not registered (for tests and experiments)."""
    params = tuple(inspect.signature(build).parameters)[1:]
    full = {p: T(specs[p]) if isinstance(specs[p], str) else specs[p] for p in params}
    return Axiom(name, group_name, inspect.getdoc(build) or "", build, params, full)


# Attribute samplers used below.
def _last(name):
    return Int(lambda s: s.rank(name) - 1)


_AXIS = Int(lambda s: s.int(0, 1))
_STRIDES = Tup(lambda s: (s.int(1, 2), s.int(1, 2)))
_PADDING = Tup(lambda s: s.pads(4, 0, 1))
_DILATION = Tup(lambda s: s.choice(((1, 1), (1, 1), (2, 1), (1, 2))))
_GROUPS = Int(lambda s: s.size("g"))
_POOL = Tup(lambda s: (s.int(1, 3), s.int(1, 2)))
_FALSE = Bool(lambda s: False)
_ANYBOOL = Bool(lambda s: s.choice((False, True)))
_PERM = Tup(lambda s: s.perm(s.rank("x")))


# --- elementwise add and multiply: commutative, associative, distributive ----------------------
group("elementwise")


@axiom(x="* m n", y="* m n")
def add_comm(A, x, y):
    """x + y = y + x (with broadcasting)."""
    return Eq(A.add(x, y), A.add(y, x))


@axiom(x="* m n", y="* m n", z="* m n")
def add_assoc(A, x, y, z):
    """(x + y) + z = x + (y + z)."""
    return Eq(A.add(A.add(x, y), z), A.add(x, A.add(y, z)))


@axiom(x="* m n", y="* m n", z="* m n")
def add_assoc_rev(A, x, y, z):
    """x + (y + z) = (x + y) + z."""
    return Eq(A.add(x, A.add(y, z)), A.add(A.add(x, y), z))


@axiom(x="* m n", y="* m n")
def mul_comm(A, x, y):
    """x * y = y * x."""
    return Eq(A.multiply(x, y), A.multiply(y, x))


@axiom(x="* m n", y="* m n", z="* m n")
def mul_assoc(A, x, y, z):
    """(x * y) * z = x * (y * z)."""
    return Eq(A.multiply(A.multiply(x, y), z), A.multiply(x, A.multiply(y, z)))


@axiom(x="* m n", y="* m n", z="* m n")
def mul_assoc_rev(A, x, y, z):
    """x * (y * z) = (x * y) * z."""
    return Eq(A.multiply(x, A.multiply(y, z)), A.multiply(A.multiply(x, y), z))


@axiom(x="* m n", y="* m n", z="* m n")
def mul_distrib(A, x, y, z):
    """x * (y + z) = x * y + x * z."""
    return Eq(A.multiply(x, A.add(y, z)), A.add(A.multiply(x, y), A.multiply(x, z)))


@axiom(x="* m n", y="* m n", z="* m n")
def mul_factor(A, x, y, z):
    """x * y + x * z = x * (y + z)."""
    return Eq(A.add(A.multiply(x, y), A.multiply(x, z)), A.multiply(x, A.add(y, z)))


@axiom(x="* m n")
def relu_idem(A, x):
    """relu(relu(x)) = relu(x)."""
    return Eq(A.relu(A.relu(x)), A.relu(x))


# --- constants (TASO's scalar constants: 0, 1, folding) ----------------------------------------
group("constants")
_ONE = Real(lambda s: 1.0)
_ZERO = Real(lambda s: 0.0)
_VALUE = Real(lambda s: s.choice((-1.5, 0.0, 0.5, 2.0)))
_DT = DType(lambda s: "float64")


@axiom(x="* m n", v=_ONE, d=_DT)
def mul_one(A, x, v, d):
    """x * 1 = x (the scalar has x's dtype)."""
    return Eq(A.multiply(x, A.scalar(v, d)), x, A.And(v == 1, d == A.dt(x)))


@axiom(x="* m n", v=_ZERO, d=_DT)
def add_zero(A, x, v, d):
    """x + 0 = x."""
    return Eq(A.add(x, A.scalar(v, d)), x, A.And(v == 0, d == A.dt(x)))


@axiom(a=_VALUE, b=_VALUE, d=_DT)
def mul_scalars(A, a, b, d):
    """scalar(a) * scalar(b) = scalar(a·b)."""
    return Eq(A.multiply(A.scalar(a, d), A.scalar(b, d)), A.scalar(a * b, d))


@axiom(a=_VALUE, b=_VALUE, d=_DT)
def add_scalars(A, a, b, d):
    """scalar(a) + scalar(b) = scalar(a + b)."""
    return Eq(A.add(A.scalar(a, d), A.scalar(b, d)), A.scalar(a + b, d))


# --- matmul: associative, linear in each argument ----------------------------------------------
group("matmul")


@axiom(a="* m n", b="* n p", c="* p q")
def matmul_assoc(A, a, b, c):
    """(a·b)·c = a·(b·c), batch dims broadcasting."""
    return Eq(A.matmul(A.matmul(a, b), c), A.matmul(a, A.matmul(b, c)))


@axiom(a="* m n", b="* n p", c="* p q")
def matmul_assoc_rev(A, a, b, c):
    """a·(b·c) = (a·b)·c."""
    return Eq(A.matmul(a, A.matmul(b, c)), A.matmul(A.matmul(a, b), c))


@axiom(x="* m n", a="* n p", b="* n p")
def matmul_linear_rhs(A, x, a, b):
    """x·(a + b) = x·a + x·b for a, b of one shape."""
    return Eq(A.matmul(x, A.add(a, b)), A.add(A.matmul(x, a), A.matmul(x, b)), A.shp(a) == A.shp(b))


@axiom(x="* m n", a="* n p", b="* n p")
def matmul_factor_rhs(A, x, a, b):
    """x·a + x·b = x·(a + b) for a, b of one shape."""
    return Eq(A.add(A.matmul(x, a), A.matmul(x, b)), A.matmul(x, A.add(a, b)), A.shp(a) == A.shp(b))


@axiom(a="* m n", b="* m n", w="* n p")
def matmul_linear_lhs(A, a, b, w):
    """(a + b)·w = a·w + b·w for a, b of one shape."""
    return Eq(A.matmul(A.add(a, b), w), A.add(A.matmul(a, w), A.matmul(b, w)), A.shp(a) == A.shp(b))


@axiom(a="* m n", b="* m n", w="* n p")
def matmul_factor_lhs(A, a, b, w):
    """a·w + b·w = (a + b)·w for a, b of one shape."""
    return Eq(A.add(A.matmul(a, w), A.matmul(b, w)), A.matmul(A.add(a, b), w), A.shp(a) == A.shp(b))


@axiom(x="* m n", w="* n p", s="")
def matmul_scalar_rhs(A, x, w, s):
    """x·(w * s) = (x·w) * s for a rank-0 s (scalar multiplication commutes with matmul)."""
    return Eq(A.matmul(x, A.multiply(w, s)), A.multiply(A.matmul(x, w), s), A.rank(s) == 0)


@axiom(x="* m n", w="* n p", s="")
def matmul_scalar_lhs(A, x, w, s):
    """(x * s)·w = (x·w) * s for a rank-0 s."""
    return Eq(A.matmul(A.multiply(x, s), w), A.multiply(A.matmul(x, w), s), A.rank(s) == 0)


@axiom(x="* m n", w="* n p", s="")
def scalar_into_matmul(A, x, w, s):
    """(x·w) * s = x·(w * s) for a rank-0 s."""
    return Eq(A.multiply(A.matmul(x, w), s), A.matmul(x, A.multiply(w, s)), A.rank(s) == 0)


# --- matmul over concat (TASO: matmul distributes over concat of either operand) ----------------


@axiom(x="* m n", a="* n p", b="* n q", k=_last("a"))
def matmul_concat_rhs(A, x, a, b, k):
    """x·[a b] = [x·a x·b]: concat on the columns of the right operand."""
    return Def(
        A.matmul(x, A.concat(k, a, b)),
        A.concat(A.rank(A.matmul(x, a)) - 1, A.matmul(x, a), A.matmul(x, b)),
        k == A.rank(a) - 1,
    )


@axiom(x="* m n", a="n p", b="n q", j=Int(lambda s: s.rank("x") - 1))
def concat_matmul_rhs(A, x, a, b, j):
    """[x·a x·b] = x·[a b] for 2-d a, b."""
    return Def(
        A.concat(j, A.matmul(x, a), A.matmul(x, b)),
        A.matmul(x, A.concat(A.rank(a) - 1, a, b)),
        A.And(j == A.rank(A.matmul(x, a)) - 1, A.rank(a) == 2, A.rank(b) == 2),
    )


@axiom(a="* m n", b="* p n", w="* n q", k=Int(lambda s: s.rank("a") - 2))
def matmul_concat_lhs(A, a, b, w, k):
    """[a; b]·w = [a·w; b·w]: concat on the rows of the left operand."""
    return Def(
        A.matmul(A.concat(k, a, b), w),
        A.concat(A.rank(A.matmul(a, w)) - 2, A.matmul(a, w), A.matmul(b, w)),
        k == A.rank(a) - 2,
    )


@axiom(a="m n", b="p n", w="n q", j=Int(lambda s: 0))
def concat_matmul_lhs(A, a, b, w, j):
    """[a·w; b·w] = [a; b]·w for 2-d a, b, w."""
    return Def(
        A.concat(j, A.matmul(a, w), A.matmul(b, w)),
        A.matmul(A.concat(0, a, b), w),
        A.And(j == 0, A.rank(a) == 2, A.rank(b) == 2, A.rank(w) == 2),
    )


@axiom(a="* m n", b="* m p", c="* n q", d="* p q", k=_last("a"), j=Int(lambda s: s.rank("c") - 2))
def matmul_concat_inner(A, a, b, c, d, k, j):
    """[a b]·[c; d] = a·c + b·d when the cut points agree."""
    return Def(
        A.matmul(A.concat(k, a, b), A.concat(j, c, d)),
        A.add(A.matmul(a, c), A.matmul(b, d)),
        A.And(k == A.rank(a) - 1, j == A.rank(c) - 2, A.dim(A.rank(a) - 1, a) == A.dim(A.rank(c) - 2, c)),
    )


@axiom(a="* m n", b="* m p", c="n q", d="p q")
def matmul_sum_inner(A, a, b, c, d):
    """a·c + b·d = [a b]·[c; d] when the products have one shape and c, d are 2-d."""
    return Def(
        A.add(A.matmul(a, c), A.matmul(b, d)),
        A.matmul(A.concat(A.rank(a) - 1, a, b), A.concat(0, c, d)),
        A.And(A.rank(a) == A.rank(b), A.rank(c) == 2, A.rank(d) == 2, A.shp(A.matmul(a, c)) == A.shp(A.matmul(b, d))),
    )


# --- conv2d: linear in each argument, over concat, enlarge --------------------------------------
group("conv2d")
_X = "n g*c H W"
_W = "g*o c h w"


@axiom(s=_STRIDES, p=_PADDING, d=_DILATION, g=_GROUPS, x=_X, a=_W, b=_W)
def conv_linear_w(A, s, p, d, g, x, a, b):
    """conv(x, a + b) = conv(x, a) + conv(x, b) for kernels of one shape."""
    return Eq(
        A.conv2d(s, p, d, g, x, A.add(a, b)),
        A.add(A.conv2d(s, p, d, g, x, a), A.conv2d(s, p, d, g, x, b)),
        A.shp(a) == A.shp(b),
    )


@axiom(s=_STRIDES, p=_PADDING, d=_DILATION, g=_GROUPS, x=_X, a=_W, b=_W)
def conv_factor_w(A, s, p, d, g, x, a, b):
    """conv(x, a) + conv(x, b) = conv(x, a + b) for kernels of one shape."""
    return Eq(
        A.add(A.conv2d(s, p, d, g, x, a), A.conv2d(s, p, d, g, x, b)),
        A.conv2d(s, p, d, g, x, A.add(a, b)),
        A.shp(a) == A.shp(b),
    )


@axiom(s=_STRIDES, p=_PADDING, d=_DILATION, g=_GROUPS, x=_X, y=_X, w=_W)
def conv_linear_x(A, s, p, d, g, x, y, w):
    """conv(x + y, w) = conv(x, w) + conv(y, w) for inputs of one shape."""
    return Eq(
        A.conv2d(s, p, d, g, A.add(x, y), w),
        A.add(A.conv2d(s, p, d, g, x, w), A.conv2d(s, p, d, g, y, w)),
        A.shp(x) == A.shp(y),
    )


@axiom(s=_STRIDES, p=_PADDING, d=_DILATION, g=_GROUPS, x=_X, w=_W, k="")
def conv_scalar_w(A, s, p, d, g, x, w, k):
    """conv(x, w * k) = conv(x, w) * k for a rank-0 k."""
    return Eq(A.conv2d(s, p, d, g, x, A.multiply(w, k)), A.multiply(A.conv2d(s, p, d, g, x, w), k), A.rank(k) == 0)


@axiom(s=_STRIDES, p=_PADDING, d=_DILATION, g=_GROUPS, x=_X, w=_W, k="")
def scalar_into_conv(A, s, p, d, g, x, w, k):
    """conv(x, w) * k = conv(x, w * k) for a rank-0 k."""
    return Eq(A.multiply(A.conv2d(s, p, d, g, x, w), k), A.conv2d(s, p, d, g, x, A.multiply(w, k)), A.rank(k) == 0)


_G1 = Int(lambda s: 1)


@axiom(s=_STRIDES, p=_PADDING, d=_DILATION, g=_G1, x="n c H W", a="o c h w", b="q c h w", k=Int(lambda s: 0))
def conv_concat_w(A, s, p, d, g, x, a, b, k):
    """conv(x, [a; b]) = [conv(x, a) conv(x, b)]: stacking kernels stacks output channels."""
    return Def(
        A.conv2d(s, p, d, g, x, A.concat(k, a, b)),
        A.concat(1, A.conv2d(s, p, d, g, x, a), A.conv2d(s, p, d, g, x, b)),
        A.And(k == 0, g == 1),
    )


@axiom(s=_STRIDES, p=_PADDING, d=_DILATION, g=_G1, x="n c H W", a="o c h w", b="q c h w", j=Int(lambda s: 1))
def concat_conv_w(A, s, p, d, g, x, a, b, j):
    """[conv(x, a) conv(x, b)] = conv(x, [a; b]) for kernels of one size."""
    return Def(
        A.concat(j, A.conv2d(s, p, d, g, x, a), A.conv2d(s, p, d, g, x, b)),
        A.conv2d(s, p, d, g, x, A.concat(0, a, b)),
        A.And(j == 1, g == 1, A.dim(2, a) == A.dim(2, b), A.dim(3, a) == A.dim(3, b)),
    )


@axiom(
    s=_STRIDES, p=_PADDING, d=_DILATION, g=_G1, x="n c H W", y="n e H W", a="o c h w", b="o e h w",
    k=Int(lambda s: 1), j=Int(lambda s: 1),
)
def conv_concat_x(A, s, p, d, g, x, y, a, b, k, j):
    """conv([x y], [a b]) = conv(x, a) + conv(y, b): concat on input channels."""
    return Def(
        A.conv2d(s, p, d, g, A.concat(k, x, y), A.concat(j, a, b)),
        A.add(A.conv2d(s, p, d, g, x, a), A.conv2d(s, p, d, g, y, b)),
        A.And(k == 1, j == 1, g == 1, A.dim(1, x) == A.dim(1, a)),
    )


@axiom(s=_STRIDES, p=_PADDING, d=_DILATION, g=_GROUPS, x=_X, y=_X, w=_W, k=Int(lambda s: 0))
def conv_concat_batch(A, s, p, d, g, x, y, w, k):
    """conv([x; y] on the batch axis, w) = [conv(x, w); conv(y, w)]."""
    return Def(
        A.conv2d(s, p, d, g, A.concat(k, x, y), w),
        A.concat(0, A.conv2d(s, p, d, g, x, w), A.conv2d(s, p, d, g, y, w)),
        k == 0,
    )


@axiom(s=_STRIDES, p=_PADDING, d=_DILATION, g=_GROUPS, x=_X, y=_X, w=_W, j=Int(lambda s: 0))
def concat_conv_batch(A, s, p, d, g, x, y, w, j):
    """[conv(x, w); conv(y, w)] = conv([x; y], w) for inputs that agree off the batch axis."""
    return Def(
        A.concat(j, A.conv2d(s, p, d, g, x, w), A.conv2d(s, p, d, g, y, w)),
        A.conv2d(s, p, d, g, A.concat(0, x, y), w),
        A.And(j == 0, A.dim(1, x) == A.dim(1, y), A.dim(2, x) == A.dim(2, y), A.dim(3, x) == A.dim(3, y)),
    )


@axiom(s=_STRIDES, p=_PADDING, d=_DILATION, g=_GROUPS, x=_X, w=_W, k="")
def conv_scalar_x(A, s, p, d, g, x, w, k):
    """conv(x * k, w) = conv(x, w) * k for a rank-0 k (zero padding scales too)."""
    return Eq(A.conv2d(s, p, d, g, A.multiply(x, k), w), A.multiply(A.conv2d(s, p, d, g, x, w), k), A.rank(k) == 0)


@axiom(s=_STRIDES, p=_PADDING, d=_DILATION, g=_GROUPS, x=_X, w=_W, k="")
def scalar_into_conv_x(A, s, p, d, g, x, w, k):
    """conv(x, w) * k = conv(x * k, w) for a rank-0 k."""
    return Eq(A.multiply(A.conv2d(s, p, d, g, x, w), k), A.conv2d(s, p, d, g, A.multiply(x, k), w), A.rank(k) == 0)


def _enlarge_width(s):
    return (0, 0, 0, 0) + s.pads(4, 0, 2)


@axiom(
    s=_STRIDES, q=Tup(lambda s: tuple(e + s.int(0, 1) for e in s.values["e"][4:])), d=Tup(lambda s: (1, 1)),
    g=_GROUPS, x=_X, w=_W, e=Tup(_enlarge_width), v=_ZERO,
)
def conv_enlarge(A, s, e, q, d, g, x, w, v):
    """TASO's enlarge: zero-padding the kernel by (t, b, l, r) and the input by as much more
    computes the same convolution: conv(x, pad(w, e), padding q) = conv(x, w, padding q - e)."""
    n = A.tnth
    return Def(
        A.conv2d(s, q, d, g, x, A.pad(e, v, w)),
        A.conv2d(s, A.tup(n(q, 0) - n(e, 4), n(q, 1) - n(e, 6), n(q, 2) - n(e, 5), n(q, 3) - n(e, 7)), d, g, x, w),
        A.And(
            v == 0, d == A.tup(1, 1), A.tlen(e) == 8, A.tlen(q) == 4,
            n(e, 0) == 0, n(e, 1) == 0, n(e, 2) == 0, n(e, 3) == 0,
            n(e, 4) >= 0, n(e, 5) >= 0, n(e, 6) >= 0, n(e, 7) >= 0,
            n(q, 0) >= n(e, 4), n(q, 1) >= n(e, 6), n(q, 2) >= n(e, 5), n(q, 3) >= n(e, 7),
        ),
    )


# --- pooling over concat (channel or batch axis), avg pool is linear ---------------------------
group("pool")
_PS = dict(size=_POOL, s=_STRIDES, p=Tup(lambda s: (0, 0, 0, 0)), d=Tup(lambda s: (1, 1)), c=_FALSE)


@axiom(**_PS, a="n c H W", b="n e H W", k=_AXIS)
def maxpool_concat(A, size, s, p, d, c, a, b, k):
    """maxpool([a b]) = [maxpool(a) maxpool(b)] along the batch or channel axis."""
    f = lambda t: A.max_pool2d(size, s, p, d, c, t)  # noqa: E731
    return Def(f(A.concat(k, a, b)), A.concat(k, f(a), f(b)), A.And(k >= 0, k <= 1))


@axiom(**_PS, a="n c H W", b="n e H W", k=_AXIS)
def concat_maxpool(A, size, s, p, d, c, a, b, k):
    """[maxpool(a) maxpool(b)] = maxpool([a b]) for inputs that agree off the axis."""
    f = lambda t: A.max_pool2d(size, s, p, d, c, t)  # noqa: E731
    return Def(
        A.concat(k, f(a), f(b)),
        f(A.concat(k, a, b)),
        A.And(k >= 0, k <= 1, A.dim(1 - k, a) == A.dim(1 - k, b), A.dim(2, a) == A.dim(2, b), A.dim(3, a) == A.dim(3, b)),
    )


@axiom(**_PS, i=_ANYBOOL, a="n c H W", b="n e H W", k=_AXIS)
def avgpool_concat(A, size, s, p, d, c, i, a, b, k):
    """avgpool([a b]) = [avgpool(a) avgpool(b)] along the batch or channel axis."""
    f = lambda t: A.avg_pool2d(size, s, p, d, c, i, t)  # noqa: E731
    return Def(f(A.concat(k, a, b)), A.concat(k, f(a), f(b)), A.And(k >= 0, k <= 1))


@axiom(**_PS, i=_ANYBOOL, a="n c H W", b="n e H W", k=_AXIS)
def concat_avgpool(A, size, s, p, d, c, i, a, b, k):
    """[avgpool(a) avgpool(b)] = avgpool([a b]) for inputs that agree off the axis."""
    f = lambda t: A.avg_pool2d(size, s, p, d, c, i, t)  # noqa: E731
    return Def(
        A.concat(k, f(a), f(b)),
        f(A.concat(k, a, b)),
        A.And(k >= 0, k <= 1, A.dim(1 - k, a) == A.dim(1 - k, b), A.dim(2, a) == A.dim(2, b), A.dim(3, a) == A.dim(3, b)),
    )


@axiom(size=_POOL, s=_STRIDES, p=_PADDING, d=_DILATION, c=_FALSE, i=_ANYBOOL, x="n c H W", y="n c H W")
def avgpool_linear(A, size, s, p, d, c, i, x, y):
    """avgpool(x + y) = avgpool(x) + avgpool(y) for inputs of one shape."""
    f = lambda t: A.avg_pool2d(size, s, p, d, c, i, t)  # noqa: E731
    return Eq(f(A.add(x, y)), A.add(f(x), f(y)), A.shp(x) == A.shp(y))


@axiom(size=_POOL, s=_STRIDES, p=_PADDING, d=_DILATION, c=_FALSE, i=_ANYBOOL, x="n c H W", k="")
def avgpool_scalar(A, size, s, p, d, c, i, x, k):
    """avgpool(x * k) = avgpool(x) * k for a rank-0 k."""
    f = lambda t: A.avg_pool2d(size, s, p, d, c, i, t)  # noqa: E731
    return Eq(f(A.multiply(x, k)), A.multiply(f(x), k), A.rank(k) == 0)


@axiom(size=_POOL, s=_STRIDES, p=_PADDING, d=_DILATION, c=_FALSE, i=_ANYBOOL, x="n c H W", k="")
def scalar_into_avgpool(A, size, s, p, d, c, i, x, k):
    """avgpool(x) * k = avgpool(x * k) for a rank-0 k."""
    f = lambda t: A.avg_pool2d(size, s, p, d, c, i, t)  # noqa: E731
    return Eq(A.multiply(f(x), k), f(A.multiply(x, k)), A.rank(k) == 0)


_POINTWISE = dict(
    size=_POOL, s=_STRIDES, p=_PADDING, d=_DILATION, c=_FALSE, i=_ANYBOOL,
    cs=Tup(lambda s: (1, 1)), cp=Tup(lambda s: (0, 0, 0, 0)), cd=_DILATION, g=_GROUPS,
    x="n g*c H W", w="g*o c 1 1",
)


def _pointwise_guard(A, cs, cp, w):
    return A.And(cs == A.tup(1, 1), cp == A.tup(0, 0, 0, 0), A.dim(2, w) == 1, A.dim(3, w) == 1)


@axiom(**_POINTWISE)
def conv1x1_avgpool(A, size, s, p, d, c, i, cs, cp, cd, g, x, w):
    """A 1×1 convolution (stride 1, no padding) mixes channels pixel by pixel, so it commutes
    with average pooling: conv(avgpool(x), w) = avgpool(conv(x, w))."""
    f = lambda t: A.avg_pool2d(size, s, p, d, c, i, t)  # noqa: E731
    h = lambda t: A.conv2d(cs, cp, cd, g, t, w)  # noqa: E731
    return Def(h(f(x)), f(h(x)), _pointwise_guard(A, cs, cp, w))


@axiom(size=_POOL, s=_STRIDES, p=Tup(lambda s: (0, 0, 0, 0)), d=_DILATION, c=_FALSE, x="n c H W")
def maxpool_relu(A, size, s, p, d, c, x):
    """maxpool(relu(x)) = relu(maxpool(x)) without padding (relu is monotone)."""
    f = lambda t: A.max_pool2d(size, s, p, d, c, t)  # noqa: E731
    return Eq(f(A.relu(x)), A.relu(f(x)), p == A.tup(0, 0, 0, 0))


# --- concat and split geometry ----------------------------------------------------------------
group("concat-split")
_ANYAXIS = Int(lambda s: s.int(0, 2))


@axiom(a="m n p", b="m n p", c="m n p", k=_ANYAXIS)
def concat_assoc(A, a, b, c, k):
    """[[a b] c] = [a [b c]]."""
    return Eq(A.concat(k, A.concat(k, a, b), c), A.concat(k, a, A.concat(k, b, c)))


@axiom(a="m n p", b="m n p", c="m n p", k=_ANYAXIS)
def concat_assoc_rev(A, a, b, c, k):
    """[a [b c]] = [[a b] c]."""
    return Eq(A.concat(k, a, A.concat(k, b, c)), A.concat(k, A.concat(k, a, b), c))


@axiom(a="m n", b="m p", c="q n", d="q p", i=Int(lambda s: 1), j=Int(lambda s: 0))
def concat_swap(A, a, b, c, d, i, j):
    """TASO's concat geometry: concatenating a 2×2 block matrix by rows then columns equals
    columns then rows: [[a b]; [c d]] = [[a; c] [b; d]] when the blocks line up."""
    return Def(
        A.concat(j, A.concat(i, a, b), A.concat(i, c, d)),
        A.concat(i, A.concat(j, a, c), A.concat(j, b, d)),
        A.And(i >= 0, j >= 0, i != j, A.dim(i, a) == A.dim(i, c)),
    )


@axiom(a="m n", b="m n", k=_AXIS, s=Int(lambda s: 0), e=Int(lambda s: s.dim("a", s.values["k"])))
def slice_concat_left(A, a, b, k, s, e):
    """split0(concat(a, b)) = a: the first part of [a b] cut at a's size."""
    return Def(A.slice(k, A.concat(k, a, b), s, e), a, A.And(s == 0, e == A.dim(k, a)))


@axiom(
    a="m n", b="m n", k=_AXIS, s=Int(lambda s: s.dim("a", s.values["k"])),
    e=Int(lambda s: s.dim("a", s.values["k"]) + s.dim("b", s.values["k"])),
)
def slice_concat_right(A, a, b, k, s, e):
    """split1(concat(a, b)) = b."""
    return Def(A.slice(k, A.concat(k, a, b), s, e), b, A.And(s == A.dim(k, a), e == A.dim(k, a) + A.dim(k, b)))


@axiom(x="m n", k=_AXIS, s=Int(lambda s: 0), e=Int(lambda s: s.dim("x", s.values["k"])))
def slice_full(A, x, k, s, e):
    """The part of x from 0 to its whole size is x."""
    return Def(A.slice(k, x, s, e), x, A.And(s == 0, e == A.dim(k, x)))


def _cut(var):
    """Ordered cut points along x's axis k for concat_slices / slice_slice (drawn once per
    sample): concat_slices uses a <= b = c <= e, slice_slice x[a:b][c:e] with c < e <= b - a."""

    def fn(s):
        if "_cuts" not in s.sizes:
            d = s.dim("x", s.values["k"])
            a, b, e = sorted(int(v) for v in s.rng.integers(0, d + 1, size=3))
            c = int(s.rng.integers(0, max(e - a, 1)))
            s.sizes["_cuts"] = {"a": a, "b": b, "e": e, "c": c, "c2": c, "e2": min(e - a, c + 1 + s.int(0, 1))}
        return s.sizes["_cuts"][var]

    return fn


@axiom(x="m N", k=_AXIS, a=Int(_cut("a")), b=Int(_cut("b")), c=Int(_cut("b")), e=Int(_cut("e")))
def concat_slices(A, x, k, a, b, c, e):
    """[x[a:b] x[b:e]] = x[a:e] (concat of split)."""
    return Def(A.concat(k, A.slice(k, x, a, b), A.slice(k, x, c, e)), A.slice(k, x, a, e), b == c)


@axiom(x="m N", k=_AXIS, a=Int(_cut("a")), b=Int(_cut("e")), c=Int(_cut("c2")), e=Int(_cut("e2")))
def slice_slice(A, x, k, a, b, c, e):
    """x[a:b][c:e] = x[a+c : a+e] (split of a split)."""
    return Def(A.slice(k, A.slice(k, x, a, b), c, e), A.slice(k, x, a + c, a + e))


@axiom(a="m n p", b="m n p", j=_ANYAXIS, k=_ANYAXIS, s=Int(lambda s: 0), e=Int(lambda s: 1))
def slice_concat_other(A, a, b, j, k, s, e):
    """Cutting [a b] along another axis cuts a and b: [a b][s:e on j] = [a[s:e] b[s:e]]."""
    return Def(
        A.slice(j, A.concat(k, a, b), s, e),
        A.concat(k, A.slice(j, a, s, e), A.slice(j, b, s, e)),
        A.And(j != k, j >= 0, k >= 0),
    )


# --- elementwise ops with concat and split -----------------------------------------------------
group("elementwise-concat")


@axiom(a="m n", b="m p", c="m n", d="m p", k=Int(lambda s: 1))
def add_concat(A, a, b, c, d, k):
    """[a b] + [c d] = [a+c b+d] for matching parts."""
    return Eq(
        A.add(A.concat(k, a, b), A.concat(k, c, d)),
        A.concat(k, A.add(a, c), A.add(b, d)),
        A.And(A.shp(a) == A.shp(c), A.shp(b) == A.shp(d)),
    )


@axiom(a="m n", b="m p", c="m n", d="m p", k=Int(lambda s: 1))
def concat_add(A, a, b, c, d, k):
    """[a+c b+d] = [a b] + [c d] for matching parts."""
    return Eq(
        A.concat(k, A.add(a, c), A.add(b, d)),
        A.add(A.concat(k, a, b), A.concat(k, c, d)),
        A.And(A.shp(a) == A.shp(c), A.shp(b) == A.shp(d)),
    )


@axiom(a="m n", b="m p", c="m n", d="m p", k=Int(lambda s: 1))
def mul_concat(A, a, b, c, d, k):
    """[a b] * [c d] = [a*c b*d] for matching parts."""
    return Eq(
        A.multiply(A.concat(k, a, b), A.concat(k, c, d)),
        A.concat(k, A.multiply(a, c), A.multiply(b, d)),
        A.And(A.shp(a) == A.shp(c), A.shp(b) == A.shp(d)),
    )


@axiom(a="m n", b="m p", c="m n", d="m p", k=Int(lambda s: 1))
def concat_mul(A, a, b, c, d, k):
    """[a*c b*d] = [a b] * [c d] for matching parts."""
    return Eq(
        A.concat(k, A.multiply(a, c), A.multiply(b, d)),
        A.multiply(A.concat(k, a, b), A.concat(k, c, d)),
        A.And(A.shp(a) == A.shp(c), A.shp(b) == A.shp(d)),
    )


@axiom(a="m n", b="m p", k=Int(lambda s: 1))
def relu_concat(A, a, b, k):
    """relu([a b]) = [relu(a) relu(b)]."""
    return Eq(A.relu(A.concat(k, a, b)), A.concat(k, A.relu(a), A.relu(b)))


@axiom(a="m n", b="m p", k=Int(lambda s: 1))
def concat_relu(A, a, b, k):
    """[relu(a) relu(b)] = relu([a b])."""
    return Eq(A.concat(k, A.relu(a), A.relu(b)), A.relu(A.concat(k, a, b)))


@axiom(a="m n", b="m p", k=Int(lambda s: 1), c="")
def scalar_concat(A, a, b, k, c):
    """[a b] * c = [a*c b*c] for a rank-0 c."""
    return Eq(A.multiply(A.concat(k, a, b), c), A.concat(k, A.multiply(a, c), A.multiply(b, c)), A.rank(c) == 0)


@axiom(a="m n", b="m p", k=Int(lambda s: 1), c="")
def concat_scalar(A, a, b, k, c):
    """[a*c b*c] = [a b] * c for a rank-0 c."""
    return Eq(A.concat(k, A.multiply(a, c), A.multiply(b, c)), A.multiply(A.concat(k, a, b), c), A.rank(c) == 0)


_SLICE = dict(k=_AXIS, s=Int(lambda s: s.int(0, 1)), e=Int(lambda s: s.int(2, 3)))


@axiom(x="M N", **_SLICE)
def slice_relu(A, x, k, s, e):
    """relu(x)[s:e] = relu(x[s:e])."""
    return Eq(A.slice(k, A.relu(x), s, e), A.relu(A.slice(k, x, s, e)))


@axiom(x="M N", **_SLICE)
def relu_slice(A, x, k, s, e):
    """relu(x[s:e]) = relu(x)[s:e]."""
    return Eq(A.relu(A.slice(k, x, s, e)), A.slice(k, A.relu(x), s, e))


def _ew_slice(f):
    def build(A, x, y, k, s, e):
        j = k - A.rank(x) + A.rank(y)  # the same axis of y, dims aligned from the right
        return Eq(
            A.slice(k, f(A, x, y), s, e),
            f(A, A.slice(k, x, s, e), A.slice(j, y, s, e)),
            A.And(k >= 0, A.rank(x) >= A.rank(y), j >= 0, A.dim(k, x) == A.dim(j, y)),
        )

    return build


_EW_SLICE = dict(x="* M N", y="* M N", **_SLICE)


@axiom(**_EW_SLICE)
def slice_add(A, x, y, k, s, e):
    """(x + y)[s:e] = x[s:e] + y[s:e] on an axis where y is not broadcast (y may have fewer
    dims, aligned from the right)."""
    return _ew_slice(lambda A, a, b: A.add(a, b))(A, x, y, k, s, e)


@axiom(**_EW_SLICE)
def slice_mul(A, x, y, k, s, e):
    """(x * y)[s:e] = x[s:e] * y[s:e] on an axis where y is not broadcast."""
    return _ew_slice(lambda A, a, b: A.multiply(a, b))(A, x, y, k, s, e)


# --- transpose: composition, identity, involution, distribution --------------------------------
group("transpose")


@axiom(x="m n p", p=_PERM, q=_PERM)
def transpose_compose(A, x, p, q):
    """transpose(transpose(x, p), q) = transpose(x, compose(p, q))."""
    return Def(A.transpose(q, A.transpose(p, x)), A.transpose(A.compose(p, q), x))


@axiom(x="m n p", p=Tup(lambda s: tuple(range(s.rank("x")))))
def transpose_identity(A, x, p):
    """transpose(x, identity) = x."""
    return Def(A.transpose(p, x), x, A.isid(p))


@axiom(x="m n p", p=_PERM)
def transpose_inverse(A, x, p):
    """transpose(transpose(x, p), inverse(p)) = x (involution when p is its own inverse)."""
    return Def(A.transpose(A.inverse(p), A.transpose(p, x)), x)


@axiom(x="m n p", p=_PERM)
def transpose_relu(A, x, p):
    """transpose(relu(x)) = relu(transpose(x))."""
    return Eq(A.transpose(p, A.relu(x)), A.relu(A.transpose(p, x)))


@axiom(x="m n p", y="m n p", p=_PERM)
def transpose_add(A, x, y, p):
    """transpose(x + y) = transpose(x) + transpose(y) for operands of one shape."""
    return Eq(A.transpose(p, A.add(x, y)), A.add(A.transpose(p, x), A.transpose(p, y)), A.shp(x) == A.shp(y))


@axiom(x="m n p", y="m n p", p=_PERM)
def transpose_mul(A, x, y, p):
    """transpose(x * y) = transpose(x) * transpose(y) for operands of one shape."""
    return Eq(
        A.transpose(p, A.multiply(x, y)), A.multiply(A.transpose(p, x), A.transpose(p, y)), A.shp(x) == A.shp(y)
    )


@axiom(x="m n p", k="", p=_PERM)
def transpose_scalar(A, x, k, p):
    """transpose(x * k) = transpose(x) * k for a rank-0 k."""
    return Eq(A.transpose(p, A.multiply(x, k)), A.multiply(A.transpose(p, x), k), A.rank(k) == 0)


@axiom(x="m n p", k="", p=_PERM)
def scalar_transpose(A, x, k, p):
    """transpose(x) * k = transpose(x * k) for a rank-0 k."""
    return Eq(A.multiply(A.transpose(p, x), k), A.transpose(p, A.multiply(x, k)), A.rank(k) == 0)


@axiom(x="m n p", p=_PERM)
def relu_transpose(A, x, p):
    """relu(transpose(x)) = transpose(relu(x))."""
    return Eq(A.relu(A.transpose(p, x)), A.transpose(p, A.relu(x)))


@axiom(a="* m n", b="* n p", p=Tup(lambda s: FUNCTIONS["last-two-swapped"](max(s.rank("a"), s.rank("b")))))
def transpose_matmul(A, a, b, p):
    """(a·b)ᵀ = bᵀ·aᵀ (ᵀ swaps the last two axes)."""
    return Eq(
        A.transpose(p, A.matmul(a, b)),
        A.matmul(A.transpose(A.lts(A.rank(b)), b), A.transpose(A.lts(A.rank(a)), a)),
        p == A.lts(A.rank(A.matmul(a, b))),
    )


@axiom(
    a="* n m", b="* p n", p=Tup(lambda s: FUNCTIONS["last-two-swapped"](s.rank("a"))),
    q=Tup(lambda s: FUNCTIONS["last-two-swapped"](s.rank("b"))),
)
def matmul_transposes(A, a, b, p, q):
    """aᵀ·bᵀ = (b·a)ᵀ."""
    return Eq(
        A.matmul(A.transpose(p, a), A.transpose(q, b)),
        A.transpose(A.lts(A.rank(A.matmul(b, a))), A.matmul(b, a)),
        A.And(p == A.lts(A.rank(a)), q == A.lts(A.rank(b))),
    )


@axiom(a="m n p", b="m n p", p=Tup(lambda s: s.perm(3)), k=_ANYAXIS)
def transpose_concat(A, a, b, p, k):
    """transpose([a b] on axis k) = [transpose(a) transpose(b)] on the axis k moves to."""
    return Def(
        A.transpose(p, A.concat(k, a, b)),
        A.concat(A.tnth(A.inverse(p), k), A.transpose(p, a), A.transpose(p, b)),
        k >= 0,
    )


@axiom(a="m n p", b="m n p", p=Tup(lambda s: s.perm(3)), j=_ANYAXIS)
def concat_transpose(A, a, b, p, j):
    """[transpose(a) transpose(b)] on axis j = transpose([a b] on axis p[j])."""
    return Def(
        A.concat(j, A.transpose(p, a), A.transpose(p, b)),
        A.transpose(p, A.concat(A.tnth(p, j), a, b)),
        j >= 0,
    )


# --- shape facts (what ops.infer says about result shapes) ------------------------------------
group("shapes")


@axiom(x="m n p", k=Int(lambda s: s.int(-3, -1)))
def dim_negative(A, x, k):
    """dim(k) for a negative k reads from the end: dim(k, x) = dim(k + rank, x)."""
    return Fact(A.dim(k, x) == A.dim(k + A.rank(x), x), guard=A.And(k < 0, k >= -A.rank(x)), patterns=[[A.dim(k, x)]])


@axiom(a="* m n", b="* m n")
def shape_ext(A, a, b):
    """Shapes with the same rank and the same dims are the same shape (ranks up to 6)."""
    same = [
        A.Implies(A.And(A.rank(a) == n, A.rank(b) == n, *[A.dim(i, a) == A.dim(i, b) for i in range(n)]), A.shp(a) == A.shp(b))
        for n in range(7)
    ]
    return Fact(A.And(*same), patterns=[[A.shp(a), A.shp(b)]])


@axiom(x="* m n")
def relu_shape(A, x):
    """relu keeps shape and dtype (⊥ included)."""
    return Fact(A.And(A.shp(A.relu(x)) == A.shp(x), A.dt(A.relu(x)) == A.dt(x)), patterns=[[A.relu(x)]])


def _ew_shape(f):
    def build(A, x, y):
        t = f(A, x, y)
        return Fact(
            A.And(
                A.rank(t) == A.max(A.rank(x), A.rank(y)),
                A.dt(t) == A.dt(x),
                A.dt(y) == A.dt(x),
                A.Implies(A.shp(x) == A.shp(y), A.shp(t) == A.shp(x)),
            ),
            defined=[t],
        )

    return build


def _ew_dims(f):
    def build(A, x, y, j):
        t = f(A, x, y)
        r = A.rank(t)
        jx, jy = j - r + A.rank(x), j - r + A.rank(y)  # the same axis of x and y (right-aligned)
        dx, dy = A.dim(jx, x), A.dim(jy, y)
        return Fact(
            A.dim(j, t) == A.If(jx >= 0, A.If(jy >= 0, A.max(dx, dy), dx), dy),
            defined=[t],
            guard=A.And(j >= 0, j < r),
            patterns=[[A.dim(j, t)]],
        )

    return build


@axiom(x="* m n", y="* m n", j=Int(lambda s: s.int(0, 3)))
def add_dims(A, x, y, j):
    """x + y broadcasts: each dim is the larger of the aligned dims (the other is 1 or equal)."""
    return _ew_dims(lambda A, a, b: A.add(a, b))(A, x, y, j)


@axiom(x="* m n", y="* m n", j=Int(lambda s: s.int(0, 3)))
def mul_dims(A, x, y, j):
    """x * y broadcasts like x + y."""
    return _ew_dims(lambda A, a, b: A.multiply(a, b))(A, x, y, j)


@axiom(x="* m n", y="* m n")
def add_shape(A, x, y):
    """x + y has the larger rank, the dtype of both, and x's shape when shapes agree."""
    return _ew_shape(lambda A, a, b: A.add(a, b))(A, x, y)


@axiom(x="* m n", y="* m n")
def mul_shape(A, x, y):
    """x * y has the larger rank, the dtype of both, and x's shape when shapes agree."""
    return _ew_shape(lambda A, a, b: A.multiply(a, b))(A, x, y)


@axiom(a="* m n", b="* n p")
def matmul_shape(A, a, b):
    """a·b: rank max(rank a, rank b) >= 2, rows of a, columns of b, inner dims agree."""
    t = A.matmul(a, b)
    ra, rb, rt = A.rank(a), A.rank(b), A.rank(t)
    return Fact(
        A.And(
            rt == A.max(ra, rb), ra >= 2, rb >= 2,
            A.dim(ra - 1, a) == A.dim(rb - 2, b),
            A.dim(rt - 1, t) == A.dim(rb - 1, b),
            A.dim(rt - 2, t) == A.dim(ra - 2, a),
            A.dt(t) == A.dt(a), A.dt(b) == A.dt(a),
        ),
        defined=[t],
    )


@axiom(s=_STRIDES, p=_PADDING, d=_DILATION, g=_GROUPS, x=_X, w=_W)
def conv_shape(A, s, p, d, g, x, w):
    """conv2d: NCHW in and out, batch of x, output channels of w, channels of x = groups × w's."""
    t = A.conv2d(s, p, d, g, x, w)
    return Fact(
        A.And(
            A.rank(t) == 4, A.rank(x) == 4, A.rank(w) == 4,
            A.dim(0, t) == A.dim(0, x), A.dim(1, t) == A.dim(0, w),
            A.dim(1, x) == g * A.dim(1, w),
            A.dt(t) == A.dt(x), A.dt(w) == A.dt(x),
            A.tlen(p) == 4, A.tnth(p, 0) >= 0, A.tnth(p, 1) >= 0, A.tnth(p, 2) >= 0, A.tnth(p, 3) >= 0,
        ),
        defined=[t],
    )


@axiom(size=_POOL, s=_STRIDES, p=_PADDING, d=_DILATION, c=_FALSE, x="n c H W")
def maxpool_shape(A, size, s, p, d, c, x):
    """max_pool2d keeps rank 4, batch, channels and dtype."""
    t = A.max_pool2d(size, s, p, d, c, x)
    return Fact(
        A.And(A.rank(t) == 4, A.rank(x) == 4, A.dim(0, t) == A.dim(0, x), A.dim(1, t) == A.dim(1, x), A.dt(t) == A.dt(x)),
        defined=[t],
    )


@axiom(size=_POOL, s=_STRIDES, p=_PADDING, d=_DILATION, c=_FALSE, i=_ANYBOOL, x="n c H W")
def avgpool_shape(A, size, s, p, d, c, i, x):
    """avg_pool2d keeps rank 4, batch, channels and dtype."""
    t = A.avg_pool2d(size, s, p, d, c, i, x)
    return Fact(
        A.And(A.rank(t) == 4, A.rank(x) == 4, A.dim(0, t) == A.dim(0, x), A.dim(1, t) == A.dim(1, x), A.dt(t) == A.dt(x)),
        defined=[t],
    )


@axiom(a="m n", b="m p", k=Int(lambda s: 1))
def concat_shape(A, a, b, k):
    """concat: one rank and dtype, sizes add up on the (in-range) axis."""
    t = A.concat(k, a, b)
    return Fact(
        A.And(
            A.rank(t) == A.rank(a), A.rank(b) == A.rank(a), A.dt(t) == A.dt(a), A.dt(b) == A.dt(a),
            k >= -A.rank(a), k < A.rank(a),
            A.dim(k, t) == A.dim(k, a) + A.dim(k, b),
        ),
        defined=[t],
    )


@axiom(a="m n p", b="m n p", k=_ANYAXIS, j=_ANYAXIS)
def concat_shape_off_axis(A, a, b, k, j):
    """concat: a, b and the result agree on every other axis."""
    t = A.concat(k, a, b)
    return Fact(
        A.And(A.dim(j, t) == A.dim(j, a), A.dim(j, b) == A.dim(j, a)),
        defined=[t],
        guard=A.And(k >= 0, j >= 0, j != k, j < A.rank(a)),
        patterns=[[A.dim(j, t)], [t, A.dim(j, a)], [t, A.dim(j, b)]],
    )


@axiom(x="m N", k=_AXIS, a=Int(lambda s: s.int(0, 2)), b=Int(lambda s: s.int(2, 5)))
def slice_shape(A, x, k, a, b):
    """slice(k, x, a, b): 0 <= a < b <= dim(k, x); b - a on the axis; rank and dtype of x."""
    t = A.slice(k, x, a, b)
    return Fact(
        A.And(
            A.rank(t) == A.rank(x), A.dt(t) == A.dt(x),
            k >= -A.rank(x), k < A.rank(x),
            0 <= a, a < b, b <= A.dim(k, x), A.dim(k, t) == b - a,
        ),
        defined=[t],
    )


@axiom(x="m N", k=_AXIS, j=_AXIS, a=Int(lambda s: s.int(0, 2)), b=Int(lambda s: s.int(2, 5)))
def slice_shape_off_axis(A, x, k, j, a, b):
    """slice keeps every other axis."""
    t = A.slice(k, x, a, b)
    return Fact(
        A.dim(j, t) == A.dim(j, x),
        defined=[t],
        guard=A.And(k >= 0, j >= 0, j != k, j < A.rank(x)),
        patterns=[[A.dim(j, t)]],
    )


@axiom(x="m n p", p=_PERM, j=_ANYAXIS)
def transpose_shape(A, x, p, j):
    """transpose: same rank and dtype; axis j of the result is axis p[j] of x."""
    t = A.transpose(p, x)
    return Fact(
        A.And(A.rank(t) == A.rank(x), A.tlen(p) == A.rank(x), A.dt(t) == A.dt(x), A.dim(j, t) == A.dim(A.tnth(p, j), x)),
        defined=[t],
        guard=A.And(j >= 0, j < A.rank(x)),
        patterns=[[A.dim(j, t)]],
    )


@axiom(x="m n p", p=_PERM)
def transpose_rank(A, x, p):
    """transpose keeps rank and dtype."""
    t = A.transpose(p, x)
    return Fact(A.And(A.rank(t) == A.rank(x), A.tlen(p) == A.rank(x), A.dt(t) == A.dt(x)), defined=[t])


@axiom(x="m n p", w=Tup(lambda s: s.pads(6, 0, 2)), v=_ZERO, j=_ANYAXIS)
def pad_shape(A, x, w, v, j):
    """pad: dim j grows by pad_width[2j] + pad_width[2j+1]."""
    t = A.pad(w, v, x)
    return Fact(
        A.And(A.rank(t) == A.rank(x), A.tlen(w) == 2 * A.rank(x), A.dt(t) == A.dt(x),
              A.dim(j, t) == A.dim(j, x) + A.tnth(w, 2 * j) + A.tnth(w, 2 * j + 1)),
        defined=[t],
        guard=A.And(j >= 0, j < A.rank(x)),
        patterns=[[A.dim(j, t)]],
    )


@axiom(v=_VALUE, d=_DT)
def scalar_shape(A, v, d):
    """A scalar has rank 0 and the given dtype."""
    t = A.scalar(v, d)
    return Fact(A.And(A.rank(t) == 0, A.dt(t) == d), defined=[t])


# -- the translator's encodings, checked numerically ------------------------------------------


def _check_split_encoding(rng) -> str | None:
    """Part j of split(x, indices, axis) is slice(axis, x, c_j, c_j+1) with cut points
    0, indices..., dim(axis, x), whenever the split is defined."""
    alg = Numeric(rng)
    shape = tuple(int(d) for d in rng.integers(1, 6, size=int(rng.integers(1, 4))))
    x = rng.standard_normal(shape)
    axis = int(rng.integers(-len(shape), len(shape)))
    d = shape[axis]
    n = int(rng.integers(1, 4))
    indices = tuple(sorted(int(v) for v in rng.integers(0, d + 1, size=n)))
    try:
        parts = ops.evaluate("split", [x], {"indices": indices, "axis": axis % len(shape)})
        ops.infer("split", [ops.TensorType(shape, "float64")], {"indices": indices, "axis": axis % len(shape)})
    except _CATCH:
        return None
    cuts = (0,) + indices + (alg.dim(axis, x),)
    for j, part in enumerate(parts):
        s = alg.slice(axis, x, cuts[j], cuts[j + 1])
        if s is None or s.shape != part.shape or not np.array_equal(s, part):
            return f"split{shape} indices={indices} axis={axis}: part {j} is not slice({cuts[j]}, {cuts[j + 1]})"
    return "ok"


def _check_concat_encoding(rng) -> str | None:
    """An n-ary concat is the left-nested binary one (⊥ exactly when it is)."""
    alg = Numeric(rng)
    rank = int(rng.integers(1, 4))
    base = [int(d) for d in rng.integers(1, 4, size=rank)]
    axis = int(rng.integers(0, rank))
    xs = []
    for _ in range(int(rng.integers(2, 5))):
        shape = list(base)
        shape[axis] = int(rng.integers(1, 4))
        if rng.random() < 0.15:
            shape[int(rng.integers(0, rank))] += 1
        xs.append(rng.standard_normal(shape))
    types = [ops.TensorType(x.shape, "float64") for x in xs]
    try:
        ops.infer("concat", types, {"axis": axis})
        whole = ops.evaluate("concat", xs, {"axis": axis})[0]
    except _CATCH:
        whole = None
    nested = alg.concat(axis, *xs)
    if (whole is None) != (nested is None) or (whole is not None and not np.array_equal(whole, nested)):
        return f"concat of {[x.shape for x in xs]} on axis {axis}: n-ary and nested binary differ"
    return "ok" if whole is not None else None


ENCODINGS = {"split-as-slices": _check_split_encoding, "concat-as-binary": _check_concat_encoding}


def check_encodings(trials: int = 60, seed: int = 0) -> list[AxiomCheck]:
    out = []
    for name, fn in ENCODINGS.items():
        rng = np.random.default_rng([seed, zlib.crc32(name.encode())])
        exercised, message = 0, ""
        for _ in range(trials):
            r = fn(rng)
            if r == "ok":
                exercised += 1
            elif r is not None:
                message = r
                break
        out.append(AxiomCheck(name, not message and exercised > 0, exercised, trials, message))
    return out


def check_axioms(axioms: list[Axiom] | None = None, trials: int = 60, seed: int = 0) -> list[AxiomCheck]:
    """Check every axiom numerically (and, when ``axioms`` is None, the translator's
    encodings); one :class:`AxiomCheck` per axiom, ``ok`` False with a refutation when it fails."""
    results = [a.check(trials, seed) for a in (AXIOMS if axioms is None else axioms)]
    if axioms is None:
        results += check_encodings(trials, seed)
    return results


class AxiomError(RuntimeError):
    """An axiom failed its numeric check."""


_CHECKED: dict = {}


DEFAULT_TRIALS = 300


def ensure_checked(trials: int = DEFAULT_TRIALS, seed: int = 0) -> None:
    """Run :func:`check_axioms` once per process; raise :class:`AxiomError` if any fails."""
    key = (trials, seed, len(AXIOMS))
    if key not in _CHECKED:
        _CHECKED[key] = [r for r in check_axioms(None, trials, seed) if not r.ok]
    bad = _CHECKED[key]
    if bad:
        raise AxiomError("axioms fail their numeric check: " + "; ".join(f"{r.name}: {r.message}" for r in bad))


def formulas(alg: Z3Algebra, axioms: list[Axiom] | None = None) -> list:
    """The background theory and every axiom as Z3 formulas."""
    return alg.background() + [a.formula(alg) for a in (AXIOMS if axioms is None else axioms)]
