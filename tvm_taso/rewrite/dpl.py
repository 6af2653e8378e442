"""Rules as ``tvm.relax.dpl`` patterns: compile a rule, find its sites in a Relax function, and
rewrite one site, the TVM-native way. :class:`~tvm_taso.passes.ApplyRules` is built on it.

The search matches rules with :mod:`tvm_taso.rewrite.match` on per-region graphs; this module
finds sites of the same rule data in a ``relax.Function`` with DPL alone, so each can check
the other.

- :func:`to_pattern` compiles each source root: ``is_op`` calls (``concat`` takes an
  ``is_tuple``), ``is_tuple_get_item`` for ``(get ...)``, one shared ``wildcard()`` per tensor
  variable and per repeated subpattern, and ``.has_attr`` for literal attribute values, the
  op defaults of unmentioned attributes included. Every pattern also records DPL's used-by
  edges, so it is ready for a ``PatternContext`` when compiled inside one.
- :class:`Sites` finds sites with ``rewrite_call``, one single-root pattern per source root
  (:class:`RulePatterns` compiles them once): ``rewrite_bindings`` finds nothing when weights
  are constants and reports one match per call (TVM 0.27; :meth:`Sites.rewrite` works around
  both, below, as ``tests/test_dpl.py`` checks). Each DPL match is then read off the matched
  Relax calls: attribute variables are bound from the calls' attributes and every attribute
  checked, with :func:`~tvm_taso.rewrite.semantics.match_attributes`. A multi-root rule joins
  its roots' matches on the tensor variables they share (the sibling matmuls of one ``?x``: a
  use-def lookup), on distinct bindings; a root that shares no variable with those before it
  (``(relu ?a), (relu ?b)``) takes the matches independent of theirs. The rule's conditions are
  evaluated last (:func:`~tvm_taso.rewrite.semantics.conditions_hold`), on the graph of the
  matched block (:class:`~tvm_taso.ir.relax_bridge.BlockGraph`), which answers what they ask
  of a bound tensor: the bindings are refs into it, as the matcher's are.
- :meth:`Sites.rewrite` rewrites one site: single-root rules with ``rewrite_call``; multi-root
  rules with ``rewrite_bindings``, which matches only variables (0.27: constant weights, or a
  dataflow variable given with ``is_expr``, never match). Constants are therefore lifted to
  parameters for the rewrite and bound back afterwards, and the tensor variables bound to
  parameters are pinned with ``is_expr`` so that the first match is the chosen site; a site
  whose operands do not single it out this way raises ``LookupError``.

Limits: a site is a binding (a multi-output root needs the binding of the whole value, a
``(get ...)`` root its ``TupleGetItem`` binding), so an unused output is no root; of two
identical bindings (one node of the matcher's hash-consed graph) the first is the site; blocks
the bridge cannot read (``match_cast``) have no sites.
"""

from __future__ import annotations

from collections import Counter
from dataclasses import dataclass

import numpy as np
import tvm
import tvm_ffi
from tvm import relax
from tvm.relax.dpl import (
    CallPattern,
    ExprPattern,
    PatternContext,
    is_expr,
    is_tuple,
    is_tuple_get_item,
    rewrite_bindings,
    rewrite_call,
    wildcard,
)

from tvm_taso.ir import dims, ops
from tvm_taso.ir.graph import Graph
from tvm_taso.ir.ops import OpError
from tvm_taso.ir.relax_bridge import BlockGraph, function_symbols
from tvm_taso.rewrite.match import Match, independent, unlinked_roots
from tvm_taso.rewrite.rule import Call, Get, Op, Rule, Scalar, Tup, Var
from tvm_taso.rewrite.semantics import conditions_hold, evaluate_attr, match_attributes, same_value

_NOT_LITERAL = object()


# -- compiling rules to patterns ------------------------------------------------------------


def to_pattern(rule: Rule, pinned: dict | None = None):
    """``(pattern, variables)``: the DPL pattern of the rule's source (a list of root patterns
    for a multi-root rule) and its tensor variables, name -> pattern. ``pinned`` maps variable
    names to Relax expressions matched with ``is_expr`` instead of ``wildcard()``."""
    compiler = _Compiler(pinned or {})
    roots = [compiler.pattern(p) for p in rule.src]
    return (roots[0] if len(roots) == 1 else roots), compiler.variables


