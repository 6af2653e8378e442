"""Decisions per region: each rewritten region is timed against the original region during the
search, only the regions measured faster are spliced in, and the comparisons are stored."""

import json

import numpy as np
import pytest
import tvm
from tvm import relax

import tvm_taso
from tvm_taso import examples
from tvm_taso.cost.analytic import AnalyticCost
from tvm_taso.cost.database import MeasurementDB
from tvm_taso.cost.kernel_build import MeasureError, graph_module, random_inputs
from tvm_taso.guard import RegionGuard, is_faster
from tvm_taso.ir.relax_bridge import block_graphs
from tvm_taso.numerics import relative_error
from tvm_taso.rewrite.rule import default_rules
from tvm_taso.runtime import flatten
from tvm_taso.search import SearchOptions, SearchStats, search


def _graph(mod):
    (g,) = block_graphs(mod)
    return g


def test_a_region_as_a_module_computes_what_the_graph_computes():
    g = _graph(examples.inception_block(size=8, channels=8))
    mod, refs = graph_module(g)
    arrays = random_inputs([g.type_of(r) for r in refs], seed=1)
    # weights are parameters too: feed the module their values, and the graph the inputs' arrays
    arrays = [g.nodes[r[0]].payload[0] if g.nodes[r[0]].op == "const" else a for r, a in zip(refs, arrays)]
    expected = g.evaluate({r[0]: a for r, a in zip(refs, arrays) if g.nodes[r[0]].op == "input"})
    exe = tvm.compile(mod, target="llvm")
    vm = relax.VirtualMachine(exe, tvm.cpu())
    got = flatten(vm["main"](*[tvm.runtime.tensor(a) for a in arrays]))
    want = [expected[r] for r in g.outputs]
    assert len(got) == len(want)
    assert all(relative_error(w, x) < 1e-4 for w, x in zip(want, got))


def test_a_tuple_valued_read_cannot_be_timed():
    g = _graph(examples.parallel_matmuls(seq=4, hidden=8))
    g.outputs = [(g.outputs[0][0], -1)]
    with pytest.raises(MeasureError):
        graph_module(g)


class Judge:
    """A judge with a fixed answer that records what it was shown."""

    def __init__(self, kept):
        self.kept, self.calls = kept, []

    def __call__(self, before, after):
        self.calls.append((before.structural_hash(), after.structural_hash()))
        return {"kept": self.kept, "reason": "fixed", "from_database": False}


def test_the_judge_has_the_last_word_on_each_region():
    g0 = _graph(examples.parallel_matmuls(seq=8, hidden=16))
    cost = AnalyticCost("cuda")
    rules = default_rules()
    free = search(g0, rules, cost, SearchOptions(time_limit=30))
    assert cost.cost(free) < cost.cost(g0)  # the search rewrites this graph

    keep, stats = Judge(True), SearchStats()
    kept = search(g0, rules, cost, SearchOptions(time_limit=30), stats=stats, judge=keep)
    assert keep.calls and kept.structural_hash() == free.structural_hash()
    assert [d["kept"] for d in stats.decisions] == [True] * len(keep.calls)
    assert all(d["rules"] and d["cost_after"] < d["cost_before"] for d in stats.decisions)

    drop, stats = Judge(False), SearchStats()
    dropped = search(g0, rules, cost, SearchOptions(time_limit=30), stats=stats, judge=drop)
    assert drop.calls and dropped.structural_hash() == g0.structural_hash()
    assert not stats.applied and not stats.rewrites and len(stats.decisions) == len(drop.calls)
    assert sum(delta for _, delta in stats.curve) == pytest.approx(0.0, abs=1e-9)  # gains taken back


