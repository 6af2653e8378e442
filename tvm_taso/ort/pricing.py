"""The ``ort`` cost model: each fused kernel written as a small ONNX model and timed in onnxruntime;
and the small ONNX models themselves (:func:`kernel_model`, :func:`region_model`), which the
region guard times too.

:class:`OrtMeasurer` is a measurer for :class:`~tvm_taso.cost.measure.MeasuredCost` (called like
:func:`~tvm_taso.cost.measure.measure_kernel`): the kernel becomes an ONNX model
(:func:`kernel_model`, weights as initializers), loaded in a session with the
runtime's provider and options, warmed up and timed. Its records go to the measurement database
under the runtime's key (:attr:`tvm_taso.ort.OrtRuntime.key`: runtime, version, provider,
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
from tvm_taso.ort import OrtRuntime, OrtSession


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


def _with_initializers(proto, values: dict[int, np.ndarray]):
    """``proto`` with its ``k``-th graph input made an initializer holding ``values[k]`` (a
    weight onnxruntime may pre-pack or fold, as it does in the user's model)."""
    from onnx import numpy_helper

    inputs = list(proto.graph.input)
    del proto.graph.input[:]
    for k, inp in enumerate(inputs):
        if k in values:
            proto.graph.initializer.append(numpy_helper.from_array(np.ascontiguousarray(values[k]), inp.name))
        else:
            proto.graph.input.append(inp)
    return proto


def region_model(g, opset: int | None = None):
    """A search graph, weights folded (:func:`~tvm_taso.ir.graph.fold_constants`), as an ONNX
    model: its constants are initializers, every other leaf (and an opaque node's output, the
    same call before and after a rewrite) a graph input. Raises
    :class:`~tvm_taso.cost.kernel_build.MeasureError` or
    :class:`~tvm_taso.io.onnx_export.ExportError` for a graph that has no such form."""
    from tvm_taso.cost.kernel_build import graph_module
    from tvm_taso.io.onnx_export import MIN_OPSET, export_onnx

    mod, refs = graph_module(g)
    proto = export_onnx(mod, opset=max(opset or MIN_OPSET, MIN_OPSET))
    weights = {k: g.nodes[ref[0]].payload[0] for k, ref in enumerate(refs) if g.nodes[ref[0]].op == "const"}
    return _with_initializers(proto, weights)


def kernel_model(kernel, seed: int = 0):
    """A fused kernel (:class:`~tvm_taso.cost.model.Kernel`) as an ONNX model, its operands of a
    weight's role (:func:`weight_operands`) initializers of random values, the others inputs."""
    from tvm_taso.cost.kernel_build import kernel_inputs, kernel_module
    from tvm_taso.io.onnx_export import export_onnx

    proto = export_onnx(kernel_module(kernel))
    arrays = kernel_inputs(kernel, seed)
    return _with_initializers(proto, {k: arrays[k] for k in weight_operands(kernel)})


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
