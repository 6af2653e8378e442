"""The ``tuned`` cost model: a kernel costs its tuned time from a MetaSchedule database.

A kernel the search prices is built as TVM would build it (its ops as a Relax function, through
the target's passes up to ``FuseTIR``: :func:`~tvm_taso.cost.tuning.tasks_of`); each TIR kernel
that comes out (a *task*) costs its best time in the database
(:func:`~tvm_taso.cost.tuning.best_seconds`), times how often it runs; a matmul or convolution
the build hands to the BLAS (:mod:`tvm_taso.blas`) costs that call timed here
(:func:`~tvm_taso.blas.matmul_seconds`). A task the database does not hold is predicted:

* with :data:`MIN_WORKLOADS` or more tuned tasks with arithmetic in the database, by
  :class:`TunedTimePredictor`: gradient-boosted trees over MetaSchedule's own per-store features
  of the untuned task (its loops, buffers and arithmetic as TVM's XGBoost cost model reads them),
  fitted to how far each tuned task's time is from its FLOPs at the analytic model's peak;
* else the whole kernel costs the analytic model's price scaled by the database's efficiency:
  the median, over the database's tuned tasks of this target, of their tuned time over their
  FLOPs at the analytic model's peak (an assumption: an untuned kernel would run as efficiently
  as the median tuned one once tuned).

A kernel without arithmetic (a copy, a transpose) that the database lacks is priced by the
analytic model as it is: tuned arithmetic says nothing about it. The scale and the predictor are
fixed when the model is made, so one search prices every kernel alike. ``describe()`` counts
kernels priced from the database, predicted, and by the fallback. Measured on a tuned ResNet-50
database, leaving each task out in turn: the predictor ranks the tasks' times with Spearman 0.85
against the scaled price's 0.70, at about the same median error (0.17 against 0.16;
``python -m benchmarks.tuned_prediction``).
"""

from __future__ import annotations

import logging
import math
import statistics
from pathlib import Path

import numpy as np

from tvm_taso import blas, target as targets
from tvm_taso.cost.analytic import AnalyticCost
from tvm_taso.cost.model import CostModel, Kernel

log = logging.getLogger("tvm_taso.cost.tuned")

MIN_WORKLOADS = 8  # the fewest tuned tasks with arithmetic a prediction is fitted on
PREDICTOR_PARAMS = {"max_depth": 2, "eta": 0.1, "nthread": 1, "verbosity": 0, "seed": 0}
PREDICTOR_ROUNDS = 50  # shallow and few: a database holds tens of tasks, not thousands


class TunedCost(CostModel):
    """Kernel cost = its tasks' tuned times in the MetaSchedule database in ``database`` (a work
    dir, as ``tvm-taso tune`` writes it), else predicted (module docstring)."""

    name = "tuned"

    def __init__(self, target, database):
        from tvm_taso.cost import tuning

        super().__init__()
        self.target = targets.with_cores(target)
        self.path = Path(tuning.check_database(database))
        tuning.tensor_intrinsics()
        self.database = tuning.open_database(self.path)
        self.analytic = AnalyticCost(self.target)
        workloads = tuned_workloads(self.database, self.target)
        self.scale = efficiency_scale(workloads, self.peak)
        self.predictor = (TunedTimePredictor(workloads, self.target, self.peak)
                          if len(workloads) >= MIN_WORKLOADS else None)
        self.from_database = self.predicted = self.fallback = self.library_calls = 0

    @property
    def peak(self) -> float:
        return self.analytic.roof.peak_flops

    def kernel_cost(self, kernel: Kernel) -> float:
        from tvm_taso.cost import tuning
        from tvm_taso.cost.kernel_build import fused_module, target_kernel_module

        try:
            fused = fused_module(target_kernel_module(kernel, self.target), self.target)
            tasks, calls = tuning.fused_tasks(fused, self.target), blas.library_calls(fused)
        except Exception:  # noqa: BLE001 - a kernel TVM cannot build here: the fallback prices it
            tasks, calls = [], []
        times = [tuning.best_seconds(self.database, t.dispatched[0], self.target) for t in tasks]
        predicted = None in times and self.predictor is not None and kernel.anchor not in _NO_ARITHMETIC
        if predicted:
            times = [s if s is not None else self.predictor.seconds(t.dispatched[0]) for s, t in zip(times, tasks)]
        static = all(isinstance(d, int) for a, b, _ in calls for d in a + b)
        if (tasks or calls) and None not in times and static:
            if predicted:
                self.predicted += 1
            else:
                self.from_database += 1
            library = sum(blas.matmul_seconds(a, b, dtype) for a, b, dtype in calls)
            self.library_calls += len(calls)
            return sum(s * 1e6 * int(t.weight) for s, t in zip(times, tasks)) + library * 1e6
        self.fallback += 1
        price = self.analytic.kernel_cost(kernel)
        return price * self.scale if kernel.anchor not in _NO_ARITHMETIC else price

    def describe(self) -> dict:
        return {"name": self.name, "target": targets.canonical(self.target), "database": str(self.path),
                "from_database": self.from_database, "predicted": self.predicted, "fallback": self.fallback,
                "library_calls": self.library_calls,
                "fallback_scale": self.scale,
                "predictor_workloads": 0 if self.predictor is None else self.predictor.workloads}


