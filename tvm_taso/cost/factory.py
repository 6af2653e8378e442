"""The one place that turns a cost-model name into a :class:`~tvm_taso.cost.model.CostModel`."""

from __future__ import annotations

import logging

from tvm_taso import target as targets
from tvm_taso.cost.analytic import AnalyticCost
from tvm_taso.cost.model import CostModel

log = logging.getLogger("tvm_taso.cost.factory")

NAMES = ("auto", "analytic", "measure", "learned", "ort", "rpc", "tuned")


def make_cost_model(cost_model, target, rpc=None, database=None) -> CostModel:
    """The cost model named by ``cost_model`` for ``target``:

    * ``"analytic"``: the roofline :class:`~tvm_taso.cost.analytic.AnalyticCost`;
    * ``"measure"``: :class:`~tvm_taso.cost.measure.MeasuredCost` (build and time each kernel on the
      target, remembered in the measurement database);
    * ``"learned"``: the :class:`~tvm_taso.cost.learned.LearnedCost` trained for the target
      (ValueError if there is none);
    * ``"rpc"``: :class:`~tvm_taso.cost.rpc.RPCMeasuredCost` on the devices ``rpc`` names
      (:func:`tvm_taso.cost.rpc.fleet.parse`: ``"host:port/key"`` for a tracker,
      ``"host:port,host:port"`` for servers), reached before it is returned
      (:class:`~tvm_taso.cost.rpc.RPCUnavailable`, one line, when they cannot be); ``rpc`` given
      with ``"auto"`` means ``"rpc"``;
    * ``"tuned"``: :class:`~tvm_taso.cost.tuned.TunedCost`, each kernel's tuned time in the
      MetaSchedule database in ``database`` (a work dir ``tvm-taso tune`` wrote);
    * ``"ort"``: :class:`~tvm_taso.ort.pricing.OrtCost` (each kernel timed in onnxruntime), for an
      ``ort`` target only (:mod:`tvm_taso.ort`); ``measure`` and ``learned`` price TVM's kernels,
      so an ``ort`` target refuses them;
    * ``"auto"`` / None: ``ort`` for an ``ort`` target; else measure when the target is CUDA and this machine has a GPU, else the
      learned model trained for the target if there is one, else analytic. The report's
      ``cost_model.name`` says which was chosen;
    * a :class:`CostModel`: itself, with its measurement budget reset (a budget bounds each
      search, not the model's lifetime).
    """
    if isinstance(cost_model, CostModel):
        reset = getattr(cost_model, "reset_budget", None)
        if callable(reset):
            reset()
        return cost_model
    if (database is not None) != (cost_model == "tuned"):
        raise ValueError("cost model 'tuned' reads a MetaSchedule database, and only it: give both, "
                         "cost_model='tuned' and database=DIR" if cost_model == "tuned" else
                         f"a MetaSchedule database is for cost model 'tuned', not {cost_model!r}")
    if cost_model == "tuned":
        from tvm_taso.cost.tuned import TunedCost

        return TunedCost(target, database)
    if cost_model == "rpc" or (rpc is not None and cost_model in (None, "auto")):
        if rpc is None:
            raise ValueError("cost model 'rpc' measures on remote devices: give rpc='host:port/key' (a tracker) "
                             "or 'host:port,host:port' (servers)")
        from tvm_taso.cost.rpc.fleet import fleet_cost

        return fleet_cost(rpc, target)
    if rpc is not None:
        raise ValueError(f"rpc= is for cost_model='rpc', not {cost_model!r}")
    runtime = targets.resolve(target).runtime if cost_model != "analytic" else None
    if cost_model == "ort" or (runtime is not None and cost_model in (None, "auto")):
        if runtime is None:
            raise ValueError(f"cost model 'ort' times kernels in onnxruntime: give an ort target "
                             f"(e.g. target='ort'), not {target}")
        from tvm_taso.ort.pricing import OrtCost

        return OrtCost(runtime)
    if runtime is not None and cost_model in ("measure", "learned"):
        raise ValueError(f"cost model {cost_model!r} prices TVM's kernels, but target {target} runs the model in "
                         "onnxruntime; use 'ort' (or 'analytic')")
    if cost_model == "analytic":
        return AnalyticCost(target)
    if cost_model == "measure":
        from tvm_taso.cost.measure import MeasuredCost

        return MeasuredCost(target)
    if cost_model == "learned":
        from tvm_taso.cost.learned import LearnedCost

        learned = LearnedCost.load_for(target)
        if learned is None:
            name = str(target) if isinstance(target, (str, targets.Target)) else targets.canonical(target)
            raise ValueError(f"no model trained for {name}; run `tvm-taso cost train` first")
        return learned
    if cost_model in (None, "auto"):
        if targets.kind(target) == "cuda" and targets.device(target) is not None:
            from tvm_taso.cost.measure import MeasuredCost

            return MeasuredCost(target)
        learned = _trained_model(target)
        return learned if learned is not None else AnalyticCost(target)
    raise ValueError(f"unknown cost model {cost_model!r}; use one of {', '.join(NAMES)} or a CostModel instance")


def _trained_model(target):
    """The learned model for ``target`` if one is trained and loads; None otherwise (without
    xgboost, or with a broken model file, ``auto`` still works)."""
    try:
        from tvm_taso.cost.learned import LearnedCost

        return LearnedCost.load_for(target)
    except ImportError:
        return None
    except Exception:  # noqa: BLE001 - a broken model file must not stop the search
        log.warning("could not load the learned cost model; using the analytic one", exc_info=True)
        return None
