"""An ONNX graph to the engine's :class:`~tvm_taso.ir.graph.Graph` and back, beside
:mod:`tvm_taso.ir.relax_bridge`.

Reading: graph inputs become ``input`` leaves, initializers (those no graph input can
override) and ``Constant`` nodes ``const`` leaves; a node of the default domain that
:data:`~tvm_taso.io.onnx_ops.READERS` knows, on float tensors of known shape, becomes engine
ops, and one whose operands are all constants is evaluated to a constant; every other node is
one ``opaque`` node. Types are those of ONNX shape inference at the priced sizes, a dimension
that depends on a symbolic input dimension being a symbolic size (:class:`ModelSizes`), and an
engine op's own derivation must agree with them at the priced sizes and at twice them.

Writing (:meth:`OnnxGraph.write`) rewrites only what the search rewrote. An ONNX node whose
engine nodes are still in the graph, with at most their operands replaced by equal values, is
written verbatim (its inputs renamed where an operand changed); engine nodes the search created
become new ONNX nodes (:data:`~tvm_taso.io.onnx_ops.EMITTERS`) with fresh names, and folded
weights new initializers. Nodes are written in the original order, new ones right after their
inputs; initializers and value_info no longer referenced are dropped, everything else of the
model (interface, metadata, functions, opset imports) is copied. A new node that would fix the
size of a symbolic dimension (a reshape or split through it, checked by inferring its types
again at twice the priced sizes), or that has no ONNX form at the model's opset, raises
:class:`RewriteRejected`.
"""

from __future__ import annotations

import hashlib
import heapq
import itertools
from collections import Counter

import numpy as np
import onnx
from onnx import helper, numpy_helper

from tvm_taso.io.onnx_model import OnnxModel, constant_value
from tvm_taso.io.onnx_tensors import DETACHED_ELEMENTS, TensorStore, copy_fields, storable_dtype
from tvm_taso.io.onnx_ops import FLOATS, READERS, emit, emit_conv
from tvm_taso.ir import dims, ops
from tvm_taso.ir.graph import Graph, Ref
from tvm_taso.ir.ops import OpError, TensorType


class RewriteRejected(Exception):
    """The search's graph holds engine nodes (``nids``) that cannot be written as this ONNX model."""

    def __init__(self, nids, reason: str):
        super().__init__(reason)
        self.nids = list(nids)


def tensor_type(entry) -> TensorType | None:
    """An inferred ``(element type, shape)`` as a TensorType; None unless fully static."""
    if entry is None or entry[1] is None or any(d is None or d < 0 for d in entry[1]):
        return None
    try:
        return TensorType(tuple(int(d) for d in entry[1]), str(np.dtype(helper.tensor_dtype_to_np_dtype(entry[0]))))
    except (TypeError, KeyError, ValueError):
        return None


