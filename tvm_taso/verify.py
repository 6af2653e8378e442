"""The rule verifier: prove each rule from the operator properties of :mod:`tvm_taso.axioms`.

A rule is translated into Z3 terms over the algebra (tensor variables become constants of sort
``T``, attribute variables Ints/tuples/reals, ``split`` becomes slices, ``(dim ?a k)`` the
``dim`` function) and proved output by output: ``src_i != dst_i`` must be unsatisfiable
together with the axioms and what is known whenever the rule fires —

- its conditions (one that the algebra cannot express is left out, which only weakens what the
  proof may use);
- every value of the source is defined (it is in the graph), and so is every value of the target
  (the matcher builds the target only when each op accepts its operands:
  ``tvm_taso.match.apply``), i.e. ``t != bot`` for each of their subterms;
- source axes are non-negative (``Graph.add`` canonicalizes them);
- the values of ``compose``/``inverse``/``identity?``/``last-two-swapped`` on the concrete tuples
  the rule mentions, computed by the rule language's own functions.

Statuses: ``proved`` (unsat for every output); ``failed`` (the solver ran out of axioms to
instantiate without a proof, or Z3 found a model where the sides differ: the axioms do not imply
the rule — then :func:`refute` looks for a concrete counterexample on random small tensors, and
the reason says ``counterexample: ...`` when it finds one, which means the rule is wrong);
``unknown`` (timeout); ``unsupported`` (an op or attribute outside the algebra, e.g.
``batch_norm``, ``reshape``; such rules keep their proof status). The axioms' numeric check runs
first; the verifier refuses to prove anything from an axiom that fails it.

Z3 runs E-matching only (no model-based instantiation: on an unprovable rule it can run for
minutes past its timeout), in a fresh non-incremental solver per output.
"""

from __future__ import annotations

import json
import logging
import os
import re
import sys
import tempfile
import time
from collections import Counter
from dataclasses import asdict, dataclass, field
from pathlib import Path

from . import axioms as ax
from . import ops
from .rule import FUNCTIONS, Call, Get, Op, Rule, Scalar, Tup, Var

log = logging.getLogger(__name__)

INSTALL_HINT = "install the verifier with pip install 'tvm-taso[verify]'"
STATUSES = ("proved", "failed", "unknown", "unsupported")


class Unsupported(Exception):
    """The rule uses something the algebra does not model."""


@dataclass
class VerifyResult:
    name: str
    status: str  # proved | failed | unknown | unsupported
    seconds: float
    reason: str = ""
    where: str = ""
    provenance: str = ""
    proof: str = ""  # the proof status the rule file gave
    dropped: list = field(default_factory=list)  # conditions the algebra could not express


def z3_available() -> bool:
    try:
        import z3  # noqa: F401
    except ImportError:
        return False
    return True


# -- translation ------------------------------------------------------------------------------

FIXED = "fixed"  # must have the default value
IGNORED = "ignored"  # does not change the value computed

# Each modeled op: attribute name -> sort (or FIXED / IGNORED), in the algebra's argument order.
ATTRS = {
    "add": {},
    "multiply": {},
    "relu": {},
    "matmul": {"out_dtype": FIXED},
    "conv2d": {
        "strides": "Tup", "padding": "Tup", "dilation": "Tup", "groups": "Int",
        "data_layout": FIXED, "kernel_layout": FIXED, "out_layout": FIXED, "out_dtype": FIXED,
    },
    "max_pool2d": {
        "pool_size": "Tup", "strides": "Tup", "padding": "Tup", "dilation": "Tup", "ceil_mode": "Bool",
        "count_include_pad": IGNORED, "layout": FIXED, "out_layout": FIXED,
    },
    "avg_pool2d": {
        "pool_size": "Tup", "strides": "Tup", "padding": "Tup", "dilation": "Tup", "ceil_mode": "Bool",
        "count_include_pad": "Bool", "layout": FIXED, "out_layout": FIXED,
    },
    "concat": {"axis": "Int"},
    "split": {"indices": "Ints", "axis": "Int"},
    "permute_dims": {"axes": "Tup"},
    "pad": {"pad_width": "Tup", "pad_mode": FIXED, "pad_value": "Real"},
}
MODELED = tuple(ATTRS)


