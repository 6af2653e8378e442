"""How the search cuts a graph into regions: at narrow points, alike in every copy of a repeated
layer (so that the copies are searched once), and a second pass straddling each boundary."""

from __future__ import annotations

import logging
from pathlib import Path

import numpy as np
import pytest

from tvm_taso.cost.analytic import AnalyticCost
from tvm_taso.io.onnx_bridge import OnnxGraph
from tvm_taso.io.onnx_model import load_onnx
from tvm_taso.ir.graph import LEAVES, Graph, weight_only
from tvm_taso.ir.ops import TensorType
from tvm_taso.rewrite.rule import default_rules
from tvm_taso.search import SearchOptions, SearchStats, Stop, search
from tvm_taso.search.regions import _splice_checked, extract, regions, splice

DATA = Path(__file__).parent / "data"

SIZE = 16


def _layers(count: int, width: int) -> Graph:
    """``count`` identical layers of ``width`` ops (a chain of matmul, add and an activation
    that changes along the layer), each op pair also reading one ``mask`` every layer shares,
    so that no point between them is narrow: a transformer's shape."""
    rng = np.random.default_rng(0)
    g = Graph()
    t = TensorType((4, 8), "float32")
    x = (g.add_leaf("input", t, None, key="x"), 0)
    mask = (g.add_leaf("input", t, None, key="mask"), 0)
    for layer in range(count):
        for k in range(width // 3):
            w = g.add_leaf("const", TensorType((8, 8), "float32"),
                           (rng.standard_normal((8, 8)).astype("float32"), None), key=(layer, k))
            x = (g.add("matmul", [x, (w, 0)], {}), 0)
            x = (g.add("add", [x, mask], {}), 0)
            x = (g.add(("relu", "sigmoid", "tanh", "gelu")[k % 4], [x], {}), 0)
    g.outputs = [x]
    return g


def _ops(g: Graph) -> list[int]:
    return [nid for nid in g.topo_order() if g.nodes[nid].op not in LEAVES]


def test_regions_cover_every_op_once_in_order():
    g = _layers(5, 21)
    for straddle in (False, True):
        windows = regions(g, SIZE, straddle)
        assert all(0 < len(w) <= SIZE for w in windows)
        flat = [nid for w in windows for nid in w]
        assert len(flat) == len(set(flat))
        order = {nid: k for k, nid in enumerate(_ops(g))}
        assert flat == sorted(flat, key=order.get)
    assert sorted(nid for w in regions(g, SIZE) for nid in w) == sorted(_ops(g))


def test_copies_of_a_layer_longer_than_a_region_are_cut_alike():
    """Layers of 21 ops with no narrow point between them, regions of 16: filling regions up
    would start each layer's regions at another op; cut alike, the layers after the first give
    the same few regions over and over."""
    g = _layers(8, 21)
    windows = regions(g, SIZE)
    shapes = [extract(g, w).sub.shape_hash() for w in windows]
    assert len(windows) >= 12
    assert len(set(shapes)) <= 4
    assert shapes[2:-1:2] == [shapes[2]] * len(shapes[2:-1:2])  # after the first layer: two regions per layer
    assert shapes[3:-1:2] == [shapes[3]] * len(shapes[3:-1:2])


def test_second_pass_straddles_every_boundary():
    g = _layers(4, 21)
    first = regions(g, SIZE)
    second = regions(g, SIZE, straddle=True)
    assert len(second) == len(first) - 1
    for a, b, window in zip(first, first[1:], second):
        assert window[0] in a and window[-1] in b  # one window across each boundary


def _downstream_reads(g: Graph, ids: list[int]) -> list[int]:
    """Ops of ``ids`` that read, through nodes outside ``ids``, a value made inside: a region
    that is not convex (splicing a rewrite of it can close a cycle)."""
    inside, users = set(ids), g.users()
    down, stack = set(), [u for m in ids for u in users[m] if u not in inside]
    while stack:
        u = stack.pop()
        if u not in down:
            down.add(u)
            stack += [v for v in users[u] if v not in inside]
    return [m for m in ids if any(src in down for src, _ in g.nodes[m].inputs)]


@pytest.mark.parametrize("model", ["googlenet_reduced", "shufflenet_v2_reduced"])
def test_regions_are_convex_around_opaque_nodes(model):
    """Reduced torchvision exports (tests/data/make_reduced_exports.py) whose opaque nodes (a
    ceil-mode max-pool, a channel split computed from Shape) sit between ops of one stretch:
    regions used to straddle them, and a merge across one made GoogLeNet and ShuffleNet V2 fail
    with CycleError. Every region is convex now, in both passes, at every size."""
    g = OnnxGraph(load_onnx(DATA / f"{model}.onnx")).graph
    assert any(n.op == "opaque" for n in g.nodes.values())
    for size in (8, 16, 32, 64):
        for straddle in (False, True):
            windows = regions(g, size, straddle)
            assert windows or straddle
            assert [w for w in windows if _downstream_reads(g, w)] == []


def test_a_region_whose_rewrite_closes_a_cycle_is_dropped_with_a_warning(caplog):
    """x -> a = relu(x) -> opaque(a) -> b = relu(opaque): a rewrite of the (non-convex) region
    {a, b} that computes both in one op reads the opaque node's value to make its input. Splicing
    it would close a cycle: the region is left as it was, one warning names it and its rules."""
    g = Graph()
    t = TensorType((4, 8), "float32")
    x = (g.add_leaf("input", t, None, key="x"), 0)
    a = g.add("relu", [x], {})
    o = g.add_opaque(((a, 0),), (t,), "opaque")
    b = g.add("relu", [(o, 0)], {})
    g.outputs = [(b, 0)]
    region = extract(g, [a, b])
    best = region.sub.copy()
    x_in, o_in = sorted(region.leaf_of)
    both = best.add("relu", [(best.add("concat", [(x_in, 0), (o_in, 0)], {"axis": 0}), 0)], {})
    halves = best.add("split", [(both, 0)], {"indices": (4,), "axis": 0})
    best.outputs = [(halves, 0), (halves, 1)]
    best.prune()
    stats = SearchStats()
    with caplog.at_level(logging.WARNING, logger="tvm_taso.search.regions"):
        assert _splice_checked(g, region, best, stats, ("merge-relus", "merge-relus")) is None
    assert stats.dropped == [{"region": 0, "rules": ["merge-relus"], "reason": "the graph has a cycle"}]
    assert "merge-relus" in caplog.text and "left as it was" in caplog.text
    g.topo_order()  # the graph itself is untouched


def test_a_region_whose_rewrite_changes_a_type_is_dropped():
    g = Graph()
    x = (g.add_leaf("input", TensorType((4, 8), "float32"), None, key="x"), 0)
    a = g.add("relu", [x], {})
    g.outputs = [(g.add("sigmoid", [(a, 0)], {}), 0)]
    region = extract(g, [a])
    best = region.sub.copy()
    (x_in,) = region.leaf_of
    best.outputs = [(best.add("permute_dims", [(x_in, 0)], {"axes": (1, 0)}), 0)]
    best.prune()
    stats = SearchStats()
    assert _splice_checked(g, region, best, stats, ("bad-rule",)) is None
    assert stats.dropped[0]["rules"] == ["bad-rule"] and "type" in stats.dropped[0]["reason"]


def _refuse_splits(write):
    """``write``, failing on any graph that holds a split (as a writer with a bug would)."""
    def refusing(self, g):
        if any(n.op == "split" for n in g.nodes.values()):
            raise KeyError("no name for a split")
        return write(self, g)
    return refusing


def test_a_relax_region_that_cannot_be_written_back_is_dropped(monkeypatch, caplog):
    """When the search's result cannot be written back as a Relax block, the block is searched
    again with each region's result written as it is found: the regions whose result fails are
    left as they were (named, with their rules, in a warning and the report), the rest is kept,
    and the pass does not fail."""
    import tvm_taso
    from tvm_taso import examples
    from tvm_taso.ir.relax_bridge import BlockGraph

    monkeypatch.setattr(BlockGraph, "to_block", _refuse_splits(BlockGraph.to_block))
    mod = examples.EXAMPLES["qkv"]()
    with caplog.at_level(logging.WARNING):
        new, report = tvm_taso.optimize(mod, target="cuda", cost_model="analytic")
    assert report["regions_dropped"] and all("cannot be written back" in d["reason"] for d in report["regions_dropped"])
    assert "merge-matmul-bias-shared-lhs" in report["regions_dropped"][0]["rules"]
    assert "searching again" in caplog.text
    assert "split" not in new.script()


def test_an_onnx_region_that_cannot_be_written_back_is_dropped(monkeypatch):
    import onnx

    import tvm_taso
    from tvm_taso.io.onnx_bridge import OnnxGraph

    monkeypatch.setattr(OnnxGraph, "written", _refuse_splits(OnnxGraph.written))
    model = tvm_taso.load_onnx(DATA / "googlenet_reduced.onnx")
    new, report = tvm_taso.optimize(model, target="cuda", cost_model="analytic")
    assert report["regions_dropped"]
    assert not any(n.op_type == "Split" for n in new.proto.graph.node)
    onnx.checker.check_model(new.proto)


def test_an_internal_failure_on_the_onnx_path_keeps_the_model_with_a_warning(monkeypatch):
    """The ONNX path gets the pass's promise: whatever fails inside the search, the model is
    given back as it was, with a warning naming the error; never an exception."""
    import warnings

    import tvm_taso
    from tvm_taso.driver import TasoSkippedWarning
    from tvm_taso.search import backtrack

    def broken(*args, **kwargs):
        raise RuntimeError("a bug in a region search")

    monkeypatch.setattr(backtrack, "search_region", broken)
    model = tvm_taso.load_onnx(DATA / "googlenet_reduced.onnx")
    with warnings.catch_warnings(record=True) as said:
        warnings.simplefilter("always")
        new, report = tvm_taso.optimize(model, target="cuda", cost_model="analytic")
    assert new.proto is model.proto and report["applied"] == {}
    assert any(issubclass(w.category, TasoSkippedWarning) and "a bug in a region search" in str(w.message)
               for w in said)


def test_a_region_reads_a_weight_expression_made_elsewhere_as_a_weight():
    """PyTorch's frontend transposes every Linear's weight, and topological order may put the
    transpose in an earlier region: the region reading it gets the expression with it (folded,
    free to combine), and splicing the region back as it was leaves the outer graph as it was."""
    rng = np.random.default_rng(0)
    g = Graph()
    x = (g.add_leaf("input", TensorType((4, 8), "float32"), None, key="x"), 0)
    w = g.add_leaf("const", TensorType((8, 8), "float32"), (rng.standard_normal((8, 8)).astype("float32"), None), key="w")
    wt = g.add("permute_dims", [(w, 0)], {"axes": (1, 0)})
    y = g.add("matmul", [x, (wt, 0)], {})
    g.outputs = [(y, 0)]
    region = extract(g, [y])
    ops = sorted(n.op for n in region.sub.nodes.values())
    assert ops == ["const", "input", "matmul", "permute_dims"]
    assert weight_only(region.sub) == {nid for nid, n in region.sub.nodes.items() if n.op in ("const", "permute_dims")}
    back = splice(g, region, region.sub)
    assert set(back.nodes) == set(g.nodes) and back.outputs == g.outputs


def _parallel_matmuls(count: int, rows: int, width: int, activation: str | None) -> Graph:
    """``count`` matmuls of one input ``x`` by their own weights, then ``activation`` of each (so
    that the matmuls come first in topological order)."""
    rng = np.random.default_rng(1)
    g = Graph()
    x = (g.add_leaf("input", TensorType((rows, width), "float32"), None, key="x"), 0)
    products = []
    for k in range(count):
        w = g.add_leaf("const", TensorType((width, width), "float32"),
                       (rng.standard_normal((width, width)).astype("float32"), None), key=k)
        products.append((g.add("matmul", [x, (w, 0)], {}), 0))
    g.outputs = [(g.add(activation, [y], {}), 0) for y in products] if activation else products
    return g


def _same_outputs(g: Graph, new: Graph) -> None:
    x = next(nid for nid, n in g.nodes.items() if n.op == "input")
    feed = np.random.default_rng(2).standard_normal(g.nodes[x].types[0].shape).astype("float32")
    want, got = g.evaluate({x: feed}), new.evaluate({x: feed})
    for a, b in zip(g.outputs, new.outputs):
        np.testing.assert_allclose(got[b], want[a], rtol=1e-4, atol=1e-3)


def test_a_rewrite_cheaper_in_its_region_but_costlier_in_the_graph_is_left_out():
    """Two matmuls of one input, each into a relu, cut into regions of two ops: merging the relus
    in the second region is cheaper there, but each relu had fused into its matmul's kernel in
    the first, so the graph would gain a kernel (8.37 -> 12.37 us before this check)."""
    g = _parallel_matmuls(2, 1, 64, "relu")
    cost, stats = AnalyticCost("cuda"), SearchStats()
    new = search(g, default_rules(), cost, SearchOptions(region_size=2, workers=1), stats=stats)
    assert stats.costlier_in_graph >= 1
    assert cost.cost(new) <= cost.cost(g)
    assert not stats.applied and not stats.rewrites
    _same_outputs(g, new)


def test_a_graph_is_swept_again_while_a_sweep_lowers_its_cost():
    """Six matmuls of one input in regions of two ops: the first sweep merges pairs, the next
    merges the merged ones, which its regions of the smaller graph now hold together."""
    g = _parallel_matmuls(6, 16, 256, None)
    cost, rules = AnalyticCost("cuda"), default_rules()
    found = []
    for sweeps in (1, 2, 3):
        stats = SearchStats()
        new = search(g, rules, cost, SearchOptions(region_size=2, sweeps=sweeps, workers=1), stats=stats)
        assert stats.sweeps == sweeps
        found.append((cost.cost(new), sum(n.op == "matmul" for n in new.nodes.values())))
        _same_outputs(g, new)
    (one, m1), (two, m2), (three, m3) = found
    assert three < two < one < cost.cost(g)
    assert m3 < m2 < m1 < 6
    # a sweep that lowers nothing ends the search: all six in one region need one sweep and a check
    stats = SearchStats()
    search(g, rules, cost, SearchOptions(region_size=16, sweeps=5, workers=1), stats=stats)
    assert stats.sweeps == 2
    # a model's report gives the most sweeps any of its blocks ran, not their sum
    total = SearchStats()
    total.absorb(stats, kept=True)
    total.absorb(SearchStats(sweeps=1), kept=True)
    assert total.sweeps == 2


def test_eqsat_statistics_are_absorbed_per_engine():
    """A worker's eqsat statistics join the run's: the largest e-graph, summed counts, and the
    per-round records added round by round (a region of two rounds and one of three)."""
    from tvm_taso.search.eqsat.runner import Iteration, RunReport

    a, b = SearchStats(), SearchStats()
    a.eqsat.add_run(RunReport(Stop.SATURATED, [Iteration(10, 8, 5, 2, 0.5), Iteration(14, 9, 3, 0, 0.25)]))
    b.eqsat.add_run(RunReport(Stop.ROUND_LIMIT, [Iteration(30, 20, 7, 4, 1.0), Iteration(40, 25, 2, 1, 0.5),
                                                 Iteration(50, 30, 1, 1, 0.5)]))
    total = SearchStats()
    total.absorb(a, kept=True)
    total.absorb(b, kept=False)  # statistics are work, counted whether or not the result was kept
    e = total.eqsat
    assert (e.egraph_nodes, e.egraph_classes, e.rounds, e.matches, e.applied) == (50, 30, 5, 18, 8)
    assert e.saturation_seconds == 2.75
    assert [r["regions"] for r in e.per_round] == [2, 2, 1]
    assert [r["matches"] for r in e.per_round] == [12, 5, 1]
    assert a.eqsat.per_round[0]["regions"] == 1  # absorbing copies, it does not share the records