class ModelSizes:
    """A model's sizes as the engine knows them: each dimension of a tensor that depends on a
    symbolic input dimension is a symbolic size (:mod:`tvm_taso.ir.dims`): the input's symbol
    (its ``dim_param``, else ``input[axis]``), a size ONNX's symbolic inference named
    (``unk__N``; one the engine derived itself, a reshape's ``-1``, replaces it: :meth:`learn`),
    or a size of its own (``tensor[axis]``). ``a`` and ``b`` hold every symbol's value at the
    priced sizes and at twice them (where the writer checks new nodes again)."""

    def __init__(self, model: OnnxModel):
        self.model = model
        self.a = dict(model.dims)
        self.b = model.doubled_dims()
        self.inputs = set(model.dims)
        self.learned: dict = {}  # a size ONNX made up -> the size the engine derived for it

    def type_of(self, name: str, a: TensorType | None, b: TensorType | None) -> TensorType | None:
        """The engine type of tensor ``name``, of type ``a`` at the priced sizes and ``b`` at
        twice them: static where it is the same at both."""
        if a is None or not self.model.dims:
            return a
        entry = self.model.symbolic_types.get(name)
        onnx_dims = entry[1] if entry is not None and entry[1] is not None and len(entry[1]) == len(a.shape) \
            else (None,) * len(a.shape)
        b_dims = b.shape if b is not None and len(b.shape) == len(a.shape) else (None,) * len(a.shape)
        shape = tuple(da if da == db else self._size(given, f"{name}[{axis}]", da, db)
                      for axis, (da, db, given) in enumerate(zip(a.shape, b_dims, onnx_dims)))
        return TensorType(shape, a.dtype)

    def _size(self, given, own: str, at_a: int, at_b: int | None):
        """The size of a dimension that is ``at_a`` at the priced sizes and ``at_b`` at twice
        them, ONNX's inference having named it ``given`` (or not: None)."""
        if dims.is_symbolic(given) and self.holds(given, at_a, at_b):
            return given  # a size over the inputs' symbols
        if isinstance(given, str) and at_b is not None:
            if given in self.learned:
                if self.holds(self.learned[given], at_a, at_b):
                    return self.learned[given]
            elif given in self.inputs:
                if (self.a[given], self.b[given]) == (at_a, at_b):
                    return dims.symbol(given)
            elif (self.a.setdefault(given, at_a), self.b.setdefault(given, at_b)) == (at_a, at_b):
                return dims.symbol(given)
        self.a[own] = at_a
        if at_b is not None:
            self.b[own] = at_b
        return dims.symbol(own)

    def holds(self, size, at_a: int, at_b: int | None) -> bool:
        """Whether ``size`` is ``at_a`` at the priced sizes and ``at_b`` (unless None) at twice them."""
        try:
            return dims.value(size, self.a) == at_a and (at_b is None or dims.value(size, self.b) == at_b)
        except KeyError:  # a size of its own, with no value at twice the priced sizes
            return False

    def learn(self, name: str, derived: TensorType) -> None:
        """The engine derived ``derived`` for tensor ``name``: a size ONNX's inference made up
        for it is that size from now on (what reads the tensor later knows it)."""
        entry = self.model.symbolic_types.get(name)
        if entry is None or entry[1] is None or len(entry[1]) != len(derived.shape):
            return
        for given, size in zip(entry[1], derived.shape):
            if isinstance(given, str) and given not in self.inputs and given not in self.learned \
                    and dims.is_symbolic(size):
                self.learned[given] = size

    def points(self) -> tuple:
        """The graph's priced point (:attr:`Graph.sizes`), or () for a static model."""
        return (tuple(sorted(self.a.items())),) if self.model.dims else ()


class ReadContext:
    """What a reader of :mod:`.onnx_ops` sees: refs, types and constant values by ONNX name."""

    def __init__(self, bridge: "OnnxGraph", graph: Graph, refs: dict[str, Ref]):
        self.bridge, self.g, self.refs, self.opset = bridge, graph, refs, bridge.model.opset

    def ref(self, name: str) -> Ref:
        if name not in self.refs:
            raise OpError(f"operand {name!r} is not a tensor the engine reads")
        return self.refs[name]

    def ty(self, name: str) -> TensorType:
        return self.bridge.type_s(name)

    def symbolic(self, name: str) -> tuple[bool, ...]:
        return self.bridge.symbolic(name)

    def const(self, name: str):
        return self.bridge.const_value(name)

    def add_node(self, op: str, refs, attrs: dict) -> int:
        return self.g.add(op, refs, attrs)

    def add(self, op: str, refs, attrs: dict) -> Ref:
        return (self.g.add(op, refs, attrs), 0)

    def leaf(self, array: np.ndarray, key, source: str | None = None) -> Ref:
        """A constant the reader derived (a transposed weight, a reshaped bias); ``source`` names
        the initializer it reshapes, which a writer may reuse."""
        nid = self.g.add_leaf("const", TensorType(array.shape, str(array.dtype)), (array, None), key=("derived",) + key)
        if source is not None:
            self.bridge.bias_source[nid] = source
        return (nid, 0)


