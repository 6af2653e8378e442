"""Rules as text: printing a pair of graphs as a rule of tvm-taso's rule language with the
size conditions it needs, checking each printed rule with the rule engine, naming families,
and rendering the generated rule file."""

from __future__ import annotations

from collections import Counter
from dataclasses import dataclass

import numpy as np

from tvm_taso.generate.checks import engine_check, engine_instance
from tvm_taso.generate.enumerate_graphs import Pair, SmallGraph
from tvm_taso.generate.search_space import ENLARGE_PAD, GCONV_GROUPS, ROLE_PREFIX, SAME_PAD, TEMPLATES, Domain
from tvm_taso.generate.shapes import LinExpr, Shapes, pair_shapes
from tvm_taso.rewrite.rule import parse_rule


class Inexpressible(Exception):
    """A graph the rule language cannot state (TASO's constants, a bare leaf as a source)."""


# =============================================================================================
# Printing graphs as rule patterns
# =============================================================================================


def _name_leaves(domain: Domain, graphs) -> dict:
    """Rule variable names for the leaves of ``graphs`` by role (``x1``, ``w1``, ``s1``) in
    print order; ``$kind`` for TASO constants."""
    names, count = {}, Counter()
    for g in graphs:
        for leaf in g.leaves_in_print_order():
            if leaf not in names:
                lf = domain.leaf(leaf)
                if lf.const:
                    names[leaf] = f"${lf.const}"
                    continue
                p = ROLE_PREFIX[lf.role]
                count[p] += 1
                names[leaf] = f"{p}{count[p]}"
    return names


def _fmt_tuple(vals) -> str:
    return "[" + " ".join(str(v) for v in vals) + "]"


def _dim_text(atom, names) -> str:
    return f"(dim ?{names[atom[0]]} {atom[1]})"


def _sum_text(terms: list[str]) -> str:
    if not terms:
        return "0"
    text = terms[0]
    for x in terms[1:]:
        text = f"(+ {text} {x})"
    return text


def le_text(e: LinExpr, names) -> str:
    """An attribute expression for a linear expression of tensor dims."""

    def terms(lst, c):
        out = [_dim_text(a, names) if k == 1 else f"(* {k} {_dim_text(a, names)})" for a, k in lst]
        return out + [str(c)] if c else out

    pos = terms([(a, k) for a, k in e.t if k > 0], max(e.c, 0))
    neg = terms([(a, -k) for a, k in e.t if k < 0], max(-e.c, 0))
    return _sum_text(pos) if not neg else f"(- {_sum_text(pos)} {_sum_text(neg)})"


def eq_text(e: LinExpr, names) -> str:
    """``(= LHS RHS)`` for ``e == 0``, positive terms on each side."""
    if e.t and e.t[0][1] < 0:
        e = -e
    lhs = LinExpr(((a, k) for a, k in e.t if k > 0), max(e.c, 0))
    rhs = LinExpr(((a, -k) for a, k in e.t if k < 0), max(-e.c, 0))
    return f"(= {le_text(lhs, names)} {le_text(rhs, names)})"


