"""Symbolic sizes for emitting rules: every dim of a graph as a linear expression of its leaves'
dims (:class:`LinExpr`), the size equations a graph or a pair implies (:func:`walk`,
:func:`pair_shapes`), and exact linear algebra on them (:class:`Span`)."""

from __future__ import annotations

from dataclasses import dataclass, field
from fractions import Fraction

from tvm_taso.generate.enumerate_graphs import Pair, half_cut
from tvm_taso.generate.search_space import ENLARGE_PAD, SAME_PAD, TEMPLATES, Domain


class LinExpr:
    """A linear expression over atoms ``(leaf name, axis)`` with integer coefficients."""

    __slots__ = ("t", "c")

    def __init__(self, terms=(), c=0):
        self.t = tuple(sorted((a, k) for a, k in terms if k))
        self.c = c

    @staticmethod
    def atom(a) -> LinExpr:
        return LinExpr(((a, 1),))

    @staticmethod
    def lit(c: int) -> LinExpr:
        return LinExpr((), c)

    def _merge(self, other, sign):
        if isinstance(other, int):
            other = LinExpr.lit(other)
        d = dict(self.t)
        for a, k in other.t:
            d[a] = d.get(a, 0) + sign * k
        return LinExpr(d.items(), self.c + sign * other.c)

    def __add__(self, o):
        return self._merge(o, 1)

    def __sub__(self, o):
        return self._merge(o, -1)

    def __neg__(self):
        return LinExpr(((a, -k) for a, k in self.t), -self.c)

    def __eq__(self, o):
        return isinstance(o, LinExpr) and self.t == o.t and self.c == o.c

    def __hash__(self):
        return hash((self.t, self.c))

    def __repr__(self):
        return " + ".join([f"{k}*{a[0]}.{a[1]}" for a, k in self.t] + [str(self.c)])

    def is_zero(self) -> bool:
        return not self.t and self.c == 0

    def value(self, env: dict) -> int:
        return self.c + sum(k * env[a] for a, k in self.t)


@dataclass
class Shapes:
    """What :func:`walk` found: dims and concat pieces of every ref, constraint equations
    (``LinExpr == 0``) and each split's cut point."""

    dims: dict = field(default_factory=dict)
    parts: dict = field(default_factory=dict)
    strict: list = field(default_factory=list)  # enforced by the rule engine's shape checks
    needed: list = field(default_factory=list)  # must be stated as conditions unless implied
    # add/multiply broadcast in Relax: their operands' equal shapes are conditions that only
    # equations not derived through an add/multiply output ("pure" ones) may make redundant
    tainted: dict = field(default_factory=dict)  # ref -> dims derived through add/multiply
    pure: list = field(default_factory=list)  # strict equations over untainted dims
    broadcast: list = field(default_factory=list)  # add/multiply operand equalities
    split_at: dict = field(default_factory=dict)  # op position -> LinExpr
    rank4: set = field(default_factory=set)  # leaves read directly by conv2d/pool (rank implied)


def _halves(pieces, code) -> LinExpr:
    """first half - second half of a two-group conv's operand cut into concat ``pieces``
    (LinExprs; ``code`` gives their size codes)."""
    cut = half_cut([(code(p), 0) for p in pieces]) if pieces is not None else None
    if cut is None:
        raise ValueError("a grouped conv's operand is not two halves")
    left, right = LinExpr.lit(0), LinExpr.lit(0)
    for k, p in enumerate(pieces):
        if k < cut:
            left = left + p
        else:
            right = right + p
    return left - right


