"""Looking for a concrete counterexample to a rule the prover could not prove."""

from __future__ import annotations

import time

import numpy as np

from tvm_taso.rewrite.rule import Rule
from tvm_taso.verify.algebra import REJECTIONS, EvaluationError, Numeric
from tvm_taso.verify.soundness import describe
from tvm_taso.verify.translate import Unsupported, translate


class _Draw(Numeric):
    """The numeric algebra with the rule's variables drawn at random: small tensors of rank
    1-4 (dims 1-3, mostly 2-3), small ints, permutations or short tuples."""

    def __init__(self, rng):
        super().__init__(rng)
        self.rng = rng
        self.values: dict = {}

    def var(self, name: str, sort: str):
        r = self.rng
        if sort == "T":
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


def refute(rule: Rule, seconds: float = 2.0, seed: int = 0, tries: int = 20000) -> str | None:
    """Look for a concrete counterexample: random values of the rule's variables where the rule
    fires (source defined, conditions true, target defined with the source's types) and the
    target computes something else (reference semantics of :mod:`tvm_taso.ir.ops`). A description
    of the first one found, or None."""
    rng = np.random.default_rng(seed)
    t0 = time.perf_counter()
    for _ in range(tries):
        if time.perf_counter() - t0 > seconds:
            return None
        alg = _Draw(rng)
        try:
            tr = translate(rule, alg)
            if len(tr.src) != len(tr.dst):
                return None
            if any(t is None for t in tr.defined) or not all(tr.canon) or not all(tr.conds):
                continue
        except Unsupported:
            return None
        except (EvaluationError, *REJECTIONS):
            continue
        for i, (a, b) in enumerate(zip(tr.src, tr.dst)):
            if a.shape != b.shape or a.dtype != b.dtype:
                break  # the matcher would not fire
        else:
            for i, (a, b) in enumerate(zip(tr.src, tr.dst)):
                scale = max(1.0, float(np.nanmax(np.abs(a), initial=0.0)))
                if not np.allclose(a, b, rtol=1e-7, atol=1e-7 * scale, equal_nan=True):
                    return f"output {i} differs by {float(np.nanmax(np.abs(a - b))):.3g} with " + describe(alg.values)
    return None

