"""Pruning: TASO's structural tests on candidate pairs (common subgraph and supergraph),
canonical forms that find identical graphs, input renamings and duplicate rule texts, and the
test that drops a rule when applications of smaller rules reproduce it."""

from __future__ import annotations

import itertools
import re

import numpy as np

from tvm_taso.generate.checks import engine_instance
from tvm_taso.generate.enumerate_graphs import Pair, SmallGraph, align
from tvm_taso.generate.output import stateable
from tvm_taso.generate.search_space import ROLE_PREFIX, TEMPLATES, Domain, base_name
from tvm_taso.generate.shapes import pair_shapes
from tvm_taso.ir.graph import COMMUTATIVE, LEAVES, Graph
from tvm_taso.rewrite.match import apply, find_matches, index_by_op


def structural_pairs(buckets: dict, domains: dict, stats: dict) -> list[Pair]:
    """TASO's pairing of the graphs grouped by fingerprint (``buckets``: ``(domain name, key) ->
    [(ops, outs, hashes, redundant)]``) and the structural pruning: identical graphs go; each
    other graph pairs with the first smaller one of its group that applies no op to the same
    inputs (common subgraph), that it does not follow from by a smaller pair (common
    supergraph) and with which a rule can be stated (:func:`~tvm_taso.generate.output.stateable`:
    a partner the rule language cannot spell, such as a convolution by TASO's identity constant,
    would lose the graph's only rule); then one pair per class of input renamings. Counts go
    into ``stats``."""
    cand = trivial = sub = sup = 0
    pairs = []
    for bkey in sorted(k for k, v in buckets.items() if len(v) > 1):
        members = sorted((SmallGraph(bkey[0], *m) for m in buckets[bkey]), key=SmallGraph.sortkey)
        cand += len(members) - 1
        uniq, seen = [], set()
        for g in members:
            c = graph_canon(g)
            if c not in seen:
                seen.add(c)
                uniq.append(g)
        trivial += len(uniq) - 1
        for j in range(1, len(uniq)):
            g = uniq[j]
            chosen, passed_sub = None, False
            for h in uniq[:j]:
                if (g.redundant or h.redundant) and (h.size and g.size):
                    continue  # a redundant graph pairs only with inputs alone
                if not stateable(h, g, domains[g.domain]):
                    continue
                perm = align(h, g)
                if perm is None or common_subgraph(h, g):
                    continue
                passed_sub = True
                if not common_supergraph(h, g, perm):
                    chosen = (h, perm)
                    break
            sub += passed_sub
            if chosen:
                sup += 1
                pairs.append(Pair(g.domain, chosen[0], g, chosen[1]))
    stats["candidate pairs (equal fingerprints)"] = cand
    stats["after removing identical graphs"] = trivial
    stats["after common-subgraph pruning"] = sub
    stats["after common-supergraph pruning"] = sup
    canon: dict = {}
    for p in pairs:
        canon.setdefault(pair_canon(domains[p.domain], p), p)
    # a two-output graph equal to itself with its inputs renamed only reorders a split's
    # outputs; single-output ones (associativity) are kept (the driver sorts them last)
    pairs = [canon[k] for k in sorted(canon)
             if len(canon[k].a.outs) == 1 or not self_renaming(domains[canon[k].domain], canon[k])]
    stats["after input-renaming pruning"] = len(pairs)
    return pairs


def _leaf_ops(g: SmallGraph) -> set:
    return {(base_name(t), refs) for t, refs in g.ops if all(r[0] == "L" for r in refs)}


def common_subgraph(a: SmallGraph, b: SmallGraph) -> bool:
    """TASO: both graphs apply the same op to the same inputs (leaves). A fused conv+relu
    contains its conv (it is ``relu(conv2d(...))`` in Relax)."""
    return bool(_leaf_ops(a) & _leaf_ops(b))


