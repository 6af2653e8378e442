"""E-matching: the rule language's patterns matched against an e-graph, and rule targets added
to it.

The same :class:`~tvm_taso.rewrite.rule.Rule` data the backtracking search applies with
:mod:`tvm_taso.rewrite.match`, meaning the same (:mod:`tvm_taso.rewrite.semantics`: attributes
matched with :func:`match_attributes`, conditions and target attributes evaluated with
:func:`conditions_hold` and :func:`evaluate_attr`, over the e-classes' :class:`Shapes`). A match
binds tensor variables to e-classes (as refs ``(class, 0)``); a target becomes new e-nodes
unioned with the source's classes, only when its types are the source's (as
:func:`tvm_taso.rewrite.match.apply` checks), spelled as a graph spells its nodes
(:func:`~tvm_taso.ir.graph.normal_node`).
"""

from __future__ import annotations

from collections.abc import Iterator

import numpy as np

from tvm_taso.ir.graph import normal_node
from tvm_taso.ir.ops import OpError, TensorType
from tvm_taso.rewrite.rule import Call, Get, Op, Rule, Scalar, Tup, Var
from tvm_taso.rewrite.semantics import (
    EVALUATION_ERRORS,
    conditions_hold,
    evaluate_attr,
    match_attributes,
    same_value,
)
from tvm_taso.search.egraph import EGraph, EGraphView


class Shapes:
    """The e-classes' values as conditions and :func:`normal_node` read them
    (:class:`~tvm_taso.ir.graph.Values`), a ref ``(class, 0)`` standing for a class."""

    def __init__(self, eg: EGraph, view: EGraphView):
        self.eg, self.view = eg, view

    def type_of(self, ref) -> TensorType:
        return self.eg.ref_types[ref[0]][0]

    def is_constant(self, ref) -> bool:
        cid = ref[0]
        return cid in self.eg.const_refs or any(
            e[0] == "leaf" and self.eg.leaves[e[1]][0] == "const" for e in self.view.classes.get(cid, ())
        )


def reach(pat) -> int:
    """How far below a pattern's root class its match reads (e-class steps): a site is new in a
    round only if a class that close under its root changed."""
    if isinstance(pat, Get):
        return 1 + reach(pat.expr)
    if isinstance(pat, Op):
        return 1 + max((reach(a) for a in pat.args), default=0)
    return 0


def merges(rule: Rule) -> bool:
    """Whether a rule merges independent computations into one op: several roots, none reading
    an output of a multi-output op (``add-over-split``, ``split-of-split`` rewrite what a merge
    left behind instead)."""

    def reads_a_part(p) -> bool:
        return isinstance(p, Get) or (isinstance(p, Op) and (p.op == "split" or any(reads_a_part(a) for a in p.args)))

    return len(rule.src) > 1 and not any(reads_a_part(p) for p in rule.src)


_COMMUTATIVE_FUNCTIONS = {"=", "!=", "and", "or", "+", "*"}  # of rule.FUNCTIONS


def match_order(rule: Rule) -> tuple[int, ...]:
    """The order to match a rule's roots in: the deepest first, as its match binds the variables
    the others are then looked up by (split-of-split: ``split(get(split(x)))`` first, then only
    the splits of that ``x``)."""
    return tuple(sorted(range(len(rule.src)), key=lambda i: -reach(rule.src[i])))