class _Compiler:
    """One pattern object per variable and per distinct subpattern, so DPL enforces sharing."""

    def __init__(self, pinned: dict):
        self.pinned = pinned
        self.variables: dict = {}
        self.memo: dict = {}

    def pattern(self, p):
        if isinstance(p, Var):
            if p.name not in self.variables:
                pin = self.pinned.get(p.name)
                self.variables[p.name] = wildcard() if pin is None else is_expr(pin)
            return self.variables[p.name]
        if p not in self.memo:
            self.memo[p] = self._get(p) if isinstance(p, Get) else self._op(p)
        return self.memo[p]

    def _get(self, p: Get):
        inner = self.pattern(p.expr)
        result = is_tuple_get_item(inner, p.index)
        inner.used_by(result, 0)
        return result

    def _op(self, p: Op):
        args = [self.pattern(a) for a in p.args]
        operands = [is_tuple(args)] if p.op == "concat" else args
        # the attribute's own operand (reshape's shape): its value is checked on the graph's node
        operands = operands + [wildcard() for _ in range(ops.OPS[p.op].trailing_operands)]
        call = CallPattern(ExprPattern(tvm.ir.Op.get(ops.OPS[p.op].relax_name)), operands, add_constraint=False)
        attrs = literal_attrs(p)
        result = call.has_attr(attrs) if attrs else call
        for i, a in enumerate(args):
            a.used_by(result, -1 if p.op == "concat" else i)
        return result


def literal_attrs(p: Op) -> dict:
    """The attribute values a call must have for ``p`` to match: its literal attributes and
    the defaults of those it does not mention, as Relax attribute values."""
    spec = ops.OPS[p.op]
    values = {**spec.defaults, **dict(p.attrs)}
    literals = {name: _literal(v) for name, v in values.items() if name not in spec.not_relax_attrs}
    return {name: v for name, v in literals.items() if v is not _NOT_LITERAL}


def _literal(x):
    if isinstance(x, (Var, Call)):
        return _NOT_LITERAL
    if isinstance(x, Tup):
        items = [_literal(i) for i in x.items]
        return _NOT_LITERAL if any(i is _NOT_LITERAL for i in items) else items
    return list(x) if isinstance(x, tuple) else x


# -- sites ----------------------------------------------------------------------------------


@dataclass(frozen=True)
class Site:
    """Where a rule matches: the binding variables of its roots and their values, with the
    match in the graph of their block (attribute values, tensor refs into ``graph``)."""

    vars: tuple
    values: tuple
    match: Match
    graph: Graph


class RulePatterns:
    """A rule's source roots compiled once, each as a pattern of its own (for ``rewrite_call``)."""

    def __init__(self, rule: Rule):
        self.rule = rule
        self.roots = []  # one compiler per root, holding the root's pattern and subpatterns
        for root in rule.src:
            compiler = _Compiler({})
            compiler.pattern(root)
            self.roots.append(compiler)


@dataclass(frozen=True)
class _RootMatch:
    """A DPL match of one source root: its binding and the bindings it makes."""

    position: int  # of the root binding in the function
    var: relax.Var
    value: relax.Expr
    block: BlockGraph
    node: int
    env: dict


