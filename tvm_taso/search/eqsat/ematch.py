"""E-matching: the rule language's patterns compiled to egglog rules, which egglog matches
relationally (:func:`compile_rules`); the sites it records checked for what egglog cannot state
here (:class:`Sites`: the checks are named below); and rule targets added to the e-graph
(:class:`Applier`).

The same :class:`~tvm_taso.rewrite.rule.Rule` data the backtracking search applies with
:mod:`tvm_taso.rewrite.match`, meaning the same (:mod:`tvm_taso.rewrite.semantics`: attributes
matched with :func:`attributes_matched`, conditions and target attributes evaluated with
:func:`conditions_hold` and :func:`evaluate_attr`, over the e-classes' :class:`Shapes`). A match
binds tensor variables to e-classes (as refs ``(class, 0)``); a target becomes new e-nodes
unioned with the source's classes, only when its types are the source's (as
:func:`tvm_taso.rewrite.match.apply` checks), spelled as a graph spells its nodes
(:func:`~tvm_taso.ir.graph.normal_node`).
"""

from __future__ import annotations

from collections.abc import Container, Iterator
from dataclasses import dataclass

import numpy as np

from tvm_taso.ir.graph import normal_node
from tvm_taso.ir.ops import OpError, TensorType
from tvm_taso.rewrite.rule import Call, Get, Op, Rule, Scalar, Tup, Var
from tvm_taso.rewrite.semantics import EVALUATION_ERRORS, attributes_matched, computes, conditions_hold, evaluate_attr, merged
from tvm_taso.search.eqsat.egraph import EGraph, EGraphView, node_term


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
    """How far below a pattern's root class its match reads (e-class steps)."""
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
    """The order a rule's roots are compiled in, and their attributes checked: the deepest first,
    as its match binds the variables the others are looked up by (split-of-split:
    ``split(get(split(x)))`` first, then only the splits of that ``x``)."""
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


class Applier:
    """Adds rule targets to the e-graph for one round, reusing e-nodes it already holds;
    ``creator`` records the rule that first made each e-node, ``sites`` (when given) the target
    e-nodes of each rule applied (what extraction's rewrite moves choose together)."""

    def __init__(self, eg: EGraph, view: EGraphView, shapes: Shapes, creator: dict, sites: list | None = None):
        self.eg, self.view, self.shapes = eg, view, shapes
        self.creator, self.sites = creator, sites
        self._site: list = []
        self._new: dict = {}  # e-node -> Ref of this round's additions
        # (op, operand classes, attributes as a target gave them) -> its e-node: normal_node's
        # spelling and type inference once per round (four in ten targets repeat one)
        self._spelled: dict = {}
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
        spelled = (op, tuple(args), tuple(attrs.items()))
        try:
            enode = self._spelled.get(spelled)
        except TypeError:  # an attribute value that does not hash (a list, from a rule built in code)
            enode = spelled = None
        if enode is not None:
            return self._enode(enode, None)
        node = normal_node(op, [(a, 0) for a in args], attrs, self.shapes)
        key = self.eg.op_key(op, node.attrs)
        enode = ("node", key, tuple(cid for cid, _ in node.inputs))
        if enode in self.view.class_of or enode in self._new:
            found = self._enode(enode, None)
        else:
            types = node.output_types()
            found = self._enode(enode, lambda: self.eg.add_node(key, enode[2], types))
        if spelled is not None:
            self._spelled[spelled] = enode
        return found