def symmetric(rule: Rule) -> bool:
    """Whether a two-root rule reads the same with its roots swapped (each variable of one root
    exchanged with the one in the same place of the other; conditions unchanged as a set): its
    sites then come in pairs whose targets are equivalent (``concat(a, b)`` or ``concat(b, a)``
    weights), and one of each pair is enough."""
    if len(rule.src) != 2:
        return False
    swap: dict[str, str] = {}

    def pair(p, q) -> bool:
        if isinstance(p, Var) and isinstance(q, Var):
            return swap.setdefault(p.name, q.name) == q.name and swap.setdefault(q.name, p.name) == p.name
        if type(p) is not type(q):
            return False
        if isinstance(p, Op):
            return (p.op == q.op and len(p.args) == len(q.args) and [n for n, _ in p.attrs] == [n for n, _ in q.attrs]
                    and all(pair(a, b) for a, b in zip(p.args, q.args))
                    and all(pair(a, b) for (_, a), (_, b) in zip(p.attrs, q.attrs)))
        if isinstance(p, Get):
            return p.index == q.index and pair(p.expr, q.expr)
        if isinstance(p, (Call, Tup)):
            items_p = p.args if isinstance(p, Call) else p.items
            items_q = q.args if isinstance(q, Call) else q.items
            return (getattr(p, "fn", None) == getattr(q, "fn", None) and len(items_p) == len(items_q)
                    and all(pair(a, b) for a, b in zip(items_p, items_q)))
        return p == q

    def renamed(x):
        if isinstance(x, Var):
            return Var(swap.get(x.name, x.name))
        if isinstance(x, Op):
            return Op(x.op, tuple(renamed(a) for a in x.args), tuple((n, renamed(v)) for n, v in x.attrs))
        if isinstance(x, Get):
            return Get(renamed(x.expr), x.index)
        if isinstance(x, Call):
            return Call(x.fn, tuple(renamed(a) for a in x.args))
        if isinstance(x, Tup):
            return Tup(tuple(renamed(a) for a in x.items))
        return x

    def normal(x):  # operands of commutative functions in a fixed order
        if isinstance(x, Call):
            args = tuple(normal(a) for a in x.args)
            return Call(x.fn, tuple(sorted(args, key=repr)) if x.fn in _COMMUTATIVE_FUNCTIONS else args)
        if isinstance(x, Tup):
            return Tup(tuple(normal(a) for a in x.items))
        return x

    if not pair(rule.src[0], rule.src[1]):
        return False
    return {normal(renamed(c)) for c in rule.conds} == {normal(c) for c in rule.conds}


def _computes(x) -> bool:
    """Whether an attribute pattern evaluates a function (its value depends on the bindings)."""
    return isinstance(x, Call) or (isinstance(x, Tup) and any(_computes(i) for i in x.items))


def _attributes_compute(pat) -> bool:
    """Whether an attribute anywhere in a pattern evaluates a function of the bindings."""
    if isinstance(pat, Get):
        return _attributes_compute(pat.expr)
    if isinstance(pat, Op):
        return any(_computes(v) for _, v in pat.attrs) or any(_attributes_compute(a) for a in pat.args)
    return False


def _merged(env: dict, more: dict, checked=()) -> dict | None:
    """``env`` with the bindings of ``more``, or None where they disagree (``checked``: names
    known to agree)."""
    out = None
    for name, value in more.items():
        if name in env:
            if name not in checked and not same_value(env[name], value):
                return None
        else:
            if out is None:
                out = dict(env)
            out[name] = value
    return env if out is None else out


