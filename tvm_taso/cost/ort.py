"""The ``ort`` cost model: each fused kernel written as a small ONNX model and timed in onnxruntime.

:class:`OrtMeasurer` is a measurer for :class:`~tvm_taso.cost.measure.MeasuredCost` (called like
:func:`~tvm_taso.cost.measure.measure_kernel`): the kernel becomes an ONNX model
(:func:`tvm_taso.ort.kernel_model`, weights as initializers), loaded in a session with the
runtime's provider and options, warmed up and timed. Its records go to the measurement database
under the runtime's key (:attr:`tvm_taso.ort.OrtRuntime.key`: runtime, version, provider,
options, device), so a second run measures nothing new. :class:`OrtCost` is the cost model: the
measured model with that measurer, falling back to the analytic model of the provider's proxy
target (scaled to the measured times) past its budget or for a kernel with no ONNX form.
"""

from __future__ import annotations

import statistics

from tvm_taso.cost.database import Record
from tvm_taso.cost.kernel_build import MeasureError
from tvm_taso.cost.measure import MeasuredCost
from tvm_taso.cost.model import Kernel
from tvm_taso.cost.worker import short_error
from tvm_taso.ort import OrtRuntime, OrtSession, feeds_for, kernel_model


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
