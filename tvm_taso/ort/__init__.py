"""onnxruntime, in one place: the runtime a model is optimized for and the kernels it is priced on.

An ``ort`` target (``"ort[:provider][,key=value...]"``) optimizes an ONNX model for onnxruntime
(or TensorRT through it), whose kernels, fusions and layouts are not TVM's. The package's
modules sit on the layers of what they serve (imports stay downward):

* :mod:`.runtime`: :class:`~.runtime.OrtRuntime` (a provider and its options, parsed from the
  target) and :class:`~.runtime.OrtSession` (a model loaded with inputs, timed);
* :mod:`.pricing`: the ``ort`` cost model (each fused kernel timed in onnxruntime) and the
  small ONNX models of kernels and regions, written by the ONNX path's own emitters;
* :mod:`.bench`: an original and an optimized model timed side by side (``tvm-taso bench``);
* :mod:`.guard`: the whole-model guard in onnxruntime (the region guard times
  :func:`.pricing.region_session`).

This module imports nothing, so that importing one piece loads no other.
"""
