"""Numerical checks with the reference semantics of :mod:`tvm_taso.ir.ops`: confirming a pair of
equal fingerprints on float64 data, and checking a rule by matching and applying it with the
rule engine on an instance of its source graph."""

from __future__ import annotations

import numpy as np

from tvm_taso.generate.enumerate_graphs import SmallGraph, align
from tvm_taso.generate.search_space import TEMPLATES, Domain, const_value, relax_steps
from tvm_taso.generate.shapes import Shapes, walk
from tvm_taso.ir import ops as _ops
from tvm_taso.ir.graph import Graph
from tvm_taso.ir.ops import TensorType
from tvm_taso.numerics import array_relative_error
from tvm_taso.rewrite.match import apply, find_matches


def _float_eval(g: SmallGraph, feeds: dict, env: dict, sh: Shapes, tag: str) -> list:
    """The outputs of ``g`` on float64 ``feeds`` (leaf name -> array) at sizes ``env``."""
    vals = {}

    def val(r):
        return feeds[r[1]] if r[0] == "L" else vals[r]

    for pos, (tname, refs) in enumerate(g.ops):
        t = TEMPLATES[tname]
        args = [val(r) for r in refs]
        cut = sh.split_at[(tag, pos)].value(env) if t.kind == "split" else None
        outs = None
        for k, (name, attrs) in enumerate(relax_steps(t, args[0].shape, cut)):
            outs = _ops.evaluate(name, args if k == 0 else [outs[0]], attrs)
        for j, o in enumerate(outs):
            vals[(pos, j)] = np.asarray(o, dtype=np.float64)
    return [val(r) for r in g.outs]


def _leaf_feeds(domain: Domain, names, env: dict, rng) -> dict:
    feeds = {}
    for name in names:
        lf = domain.leaf(name)
        shape = tuple(env[(name, i)] for i in range(len(lf.dims)))
        if lf.const:
            feeds[name] = const_value(lf, shape).astype(np.float64)
        else:
            feeds[name] = rng.standard_normal(shape)
    return feeds


def float_confirm(domain: Domain, a: SmallGraph, b: SmallGraph, seed: int, trials: int = 2) -> bool:
    """Whether ``a`` and ``b`` (equal fingerprints) compute the same outputs on ``trials`` sets of
    random float64 inputs at the enumeration's sizes."""
    perm = align(a, b)
    if perm is None:
        return False
    codes = domain.codes()
    sh = walk(domain, a.ops, codes, tag="a")
    walk(domain, b.ops, codes, sh, tag="b")
    env = domain.sizes()
    names = sorted(set(a.leaves()) | set(b.leaves()))
    rng = np.random.default_rng(seed)
    for _ in range(trials):
        feeds = _leaf_feeds(domain, names, env, rng)
        va = _float_eval(a, feeds, env, sh, "a")
        vb = _float_eval(b, feeds, env, sh, "b")
        if any(array_relative_error(va[i], vb[perm[i]]) > 1e-7 for i in range(len(va))):
            return False
    return True


def engine_instance(domain: Domain, g: SmallGraph, sh: Shapes, tag: str, env: dict, rng) -> tuple[Graph, dict]:
    """The graph ``g`` at sizes ``env`` as a rule-engine :class:`~tvm_taso.ir.graph.Graph` with
    random float64 inputs: (graph, feeds)."""
    G = Graph()
    ids, feeds = {}, {}
    for leaf in sorted(g.leaves()):
        lf = domain.leaf(leaf)
        shape = tuple(env[(leaf, i)] for i in range(len(lf.dims)))
        nid = G.add_leaf("input", TensorType(shape, "float64"), None, key=leaf)
        ids[leaf] = (nid, 0)
        feeds[nid] = rng.standard_normal(shape)
    vals = {}

    def ref(r):
        return ids[r[1]] if r[0] == "L" else vals[r]

    for pos, (tname, refs) in enumerate(g.ops):
        t = TEMPLATES[tname]
        args = [ref(r) for r in refs]
        cut = sh.split_at[(tag, pos)].value(env) if t.kind == "split" else None
        cur = None
        for k, (name, attrs) in enumerate(relax_steps(t, G.type_of(args[0]).shape, cut)):
            nid = G.add(name, args if k == 0 else [cur], attrs)
            cur = (nid, 0)
        n = len(G.nodes[cur[0]].types)
        for j in range(n):
            vals[(pos, j)] = (cur[0], j)
    G.outputs = [ref(r) for r in g.outs]
    return G, feeds


def engine_check(rule, G, feeds, tol: float = 1e-7) -> tuple[bool, str]:
    """Match ``rule`` on ``G`` and apply it at every site; every rewrite must compute the same
    outputs, and at least one must apply."""
    expected = G.evaluate(feeds)
    applied = 0
    for m in find_matches(G, rule):
        new = apply(G, m)
        if new is None:
            continue
        got = new.evaluate(feeds)
        for ro, rn in zip(G.outputs, new.outputs):
            if array_relative_error(expected[ro], got[rn]) > tol:
                return False, "wrong values"
        applied += 1
    return (applied > 0), ("ok" if applied else "no site")
