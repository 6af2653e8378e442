"""Rules as ``tvm.relax.dpl`` patterns: compile a rule, list its sites in a Relax function,
and apply it at one chosen site, the TVM-native way.

The search uses :mod:`tvm_taso.match` on per-region graphs; this module applies the same rule
data directly to a ``relax.Function`` and cross-checks that matcher.

- :func:`to_pattern` compiles each source root: ``is_op`` calls (``concat`` takes an
  ``is_tuple``), ``is_tuple_get_item`` for ``(get ...)``, one shared ``wildcard()`` per tensor
  variable and per repeated subpattern, and ``.has_attr`` for literal attribute values, the
  op defaults of unmentioned attributes included. Attribute variables and conditions are left
  to a post-check with our evaluator. Every pattern also records DPL's used-by edges, so it is
  ready for a ``PatternContext`` when compiled inside one.
- :func:`sites` lists the sites of a rule in binding order. Single-root rules: every
  ``rewrite_call`` match, kept when our matcher accepts that root (attribute variables and
  conditions). Multi-root rules: ``rewrite_bindings`` reports only the first match, so their
  sites come from our matcher.
- :func:`apply_at` rewrites one site: single-root rules with ``rewrite_call``; multi-root rules
  with ``rewrite_bindings``, which matches only variables (0.27: constant weights, or a
  dataflow variable given with ``is_expr``, never match). Constants are therefore lifted to
  parameters for the rewrite and bound back afterwards, and the tensor variables bound to
  parameters are pinned with ``is_expr`` so that the first match is the chosen site; a site
  whose operands do not single it out this way raises ``LookupError``.

Limits: a site is a binding (a multi-output root of a multi-root rule needs the binding of the
whole value, a ``(get ...)`` root its ``TupleGetItem`` binding), so two identical bindings are
two DPL sites where our hash-consed graph has one; blocks the bridge cannot read
(``match_cast``) have no sites.
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

from . import ops
from .graph import Graph
from .match import Match, evaluate_attr, find_matches
from .ops import OpError
from .relax_bridge import BlockGraph
from .rule import Call, Get, Op, Rule, Scalar, Tup, Var

# Rule attributes that Relax does not store under that name and value, never given to
# ``has_attr``: split keeps ``indices_or_sections`` (a count or int64 cut points), reshape takes
# its shape as an operand, permute_dims stores ``axes=None`` for the full reversal.
_NOT_RELAX_ATTRS = {"split": {"indices"}, "reshape": {"shape"}, "permute_dims": {"axes"}}

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
        call = CallPattern(ExprPattern(tvm.ir.Op.get(ops.OPS[p.op].relax_name)), operands, add_constraint=False)
        attrs = literal_attrs(p)
        result = call.has_attr(attrs) if attrs else call
        for i, a in enumerate(args):
            a.used_by(result, -1 if p.op == "concat" else i)
        return result


def literal_attrs(p: Op) -> dict:
    """The attribute values a call must have for ``p`` to match: its literal attributes and
    the defaults of those it does not mention, as Relax attribute values."""
    values = {**ops.OPS[p.op].defaults, **dict(p.attrs)}
    skip = _NOT_RELAX_ATTRS.get(p.op, set())
    literals = {name: _literal(v) for name, v in values.items() if name not in skip}
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
    """Where a rule matches: the binding variables of its roots and their values, with our
    matcher's bindings (attribute values, tensor refs into ``graph``)."""

    vars: tuple
    values: tuple
    match: Match
    graph: Graph


