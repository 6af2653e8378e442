"""Rules as terms of the verifier's algebra (:mod:`tvm_taso.verify.algebra`).

Tensor variables become constants of sort ``T``, attribute variables Ints/tuples/reals (the
sorts the op table gives each attribute, ``OpSpec.algebra``), ``split`` becomes slices,
``(dim ?a k)`` the ``dim`` function. Besides the terms of each side, a :class:`Translation`
holds what is known whenever the rule fires:

- its conditions (one that the algebra cannot express is left out, which only weakens what the
  proof may use);
- every value of the source is defined (it is in the graph), and so is every value of the target
  (the matcher builds the target only when each op accepts its operands:
  ``tvm_taso.rewrite.match.apply``), i.e. ``t != bot`` for each of their subterms;
- source axes are non-negative (``Graph.add`` canonicalizes them);
- the values of ``compose``/``inverse``/``identity?``/``last-two-swapped`` on the concrete tuples
  the rule mentions, computed by the rule language's own functions.
"""

from __future__ import annotations

from dataclasses import dataclass

from tvm_taso.ir import ops
from tvm_taso.rewrite.rule import FUNCTIONS, Call, Get, Op, Rule, Scalar, Tup, Var
from tvm_taso.verify.algebra import MAX_TUPLE, Z3Algebra


class Unsupported(Exception):
    """The rule uses something the algebra does not model."""


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
    def __init__(self, alg):
        self.alg = alg
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
        model = ops.OPS[p.op].algebra if p.op in ops.OPS else None
        if model is None:
            raise Unsupported(f"op {p.op} is not in the verifier's algebra")
        args = []
        for a in p.args:
            refs = self.tensor(a, in_src)
            if len(refs) != 1:
                raise Unsupported(f"a {len(refs)}-output value used as an operand of {p.op}")
            args.append(refs[0])
        at = self.op_attrs(p, model, in_src)
        A = self.alg
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
        # the algebra's function takes the modeled attributes in the op table's order, then the operands
        return [self.note(getattr(A, model.function)(*at.values(), *args))]

    def note(self, term):
        self.defined.append(term)
        return term

    def op_attrs(self, p: Op, model: ops.AlgebraOp, in_src: bool) -> dict:
        """The modeled attributes of ``p`` as terms, in the order of ``model.attrs``."""
        given = dict(p.attrs)
        defaults = ops.OPS[p.op].defaults
        out = {}
        for name, sort in model.attrs.items():
            if sort == ops.IGNORED:
                continue
            if sort == ops.FIXED:
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
            if name not in model.attrs:
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
            if len(x.items) > MAX_TUPLE:
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


def _tuple_facts(alg: Z3Algebra, tuples: set) -> list:
    """Values of the rule language's tuple functions on concrete tuples, from the very functions
    the matcher evaluates (rule.FUNCTIONS)."""
    pool = set(tuples)
    for n in range(0, 7):
        pool.add(tuple(FUNCTIONS["last-two-swapped"](n)) if n >= 2 else tuple(range(n)))
        pool.add(tuple(range(n)))
    facts = []
    for n in range(0, MAX_TUPLE):
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
    """The rule as terms of ``alg`` (a :class:`~tvm_taso.verify.algebra.Z3Algebra`, or a numeric
    algebra whose variables hold values) and what holds whenever it fires; Unsupported if it
    uses something outside the algebra."""
    tr = _Translator(alg)
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

