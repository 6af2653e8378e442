"""How the search cuts a graph into regions: at narrow points, alike in every copy of a repeated
layer (so that the copies are searched once), and a second pass straddling each boundary."""

from __future__ import annotations

import numpy as np

from tvm_taso.ir.graph import LEAVES, Graph
from tvm_taso.ir.ops import TensorType
from tvm_taso.search.backtrack import extract, regions

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
    shapes = [extract(g, w)[0].shape_hash() for w in windows]
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