# -- relational matching: the patterns' structure matched by egglog -----------------------------
#
# What egglog's queries cannot state, checked in Python per site found (egglog has no negation,
# no attribute values and no shape analysis in this e-graph):
#   TUPLE_OPERAND   a tensor variable binds no multi-output value;
#   GET_ROOT        a ``get i`` root reads an op with more than i outputs;
#   DISTINCT_ROOTS  the roots of a multi-output rule are distinct classes (egglog checks those
#                   of one part: ``!=``);
#   ATTRIBUTES      attribute patterns against the op's attributes: egglog checks each pattern's
#                   own (``Fits`` facts, stated by Python for each new op key), Python the
#                   variables several ops share and the attributes that compute (memoized);
#   CONDITIONS      the rule's conditions over shapes (:func:`conditions_hold`);
#   JOIN            roots that share no tensor variable (two transposes anywhere) are matched
#                   apart and paired here, lazily: egglog would build every pair;
# and, in :mod:`.runner`, the dependency filters of multi-output sites (cycles, repeated merges).
# Of those filters, egglog states one (ORIGINAL_ROOTS, :func:`original_roots`): a merge's roots
# are not all made by the rules, so egglog does not build the pairs of merged values that the
# e-graph's growth would otherwise multiply, only for Python to reject them.

RELATION = "{relation}"  # in a compiled program, where its relation's name goes


@dataclass(frozen=True)
class Part:
    """A connected part of a rule's roots (they share tensor variables), matched by egglog: its
    relation's columns are the classes of ``roots``, the classes of the rule's tensor variables
    ``variables`` and the op keys of the rule's op patterns ``ops`` (indexes into the rule's)."""

    relation: str
    roots: tuple[int, ...]
    variables: tuple[int, ...]
    ops: tuple[int, ...]


@dataclass(frozen=True)
class CompiledRule:
    """A rule's source patterns as egglog rules, one :class:`Part` per connected part of its
    roots; ``variables``: its tensor variables; ``ops``: its op patterns in the order their
    attributes are checked (the roots in :func:`match_order`, each from its root down)."""

    rule: Rule
    variables: tuple[str, ...]
    ops: tuple[Op, ...]
    parts: tuple[Part, ...]
    needs: tuple[tuple[int, ...], ...] = ()  # :func:`original_roots`


def fit_key(pat: Op) -> tuple | None:
    """What decides whether an op's attributes fit ``pat``'s on their own (its op and attribute
    patterns, variables renamed in order of appearance), or None for a pattern whose attributes
    compute (checked in Python only)."""
    if any(computes(v) for _, v in pat.attrs):
        return None
    names: dict[str, str] = {}

    def renamed(x):
        if isinstance(x, Var):
            return Var(names.setdefault(x.name, f"a{len(names)}"))
        if isinstance(x, Tup):
            return Tup(tuple(renamed(i) for i in x.items))
        return x

    return (pat.op, tuple((name, renamed(v)) for name, v in pat.attrs))


def original_roots(rule: Rule) -> list[tuple[int, ...]]:
    """ORIGINAL_ROOTS: for a merge (:func:`merges`), the sets of its roots of which one must be
    all of the input graph's classes (``Orig``, :meth:`.egraph.EGraph.mark_loaded`) for a site to
    be offered; none for other rules. Merges grow one input value at a time (the runner's
    ``Dependencies.redundant``): of a merge's roots at most one is a class the rules made. For a
    symmetric rule, whose roots come in increasing class order, that one is the last, and the
    rules' classes are numbered after the input graph's: its first root is the input graph's."""
    if not merges(rule):
        return []
    if symmetric(rule):
        return [(0,)]
    roots = range(len(rule.src))
    return [tuple(j for j in roots if j != i) for i in roots]