class Printer:
    """Prints one graph as rule patterns (source) or expressions (target)."""

    def __init__(self, domain: Domain, g: SmallGraph, sh: Shapes, tag: str, names: dict, source: bool, cut_vars: dict):
        self.domain, self.g, self.sh, self.tag, self.names = domain, g, sh, tag, names
        self.source = source
        self.cut_vars = cut_vars  # (tag, pos) -> attribute var name (sources)
        self.memo = {}

    def op(self, pos: int) -> str:
        if pos in self.memo:
            return self.memo[pos]
        tname, refs = self.g.ops[pos]
        t = TEMPLATES[tname]
        args = " ".join(self.ref(r) for r in refs)
        if t.kind == "matmul":
            s = f"(matmul {args})"
        elif t.kind == "conv":
            s = f"(conv2d {args} :padding {_fmt_tuple(SAME_PAD[t.kernel])})"
            if t.relu:
                s = f"(relu {s})"
        elif t.kind == "gconv":
            s = f"(conv2d {args} :padding {_fmt_tuple(SAME_PAD[t.kernel])} :groups {GCONV_GROUPS})"
        elif t.kind == "dwconv":
            raise Inexpressible("depthwise conv with TASO's pooling constant")
        elif t.kind == "pool":
            s = f"({t.pool}_pool2d {args} :pool_size [3 3] :padding [1 1 1 1])"
        elif t.kind == "relu":
            s = f"(relu {args})"
        elif t.kind == "add":
            s = f"(add {args})"
        elif t.kind in ("mul", "smul"):
            s = f"(multiply {args})"
        elif t.kind == "concat":
            s = f"(concat {args} :axis {t.axis})"
        elif t.kind == "split":
            key = (self.tag, pos)
            if self.source:
                cut = "?" + self.cut_vars.setdefault(key, f"i{len(self.cut_vars) + 1}")
            else:
                cut = le_text(self.sh.split_at[key], self.names)
            s = f"(split {args} :indices [{cut}] :axis {t.axis})"
        elif t.kind == "transpose":
            s = f"(permute_dims {args} :axes [1 0])"
        elif t.kind == "enlarge":
            w = self.sh.dims[self._key(refs[0])]
            codes = self.domain.codes()
            k = tuple(e.c + sum(c * codes[a] for a, c in e.t) for e in w[2:])
            s = f"(pad {args} :pad_width {_fmt_tuple(ENLARGE_PAD[k])})"
        else:
            raise ValueError(t.kind)
        self.memo[pos] = s
        return s

    def _key(self, r):
        return ("L", r[1]) if r[0] == "L" else (self.tag, r)

    def ref(self, r) -> str:
        if r[0] == "L":
            name = self.names[r[1]]
            if name.startswith("$"):
                raise Inexpressible(f"TASO constant {name[1:]}")
            return "?" + name
        pos, j = r
        if TEMPLATES[self.g.ops[pos][0]].kind == "split":
            return f"(get {self.op(pos)} {j})"
        return self.op(pos)

    def roots(self, order) -> list[str]:
        """One pattern per output in ``order``; both outputs of one split, in order, print as
        the split itself."""
        refs = [self.g.outs[i] for i in order]
        out, i = [], 0
        while i < len(refs):
            r = refs[i]
            if (r[0] != "L" and TEMPLATES[self.g.ops[r[0]][0]].kind == "split" and r[1] == 0
                    and i + 1 < len(refs) and refs[i + 1] == (r[0], 1)):
                out.append(self.op(r[0]))
                i += 2
                continue
            if self.source and r[0] == "L":
                raise Inexpressible("a bare tensor as a source")
            out.append(self.ref(r))
            i += 1
        return out


# =============================================================================================
# Rules from pairs
# =============================================================================================


# A rule's family (its name's middle part): (name, test on the op kinds and the output count)
FAMILIES = [
    ("group-conv", lambda k, n: "gconv" in k),
    ("enlarge", lambda k, n: "enlarge" in k),
    ("merge-matmul", lambda k, n: n == 2 and "matmul" in k and "split" in k),
    ("merge-conv", lambda k, n: n == 2 and "conv" in k and "split" in k),
    ("matmul-concat", lambda k, n: "matmul" in k and k & {"concat", "split"}),
    ("conv-concat", lambda k, n: "conv" in k and k & {"concat", "split"}),
    ("matmul-add", lambda k, n: "matmul" in k and "add" in k),
    ("conv-add", lambda k, n: "conv" in k and "add" in k),
    ("matmul-transpose", lambda k, n: k == {"matmul", "transpose"}),
    ("matmul-assoc", lambda k, n: k == {"matmul"}),
    ("transpose", lambda k, n: "transpose" in k),
    ("relu-concat", lambda k, n: "relu" in k and k & {"concat", "split"} and k <= {"relu", "concat", "split"}),
    ("concat-split", lambda k, n: k <= {"concat", "split"}),
    ("pool", lambda k, n: "pool" in k),
    ("scalar", lambda k, n: "smul" in k),
    ("matmul", lambda k, n: "matmul" in k),
    ("conv", lambda k, n: "conv" in k),
    ("elementwise-concat", lambda k, n: k & {"concat", "split"}),
    ("elementwise", lambda k, n: True),
]


def family(pair: Pair) -> str:
    """The first of :data:`FAMILIES` whose test the pair's op kinds and output count pass."""
    k, n = pair.kinds(), len(pair.a.outs)
    for name, pred in FAMILIES:
        if pred(k, n):
            return name
    return "misc"


def expressible(src: SmallGraph, dst: SmallGraph, domain: Domain) -> bool:
    """Whether the rule language can state ``src => dst``: no TASO constant (they have no
    spelling), no bare tensor as a source, no input that only the target reads."""
    if not src.ops or any(r[0] == "L" for r in src.outs):
        return False
    if not set(dst.leaves()) <= set(src.leaves()):
        return False
    for name in set(src.leaves()) | set(dst.leaves()):
        if domain.leaf(name).const:
            return False
    return not ({"dwconv"} & (src.kinds() | dst.kinds()))


def stateable(a: SmallGraph, b: SmallGraph, domain: Domain) -> bool:
    """Whether a rule between the graphs ``a`` and ``b`` can be written, in one direction or the
    other."""
    return expressible(a, b, domain) or expressible(b, a, domain)


def _direct_rank4(g: SmallGraph) -> set:
    out = set()
    for tname, refs in g.ops:
        kind = TEMPLATES[tname].kind
        if kind in ("conv", "gconv", "pool"):
            out |= {r[1] for r in refs if r[0] == "L"}
    return out


