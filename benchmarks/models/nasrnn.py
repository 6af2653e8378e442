"""NasRNN as TASO's example ``examples/nasrnn.py`` builds it: the recurrent cell found by neural
architecture search, unrolled over ``steps`` (5) time steps of batch 1, ``hidden`` (512) wide.

Each step is TASO's ``nas_node``: eight ``combine``s ``t_i = x @ Wx_i + h @ Wh_i`` (MatMul, MatMul,
Add), then the tree
``m0 = relu(t0) + sigmoid(t3)``, ``m1 = sigmoid(t1) + tanh(t2)``, ``m2 = sigmoid(t4) * tanh(t5)``,
``m3 = sigmoid(t6) * relu(t7)``, ``m4 = sigmoid(m1) + tanh(m2)``, ``m5 = tanh(m0) * tanh(m3)``,
``m6 = tanh(m4) * tanh(m5)``, and the new state ``h = tanh(m6)``. The output is the last state,
(1, hidden), as in TASO (whose graph ends there).

Inputs as in TASO: one graph input per step, ``x0`` ... ``x{steps-1}``, each (1, hidden) -- no
Split/Squeeze to cut a stacked input, so the graph is exactly TASO's. The initial state is an
initializer (1, hidden), as TASO's ``new_weight``. Where it deviates: TASO's ``combine`` draws
new weights on every call, so its unrolled steps do not share weights; here, by default
(``share_weights=True``), all steps use the same 16 (hidden, hidden) matrices, as a real RNN
does; ``share_weights=False`` gives TASO's graph exactly. Weights are ``1 / sqrt(2 hidden)``-scaled
so that each ``t_i`` has O(1) variance. ~4.2 M weights shared (~21 M per-step).
"""

from __future__ import annotations

import numpy as np
import onnx
from onnx import TensorProto

from .onnx_graph import OnnxGraph


def nasrnn(hidden: int = 512, steps: int = 5, seed: int = 0, share_weights: bool = True) -> onnx.ModelProto:
    """NasRNN on inputs ``x0`` ... ``x{steps-1}`` of shape (1, hidden); the output is the final
    hidden state (1, hidden). ``share_weights=False``: fresh weights per step, as TASO's graph."""
    g = OnnxGraph(seed)
    scale = 1.0 / np.sqrt(2 * hidden)  # x @ Wx + h @ Wh: two sums of `hidden` terms

    def cell_weights(prefix):
        return [(g.weight(hidden, hidden, scale=scale, name=f"{prefix}.wx{i}"),
                 g.weight(hidden, hidden, scale=scale, name=f"{prefix}.wh{i}")) for i in range(8)]

    shared = cell_weights("cell") if share_weights else None
    h = g.init(0.5 * g.rng.standard_normal((1, hidden)), "h0")

    def nas_node(h, x, weights, name):
        def op(kind, *args, n):
            return g.op(kind, *args, name=f"{name}/{kind}_{n}")

        t = []
        for i, (wx, wh) in enumerate(weights):
            a = g.op("MatMul", x, wx, name=f"{name}.t{i}/MatMul_x")
            b = g.op("MatMul", h, wh, name=f"{name}.t{i}/MatMul_h")
            t.append(g.op("Add", a, b, name=f"{name}.t{i}/Add"))
        m0 = op("Add", op("Relu", t[0], n=0), op("Sigmoid", t[3], n=0), n=0)
        m1 = op("Add", op("Sigmoid", t[1], n=1), op("Tanh", t[2], n=0), n=1)
        m2 = op("Mul", op("Sigmoid", t[4], n=2), op("Tanh", t[5], n=1), n=0)
        m3 = op("Mul", op("Sigmoid", t[6], n=3), op("Relu", t[7], n=1), n=1)
        m4 = op("Add", op("Sigmoid", m1, n=4), op("Tanh", m2, n=2), n=2)
        m5 = op("Mul", op("Tanh", m0, n=3), op("Tanh", m3, n=4), n=2)
        m6 = op("Mul", op("Tanh", m4, n=5), op("Tanh", m5, n=6), n=3)
        return op("Tanh", m6, n=7)

    for s in range(steps):
        weights = shared if share_weights else cell_weights(f"step{s}")
        h = nas_node(h, f"x{s}", weights, f"step{s}")
    inputs = {f"x{s}": ((1, hidden), TensorProto.FLOAT) for s in range(steps)}
    return g.model(inputs, [h], "nasrnn")
