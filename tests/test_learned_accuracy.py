"""benchmarks/learned_accuracy.py, leave one model out, without measuring anything.

Two "models" are the kernels of two built-in examples at a few sizes (a ResNet bottleneck and
conv-BN-ReLU layers, which share some kernels: the same 3x3 conv and BN+ReLU shapes). Their
latencies are synthetic: a made-up function of the kernel that the roofline does not compute,
or a known multiple of the roofline where a test needs to know the right answer."""

from __future__ import annotations

import json

import numpy as np
import pytest

from benchmarks import learned_accuracy as la
from tvm_taso import examples
from tvm_taso.cost.analytic import AnalyticCost
from tvm_taso.cost.database import Record, measured_target
from tvm_taso.cost.training import model_kernels, score_split

LLVM = measured_target("llvm")
# two benchmark model names stand for the two examples when the whole CLI runs
MODEL_A, MODEL_B = "resnet50", "squeezenet1.1"


@pytest.fixture(scope="module")
def kernels_by_model():
    a = [k for s, c in ((8, 16), (12, 16), (16, 32)) for k in model_kernels(examples.resnet_bottleneck(size=s, channels=c))]
    b = [k for s, c in ((8, 4), (12, 4), (16, 8)) for k in model_kernels(examples.conv_bn_relu(size=s, channels=c))]
    return {MODEL_A: list(dict.fromkeys(a)), MODEL_B: list(dict.fromkeys(b))}


def _synthetic_us(kernel) -> float:
    """Not the roofline: a launch overhead, a cost per op and the square root of the output size."""
    return 2.0 + 5.0 * len(kernel.ops) + sum(t.size for t in kernel.outputs) ** 0.5


def _record(kernel, us=None, status="ok") -> Record:
    return Record(key=kernel.key(), target=LLVM, kernel=kernel.to_json(), status=status,
                  median_us=us if status == "ok" else None, samples_us=[us] if status == "ok" else [])


def _keys(kernel_list) -> set:
    return {k.key() for k in kernel_list}


def test_split_keeps_the_held_out_models_kernels_out_of_training(kernels_by_model):
    a, b = (_keys(kernels_by_model[m]) for m in (MODEL_A, MODEL_B))
    shared = a & b
    assert shared and a - b and b - a  # the examples do share kernels: the case to guard
    unmeasured = min(a - b)
    measured = (a | b) - {unmeasured}
    keys = {MODEL_A: a, MODEL_B: b}

    train, test, dropped = la.split_by_model(keys, measured, MODEL_A)
    assert set(test) == a - {unmeasured}  # every measured kernel of the held-out model, nothing else
    assert not set(train) & a  # no kernel of the held-out model, shared or not
    assert set(train) == b - a and dropped == len(shared)

    train, test, dropped = la.split_by_model(keys, measured, MODEL_B)
    assert set(test) == b and set(train) == a - b - {unmeasured} and dropped == len(shared)


def test_score_split_refuses_a_kernel_on_both_sides(kernels_by_model):
    recs = [_record(k, _synthetic_us(k)) for k in kernels_by_model[MODEL_A]]
    with pytest.raises(ValueError, match="both sides"):
        score_split(recs, recs[:3], LLVM)


def test_roofline_is_scaled_on_training_kernels_and_scored_on_the_held_out_model(kernels_by_model):
    """Model A's own kernels take 3x the roofline, every kernel of B (shared ones included) 2x.
    Holding out B, the scale fitted on A's kernels is 3, so every prediction of B's kernels is
    1.5x their time (relative error exactly 0.5) and the rank order is the roofline's (1.0).
    Holding out A, training sees only B's own kernels: scale 2."""
    analytic = AnalyticCost(LLVM)
    b_keys = _keys(kernels_by_model[MODEL_B])
    records = {}
    for ks in kernels_by_model.values():
        for k in ks:
            records[k.key()] = _record(k, (2.0 if k.key() in b_keys else 3.0) * analytic.kernel_cost(k))
    out = la.leave_one_model_out(kernels_by_model, records, LLVM)
    held_b, held_a = out["per_model"][MODEL_B], out["per_model"][MODEL_A]
    assert held_b["analytic_scale"] == pytest.approx(3.0)
    assert held_b["analytic_median_rel_error"] == pytest.approx(0.5, abs=1e-3)
    assert held_b["analytic_spearman"] == pytest.approx(1.0)
    assert held_a["analytic_scale"] == pytest.approx(2.0)
    assert set(held_b["test_keys"]) == b_keys and held_b["test"] == len(b_keys)
    assert out["pooled"]["test"] == held_a["test"] + held_b["test"]


