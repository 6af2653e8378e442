"""Learned cost: an XGBoost model of kernel latency, trained on the measurement database.

Measuring every kernel a search meets costs a build and a run each (seconds on a CPU, more on a
remote board). :class:`LearnedCost` predicts a kernel's time from :func:`kernel_features`
instead, with gradient-boosted trees (an :class:`xgboost.Booster`, trained with
``xgboost.train``: the scikit-learn wrapper ``XGBRegressor`` would need scikit-learn, which
tvm-taso does not otherwise use) fitted on the target's recorded measurements to predict
``log(latency in µs)`` -- the same recipe as TVM's own XGBoost cost model (gradient boosted
trees over hand-made features, trained on the log scale so that a 2x error on a 5 µs kernel
weighs as much as one on a 5 ms kernel). :mod:`.training` fits and scores models.

* :meth:`LearnedCost.save` / :meth:`LearnedCost.load_for` keep one model per target in
  ``<cache>/learned-<kind>-<digest>.json`` (:func:`tvm_taso.files.cache_dir`);
  ``cost_model="auto"`` uses it when it exists, ``cost_model="learned"`` requires it.
* A kernel already measured on the target (in the measurement database) costs its measured
  time, never a prediction; with a measurer and a budget, the new kernels of candidates that
  may win are measured (see :class:`LearnedCost`).
"""

from __future__ import annotations

import hashlib
import json
import logging
import math
import os
import time
from pathlib import Path

import numpy as np

from tvm_taso import target as targets
from tvm_taso.cost.database import MeasurementDB, default_path, measured_target
from tvm_taso.cost.model import CostModel, Kernel, kernels
from tvm_taso.files import cache_dir, write_text_atomically
from tvm_taso.ir import ops

log = logging.getLogger("tvm_taso.cost.learned")

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
    """One :func:`kernel_features` row per kernel."""
    return np.stack([kernel_features(k) for k in kernel_list]) if kernel_list else np.zeros((0, len(FEATURE_NAMES)), np.float32)


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


def model_path(target=None) -> Path:
    """``<cache>/learned-<kind>-<digest>.json``: one model per canonical target string."""
    t = targets.canonical(target)
    kind = "".join(c for c in targets.kind(t) if c.isalnum() or c in "-_") or "target"
    digest = hashlib.sha256(measured_target(t).encode()).hexdigest()[:10]  # trained on what is measured there
    return cache_dir() / f"learned-{kind}-{digest}.json"