def compile_rule(rule: Rule, op_number, fit_number=lambda pat: None) -> tuple[CompiledRule, list[str]]:
    """``rule`` compiled to egglog: the :class:`CompiledRule` (its parts' relations named
    :data:`RELATION` for now) and each part's egglog program. ``op_number(op)``: the number the
    e-nodes of op ``op`` carry; ``fit_number(pat)``: the number of ``pat``'s :func:`fit_key` in
    the ``Fits`` facts (whose op keys fit it on their own), or None. A ``get 0`` below a root
    may read a one-output op directly (as a graph's ref ``(node, 0)`` does): each such ``get``
    doubles a part's egglog rules."""
    variables: list[str] = []
    ops_in_order: list[Op] = []
    position: dict[int, int] = {}  # id of an op pattern -> its place in ops_in_order
    fresh = iter(range(1 << 30))

    def number(pat, root: int, used: dict) -> None:
        if isinstance(pat, Get):
            number(pat.expr, root, used)
        elif isinstance(pat, Op):
            position[id(pat)] = len(ops_in_order)
            ops_in_order.append(pat)
            used.setdefault(root, [set(), []])[1].append(position[id(pat)])
            for arg in pat.args:
                if isinstance(arg, Var):
                    if arg.name not in variables:
                        variables.append(arg.name)
                    used[root][0].add(variables.index(arg.name))
                else:
                    number(arg, root, used)

    def at_class(pat, cls: str, fits) -> list[list[str]]:
        """The alternative fact lists that match ``pat`` (an op or a ``get``) at the class ``cls``
        (``fits``: whether its ops' own attributes are stated as ``Fits`` facts)."""
        if isinstance(pat, Get):
            below = f"c{next(fresh)}"
            ways = [[f"(= {cls} (Get {below} {pat.index}))"] + f for f in op_at(pat.expr, below, fits)]
            return ways + (op_at(pat.expr, cls, fits) if pat.index == 0 else [])
        return op_at(pat, cls, fits)

    def op_at(pat: Op, cls: str, fits: bool) -> list[list[str]]:
        key = f"k{position[id(pat)]}"
        arg_classes, arg_ways = [], [[]]
        for arg in pat.args:
            if isinstance(arg, Var):
                arg_classes.append(f"v{variables.index(arg.name)}")
                continue
            name = f"c{next(fresh)}"
            arg_classes.append(name)
            arg_ways = [w + f for w in arg_ways for f in at_class(arg, name, fits)]
        head = [f"(= {cls} {node_term(op_number(pat.op), key, arg_classes)})"]
        fit = fit_number(pat) if fits else None
        if fit is not None:
            head.append(f"(Fits {fit} {key})")
        return [head + w for w in arg_ways]

    order = match_order(rule)
    needs = tuple(original_roots(rule))
    used: dict[int, list] = {}  # root -> [its variables, its ops]
    for i in order:
        number(rule.src[i], i, used)
    parts, programs = [], []
    for roots in _connected(order, {i: used[i][0] for i in order}):
        # a part of several roots states its ops' own attributes in egglog (Fits), as pairs
        # failing them would otherwise be built; a one-root part leaves them to Python, sharing
        # its egglog rule with the rules of its structure (each costs egglog at every push)
        ways = [[]]
        for i in roots:
            root = rule.src[i]
            ways = [w + f for w in ways
                    for f in op_at(root.expr if isinstance(root, Get) else root, f"r{i}", len(roots) > 1)]
        distinct = [f"(!= r{i} r{j})" for a, i in enumerate(roots) for j in roots[a + 1:]]
        ways = [w + distinct for w in ways]
        if len(roots) == len(rule.src) > 1 and needs:  # one part: all its roots here
            ways = [w + [f"(Orig r{j})" for j in needed] for w in ways for needed in needs]
        part_vars = sorted(set().union(*(used[i][0] for i in roots)))
        part_ops = sorted(j for i in roots for j in used[i][1])
        columns = [f"r{i}" for i in roots] + [f"v{k}" for k in part_vars] + [f"k{j}" for j in part_ops]
        sorts = ["T"] * (len(roots) + len(part_vars)) + ["i64"] * len(part_ops)
        lines = [f"(relation {RELATION} ({' '.join(sorts)}))"]
        lines += [f"(rule ({' '.join(facts)}) (({RELATION} {' '.join(columns)})) :ruleset match)" for facts in ways]
        # emptied once read: egglog matches only what is new, so the relation then holds only
        # the rows found since (reading every row each round cost more than matching)
        lines.append(f"(rule (({RELATION} {' '.join(columns)})) ((delete ({RELATION} {' '.join(columns)}))) :ruleset read)")
        parts.append(Part(RELATION, tuple(roots), tuple(part_vars), tuple(part_ops)))
        programs.append("\n".join(lines))
    return CompiledRule(rule, tuple(variables), tuple(ops_in_order), tuple(parts), needs), programs


