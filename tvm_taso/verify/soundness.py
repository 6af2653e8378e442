"""The numeric check that the axioms hold in the op table's semantics, run before any proof.

:func:`check_axioms` evaluates every axiom on random small tensors, with the reference semantics
of :mod:`tvm_taso.ir.ops` (``ops.infer`` decides ⊥, ``ops.evaluate`` computes values; see
:class:`~tvm_taso.verify.algebra.Numeric`), half of the draws shaped to fit and half perturbed
(broadcast dims, wrong sizes, ⊥ operands, off-by-one attributes) so that the ⊥ cases are tested
too; it checks the translator's encodings of ``split`` and ``concat`` the same way. A wrong
axiom is reported with the values that refute it, and the verifier refuses to run on axioms
that fail.
"""

from __future__ import annotations

import math
import zlib
from dataclasses import dataclass

import numpy as np

from tvm_taso.ir import ops
from tvm_taso.verify.algebra import REJECTIONS, EvaluationError, Numeric
from tvm_taso.verify.axioms import AXIOMS
from tvm_taso.verify.statements import T, Axiom, Bool, DType, Int, Real, Tup


@dataclass
class AxiomCheck:
    name: str
    ok: bool
    exercised: int  # draws that met the premise (guard and definedness) and so tested the conclusion
    trials: int
    message: str


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


def check_axiom(axiom: Axiom, trials: int = 60, seed: int = 0, min_exercised: int = 4) -> AxiomCheck:
    """Evaluate the axiom on ``trials`` random draws with the reference semantics."""
    rng = np.random.default_rng([seed, zlib.crc32(axiom.name.encode())])
    exercised = skipped = 0
    tensors = [p for p in axiom.params if isinstance(axiom.specs[p], T)]
    others = [p for p in axiom.params if p not in tensors]
    for trial in range(trials):
        perturb = trial % 2 == 1
        s = Sampler(rng)
        for p in tensors:
            s.values[p] = s.tensor(axiom.specs[p].template, perturb)
        for p in others:
            spec = axiom.specs[p]
            value = spec.fn(s) if callable(spec.fn) else spec.fn
            s.values[p] = s.perturb(spec, value) if perturb else value
        alg = Numeric(rng)
        try:
            st = axiom.statement(alg, s.values)
            verdict = _judge(st, alg)
        except EvaluationError as err:  # ops.infer accepted what ops.evaluate cannot compute
            skipped += 1
            if skipped > trials // 4:
                return AxiomCheck(axiom.name, False, exercised, trial + 1, f"ops.evaluate failed {skipped} times: {err}")
            continue
        if verdict is True:
            exercised += 1
        elif isinstance(verdict, str):
            return AxiomCheck(axiom.name, False, exercised, trial + 1, f"{verdict}; with {describe(s.values)}")
    if exercised < min_exercised:
        return AxiomCheck(
            axiom.name, False, exercised, trials, f"only {exercised} of {trials} draws met the premise (sampler too loose)"
        )
    return AxiomCheck(axiom.name, True, exercised, trials, "")


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


def describe(values: dict) -> str:
    """Values of variables as text, tensors by shape (a refutation's message)."""
    parts = []
    for k, v in values.items():
        if isinstance(v, np.ndarray):
            parts.append(f"{k}: tensor{list(v.shape)}")
        elif v is None:
            parts.append(f"{k}: ⊥")
        else:
            parts.append(f"{k}={v!r}")
    return ", ".join(parts)


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
    except REJECTIONS:
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
    except REJECTIONS:
        whole = None
    nested = alg.concat(axis, *xs)
    if (whole is None) != (nested is None) or (whole is not None and not np.array_equal(whole, nested)):
        return f"concat of {[x.shape for x in xs]} on axis {axis}: n-ary and nested binary differ"
    return "ok" if whole is not None else None


ENCODINGS = {"split-as-slices": _check_split_encoding, "concat-as-binary": _check_concat_encoding}


def check_encodings(trials: int = 60, seed: int = 0) -> list[AxiomCheck]:
    """Check each of :data:`ENCODINGS` on ``trials`` random draws."""
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
    results = [check_axiom(a, trials, seed) for a in (AXIOMS if axioms is None else axioms)]
    if axioms is None:
        results += check_encodings(trials, seed)
    return results


class AxiomError(RuntimeError):
    """An axiom failed its numeric check."""

    @classmethod
    def of(cls, failed: list[AxiomCheck]) -> AxiomError:
        return cls("axioms fail their numeric check: " + "; ".join(f"{r.name}: {r.message}" for r in failed))


_CHECKED: dict = {}

DEFAULT_TRIALS = 300


def ensure_checked(trials: int = DEFAULT_TRIALS, seed: int = 0) -> None:
    """Run :func:`check_axioms` once per process; raise :class:`AxiomError` if any fails."""
    key = (trials, seed, len(AXIOMS))
    if key not in _CHECKED:
        _CHECKED[key] = [r for r in check_axioms(None, trials, seed) if not r.ok]
    if _CHECKED[key]:
        raise AxiomError.of(_CHECKED[key])
