"""Looking for a concrete counterexample to a rule the prover could not prove."""

from __future__ import annotations

import time
from dataclasses import dataclass

import numpy as np

from tvm_taso.rewrite.rule import Rule
from tvm_taso.verify.algebra import REJECTIONS, EvaluationError, Numeric
from tvm_taso.verify.soundness import describe
from tvm_taso.verify.translate import Unsupported, translate


class _Draw(Numeric):
    """The numeric algebra with the rule's variables drawn at random: small tensors of rank
    1-4 (dims 1-3, mostly 2-3), small ints, permutations or short tuples."""

    def __init__(self, rng, dim: int | None = None):
        super().__init__(rng)
        self.rng = rng
        self.same_dim = dim  # every tensor dim equal to it (shapes then often fit together), or random
        self.values: dict = {}

    def var(self, name: str, sort: str):
        r = self.rng
        if sort == "T" and self.same_dim is not None:
            rank = int(r.choice((0, 1, 2, 2, 3, 4, 4, 4)))
            shape = tuple(1 if r.random() < 0.15 else self.same_dim for _ in range(rank))
            v = r.standard_normal(shape)
        elif sort == "T":
            shape = tuple(int(r.choice((1, 2, 2, 3, 3))) for _ in range(int(r.choice((1, 2, 2, 3, 4, 4)))))
            v = r.standard_normal(shape)
        elif sort == "Int":
            v = int(r.integers(0, 4))
        elif sort == "Real":
            v = float(r.choice((0.0, 1.0, 0.5, -2.0)))
        elif sort == "Bool":
            v = bool(r.integers(0, 2))
        else:  # Tup
            kind = int(r.integers(0, 4))
            if kind == 0:
                v = tuple(int(i) for i in r.permutation(int(r.integers(2, 5))))
            elif kind == 1:
                v = (1, 1)
            elif kind == 2:
                v = tuple(int(i) for i in r.integers(1, 3, size=2))
            else:
                v = tuple(int(i) for i in r.integers(0, 2, size=4))
        self.values[name] = v
        return v


@dataclass
class Sample:
    """What drawing random instances of a rule showed (:func:`sample`)."""

    fired: int = 0  # instances where the rule fires: all of them agreed, unless counterexample
    drawn: int = 0
    counterexample: str | None = None
    unsupported: str | None = None  # the rule uses something the algebra does not model
    # why the other draws did not fire
    undefined: int = 0  # the source or target rejects its operands, or a tuple is out of range
    conditions_false: int = 0
    types_differ: int = 0  # source defined, conditions true, target of another shape or dtype


def sample(rule: Rule, seconds: float = 2.0, seed: int = 0, tries: int = 20000, enough: int | None = None,
           equal_dims: bool = False) -> Sample:
    """Draw random values of the rule's variables (small tensors, ints, tuples) and compare
    source and target wherever the rule fires (reference semantics of :mod:`tvm_taso.ir.ops`);
    stops at the first counterexample, after ``enough`` instances that fired, ``tries`` draws or
    ``seconds``. With ``equal_dims``, every other draw gives its tensors one dim size (1 to 4;
    a dim is 1 now and then) and ranks 0 to 4, so that the operands of multi-op patterns fit
    together far more often."""
    rng = np.random.default_rng(seed)
    t0 = time.perf_counter()
    out = Sample()
    for k in range(tries):
        if time.perf_counter() - t0 > seconds or (enough is not None and out.fired >= enough):
            break
        out.drawn += 1
        alg = _Draw(rng, int(rng.choice((1, 2, 2, 3, 3, 4))) if equal_dims and k % 2 else None)
        try:
            tr = translate(rule, alg)
            if len(tr.src) != len(tr.dst):
                out.unsupported = f"{len(tr.src)} source outputs but {len(tr.dst)} target outputs"
                return out
            if any(t is None for t in tr.defined) or not all(tr.canon):
                out.undefined += 1
                continue
            if not all(tr.conds):
                out.conditions_false += 1
                continue
        except Unsupported as err:
            out.unsupported = str(err) or "outside the verifier's algebra"
            return out
        except (EvaluationError, *REJECTIONS):
            out.undefined += 1
            continue
        if any(a.shape != b.shape or a.dtype != b.dtype for a, b in zip(tr.src, tr.dst)):
            out.types_differ += 1  # the matcher would not fire
            continue
        out.fired += 1
        for i, (a, b) in enumerate(zip(tr.src, tr.dst)):
            scale = max(1.0, float(np.nanmax(np.abs(a), initial=0.0)))
            if not np.allclose(a, b, rtol=1e-7, atol=1e-7 * scale, equal_nan=True):
                out.counterexample = (f"output {i} differs by {float(np.nanmax(np.abs(a - b))):.3g} with "
                                      + describe(alg.values))
                return out
    return out


def refute(rule: Rule, seconds: float = 2.0, seed: int = 0, tries: int = 20000) -> str | None:
    """Look for a concrete counterexample: random values of the rule's variables where the rule
    fires (source defined, conditions true, target defined with the source's types) and the
    target computes something else (reference semantics of :mod:`tvm_taso.ir.ops`). A description
    of the first one found, or None."""
    return sample(rule, seconds, seed, tries).counterexample