def _connected(order: tuple[int, ...], variables: dict[int, set]) -> list[list[int]]:
    """The roots (in ``order``) grouped by shared variables, transitively."""
    groups: list[tuple[list[int], set]] = []
    for i in order:
        joined = [g for g in groups if g[1] & variables[i]]
        roots, names = [i], set(variables[i])
        for g in joined:
            roots, names = g[0] + roots, names | g[1]
            groups.remove(g)
        groups.append((roots, names))
    return [sorted(g[0], key=order.index) for g in groups]


def compile_rules(rules: list[Rule], op_number) -> tuple[dict[int, CompiledRule], list[tuple[str, int, str]], list[Op]]:
    """Each rule compiled (by rule id); the egglog programs ``(relation, class columns,
    program)``, one per distinct part (the generated rules share about half of their
    structures); and the op patterns the ``Fits`` facts number, one per :func:`fit_key`."""
    compiled, programs, relation_of = {}, [], {}
    fits: list[Op] = []
    fit_of: dict[tuple, int] = {}

    def fit_number(pat: Op) -> int | None:
        key = fit_key(pat)
        if key is None:
            return None
        if key not in fit_of:
            fit_of[key] = len(fits)
            fits.append(pat)
        return fit_of[key]

    for rule in rules:
        c, texts = compile_rule(rule, op_number, fit_number)
        parts = []
        for part, text in zip(c.parts, texts):
            relation = relation_of.get(text)
            if relation is None:
                relation = relation_of[text] = f"M{len(relation_of)}"
                programs.append((relation, len(part.roots) + len(part.variables), text.replace(RELATION, relation)))
            parts.append(Part(relation, part.roots, part.variables, part.ops))
        compiled[id(rule)] = CompiledRule(rule, c.variables, c.ops, tuple(parts), c.needs)
    return compiled, programs, fits


def _hashable(value):
    """An attribute value as an index key (lists, from a rule built in code, as tuples)."""
    return tuple(_hashable(v) for v in value) if isinstance(value, (list, tuple)) else value