class Sites:
    """The sites of rules in one Relax function, found with DPL (see the module's docstring).

    The function's blocks are read once into graphs (:class:`BlockGraph`): they give each
    matched Relax expression its type and its canonical attributes.
    """

    def __init__(self, func: relax.Function):
        self.func = func
        self.blocks: list[BlockGraph] = []
        self.where: dict = {}  # binding value -> (var, BlockGraph)
        self.position: dict = {}  # binding var -> index in the function
        self.leaves: dict = {}  # (BlockGraph, parameter or constant) -> ref
        self.called: set = set()  # names of the Relax ops the function calls
        try:
            self.variables = function_symbols(func)  # its symbolic sizes, which targets are written with
        except OpError:
            self.variables = None
        for block in func.body.blocks:
            try:
                if self.variables is None:
                    raise OpError("symbols the engine cannot tell apart")
                bg = BlockGraph(block, Counter(), self.variables)
            except OpError:
                continue
            self.blocks.append(bg)
            for b in block.bindings:
                self.where[b.value] = (b.var, bg)
                self.position[b.var] = len(self.position)
                if isinstance(b.value, relax.Call) and isinstance(b.value.op, tvm.ir.Op):
                    self.called.add(b.value.op.name)
            for nid, node in bg.graph.nodes.items():
                if node.op in ("input", "const"):
                    self.leaves[bg, node.payload if node.op == "input" else node.payload[1]] = (nid, 0)

    def of(self, rule: Rule | RulePatterns) -> list[Site]:
        """The sites of a rule (or of its compiled patterns), in binding order."""
        patterns = rule if isinstance(rule, RulePatterns) else RulePatterns(rule)
        rule = patterns.rule
        if any(ops.OPS[op].relax_name not in self.called for op in rule.root_ops):
            return []
        per_root = [self._root_matches(root, compiler) for root, compiler in zip(rule.src, patterns.roots)]
        unlinked = unlinked_roots(rule)
        found = []
        for combo in _joined(per_root):
            graph = combo[0].block.graph
            # a root that shares no variable with those before it (parallel ops) is a site
            # only where it is independent of them, as in the matcher
            nodes = tuple(m.node for m in combo)
            if any(unlinked[k] and not independent(graph, nodes[k], nodes[:k]) for k in range(len(nodes))):
                continue
            env = {}
            for m in combo:
                env.update(m.env)
            if conditions_hold(rule, env, graph):
                match = Match(rule, tuple(m.node for m in combo), tuple(sorted(env.items(), key=lambda kv: kv[0])))
                found.append(Site(tuple(m.var for m in combo), tuple(m.value for m in combo), match, graph))
        # two identical bindings are one node of the block's hash-consed graph: one site
        unique = {}
        for site in sorted(found, key=lambda s: [self.position[v] for v in s.vars]):
            unique.setdefault((site.match.roots, site.match.env), site)
        return list(unique.values())

    def _root_matches(self, root, compiler: _Compiler) -> list[_RootMatch]:
        """Every binding where DPL matches the source root ``root`` alone, its attributes
        checked."""
        found = []

        def record(expr, matchings):
            if not isinstance(expr, relax.Var) and expr in self.where:  # aliases are no sites
                var, bg = self.where[expr]
                env = self._read(root, matchings, compiler, bg, {}, is_root=True)
                if env is not None:
                    found.append(_RootMatch(self.position[var], var, expr, bg, bg.env[var][0], env))
            return expr

        rewrite_call(compiler.pattern(root), record, self.func)
        return found

    def _ref(self, expr, bg: BlockGraph):
        """The value of ``bg``'s graph that a matched Relax expression is, or None. (DPL reports
        a matched variable's bound value; a value bound in another block is an input here.)"""
        if expr in self.where:
            var, owner = self.where[expr]
            if owner is bg:
                return bg.env[var]
            expr = var
        if isinstance(expr, relax.Var) and expr in bg.env:
            return bg.env[expr]
        return self.leaves.get((bg, expr))

    def _read(self, p, matchings, compiler, bg: BlockGraph, env: dict, is_root=False) -> dict | None:
        """``env`` extended by the bindings of DPL's match of pattern ``p``, or None where the
        matched values are not what the rule means (not a tensor, an attribute off)."""
        g = bg.graph
        if isinstance(p, Var):
            ref = self._ref(matchings[compiler.variables[p.name]], bg)
            if ref is None or ref[1] < 0 or g.nodes[ref[0]].types[ref[1]] is None:
                return None
            if env.get(p.name, ref) != ref:
                return None
            return {**env, p.name: ref}
        call = p.expr if isinstance(p, Get) else p
        ref = self._ref(matchings[compiler.memo[call]], bg)
        if ref is None:
            return None
        node = g.nodes[ref[0]]
        if node.op != call.op:  # read as opaque (a symbolic shape, say)
            return None
        if isinstance(p, Get) and p.index >= len(node.types):
            return None
        if not is_root and not isinstance(p, Get) and len(node.types) != 1:
            return None
        env = match_attributes(call, node.attr, env)
        before = env
        for arg in call.args:
            if env is None:
                return None
            env = self._read(arg, matchings, compiler, bg, env)
        if env is None:
            return None
        return self._in_graph_order(call, node, before, env, matchings, compiler, bg)

    def _in_graph_order(self, call: Op, node, before: dict, env: dict, matchings, compiler, bg: BlockGraph):
        """``env`` with ``call``'s operands bound in the order the matcher reads them (the
        graph node's), or None when the matcher would not match there. DPL matches add and
        multiply either way round, and the graph puts a constant operand second: where DPL's
        order is the node's reversed and both operands are variables bound here, they are
        bound again in the node's order; a reversed nested operand is no site of the matcher."""
        got = [self._operand_ref(a, matchings, compiler, bg, env) for a in call.args]
        if got == list(node.inputs):
            return env
        if len(got) != 2 or got[::-1] != list(node.inputs):
            return None
        x, y = call.args
        if not (isinstance(x, Var) and isinstance(y, Var)) or x.name in before or y.name in before:
            return None
        return {**env, x.name: node.inputs[0], y.name: node.inputs[1]}

    def _operand_ref(self, p, matchings, compiler, bg: BlockGraph, env: dict):
        """The graph value a pattern operand matched (read by :meth:`_read` before)."""
        if isinstance(p, Var):
            return env[p.name]
        ref = self._ref(matchings[compiler.memo[p.expr if isinstance(p, Get) else p]], bg)
        return (ref[0], p.index) if isinstance(p, Get) else ref

    def rewrite(self, site: Site) -> relax.Function:
        """The function with the site's rule applied at ``site`` (one of :meth:`of`'s); raises
        ValueError unless the rule's targets have the types of its sources."""
        if len(site.match.rule.src) == 1:
            return self._rewrite_call(site)
        return _rewrite_bindings(self.func, site, self.variables)

    def _rewrite_call(self, site: Site) -> relax.Function:
        rule = site.match.rule
        pattern, variables = to_pattern(rule)

        def rewrite(expr, matchings):
            if not expr.same_as(site.values[0]):
                return expr
            operands = {name: self._operand(matchings[p]) for name, p in variables.items()}
            return _replacements(rule, site, operands, self.variables)[0]

        return rewrite_call(pattern, rewrite, self.func)

    def _operand(self, expr):
        """The variable bound to ``expr`` (DPL reports a matched variable's value), else it."""
        if isinstance(expr, relax.Var) or expr not in self.where:
            return expr
        return self.where[expr][0]


