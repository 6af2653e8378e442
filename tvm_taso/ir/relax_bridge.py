"""Relax dataflow blocks to :class:`~tvm_taso.ir.graph.Graph` and back.

Reading keeps every binding: calls to known ops become op nodes, their shapes static or
symbolic (sizes of :mod:`tvm_taso.ir.dims`: the function's ``tirx.Var`` s by name); anything else
(unknown ops, shapes the engine does not model, tuples) becomes an ``opaque`` node that is
re-emitted unchanged, with a note of why in ``skipped``. Writing emits the graph's nodes in topological
order, reusing the original dataflow variables of nodes that survived, and binds each of the
block's output variables (the non-dataflow ones, visible after the block) to its new value.
"""

from __future__ import annotations

from collections import Counter

import numpy as np
import tvm
from tvm import relax

from tvm_taso.ir import dims, ops
from tvm_taso.ir.graph import LEAVES, Graph, Ref
from tvm_taso.ir.ops import OpError


# Functions already lowered (``Primitive``), pattern-matched for an external codegen
# (``Composite``) or handed to one (``Codegen``, BYOC partitions): not ours to rewrite, as for
# TVM's own passes.
FOREIGN_ATTRS = ("Primitive", "Composite", "Codegen")


def with_functions(mod: tvm.IRModule, functions: dict) -> tvm.IRModule:
    """A copy of ``mod`` with the functions of ``functions`` (global var -> function) replaced;
    ``mod`` itself stays as it was (an IRModule's item assignment changes it in place, and a pass
    is handed its caller's module)."""
    mod = mod.clone()
    for gvar, func in functions.items():
        mod[gvar] = func
    return mod


def foreign_function(func) -> str | None:
    """The attribute that makes ``func`` off limits to rewriting (see :data:`FOREIGN_ATTRS`),
    or None."""
    attrs = getattr(func, "attrs", None)
    if attrs is None:
        return None
    return next((key for key in FOREIGN_ATTRS if key in attrs), None)


def function_symbols(func) -> dict:
    """``{name: tirx.Var}`` of the symbolic sizes ``func`` defines (a rewritten block writes its
    sizes with these); OpError when two of them share a name (the engine knows symbols by name)."""
    found: dict = {}
    for var in relax.analysis.defined_symbolic_vars(func):
        if str(var.name) in found and not found[str(var.name)].same_as(var):
            raise OpError(f"two symbolic sizes named {var.name}")
        found[str(var.name)] = var
    return found


class FunctionSymbols:
    """A function's symbolic sizes: its ``tirx.Var`` s by name (:func:`function_symbols`), and
    where a block using some of them is priced (:func:`~tvm_taso.ir.dims.priced_points`: the
    user's ``given`` sizes, else the function's ``tir_var_lower_bound`` / ``tir_var_upper_bound``
    attributes, else the default)."""

    def __init__(self, func, given: dict | None = None):
        self.variables = function_symbols(func)
        attrs = func.attrs if func.attrs is not None else {}
        self.bounds = [{str(k): int(v) for k, v in (attrs.get(key) or {}).items()}
                       for key in ("tir_var_lower_bound", "tir_var_upper_bound")]
        self.given = given or {}

    def price(self, graph: Graph) -> dict:
        """Set ``graph.sizes`` to the points the symbols its known ops see (in their types, their
        operands' types and their attributes: what a kernel is priced on) are priced at; return
        where each symbol's sizes came from."""
        known = [n for n in graph.nodes.values() if n.op not in LEAVES and n.op != "opaque"]
        types = [t for n in known for t in n.types] + [graph.nodes[r[0]].types[r[1]] for n in known
                                                        for r in n.inputs if r[1] >= 0]
        names = frozenset().union(*(dims.symbols_of(t.shape) for t in types if t is not None),
                                  *(dims.symbols_of(v) for n in known for _, v in n.attrs))
        graph.sizes, sources = dims.priced_points(names, self.given, *self.bounds)
        return sources