def test_region_guard_times_once_and_remembers(tmp_path):
    g0 = _graph(examples.resnet_bottleneck(size=7, channels=16))
    cost = AnalyticCost("llvm")
    db = tmp_path / "regions.jsonl"
    judge = RegionGuard("llvm", repeats=3, min_repeat_ms=5, db=db)
    stats = SearchStats()
    search(g0, default_rules(), cost, SearchOptions(time_limit=30), stats=stats, judge=judge)
    assert stats.decisions, "the search rewrote no region"
    first = stats.decisions[0]
    assert first["from_database"] is False and first["rounds"] == 3 and first["before_ms"] > 0
    assert first["kept"] == is_faster(first)
    spent = judge.seconds
    assert spent > 0

    again = RegionGuard("llvm", repeats=3, min_repeat_ms=5, db=db)
    stats2 = SearchStats()
    search(g0, default_rules(), cost, SearchOptions(time_limit=30), stats=stats2, judge=again)
    assert again.seconds == 0.0  # nothing measured the second time
    assert [d["from_database"] for d in stats2.decisions] == [True] * len(stats2.decisions)
    assert [d["ratio"] for d in stats2.decisions] == [d["ratio"] for d in stats.decisions]
    records = [json.loads(line) for line in db.read_text().splitlines()]
    assert len(records) == len({(r["key"], r["target"]) for r in records}) >= 1
    assert {"before", "after"} <= set(records[0]["kernel"]["regions"])


def test_a_region_that_does_not_build_is_dropped_and_remembered(tmp_path, monkeypatch):
    import tvm_taso.guard as guard_module

    def broken(g):
        raise MeasureError("cannot express this region")

    monkeypatch.setattr(guard_module, "graph_module", broken)
    g0 = _graph(examples.parallel_matmuls(seq=8, hidden=16))
    judge = RegionGuard("llvm", repeats=3, db=MeasurementDB(tmp_path / "r.jsonl"))
    stats = SearchStats()
    out = search(g0, default_rules(), AnalyticCost("cuda"), SearchOptions(time_limit=30), stats=stats, judge=judge)
    assert out.structural_hash() == g0.structural_hash()
    assert stats.decisions and not any(d["kept"] for d in stats.decisions)
    assert "could not be timed: MeasureError: cannot express this region" in stats.decisions[0]["reason"]
    # the failure is a record: the next run does not try again
    again = RegionGuard("llvm", repeats=3, db=MeasurementDB(tmp_path / "r.jsonl"))
    stats2 = SearchStats()
    search(g0, default_rules(), AnalyticCost("cuda"), SearchOptions(time_limit=30), stats=stats2, judge=again)
    assert all(d["from_database"] for d in stats2.decisions)


def test_optimize_reports_region_decisions_with_the_guard(tmp_path, monkeypatch):
    monkeypatch.setenv("TVM_TASO_CACHE", str(tmp_path))
    mod = examples.resnet_bottleneck(size=7, channels=16)
    new, report = tvm_taso.optimize(mod, target="llvm", cost_model="analytic", guard=True, guard_repeats=3)
    regions = report["region_guard"]
    assert regions["regions"] == len(regions["decisions"]) >= 1
    assert regions["kept"] + regions["dropped"] == regions["regions"]
    assert regions["database"] == str(tmp_path / "regions.jsonl")
    assert report["settings"]["region_guard"] is True
    json.dumps(report, allow_nan=False)
    if regions["kept"] == 0:  # every region dropped: nothing for the whole-model guard to judge
        assert new is mod and report["applied"] == {}

    _, off = tvm_taso.optimize(mod, target="llvm", cost_model="analytic", guard=True, guard_repeats=3,
                               region_guard=False)
    assert "region_guard" not in off and off["settings"]["region_guard"] is False
    _, default = tvm_taso.optimize(mod, target="llvm", cost_model="analytic")
    assert "region_guard" not in default  # a prediction-only search times nothing
    with pytest.raises(ValueError, match="region_guard"):
        tvm_taso.optimize(mod, target="llvm", region_guard="yes")


def test_no_device_means_no_region_timing(caplog):
    mod = examples.parallel_matmuls(seq=8, hidden=16)
    _, report = tvm_taso.optimize(mod, target="cuda", cost_model="analytic", region_guard=True)
    assert "region_guard" not in report
    assert any("no cuda device" in r.getMessage() for r in caplog.records)


def test_region_inputs_are_random_arrays_of_each_type():
    from tvm_taso.ir.ops import TensorType

    arrays = random_inputs([TensorType((2, 3), "float32"), TensorType((4,), "int64"), TensorType((1,), "bool")])
    assert [a.shape for a in arrays] == [(2, 3), (4,), (1,)]
    assert [a.dtype for a in arrays] == [np.float32, np.int64, np.bool_]
    assert arrays[1].min() >= 0 and arrays[1].max() < 4