class OnnxGraph:
    """``model``'s main graph as an engine graph (``self.graph``); ``frozen`` ONNX node indices
    stay opaque (rewrites there were rejected). ``skipped`` counts opaque nodes by op type."""

    def __init__(self, model: OnnxModel, frozen=frozenset()):
        self.model, self.frozen = model, frozenset(frozen)
        self.proto = model.structure
        self.sizes = ModelSizes(model)
        self._types: dict[str, TensorType | None] = {}
        g = self.graph = Graph()
        self.refs: dict[str, Ref] = {}  # ONNX tensor name -> engine ref
        self.owner: dict[int, int] = {}  # engine node id -> index of the ONNX node it came from
        self.node_refs: dict[int, list] = {}  # ONNX node index -> ref of each output (None: none)
        self.const_nodes: set[int] = set()  # ONNX nodes read as constants
        self.alias_nodes: set[int] = set()  # Identity nodes: their output is their input's ref
        self.bias_source: dict[int, str] = {}
        self.skipped: Counter = Counter()
        self.reasons: dict[str, str] = {}
        self._consts: dict[str, np.ndarray] = {}
        self._inits = {i.name: i for i in self.proto.graph.initializer}
        self.producer: dict[str, int] = {}  # tensor name -> index of the node writing it
        self.quantized = _quantized_boundary(self.proto.graph)
        overridable = {i.name for i in self.proto.graph.input}
        for inp in self.proto.graph.input:
            self.refs[inp.name] = (g.add_leaf("input", self.type_s(inp.name), inp.name, key=inp.name), 0)
        for name in self._inits:
            if name not in overridable:
                self.refs[name] = (g.add_leaf("const", self.type_a(name), (self.constant(name), name), key=name), 0)
        for idx, node in enumerate(self.proto.graph.node):
            start = g.next_id
            outs = self._read_node(idx, node)
            for nid in range(start, g.next_id):
                self.owner.setdefault(nid, idx)
            self.node_refs[idx] = outs
            for name, ref in zip(node.output, outs):
                if name:
                    self.producer[name] = idx
                    if ref is not None:
                        self.refs[name] = ref
        used = {n for node in self.proto.graph.node for n in list(node.input) + _implicit_inputs(node)}
        self.required: list[str] = [o.name for o in self.proto.graph.output]
        self.required += [n for node in self.proto.graph.node for n in node.output
                          if n and n not in used and n not in self.required and n in self.refs]
        # what engine ops read as attributes (a Reshape's shape computed by shape code) stays in
        # the graph after the outputs, so that its opaque producers are rewired with the rest
        # and written back as they were
        self.attribute_inputs = [n for n in dict.fromkeys(self._attribute_inputs()) if n not in self.required]
        g.outputs = [self.refs[n] for n in self.required + self.attribute_inputs]
        g.prune()
        g.sizes = self.sizes.points()
        self.original = g.copy()

    # -- types --------------------------------------------------------------------------------
    def type_a(self, name: str) -> TensorType | None:
        return tensor_type(self.model.types.get(name))

    def type_b(self, name: str) -> TensorType | None:
        return tensor_type(self.model.doubled_types.get(name))

    def type_s(self, name: str) -> TensorType | None:
        """The engine's type of ``name``: symbolic where it depends on a symbolic dimension
        (:class:`ModelSizes`), its value at the priced sizes :meth:`type_a`."""
        if name not in self._types:
            self._types[name] = self.sizes.type_of(name, self.type_a(name), self.type_b(name))
        return self._types[name]

    def symbolic(self, name: str) -> tuple[bool, ...]:
        """Per dimension of ``name``: does its size depend on a symbolic input dimension?"""
        a, b = self.model.types.get(name), self.model.doubled_types.get(name)
        if a is None or a[1] is None:
            return ()
        bs = b[1] if b is not None and b[1] is not None and len(b[1]) == len(a[1]) else (None,) * len(a[1])
        return tuple(x is None or y is None or x != y for x, y in zip(a[1], bs))

    def const_value(self, name: str):
        """The value of ``name`` if it is fixed: a constant (:meth:`constant`) or shape code
        whose value does not change with the inputs
        (:attr:`~tvm_taso.io.onnx_model.OnnxModel.known_values`; its nodes stay as they are,
        what reads it sees the value), else None."""
        value = self.constant(name)
        return value if value is not None else self.model.known_values.get(name)

    def constant(self, name: str):
        """The value of ``name`` if it is a constant (an initializer no input overrides, a
        Constant node, a node evaluated at reading), else None."""
        if name in self._consts:
            return self._consts[name]
        init = self._inits.get(name)
        if init is None or any(i.name == name for i in self.proto.graph.input):
            return None
        self._consts[name] = self.model.initializer_value(init)
        return self._consts[name]

    # -- reading ------------------------------------------------------------------------------
    def _attribute_inputs(self):
        """Names read by engine ops at an input that is no operand, made by an opaque node."""
        for idx, node in enumerate(self.proto.graph.node):
            if node.op_type not in READERS or idx in self.const_nodes or node.domain not in ("", "ai.onnx"):
                continue
            positions = READERS[node.op_type][1]
            if positions is None or self.owner_of_outputs(idx) == "opaque":
                continue
            for k, name in enumerate(node.input):
                ref = self.refs.get(name)
                if name and k not in positions and ref is not None and self.graph.nodes[ref[0]].op == "opaque":
                    yield name

    def owner_of_outputs(self, idx: int) -> str | None:
        """The engine op that ONNX node ``idx``'s first output is, or None."""
        outs = [r for r in self.node_refs.get(idx, []) if r is not None]
        return self.graph.nodes[outs[0][0]].op if outs else None

    def _read_node(self, idx: int, node) -> list:
        g = self.graph
        default = node.domain in ("", "ai.onnx")
        if default and node.op_type == "Constant":
            value = constant_value(node)
            if value is not None:
                self.const_nodes.add(idx)
                self._consts[node.output[0]] = value
                ty = TensorType(value.shape, str(value.dtype))
                return [(g.add_leaf("const", ty, (value, node.output[0]), key=node.output[0]), 0)]
        reason = "frozen" if idx in self.frozen else None
        if reason is None and default and node.op_type == "Identity" and node.input[0] in self.refs:
            self.alias_nodes.add(idx)  # the same value under another name
            if self.constant(node.input[0]) is not None:
                self._consts[node.output[0]] = self.constant(node.input[0])
            return [self.refs[node.input[0]]]
        if reason is None and default and node.op_type in READERS and idx in self.quantized:
            reason = "reads a DequantizeLinear output or feeds a QuantizeLinear (a quantized kernel)"
        if reason is None and default and node.op_type in READERS:
            try:
                return self._read_known(idx, node)
            except OpError as err:
                reason = str(err)
        if reason != "frozen":
            what = f"ONNX op {node.op_type}" if default else f"ONNX op {node.domain}.{node.op_type}"
            self.skipped[what] += 1
            if reason:
                self.reasons.setdefault(what, reason)
        operands = [self.refs[n] for n in list(node.input) + _implicit_inputs(node) if n in self.refs]
        nid = g.add_opaque(tuple(operands), tuple(self.type_s(n) if n else None for n in node.output), idx)
        return [(nid, i) for i in range(len(node.output))]

    def _read_known(self, idx: int, node) -> list:
        reader, positions = READERS[node.op_type]
        operands = [n for k, n in enumerate(node.input) if n and (positions is None or k in positions)]
        for name in operands + [n for n in node.output if n]:
            ty = self.type_a(name)
            if ty is None or ty.dtype not in FLOATS:
                raise OpError(f"{name!r} is not a float tensor of known shape")
        at = {a.name: helper.get_attribute_value(a) for a in node.attribute}
        if all(self.constant(n) is not None for n in operands):
            return self._evaluate(idx, node, reader, operands, at)
        refs = reader(ReadContext(self, self.graph, self.refs), node, at)
        for name, ref in zip(node.output, refs):
            derived, a, b = self.graph.type_of(ref), self.type_a(name), self.type_b(name)
            if name and (derived.dtype != a.dtype or len(derived.shape) != len(a.shape) or not all(
                    self.sizes.holds(d, x, y) for d, x, y in zip(derived.shape, a.shape,
                                                                  b.shape if b is not None else [None] * len(a.shape)))):
                raise OpError(f"engine type {derived} differs from ONNX's {a}")
            if name:
                self.sizes.learn(name, derived)
                self._types[name] = derived
        return list(refs)

    def _evaluate(self, idx: int, node, reader, operands: list[str], at: dict) -> list:
        """A node on constants only, evaluated now: its outputs become constant leaves."""
        scratch = Graph()
        refs = {n: (scratch.add_leaf("const", self.type_a(n), (self.constant(n), n), key=n), 0) for n in operands}
        outs = reader(ReadContext(self, scratch, refs), node, at)
        values = scratch.evaluate({})
        result = []
        for name, ref in zip(node.output, outs):
            ty = self.type_a(name)
            value = np.ascontiguousarray(np.asarray(values[ref]).astype(ty.dtype))
            if value.shape != ty.shape:
                raise OpError("evaluated shape differs from ONNX's")
            self._consts[name] = value
            result.append((self.graph.add_leaf("const", ty, (value, name), key=name), 0))
        self.const_nodes.add(idx)
        return result

    # -- writing ------------------------------------------------------------------------------
    def written(self, g: Graph) -> OnnxModel:
        """The model computing ``g`` (the search's result on :attr:`graph`); RewriteRejected
        when a node of ``g`` cannot be written (see the module docstring). Its new weights are
        held apart, with the original's (:mod:`tvm_taso.io.onnx_tensors`)."""
        writer = _Writer(self, g)
        return self.model.with_proto(writer.model(), writer.store)

    def write(self, g: Graph) -> onnx.ModelProto:
        """The complete message of :meth:`written`."""
        return self.written(g).proto

    def owners_to_freeze(self, g: Graph, nids) -> set[int]:
        """ONNX nodes to keep opaque so that the rewrite that made ``nids`` is not found again:
        those the rewrite replaced that read what the new nodes read."""
        original = self.original.nodes
        new = {nid for nid, n in g.nodes.items() if n.op not in ("input", "const", "opaque")
               and original.get(nid) is not n}
        component, stack = set(), [n for n in nids if n in new]
        users = g.users()
        while stack:
            nid = stack.pop()
            if nid in component:
                continue
            component.add(nid)
            stack += [s for s, _ in g.nodes[nid].inputs if s in new]
            stack += [u for u in users.get(nid, []) if u in new]
        reads = {r for nid in component for r in g.nodes[nid].inputs if r[0] not in component}
        replaced = [nid for nid, n in original.items() if nid in self.owner and g.nodes.get(nid) is not n
                    and n.op != "opaque"]
        chosen = {self.owner[nid] for nid in replaced if set(original[nid].inputs) & reads}
        return chosen or {self.owner[nid] for nid in replaced}