@dataclass
class Translation:
    src: list  # terms, one per source output
    dst: list
    conds: list  # the rule's conditions the algebra can express
    canon: list  # source axes are non-negative
    defined: list  # every tensor subterm of source and target (and the tensor variables)
    tuples: set  # concrete tuples the rule mentions
    dropped: list  # conditions left out, with the reason

    def facts(self, alg) -> list:
        """What holds whenever the rule fires, as Z3 formulas."""
        return self.conds + self.canon + [t != alg.bot for t in self.defined] + _tuple_facts(alg, self.tuples)


class _Translator:
    def __init__(self, alg, rule: Rule):
        self.alg = alg
        self.rule = rule
        self.tensors: dict[str, object] = {}
        self.attrs: dict[str, tuple[str, object]] = {}  # name -> (sort, const)
        self.tuples: set[tuple] = set()  # concrete tuples seen
        self.defined: list = []
        self.facts: list = []
        self.fresh = 0

    # tensors
    def tvar(self, name: str):
        if name not in self.tensors:
            self.tensors[name] = self.alg.var("t." + name, "T")
        return self.tensors[name]

    def tensor(self, p, in_src: bool) -> list:
        if isinstance(p, Var):
            return [self.tvar(p.name)]
        if isinstance(p, Scalar):
            like = self.tvar(p.like.name)
            return [self.note(self.alg.scalar(self.attr(p.value, "Real"), self.alg.dt(like)))]
        if isinstance(p, Get):
            parts = self.tensor(p.expr, in_src)
            if p.index >= len(parts):
                raise Unsupported(f"(get ... {p.index}) of an op with {len(parts)} outputs")
            return [parts[p.index]]
        if not isinstance(p, Op):
            raise Unsupported(f"pattern {p!r}")
        if p.op not in ATTRS:
            raise Unsupported(f"op {p.op} is not in the verifier's algebra")
        args = []
        for a in p.args:
            refs = self.tensor(a, in_src)
            if len(refs) != 1:
                raise Unsupported(f"a {len(refs)}-output value used as an operand of {p.op}")
            args.append(refs[0])
        at = self.op_attrs(p, in_src)
        A = self.alg
        if p.op in ("add", "multiply", "relu", "matmul"):
            return [self.note(getattr(A, p.op)(*args))]
        if p.op == "conv2d":
            return [self.note(A.conv2d(at["strides"], at["padding"], at["dilation"], at["groups"], *args))]
        if p.op in ("max_pool2d", "avg_pool2d"):
            window = [at["pool_size"], at["strides"], at["padding"], at["dilation"], at["ceil_mode"]]
            if p.op == "avg_pool2d":
                window.append(at["count_include_pad"])
            return [self.note(getattr(A, p.op)(*window, args[0]))]
        if p.op == "concat":
            if in_src:
                self.facts.append(at["axis"] >= 0)
            if len(args) == 1:
                raise Unsupported("concat of one operand")
            out = args[0]
            for x in args[1:]:
                out = self.note(A.concat(at["axis"], out, x))
            return [out]
        if p.op == "split":
            k, x = at["axis"], args[0]
            if in_src:
                self.facts.append(k >= 0)
            cuts = [0] + list(at["indices"]) + [A.dim(k, x)]
            return [self.note(A.slice(k, x, a, b)) for a, b in zip(cuts, cuts[1:])]
        if p.op == "permute_dims":
            return [self.note(A.transpose(at["axes"], args[0]))]
        if p.op == "pad":
            return [self.note(A.pad(at["pad_width"], at["pad_value"], args[0]))]
        raise Unsupported(f"op {p.op}")  # pragma: no cover

    def note(self, term):
        self.defined.append(term)
        return term

    def op_attrs(self, p: Op, in_src: bool) -> dict:
        given = dict(p.attrs)
        defaults = ops.OPS[p.op].defaults
        out = {}
        for name, sort in ATTRS[p.op].items():
            if sort == IGNORED:
                continue
            if sort == FIXED:
                value = given.get(name, defaults.get(name))
                if isinstance(value, (Var, Call, Tup)) or value != defaults.get(name):
                    raise Unsupported(f"{p.op} :{name} {value!r} (only the default {defaults.get(name)!r} is modeled)")
                continue
            if name in given:
                value = given[name]
            elif name in defaults:
                value = defaults[name]
            elif in_src:  # a required attribute the source leaves open matches anything
                if sort == "Ints":
                    raise Unsupported(f"({p.op} ...) without :{name}: the number of outputs is unknown")
                self.fresh += 1
                out[name] = self.alg.var(f"any{self.fresh}", sort)
                continue
            else:
                raise Unsupported(f"target ({p.op} ...) without :{name}")
            if sort == "Ints":
                if not isinstance(value, Tup):
                    raise Unsupported(f"{p.op} :{name} must be a list to count the outputs")
                out[name] = [self.attr(v, "Int") for v in value.items]
            else:
                out[name] = self.attr(value, sort)
        for name in given:
            if name not in ATTRS[p.op]:
                raise Unsupported(f"{p.op} :{name} is not modeled")
        return out

    # attribute expressions
    def avar(self, name: str, sort: str):
        if name in self.attrs:
            have, const = self.attrs[name]
            if sort not in ("Any", have) and not (sort == "Real" and have == "Int"):
                raise Unsupported(f"?{name} is used both as {have} and as {sort}")
            return const if not (sort == "Real" and have == "Int") else self.alg.to_real(const)
        if sort == "Any":
            raise Unsupported(f"?{name} is not bound by the source")
        const = self.alg.var("a." + name, sort)
        self.attrs[name] = (sort, const)
        return const

    def attr(self, x, sort: str):
        A = self.alg
        if isinstance(x, Var):
            return self.avar(x.name, sort)
        if isinstance(x, bool):
            if sort not in ("Bool", "Any"):
                raise Unsupported(f"boolean {x} where {sort} is expected")
            return A.lit(x, "Bool")
        if isinstance(x, int):
            if sort == "Real":
                return A.lit(x, "Real")
            if sort not in ("Int", "Any"):
                raise Unsupported(f"number {x} where {sort} is expected")
            return A.lit(x, "Int")
        if isinstance(x, float):
            if sort not in ("Real", "Any"):
                raise Unsupported(f"number {x} where {sort} is expected")
            return A.lit(x, "Real")
        if isinstance(x, tuple):  # a default value
            x = Tup(tuple(x))
        if isinstance(x, Tup):
            if sort not in ("Tup", "Any"):
                raise Unsupported(f"tuple where {sort} is expected")
            if len(x.items) > ax.MAX_TUPLE:
                raise Unsupported(f"tuple of {len(x.items)} items")
            if all(isinstance(i, int) and not isinstance(i, bool) for i in x.items):
                self.tuples.add(tuple(x.items))
            return A.tup(*[self.attr(i, "Int") for i in x.items])
        if isinstance(x, Call):
            return self.call(x, sort)
        raise Unsupported(f"attribute value {x!r}")

    def call(self, x: Call, sort: str):
        A, fn = self.alg, x.fn
        def floordiv(a, b):
            try:
                return A.floordiv(a, b)
            except TypeError:
                raise Unsupported("// on non-integers") from None

        arith = {"+": lambda a, b: a + b, "-": lambda a, b: a - b, "*": lambda a, b: a * b, "//": floordiv}
        cmp = {
            "<": lambda a, b: a < b, "<=": lambda a, b: a <= b, ">": lambda a, b: a > b, ">=": lambda a, b: a >= b,
        }
        if fn in arith:
            a, b = (self.attr(v, "Any") for v in x.args)
            return arith[fn](a, b)
        if fn in cmp:
            a, b = (self.attr(v, "Any") for v in x.args)
            return cmp[fn](a, b)
        if fn in ("=", "!="):
            eq = self.equal(*x.args)
            return eq if fn == "=" else A.Not(eq)
        if fn == "and":
            return A.And(*[self.attr(v, "Bool") for v in x.args])
        if fn == "or":
            return A.Or(*[self.attr(v, "Bool") for v in x.args])
        if fn == "not":
            return A.Not(self.attr(x.args[0], "Bool"))
        if fn == "dim":
            return A.dim(self.attr(x.args[1], "Int"), self.tvar(x.args[0].name))
        if fn == "rank":
            return A.rank(self.tvar(x.args[0].name))
        if fn == "const?":
            self.fresh += 1
            return A.fresh_bool(f"const{self.fresh}")  # unknown: the proof may not depend on it
        if fn == "compose":
            return A.compose(self.attr(x.args[0], "Tup"), self.attr(x.args[1], "Tup"))
        if fn == "inverse":
            return A.inverse(self.attr(x.args[0], "Tup"))
        if fn == "identity?":
            return A.isid(self.attr(x.args[0], "Tup"))
        if fn == "last-two-swapped":
            return A.lts(self.attr(x.args[0], "Int"))
        if fn == "nth":
            return A.tnth(self.attr(x.args[0], "Tup"), self.attr(x.args[1], "Int"))
        raise Unsupported(f"attribute function ({fn} ...)")

    def equal(self, a, b):
        """``(= a b)``, with ``(shape ?t)`` compared to a shape or to a list of dims."""
        A = self.alg

        def is_shape(v):
            return isinstance(v, Call) and v.fn == "shape"

        if is_shape(a) or is_shape(b):
            if not is_shape(a):
                a, b = b, a
            t = self.tvar(a.args[0].name)
            if is_shape(b):
                return A.shp(t) == A.shp(self.tvar(b.args[0].name))
            if isinstance(b, Tup):
                return A.And(A.rank(t) == len(b.items), *[A.dim(i, t) == self.attr(v, "Int") for i, v in enumerate(b.items)])
            raise Unsupported("(shape ?t) compared with something other than a shape or a list")
        return self.attr(a, "Any") == self.attr(b, "Any")


