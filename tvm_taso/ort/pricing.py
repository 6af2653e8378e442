"""The ``ort`` cost model: each fused kernel written as a small ONNX model and timed in onnxruntime;
and the small ONNX models themselves (:func:`kernel_model`, :func:`region_model`; the region
guard times the latter), written by the ONNX path's own emitters
(:mod:`tvm_taso.io.onnx_graph`), so that what is timed is what a rewrite would write.

:class:`OrtMeasurer` is a measurer for :class:`~tvm_taso.cost.measure.MeasuredCost` (called like
:func:`~tvm_taso.cost.measure.measure_kernel`): the kernel becomes an ONNX model
(:func:`kernel_model`, weights as initializers), loaded in a session with the
runtime's provider and options, warmed up and timed. Its records go to the measurement database
under the runtime's key (:attr:`tvm_taso.ort.runtime.OrtRuntime.key`: runtime, version, provider,
options, device), so a second run measures nothing new. :class:`OrtCost` is the cost model: the
measured model with that measurer, falling back to the analytic model of the provider's proxy
target (scaled to the measured times) past its budget or for a kernel with no ONNX form.
"""

from __future__ import annotations

import statistics

import numpy as np

from tvm_taso.cost.database import Record
from tvm_taso.cost.kernel_build import MeasureError
from tvm_taso.cost.measure import MeasuredCost
from tvm_taso.cost.model import Kernel
from tvm_taso.cost.worker import short_error
from tvm_taso.io.onnx_opset import LAYER_NORMALIZATION_OP_SINCE
from tvm_taso.ort.runtime import OrtRuntime, OrtSession

# written for the user's opset where known (a region); a kernel for the lowest opset in which
# every op of the table but gelu is one ONNX op
OPSET = LAYER_NORMALIZATION_OP_SINCE


class OrtMeasurer:
    """Times kernels in onnxruntime with ``runtime`` (in this process: onnxruntime does not
    crash on a model it cannot run, it raises)."""

    def __init__(self, runtime: OrtRuntime):
        self.runtime = runtime

    def __call__(self, kernel: Kernel, target=None, repeats: int = 10, timeout: float = 60.0, *, warmup: int = 3,
                 min_repeat_ms: int = 1, database=None) -> Record:
        key = kernel.key()
        try:
            proto = kernel_model(kernel)
        except Exception as err:  # noqa: BLE001 - no ONNX form: the fallback prices it
            raise MeasureError(short_error(err, 300)) from None
        try:
            session = OrtSession(self.runtime, proto, feeds_for(proto))
        except Exception as err:  # noqa: BLE001 - onnxruntime refuses the kernel: it costs infinity
            return Record(key, self.runtime.key, kernel.to_json(), "build_error", error=short_error(err, 300))
        try:
            for _ in range(max(1, warmup)):
                session.run()
            samples = [session.time_ms(min_repeat_ms) * 1e3 for _ in range(max(1, repeats))]
        except Exception as err:  # noqa: BLE001
            return Record(key, self.runtime.key, kernel.to_json(), "runtime_error", error=short_error(err, 300))
        return Record(key, self.runtime.key, kernel.to_json(), "ok", median_us=statistics.median(samples),
                      samples_us=samples)

    def record_target(self, target_string: str) -> str:
        """Its records are kept under the runtime's key, not the proxy TVM target's."""
        return self.runtime.key

    def describe(self) -> dict:
        return {"runtime": str(self.runtime)}


class OrtCost(MeasuredCost):
    """Kernel cost = its median time in onnxruntime with ``runtime`` (see the module docstring);
    the other arguments are :class:`~tvm_taso.cost.measure.MeasuredCost`'s."""

    name = "ort"

    def __init__(self, runtime: OrtRuntime, target=None, db=None, **kwargs):
        super().__init__(target if target is not None else runtime.proxy, db, measurer=OrtMeasurer(runtime), **kwargs)


def feeds_for(proto, seed: int = 0) -> dict[str, np.ndarray]:
    """Random arrays for ``proto``'s inputs (static shapes), by name
    (:func:`~tvm_taso.cost.kernel_build.random_inputs`)."""
    from onnx import helper

    from tvm_taso.cost.kernel_build import random_inputs
    from tvm_taso.ir.ops import TensorType

    inits = {t.name for t in proto.graph.initializer}
    inputs = [i for i in proto.graph.input if i.name not in inits]
    types = [TensorType(tuple(d.dim_value for d in i.type.tensor_type.shape.dim),
                        str(helper.tensor_dtype_to_np_dtype(i.type.tensor_type.elem_type))) for i in inputs]
    return dict(zip((i.name for i in inputs), random_inputs(types, seed)))