class WriteContext:
    """What an emitter of :mod:`.onnx_ops` sees: the opset, types, and makers of nodes, fresh
    names and initializers."""

    def __init__(self, writer: "_Writer", priority: float):
        self.writer, self.priority, self.opset = writer, priority, max(writer.bridge.model.opset, 1)

    def type_of(self, ref: Ref) -> TensorType:
        return self.writer.g.type_of(ref)

    def fresh(self, hint: str) -> str:
        return self.writer.fresh(hint)

    def constant(self, array: np.ndarray, hint: str) -> str:
        return self.writer.initializer(np.asarray(array), hint)

    def node(self, op_type: str, inputs, outputs, **attrs) -> None:
        proto = helper.make_node(op_type, list(inputs), list(outputs), name=self.fresh(f"taso_{op_type}"), **attrs)
        self.writer.add_item(self.priority, proto)


class _Writer:
    def __init__(self, bridge: OnnxGraph, g: Graph):
        self.bridge, self.g = bridge, g
        self.proto = bridge.proto
        self.items: list[tuple[float, onnx.NodeProto]] = []
        self.priority_of: dict[str, float] = {}
        self.name_of: dict[Ref, str] = {}
        self.emitted: set[int] = set()  # ONNX nodes written (verbatim or with renamed inputs)
        self.new_inits: list[onnx.TensorProto] = []
        self.by_contents: dict[tuple, str] = {}  # (dtype, shape, digest) -> the new initializer holding it
        self.store = bridge.model.store.extended() if bridge.model.store is not None else TensorStore()
        self.taken = _all_names(self.proto)
        self.counter = itertools.count()
        self.type_b: dict[Ref, TensorType | None] = {}
        self.users = g.users()
        self._renames: dict[int, dict | None] = {}
        self._by_ref: dict[Ref, list[int]] = {}
        for idx, outs in bridge.node_refs.items():
            for ref in outs:
                if ref is not None:
                    self._by_ref.setdefault(ref, []).append(idx)

    def fresh(self, hint: str) -> str:
        while True:
            name = f"{hint}_{next(self.counter)}"
            if name not in self.taken:
                self.taken.add(name)
                return name

    def initializer(self, array: np.ndarray, hint: str) -> str:
        """A new initializer holding ``array``, or the one written already with the same
        contents: a weight folded in several places (the layers of a model that shares its
        weights, ALBERT's, each merging the same Q/K/V) is written once."""
        array = np.ascontiguousarray(array)
        digest = hashlib.blake2b(memoryview(array).cast("B"), digest_size=16).hexdigest()
        key = (str(array.dtype), array.shape, digest)
        if key in self.by_contents:
            return self.by_contents[key]
        name = self.by_contents[key] = self.fresh(f"taso_{hint}")
        data_type = helper.np_dtype_to_tensor_dtype(array.dtype)
        if array.size > DETACHED_ELEMENTS and storable_dtype(data_type) is not None:
            self.new_inits.append(self.store.tensor(name, array, data_type))
        else:
            self.new_inits.append(numpy_helper.from_array(array, name))
        return name

    def add_item(self, priority: float, node: onnx.NodeProto) -> None:
        self.items.append((priority, node))
        for out in node.output:
            self.priority_of[out] = priority

    # -- which ONNX nodes are still there -----------------------------------------------------
    def available(self, idx: int) -> bool:
        """Is ONNX node ``idx`` still computed by ``g`` (so it can be written as it was)?"""
        return idx in self.bridge.const_nodes or self.renames(idx) is not None

    def renames(self, idx: int) -> dict[Ref, Ref] | None:
        """For an ONNX node whose engine nodes are all still in ``g``, changed at most in
        operands from outside the node: {old operand ref: new ref}. None otherwise."""
        if idx not in self._renames:
            self._renames[idx] = self._find_renames(idx)
        return self._renames[idx]

    def _find_renames(self, idx: int) -> dict[Ref, Ref] | None:
        bridge, g, original = self.bridge, self.g, self.bridge.original.nodes
        outs = [r for r in bridge.node_refs.get(idx, []) if r is not None]
        if not outs or idx in bridge.const_nodes:
            return None
        if idx in bridge.alias_nodes:  # its input's value, still there (a leaf always is)
            leaf = original.get(outs[0][0]) is None or original[outs[0][0]].op in ("const", "input")
            return {} if leaf or outs[0][0] in g.nodes else None
        mapping: dict[Ref, Ref] = {}
        stack, seen = [r[0] for r in outs], set()
        while stack:
            nid = stack.pop()
            if nid in seen:
                continue
            seen.add(nid)
            old, new = original.get(nid), g.nodes.get(nid)
            if old is None or new is None or (old.op, old.attrs) != (new.op, new.attrs) or (
                    old.op == "opaque" and old.payload != new.payload):
                return None
            for a, b in zip(old.inputs, new.inputs):
                if bridge.owner.get(a[0]) == idx:
                    if a != b:
                        return None
                    stack.append(a[0])
                elif mapping.setdefault(a, b) != b:
                    return None
        return mapping

    def provider(self, ref: Ref):
        """(ONNX node index or None, name) of an original tensor that still holds ``ref``, else None."""
        n = self.g.nodes[ref[0]]
        if n.op == "input":
            return None, n.payload
        if n.op == "const":
            return (self.bridge.producer.get(n.payload[1]), n.payload[1]) if n.payload[1] is not None else None
        for idx in self._by_ref.get(ref, []):
            if self.available(idx):
                return idx, self.proto.graph.node[idx].output[self.bridge.node_refs[idx].index(ref)]
        return None

    # -- demand-driven writing ----------------------------------------------------------------
    def need_node(self, idx: int) -> None:
        """Write ONNX node ``idx`` (available) as it was, with the operands that changed renamed."""
        if idx in self.emitted:
            return
        self.emitted.add(idx)
        node = self.proto.graph.node[idx]
        mapping = {} if idx in self.bridge.const_nodes else self.renames(idx)
        renamed = list(node.input)
        for k, name in enumerate(node.input):
            if name:
                old = self.bridge.refs.get(name)
                renamed[k] = self.need_input(name, mapping.get(old, old))
        for name in _implicit_inputs(node):
            old = self.bridge.refs.get(name)
            source = self.need_input(name, mapping.get(old, old))
            if source != name:  # a subgraph reads it by name: give the new value that name
                self.add_item(self._priority(source) + 0.5, helper.make_node(
                    "Identity", [source], [name], name=self.fresh("taso_Identity")))
        if renamed != list(node.input):
            node = onnx.NodeProto.FromString(node.SerializeToString())
            del node.input[:]
            node.input.extend(renamed)
        self.add_item(idx, node)

    def need_input(self, name: str, ref: Ref | None) -> str:
        """The name to read for an operand that was ``name`` and now holds ``ref``."""
        idx = self.bridge.producer.get(name)
        if ref is None or (ref == self.bridge.refs.get(name) and (idx is None or self.available(idx))):
            if idx is not None:
                self.need_node(idx)
            return name
        # the same value (rewrites replace values by equal ones) computed by new nodes: they
        # take the name its old producer, no longer written, freed
        return self.need_ref(ref, name if idx is not None and not self.available(idx) else None)

    def need_ref(self, ref: Ref, name: str | None = None) -> str:
        """A name holding ``ref``: an original tensor, else new ONNX nodes (their output named
        ``name`` when given)."""
        if ref in self.name_of:
            return self.name_of[ref]
        found = self.provider(ref)
        if found is not None:
            idx, found_name = found
            if idx is not None:
                self.need_node(idx)
            self.name_of[ref] = found_name
            return found_name
        node = self.g.nodes[ref[0]]
        if node.op == "const":
            self.name_of[ref] = self.initializer(node.payload[0], "w")
            return self.name_of[ref]
        self._emit_new(ref[0], {ref: name} if name else {})
        return self.name_of[ref]

    def _emit_new(self, nid: int, wanted: dict[Ref, str]) -> None:
        node = self.g.nodes[nid]
        if node.op in ("opaque", "input"):
            raise RewriteRejected([nid], f"{node.op} value with no ONNX name")
        conv = self._fusable_conv(nid)
        ins = [self.need_ref(r) for r in (self.g.nodes[conv].inputs if conv is not None else node.inputs)]
        self._check_dynamic(nid)
        outs = []
        for i in range(len(node.types)):
            self.name_of[(nid, i)] = wanted.get((nid, i)) or self.fresh(f"taso_{node.op}")
            outs.append(self.name_of[(nid, i)])
        if node.op == "batch_norm":  # outputs 1 and 2 are the running mean and variance, unchanged
            self.name_of[(nid, 1)], self.name_of[(nid, 2)] = ins[3], ins[4]
            outs = outs[:1]
        w = WriteContext(self, max([self._priority(n) for n in ins], default=-1) + 0.5)
        try:
            if conv is not None:
                emit_conv(w, self.g.nodes[conv], ins, outs, bias=self._bias_name(node.inputs[1]))
            else:
                emit(w, node, ins, outs)
        except OpError as err:
            raise RewriteRejected([nid], str(err)) from None

    def _priority(self, name: str) -> float:
        idx = self.bridge.producer.get(name)
        return self.priority_of.get(name, idx if idx is not None else -1)

    def _fusable_conv(self, nid: int) -> int | None:
        """The new conv2d whose only user, the new ``add`` ``nid`` of a per-channel constant,
        becomes its bias (one Conv, as exporters write it), or None."""
        node = self.g.nodes[nid]
        if node.op != "add":
            return None
        (src, out), bias = node.inputs
        conv, b = self.g.nodes[src], self.g.nodes[bias[0]]
        if conv.op != "conv2d" or out != 0 or (src, 0) in self.name_of or set(self.users[src]) != {nid} \
                or (src, 0) in self.g.outputs or self.provider((src, 0)) is not None:
            return None
        if b.op != "const" or b.types[0].shape != (1, conv.types[0].shape[1], 1, 1):
            return None
        return src

    def _bias_name(self, ref: Ref) -> str:
        source = self.bridge.bias_source.get(ref[0])
        idx = self.bridge.producer.get(source)
        if source is not None and (idx is None or self.available(idx)):
            return self.need_input(source, None)
        return self.initializer(self.g.nodes[ref[0]].payload[0].reshape(-1), "bias")

    # -- symbolic dimensions ------------------------------------------------------------------
    def _b(self, ref: Ref) -> TensorType | None:
        """The type of ``ref`` with every symbolic dimension at twice its priced size."""
        if ref not in self.type_b:
            node = self.g.nodes[ref[0]]
            found = self.provider(ref)
            if found is not None:
                self.type_b[ref] = self.bridge.type_b(found[1])
            elif node.op == "const":
                self.type_b[ref] = node.types[0]
            else:
                self._check_dynamic(ref[0])
        return self.type_b.get(ref)

    def _check_dynamic(self, nid: int) -> None:
        """Infer the new node ``nid`` again at twice the priced sizes, its attributes' symbolic
        sizes there too: one whose types there are not its symbolic types' values (attributes
        that fix a symbolic size: a reshape or split written with the priced sizes) is rejected."""
        node = self.g.nodes[nid]
        if (nid, 0) in self.type_b:
            return
        if not self.bridge.model.dims:
            self.type_b.update({(nid, i): t for i, t in enumerate(node.types)})
            return
        ins = [self._b(r) for r in node.inputs]
        point = self.bridge.sizes.b
        try:
            if any(t is None for t in ins):
                raise OpError("an operand of unknown size")
            outs = ops.infer(node.op, ins, {k: dims.value(v, point) for k, v in node.attr.items()})
            if [t.shape for t in outs] != [dims.value(t.shape, point) for t in node.types]:
                raise OpError("its attributes hold the size")
        except (OpError, KeyError) as err:
            raise RewriteRejected([nid], f"{node.op} would fix a symbolic size ({err})") from None
        self.type_b.update({(nid, i): t for i, t in enumerate(outs)})

    # -- the model ----------------------------------------------------------------------------
    def model(self) -> onnx.ModelProto:
        bridge, g = self.bridge, self.g
        inputs = {i.name for i in self.proto.graph.input} | set(bridge._inits)
        for name, ref in zip(bridge.required, g.outputs):
            idx = bridge.producer.get(name)
            if idx is not None and self.available(idx):
                self.need_node(idx)
                continue
            if idx is None and name in inputs:
                continue  # an input or initializer passed through
            fresh = ref not in self.name_of and self.provider(ref) is None and g.nodes[ref[0]].op != "const"
            source = self.need_ref(ref, name if fresh else None)
            if source != name:
                self.add_item(self._priority(source) + 0.5,
                              helper.make_node("Identity", [source], [name], name=self.fresh("taso_Identity")))
            want, got = bridge.type_b(name), self._b(ref)
            if bridge.model.dims and want is not None and got is not None and want != got:
                raise RewriteRejected([ref[0]], f"output {name} would lose a symbolic size")
        return self._assemble(inputs)

    def _assemble(self, inputs: set[str]) -> onnx.ModelProto:
        src = self.proto
        out = onnx.ModelProto()
        copy_fields(out, src, skip=("graph",))
        copy_fields(out.graph, src.graph, skip=("node", "initializer", "value_info"))
        nodes = _ordered(self.items, inputs | {i.name for i in self.new_inits})
        out.graph.node.extend(nodes)
        used = {n for node in nodes for n in list(node.input) + _implicit_inputs(node)}
        used |= {o.name for o in src.graph.output} | {i.name for i in src.graph.input}
        before = {n for node in src.graph.node for n in list(node.input) + _implicit_inputs(node)}
        before |= {o.name for o in src.graph.output}
        out.graph.initializer.extend(i for i in src.graph.initializer if i.name in used or i.name not in before)
        out.graph.initializer.extend(i for i in self.new_inits if i.name in used)
        present = {n for node in nodes for n in node.output} | {i.name for i in out.graph.initializer}
        out.graph.value_info.extend(v for v in src.graph.value_info if v.name in present)
        if not any(o.domain in ("", "ai.onnx") for o in out.opset_import) and any(
                n.name.startswith("taso_") and not n.domain for n in nodes):
            out.opset_import.append(helper.make_opsetid("", onnx.defs.onnx_opset_version()))
        return out