class Matcher:
    """Every site of a rule in one snapshot of the e-graph."""

    def __init__(self, eg: EGraph, view: EGraphView, memo: tuple[dict, dict]):
        self.eg, self.view = eg, view
        # across the rounds of one saturation (the rules, whose ids key them, stay alive):
        # (pattern id, op key) -> attribute bindings or None; pattern id -> whether its attributes compute
        self.attribute_memo, self.computes_memo = memo
        self.shapes = Shapes(eg, view)
        self._attrs: dict[int, dict] = {}
        self._near_by_op: dict = {}  # (op, id of a set the caller keeps for the round) -> e-nodes
        self._sites: dict = {}  # (root pattern id, id of the classes it is limited to) -> its sites
        self._indexes: dict = {}  # the same, with the variables joined on -> sites by their values
        self._depends: dict[int, bool] = {}  # root pattern id -> whether its attributes read other roots' bindings

    def attrs(self, op_key: int) -> dict:
        found = self._attrs.get(op_key)
        if found is None:
            found = self._attrs[op_key] = dict(self.eg.op_keys[op_key][1])
        return found

    def matches(self, rule: Rule, roots_in: set | None = None, accept=None,
                order: tuple[int, ...] | None = None) -> Iterator[tuple[tuple[int, ...], dict]]:
        """(root classes, bindings) of each site, one per distinct pair; with ``roots_in``, only
        the sites with a root among those classes; with ``accept``, only sites whose roots it
        accepts (asked when the last root is chosen). ``order``: :func:`match_order` of the
        rule, if the caller keeps it."""
        seen = set()
        order = order or match_order(rule)
        for position in range(len(rule.src)) if roots_in is not None else (None,):
            for chosen, env in self._join(rule, order, 0, (), {}, roots_in=roots_in, position=position,
                                          accept=accept):
                roots = tuple(chosen[order.index(i)] for i in range(len(order)))
                key = (roots, tuple(sorted(env.items(), key=lambda kv: kv[0])))
                if key in seen:
                    continue
                seen.add(key)
                if conditions_hold(rule, env, self.shapes):
                    yield roots, env

    def _join(self, rule: Rule, order: tuple, k: int, chosen: tuple, env: dict, *, roots_in: set | None,
              position: int | None, accept):
        """Sites of the roots ``order[k:]`` (classes chosen in that order) agreeing with ``env``;
        the root at ``position`` taken from ``roots_in``. Each root's pattern is matched once per
        round on its own (:meth:`root_sites`) and joined with the roots before it on the
        variables they share, by a hash index (:meth:`_partners`): a merge rule's second matmul
        is looked up by the input the first one bound, not matched again for every first one."""
        if k == len(order):
            yield chosen, env
            return
        i = order[k]
        last = k == len(order) - 1
        for cid, site_env, checked in self._partners(rule.src[i], env, roots_in if i == position else None):
            if cid in chosen:
                continue
            if last and k and accept is not None and not accept(
                    tuple((chosen + (cid,))[order.index(j)] for j in range(len(order)))):
                continue
            env2 = _merged(env, site_env, checked)
            if env2 is not None:
                yield from self._join(rule, order, k + 1, chosen + (cid,), env2, roots_in=roots_in,
                                      position=position, accept=accept)

    def root_sites(self, pat, classes: set | None = None) -> list[tuple[int, dict]]:
        """(class, bindings) of every match of the root pattern ``pat`` on its own, in classes
        of ``classes`` if given (one of a round's sets of classes near a change)."""
        key = (id(pat), None if classes is None else id(classes))
        found = self._sites.get(key)
        if found is None:
            found = self._sites[key] = [(cid, env) for cid, node_pat, enode in self._root_candidates(pat, classes)
                                        for env in self._enode(node_pat, enode, {})]
        return found

    def _root_candidates(self, pat, classes: set | None):
        """(class, node pattern, e-node) for each e-node of the root pattern's op that may match
        it, in ``classes`` if given; a ``get`` root only in classes with that many outputs."""
        node_pat = pat.expr if isinstance(pat, Get) else pat
        candidates = self.near(node_pat.op, classes) if classes is not None else self.view.by_op.get(node_pat.op, ())
        for cid, enode in candidates:
            if not (isinstance(pat, Get) and pat.index >= len(self.view.types[cid])):
                yield cid, node_pat, enode

    def _partners(self, pat, env: dict, classes: set | None):
        """(class, bindings, names known to agree with ``env``) of each site of the root pattern
        ``pat`` that may agree with ``env`` (:func:`_merged` checks the rest)."""
        if env and self._reads_bindings(pat):  # its attributes are computed from other roots' bindings
            for cid, node_pat, enode in self._root_candidates(pat, classes):
                for env2 in self._enode(node_pat, enode, env):
                    yield cid, env2, env2.keys()
            return
        sites = self.root_sites(pat, classes)
        if not env:
            for cid, site_env in sites:
                yield cid, site_env, ()
            return
        # joined on the variables every site binds (a node lacking an attribute the pattern
        # names binds nothing for it); any other shared variable is checked by _merged
        key = (id(pat), None if classes is None else id(classes), tuple(sorted(env)))
        found = self._indexes.get(key)
        if found is None:
            common = set.intersection(*(set(e) for _, e in sites)) if sites else set()
            names = tuple(n for n in key[2] if n in common)
            index: dict = {}
            for site in sites:
                index.setdefault(tuple(site[1][n] for n in names), []).append(site)
            found = self._indexes[key] = (frozenset(names), names, index)
        checked, names, index = found
        for cid, site_env in index.get(tuple(env[n] for n in names), ()):
            yield cid, site_env, checked

    def _reads_bindings(self, pat) -> bool:
        found = self._depends.get(id(pat))
        if found is None:
            found = self._depends[id(pat)] = _attributes_compute(pat)
        return found

    def near(self, op: str, classes: set) -> list:
        """The e-nodes of ``op`` in ``classes`` (one of a round's sets of classes near a change)."""
        key = (op, id(classes))
        found = self._near_by_op.get(key)
        if found is None:
            found = self._near_by_op[key] = [(cid, e) for cid, e in self.view.by_op.get(op, ()) if cid in classes]
        return found

    def _enode(self, pat: Op, enode, env: dict):
        if enode[0] != "node" or len(enode[2]) != len(pat.args):
            return
        op, _ = self.eg.op_keys[enode[1]]
        if op != pat.op:
            return
        env = self._attributes(pat, enode[1], env)
        if env is not None:
            yield from self._args(pat.args, enode[2], 0, env)

    def _attributes(self, pat: Op, op_key: int, env: dict) -> dict | None:
        """:func:`match_attributes`, memoized per pattern and op key on an empty environment
        (then merged with ``env``) when the pattern's attributes compute nothing."""
        computes = self.computes_memo.get(id(pat))
        if computes is None:
            computes = self.computes_memo[id(pat)] = any(_computes(v) for _, v in pat.attrs)
        if computes:
            return match_attributes(pat, self.attrs(op_key), env)
        key = (id(pat), op_key)
        if key not in self.attribute_memo:
            self.attribute_memo[key] = match_attributes(pat, self.attrs(op_key), {})
        bound = self.attribute_memo[key]
        if bound is None:
            return None
        for name, value in bound.items():
            if name in env:
                if not same_value(env[name], value):
                    return None
            else:
                env = dict(env)
                env[name] = value
        return env

    def _args(self, pats, children, k: int, env: dict):
        if k == len(pats):
            yield env
            return
        for env2 in self._class(pats[k], children[k], env):
            yield from self._args(pats, children, k + 1, env2)

    def _class(self, pat, cid: int, env: dict):
        view = self.view
        if isinstance(pat, Var):
            if view.is_tuple(cid):
                return
            bound = env.get(pat.name)
            if bound is None:
                env = dict(env)
                env[pat.name] = (cid, 0)
                yield env
            elif bound == (cid, 0):
                yield env
            return
        if isinstance(pat, Get):
            if view.is_tuple(cid):
                return
            for enode in view.classes[cid]:
                if enode[0] == "get" and enode[1] == pat.index:
                    for inner in view.classes[enode[2][0]]:
                        yield from self._enode(pat.expr, inner, env)
                elif pat.index == 0 and enode[0] == "node":  # output 0 of a one-output op
                    yield from self._enode(pat.expr, enode, env)
            return
        if view.is_tuple(cid):
            return
        for enode in view.classes[cid]:
            yield from self._enode(pat, enode, env)


