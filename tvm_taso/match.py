"""The rule engine: find every site where a rule's source matches a graph, and apply the rule
at one chosen site.

Matching is driven by the rule data (:mod:`tvm_taso.rule`); it finds all sites, constants
included, and handles multi-output rules by matching roots one after another. The same rules
also compile to ``tvm.relax.dpl`` patterns (:mod:`tvm_taso.dpl`); the search uses this
matcher because it works on the small per-region graphs without rebuilding Relax per candidate.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Iterator

import numpy as np

from . import ops
from .graph import CycleError, Graph, Ref
from .ops import OpError
from .rule import FUNCTIONS, Call, Get, Op, Rule, Scalar, Tup, Var


@dataclass(frozen=True)
class Match:
    rule: Rule
    roots: tuple[int, ...]  # node ids of the source roots
    env: tuple  # sorted (name, value) bindings: tensor vars to refs, attribute vars to values

    @property
    def bindings(self) -> dict:
        return dict(self.env)


_TENSOR = object()  # marks a tensor binding in env


def _match_attr(pat, value, env: dict) -> dict | None:
    if isinstance(pat, Var):
        key = "@" + pat.name
        if key in env:
            return env if _same_value(env[key], value) else None
        env = dict(env)
        env[key] = value
        return env
    if isinstance(pat, Tup):
        if not isinstance(value, tuple) or len(value) != len(pat.items):
            return None
        for p, v in zip(pat.items, value):
            env = _match_attr(p, v, env)
            if env is None:
                return None
        return env
    if isinstance(pat, Call):
        return env if _same_value(evaluate_attr(pat, env, None), value) else None
    return env if _same_value(pat, value) else None


def _same_value(a, b) -> bool:
    if isinstance(a, float) or isinstance(b, float):
        try:
            return abs(float(a) - float(b)) <= 1e-12 * max(1.0, abs(float(a)))
        except (TypeError, ValueError):
            return False
    if isinstance(a, (tuple, list)) and isinstance(b, (tuple, list)):
        return len(a) == len(b) and all(_same_value(x, y) for x, y in zip(a, b))
    return a == b


def _match_node(pat: Op, g: Graph, nid: int, env: dict) -> dict | None:
    node = g.nodes[nid]
    if node.op != pat.op or len(node.inputs) != len(pat.args):
        return None
    attrs = node.attr
    given = dict(pat.attrs)
    defaults = ops.OPS[pat.op].defaults
    for name, value in attrs.items():
        if name in given:
            env = _match_attr(given[name], value, env)
            if env is None:
                return None
        elif name in defaults and not _same_value(defaults[name], value):
            return None
    for p, ref in zip(pat.args, node.inputs):
        env = _match_expr(p, g, ref, env)
        if env is None:
            return None
    return env


def _match_expr(pat, g: Graph, ref: Ref, env: dict) -> dict | None:
    if isinstance(pat, Var):
        if ref[1] < 0 or g.nodes[ref[0]].types[ref[1]] is None:
            return None
        if pat.name in env:
            return env if env[pat.name] == ref else None
        env = dict(env)
        env[pat.name] = ref
        return env
    if isinstance(pat, Get):
        if ref[1] != pat.index:
            return None
        return _match_node(pat.expr, g, ref[0], env)
    if ref[1] != 0 or len(g.nodes[ref[0]].types) != 1:
        return None
    return _match_node(pat, g, ref[0], env)


def _match_root(pat, g: Graph, nid: int, env: dict) -> dict | None:
    """A source root matches a whole node (every output of a multi-output root)."""
    if isinstance(pat, Get):
        if pat.index >= len(g.nodes[nid].types):
            return None
        return _match_node(pat.expr, g, nid, env)
    return _match_node(pat, g, nid, env)


def evaluate_attr(x, env: dict, g: Graph | None):
    """Value of an attribute expression under the bindings of a match."""
    if isinstance(x, Var):
        if "@" + x.name in env:
            return env["@" + x.name]
        raise KeyError(x.name)
    if isinstance(x, Tup):
        return tuple(evaluate_attr(i, env, g) for i in x.items)
    if isinstance(x, Call):
        if x.fn in ("dim", "rank", "shape", "const?"):
            ref = env[x.args[0].name]
            if x.fn == "const?":
                return g.nodes[ref[0]].op == "const"
            shape = g.type_of(ref).shape
            if x.fn == "rank":
                return len(shape)
            if x.fn == "shape":
                return shape
            k = evaluate_attr(x.args[1], env, g)
            if not -len(shape) <= k < len(shape):
                raise OpError(f"dim {k} of rank {len(shape)}")
            return shape[k]
        return FUNCTIONS[x.fn](*(evaluate_attr(a, env, g) for a in x.args))
    return x


def find_matches(g: Graph, rule: Rule, by_op: dict[str, list[int]] | None = None) -> Iterator[Match]:
    """Every site of ``rule`` in ``g``, in a deterministic order."""
    if by_op is None:
        by_op = index_by_op(g)
    roots = rule.src

    def extend(k: int, chosen: tuple[int, ...], env: dict):
        if k == len(roots):
            try:
                ok = all(evaluate_attr(c, env, g) for c in rule.conds)
            except (OpError, KeyError, IndexError, TypeError, ValueError, ZeroDivisionError):
                ok = False
            if ok:
                yield Match(rule, chosen, tuple(sorted(env.items(), key=lambda kv: kv[0])))
            return
        pat = roots[k]
        op = pat.expr.op if isinstance(pat, Get) else pat.op
        for nid in by_op.get(op, ()):
            if nid in chosen:
                continue
            env2 = _match_root(pat, g, nid, env)
            if env2 is not None:
                yield from extend(k + 1, chosen + (nid,), env2)

    yield from extend(0, (), {})


def index_by_op(g: Graph) -> dict[str, list[int]]:
    by_op: dict[str, list[int]] = {}
    for nid in sorted(g.nodes):
        by_op.setdefault(g.nodes[nid].op, []).append(nid)
    return by_op


def _source_outputs(g: Graph, match: Match) -> list[Ref]:
    outs = []
    for pat, nid in zip(match.rule.src, match.roots):
        if isinstance(pat, Get):
            outs.append((nid, pat.index))
        else:
            outs.extend((nid, i) for i in range(len(g.nodes[nid].types)))
    return outs


def _instantiate(x, g: Graph, env: dict) -> list[Ref]:
    """Build a target expression into ``g``; returns its output refs."""
    if isinstance(x, Var):
        return [env[x.name]]
    if isinstance(x, Scalar):
        ty = g.type_of(env[x.like.name])
        value = np.array(evaluate_attr(x.value, env, g), dtype=ty.dtype)
        nid = g.add_leaf("const", ops.TensorType((), ty.dtype), (value, None), key=("scalar", value.item(), ty.dtype))
        return [(nid, 0)]
    if isinstance(x, Get):
        refs = _instantiate(x.expr, g, env)
        if x.index >= len(refs):
            raise OpError(f"get {x.index} of {len(refs)} outputs")
        return [refs[x.index]]
    args = []
    for a in x.args:
        refs = _instantiate(a, g, env)
        if len(refs) != 1:
            raise OpError(f"a {len(refs)}-output value used as an operand")
        args.append(refs[0])
    attrs = {name: evaluate_attr(v, env, g) for name, v in x.attrs}
    nid = g.add(x.op, args, attrs)
    return [(nid, i) for i in range(len(g.nodes[nid].types))]


def apply(g: Graph, match: Match) -> Graph | None:
    """A new graph with the rule applied at ``match``; None if the result would not be valid
    (types differ, an op rejects its operands, or a cycle appears)."""
    env = match.bindings
    src = _source_outputs(g, match)
    new = g.copy()
    try:
        dst = [ref for x in match.rule.dst for ref in _instantiate(x, new, env)]
    except (OpError, KeyError, IndexError, TypeError, ValueError, ZeroDivisionError):
        return None
    if len(dst) != len(src):
        return None
    for s, d in zip(src, dst):
        if new.type_of(d) != g.type_of(s):
            return None
    mapping = {s: d for s, d in zip(src, dst) if s != d}
    if not mapping:
        return None
    new.replace_uses(mapping)
    new.prune()
    try:
        new.topo_order()
    except CycleError:
        return None
    return new
