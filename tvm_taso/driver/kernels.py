"""The kernels a search prices: what a cost model for a model must rank, so what to measure to
train one (:mod:`tvm_taso.cost.training`)."""

from __future__ import annotations

import warnings

from tvm_taso.cost.analytic import AnalyticCost
from tvm_taso.cost.model import Kernel
from tvm_taso.driver.optimize import TasoSkippedWarning, optimize


class _Recorder(AnalyticCost):
    """The roofline, remembering every distinct kernel it is asked about (in order)."""

    name = "analytic"

    def __init__(self, target=None):
        super().__init__(target)
        self.seen: dict[Kernel, None] = {}

    def kernel_cost(self, kernel: Kernel) -> float:
        self.seen.setdefault(kernel, None)
        return super().kernel_cost(kernel)


def search_kernels(mod, target=None, **optimize_kw) -> list[Kernel]:
    """The distinct kernels a search over ``mod`` prices (the model's own and every candidate's,
    with the analytic model steering): the kernels a cost model for this model must rank."""
    rec = _Recorder(target)
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", TasoSkippedWarning)
        optimize(mod, target=target, cost_model=rec, **optimize_kw)
    return list(rec.seen)