def _tuple_facts(alg: ax.Z3Algebra, tuples: set) -> list:
    """Values of the rule language's tuple functions on concrete tuples, from the very functions
    the matcher evaluates (rule.FUNCTIONS)."""
    pool = set(tuples)
    for n in range(0, 7):
        pool.add(tuple(FUNCTIONS["last-two-swapped"](n)) if n >= 2 else tuple(range(n)))
        pool.add(tuple(range(n)))
    facts = []
    for n in range(0, ax.MAX_TUPLE):
        try:
            facts.append(alg.lts(n) == alg.tup(*FUNCTIONS["last-two-swapped"](n)))
        except (IndexError, ValueError):
            pass
    for p in pool:
        tp = alg.tup(*p)
        facts.append(alg.isid(tp) == bool(FUNCTIONS["identity?"](p)))
        try:
            facts.append(alg.inverse(tp) == alg.tup(*FUNCTIONS["inverse"](p)))
        except (IndexError, ValueError):
            pass
        for q in pool:
            if len(q) != len(p):
                continue
            try:
                facts.append(alg.compose(tp, alg.tup(*q)) == alg.tup(*FUNCTIONS["compose"](p, q)))
            except (IndexError, ValueError):
                pass
    return facts


def translate(rule: Rule, alg) -> Translation:
    """The rule as terms of ``alg`` (a :class:`~tvm_taso.axioms.Z3Algebra`, or a numeric
    algebra whose variables hold values) and what holds whenever it fires; Unsupported if it
    uses something outside the algebra."""
    tr = _Translator(alg, rule)
    src = [t for p in rule.src for t in tr.tensor(p, True)]
    dst = [t for p in rule.dst for t in tr.tensor(p, False)]
    dropped, conds = [], []
    for c in rule.conds:
        try:
            conds.append(tr.attr(c, "Bool"))
        except Unsupported as err:
            dropped.append(f"{_show(c)}: {err}")
    defined = list(tr.tensors.values()) + tr.defined
    return Translation(src, dst, conds, tr.facts, defined, tr.tuples, dropped)