class _Bindings:
    """A function's bindings, each with the graph of its block."""

    def __init__(self, func: relax.Function):
        self.blocks: list[BlockGraph] = []
        self.where: dict = {}  # binding value -> (var, BlockGraph)
        self.value_of: dict = {}  # var -> binding value
        for block in func.body.blocks:
            try:
                bg = BlockGraph(block, Counter())
            except OpError:
                continue
            self.blocks.append(bg)
            for b in block.bindings:
                self.where[b.value] = (b.var, bg)
                self.value_of[b.var] = b.value

    def operand(self, expr):
        """The variable bound to ``expr`` (DPL reports a matched variable's value), else it."""
        if isinstance(expr, relax.Var) or expr not in self.where:
            return expr
        return self.where[expr][0]

    def root_site(self, rule: Rule, expr) -> Site | None:
        """The site of a single-root rule at the binding whose value is ``expr``, if our
        matcher accepts it there. Aliases (``gv = lv``) are not sites of their own."""
        if isinstance(expr, relax.Var) or expr not in self.where:
            return None
        var, bg = self.where[expr]
        nid = bg.env[var][0]
        match = next(find_matches(bg.graph, rule, {rule.root_ops[0]: [nid]}), None)
        return None if match is None else Site((var,), (expr,), match, bg.graph)

    def graph_sites(self, rule: Rule) -> list[Site]:
        """Every site of our matcher whose roots are all bindings."""
        found = []
        for bg in self.blocks:
            var_of = {}
            for var, ref in bg.env.items():
                var_of.setdefault(ref, var)
            for match in find_matches(bg.graph, rule):
                refs = [_root_ref(bg.graph, p, nid) for p, nid in zip(rule.src, match.roots)]
                if all(r in var_of for r in refs):
                    roots = tuple(var_of[r] for r in refs)
                    found.append(Site(roots, tuple(self.value_of[v] for v in roots), match, bg.graph))
        return found


def _root_ref(g: Graph, pattern, nid: int):
    if isinstance(pattern, Get):
        return (nid, pattern.index)
    return (nid, 0) if len(g.nodes[nid].types) == 1 else (nid, -1)


def sites(func: relax.Function, rule: Rule) -> list[Site]:
    """The sites of ``rule`` in ``func``, in binding order (see the module's docstring)."""
    return _sites(func, rule, _Bindings(func))


def _sites(func: relax.Function, rule: Rule, bindings: _Bindings) -> list[Site]:
    if len(rule.src) > 1:
        return bindings.graph_sites(rule)
    pattern, _ = to_pattern(rule)
    found = []

    def record(expr, matchings):
        site = bindings.root_site(rule, expr)
        if site is not None:
            found.append(site)
        return expr

    rewrite_call(pattern, record, func)
    return found


# -- rewriting ------------------------------------------------------------------------------


def apply_at(func: relax.Function, rule: Rule, index: int) -> relax.Function:
    """``func`` with ``rule`` applied at its ``index``-th site only."""
    bindings = _Bindings(func)
    found = _sites(func, rule, bindings)
    if not 0 <= index < len(found):
        raise IndexError(f"{rule.name} has {len(found)} sites in the function, not {index + 1}")
    if len(rule.src) == 1:
        return _rewrite_call(func, rule, found[index], bindings)
    return _rewrite_bindings(func, rule, found[index])


def _rewrite_call(func, rule: Rule, site: Site, bindings: _Bindings) -> relax.Function:
    pattern, variables = to_pattern(rule)

    def rewrite(expr, matchings):
        if not expr.same_as(site.values[0]):
            return expr
        operands = {name: bindings.operand(matchings[p]) for name, p in variables.items()}
        return _replacements(rule, site, operands)[0]

    return rewrite_call(pattern, rewrite, func)


def _rewrite_bindings(func, rule: Rule, site: Site) -> relax.Function:
    lifted, constants = _lift_constants(func)
    with PatternContext() as ctx:
        roots, variables = to_pattern(rule, _pins(site, lifted, constants))
    applied = []

    def rewrite(matchings, _bindings):
        if not all(matchings[r].same_as(v) for r, v in zip(roots, site.vars)):
            return {}
        applied.append(site)
        operands = {name: matchings[p] for name, p in variables.items()}
        return dict(zip(site.vars, _replacements(rule, site, operands)))

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


def _replacements(rule: Rule, site: Site, operands: dict) -> list:
    """The new value of each root binding of ``site``: the rule's targets built with Relax ops,
    their outputs dealt out to the roots in order (a multi-output root takes a tuple). Raises
    ValueError unless each value has its root's type (shapes and dtypes)."""
    builder = _Builder(operands, site.match.bindings, site.graph)
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

    def __init__(self, operands: dict, env: dict, graph: Graph):
        self.operands = operands
        self.env = env
        self.graph = graph
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
        attrs.update((name, evaluate_attr(v, self.env, self.graph)) for name, v in x.attrs)
        return spec.build([self.build(a) for a in x.args], attrs)
