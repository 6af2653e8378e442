"""Engine ops as a standalone ONNX model, written by the emitters that write rewrites back into
a user's model (:data:`.onnx_ops.EMITTERS`): what onnxruntime times for a region or a kernel is
what the ONNX path would write.

:class:`ModelWriter` is what an emitter sees (the opset, types, makers of nodes, fresh names and
initializers), collecting one graph; :func:`graph_model` writes a search graph with it.
"""

from __future__ import annotations

import itertools

import numpy as np
import onnx
from onnx import helper, numpy_helper

from tvm_taso.io.onnx_ops import emit
from tvm_taso.ir.graph import LEAVES
from tvm_taso.ir.ops import OpError, TensorType


def value_info(name: str, ty: TensorType):
    if ty is None:
        raise OpError("a tuple-valued input or output has no ONNX tensor form")
    shape = [d if isinstance(d, int) else str(d) for d in ty.shape]
    return helper.make_tensor_value_info(name, helper.np_dtype_to_tensor_dtype(np.dtype(ty.dtype)), shape)


class ModelWriter:
    """One ONNX graph being written: ``type_of`` gives an operand's type (an emitter reads
    shapes), ``opset`` is the opset written for."""

    def __init__(self, opset: int, type_of):
        self.opset, self.type_of = opset, type_of
        self.nodes: list[onnx.NodeProto] = []
        self.initializers: list[onnx.TensorProto] = []
        self.inputs: list[onnx.ValueInfoProto] = []
        self._counter = itertools.count()

    def fresh(self, hint: str) -> str:
        return f"{hint}_{next(self._counter)}"

    def constant(self, array: np.ndarray, hint: str) -> str:
        name = self.fresh(hint)
        self.initializers.append(numpy_helper.from_array(np.ascontiguousarray(array), name))
        return name

    def node(self, op_type: str, inputs, outputs, **attrs) -> None:
        self.nodes.append(helper.make_node(op_type, list(inputs), list(outputs), name=self.fresh(op_type), **attrs))

    def input(self, name: str, ty: TensorType, value: np.ndarray | None = None) -> str:
        """A graph input ``name`` of type ``ty``, or an initializer holding ``value`` when given."""
        if value is not None:
            array = np.ascontiguousarray(np.asarray(value).astype(ty.dtype, copy=False).reshape(ty.shape))
            self.initializers.append(numpy_helper.from_array(array, name))
        else:
            self.inputs.append(value_info(name, ty))
        return name

    def model(self, outputs: list[tuple[str, TensorType]]) -> onnx.ModelProto:
        """The graph as a model whose outputs are ``outputs`` (name, type); an output that is
        an input goes through an Identity (a graph output must be a node's)."""
        inputs = {i.name for i in self.inputs} | {t.name for t in self.initializers}
        names = []
        for name, _ in outputs:
            if name in inputs or name in names:
                copy = self.fresh("out")
                self.node("Identity", [name], [copy])
                name = copy
            names.append(name)
        graph = helper.make_graph(self.nodes, "region", self.inputs,
                                  [value_info(n, ty) for n, (_, ty) in zip(names, outputs)], self.initializers)
        return helper.make_model(graph, opset_imports=[helper.make_opsetid("", self.opset)])


def graph_model(g, opset: int, weights: bool = True) -> onnx.ModelProto:
    """The search graph ``g`` as an ONNX model: its constants initializers (inputs when not
    ``weights``), every other leaf, and each output of an opaque node (the same call before and
    after a rewrite), a graph input. Raises :class:`~tvm_taso.ir.ops.OpError` for an op or form
    the ONNX path cannot write."""
    w = ModelWriter(opset, g.type_of)
    names: dict = {}
    read = itertools.count()

    def name_of(ref) -> str:  # a leaf or an opaque output is written where it is first read
        if ref not in names:
            n = g.nodes[ref[0]]
            names[ref] = w.input(f"p{next(read)}", g.type_of(ref), n.payload[0] if weights and n.op == "const" else None)
        return names[ref]

    for nid in g.topo_order():
        n = g.nodes[nid]
        if n.op not in LEAVES and n.op != "opaque":
            outs = [w.fresh(n.op) for _ in n.types]
            emit(w, n, [name_of(r) for r in n.inputs], outs)
            names.update({(nid, k): out for k, out in enumerate(outs)})
    return w.model([(name_of(r), g.type_of(r)) for r in g.outputs])