class Applier:
    """Adds rule targets to the e-graph for one round, reusing e-nodes it already holds;
    ``creator`` records the rule that first made each e-node, ``sites`` (when given) the target
    e-nodes of each rule applied (what extraction's rewrite moves choose together)."""

    def __init__(self, eg: EGraph, view: EGraphView, shapes: Shapes, creator: dict, sites: list | None = None):
        self.eg, self.view, self.shapes = eg, view, shapes
        self.creator, self.sites = creator, sites
        self._site: list = []
        self._new: dict = {}  # e-node -> Ref of this round's additions
        self._leaf: dict = {}
        for cid, enodes in view.classes.items():
            for e in enodes:
                if e[0] == "leaf":
                    self._leaf[eg.leaves[e[1]][3]] = cid
        self.changes = 0
        self.rule = ""

    def apply(self, rule: Rule, roots: tuple[int, ...], env: dict) -> bool:
        """Union the target of ``rule`` at this site with its source; False if it does not fit."""
        self.rule = rule.name
        src = []
        for pat, cid in zip(rule.src, roots):
            if isinstance(pat, Get):
                src.append(self._output(cid, pat.index))
            else:
                src.extend(self._outputs(cid))
        self._site = []
        try:
            dst = [c for x in rule.dst for c in self._build(x, env)]
        except EVALUATION_ERRORS:
            return False
        if len(dst) != len(src):
            return False
        types = self.eg.ref_types
        if any(types[s] != types[d] for s, d in zip(src, dst)):
            return False
        if self.sites is not None and self._site:
            self.sites.append(tuple(self._site))
        for s, d in zip(src, dst):
            if self._find(s) != self._find(d):
                self.eg.union(s, d)
                self.changes += 1
        return True

    def _find(self, ref: int) -> int:
        return self.view.canonical.get(ref, ref)

    def _enode(self, enode, make) -> int:
        self._site.append(enode)
        found = self.view.class_of.get(enode)
        if found is None:
            found = self._new.get(enode)
        if found is None:
            found = self._new[enode] = make()
            self.creator.setdefault(enode, self.rule)
            self.changes += 1
        return found

    def _output(self, cid: int, index: int) -> int:
        if not self.eg.ref_types[cid] or len(self.eg.ref_types[cid]) == 1:
            if index != 0:
                raise OpError(f"output {index} of a single-output value")
            return cid
        ty = self.eg.ref_types[cid][index]
        return self._enode(("get", index, (cid,)), lambda: self.eg.add_get(cid, index, ty))

    def _outputs(self, cid: int) -> list[int]:
        n = len(self.eg.ref_types[cid])
        return [cid] if n == 1 else [self._output(cid, i) for i in range(n)]

    def _build(self, x, env: dict) -> list[int]:
        if isinstance(x, Var):
            return [env[x.name][0]]
        if isinstance(x, Scalar):
            ty = self.shapes.type_of(env[x.like.name])
            value = np.array(evaluate_attr(x.value, env, self.shapes), dtype=ty.dtype)
            key = ("scalar", value.item(), ty.dtype)
            found = self._leaf.get(key)
            if found is None:
                found = self._leaf[key] = self.eg.add_leaf("const", TensorType((), ty.dtype), (value, None), key, None)
                self.changes += 1
            return [found]
        if isinstance(x, Get):
            refs = self._build(x.expr, env)
            if x.index >= len(refs):
                raise OpError(f"get {x.index} of {len(refs)} outputs")
            return [refs[x.index]]
        args = []
        for a in x.args:
            refs = self._build(a, env)
            if len(refs) != 1:
                raise OpError(f"a {len(refs)}-output value used as an operand")
            args.append(self._find(refs[0]))
        attrs = {name: evaluate_attr(v, env, self.shapes) for name, v in x.attrs}
        return self._outputs(self.add_op(x.op, args, attrs))

    def add_op(self, op: str, args: list[int], attrs: dict) -> int:
        """The class of ``op`` on the classes ``args`` (spelled by :func:`normal_node`, as a
        graph's node is), added if new; raises OpError if the types do not check."""
        node = normal_node(op, [(a, 0) for a in args], attrs, self.shapes)
        key = self.eg.op_key(op, node.attrs)
        enode = ("node", key, tuple(cid for cid, _ in node.inputs))
        if enode in self.view.class_of or enode in self._new:
            return self._enode(enode, None)
        types = node.output_types()
        return self._enode(enode, lambda: self.eg.add_node(key, enode[2], types))