class Sites:
    """The sites of compiled rules over the rounds of one saturation: the rows egglog recorded,
    checked in Python (the checks named above). Each round (:meth:`update`) only the rows new
    since the last are added to each rule's backlog; a site leaves it when it is rejected or
    applied, and one a round left (the node limit, a ban) is offered again in the next."""

    def __init__(self, eg: EGraph, compiled: dict[int, CompiledRule]):
        self.eg, self.compiled = eg, compiled
        self._backlog: dict[int, list] = {key: [] for key, c in compiled.items() if len(c.parts) == 1}
        self._done: dict[int, set] = {key: set() for key, c in compiled.items() if len(c.parts) > 1}
        # relation of a JOIN part -> every row read so far (the other relations' rows live in backlogs)
        self._rows: dict[str, list] = {part.relation: [] for key in self._done for part in compiled[key].parts}
        self._bound_memo: dict[int, dict] = {}  # id of a compiled rule -> op keys -> bindings (or _COMPUTES)

    def update(self, view: EGraphView, loaded: Container[int] | None = None) -> None:
        """Read a new snapshot: its new rows join the backlogs, renamed to the classes now.
        ``loaded``: the input graph's classes now, for ORIGINAL_ROOTS in JOIN rules (egglog
        states it for rules of one part)."""
        self.view, self.shapes, self.loaded = view, Shapes(self.eg, view), loaded
        self._attributed_now: dict = {}
        for relation, rows in self._rows.items():
            rows.extend(view.rows.get(relation, ()))
        for key, backlog in self._backlog.items():
            backlog.extend(view.rows.get(self.compiled[key].parts[0].relation, ()))

    def of(self, compiled: CompiledRule, accept=None) -> Iterator[tuple[tuple[int, ...], dict]]:
        """(root classes, bindings) of each site of ``compiled`` waiting to be checked."""
        key = id(compiled.rule)
        if key in self._done:
            yield from self._joined(compiled, accept)
            return
        part = compiled.parts[0]
        backlog = self._backlog[key] = self._renamed(part, self._backlog[key])
        k, offered = 0, False
        try:
            while k < len(backlog):
                row = backlog[k]
                k += 1
                site = self._site(compiled, (part,), (row,), accept)
                if site is not None:
                    offered = True
                    yield site
                    offered = False
        finally:  # the site the caller stopped at, and those after it, wait for the next round
            del backlog[:k - offered]

    def _joined(self, compiled: CompiledRule, accept):
        """JOIN: the sites of a rule whose roots share no tensor variable, paired here lazily,
        each part's rows joined with the ones before on the attribute variables they share
        (two convolutions merged into one grouped conv must have one stride: a hash index on
        it, not every pair)."""
        done = self._done[id(compiled.rule)]
        sides = [self._attributed(compiled, k) for k in range(len(compiled.parts))]
        indexes: list = [None]
        bound, bound_any = set(sides[0][1]), set(sides[0][2])
        for side, names, names_any in sides[1:]:
            shared = tuple(sorted(bound & names))
            index: dict = {}
            for row, env in side:
                index.setdefault(tuple(_hashable(env.get(n)) for n in shared), []).append((row, env))
            # when every name both sides may bind is indexed, a candidate agrees: no check
            indexes.append((shared, index, (bound_any & names_any) <= set(shared)))
            bound |= names
            bound_any |= names_any

        def pairs(k: int, rows: tuple, env: dict):
            if k == len(sides):
                yield rows
                return
            if k == 0:
                candidates, agree = sides[0][0], True
            else:
                shared, index, agree = indexes[k]
                candidates = index.get(tuple(_hashable(env.get(n)) for n in shared), ())
            for row, more in candidates:
                env2 = {**env, **more} if agree else merged(env, more)
                if env2 is not None:
                    yield from pairs(k + 1, rows + (row,), env2)

        for rows in pairs(0, (), {}):
            if rows in done:
                continue
            done.add(rows)  # taken back below if the caller stops at it
            site = self._site(compiled, compiled.parts, rows, accept)
            if site is not None:
                done.discard(rows)
                yield site
                done.add(rows)

    def _attributed(self, compiled: CompiledRule, k: int) -> tuple[list, set, set]:
        """Part ``k``'s rows whose ops' attributes fit on their own, each with the attribute
        variables they bind (patterns that compute attributes are left to :meth:`_site`); the
        names every row binds (an op lacking an attribute its pattern names binds nothing for
        it: such names are checked by :func:`merged`, not indexed) and the names any row binds.
        Worked out once per snapshot."""
        key = (id(compiled.rule), k)
        if key not in self._attributed_now:
            rows, names, names_any = self._attributed_rows(compiled, compiled.parts[k])
            if self.loaded is not None and len(compiled.needs) == 1 and compiled.needs[0] == compiled.parts[k].roots:
                rows = [(row, env) for row, env in rows if row[0] in self.loaded]  # ORIGINAL_ROOTS
            self._attributed_now[key] = rows, names, names_any
        return self._attributed_now[key]

    def _attributed_rows(self, compiled: CompiledRule, part: Part) -> tuple[list, set, set]:
        out, names, names_any = [], None, set()
        cut = len(part.roots) + len(part.variables)
        for row in self._all_rows(part):
            env: dict | None = {}
            for j, key in zip(part.ops, row[cut:]):
                pat = compiled.ops[j]
                if not any(computes(v) for _, v in pat.attrs):
                    env = attributes_matched(pat, self.eg.op_keys[key][1], env)
                    if env is None:
                        break
            if env is not None:
                out.append((row, env))
                names = set(env) if names is None else names & env.keys()
                names_any |= env.keys()
        return out, names or set(), names_any

    def _all_rows(self, part: Part) -> list[tuple]:
        return self._renamed(part, self._rows.get(part.relation, ()))

    def _renamed(self, part: Part, rows) -> list[tuple]:
        """``rows`` with their classes as this snapshot names them (a union renames a class to
        its smallest member), each once, in order: by root classes (in :func:`match_order`),
        then variables and ops, so that a round cut short applies the same sites whatever
        round each was found in."""
        n, named = len(part.roots) + len(part.variables), self.view.canonical.__getitem__
        return sorted({tuple(map(named, row[:n])) + row[n:] for row in rows})

    def _site(self, compiled: CompiledRule, parts, rows, accept) -> tuple[tuple[int, ...], dict] | None:
        """The site of one row per part: (roots, bindings), or None where a check fails (the
        cheapest checks first; the attributes of a rule whose patterns compute nothing are
        looked up by the row's op keys, before anything is bound)."""
        rule, view = compiled.rule, self.view
        roots: list = [None] * len(rule.src)
        for part, row in zip(parts, rows):
            for i, c in zip(part.roots, row):
                roots[i] = c
        roots = tuple(roots)
        if len(roots) > 1 and len(set(roots)) != len(roots):  # DISTINCT_ROOTS (across parts)
            return None
        if accept is not None and not accept(roots):
            return None
        keys: list = [None] * len(compiled.ops)
        for part, row in zip(parts, rows):
            for j, op_key in zip(part.ops, row[len(part.roots) + len(part.variables):]):
                keys[j] = op_key
        bound = self._bound(compiled, keys)
        if bound is None:  # ATTRIBUTES
            return None
        for i, pat in enumerate(rule.src):
            if isinstance(pat, Get) and pat.index >= len(view.types[roots[i]]):  # GET_ROOT
                return None
        classes: list = [None] * len(compiled.variables)
        for part, row in zip(parts, rows):
            for k, c in zip(part.variables, row[len(part.roots):len(part.roots) + len(part.variables)]):
                if view.is_tuple(c):  # TUPLE_OPERAND
                    return None
                classes[k] = c
        env = {name: (c, 0) for name, c in zip(compiled.variables, classes)}
        env = self._attributes(compiled, keys, env) if bound is _COMPUTES else {**env, **bound}
        if env is None or not conditions_hold(rule, env, self.shapes):  # CONDITIONS
            return None
        return roots, env

    def _bound(self, compiled: CompiledRule, keys: list):
        """ATTRIBUTES for op keys ``keys`` of a rule whose op patterns compute nothing: the
        attribute variables they bind, or None if they do not fit (memoized per rule: the same
        ops recur in row after row); :data:`_COMPUTES` for a rule with a pattern that computes
        (checked in order with the tensors bound, :meth:`_attributes`)."""
        memo = self._bound_memo.get(id(compiled))
        if memo is None:
            memo = self._bound_memo[id(compiled)] = (
                _COMPUTES if any(computes(v) for pat in compiled.ops for _, v in pat.attrs) else {})
        if memo is _COMPUTES:
            return _COMPUTES
        key = tuple(keys)
        found = memo.get(key, _COMPUTES)
        if found is _COMPUTES:
            found = memo[key] = self._attributes(compiled, keys, {})
        return found

    def _attributes(self, compiled: CompiledRule, keys: list, env: dict) -> dict | None:
        """ATTRIBUTES: each op pattern's attributes against its op key's, in order."""
        for pat, op_key in zip(compiled.ops, keys):
            env = attributes_matched(pat, self.eg.op_keys[op_key][1], env)
            if env is None:
                return None
        return env


_COMPUTES = object()  # Sites._bound: the rule's attributes are checked with its tensors bound