def _show(x) -> str:
    if isinstance(x, Call):
        return "(" + " ".join([x.fn] + [_show(a) for a in x.args]) + ")"
    if isinstance(x, Tup):
        return "[" + " ".join(_show(i) for i in x.items) + "]"
    if isinstance(x, Var):
        return "?" + x.name
    return str(x)


# -- numeric refutation -----------------------------------------------------------------------


class _Draw(ax.Numeric):
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
    target computes something else (reference semantics of :mod:`tvm_taso.ops`). A description
    of the first one found, or None."""
    import numpy as np

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
        except ax.EvaluationError:
            continue
        except (ops.OpError, KeyError, IndexError, TypeError, ValueError, ZeroDivisionError):
            continue
        for i, (a, b) in enumerate(zip(tr.src, tr.dst)):
            if a.shape != b.shape or a.dtype != b.dtype:
                break  # the matcher would not fire
        else:
            for i, (a, b) in enumerate(zip(tr.src, tr.dst)):
                scale = max(1.0, float(np.nanmax(np.abs(a), initial=0.0)))
                if not np.allclose(a, b, rtol=1e-7, atol=1e-7 * scale, equal_nan=True):
                    return f"output {i} differs by {float(np.nanmax(np.abs(a - b))):.3g} with " + ax._describe(alg.values)
    return None


# -- proving ------------------------------------------------------------------------------------


class Prover:
    """Holds the algebra and the axioms' formulas; proves one rule at a time."""

    refute_seconds = 2.0  # spent looking for a counterexample to a rule that is not proved

    def __init__(self, axioms: list | None = None, check: bool = True):
        if check and axioms is None:
            ax.ensure_checked()
        elif check:
            bad = [r for r in ax.check_axioms(axioms, trials=ax.DEFAULT_TRIALS) if not r.ok]
            if bad:
                raise ax.AxiomError(
                    "axioms fail their numeric check: " + "; ".join(f"{r.name}: {r.message}" for r in bad)
                )
        self.alg = ax.Z3Algebra()
        self.formulas = ax.formulas(self.alg, axioms)

    # A proof that takes 0.1 s with one random seed can run past any timeout with another (and
    # the seed's effect shifts with every term created before), so a timeout restarts the
    # search with the next seed and twice the budget, until the rule's timeout is spent.
    first_attempt_seconds = 1.0

    def solver(self, seconds: float, seed: int = 0):
        z3 = self.alg.z3
        s = z3.Solver()
        s.set("timeout", max(1, int(seconds * 1000)))
        s.set("random_seed", seed)
        # E-matching only: with auto_config Z3 turns model-based quantifier instantiation back
        # on, which on an unprovable rule can run for minutes past the timeout.
        s.set("auto_config", False)
        s.set("mbqi", False)
        s.add(self.formulas)
        return s

    def prove(self, rule: Rule, timeout: float = 10.0) -> VerifyResult:
        t0 = time.perf_counter()
        base = dict(where=rule.where, provenance=rule.provenance, proof=rule.proof)

        def result(status, reason="", dropped=()):
            return VerifyResult(rule.name, status, time.perf_counter() - t0, reason, dropped=list(dropped), **base)

        try:
            tr = translate(rule, self.alg)
        except Unsupported as err:
            return result("unsupported", str(err))
        if len(tr.src) != len(tr.dst):
            return result("failed", f"{len(tr.src)} source outputs but {len(tr.dst)} target outputs")
        z3 = self.alg.z3
        for i, (a, b) in enumerate(zip(tr.src, tr.dst)):
            if a.eq(b):
                continue
            left = timeout - (time.perf_counter() - t0)
            if left <= 0:
                return result("unknown", f"timeout ({timeout:g} s) before output {i}", tr.dropped)
            r, why = self._check(tr, a, b, left)
            if r == z3.unsat:
                continue
            saturated = r == z3.sat or "incomplete quantifiers" in why
            cex = refute(rule, min(self.refute_seconds, max(0.5, timeout - (time.perf_counter() - t0))))
            if cex:
                return result("failed", f"counterexample: {cex}", tr.dropped)
            if saturated:
                return result("failed", f"output {i}: not implied by the axioms (E-matching saturated; "
                              "a missing axiom or a wrong rule; no counterexample found)", tr.dropped)
            return result("unknown", f"output {i}: {why} after {time.perf_counter() - t0:.1f} s", tr.dropped)
        reason = ""
        if tr.dropped:
            reason = f"without {len(tr.dropped)} condition(s) the algebra cannot express"
        return result("proved", reason, tr.dropped)

    def _check(self, tr, a, b, seconds: float):
        """Checks ``a != b`` against the axioms; returns (z3 result, reason when unknown)."""
        z3 = self.alg.z3
        deadline = time.perf_counter() + seconds
        budget, seed = self.first_attempt_seconds, 0
        while True:
            left = deadline - time.perf_counter()
            # A fresh, non-incremental solver per attempt: push/pop or assumption literals switch
            # Z3 to incremental mode, which skips the preprocessing that makes these proofs fast
            # (and a push saturates E-matching with no timeout).
            s = self.solver(budget if left > 1.5 * budget else left, seed)
            s.add(tr.facts(self.alg))
            s.add(a != b)
            r = s.check()
            if r != z3.unknown:
                return r, ""
            why = s.reason_unknown()
            if not ("timeout" in why or "canceled" in why):
                return r, why
            if deadline - time.perf_counter() <= 0.05:
                return r, "timeout"
            budget, seed = 2 * budget, seed + 1