def walk(domain: Domain, ops_: tuple, codes: dict, sh: Shapes | None = None, tag: str = "") -> Shapes:
    """Symbolic shapes of a graph (``tag`` keeps two graphs' refs apart in one :class:`Shapes`)."""
    sh = sh or Shapes()

    def code(e: LinExpr) -> int:
        return e.c + sum(k * codes[a] for a, k in e.t)

    def same(p, q):
        if p is None or q is None:
            return None
        return p if len(p) == len(q) and all(code(a) == code(b) for a, b in zip(p, q)) else None

    def get(ref):
        if ref[0] == "L":
            lf = domain.leaf(ref[1])
            key = ("L", ref[1])
            if key not in sh.dims:
                sh.dims[key] = tuple(LinExpr.atom((lf.name, i)) for i in range(len(lf.dims)))
                sh.parts[key] = (None,) * len(lf.dims)
                sh.tainted[key] = False
            return key
        return (tag, ref)

    for pos, (tname, refs) in enumerate(ops_):
        t = TEMPLATES[tname]
        keys = [get(r) for r in refs]
        d = [sh.dims[k] for k in keys]
        pp = [sh.parts[k] for k in keys]
        taint = any(sh.tainted[k] for k in keys)
        n_strict = len(sh.strict)
        outs = []
        if t.kind == "matmul":
            sh.strict.append(d[0][1] - d[1][0])
            outs.append(((d[0][0], d[1][1]), (pp[0][0], pp[1][1])))
        elif t.kind in ("conv", "dwconv"):
            x, w = d
            kh, kw = t.kernel
            pt, pl, pb, pr = SAME_PAD[t.kernel]
            if t.kind == "conv":
                sh.strict.append(x[1] - w[1])
            else:
                sh.needed.append(w[1] - 1)
                sh.needed.append(w[0] - x[1])
            sh.needed += [w[2] - kh, w[3] - kw]
            outs.append(((x[0], w[0], x[2] + (pt + pb + 1) - w[2], x[3] + (pl + pr + 1) - w[3]),
                         (pp[0][0], pp[1][0], None, None)))
            for r in refs:
                if r[0] == "L":
                    sh.rank4.add(r[1])
        elif t.kind == "gconv":
            x, w = d
            # two groups: input channels twice the kernel's, and both operands cut in halves by
            # the concat that made them (equal halves, a condition the engine does not check)
            sh.strict.append(x[1] - (w[1] + w[1]))
            sh.needed += [w[2] - t.kernel[0], w[3] - t.kernel[1], _halves(pp[0][1], code), _halves(pp[1][0], code)]
            pt, pl, pb, pr = SAME_PAD[t.kernel]
            outs.append(((x[0], w[0], x[2] + (pt + pb + 1) - w[2], x[3] + (pl + pr + 1) - w[3]),
                         (pp[0][0], pp[1][0], None, None)))
            for r in refs:
                if r[0] == "L":
                    sh.rank4.add(r[1])
        elif t.kind == "pool":
            outs.append((d[0], (pp[0][0], pp[0][1], None, None)))
            if refs[0][0] == "L":
                sh.rank4.add(refs[0][1])
        elif t.kind in ("relu", "smul"):
            outs.append((d[0], pp[0]))
        elif t.kind in ("add", "mul"):
            sh.broadcast += [a - b for a, b in zip(d[0], d[1])]
            taint = True
            outs.append((d[0], tuple(same(p, q) for p, q in zip(pp[0], pp[1]))))
        elif t.kind == "concat":
            ax = t.axis
            sh.strict += [d[0][i] - d[1][i] for i in range(len(d[0])) if i != ax]
            dims = list(d[0])
            dims[ax] = d[0][ax] + d[1][ax]
            parts = [same(p, q) for p, q in zip(pp[0], pp[1])]
            parts[ax] = (pp[0][ax] or (d[0][ax],)) + (pp[1][ax] or (d[1][ax],))
            outs.append((tuple(dims), tuple(parts)))
        elif t.kind == "split":
            ax = t.axis
            pieces = pp[0][ax]
            left, right = pieces[:-1], pieces[-1]
            cut = left[0]
            for q in left[1:]:
                cut = cut + q
            sh.split_at[(tag, pos)] = cut
            d0, d1 = list(d[0]), list(d[0])
            d0[ax], d1[ax] = cut, right
            p0, p1 = list(pp[0]), list(pp[0])
            p0[ax] = left if len(left) >= 2 else None
            p1[ax] = None
            outs += [(tuple(d0), tuple(p0)), (tuple(d1), tuple(p1))]
        elif t.kind == "transpose":
            outs.append(((d[0][1], d[0][0]), (pp[0][1], pp[0][0])))
        elif t.kind == "enlarge":
            w = d[0]
            kh0, kw0 = code(w[2]), code(w[3])
            pw = ENLARGE_PAD[(kh0, kw0)]
            sh.needed += [w[2] - kh0, w[3] - kw0]
            dims = (w[0], w[1], w[2] + (pw[4] + pw[5]), w[3] + (pw[6] + pw[7]))
            outs.append((dims, (pp[0][0], pp[0][1], None, None)))
        else:
            raise ValueError(t.kind)
        if not taint:
            sh.pure += sh.strict[n_strict:]
        for j, (dims, parts) in enumerate(outs):
            sh.dims[(tag, (pos, j))] = dims
            sh.parts[(tag, (pos, j))] = parts
            sh.tainted[(tag, (pos, j))] = taint
    return sh