def tuned_workloads(database, target) -> list[tuple[float, float, object]]:
    """(best seconds, FLOPs, workload IRModule) of each task ``database`` tuned for ``target``
    that has arithmetic."""
    import tvm_ffi
    from tvm.s_tir.analysis import estimate_tir_flops

    canonical, best = targets.canonical(target), {}
    for record in database.get_all_tuning_records():
        if record.run_secs and targets.canonical(record.target) == canonical:
            key = tvm_ffi.structural_hash(record.workload.mod)
            seconds = float(record.run_secs[0])
            if key not in best or seconds < best[key][0]:
                best[key] = (seconds, record.workload.mod)
    rows = [(seconds, float(estimate_tir_flops(mod)), mod) for seconds, mod in best.values()]
    return [row for row in rows if row[1] > 0]


def efficiency_scale(workloads, peak: float) -> float:
    """The median, over tuned ``workloads`` (:func:`tuned_workloads`), of tuned seconds over
    FLOPs at ``peak``; 1 for none."""
    return statistics.median(s / (f / peak) for s, f, _ in workloads) if workloads else 1.0


class TunedTimePredictor:
    """A task's tuned time predicted from its untuned loops: an :class:`xgboost.Booster` over
    :func:`workload_features`, fitted to ``log(tuned seconds / (FLOPs / peak))`` of the tuned
    ``workloads`` (:func:`tuned_workloads`; ``features``: theirs, when computed before) around
    their median — the scaled analytic price, then what the features say about how far a task is
    from it (the log scale, as in TVM's own XGBoost cost model: a 2x error weighs the same on a
    small task as on a large one)."""

    def __init__(self, workloads, target, peak: float, features: np.ndarray | None = None):
        import xgboost

        self.target, self.peak, self.workloads = target, peak, len(workloads)
        x = features if features is not None else np.stack(
            [workload_features(mod, target, flops) for _, flops, mod in workloads])
        y = np.array([math.log(seconds / (flops / peak)) for seconds, flops, _ in workloads])
        self.center = float(np.median(y))
        self.booster = xgboost.train(PREDICTOR_PARAMS, xgboost.DMatrix(x, label=y - self.center), PREDICTOR_ROUNDS)

    def seconds(self, workload) -> float | None:
        """The predicted tuned seconds of the task ``workload`` (an IRModule), or None for one
        without arithmetic or whose features TVM cannot extract (symbolic extents)."""
        from tvm.s_tir.analysis import estimate_tir_flops

        try:
            flops = float(estimate_tir_flops(workload))
            if flops <= 0:
                return None
            x = workload_features(workload, self.target, flops)[None, :]
        except Exception as err:  # noqa: BLE001 - TVM raises several types; the caller falls back
            log.debug("no tuned-time prediction for a task: %s", err)
            return None
        log_ratio = self.center + float(self.booster.inplace_predict(x)[0])
        return math.exp(log_ratio) * flops / self.peak


def workload_features(workload, target, flops: float) -> np.ndarray:
    """MetaSchedule's per-store features (``PerStoreFeature``, with the workload's) of the untuned
    task ``workload``, summed and maximized over its stores, with its log FLOPs and store count."""
    from tvm import s_tir
    from tvm.s_tir import meta_schedule as ms

    from tvm_taso.cost.schedules import design_space_context

    func = next(iter(workload.functions.values()))
    candidate = ms.MeasureCandidate(s_tir.Schedule(workload), ms.arg_info.ArgInfo.from_prim_func(func))
    (per_store,) = ms.feature_extractor.PerStoreFeature(extract_workload=True).extract_from(
        design_space_context(workload, target), [candidate])
    rows = per_store.numpy()
    return np.concatenate([rows.sum(0), rows.max(0), [math.log(flops), rows.shape[0]]])


# kernels that only move data: the efficiency of tuned arithmetic says nothing about them
_NO_ARITHMETIC = frozenset({"permute_dims", "reshape", "concat", "split", "pad"})