def region_model(g, opset: int | None = None):
    """A search graph, weights folded (:func:`~tvm_taso.ir.graph.fold_constants`), as an ONNX
    model (:func:`~tvm_taso.io.onnx_graph.graph_model`, written for ``opset``): its constants
    initializers, every other leaf (and an opaque node's output, the same call before and after
    a rewrite) a graph input. Raises :class:`~tvm_taso.ir.ops.OpError` for a graph the ONNX
    path could not write."""
    from tvm_taso.io.onnx_graph import graph_model

    return graph_model(g, opset or OPSET)


def region_session(runtime: OrtRuntime, g, opset: int | None = None) -> OrtSession:
    """The folded region ``g`` (:func:`region_model`) loaded by ``runtime`` with random inputs:
    what the region guard times for an ``ort`` target."""
    proto = region_model(g, opset)
    return OrtSession(runtime, proto, feeds_for(proto))


def kernel_model(kernel, seed: int = 0):
    """A fused kernel (:class:`~tvm_taso.cost.model.Kernel`) as an ONNX model, its operands of a
    weight's role (:func:`weight_operands`) initializers of random values, the others inputs."""
    from tvm_taso.cost.kernel_build import kernel_inputs, select_outputs
    from tvm_taso.io.onnx_graph import ModelWriter
    from tvm_taso.io.onnx_ops import emit
    from tvm_taso.ir import ops
    from tvm_taso.ir.graph import Node

    arrays, weights = kernel_inputs(kernel, seed), weight_operands(kernel)
    types: dict = {}  # ref -> type: ("in", k) for the k-th external operand, (op, output) inside
    w = ModelWriter(OPSET, types.__getitem__)
    values: list[list[tuple]] = []  # per op: its outputs' (name, type)
    external = 0
    for op, attrs, operands in kernel.ops:
        refs, names = [], []
        for o in operands:
            if o[0] == "in":
                ref = ("in", external)
                types[ref] = o[1]
                names.append(w.input(f"p{external}", o[1], arrays[external] if external in weights else None))
                external += 1
            else:
                ref = (o[1], o[2])
                names.append(values[o[1]][o[2]][0])
            refs.append(ref)
        out_types = tuple(ops.OPS[op].infer([types[r] for r in refs], dict(attrs)))
        outs = [w.fresh(op) for _ in out_types]
        emit(w, Node(op, tuple(refs), tuple(dict(attrs).items()), out_types), names, outs)
        types.update({(len(values), i): t for i, t in enumerate(out_types)})
        values.append(list(zip(outs, out_types)))
    consumed = {(o[1], o[2]) for _, _, operands in kernel.ops for o in operands if o[0] == "op"}
    return w.model(select_outputs(kernel, values, [[t for _, t in v] for v in values], consumed))


def weight_operands(kernel) -> set[int]:
    """The external operands of ``kernel`` (numbered as :func:`~tvm_taso.cost.kernel_build.kernel_module`
    makes them parameters) that are a weight in the models the search sees: a convolution's
    kernel, a matrix multiplied into the first operand, and any later operand smaller than the
    first (a bias, a scale, a normalization's gamma). A kernel records shapes, not which
    operands are constants, and onnxruntime pre-packs and folds constants, so they are
    initializers when it is timed."""
    from tvm_taso.ir import ops

    weights, k, types = set(), 0, []
    for op, attrs, operands in kernel.ops:
        shapes = [o[1] if o[0] == "in" else types[o[1]][o[2]] for o in operands]
        types.append(list(ops.OPS[op].infer(shapes, dict(attrs))))
        for i, o in enumerate(operands):
            if o[0] != "in":
                continue
            first = shapes[0]
            if i > 0 and (op == "conv2d" and i == 1 or op == "matmul" and i == 1 and len(o[1].shape) == 2
                          or len(o[1].shape) < len(first.shape) or np.prod(o[1].shape) < np.prod(first.shape)):
                weights.add(k)
            k += 1
    return weights