class Span:
    """Linear equations ``LinExpr == 0`` in echelon form (exact, with fractions)."""

    def __init__(self):
        self.rows: list = []  # (pivot atom, {atom: Fraction}, const)

    def reduce(self, e: LinExpr):
        d = {a: Fraction(k) for a, k in e.t}
        c = Fraction(e.c)
        for p, row, rc in self.rows:
            f = d.get(p)
            if f:
                for a, k in row.items():
                    d[a] = d.get(a, 0) - f * k
                c -= f * rc
                d = {a: k for a, k in d.items() if k}
        return d, c

    def add(self, e: LinExpr) -> bool:
        d, c = self.reduce(e)
        if not d:
            if c != 0:
                raise ValueError("inconsistent size constraints")
            return False
        p = min(d)
        f = d[p]
        self.rows.append((p, {a: k / f for a, k in d.items()}, c / f))
        return True

    def solve(self, atoms, rng, lo=2, hi=5, tries=60) -> dict | None:
        """Positive integer sizes satisfying every equation, the free ones drawn at random."""
        pivots = {p for p, _, _ in self.rows}
        free = [a for a in atoms if a not in pivots]
        for _ in range(tries):
            env = {a: Fraction(int(rng.integers(lo, hi + 1))) for a in free}
            for p, row, c in reversed(self.rows):
                env[p] = -(c + sum(k * env[a] for a, k in row.items() if a != p))
            if all(v.denominator == 1 and v > 0 for v in env.values()):
                return {a: int(v) for a, v in env.items()}
        return None


def pair_shapes(domain: Domain, pair: Pair, pin: bool) -> tuple[Shapes, list, Span]:
    """The shapes of both graphs of ``pair`` (tags ``"a"`` and ``"b"``) with their outputs'
    shapes equated; the conditions a rule must state (equations ``LinExpr == 0`` that the rule
    engine's own shape checks do not imply); and every equation, solved. With ``pin``, sizes the
    enumeration shared (equal symbols) are conditions too."""
    codes = domain.codes()
    sh = walk(domain, pair.a.ops, codes, tag="a")
    walk(domain, pair.b.ops, codes, sh, tag="b")

    def key(tag, r):
        return ("L", r[1]) if r[0] == "L" else (tag, r)

    for i, r in enumerate(pair.a.outs):
        ka, kb = key("a", r), key("b", pair.b.outs[pair.perm[i]])
        eqs = [x - y for x, y in zip(sh.dims[ka], sh.dims[kb])]
        sh.strict += eqs
        if not (sh.tainted[ka] or sh.tainted[kb]):
            sh.pure += eqs
    if pin:  # the enumeration's own size sharing, for rules that do not hold more generally
        first = {}
        for leaf in sorted(pair.leaves()):
            for i in range(len(domain.leaf(leaf).dims)):
                a = (leaf, i)
                if codes[a] in first:
                    sh.needed.append(LinExpr.atom(a) - LinExpr.atom(first[codes[a]]))
                else:
                    first[codes[a]] = a
    conds, seen = [], set()
    # first the operand shapes of add/multiply, against equations that do not assume them
    enforced = Span()
    for e in sh.pure:
        enforced.add(e)
    for e in sh.broadcast:
        if not e.is_zero() and e not in seen:
            seen.add(e)
            if enforced.add(e):
                conds.append(e)
    # with those, every dim expression is exact: all shape checks count
    for e in sh.strict:
        enforced.add(e)
    for e in sh.needed:
        if e.is_zero() or e in seen:
            continue
        seen.add(e)
        if enforced.add(e):
            conds.append(e)
    full = Span()
    for e in sh.strict + sh.broadcast + sh.needed:
        full.add(e)
    return sh, conds, full