def verify_rules(rules: list[Rule], timeout: float = 10.0, progress: bool = False, time_limit: float | None = None,
                 jobs: int = 1, isolate: bool = False) -> list[VerifyResult]:
    """Prove every rule; one :class:`VerifyResult` per rule, in order.

    ``timeout`` bounds each rule (Z3's own timeout). Z3 does not always stop on time, so with
    ``isolate`` (or ``jobs`` > 1) rules run in worker processes and a worker still busy at
    ``2 * timeout + 10`` seconds is killed and its rule reported ``unknown``. ``time_limit``
    bounds the whole run: rules not reached by then are ``unknown``."""
    if not z3_available():
        raise ax.VerifierUnavailable(f"the verifier needs z3: {INSTALL_HINT}")
    ax.ensure_checked()
    bar = _bar(len(rules), progress)
    try:
        if (jobs > 1 or isolate) and rules:
            out = _run_workers(rules, timeout, max(1, jobs), time_limit, bar)
        else:
            out = [None] * len(rules)
            t0 = time.perf_counter()
            prover = Prover(check=False)
            for i, r in enumerate(rules):
                if time_limit is not None and time.perf_counter() - t0 > time_limit:
                    break
                out[i] = prover.prove(r, timeout)
                _tick(bar, out[i])
    finally:
        if bar is not None:
            bar.close()
    for i, r in enumerate(rules):
        if out[i] is None:
            out[i] = VerifyResult(r.name, "unknown", 0.0, "not reached within the time limit", r.where, r.provenance, r.proof)
    return out


