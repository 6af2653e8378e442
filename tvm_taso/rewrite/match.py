"""The rule engine: find every site where a rule's source matches a graph, apply the rule at
one chosen site, and say why a rule does not match.

Matching is driven by the rule data (:mod:`tvm_taso.rewrite.rule`), what its attributes and
conditions mean by :mod:`tvm_taso.rewrite.semantics` (a :class:`Graph` answers what conditions
ask of a bound tensor); it finds all sites, constants included, and handles multi-output rules
by matching roots one after another. The same rules also compile to ``tvm.relax.dpl`` patterns
(:mod:`tvm_taso.rewrite.dpl`); the search uses this matcher because it works on the small
per-region graphs without rebuilding Relax per candidate. :func:`why_not` replays the matching
with a trace, in the spirit of onnxscript's ``MatchResult.fail(reason)``; the search never pays
for it.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Iterator

import numpy as np

from tvm_taso.ir import ops
from tvm_taso.ir.graph import CycleError, Graph, Ref
from tvm_taso.ir.ops import OpError
from tvm_taso.rewrite.rule import Get, Op, Rule, Scalar, Var, show
from tvm_taso.rewrite.semantics import EVALUATION_ERRORS, attributes_matched, conditions_hold, evaluate_attr, fail, match_attributes


@dataclass(frozen=True)
class Match:
    rule: Rule
    roots: tuple[int, ...]  # node ids of the source roots
    env: tuple  # sorted (name, value) bindings: tensor vars to refs, attribute vars to values

    @property
    def bindings(self) -> dict:
        return dict(self.env)


# Matching: each function returns the bindings extended by a match of ``pat``, or None; ``why``
# as in :mod:`tvm_taso.rewrite.semantics`.


def _match_node(pat: Op, g: Graph, nid: int, env: dict, why: list | None = None) -> dict | None:
    node = g.nodes[nid]
    if node.op != pat.op:
        return None if why is None else fail(why, f"node {nid} is {node.op}, not {pat.op}")
    if len(node.inputs) != len(pat.args):
        return None if why is None else fail(why, f"{pat.op} node {nid} has {len(node.inputs)} operands, not {len(pat.args)}")
    env = match_attributes(pat, node.attr, env, why) if why is not None else attributes_matched(pat, node.attrs, env)
    if env is None:
        return None
    for p, ref in zip(pat.args, node.inputs):
        env = _match_expr(p, g, ref, env, why)
        if env is None:
            return None
    return env


def _match_expr(pat, g: Graph, ref: Ref, env: dict, why: list | None = None) -> dict | None:
    if isinstance(pat, Var):
        if ref[1] < 0 or g.nodes[ref[0]].types[ref[1]] is None:
            return None if why is None else fail(why, f"?{pat.name} would be {_show_ref(g, ref)}, not a tensor")
        if pat.name in env:
            if env[pat.name] == ref:
                return env
            return None if why is None else fail(why, f"?{pat.name} is {_show_ref(g, env[pat.name])} and {_show_ref(g, ref)}")
        env = dict(env)
        env[pat.name] = ref
        return env
    if isinstance(pat, Get):
        if ref[1] != pat.index:
            return None if why is None else fail(why, f"{_show_ref(g, ref)} is not output {pat.index} of a {pat.expr.op}")
        return _match_node(pat.expr, g, ref[0], env, why)
    if ref[1] != 0 or len(g.nodes[ref[0]].types) != 1:
        return None if why is None else fail(why, f"{_show_ref(g, ref)} is not the one output of a {pat.op}")
    return _match_node(pat, g, ref[0], env, why)


def _match_root(pat, g: Graph, nid: int, env: dict, why: list | None = None) -> dict | None:
    """A source root matches a whole node (every output of a multi-output root)."""
    if isinstance(pat, Get):
        if pat.index >= len(g.nodes[nid].types):
            return None if why is None else fail(why, f"node {nid} has no output {pat.index}")
        return _match_node(pat.expr, g, nid, env, why)
    return _match_node(pat, g, nid, env, why)


# id of a rule -> (the rule, its unlinked_roots, the ops its source patterns name); the rule is
# held so that its id is not reused
_FACTS: dict[int, tuple[Rule, tuple[bool, ...], frozenset]] = {}


def _facts(rule: Rule) -> tuple[tuple[bool, ...], frozenset]:
    """What :func:`find_matches` asks of a rule on every graph, worked out once."""
    found = _FACTS.get(id(rule))
    if found is None or found[0] is not rule:
        if len(_FACTS) >= 4096:  # a long process parsing many rule sets starts again
            _FACTS.clear()
        found = _FACTS[id(rule)] = (rule, unlinked_roots(rule), frozenset(_ops_named(rule.src)))
    return found[1], found[2]


def _ops_named(patterns) -> set[str]:
    out: set[str] = set()
    for p in patterns:
        if isinstance(p, Get):
            out |= _ops_named((p.expr,))
        elif isinstance(p, Op):
            out.add(p.op)
            out |= _ops_named(p.args)
    return out


def find_matches(g: Graph, rule: Rule, by_op: dict[str, list[int]] | None = None) -> Iterator[Match]:
    """Every site of ``rule`` in ``g``, in a deterministic order."""
    if by_op is None:
        by_op = index_by_op(g)
    roots = rule.src
    unlinked, needed = _facts(rule)
    if not needed <= by_op.keys():
        return

    def extend(k: int, chosen: tuple[int, ...], env: dict):
        if k == len(roots):
            if conditions_hold(rule, env, g):
                yield Match(rule, chosen, tuple(sorted(env.items(), key=lambda kv: kv[0])))
            return
        pat = roots[k]
        op = pat.expr.op if isinstance(pat, Get) else pat.op
        for nid in by_op.get(op, ()):
            if nid in chosen or (unlinked[k] and not independent(g, nid, chosen)):
                continue
            env2 = _match_root(pat, g, nid, env)
            if env2 is not None:
                yield from extend(k + 1, chosen + (nid,), env2)

    yield from extend(0, (), {})


def _tensor_vars(p) -> set:
    if isinstance(p, Var):
        return {p.name}
    if isinstance(p, Get):
        return _tensor_vars(p.expr)
    if isinstance(p, Op):
        return set().union(*(_tensor_vars(a) for a in p.args))
    return set()


def unlinked_roots(rule: Rule) -> tuple[bool, ...]:
    """Per source root, whether it shares no tensor variable with the roots before it: the
    second root of ``(relu ?a), (relu ?b)``, a pair of parallel ops. Such a root only takes
    nodes independent of the roots chosen before (no path either way), so candidates are the
    pairs of parallel same-op nodes of the graph (a search region), not every pair."""
    seen: set = set()
    out = []
    for p in rule.src:
        names = _tensor_vars(p)
        out.append(bool(seen) and not names & seen)
        seen |= names
    return tuple(out)


def independent(g: Graph, nid: int, chosen: tuple[int, ...]) -> bool:
    """Whether no path joins node ``nid`` and any node of ``chosen``, in either direction."""
    position, ancestors = g.derived("ancestors", _ancestors)
    return all(not (ancestors[nid] >> position[c]) & 1 and not (ancestors[c] >> position[nid]) & 1 for c in chosen)


def _ancestors(g: Graph) -> tuple[dict, dict]:
    """(position of each node in topological order, each node's ancestors as a bit mask of
    positions)."""
    order = g.topo_order()
    position = {nid: k for k, nid in enumerate(order)}
    ancestors: dict[int, int] = {}
    for nid in order:
        mask = 0
        for src, _ in g.nodes[nid].inputs:
            mask |= ancestors[src] | (1 << position[src])
        ancestors[nid] = mask
    return position, ancestors


def why_not(g: Graph, rule: Rule, nid: int | None = None) -> str | None:
    """Why ``rule`` has no site in ``g`` (with node ``nid`` as its first root, when given), or
    None when it has one: the first failing check (op, operand count, attribute, shared
    variable, condition) of the candidate that got furthest, the first one among equals."""
    by_op = index_by_op(g)
    sites = find_matches(g, rule, by_op)
    if any(nid is None or m.roots[0] == nid for m in sites):
        return None
    op = rule.root_ops[0]
    candidates = [nid] if nid is not None else by_op.get(op, [])
    if not candidates:
        return f"no {op} node"
    return max((_trace(g, rule, by_op, n) for n in candidates), key=lambda depth_reason: depth_reason[0])[1]


def _trace(g: Graph, rule: Rule, by_op: dict, nid: int) -> tuple[int, str]:
    """How far ``rule`` gets with node ``nid`` as its first root (roots matched, conditions
    last) and why it stops there; later roots take the first node that fits."""
    why: list = []
    env = _match_root(rule.src[0], g, nid, {}, why)
    if env is None:
        return 0, f"node {nid}: {why[0]}"
    chosen = (nid,)
    for k, pat in enumerate(rule.src[1:], 1):
        op = rule.root_ops[k]
        others = [n for n in by_op.get(op, ()) if n not in chosen]
        if not others:
            return k, f"root {k + 1}: no {op} node besides node {', '.join(map(str, chosen))}"
        fit = next((n for n in others if _match_root(pat, g, n, env) is not None), None)
        if fit is None:
            _match_root(pat, g, others[0], env, why)
            return k, f"root {k + 1} {show(pat)}: node {others[0]}: {why[0]}"
        env = _match_root(pat, g, fit, env)
        chosen += (fit,)
    conditions_hold(rule, env, g, why)
    return len(rule.src), f"node{'s' * (len(chosen) > 1)} {', '.join(map(str, chosen))}: {why[0]}"


def _show_ref(g: Graph, ref: Ref) -> str:
    nid, index = ref
    node = g.nodes[nid]
    if index < 0:
        return f"the {len(node.types)} outputs of {node.op} node {nid}"
    return f"{node.op} node {nid}" + (f" output {index}" if len(node.types) > 1 else "")


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
    except EVALUATION_ERRORS:
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
