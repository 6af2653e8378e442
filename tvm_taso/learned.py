"""Learned cost: an XGBoost model of kernel latency, trained on the measurement database.

Measuring every kernel a search meets costs a build and a run each (seconds on a CPU, more on a
remote board). :class:`LearnedCost` predicts a kernel's time from :func:`kernel_features`
instead, with gradient-boosted trees (an :class:`xgboost.Booster`, trained with
``xgboost.train``: the scikit-learn wrapper ``XGBRegressor`` would need scikit-learn, which
tvm-taso does not otherwise use) fitted on the target's recorded measurements to predict ``log(latency in µs)`` -- the same recipe as TVM's own XGBoost cost model (gradient
boosted trees over hand-made features, trained on the log scale so that a 2x error on a 5 µs
kernel weighs as much as one on a 5 ms kernel).

* :func:`train` fits a model on :class:`~tvm_taso.database.Record` s and reports, on a held-out
  split, the Spearman rank correlation (what the search needs: the *order* of candidates) and
  the median relative error (what the reported costs need).
* :meth:`LearnedCost.save` / :meth:`LearnedCost.load_for` keep one model per target in
  ``$TVM_TASO_CACHE/learned-<kind>-<digest>.json`` (else ``~/.cache/tvm-taso/``);
  ``cost_model="auto"`` uses it when it exists.
* A kernel already measured on the target (in the measurement database) costs its measured
  time, never a prediction.
* ``LearnedCost(..., measure=MeasuredCost, budget=N)`` predicts every candidate and measures at
  most ``N`` new kernels per search, where they decide something (see :class:`LearnedCost`).

``tvm-taso cost train`` (:func:`add_cost_train_command`) trains a model from the database.
"""

from __future__ import annotations

import hashlib
import json
import logging
import math
import os
import statistics
import time
from collections import Counter
from dataclasses import dataclass
from pathlib import Path

import numpy as np

from . import ops
from .cost import AnalyticCost, CostModel, Kernel, kernels

log = logging.getLogger("tvm_taso.learned")

FORMAT = "tvm-taso-learned/1"

_OP_NAMES = sorted(ops.OPS)
_KINDS = [ops.ELEMWISE, ops.INJECTIVE, ops.KERNEL, ops.REDUCE, ops.VIEW]


def _feature_names() -> list[str]:
    names = ["n_ops", "n_inputs", "n_outputs"]
    names += [f"kind:{k}" for k in _KINDS]
    names += [f"op:{o}" for o in _OP_NAMES]
    names += [f"anchor:{o}" for o in _OP_NAMES] + ["anchor:other"]
    names += [
        "log_flops", "log_anchor_flops", "log_bytes_read", "log_bytes_written", "log_bytes",
        "log_intensity", "log_out_elems", "log_anchor_out_elems", "log_max_in_elems", "dtype_bytes",
        "log_out_last_dim", "out_last_dim_pow2", "out_rank",
    ]
    names += [
        "conv:n", "conv:cin", "conv:cout", "conv:h", "conv:w", "conv:oh", "conv:ow", "conv:kh", "conv:kw",
        "conv:stride", "conv:dilation", "conv:pad", "conv:groups", "conv:cin_per_group", "conv:depthwise",
    ]
    names += ["mm:batch", "mm:m", "mm:n", "mm:k", "mm:weight_batched", "mm:n_pow2", "mm:k_pow2"]
    names += ["pool:k", "pool:stride"]
    names += ["reduce:inner", "reduce:outer"]
    names += ["concat:inputs", "split:outputs", "permute:moves_last", "pad:elems"]
    return names


FEATURE_NAMES: list[str] = _feature_names()
_INDEX = {name: i for i, name in enumerate(FEATURE_NAMES)}


def _lg(x) -> float:
    """log2(1 + x): the scale of every size feature."""
    return math.log2(1.0 + max(0.0, float(x)))


def _pow2(n: int, cap: int = 6) -> int:
    """How many times 2 divides ``n`` (capped): vectorization and tiling care."""
    n, k = int(n), 0
    while n > 0 and n % 2 == 0 and k < cap:
        n //= 2
        k += 1
    return k