def _joined(per_root: list) -> list[tuple]:
    """The combinations of root matches, one per root, in one block, on distinct nodes, that
    agree on the variables they share. Each root's matches are indexed by the tensor variables
    it shares with the roots before it, so a root is looked up, not searched."""
    seen: set = set()
    indexes = []
    for matches in per_root:
        names = set(matches[0].env) if matches else set()  # every match of a root binds the same names
        shared = sorted(n for n in names & seen if not n.startswith("@"))
        seen |= names
        index: dict = {}
        for m in matches:
            index.setdefault((id(m.block), *(m.env[n] for n in shared)), []).append(m)
        indexes.append((shared, index))
    combos = []

    def extend(combo: tuple, env: dict):
        if len(combo) == len(per_root):
            combos.append(combo)
            return
        shared, index = indexes[len(combo)]
        block = combo[0].block if combo else None
        keys = index if block is None else [(id(block), *(env[n] for n in shared))]
        for key in keys:
            for m in index.get(key, ()):
                if any(m.node == c.node for c in combo):
                    continue
                if all(same_value(env[n], v) for n, v in m.env.items() if n in env):
                    extend(combo + (m,), {**env, **m.env})

    extend((), {})
    return combos


def sites(func: relax.Function, rule: Rule) -> list[Site]:
    """The sites of ``rule`` in ``func``, in binding order (see :class:`Sites`)."""
    return Sites(func).of(rule)


# -- rewriting ------------------------------------------------------------------------------


def apply_at(func: relax.Function, rule: Rule, index: int) -> relax.Function:
    """``func`` with ``rule`` applied at its ``index``-th site only."""
    finder = Sites(func)
    found = finder.of(rule)
    if not 0 <= index < len(found):
        raise IndexError(f"{rule.name} has {len(found)} sites in the function, not {index + 1}")
    return finder.rewrite(found[index])


def _rewrite_bindings(func, site: Site, symbols: dict) -> relax.Function:
    rule = site.match.rule
    lifted, constants = _lift_constants(func)
    with PatternContext() as ctx:
        roots, variables = to_pattern(rule, _pins(site, lifted, constants))
    applied = []

    def rewrite(matchings, _bindings):
        if not all(matchings[r].same_as(v) for r, v in zip(roots, site.vars)):
            return {}
        applied.append(site)
        operands = {name: matchings[p] for name, p in variables.items()}
        return dict(zip(site.vars, _replacements(rule, site, operands, symbols)))

    new = rewrite_bindings(ctx, rewrite, lifted)
    if not applied:
        raise LookupError(f"rewrite_bindings did not report the chosen site of {rule.name} first")
    return new.bind_params({var: const for var, const in constants})


