"""The verifier's model of the op table, as two algebras with the same method names.

**The model.** Tensors are an uninterpreted sort ``T`` with one extra element ``bot`` (⊥): the
value of an op application that :mod:`tvm_taso.ir.ops` rejects (bad shapes or attributes). Every
op is total and strict (⊥ in, ⊥ out), so the real semantics of the op table *is* a model, and
an axiom is sound exactly when it holds there — including its ⊥ cases. A tensor's shape is
``shp(t)`` (an uninterpreted ``Shape``) read through ``rank`` and ``dim`` (``dim(k, t)`` indexes
like Python, ``k`` may be negative), its dtype is ``dt(t)``. Tuple attributes (strides, padding,
permutations) are a Z3 datatype ``Tup`` of ints; ``compose``/``inverse``/``identity?``/
``last-two-swapped`` are the rule language's functions, left uninterpreted here (the verifier adds
their values on the concrete tuples a rule mentions, computed by :data:`tvm_taso.rewrite.rule.FUNCTIONS`).
The op table says which ops are modeled and with which attribute sorts (``OpSpec.algebra``).

The rule language's ``split`` is encoded as slices: part ``j`` of ``split(x, indices, axis k)``
is ``slice(k, x, c_j, c_j+1)`` with cut points ``0, indices..., dim(k, x)`` (TASO's ``split0``/
``split1`` are the two slices of a one-index split), and an n-ary ``concat`` is a left-nested
binary one. :data:`tvm_taso.verify.soundness.ENCODINGS` checks both encodings numerically.

:class:`Numeric` computes on concrete values with the op table's reference semantics (the
numeric check of the axioms, the search for counterexamples); :class:`Z3Algebra` builds Z3 terms
(the proofs).
"""

from __future__ import annotations

import numpy as np

from tvm_taso.ir import ops
from tvm_taso.rewrite.rule import FUNCTIONS

MAX_TUPLE = 10  # longest tuple attribute the algebra represents (pad_width of a rank-5 tensor)


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


# How the op table rejects an application (the value is ⊥).
REJECTIONS = (ops.OpError, KeyError, IndexError, TypeError, ValueError, ZeroDivisionError)


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
        except REJECTIONS:
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

    def merge_groups(self, groups, factor, w):
        return self._op("merge_groups", [w], dict(groups=groups, factor=factor))

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
        except REJECTIONS:
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
        except REJECTIONS:
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
# Function symbols of the algebra: name -> (attribute sorts, number of tensor operands), from
# the op table; an n-ary concat is a left-nested binary one.
SIGNATURES = {
    spec.algebra.function: (spec.algebra.sorts, 2 if spec.arity is None else spec.arity)
    for spec in ops.OPS.values()
    if spec.algebra is not None and spec.algebra.function is not None
}


class Z3Algebra:
    """The algebra on Z3 terms: the same method names as :class:`Numeric`."""

    def __init__(self):
        try:
            import z3
        except ImportError:  # pragma: no cover - depends on the install
            raise VerifierUnavailable("the verifier needs z3: install it with pip install 'tvm-taso[verify]'") from None
        # Z3 takes SIGINT for itself while it solves (it cancels the check, which then answers
        # "unknown"), so a user's Ctrl-C during a proof was swallowed: leave it to Python, which
        # raises KeyboardInterrupt once the check returns (within the rule's budget)
        z3.set_param("ctrl_c", False)
        self.z3 = z3
        self.ctx = z3.main_ctx()  # where the axioms and rules are built (the prover copies them)
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

    def merge_groups(self, groups, factor, w):
        return self.fns["merge_groups"](groups, factor, w)

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