def rule_text(domain: Domain, pair: Pair, sh: Shapes, conds: list, forward: bool, name: str) -> str:
    """The rule ``a => b`` (``forward``) or ``b => a`` of ``pair`` with its conditions: the ranks
    of inputs no conv/pool fixes, the size equations ``conds`` and each split's cut point."""
    src, dst = (pair.a, pair.b) if forward else (pair.b, pair.a)
    stag, dtag = ("a", "b") if forward else ("b", "a")
    if forward:
        sorder, dorder = list(range(len(src.outs))), list(pair.perm)
    else:
        inv = [0] * len(pair.perm)
        for i, j in enumerate(pair.perm):
            inv[j] = i
        sorder, dorder = list(range(len(src.outs))), inv
    names = _name_leaves(domain, [src])
    cut_vars: dict = {}
    sp = Printer(domain, src, sh, stag, names, True, cut_vars)
    roots = sp.roots(sorder)
    dp = Printer(domain, dst, sh, dtag, names, False, {})
    targets = dp.roots(dorder)
    cs = []
    rank4 = _direct_rank4(src)
    for leaf in src.leaves_in_print_order():
        if leaf not in rank4:
            cs.append(f"(= (rank ?{names[leaf]}) {len(domain.leaf(leaf).dims)})")
    cs += [eq_text(e, names) for e in conds]
    for key, var in cut_vars.items():
        cs.append(f"(= ?{var} {le_text(sh.split_at[key], names)})")
    text = f"{name} [generated, checked]: {', '.join(roots)}\n    => {', '.join(targets)}"
    if cs:
        text += "\n    if " + ", ".join(cs)
    return text


def make_rules(domain: Domain, pair: Pair, index: int, seed: int) -> dict:
    """Both directions of a pair as rule texts (named ``r``), each checked by the rule engine
    on two instances: ``{"rules": [(forward, text, sizes of the first instance)], "why":
    [reason a direction is missing], "family": family}``."""
    fam = family(pair)
    out = {"rules": [], "why": []}
    for forward in (True, False):
        src, dst = (pair.a, pair.b) if forward else (pair.b, pair.a)
        if not expressible(src, dst, domain):
            out["why"].append("inexpressible")
            continue
        ok = False
        for pin in (False, True):
            sh, conds, full = pair_shapes(domain, pair, pin)
            try:
                text = rule_text(domain, pair, sh, conds, forward, "r")
            except Inexpressible:
                break
            lhs, rhs = text.split("\n    => ")
            if lhs.split(": ", 1)[1] == rhs.split("\n")[0]:
                out["why"].append("identical")
                break
            rule = parse_rule(text)
            rng = np.random.default_rng([seed, index, int(forward), int(pin)])
            atoms = sorted({(leaf, i) for leaf in pair.leaves() for i in range(len(domain.leaf(leaf).dims))})
            envs = [full.solve(atoms, rng) for _ in range(2)]
            if any(e is None for e in envs):
                envs = [domain.sizes()]
            good = True
            for env in envs:
                G, feeds = engine_instance(domain, src, sh, "a" if forward else "b", env, rng)
                passed, _ = engine_check(rule, G, feeds)
                if not passed:
                    good = False
                    break
            if good:
                out["rules"].append((forward, text, envs[0]))
                ok = True
                break
        if not ok:
            out["why"].append("failed check")
    out["family"] = fam
    return out


# =============================================================================================
# The rule file
# =============================================================================================


@dataclass
class Emitted:
    """One rule of the generated file."""

    name: str
    family: str
    text: str  # the rule (one logical line, continuation lines indented)


def render(result) -> str:
    """The rule file of a :class:`~tvm_taso.generate.driver.GenResult`: a header with the
    counts after each step, then the rules by family."""
    lines = [
        "# Generated by `tvm-taso rules generate` (tvm_taso/generate/): TASO's generator over the",
        "# operators of tvm_taso/ir/ops.py. Every rule was found by integer fingerprints, confirmed on",
        "# float64 data, and checked by matching and applying it on two instances with random sizes",
        "# (proof status `checked`). `gen-F-N` rewrites the smaller graph of pair N into the larger;",
        "# `gen-F-N-rev` is the other direction. Do not edit: regenerate.",
        "#",
    ]
    for k, v in result.stats.items():
        lines.append(f"# {k}: {v}")
    lines.append("# families: " + ", ".join(f"{k} {v}" for k, v in result.families.items()))
    fam = None
    for e in result.rules:
        if e.family != fam:
            fam = e.family
            lines += ["", f"# --- {fam} " + "-" * max(3, 86 - len(fam))]
        lines.append(e.text)
    return "\n".join(lines) + "\n"