def _worker_main(conn, timeout: float) -> None:
    prover = Prover(check=False)
    while True:
        try:
            task = conn.recv()
        except EOFError:
            return
        if task is None:
            return
        i, rule = task
        conn.send((i, prover.prove(rule, timeout)))


def _run_workers(rules, timeout, jobs, time_limit, bar) -> list:
    """Prove in ``jobs`` worker processes (started here, and killed here when overdue)."""
    import multiprocessing as mp
    from multiprocessing.connection import wait

    ctx = mp.get_context("fork" if "fork" in mp.get_all_start_methods() else "spawn")
    hard = 2 * timeout + 10
    out: list = [None] * len(rules)
    todo = list(range(len(rules)))

    def start():
        parent, child = ctx.Pipe()
        proc = ctx.Process(target=_worker_main, args=(child, timeout), daemon=True)
        proc.start()
        child.close()
        return {"proc": proc, "conn": parent, "task": None, "since": 0.0}

    def stop(w):
        if w["proc"].is_alive():
            w["proc"].kill()
        w["proc"].join()
        w["conn"].close()

    def lost(i, since, why):
        r = rules[i]
        return VerifyResult(r.name, "unknown", time.perf_counter() - since, why, r.where, r.provenance, r.proof)

    workers = [start() for _ in range(min(jobs, len(rules)))]
    t0 = time.perf_counter()
    try:
        while todo or any(w["task"] is not None for w in workers):
            now = time.perf_counter()
            if time_limit is not None and now - t0 > time_limit:
                break
            for w in workers:
                if w["task"] is None and todo:
                    i = todo.pop(0)
                    w["conn"].send((i, rules[i]))
                    w["task"], w["since"] = i, now
            busy = [w["conn"] for w in workers if w["task"] is not None]
            ready = set(wait(busy, timeout=0.2)) if busy else set()
            for k, w in enumerate(workers):
                if w["task"] is None:
                    continue
                i, res = w["task"], None
                if w["conn"] in ready:
                    try:
                        _, res = w["conn"].recv()
                    except (EOFError, OSError):
                        res = lost(i, w["since"], "the prover process died")
                        stop(w)
                        workers[k] = w = start()
                elif time.perf_counter() - w["since"] > hard:
                    res = lost(i, w["since"], f"Z3 ignored its {timeout:g} s timeout; stopped after {hard:g} s")
                    stop(w)
                    workers[k] = w = start()
                if res is not None:
                    out[i] = res
                    w["task"] = None
                    _tick(bar, res)
    finally:
        for w in workers:
            if w["task"] is None and w["proc"].is_alive():
                try:
                    w["conn"].send(None)
                    w["proc"].join(2)
                except OSError:
                    pass
            stop(w)
    return out


