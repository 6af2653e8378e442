"""How an axiom is stated: its three forms, the sorts of its variables, and its Z3 formula.

An axiom is a small Python function over an *algebra* (:mod:`tvm_taso.verify.algebra`), so the
same text is both the Z3 formula and the numeric test (:mod:`tvm_taso.verify.soundness`). It
returns one of three forms:

- ``Eq(lhs, rhs, guard)``: ``guard → lhs = rhs``, ⊥ included (lhs is ⊥ exactly when rhs is);
- ``Def(lhs, rhs, guard)``: ``guard ∧ lhs ≠ ⊥ → lhs = rhs`` (the right side may be defined on
  more inputs, e.g. ``slice(concat(a, b)) = a`` says nothing about ``b`` when ``a`` alone is
  given);
- ``Fact(then, defined, guard)``: ``guard ∧ every term in defined ≠ ⊥ → then``: shape facts.

The left side is the E-matching trigger (write a second axiom for the other direction), unless
``patterns`` gives others (an axiom whose guard names what the left side cannot bind).
"""

from __future__ import annotations

import inspect
from dataclasses import dataclass
from typing import Callable

from tvm_taso.verify.algebra import Z3Algebra


# -- statements -------------------------------------------------------------------------------


class Eq:
    """``guard → lhs = rhs`` (⊥ on one side exactly when on the other); ``patterns``: triggers
    in place of the left side, for an axiom whose guard names variables the left side cannot
    bind (lists of terms, each a multi-pattern)."""

    kind = "eq"

    def __init__(self, lhs, rhs, guard=True, patterns=()):
        self.lhs, self.rhs, self.guard, self.patterns = lhs, rhs, guard, tuple(patterns)


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
            pattern_sets = [list(ps) for ps in st.patterns] or [[st.lhs]]
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


def make_axiom(name: str, build: Callable, group_name: str = "user", **specs) -> Axiom:
    """An axiom from ``build(algebra, *variables)``; keyword arguments give each variable's spec
    (a string is a tensor template)."""
    params = tuple(inspect.signature(build).parameters)[1:]
    missing = [p for p in params if p not in specs]
    if missing:
        raise TypeError(f"axiom {name}: no spec for {missing}")
    full = {p: T(specs[p]) if isinstance(specs[p], str) else specs[p] for p in params}
    return Axiom(name, group_name, inspect.getdoc(build) or "", build, params, full)
