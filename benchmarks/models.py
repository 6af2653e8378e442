"""Benchmark-sized Relax models, built the way TVM's ONNX frontend would produce them: one
``main`` function with a single dataflow block, batch 1, float32 weights as ``relax.const``
constants drawn from a seeded numpy generator.

* :func:`bert_base` -- a BERT-base-shaped encoder stack (12 layers, hidden 768, 12 heads,
  FFN 3072, sequence 128 by default; ~85 M weights, ~340 MB as float32).
* :func:`resnet50` -- a ResNet-50-shaped classifier (224x224 input, bottleneck stages
  [3, 4, 6, 3], 1000 classes; ~25 M weights, ~100 MB as float32).

Both take smaller sizes so that tests can build them in milliseconds.
"""

from __future__ import annotations

import numpy as np
import tvm
from tvm import relax


class _Net:
    """A BlockBuilder with seeded random float32 constants."""

    def __init__(self, seed: int):
        self.rng = np.random.default_rng(seed)
        self.bb = relax.BlockBuilder()

    def emit(self, expr) -> relax.Var:
        return self.bb.emit(expr)

    def const(self, array: np.ndarray) -> relax.Constant:
        return relax.const(np.ascontiguousarray(array, dtype="float32"))

    def weight(self, *shape: int, fan_in: int | None = None, scale: float | None = None) -> relax.Constant:
        if scale is None:
            fan_in = fan_in if fan_in is not None else (int(np.prod(shape[1:])) if len(shape) > 1 else shape[0])
            scale = 1.0 / np.sqrt(max(fan_in, 1))
        w = self.rng.standard_normal(shape, dtype=np.float32)
        w *= np.float32(scale)
        return self.const(w)

    # --- ONNX-style building blocks -------------------------------------------------------

    def linear(self, x, n_in: int, n_out: int) -> relax.Var:
        """ONNX MatMul + Add: ``x @ W + b`` with W of shape (n_in, n_out)."""
        y = self.emit(relax.op.matmul(x, self.weight(n_in, n_out, fan_in=n_in)))
        return self.emit(relax.op.add(y, self.weight(n_out, scale=0.02)))

    def layer_norm(self, x, n: int) -> relax.Var:
        gamma = self.const(1 + 0.1 * self.rng.standard_normal(n))
        beta = self.const(0.1 * self.rng.standard_normal(n))
        return self.emit(relax.op.nn.layer_norm(x, gamma, beta, axes=[-1]))

    def conv(self, x, cin: int, cout: int, k: int, stride: int = 1) -> relax.Var:
        w = self.weight(cout, cin, k, k)
        return self.emit(relax.op.nn.conv2d(x, w, strides=stride, padding=k // 2))

    def batch_norm(self, x, c: int) -> relax.Var:
        gamma = self.const(1 + 0.1 * self.rng.standard_normal(c))
        beta = self.const(0.1 * self.rng.standard_normal(c))
        mean = self.const(0.1 * self.rng.standard_normal(c))
        var = self.const(0.5 + self.rng.random(c))
        bn = self.emit(relax.op.nn.batch_norm(x, gamma, beta, mean, var, axis=1, momentum=0.9, training=False))
        return self.emit(relax.TupleGetItem(bn, 0))

    def conv_bn(self, x, cin: int, cout: int, k: int, stride: int = 1, relu: bool = False) -> relax.Var:
        y = self.batch_norm(self.conv(x, cin, cout, k, stride), cout)
        return self.emit(relax.op.nn.relu(y)) if relu else y


def _module(net: _Net, params: list[relax.Var], body) -> tvm.IRModule:
    with net.bb.function("main", params):
        with net.bb.dataflow():
            out = net.bb.emit_output(body(*params))
        net.bb.emit_func_output(out)
    return net.bb.get()


def bert_base(
    layers: int = 12, seq: int = 128, hidden: int = 768, heads: int = 12, ffn: int = 3072, seed: int = 0
) -> tvm.IRModule:
    """A BERT-base-shaped encoder stack on an embedded input ``x`` of shape (1, seq, hidden)."""
    if hidden % heads:
        raise ValueError(f"hidden {hidden} is not a multiple of heads {heads}")
    hd = hidden // heads
    net = _Net(seed)
    x = relax.Var("x", relax.TensorType((1, seq, hidden), "float32"))

    def heads_of(t, perm):
        t = net.emit(relax.op.reshape(t, (1, seq, heads, hd)))
        return net.emit(relax.op.permute_dims(t, perm))

    def layer(h):
        q = heads_of(net.linear(h, hidden, hidden), [0, 2, 1, 3])  # (1, heads, seq, hd)
        k = heads_of(net.linear(h, hidden, hidden), [0, 2, 3, 1])  # (1, heads, hd, seq)
        v = heads_of(net.linear(h, hidden, hidden), [0, 2, 1, 3])  # (1, heads, seq, hd)
        s = net.emit(relax.op.matmul(q, k))  # (1, heads, seq, seq)
        s = net.emit(relax.op.multiply(s, net.const(np.array(1.0 / np.sqrt(hd)))))
        p = net.emit(relax.op.nn.softmax(s, axis=-1))
        c = net.emit(relax.op.matmul(p, v))  # (1, heads, seq, hd)
        c = net.emit(relax.op.permute_dims(c, [0, 2, 1, 3]))
        c = net.emit(relax.op.reshape(c, (1, seq, hidden)))
        a = net.linear(c, hidden, hidden)
        h = net.layer_norm(net.emit(relax.op.add(a, h)), hidden)
        f = net.emit(relax.op.nn.gelu(net.linear(h, hidden, ffn)))
        f = net.linear(f, ffn, hidden)
        return net.layer_norm(net.emit(relax.op.add(f, h)), hidden)

    def body(x):
        h = x
        for _ in range(layers):
            h = layer(h)
        return h

    return _module(net, [x], body)


def resnet50(image: int = 224, seed: int = 0, width: int = 64, classes: int = 1000) -> tvm.IRModule:
    """A ResNet-50 (v1.5: stride on the 3x3) on an input of shape (1, 3, image, image);
    ``width`` is the stem's channels (64 in ResNet-50; the last stage has 32 x width)."""
    net = _Net(seed)
    x = relax.Var("x", relax.TensorType((1, 3, image, image), "float32"))

    def bottleneck(h, cin, mid, stride, project):
        out = 4 * mid
        y = net.conv_bn(h, cin, mid, 1, relu=True)
        y = net.conv_bn(y, mid, mid, 3, stride=stride, relu=True)
        y = net.conv_bn(y, mid, out, 1)
        s = net.conv_bn(h, cin, out, 1, stride=stride) if project else h
        return net.emit(relax.op.nn.relu(net.emit(relax.op.add(y, s))))

    def body(x):
        h = net.conv_bn(x, 3, width, 7, stride=2, relu=True)
        h = net.emit(relax.op.nn.max_pool2d(h, (3, 3), strides=(2, 2), padding=(1, 1)))
        cin = width
        for stage, blocks in enumerate((3, 4, 6, 3)):
            mid = width * 2**stage
            for b in range(blocks):
                stride = 2 if (b == 0 and stage > 0) else 1
                h = bottleneck(h, cin, mid, stride, project=(b == 0))
                cin = 4 * mid
        h = net.emit(relax.op.mean(h, axis=[2, 3], keepdims=True))  # global average pool
        h = net.emit(relax.op.reshape(h, (1, cin)))  # flatten
        return net.linear(h, cin, classes)

    return _module(net, [x], body)


MODELS = {"bert": bert_base, "resnet50": resnet50}

QUICK_SIZES = {
    "bert": {"layers": 2, "seq": 16, "hidden": 64, "heads": 4, "ffn": 256},
    "resnet50": {"image": 32, "width": 8},
}