def _ordered(items: list[tuple[float, onnx.NodeProto]], available: set[str]) -> list[onnx.NodeProto]:
    """``items`` in a topological order, lowest priority first among the ready ones."""
    waiting: dict[str, list[int]] = {}
    missing = []
    ready: list[tuple[float, int]] = []
    produced = set(available)
    for k, (priority, node) in enumerate(items):
        needs = {n for n in list(node.input) + _implicit_inputs(node) if n and n not in produced}
        missing.append(needs)
        for n in needs:
            waiting.setdefault(n, []).append(k)
    outputs_of = {}
    for k, (_, node) in enumerate(items):
        for n in node.output:
            outputs_of.setdefault(n, k)
    for k, needs in enumerate(missing):
        needs &= set(outputs_of)  # names from an enclosing scope are nobody's output here
        if not needs:
            heapq.heappush(ready, (items[k][0], k))
    order = []
    while ready:
        _, k = heapq.heappop(ready)
        order.append(items[k][1])
        for n in items[k][1].output:
            for j in waiting.pop(n, []):
                missing[j].discard(n)
                if not missing[j]:
                    heapq.heappush(ready, (items[j][0], j))
    if len(order) != len(items):
        raise RewriteRejected([], "the written graph would have a cycle")
    return order


def _quantized_boundary(graph) -> set[int]:
    """Indices of the nodes that read a ``DequantizeLinear`` output or whose output a
    ``QuantizeLinear`` reads: in a QDQ model these pairs mark the ops a runtime runs as quantized
    kernels, so no rewrite may go through them (nodes and their Q/DQ stay as they are)."""
    dequantized = {n.output[0] for n in graph.node if n.op_type == "DequantizeLinear" and n.output}
    quantized = {n.input[0] for n in graph.node if n.op_type == "QuantizeLinear" and n.input}
    return {idx for idx, n in enumerate(graph.node)
            if n.op_type not in ("QuantizeLinear", "DequantizeLinear")
            and (dequantized & set(n.input) or quantized & set(n.output))}


