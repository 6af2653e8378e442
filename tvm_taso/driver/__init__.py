"""The drivers above the search: :func:`optimize` (options checked once, the target parsed
once, one report) over the Relax front end (:mod:`.relax`) and the ONNX one (:mod:`.onnx`),
both of which search each graph with the one block driver (:mod:`.block`)."""

from tvm_taso.driver.optimize import TasoSkippedWarning, optimize

__all__ = ["TasoSkippedWarning", "optimize"]