def _bar(total: int, progress: bool):
    if not progress:
        return None
    try:
        from tqdm import tqdm
    except ImportError:  # pragma: no cover
        return None
    return tqdm(total=total, desc="verifying", unit="rule", file=sys.stderr, leave=False)


def _tick(bar, res: VerifyResult) -> None:
    log.info("%s: %s (%.2f s) %s", res.name, res.status, res.seconds, res.reason)
    if bar is not None:
        bar.update(1)


# -- writing the proof status back --------------------------------------------------------------


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
    fd, tmp = tempfile.mkstemp(prefix=".tvm-taso-", suffix=".rules", dir=str(path.parent))
    try:
        with os.fdopen(fd, "wb") as f:
            f.write(text.encode("utf-8"))
        os.chmod(tmp, path.stat().st_mode & 0o7777)
        os.replace(tmp, path)
    finally:
        if os.path.exists(tmp):
            os.unlink(tmp)
    return len(edits)


def _shipped_path(where: str) -> Path:
    """The file behind a shipped rule's ``rules/NAME.rules:LINE``."""
    import importlib.resources

    name = where.rsplit(":", 1)[0].split("/")[-1]
    return Path(str(importlib.resources.files("tvm_taso.rules") / name))


# -- command line -------------------------------------------------------------------------------