def common_supergraph(a: SmallGraph, b: SmallGraph, perm) -> bool:
    """TASO: every output is the same op on both sides, with all inputs but one the same
    leaves; the pair follows from the smaller pair of the differing inputs."""
    if not a.ops or not b.ops:
        return False
    for i, ra in enumerate(a.outs):
        rb = b.outs[perm[i]]
        if ra[1] != rb[1]:
            return False
        oa, ob = a.ops[ra[0]], b.ops[rb[0]]
        if oa[0] != ob[0]:
            return False
        diff = sum(1 for x, y in zip(oa[1], ob[1]) if not (x == y and x[0] == "L"))
        if diff > 1:
            return False
    return True


# =============================================================================================
# Canonical forms (identical graphs, renamings)
# =============================================================================================


def _expr(g: SmallGraph, r, names: dict | None, domain: Domain | None, flips=frozenset()) -> str:
    """Ref ``r`` of ``g`` as text; with ``names``, leaves renamed in order of appearance (by
    role and literal dims), and the operands of the ops at positions ``flips`` swapped."""
    if r[0] == "L":
        if names is None:
            return r[1]
        if r[1] not in names:
            lf = domain.leaf(r[1])
            if lf.const:
                names[r[1]] = "$" + lf.const
            else:
                p = ROLE_PREFIX[lf.role] + "".join(str(d) if isinstance(d, int) else "*" for d in lf.dims)
                names[r[1]] = f"{p}_{sum(1 for v in names.values() if v.startswith(p + '_')) + 1}"
        return names[r[1]]
    tname, refs = g.ops[r[0]]
    t = TEMPLATES[tname]
    if r[0] in flips:
        refs = refs[::-1]
    s = f"{base_name(tname)}({','.join(_expr(g, x, names, domain, flips) for x in refs)})"
    if t.relu:
        s = f"relu({s})"
    return s + f"#{r[1]}" if t.kind == "split" else s


def graph_canon(g: SmallGraph) -> tuple:
    """The graph as text, outputs in fingerprint order: equal for identical graphs."""
    order = sorted(range(len(g.outs)), key=lambda i: g.hashes[i])
    return tuple(_expr(g, g.outs[i], None, None) for i in order)


def _flip_sets(g: SmallGraph):
    """Every choice of operand order for the commutative ops (add, multiply) of ``g``."""
    comm = [k for k, (t, _) in enumerate(g.ops) if TEMPLATES[t].kind in ("add", "mul")]
    for n in range(len(comm) + 1):
        for c in itertools.combinations(comm, n):
            yield frozenset(c)


def pair_canon(domain: Domain, pair: Pair) -> tuple:
    """The same for every renaming of the inputs, either direction, either output order and
    either operand order of add/multiply."""
    inv = [0] * len(pair.perm)
    for i, j in enumerate(pair.perm):
        inv[j] = i
    best = None
    for g1, g2, perm in ((pair.a, pair.b, pair.perm), (pair.b, pair.a, tuple(inv))):
        for order in itertools.permutations(range(len(g1.outs))):
            for f1 in _flip_sets(g1):
                for f2 in _flip_sets(g2):
                    names: dict = {}
                    s1 = tuple(_expr(g1, g1.outs[i], names, domain, f1) for i in order)
                    s2 = tuple(_expr(g2, g2.outs[perm[i]], names, domain, f2) for i in order)
                    key = (s1, s2)
                    if best is None or key < best:
                        best = key
    return best


def self_renaming(domain: Domain, pair: Pair, flips: bool = False) -> bool:
    """Whether one side is the other with its inputs renamed (and its outputs reordered): such
    a rule never changes a graph. With ``flips``, also up to the operand order of add and
    multiply (associativity and commutativity: cost-neutral, but they enable other rules)."""
    def forms(g, perm):
        out = set()
        for order in itertools.permutations(range(len(g.outs))):
            for f in (_flip_sets(g) if flips else [frozenset()]):
                names: dict = {}
                out.add(tuple(_expr(g, g.outs[perm[i]], names, domain, f) for i in order))
        return out

    ident = tuple(range(len(pair.a.outs)))
    return bool(forms(pair.a, ident) & forms(pair.b, pair.perm))


