"""The ``tuned`` cost model: a kernel costs its tuned time from a MetaSchedule database.

A kernel the search prices is built as TVM would build it (its ops as a Relax function, through
the target's passes up to ``FuseTIR``: :func:`~tvm_taso.cost.tuning.tasks_of`); each TIR kernel
that comes out costs its best time in the database (:func:`~tvm_taso.cost.tuning.best_seconds`),
times how often it runs. A kernel the database does not hold costs the analytic model's price
scaled by the database's own efficiency: the median, over the database's tuned kernels of this
target, of their tuned time over their FLOPs at the analytic model's peak (an assumption: an
untuned kernel would run as efficiently as the median tuned one once tuned; a kernel without
arithmetic, a copy, is priced by the analytic model as it is). The scale is fixed when the
model is made, so one search prices every kernel alike. ``describe()`` counts kernels priced
from the database and by the fallback.
"""

from __future__ import annotations

import logging
import statistics
from pathlib import Path

from tvm_taso import target as targets
from tvm_taso.cost.analytic import AnalyticCost
from tvm_taso.cost.model import CostModel, Kernel

log = logging.getLogger("tvm_taso.cost.tuned")


class TunedCost(CostModel):
    """Kernel cost = its tuned time in the MetaSchedule database in ``database`` (a work dir, as
    ``tvm-taso tune`` writes it), else the scaled analytic price (module docstring)."""

    name = "tuned"

    def __init__(self, target, database):
        from tvm_taso.cost import tuning

        super().__init__()
        self.target = targets.with_cores(target)
        self.path = Path(tuning.check_database(database))
        tuning.tensor_intrinsics()
        self.database = tuning.open_database(self.path)
        self.analytic = AnalyticCost(self.target)
        self.scale = self._efficiency_scale()
        self.from_database = self.fallback = 0

    def _efficiency_scale(self) -> float:
        """Median, over the database's kernels tuned for this target, of the best tuned seconds /
        (FLOPs / the analytic peak); 1 when it holds none with arithmetic."""
        import tvm_ffi
        from tvm.s_tir.analysis import estimate_tir_flops

        canonical, best = targets.canonical(self.target), {}
        for record in self.database.get_all_tuning_records():
            if record.run_secs and targets.canonical(record.target) == canonical:
                key = tvm_ffi.structural_hash(record.workload.mod)
                seconds = float(record.run_secs[0])
                if key not in best or seconds < best[key][0]:
                    best[key] = (seconds, record.workload.mod)
        ratios = []
        for seconds, mod in best.values():
            flops = float(estimate_tir_flops(mod))
            if flops > 0:
                ratios.append(seconds / (flops / self.analytic.roof.peak_flops))
        return statistics.median(ratios) if ratios else 1.0

    def kernel_cost(self, kernel: Kernel) -> float:
        from tvm_taso.cost import tuning
        from tvm_taso.cost.kernel_build import kernel_module

        try:
            tasks = tuning.tasks_of(kernel_module(kernel), self.target)
        except Exception:  # noqa: BLE001 - a kernel TVM cannot build here: the fallback prices it
            tasks = []
        times = [tuning.best_seconds(self.database, t.dispatched[0], self.target) for t in tasks]
        if tasks and all(s is not None for s in times):
            self.from_database += 1
            return sum(s * 1e6 * int(t.weight) for s, t in zip(times, tasks))
        self.fallback += 1
        price = self.analytic.kernel_cost(kernel)
        return price * self.scale if kernel.anchor not in _NO_ARITHMETIC else price

    def describe(self) -> dict:
        return {"name": self.name, "target": targets.canonical(self.target), "database": str(self.path),
                "from_database": self.from_database, "fallback": self.fallback, "fallback_scale": self.scale}


# kernels that only move data: the efficiency of tuned arithmetic says nothing about them
_NO_ARITHMETIC = frozenset({"permute_dims", "reshape", "concat", "split", "pad"})
