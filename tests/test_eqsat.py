"""Equality saturation (search="eqsat"): same outputs on the fuzz graphs, limits that stop it
cleanly, the Q/K/V merge, and the option plumbing."""

from __future__ import annotations

import warnings

import numpy as np
import pytest

pytest.importorskip("egglog")

import tvm_taso  # noqa: E402
from tvm_taso import examples  # noqa: E402
from tvm_taso.cost.analytic import AnalyticCost  # noqa: E402
from tvm_taso.ir.graph import Graph, fold_constants  # noqa: E402
from tvm_taso.ir.ops import TensorType  # noqa: E402
from tvm_taso.ir.relax_bridge import BlockGraph  # noqa: E402
from tvm_taso.numerics import relative_error  # noqa: E402
from tvm_taso.rewrite.rule import default_rules  # noqa: E402
from tvm_taso.search import eqsat  # noqa: E402
from tvm_taso.search.backtrack import SearchStats  # noqa: E402

from test_fuzz import evaluate_graph, random_module  # noqa: E402

RULES = default_rules()
COST = AnalyticCost("cuda")
SMALL = eqsat.EqsatLimits(node_limit=400, rounds=3, multi_rounds=2)
FUZZ_SEEDS = range(8)


def _feeds(g: Graph, seed: int = 0) -> dict:
    rng = np.random.default_rng(seed)
    return {nid: rng.standard_normal(n.types[0].shape).astype(n.types[0].dtype)
            for nid, n in g.nodes.items() if n.op == "input"}


def _outputs(g: Graph, feeds: dict) -> list:
    values = evaluate_graph(g, feeds)
    return [values[r] for r in g.outputs]


def qkv_relu() -> Graph:
    """Three Q/K/V-shaped projections of one input, each followed by relu."""
    rng = np.random.default_rng(0)
    g = Graph()
    x = g.add_leaf("input", TensorType((1, 16, 64), "float32"), None, key="x")
    outs = []
    for i in range(3):
        w = g.add_leaf("const", TensorType((64, 64), "float32"),
                       (rng.standard_normal((64, 64)).astype("float32"), None), key=("w", i))
        outs.append((g.add("relu", [(g.add("matmul", [(x, 0), (w, 0)], {}), 0)], {}), 0))
    g.outputs = outs
    return g


@pytest.mark.parametrize("seed", FUZZ_SEEDS)
def test_fuzz_graphs_keep_their_outputs(seed):
    try:
        mod = random_module(seed)
    except ValueError as err:  # the generator's own failure; tests/test_fuzz.py reports it
        pytest.skip(f"fuzz generator made no module for seed {seed}: {err}")
    g = BlockGraph(mod["main"].body.blocks[0], {}).graph
    stats = SearchStats()
    new = eqsat.search(g, RULES, COST, time_limit=20.0, stats=stats, kind="eqsat", limits=SMALL)
    fold_constants(new)
    assert COST.cost(new) <= COST.cost(g) + 1e-9
    assert stats.engines["eqsat"] >= 1
    feeds = _feeds(g, seed)
    assert relative_error(_outputs(g, feeds), _outputs(new, feeds)) <= 1e-4


def test_qkv_relu_matmuls_are_merged():
    g = qkv_relu()
    stats = SearchStats()
    new = eqsat.search(g, RULES, COST, time_limit=60.0, stats=stats, kind="eqsat")
    assert [n.op for n in new.nodes.values()].count("matmul") == 1
    assert COST.cost(new) < COST.cost(g)
    feeds = _feeds(g)
    assert relative_error(_outputs(g, feeds), _outputs(new, feeds)) <= 1e-5


@pytest.mark.parametrize(
    "limits, time_limit, reason",
    [
        (eqsat.EqsatLimits(node_limit=20), 60.0, "node limit"),
        (eqsat.EqsatLimits(rounds=1), 60.0, "round limit"),
        (eqsat.EqsatLimits(), 1e-4, "deadline"),
    ],
)
def test_limits_stop_cleanly(limits, time_limit, reason):
    g = qkv_relu()
    stats = SearchStats()
    region = eqsat.EqsatRegion(RULES, COST, limits)
    import time

    best, best_cost, _ = region(g, time.perf_counter() + time_limit, stats)
    assert stats.stopped[reason] == 1, stats.stopped
    assert best_cost <= COST.cost(g)
    feeds = _feeds(g)
    assert relative_error(_outputs(g, feeds), _outputs(best, feeds)) <= 1e-5


def test_optimize_reports_the_search():
    mod = examples.parallel_matmuls(seq=8, hidden=16)
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        _, report = tvm_taso.optimize(mod, target="cuda", cost_model="analytic", search="eqsat", time_limit=60)
    assert report["search"]["kind"] == "eqsat"
    assert report["search"]["regions"]["eqsat"] >= 1
    assert report["search"]["egraph_nodes"] > 0
    assert report["cost_after"] <= report["cost_before"]
    assert report["settings"]["search"] == "eqsat"
    assert set(report["regions_stopped"]) <= {"saturated", "node limit", "round limit", "deadline",
                                               "reused an identical region"}


def test_unknown_search_and_missing_egglog(monkeypatch):
    with pytest.raises(ValueError, match="search must be one of"):
        tvm_taso.optimize(examples.parallel_matmuls(seq=8, hidden=16), search="annealing")
    from tvm_taso.search import egraph

    monkeypatch.setattr(egraph, "_egglog", None)
    with pytest.raises(ImportError, match=r"tvm-taso\[eqsat\]"):
        eqsat.check_search("eqsat")
    eqsat.check_search("backtrack")  # needs nothing