class BlockGraph:
    """A dataflow block as a graph, plus what is needed to write it back: ``variables``, the
    function's symbolic sizes by name (:func:`function_symbols`)."""

    def __init__(self, block, skipped: Counter, variables: dict | None = None):
        self.variables = variables or {}
        self.graph = Graph()
        self.out_vars: list = []  # block output vars, in graph.outputs order
        self.env: dict = {}  # relax var -> Ref
        self._leaves: dict = {}
        g = self.graph
        for binding in block.bindings:
            if not isinstance(binding, relax.VarBinding):
                raise OpError("match_cast in a dataflow block")
            var, value = binding.var, binding.value
            ref = self._read(var, value, skipped)
            self.env[var] = ref
            if not isinstance(var, relax.DataflowVar):
                self.out_vars.append(var)
                g.outputs.append(ref)

    def _operand(self, expr) -> Ref:
        if isinstance(expr, relax.Var) and expr in self.env:
            return self.env[expr]
        key = expr
        if key in self._leaves:
            return self._leaves[key]
        if isinstance(expr, relax.Var):
            try:
                ty = ops.tensor_type(expr.ty)
            except OpError:
                ty = None
            nid = self.graph.add_leaf("input", ty, expr, key=len(self._leaves))
        elif isinstance(expr, tvm.ir.expr.GenericConst) and isinstance(expr.ty, relax.TensorType):
            ty = ops.tensor_type(expr.ty)
            nid = self.graph.add_leaf("const", ty, (expr.value.numpy(), expr), key=len(self._leaves))
        else:
            raise OpError(f"operand {type(expr).__name__}")
        self._leaves[key] = (nid, 0)
        return (nid, 0)

    def _read(self, var, value, skipped: Counter) -> Ref:
        g = self.graph
        if isinstance(value, relax.Var):  # an alias: the same value under another name
            return self._operand(value)
        if isinstance(value, relax.TupleGetItem) and isinstance(value.tuple_value, relax.Var):
            src = self.env.get(value.tuple_value)
            if src is not None and src[1] == -1 and g.nodes[src[0]].op != "opaque":
                return (src[0], value.index)
        if isinstance(value, relax.Call) and isinstance(value.op, tvm.ir.Op):
            try:
                spec, args, attrs = ops.read_call(value)
                refs = [self._operand(a) for a in args]
                nid = g.add(spec.name, refs, attrs, origin=var)
                node = g.nodes[nid]
                if len(node.types) == 1:
                    if node.types[0] != ops.tensor_type(var.ty):
                        raise OpError(f"{spec.name} type {var.ty} differs from ours {node.types[0]}")
                    return (nid, 0)
                return (nid, -1)
            except OpError as err:
                reason = str(err)
                skipped[reason if reason.startswith("unknown op") else f"{value.op.name}: {reason}"] += 1
        refs = tuple(self._operand(v) for v in _free_operands(value))
        try:
            ty = ops.tensor_type(var.ty)
        except OpError:
            ty = None
        return (g.add_opaque(refs, (ty,), value), 0)

    def to_block(self, graph: Graph) -> relax.DataflowBlock:
        """The dataflow block computing ``graph`` (an optimized version of self.graph)."""
        bindings = []
        var_of: dict[Ref, relax.Expr] = {}
        used_names: set = set()
        bb = relax.BlockBuilder()
        out_by_ref: dict[Ref, list] = {}
        for ref, var in zip(graph.outputs, self.out_vars):
            out_by_ref.setdefault(ref, []).append(var)
        fresh = iter(range(1 << 30))

        def new_var(name, ty):
            while True:
                candidate = f"{name}_t{next(fresh)}"
                if candidate not in used_names:
                    used_names.add(candidate)
                    return relax.DataflowVar(candidate, ty)

        def operand(ref: Ref):
            if ref in var_of:
                return var_of[ref]
            nid, idx = ref
            tup = var_of[(nid, -1)]
            expr = bb.normalize(relax.TupleGetItem(tup, idx))
            v = new_var(tup.name, expr.ty)
            bindings.append(relax.VarBinding(v, expr))
            var_of[ref] = v
            return v

        for nid in graph.topo_order():
            node = graph.nodes[nid]
            if node.op == "input":
                var_of[(nid, 0)] = node.payload
                continue
            if node.op == "const":
                array, expr = node.payload
                var_of[(nid, 0)] = expr if expr is not None else relax.const(np.ascontiguousarray(array), str(array.dtype))
                continue
            args = [operand(r) for r in node.inputs]
            if node.op == "opaque":
                value = _substitute(node.payload, dict(zip(_free_operands(node.payload), args)))
                if value is not node.payload:
                    value = bb.normalize(value)  # a rebuilt call has no type until normalized
            else:
                attrs = {k: dims.to_prim(v, self.variables) for k, v in node.attr.items()}
                value = bb.normalize(ops.OPS[node.op].build(args, attrs))
            multi = len(node.types) > 1
            ref = (nid, -1) if multi else (nid, 0)
            origin = node.payload if node.op != "opaque" else None
            outs = out_by_ref.get(ref, [])
            if outs:
                var = outs.pop(0)
            elif isinstance(origin, relax.DataflowVar) and origin.name not in used_names:
                var = origin
            else:
                var = new_var("taso" if origin is None else origin.name, value.ty)
            used_names.add(var.name)
            bindings.append(relax.VarBinding(var, value))
            var_of[ref] = var
        for ref, var in zip(graph.outputs, self.out_vars):
            if any(b.var.same_as(var) for b in bindings):
                continue
            bindings.append(relax.VarBinding(var, operand(ref)))
        return relax.DataflowBlock(bindings)