def kernel_features(kernel: Kernel) -> np.ndarray:
    """A fixed-length float32 vector describing ``kernel`` (names in :data:`FEATURE_NAMES`).

    Counts of ops and op kinds; the anchor op (one-hot); total and anchor FLOPs, bytes read
    (external inputs) and written (outputs), output elements, arithmetic intensity; the
    conv2d / matmul / pool / reduction / layout attributes of the kernel's first op of each
    sort (kernel size, stride, groups, channels, m/n/k, ...). Sizes are log2-scaled. Never
    raises: what cannot be inferred stays 0."""
    f = np.zeros(len(FEATURE_NAMES), dtype=np.float32)

    def put(name, value):
        f[_INDEX[name]] = value

    put("n_ops", len(kernel.ops))
    put("n_outputs", len(kernel.outputs))
    anchor = kernel.ops[0][0] if kernel.ops else None
    put(f"anchor:{anchor}" if anchor in ops.OPS else "anchor:other", 1.0)

    produced: list[list] = []
    flops = anchor_flops = 0.0
    read = n_inputs = max_in = 0
    anchor_out = 0
    dtype_bytes = 4
    seen: set[str] = set()
    for idx, (op, attrs, operands) in enumerate(kernel.ops):
        spec = ops.OPS.get(op)
        if spec is None:
            produced.append([])
            continue
        f[_INDEX[f"op:{op}"]] += 1
        f[_INDEX[f"kind:{spec.kind}"]] += 1
        a = dict(attrs)
        types = []
        for o in operands:
            if o[0] == "in":
                t = o[1]
                if t is not None:
                    n_inputs += 1
                    read += t.nbytes
                    max_in = max(max_in, t.size)
                    dtype_bytes = np.dtype(t.dtype).itemsize
            else:
                src = produced[o[1]] if o[1] < len(produced) else []
                t = src[o[2]] if o[2] < len(src) else None
            types.append(t)
        outs: list = []
        if all(t is not None for t in types):
            try:
                outs = spec.infer(types, a)
                if spec.flops is not None:
                    fl = float(spec.flops(types, outs, a))
                    flops += fl
                    if idx == 0:
                        anchor_flops = fl
            except Exception:  # noqa: BLE001 - a feature vector never fails
                outs = []
        produced.append(outs)
        if idx == 0 and outs:
            anchor_out = max(t.size for t in outs if t is not None)
        if op in seen or not outs or any(t is None for t in types):
            continue
        seen.add(op)
        _op_features(put, op, a, types, outs)

    written = sum(t.nbytes for t in kernel.outputs if t is not None)
    out_elems = max((t.size for t in kernel.outputs if t is not None), default=0)
    put("n_inputs", n_inputs)
    put("log_flops", _lg(flops))
    put("log_anchor_flops", _lg(anchor_flops))
    put("log_bytes_read", _lg(read))
    put("log_bytes_written", _lg(written))
    put("log_bytes", _lg(read + written))
    put("log_intensity", math.log2((flops + 1.0) / (read + written + 1.0)))
    put("log_out_elems", _lg(out_elems))
    put("log_anchor_out_elems", _lg(anchor_out))
    put("log_max_in_elems", _lg(max_in))
    put("dtype_bytes", dtype_bytes)
    if kernel.outputs and kernel.outputs[0] is not None and kernel.outputs[0].shape:
        last = kernel.outputs[0].shape[-1]
        put("log_out_last_dim", _lg(last))
        put("out_last_dim_pow2", _pow2(last))
        put("out_rank", len(kernel.outputs[0].shape))
    return f


