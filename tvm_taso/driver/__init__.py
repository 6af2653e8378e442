"""The drivers above the search: :func:`optimize` (options checked once, the target parsed
once, one report) over the model's front end (:mod:`.front_end`: Relax, :mod:`.relax`; ONNX,
:mod:`.onnx`), each of which searches its graphs through the one block driver (:mod:`.block`)."""

from tvm_taso.driver.optimize import TasoSkippedWarning, optimize

__all__ = ["TasoSkippedWarning", "optimize"]