def _implicit_inputs(node) -> list[str]:
    """Names a node's subgraphs (If, Loop, Scan bodies) read from the enclosing graph."""
    found: list[str] = []
    for attr in node.attribute:
        for sub in ([attr.g] if attr.HasField("g") else []) + list(attr.graphs):
            local = {i.name for i in sub.input} | {i.name for i in sub.initializer}
            for inner in sub.node:
                for n in list(inner.input) + _implicit_inputs(inner):
                    if n and n not in local and n not in found:
                        found.append(n)
                local |= set(inner.output)
    return found


def _all_names(proto: onnx.ModelProto) -> set[str]:
    """Every tensor, node and graph name of the model (subgraphs and functions included)."""
    names: set[str] = set()

    def graph(gr):
        names.add(gr.name)
        for vi in list(gr.input) + list(gr.output) + list(gr.value_info):
            names.add(vi.name)
        names.update(i.name for i in gr.initializer)
        for node in gr.node:
            names.add(node.name)
            names.update(node.input)
            names.update(node.output)
            for attr in node.attribute:
                for sub in ([attr.g] if attr.HasField("g") else []) + list(attr.graphs):
                    graph(sub)

    graph(proto.graph)
    for f in proto.functions:
        names.add(f.name)
        for node in f.node:
            names.update([node.name, *node.input, *node.output])
    return names
