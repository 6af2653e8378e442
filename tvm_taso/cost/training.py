"""Training the learned cost model: which kernels to measure, fitting, held-out scores.

* :func:`model_kernels` lists the kernels a model has (and
  :func:`tvm_taso.driver.kernels.search_kernels` those a search over it prices): what to
  measure for training.
* :func:`train` fits a :class:`~tvm_taso.cost.learned.LearnedCost` on
  :class:`~tvm_taso.cost.database.Record` s and reports, on a held-out split, the Spearman rank
  correlation (what the search needs: the *order* of candidates) and the median relative error
  (what the reported costs need); :func:`evaluate` scores a model on other records;
  :func:`score_split` fits on some records and scores on others, for splits chosen by the caller
  (e.g. by model: ``benchmarks/learned_accuracy.py``).
"""

from __future__ import annotations

import logging
import math
import statistics
import time
from collections import Counter

import numpy as np

from tvm_taso.cost.analytic import AnalyticCost
from tvm_taso.cost.database import measured_target
from tvm_taso.cost.learned import FEATURE_NAMES, LearnedCost, features_matrix
from tvm_taso.cost.model import Kernel, kernels
from tvm_taso.ir.relax_bridge import block_graphs

log = logging.getLogger("tvm_taso.cost.training")


def model_kernels(mod) -> list[Kernel]:
    """The distinct kernels of every dataflow block of ``mod`` as it is."""
    found: dict[Kernel, None] = {}
    for g in block_graphs(mod):
        for k in kernels(g):
            found.setdefault(k, None)
    return list(found)


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


def spearman(a, b) -> float | None:
    """Spearman rank correlation of ``a`` and ``b``; None when undefined (fewer than 3 values,
    or one side constant)."""
    from scipy.stats import spearmanr

    if len(a) < 3 or np.ptp(a) == 0 or np.ptp(b) == 0:
        return None
    return float(spearmanr(a, b).statistic)


def median_rel_error(pred, true) -> float | None:
    """Median of |pred - true| / true; None for no values."""
    if len(true) == 0:
        return None
    return float(np.median(np.abs(pred - true) / true))


def _held_out_scores(booster, ks, x, y, tr, test, target) -> tuple[dict, np.ndarray, np.ndarray | None]:
    """Scores on the kernels ``test`` (indices into ``ks`` / ``x`` / ``y``) of ``booster`` and of
    the roofline, the roofline scaled by the median measured/estimated ratio of the training
    kernels ``tr`` only; with the predicted and scaled roofline µs of the ``test`` kernels."""
    pred = np.exp(_predict_log(booster, x[test]))
    scores = {"spearman": spearman(pred, y[test]), "median_rel_error": median_rel_error(pred, y[test])}
    scaled = None
    try:
        analytic = AnalyticCost(target)
        est = np.array([analytic.kernel_cost(k) for k in ks])
        scale = statistics.median(y[tr] / est[tr])
        scaled = est[test] * scale
        scores["analytic_spearman"] = spearman(est[test], y[test])
        scores["analytic_median_rel_error"] = median_rel_error(scaled, y[test])
        scores["analytic_scale"] = float(scale)
    except Exception:  # noqa: BLE001 - the comparison is informative only
        log.debug("analytic comparison failed", exc_info=True)
    return scores, pred, scaled


def score_split(train_records, test_records, target, *, seed: int = 0, params: dict | None = None) -> dict:
    """Fit on ``train_records`` and score on ``test_records`` (ok ones for ``target``): the
    held-out metrics of :func:`train`, for a split the caller chose (by model, say). The two
    sides must share no kernel (ValueError otherwise, as with fewer than 4 training or 1 test
    kernel). Besides the metrics: ``keys``, ``measured_us``, ``predicted_us`` and ``analytic_us``
    (the roofline scaled on the training kernels; None if it failed), one per test kernel."""
    target = measured_target(target)
    tr_ks, tr_y, _ = _usable(train_records, target)
    te_ks, te_y, _ = _usable(test_records, target)
    shared = {k.key() for k in tr_ks} & {k.key() for k in te_ks}
    if shared:
        raise ValueError(f"{len(shared)} kernel(s) on both sides of the split")
    if len(tr_ks) < 4 or not te_ks:
        raise ValueError(f"need at least 4 training and 1 test kernel, have {len(tr_ks)} and {len(te_ks)}")
    ks, y = tr_ks + te_ks, np.concatenate([tr_y, te_y])
    x = features_matrix(ks)
    tr, test = np.arange(len(tr_ks)), np.arange(len(tr_ks), len(ks))
    booster = _fit(x[tr], np.log(y[tr]), seed, params)
    scores, pred, scaled = _held_out_scores(booster, ks, x, y, tr, test, target)
    return {
        "train": len(tr_ks), "test": len(te_ks), **scores,
        "keys": [k.key() for k in te_ks], "measured_us": te_y, "predicted_us": pred, "analytic_us": scaled,
    }


def evaluate(model: "LearnedCost", records, target=None) -> dict:
    """Spearman and median relative error of ``model`` on ``records`` (ok ones, for ``target``
    when given)."""
    ks, y, _ = _usable(records, None if target is None else measured_target(target))
    pred = model.predict(ks)
    return {"records": len(ks), "spearman": spearman(pred, y), "median_rel_error": median_rel_error(pred, y)}


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
    roofline :class:`~tvm_taso.cost.analytic.AnalyticCost` (``analytic_spearman``; its relative error
    after scaling it by the median measured/estimated ratio of the training kernels) for
    comparison. With ``refit`` (default) the returned model is then refitted on every record.
    ValueError with fewer than 4 usable records."""
    records = list(records)
    if target is None:
        counts = Counter(r.target for r in records if r.ok)
        if not counts:
            raise ValueError("no successful measurements to train on")
        target = counts.most_common(1)[0][0]
    else:
        target = measured_target(target)
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
        "train_spearman": spearman(_predict_log(model, x[tr]), logy[tr]),
    }
    if len(test):
        scores, _, _ = _held_out_scores(model, ks, x, y, tr, test, target)
        metrics.update(scores)
    if refit and len(test):
        model = _fit(x, logy, seed, params)
    metrics["refit_on_all"] = bool(refit and len(test))
    metrics["train_seconds"] = round(time.perf_counter() - t0, 3)
    return LearnedCost(model, target, metrics=metrics), metrics