def test_cli_reports_per_held_out_model_and_a_rerun_measures_nothing(kernels_by_model, tmp_path, monkeypatch):
    """The whole run with collection and measurement faked: one kernel of A fails to build, and
    its measured kernels are what A is tested on; the JSON carries every field; a second run
    finds everything in the database."""
    failing = next(k for k in kernels_by_model[MODEL_A] if k.key() not in _keys(kernels_by_model[MODEL_B]))
    calls = []

    def fake_collect(name, quick, target, budget, time_limit, seed):
        ks = kernels_by_model[name]
        return {"kernels": list(ks), "model_kernels": len(ks), "candidate_kernels": 0, "search_seconds": 0.0,
                "search_reached_time_limit": False}

    def fake_measure(kernel, target, **kw):
        calls.append(kernel.key())
        if kernel.key() == failing.key():
            return _record(kernel, status="build_error")
        return _record(kernel, _synthetic_us(kernel))

    monkeypatch.setattr(la, "collect", fake_collect)
    monkeypatch.setattr(la, "measure_kernel", fake_measure)
    out_json = tmp_path / "learned_accuracy.json"
    argv = ["--models", MODEL_A, MODEL_B, "--db", str(tmp_path / "db.jsonl"), "--json", str(out_json), "--max-kernels", "0"]
    assert la.main(argv) == 0
    distinct = _keys(kernels_by_model[MODEL_A]) | _keys(kernels_by_model[MODEL_B])
    assert sorted(calls) == sorted(distinct)  # each distinct kernel measured once, shared ones too

    r = json.loads(out_json.read_text())
    for field in ("target", "sizes", "settings", "per_model", "pooled", "mean_over_models",
                  "random_split_all_models", "cut_short", "distinct_kernels_measured_ok", "analytic_scale_fitted_on"):
        assert field in r
    assert r["distinct_kernels_measured_ok"] == len(distinct) - 1
    a, b = r["per_model"][MODEL_A], r["per_model"][MODEL_B]
    a_ok = _keys(kernels_by_model[MODEL_A]) - {failing.key()}
    assert set(a["test_keys"]) == a_ok and a["test"] == len(a_ok)
    assert a["failed"] == 1 and b["failed"] == 0
    shared = _keys(kernels_by_model[MODEL_A]) & _keys(kernels_by_model[MODEL_B])
    assert a["dropped_shared"] == b["dropped_shared"] == len(shared)
    assert a["train"] == len(_keys(kernels_by_model[MODEL_B]) - shared)
    for row in (a, b, r["pooled"]):
        for m in la.METRICS:
            assert row[m] is not None and np.isfinite(row[m])
        assert -1.0 <= row["spearman"] <= 1.0 and row["median_rel_error"] >= 0
    assert r["pooled"]["test"] == a["test"] + b["test"]
    assert r["mean_over_models"]["spearman"] == pytest.approx((a["spearman"] + b["spearman"]) / 2, abs=1e-3)
    assert r["cut_short"] == {}

    calls.clear()
    assert la.main(argv) == 0
    r2 = json.loads(out_json.read_text())
    assert calls == []
    assert all(row["measured"] == 0 and row["db_hits"] == len(kernels_by_model[m]) for m, row in r2["per_model"].items())
    assert r2["per_model"][MODEL_A]["spearman"] == a["spearman"]  # same data, same seed: same answer