def _op_features(put, op, a, types, outs) -> None:
    if op == "conv2d":
        (n, c, h, w), (o, i, kh, kw) = types[0].shape, types[1].shape
        _, _, oh, ow = outs[0].shape
        for name, v in (("n", n), ("cin", c), ("cout", o), ("h", h), ("w", w), ("oh", oh), ("ow", ow),
                        ("kh", kh), ("kw", kw), ("cin_per_group", i)):
            put(f"conv:{name}", _lg(v))
        put("conv:stride", max(a.get("strides", (1, 1))))
        put("conv:dilation", max(a.get("dilation", (1, 1))))
        put("conv:pad", sum(a.get("padding", (0, 0, 0, 0))))
        g = int(a.get("groups", 1))
        put("conv:groups", _lg(g))
        put("conv:depthwise", 1.0 if g > 1 and g == c else 0.0)
    elif op == "matmul":
        sa, sb = types[0].shape, types[1].shape
        m, k, nn = sa[-2], sa[-1], sb[-1]
        batch = math.prod(outs[0].shape[:-2]) if len(outs[0].shape) > 2 else 1
        put("mm:batch", _lg(batch))
        put("mm:m", _lg(m))
        put("mm:n", _lg(nn))
        put("mm:k", _lg(k))
        put("mm:weight_batched", 1.0 if len(sb) > 2 and math.prod(sb[:-2]) > 1 else 0.0)
        put("mm:n_pow2", _pow2(nn))
        put("mm:k_pow2", _pow2(k))
    elif op in ("max_pool2d", "avg_pool2d"):
        put("pool:k", _lg(math.prod(a.get("pool_size", (1, 1)))))
        put("pool:stride", max(a.get("strides", (1, 1))))
    elif op in ("softmax", "layer_norm", "mean", "batch_norm"):
        shape = types[0].shape
        rank = len(shape)
        if op == "softmax":
            axes = [a.get("axis", -1)]
        elif op == "layer_norm":
            axes = list(a.get("axes", (-1,)))
        elif op == "mean":
            axes = list(a.get("axis", ()))
        else:  # batch_norm (inference): per channel, over the rest
            axes = [d for d in range(rank) if d != a.get("axis", 1) % max(rank, 1)]
        inner = math.prod(shape[x % rank] for x in axes) if rank else 1
        size = math.prod(shape)
        put("reduce:inner", _lg(inner))
        put("reduce:outer", _lg(size // max(inner, 1)))
    elif op == "concat":
        put("concat:inputs", len(types))
    elif op == "split":
        put("split:outputs", len(outs))
    elif op == "permute_dims":
        axes = a.get("axes") or ()
        put("permute:moves_last", 1.0 if axes and axes[-1] != len(axes) - 1 else 0.0)
    elif op == "pad":
        put("pad:elems", _lg(outs[0].size - types[0].size))


def features_matrix(kernel_list) -> np.ndarray:
    return np.stack([kernel_features(k) for k in kernel_list]) if kernel_list else np.zeros((0, len(FEATURE_NAMES)), np.float32)


# --------------------------------------------------------------------------------------------
# Where models live
# --------------------------------------------------------------------------------------------


def cache_dir() -> Path:
    root = os.environ.get("TVM_TASO_CACHE")
    return Path(root).expanduser() if root else Path.home() / ".cache" / "tvm-taso"


def model_path(target=None) -> Path:
    """``<cache>/learned-<kind>-<digest>.json``: one model per canonical target string."""
    from .database import canonical_target, target_kind

    t = canonical_target(target)
    kind = "".join(c for c in target_kind(t) if c.isalnum() or c in "-_") or "target"
    digest = hashlib.sha256(t.encode()).hexdigest()[:10]
    return cache_dir() / f"learned-{kind}-{digest}.json"


# --------------------------------------------------------------------------------------------
# The cost model
# --------------------------------------------------------------------------------------------


@dataclass
class _Region:
    """The kernels of the first graph seen with one interface (a search region's start)."""

    start: Counter
    start_cost: float
    best: float


def _interface(g) -> tuple:
    """What stays fixed while the search rewrites one region: its input leaves and output
    types. Every candidate of a region shares it with the region's starting graph."""
    inputs = tuple(sorted(repr(n.attrs) for n in g.nodes.values() if n.op == "input"))
    outputs = []
    for ref in g.outputs:
        try:
            outputs.append(str(g.type_of(ref)))
        except Exception:  # noqa: BLE001
            outputs.append("?")
    return inputs, tuple(outputs)


class LearnedCost(CostModel):
    """Kernel cost predicted by a gradient-boosted tree model of ``log(µs)``.

    ``model`` is a fitted :class:`xgboost.Booster` (from :func:`train` or :meth:`load`; a
    fitted ``XGBRegressor`` is accepted too); ``target`` the target it was trained for. A kernel measured on the target
    (``db``: a :class:`~tvm_taso.database.MeasurementDB`, a path, or None for the default file
    when it exists) costs its measured time; the others cost the model's prediction.

    **Measuring the few that matter** (``measure=`` a :class:`~tvm_taso.measure.MeasuredCost`
    instance or class, or an ``RPCMeasuredCost``; ``budget=N``): every candidate is first
    priced by prediction. A rewrite only changes the kernels where a candidate differs from
    its region's starting graph, and the search keeps a candidate only if it is cheaper than
    the best graph of its region; so when a candidate's predicted cost is within ``margin``
    (5 %) of the best cost seen for its region, the kernels it *adds* and the kernels it
    *removes* relative to the region's start are measured (at most ``N`` new measurements per
    search; database hits are free), and the candidate is re-priced as the start's cost plus
    the measured difference. Kernels shared with the start cancel out of every comparison, so
    their prediction error cannot flip a decision; the measured difference decides. Candidates
    predicted to be clearly worse are never measured. Regions are told apart by their
    interface (input leaves and output types), which rewrites preserve.
    """

    name = "learned"

    def __init__(
        self,
        model=None,
        target=None,
        *,
        db=None,
        measure=None,
        budget: int | None = None,
        margin: float = 0.05,
        metrics: dict | None = None,
        path: str | os.PathLike | None = None,
    ):
        super().__init__()
        from .database import MeasurementDB, canonical_target

        if model is None:
            raise ValueError("LearnedCost needs a fitted model: use train(...), LearnedCost.load(...) or load_for(...)")
        if hasattr(model, "get_booster"):  # an XGBRegressor
            model = model.get_booster()
        try:
            # one thread: a prediction is a few rows; OpenMP threads only spin (60 ms a call
            # instead of 0.2 ms on a busy 2-core machine)
            model.set_param({"nthread": 1})
        except Exception:  # noqa: BLE001
            pass
        self.model = model
        self.target = canonical_target(target)
        self.metrics = dict(metrics or {})
        self.path = str(path) if path else None
        self.margin = margin
        self.budget = budget
        # the measurer: a CostModel that measures (MeasuredCost, RPCMeasuredCost), made from a class
        if isinstance(measure, type):
            measure = measure(target) if target is not None else measure()
        self.measurer = measure
        if measure is not None and db is None:
            db = getattr(measure, "db", None)
        if isinstance(db, MeasurementDB) or db is None:
            self._db = db
        else:
            self._db = MeasurementDB(db)
        self._db_default = db is None and measure is None
        self.db_target = getattr(measure, "db_target", None) or self.target
        self.predicted = self.db_hits = self.measured = 0
        self.predict_seconds = 0.0
        self._measured_kernels: set[Kernel] = set()
        self._regions: dict[tuple, _Region] = {}
        self._used = 0

    # -- the database of measured times -------------------------------------------------------
    @property
    def db(self):
        if self._db is None and self._db_default:
            from .database import MeasurementDB, default_path

            self._db_default = False
            if default_path().exists():
                self._db = MeasurementDB()
        return self._db

    def reset_budget(self) -> None:
        """A new search: the measurement budget and the regions' best costs start afresh."""
        self._used = 0
        self._regions.clear()
        reset = getattr(self.measurer, "reset_budget", None)
        if callable(reset):
            reset()

    # -- pricing ------------------------------------------------------------------------------
    def predict(self, kernel_list) -> np.ndarray:
        """Predicted µs of each kernel (the model alone, no database)."""
        if not kernel_list:
            return np.zeros(0)
        t0 = time.perf_counter()
        x = features_matrix(list(kernel_list))
        y = np.asarray(self.model.inplace_predict(x), dtype=np.float64).reshape(-1)
        self.predict_seconds += time.perf_counter() - t0
        return np.exp(np.clip(y, -20.0, 40.0))

    def kernel_cost(self, kernel: Kernel) -> float:
        self._price([kernel])
        return self._memo[kernel]

    def _price(self, kernel_list) -> None:
        """Memoize a cost for every kernel: measured if the database has it, else predicted
        (all predictions of one graph in one call to the model)."""
        todo = [k for k in dict.fromkeys(kernel_list) if k not in self._memo]
        if not todo:
            return
        db = self.db
        left = []
        for k in todo:
            rec = None
            if db is not None:
                try:
                    rec = db.get(k.key(), self.db_target)
                except Exception:  # noqa: BLE001
                    rec = None
            if rec is not None:
                self._memo[k] = rec.cost
                self._measured_kernels.add(k)
                self.db_hits += 1
            else:
                left.append(k)
        if left:
            for k, c in zip(left, self.predict(left)):
                self._memo[k] = float(c)
            self.predicted += len(left)

    def _graph_cost(self, g) -> float:
        ks = kernels(g)
        self._price(ks)
        plain = sum(self._memo[k] for k in ks)
        if self.measurer is None:
            return plain
        counts = Counter(ks)
        key = _interface(g)
        region = self._regions.get(key)
        if region is None:
            self._regions[key] = _Region(counts, plain, plain)
            return plain
        cost = self._delta_cost(region, counts, plain)
        if cost < region.best * (1.0 + self.margin) and self._budget_left():
            changed = list(dict.fromkeys(list((counts - region.start).elements()) + list((region.start - counts).elements())))
            if self._measure(changed):
                cost = self._delta_cost(region, counts, sum(self._memo[k] for k in ks))
        region.best = min(region.best, cost)
        return cost

    def _delta_cost(self, region: _Region, counts: Counter, plain: float) -> float:
        """The start's cost plus what differs, each kernel at its current (best known) cost."""
        added, removed = counts - region.start, region.start - counts
        vals = [self._memo[k] for k in added.elements()] + [self._memo[k] for k in removed.elements()]
        if not math.isfinite(region.start_cost) or not all(math.isfinite(v) for v in vals):
            return plain
        cost = (region.start_cost + sum(self._memo[k] * n for k, n in added.items())
                - sum(self._memo[k] * n for k, n in removed.items()))
        return max(cost, 0.0)

    def _budget_left(self) -> bool:
        return self.budget is None or self._used < self.budget

    def _measure(self, kernel_list) -> bool:
        """Measure the kernels not measured yet, within the budget; True if any value changed."""
        changed = False
        for k in kernel_list:
            if k in self._measured_kernels:
                continue
            if not self._budget_left():
                break
            value = self._measure_one(k)
            if value is None:
                continue
            self._memo[k] = value
            self._measured_kernels.add(k)
            changed = True
        return changed

    def _measure_one(self, kernel: Kernel) -> float | None:
        m = self.measurer
        if isinstance(m, CostModel):
            before = (getattr(m, "measured", 0), getattr(m, "cached", 0))
            value = m.kernel_cost(kernel)
            after = (getattr(m, "measured", 0), getattr(m, "cached", 0))
            if after[0] > before[0]:
                self._used += 1
                self.measured += 1
                return float(value)
            if after[1] > before[1]:
                self.db_hits += 1
                return float(value)
            self._used += 1  # an attempt that fell back (e.g. the kernel cannot be built as a module)
            return None
        # a plain measurement function: measure_kernel-compatible, returns a Record
        self._used += 1
        try:
            rec = m(kernel, self.target)
        except Exception:  # noqa: BLE001 - an unreachable device is not the kernel's fault
            log.warning("measurement failed; keeping the prediction", exc_info=True)
            return None
        self.measured += 1
        if self.db is not None:
            try:
                self.db.add(rec)
            except Exception:  # noqa: BLE001
                log.warning("could not record a measurement", exc_info=True)
        return rec.cost

    def describe(self) -> dict:
        d = {
            "name": self.name,
            "target": self.target,
            "model": self.path,
            "trained_on": self.metrics.get("records_used"),
            "spearman": self.metrics.get("spearman"),
            "median_rel_error": self.metrics.get("median_rel_error"),
            "predicted": self.predicted,
            "db_hits": self.db_hits,
            "predict_seconds": round(self.predict_seconds, 3),
        }
        if self.measurer is not None:
            d.update({"measured": self.measured, "budget": self.budget, "measurer": self.measurer.name
                      if isinstance(self.measurer, CostModel) else type(self.measurer).__name__})
        return d

    # -- files --------------------------------------------------------------------------------
    def to_json(self) -> dict:
        import xgboost

        raw = self.model.save_raw("json")
        return {
            "format": FORMAT,
            "target": self.target,
            "features": FEATURE_NAMES,
            "metrics": self.metrics,
            "created": time.time(),
            "xgboost_version": xgboost.__version__,
            "model": json.loads(bytes(raw).decode()),
        }

    def save(self, path: str | os.PathLike | None = None) -> Path:
        """Write the model (atomically); default :func:`model_path` of its target."""
        path = Path(path) if path is not None else model_path(self.target)
        path.parent.mkdir(parents=True, exist_ok=True)
        tmp = path.with_name(path.name + f".tmp{os.getpid()}")
        tmp.write_text(json.dumps(self.to_json()))
        os.replace(tmp, path)
        self.path = str(path)
        return path

    @classmethod
    def load(cls, path: str | os.PathLike, **kw) -> "LearnedCost":
        """A model written by :meth:`save`; ValueError if it is not one, or if it was trained
        on other features than this version computes."""
        import xgboost

        data = json.loads(Path(path).read_text())
        if not isinstance(data, dict) or data.get("format") != FORMAT:
            raise ValueError(f"{path}: not a tvm-taso learned cost model")
        if data.get("features") != FEATURE_NAMES:
            raise ValueError(f"{path}: trained on other features than this version of tvm-taso computes; retrain it")
        model = xgboost.Booster(model_file=bytearray(json.dumps(data["model"]).encode()))
        kw.setdefault("metrics", data.get("metrics"))
        return cls(model, data["target"], path=path, **kw)

    @classmethod
    def load_for(cls, target=None, **kw) -> "LearnedCost | None":
        """The saved model for ``target`` (see :func:`model_path`), or None if there is none
        (or it is stale: other features, unreadable)."""
        path = model_path(target)
        if not path.exists():
            return None
        try:
            return cls.load(path, **kw)
        except (ValueError, OSError, KeyError) as err:
            log.warning("ignoring the learned cost model %s: %s", path, err)
            return None


# --------------------------------------------------------------------------------------------
# Which kernels to measure for training
# --------------------------------------------------------------------------------------------


class _Recorder(AnalyticCost):
    """The roofline, remembering every distinct kernel it is asked about (in order)."""

    name = "analytic"

    def __init__(self, target=None):
        super().__init__(target)
        self.seen: dict[Kernel, None] = {}

    def kernel_cost(self, kernel: Kernel) -> float:
        self.seen.setdefault(kernel, None)
        return super().kernel_cost(kernel)


def model_kernels(mod) -> list[Kernel]:
    """The distinct kernels of every dataflow block of ``mod`` as it is."""
    from .relax_bridge import BlockGraph
    from tvm import relax

    found: dict[Kernel, None] = {}
    for _, func in mod.functions.items():
        if not isinstance(func, relax.Function) or not isinstance(func.body, relax.SeqExpr):
            continue
        for block in func.body.blocks:
            if isinstance(block, relax.DataflowBlock):
                try:
                    g = BlockGraph(block, Counter()).graph
                except ops.OpError:
                    continue
                for k in kernels(g):
                    found.setdefault(k, None)
    return list(found)


def search_kernels(mod, target=None, **optimize_kw) -> list[Kernel]:
    """The distinct kernels a search over ``mod`` prices (the model's own and every candidate's,
    with the analytic model steering): the kernels a cost model for this model must rank."""
    import warnings

    from .optimize import TasoSkippedWarning, optimize

    rec = _Recorder(target)
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", TasoSkippedWarning)
        optimize(mod, target=target, cost_model=rec, **optimize_kw)
    return list(rec.seen)


# --------------------------------------------------------------------------------------------
# Training
# --------------------------------------------------------------------------------------------

DEFAULT_PARAMS = dict(
    max_depth=6,
    eta=0.08,
    subsample=0.9,
    colsample_bytree=0.9,
    min_child_weight=1.0,
    reg_lambda=1.0,
    objective="reg:squarederror",
    tree_method="hist",
)
DEFAULT_ROUNDS = 300


def _fit(x, y, seed: int, params: dict | None):
    """An :class:`xgboost.Booster` fitted to ``y`` (log µs) on features ``x``."""
    import xgboost

    p = dict(DEFAULT_PARAMS)
    p.update(params or {})
    rounds = int(p.pop("n_estimators", p.pop("num_boost_round", DEFAULT_ROUNDS)))
    p.setdefault("seed", seed)
    p.setdefault("nthread", 1)  # tiny data: threads only add OpenMP spinning (10x slower on a busy machine)
    p.setdefault("verbosity", 0)
    dtrain = xgboost.DMatrix(x, label=y, feature_names=[n.replace(":", "_") for n in FEATURE_NAMES])
    return xgboost.train(p, dtrain, num_boost_round=rounds)


def _predict_log(booster, x) -> np.ndarray:
    return np.asarray(booster.inplace_predict(x), dtype=np.float64).reshape(-1)


def _usable(records, target):
    """(kernels, µs) of the ok records for ``target`` (latest per key), and how many failed."""
    latest = {}
    for r in records:
        if target is not None and r.target != target:
            continue
        latest[r.key] = r
    ks, ys, failed = [], [], 0
    for r in latest.values():
        if not r.ok or not r.median_us or r.median_us <= 0 or not math.isfinite(r.median_us):
            failed += 1
            continue
        try:
            k = Kernel.from_json(r.kernel)
        except Exception:  # noqa: BLE001
            failed += 1
            continue
        ks.append(k)
        ys.append(float(r.median_us))
    return ks, np.asarray(ys, dtype=np.float64), failed


def _spearman(a, b) -> float | None:
    from scipy.stats import spearmanr

    if len(a) < 3 or np.ptp(a) == 0 or np.ptp(b) == 0:
        return None
    return float(spearmanr(a, b).statistic)


def _rel_error(pred, true) -> float | None:
    if len(true) == 0:
        return None
    return float(np.median(np.abs(pred - true) / true))


def evaluate(model: "LearnedCost", records, target=None) -> dict:
    """Spearman and median relative error of ``model`` on ``records`` (ok ones)."""
    ks, y, _ = _usable(records, target)
    pred = model.predict(ks)
    return {"records": len(ks), "spearman": _spearman(pred, y), "median_rel_error": _rel_error(pred, y)}


def train(
    records,
    target=None,
    *,
    test_fraction: float = 0.25,
    seed: int = 0,
    params: dict | None = None,
    refit: bool = True,
) -> tuple[LearnedCost, dict]:
    """Fit a :class:`LearnedCost` on measurement ``records`` (ok ones, for ``target``; default:
    the target most records are for) and report held-out metrics.

    A random ``test_fraction`` of the kernels is held out; the model fitted on the rest is
    scored there: ``spearman`` (rank correlation of predicted and measured times),
    ``median_rel_error`` (median of |pred - measured| / measured), and the same for the
    roofline :class:`~tvm_taso.cost.AnalyticCost` (``analytic_spearman``; its relative error
    after scaling it by the median measured/estimated ratio of the training kernels) for
    comparison. With ``refit`` (default) the returned model is then refitted on every record.
    ValueError with fewer than 4 usable records."""
    from .database import canonical_target

    records = list(records)
    if target is None:
        counts = Counter(r.target for r in records if r.ok)
        if not counts:
            raise ValueError("no successful measurements to train on")
        target = counts.most_common(1)[0][0]
    else:
        target = canonical_target(target)
    t0 = time.perf_counter()
    ks, y, failed = _usable(records, target)
    if len(ks) < 4:
        raise ValueError(f"need at least 4 successful measurements for {target}, have {len(ks)}")
    x = features_matrix(ks)
    logy = np.log(y)
    rng = np.random.default_rng(seed)
    order = rng.permutation(len(ks))
    n_test = int(round(len(ks) * test_fraction)) if test_fraction > 0 else 0
    n_test = min(max(n_test, 2 if test_fraction > 0 else 0), len(ks) - 2)
    test, tr = order[:n_test], order[n_test:]
    model = _fit(x[tr], logy[tr], seed, params)
    metrics = {
        "target": target,
        "records_used": len(ks),
        "records_failed_skipped": failed,
        "train": int(len(tr)),
        "test": int(len(test)),
        "seed": seed,
        "spearman": None,
        "median_rel_error": None,
        "train_spearman": _spearman(_predict_log(model, x[tr]), logy[tr]),
    }
    if len(test):
        pred = np.exp(_predict_log(model, x[test]))
        metrics["spearman"] = _spearman(pred, y[test])
        metrics["median_rel_error"] = _rel_error(pred, y[test])
        try:
            analytic = AnalyticCost(json.loads(target) if target.startswith("{") else target)
            est = np.array([analytic.kernel_cost(ks[i]) for i in range(len(ks))])
            scale = statistics.median(y[tr] / est[tr])
            metrics["analytic_spearman"] = _spearman(est[test], y[test])
            metrics["analytic_median_rel_error"] = _rel_error(est[test] * scale, y[test])
        except Exception:  # noqa: BLE001 - the comparison is informative only
            log.debug("analytic comparison failed", exc_info=True)
    if refit and len(test):
        model = _fit(x, logy, seed, params)
    metrics["refit_on_all"] = bool(refit and len(test))
    metrics["train_seconds"] = round(time.perf_counter() - t0, 3)
    return LearnedCost(model, target, metrics=metrics), metrics


# --------------------------------------------------------------------------------------------
# Command line: ``tvm-taso cost train``
# --------------------------------------------------------------------------------------------


def add_cost_train_command(subparsers) -> None:
    """Add ``cost train [--db PATH] [--target T] [-o MODEL]`` to a CLI: under an existing
    ``cost`` command (e.g. the one ``add_cost_show_command`` adds) or a new one."""
    from .measure import cost_subparsers

    tr = cost_subparsers(subparsers).add_parser(
        "train",
        help="train the learned cost model from the measurement database",
        description="Fit an XGBoost model of kernel latency (log µs) on the target's measured kernels, "
        "print held-out Spearman rank correlation and median relative error, and save it where "
        "cost_model='auto' finds it.",
    )
    tr.add_argument("--db", default=None, help="database file or folder (default $TVM_TASO_CACHE or ~/.cache/tvm-taso)")
    tr.add_argument("--target", default=None,
                    help="train for this target (llvm, cuda or a JSON target; default: the only / most measured one)")
    tr.add_argument("-o", "--output", default=None, help="model file (default <cache>/learned-<target>.json)")
    tr.add_argument("--test-fraction", type=float, default=0.25, help="held-out share (default 0.25)")
    tr.add_argument("--seed", type=int, default=0)
    tr.add_argument("--json", action="store_true", help="print the metrics as JSON")
    tr.set_defaults(func=cmd_cost_train)


def cmd_cost_train(args) -> int:
    import sys

    from .database import MeasurementDB, canonical_target, target_kind

    db = MeasurementDB(args.db)
    records = db.records()
    target = None
    if args.target:
        text = args.target
        target = canonical_target(text)
        if not any(r.target == target for r in records):
            # "llvm" names every llvm record when there is just one llvm target in the database
            same = sorted({r.target for r in records if target_kind(r.target) == target_kind(target)})
            if len(same) == 1 and not text.lstrip().startswith("{"):
                target = same[0]
    else:
        targets = Counter(r.target for r in records if r.ok)
        if len(targets) > 1:
            print(f"tvm-taso: {db.path} holds measurements for {len(targets)} targets; choose one with --target:",
                  file=sys.stderr)
            for t, n in targets.most_common():
                print(f"  {n:>6}  {t}", file=sys.stderr)
            return 2
    try:
        model, metrics = train(records, target, test_fraction=args.test_fraction, seed=args.seed)
    except ValueError as err:
        print(f"tvm-taso: cannot train: {err} ({db.path})", file=sys.stderr)
        return 2
    path = model.save(args.output)
    metrics = dict(metrics, model=str(path))
    if args.json:
        print(json.dumps(metrics, indent=2))
        return 0

    def fmt(v, pct=False):
        return "-" if v is None else (f"{100 * v:.1f} %" if pct else f"{v:.3f}")

    print(f"trained on {metrics['train']} kernels, held out {metrics['test']} "
          f"({metrics['records_failed_skipped']} failed measurements skipped) in {metrics['train_seconds']:.2f} s")
    print(f"  target                   {metrics['target']}")
    print(f"  held-out Spearman        {fmt(metrics['spearman'])}"
          f"   (analytic roofline {fmt(metrics.get('analytic_spearman'))})")
    print(f"  median relative error    {fmt(metrics['median_rel_error'], True)}"
          f"   (scaled roofline {fmt(metrics.get('analytic_median_rel_error'), True)})")
    print(f"  saved                    {path}")
    return 0


def main(argv=None) -> int:
    import argparse

    p = argparse.ArgumentParser(prog="python -m tvm_taso.learned")
    sub = p.add_subparsers(dest="command", required=True)
    add_cost_train_command(sub)
    args = p.parse_args(argv)
    return args.func(args)


if __name__ == "__main__":
    import sys

    sys.exit(main())