def _free_operands(value) -> list:
    """The variables and constants an (A-normal form) binding value reads, in order."""
    found = []

    def visit(e):
        if isinstance(e, relax.Var) or isinstance(e, tvm.ir.expr.GenericConst) and isinstance(e.ty, relax.TensorType):
            if not any(e.same_as(f) for f in found):
                found.append(e)
        elif isinstance(e, relax.Call):
            for a in e.args:
                visit(a)
        elif isinstance(e, relax.Tuple):
            for f in e.fields:
                visit(f)
        elif isinstance(e, relax.TupleGetItem):
            visit(e.tuple_value)

    visit(value)
    return found


def _substitute(value, mapping: dict):
    if not any(not k.same_as(v) for k, v in mapping.items()):
        return value

    def sub(e):
        for k, v in mapping.items():
            if e.same_as(k):
                return v
        if isinstance(e, relax.Call):
            return relax.Call(e.op, [sub(a) for a in e.args], e.attrs, list(e.ty_args))
        if isinstance(e, relax.Tuple):
            return relax.Tuple([sub(f) for f in e.fields])
        if isinstance(e, relax.TupleGetItem):
            return relax.TupleGetItem(sub(e.tuple_value), e.index)
        return e

    return sub(value)


def block_graphs(mod: tvm.IRModule) -> list[Graph]:
    """The graph of every dataflow block of every Relax function in ``mod`` that the bridge can
    read (a block it cannot read, e.g. one with a ``match_cast``, is left out), priced at its
    symbols' default sizes (:class:`FunctionSymbols`)."""
    graphs = []
    for func in mod.functions.values():
        if not isinstance(func, relax.Function) or not isinstance(func.body, relax.SeqExpr):
            continue
        try:
            symbols = FunctionSymbols(func)
        except OpError:
            continue
        for block in func.body.blocks:
            if isinstance(block, relax.DataflowBlock):
                try:
                    graph = BlockGraph(block, Counter(), symbols.variables).graph
                except OpError:
                    continue
                symbols.price(graph)
                graphs.append(graph)
    return graphs