def add_verify_command(subparsers) -> None:
    """Add ``verify`` to the ``tvm-taso rules`` subcommands."""
    p = subparsers.add_parser(
        "verify",
        help="prove rules from the operator axioms with Z3 (pip install 'tvm-taso[verify]')",
        description="Prove each rule (source = target under TASO-style operator axioms, which are "
        "first checked numerically against the reference semantics) and report the result per rule.",
    )
    p.add_argument("file", nargs="?", help="a rule file (default: the shipped library, unverified rules included)")
    p.add_argument("--timeout", type=float, default=10.0, help="seconds per rule (default 10)")
    p.add_argument("--time-limit", type=float, default=None, help="seconds for the whole run (default: none)")
    p.add_argument("--jobs", type=int, default=0, help="parallel processes (default: CPU count)")
    p.add_argument("--write", action="store_true", help="mark proved rules [..., proved] in their rule files")
    p.add_argument("--json", metavar="OUT", help="write the results as JSON")
    p.set_defaults(func=cmd_rules_verify)


def cmd_rules_verify(args) -> int:
    if not z3_available():
        print(f"tvm-taso: error: the verifier needs z3: {INSTALL_HINT}", file=sys.stderr)
        return 2
    import tvm_taso

    rules = tvm_taso.load_rules(args.file) if args.file else tvm_taso.default_rules(include_unverified=True)
    t0 = time.perf_counter()
    try:
        ax.ensure_checked()
    except ax.AxiomError as err:
        print(f"tvm-taso: error: {err}", file=sys.stderr)
        return 1
    t_check = time.perf_counter() - t0
    jobs = args.jobs or os.cpu_count() or 1
    results = verify_rules(rules, args.timeout, progress=True, time_limit=args.time_limit, jobs=jobs, isolate=True)
    total = time.perf_counter() - t0
    width = max([len(r.name) for r in results] + [4])
    print(f"{'rule':{width}s} {'status':11s} {'seconds':>7s}  reason")
    for r in results:
        print(f"{r.name:{width}s} {r.status:11s} {r.seconds:7.2f}  {r.reason}")
    counts = Counter(r.status for r in results)
    print(
        f"{len(results)} rules: " + ", ".join(f"{counts.get(s, 0)} {s}" for s in STATUSES)
        + f"; {len(ax.AXIOMS)} axioms checked numerically in {t_check:.1f} s; total {total:.1f} s"
    )
    summary = {
        "rules": [asdict(r) for r in results],
        "counts": {s: counts.get(s, 0) for s in STATUSES},
        "axioms": len(ax.AXIOMS),
        "timeout": args.timeout,
        "seconds": total,
    }
    if args.json:
        fd, tmp = tempfile.mkstemp(prefix=".tvm-taso-", suffix=".json", dir=os.path.dirname(os.path.abspath(args.json)))
        with os.fdopen(fd, "w") as f:
            json.dump(summary, f, indent=2)
        os.replace(tmp, args.json)
        print(f"report           {args.json}")
    if args.write:
        by_file: dict[Path, list] = {}
        for r in results:
            path = Path(r.where.rsplit(":", 1)[0]) if args.file else _shipped_path(r.where)
            by_file.setdefault(path, []).append(r)
        for path, rs in by_file.items():
            n = write_proofs(path, rs)
            if n:
                print(f"written          {path}: {n} rule(s) marked proved")
    stale = [r.name for r in results if r.proof == "proved" and r.status != "proved"]
    if stale:
        print(f"warning: marked proved but not proved here: {', '.join(stale)}", file=sys.stderr)
    wrong = [r.name for r in results if r.reason.startswith("counterexample")]
    if wrong:
        print(f"error: counterexamples found for: {', '.join(wrong)}", file=sys.stderr)
    return 1 if wrong else 0
