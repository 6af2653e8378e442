"""Small built-in Relax models (weights as constants, as the ONNX importer makes them), used by
the command line's ``example`` command, the tests and the tutorials. Running them is
:mod:`tvm_taso.runtime`'s job."""

from __future__ import annotations

import numpy as np
import tvm
from tvm import relax


class _Builder:
    """A Relax function under construction with seeded random weights."""

    def __init__(self, seed: int):
        self.rng = np.random.default_rng(seed)
        self.bb = relax.BlockBuilder()

    def weight(self, *shape, scale: float | None = None) -> relax.Expr:
        fan_in = int(np.prod(shape[1:])) if len(shape) > 1 else shape[0]
        s = scale if scale is not None else 1.0 / np.sqrt(max(fan_in, 1))
        return relax.const((self.rng.standard_normal(shape) * s).astype("float32"))

    def emit(self, expr):
        return self.bb.emit(expr)

    def conv(self, x, cin, cout, k, stride=1, *, pad=None, groups=1, bias=False):
        kh, kw = (k, k) if isinstance(k, int) else k
        pad = (kh // 2, kw // 2) if pad is None else pad
        y = self.emit(
            relax.op.nn.conv2d(
                x, self.weight(cout, cin // groups, kh, kw), strides=stride, padding=pad, groups=groups
            )
        )
        if bias:
            y = self.emit(relax.op.add(y, self.weight(1, cout, 1, 1, scale=0.1)))
        return y

    def batch_norm(self, x, c):
        gamma = relax.const((1 + 0.1 * self.rng.standard_normal(c)).astype("float32"))
        beta = relax.const((0.1 * self.rng.standard_normal(c)).astype("float32"))
        mean = relax.const((0.1 * self.rng.standard_normal(c)).astype("float32"))
        var = relax.const((0.5 + self.rng.random(c)).astype("float32"))
        bn = self.emit(relax.op.nn.batch_norm(x, gamma, beta, mean, var, axis=1, momentum=0.9, training=False))
        return self.emit(relax.TupleGetItem(bn, 0))

    def conv_bn_relu(self, x, cin, cout, k, stride=1):
        return self.emit(relax.op.nn.relu(self.batch_norm(self.conv(x, cin, cout, k, stride), cout)))

    def linear(self, x, n_in, n_out, bias=True):
        y = self.emit(relax.op.matmul(x, self.weight(n_in, n_out)))
        if bias:
            y = self.emit(relax.op.add(y, self.weight(n_out, scale=0.1)))
        return y


def _module(name_inputs: dict, body, seed: int = 0) -> tvm.IRModule:
    b = _Builder(seed)
    params = [relax.Var(n, relax.TensorType(shape, "float32")) for n, shape in name_inputs.items()]
    with b.bb.function("main", params):
        with b.bb.dataflow():
            out = body(b, *params)
            out = b.bb.emit_output(out)
        b.bb.emit_func_output(out)
    return b.bb.get()


def parallel_matmuls(seq: int = 16, hidden: int = 64, seed: int = 0) -> tvm.IRModule:
    """Attention's Q/K/V projections (with bias) of one input, combined as softmax(QK^T)V."""

    def body(b, x):
        q, k, v = (b.linear(x, hidden, hidden) for _ in range(3))
        s = b.emit(relax.op.matmul(q, b.emit(relax.op.permute_dims(k, [0, 2, 1]))))
        p = b.emit(relax.op.nn.softmax(s, axis=-1))
        return b.emit(relax.op.matmul(p, v))

    return _module({"x": (1, seq, hidden)}, body, seed)


def inception_block(size: int = 14, channels: int = 32, seed: int = 0) -> tvm.IRModule:
    """An Inception-style block: parallel 1x1, 3x3 and 5x5 convs (+ bias, relu) of one input,
    and a pooled branch, concatenated on channels."""

    def body(b, x):
        c = channels
        branches = []
        for k in (1, 3, 5):
            branches.append(b.emit(relax.op.nn.relu(b.conv(x, c, c, k, bias=True))))
        pool = b.emit(relax.op.nn.avg_pool2d(x, (3, 3), strides=(1, 1), padding=(1, 1), count_include_pad=True))
        branches.append(b.emit(relax.op.nn.relu(b.conv(pool, c, c, 1, bias=True))))
        return b.emit(relax.op.concat(branches, axis=1))

    return _module({"x": (1, channels, size, size)}, body, seed)


def conv_bn_relu(size: int = 16, channels: int = 16, seed: int = 0) -> tvm.IRModule:
    """Two conv -> batch_norm -> relu layers."""

    def body(b, x):
        y = b.conv_bn_relu(x, channels, channels, 3)
        return b.conv_bn_relu(y, channels, 2 * channels, 3)

    return _module({"x": (1, channels, size, size)}, body, seed)


def resnet_bottleneck(size: int = 14, channels: int = 64, seed: int = 0) -> tvm.IRModule:
    """A ResNet-50 bottleneck with a projection shortcut: 1x1 -> 3x3 -> 1x1 (each conv-BN, relu)
    plus a 1x1 conv-BN shortcut of the same input, added, relu."""

    def body(b, x):
        mid, out = channels // 4, channels * 2
        y = b.conv_bn_relu(x, channels, mid, 1)
        y = b.conv_bn_relu(y, mid, mid, 3)
        y = b.batch_norm(b.conv(y, mid, out, 1), out)
        s = b.batch_norm(b.conv(x, channels, out, 1), out)
        return b.emit(relax.op.nn.relu(b.emit(relax.op.add(y, s))))

    return _module({"x": (1, channels, size, size)}, body, seed)


def llama_decoder(seq="seq_len", layers: int = 2, hidden: int = 128, heads: int = 4, intermediate: int = 256,
                  seed: int = 0) -> tvm.IRModule:
    """A Llama-style decoder as TVM's own LLM stacks write one, with ``tvm.relax.frontend.nn``:
    per layer RMSNorm, separate Q, K and V projections (no bias), attention, output projection,
    RMSNorm and a SwiGLU MLP with separate gate and up projections. Its input is ``x: (1, seq,
    hidden)``, ``seq`` a symbolic length (a name) or a size; weights random, bound as constants."""
    from tvm.relax.frontend import nn

    class Attention(nn.Module):
        def __init__(self):
            self.q_proj, self.k_proj, self.v_proj, self.o_proj = (nn.Linear(hidden, hidden, bias=False)
                                                                  for _ in range(4))

        def forward(self, x):
            b, n, _ = x.shape
            q, k, v = (nn.reshape(p(x), (b, n, heads, hidden // heads)) for p in (self.q_proj, self.k_proj,
                                                                                  self.v_proj))
            return self.o_proj(nn.reshape(nn.scaled_dot_product_attention(q, k, v), (b, n, hidden)))

    class Layer(nn.Module):
        def __init__(self):
            self.input_norm = nn.RMSNorm(hidden, -1, 1e-5, bias=False)
            self.attn = Attention()
            self.post_norm = nn.RMSNorm(hidden, -1, 1e-5, bias=False)
            self.gate_proj, self.up_proj = (nn.Linear(hidden, intermediate, bias=False) for _ in range(2))
            self.down_proj = nn.Linear(intermediate, hidden, bias=False)

        def forward(self, x):
            x = x + self.attn(self.input_norm(x))
            h = self.post_norm(x)
            return x + self.down_proj(nn.silu(self.gate_proj(h)) * self.up_proj(h))

    class Decoder(nn.Module):
        def __init__(self):
            self.layers = nn.ModuleList([Layer() for _ in range(layers)])

        def forward(self, x):
            for layer in self.layers:
                x = layer(x)
            return x

    mod, params = Decoder().export_tvm(spec={"forward": {"x": nn.spec.Tensor([1, seq, hidden], "float32")}})
    rng = np.random.default_rng(seed)
    weights = {name: tvm.runtime.tensor((rng.standard_normal([int(d) for d in p.shape]) * 0.05).astype("float32"))
               for name, p in params}
    func = relax.transform.BindParams("forward", weights)(mod)["forward"]
    return tvm.IRModule({"main": func.with_attr("global_symbol", "main")})


EXAMPLES = {
    "qkv": parallel_matmuls,
    "inception": inception_block,
    "conv-bn-relu": conv_bn_relu,
    "bottleneck": resnet_bottleneck,
    "llama": llama_decoder,
}
