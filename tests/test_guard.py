"""The guard: a rewrite is kept only when it is measured faster end to end, and side-by-side
timing computes its ratios pair by pair."""

import itertools

import pytest

import tvm_taso
from tvm_taso import examples
from tvm_taso.cost.latency import compare_modules, side_by_side, speedup
from tvm_taso.guard import is_faster
from tvm_taso.runtime import inputs_for


def test_side_by_side_alternates_and_pairs_rounds():
    order = []
    clock = itertools.count(1)

    def sampler(name, ms):
        def sample():
            order.append((name, next(clock)))
            return ms
        return sample

    samples = side_by_side({"a": sampler("a", 10.0), "b": sampler("b", 5.0)}, repeats=4)
    assert samples == {"a": [10.0] * 4, "b": [5.0] * 4}
    timed = [name for name, _ in order[2:]]  # after one warm-up call each
    assert timed == ["a", "b", "b", "a", "a", "b", "b", "a"]  # the order flips every round


def test_speedup_is_a_median_of_pairwise_ratios():
    # a machine that slows down halfway: medians taken apart would blur a steady 2x
    before, after = [10, 10, 40, 40, 40], [5, 5, 20, 20, 20]
    s = speedup(before, after)
    assert s["ratio"] == s["ratio_low"] == s["ratio_high"] == 2.0 and s["rounds"] == 5
    assert is_faster(s)
    assert not is_faster(speedup([10, 10, 10, 10], [9, 9, 11, 11]))  # won only half the rounds


def test_a_guard_that_measures_no_gain_returns_the_original_module():
    mod = examples.parallel_matmuls(seq=8, hidden=16)
    calls = []

    def guard(before, after):
        calls.append((before, after))
        return {"kept": False, "reason": "not measurably faster"}

    new, report = tvm_taso.optimize(mod, target="cuda", cost_model="analytic", guard=guard)
    assert len(calls) == 1 and calls[0][0] is mod and calls[0][1] is not mod  # the search did rewrite
    assert new is mod
    assert report["applied"] == {} and report["guard"]["reverted"]
    assert report["cost_after"] == report["cost_before"] and report["speedup_estimate"] == 1.0


def test_guard_times_both_modules_on_this_cpu():
    mod = examples.conv_bn_relu(size=16, channels=16)  # the llvm cost model folds its batch norms
    # the whole-module guard alone (per-region timing might drop every region first: test_region_guard)
    new, report = tvm_taso.optimize(mod, target="llvm", cost_model="analytic", guard=True, guard_repeats=3,
                                    region_guard=False)
    verdict = report["guard"]
    assert verdict["measured"] and verdict["rounds"] == 3 and verdict["before_ms"] > 0
    assert verdict["kept"] == is_faster(verdict)
    assert (new is mod) != verdict["kept"]
    assert report["settings"]["guard"] is True


def test_compare_modules_on_identical_modules_is_close_to_one():
    mod = examples.conv_bn_relu(size=8, channels=8)
    result = compare_modules(mod, mod, "llvm", inputs_for(mod), repeats=3, min_repeat_ms=5)
    assert result["rounds"] == 3 and result["ratio"] == pytest.approx(1.0, rel=0.5)
    assert set(result["compile_seconds"]) == {"before", "after"}