@relax.expr_functor.mutator
class _ConstantLifter(relax.PyExprMutator):
    """Replaces every tensor constant by a new variable (one per constant object)."""

    def __init__(self):
        super().__init__()
        self.lifted: list = []  # (var, constant)

    def visit_generic_const_(self, const):
        if not isinstance(const.ty, relax.TensorType):
            return const
        for var, c in self.lifted:
            if c.same_as(const):
                return var
        var = relax.Var(f"taso_const{len(self.lifted)}", const.ty)
        self.lifted.append((var, const))
        return var


def _lift_constants(func: relax.Function):
    """``func`` with its tensor constants as extra parameters, and the (parameter, constant)
    pairs that bind them back."""
    lifter = _ConstantLifter()
    body = lifter.visit_expr(func.body)
    params = list(func.params) + [var for var, _ in lifter.lifted]
    return relax.Function(params, body, func.ret_ty, func.is_pure, func.attrs), lifter.lifted


def _pins(site: Site, lifted: relax.Function, constants: list) -> dict:
    """The site's tensor variables bound to parameters of ``lifted``, name -> parameter."""
    param_of = [(c, v) for v, c in constants] + [(p, p) for p in lifted.params]
    pins = {}
    for name, value in site.match.env:
        node = site.graph.nodes[value[0]] if not name.startswith("@") else None
        if node is None or node.op not in ("input", "const"):
            continue
        leaf = node.payload if node.op == "input" else node.payload[1]
        pins.update((name, param) for expr, param in param_of if expr.same_as(leaf))
    return pins


def _replacements(rule: Rule, site: Site, operands: dict, variables: dict) -> list:
    """The new value of each root binding of ``site``: the rule's targets built with Relax ops
    (symbolic sizes written with the function's ``variables``), their outputs dealt out to the
    roots in order (a multi-output root takes a tuple). Raises ValueError unless each value has
    its root's type (shapes and dtypes)."""
    builder = _Builder(operands, site.match.bindings, site.graph, variables)
    targets = [builder.build(t) for t in rule.dst]
    outputs = []  # (expression, type) per output
    for expr, ty in zip(targets, _types(targets)):
        if isinstance(ty, relax.TupleType):
            outputs.extend((relax.TupleGetItem(expr, i), field) for i, field in enumerate(ty.fields))
        else:
            outputs.append((expr, ty))
    values, k = [], 0
    for var in site.vars:
        want = list(var.ty.fields) if isinstance(var.ty, relax.TupleType) else [var.ty]
        got = outputs[k : k + len(want)]
        k += len(want)
        if len(got) != len(want) or not all(tvm_ffi.structural_equal(t, w) for (_, t), w in zip(got, want)):
            raise ValueError(f"{rule.name}: target types {[str(t) for _, t in got]} differ from {var.ty}")
        values.append(got[0][0] if isinstance(var.ty, relax.TensorType) else relax.Tuple([e for e, _ in got]))
    if k != len(outputs):
        raise ValueError(f"{rule.name}: {len(outputs)} target outputs for {k} source outputs")
    return values


def _types(exprs: list) -> list:
    """The Relax types of nested expressions, inferred in a scratch scope (the expressions
    themselves stay nested: the rewriters emit their bindings)."""
    scratch = relax.BlockBuilder()
    with scratch.testing_scope([]):
        return [scratch.normalize(e).ty for e in exprs]


class _Builder:
    """A target expression as nested Relax op calls; equal subexpressions are built once."""

    def __init__(self, operands: dict, env: dict, graph: Graph, variables: dict):
        self.operands = operands
        self.env = env
        self.graph = graph
        self.variables = variables
        self.memo: dict = {}

    def build(self, x):
        if isinstance(x, Var):
            return self.operands[x.name]
        if x not in self.memo:
            self.memo[x] = self._build(x)
        return self.memo[x]

    def _build(self, x):
        if isinstance(x, Scalar):
            dtype = self.graph.type_of(self.env[x.like.name]).dtype
            return relax.const(np.array(evaluate_attr(x.value, self.env, self.graph), dtype=dtype), dtype)
        if isinstance(x, Get):
            return relax.TupleGetItem(self.build(x.expr), x.index)
        spec = ops.OPS[x.op]
        attrs = dict(spec.defaults)
        attrs.update((name, dims.to_prim(evaluate_attr(v, self.env, self.graph), self.variables))
                     for name, v in x.attrs)
        return spec.build([self.build(a) for a in x.args], attrs)