class LearnedCost(CostModel):
    """Kernel cost predicted by a gradient-boosted tree model of ``log(µs)``.

    ``model`` is a fitted :class:`xgboost.Booster` (from :func:`~tvm_taso.cost.training.train`
    or :meth:`load`; a fitted ``XGBRegressor`` is accepted too); ``target`` the target it was
    trained for. A kernel measured on the target (``db``: a
    :class:`~tvm_taso.cost.database.MeasurementDB`, a path, or None for the default file when it
    exists) costs its measured time; the others cost the model's prediction.

    **Measuring the few that matter** (``measure=`` a :class:`~tvm_taso.cost.measure.MeasuredCost`
    instance or class; ``budget=N``): a rewrite changes only a few kernels, and the search keeps
    a candidate only if it beats the best graph of its region. So when a graph brings kernels
    never priced before and its predicted cost is within ``margin`` (5 %) of the cheapest graph
    seen with the same interface (input leaves and output types, which rewrites preserve), its
    new kernels are measured (at most ``N`` per search, :meth:`reset_budget`); otherwise they
    are predicted. Either way a kernel is priced once and its price never changes: a graph
    costs the sum of its kernels' prices, whatever order the search visits graphs in (what was
    seen only decides which kernels are worth a measurement).
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
        self.target = targets.canonical(target)
        self.metrics = dict(metrics or {})
        self.path = str(path) if path else None
        self.budget, self.margin = budget, margin
        if isinstance(measure, type):
            measure = measure(target) if target is not None else measure()
        self.measurer = measure
        if measure is not None and db is None:
            db = measure.db
        self._db = db if isinstance(db, MeasurementDB) or db is None else MeasurementDB(db)
        self._db_default = db is None and measure is None
        self.db_target = measure.db_target if measure is not None else measured_target(self.target)
        self.predicted = self.db_hits = self.measured = 0
        self.predict_seconds = 0.0
        self._used = 0
        self._best: dict[tuple, float] = {}  # interface -> cheapest graph cost seen this search

    @property
    def db(self):
        """The measurement database (the default one only if its file exists)."""
        if self._db is None and self._db_default:
            self._db_default = False
            if default_path().exists():
                self._db = MeasurementDB()
        return self._db

    def reset_budget(self) -> None:
        """A new search: the measurement budget and the best costs seen start afresh."""
        self._used = 0
        self._best.clear()
        if self.measurer is not None:
            self.measurer.reset_budget()

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
        if kernel not in self._memo:
            self._price([kernel])
        return self._memo[kernel]

    def _graph_cost(self, g) -> float:
        ks = kernels(g)
        interface = _interface(g)
        best = self._best.get(interface)
        self._price(ks, lambda tentative: best is not None and tentative < best * (1.0 + self.margin))
        cost = sum(self._memo[k] for k in ks)
        self._best[interface] = cost if best is None else min(best, cost)
        return cost

    def _price(self, kernel_list, worth_measuring=None) -> None:
        """Fix a price for every kernel not priced yet: its measured time if the database has
        it; else, if ``worth_measuring(tentative graph cost)`` says so and the budget allows, a
        new measurement; else the prediction (all of one graph in one call to the model)."""
        new = [k for k in dict.fromkeys(kernel_list) if k not in self._memo]
        for k in new:
            value = self._recorded(k)
            if value is not None:
                self._memo[k] = value
        left = [k for k in new if k not in self._memo]
        if not left:
            return
        predicted = dict(zip(left, (float(c) for c in self.predict(left))))
        if self.measurer is not None and worth_measuring is not None:
            tentative = sum(self._memo.get(k, predicted.get(k, 0.0)) for k in kernel_list)
            if worth_measuring(tentative):
                for k in left:
                    value = self._measure(k)
                    if value is not None:
                        self._memo[k] = value
        for k in left:
            if k not in self._memo:
                self._memo[k] = predicted[k]
                self.predicted += 1

    def _recorded(self, kernel: Kernel) -> float | None:
        db = self.db
        if db is None:
            return None
        try:
            rec = db.get(kernel.key(), self.db_target)
        except Exception:  # noqa: BLE001 - an unreadable database only costs the shortcut
            return None
        if rec is None:
            return None
        self.db_hits += 1
        return rec.cost

    def _measure(self, kernel: Kernel) -> float | None:
        """The measured time of a new kernel, or None (no measurer, budget spent, or the
        measurer fell back to an estimate: then the prediction is the better guess)."""
        if self.measurer is None or (self.budget is not None and self._used >= self.budget):
            return None
        m = self.measurer
        measured, fallbacks = m.measured, m.fallbacks
        value = m.kernel_cost(kernel)
        if m.measured > measured:
            self._used += 1
            self.measured += 1
            return float(value)
        if m.fallbacks == fallbacks:  # another process recorded it meanwhile
            self.db_hits += 1
            return float(value)
        self._used += 1  # an attempt that fell back (e.g. the kernel cannot be built as a module)
        return None

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
            d.update({"measured": self.measured, "budget": self.budget, "measurer": self.measurer.name})
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
        """Write the model atomically; default :func:`model_path` of its target."""
        path = Path(path) if path is not None else model_path(self.target)
        path.parent.mkdir(parents=True, exist_ok=True)
        write_text_atomically(path, json.dumps(self.to_json()))
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
