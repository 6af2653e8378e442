"""Cost models: the kernels TVM would build and what they cost on a target.

:mod:`.model` holds the kernel partition and the :class:`CostModel` interface; the models are
:mod:`.analytic` (roofline), :mod:`.measure` (timed on the device, through :mod:`.worker`
processes, or remotely with :mod:`.rpc`) and :mod:`.learned` (predicted; fitted by
:mod:`.training`). :mod:`.factory` makes any of them by name, :mod:`.database` remembers
measurements, :mod:`.kernel_build` turns a kernel into a module, :mod:`.latency` times whole
modules side by side.
"""

from .analytic import AnalyticCost
from .model import CostModel, Kernel, kernels

__all__ = ["AnalyticCost", "CostModel", "Kernel", "kernels"]