def normalized_rule_text(text: str) -> str:
    """A rule's text without its name, variables renamed in order of appearance: equal for
    rules that differ only in names."""
    body = text.split(" ", 1)[1]
    names: dict = {}

    def sub(m):
        return "?" + names.setdefault(m.group(1), f"v{len(names) + 1}")

    return re.sub(r"\?([A-Za-z]\w*)", sub, body)


# =============================================================================================
# Rules that smaller rules imply
# =============================================================================================


def _chash(g) -> tuple:
    """A hash of what a rule-engine graph computes, blind to the operand order of add and
    multiply."""
    memo: dict = {}
    for nid in g.topo_order():
        n = g.nodes[nid]
        if n.op in LEAVES:
            memo[nid] = ("leaf", n.attrs)
            continue
        ins = [(memo[s], i) for s, i in n.inputs]
        if n.op in COMMUTATIVE:
            ins.sort(key=repr)
        memo[nid] = hash((n.op, n.attrs, tuple(ins)))
    return tuple((memo[s], i) for s, i in g.outputs)


def _commuted(g, limit: int = 3) -> list:
    """``g`` with the operands of some of its add/multiply nodes swapped (every choice)."""
    order = g.topo_order()
    comm = [nid for nid in order if g.nodes[nid].op in COMMUTATIVE and len(set(g.nodes[nid].inputs)) == 2][:limit]
    out = []
    for mask in range(1, 1 << len(comm)):
        flip = {nid for k, nid in enumerate(comm) if mask >> k & 1}
        h = Graph()
        m: dict = {}
        for nid in order:
            n = g.nodes[nid]
            if n.op in LEAVES:
                m[nid] = h.add_leaf(n.op, n.types[0], n.payload, dict(n.attrs)["key"])
                continue
            ins = [(m[s], i) for s, i in n.inputs]
            if nid in flip:
                ins = ins[::-1]
            m[nid] = h.add(n.op, ins, dict(n.attrs))
        h.outputs = [(m[s], i) for s, i in g.outputs]
        out.append(h)
    return out


def is_implied(domain: Domain, rule, pair: Pair, forward: bool, env: dict, earlier: list, *,
               depth: int = 3, width: int = 48) -> bool:
    """Whether up to ``depth`` applications of the ``earlier`` rules rewrite the rule's source
    (at sizes ``env``) into a graph the rule itself produces, up to the operand order of
    add/multiply (at most ``width`` graphs are kept per step)."""
    sh, _, _ = pair_shapes(domain, pair, False)
    src = pair.a if forward else pair.b
    G, _ = engine_instance(domain, src, sh, "a" if forward else "b", env, np.random.default_rng(0))
    goals = set()
    for m in find_matches(G, rule):
        new = apply(G, m)
        if new is not None:
            goals.add(_chash(new))
    if not goals:
        return False
    frontier = [G] + _commuted(G)
    seen = {g.structural_hash() for g in frontier}
    for _depth in range(depth):
        nxt = []
        for g in frontier:
            by_op = index_by_op(g)
            for q in earlier:
                if any(op not in by_op for op in q.root_ops):
                    continue
                for m in find_matches(g, q, by_op):
                    new = apply(g, m)
                    if new is None:
                        continue
                    h = new.structural_hash()
                    if h in seen:
                        continue
                    seen.add(h)
                    if _chash(new) in goals:
                        return True
                    nxt.append(new)
        if _depth + 1 < depth:
            frontier = []
            for g in nxt[:width]:
                frontier.append(g)
                for c in _commuted(g):
                    if c.structural_hash() not in seen:
                        seen.add(c.structural_hash())
                        frontier.append(c)
    return False
