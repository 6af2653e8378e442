"""Benchmark-sized ONNX models, written node by node with ``onnx.helper`` the way PyTorch's
exporter writes them (opset 17, batch 1, float32 weights drawn from a seeded numpy generator, no
downloads): the ONNX counterparts of :mod:`benchmarks.models`, for the import → optimize →
export round trip (``python -m benchmarks.roundtrip``) and ``tvm-taso optimize``.

* :func:`bert_base_onnx` -- BERT-base (12 layers, hidden 768, 12 heads, FFN 3072, sequence
  128): token/position/type embeddings (Gather) and their LayerNormalization, then per layer
  Q/K/V MatMul+Add, Reshape/Transpose to heads, MatMul QKᵀ, Div by √head_dim, Softmax, MatMul V,
  Transpose/Reshape back, output projection, residual Add, LayerNormalization, FFN with GELU
  written as ``x * 0.5 * (1 + erf(x / √2))``, residual Add, LayerNormalization. ~109 M weights,
  ~440 MB as float32 (~340 MB without the embeddings).
* :func:`resnet50_onnx` -- ResNet-50 v1.5 (Conv / BatchNormalization / Relu, MaxPool,
  bottleneck stages [3, 4, 6, 3], GlobalAveragePool, Flatten, Gemm); ~25.6 M weights.

Both take small sizes (and ResNet a ``width`` factor) so that tests build tiny versions in
milliseconds. Every model is shape-inferred and passes ``onnx.checker.check_model(full_check=True)``.
"""

from __future__ import annotations

import numpy as np
import onnx
from onnx import TensorProto, helper, numpy_helper

OPSET = 17  # LayerNormalization


class OnnxGraph:
    """Nodes and initializers under construction, with seeded random float32 weights."""

    def __init__(self, seed: int):
        self.rng = np.random.default_rng(seed)
        self.nodes: list[onnx.NodeProto] = []
        self.inits: list[onnx.TensorProto] = []
        self._names: dict[str, int] = {}

    def _fresh(self, base: str) -> str:
        k = self._names.get(base, 0)
        self._names[base] = k + 1
        return f"{base}_{k}" if k else base

    def init(self, value, name: str = "w") -> str:
        """An initializer holding ``value`` (float64 arrays are stored as float32)."""
        value = np.asarray(value)
        if value.dtype == np.float64:
            value = value.astype(np.float32)
        name = self._fresh(name)
        self.inits.append(numpy_helper.from_array(np.array(value, order="C"), name))  # keeps 0-d arrays 0-d
        return name

    def weight(self, *shape: int, fan_in: int | None = None, scale: float | None = None, name: str = "w") -> str:
        if scale is None:
            fan_in = fan_in if fan_in is not None else (int(np.prod(shape[1:])) if len(shape) > 1 else shape[0])
            scale = 1.0 / np.sqrt(max(fan_in, 1))
        w = self.rng.standard_normal(shape, dtype=np.float32)
        w *= np.float32(scale)
        return self.init(w, name)

    def scalar(self, value: float, name: str = "c") -> str:
        return self.init(np.array(value, dtype=np.float32), name)

    def ints(self, values, name: str = "shape") -> str:
        return self.init(np.array(values, dtype=np.int64), name)

    def op(self, op_type: str, *inputs: str, outputs: int = 1, name: str | None = None, **attrs):
        base = self._fresh(name or op_type)
        outs = [base if outputs == 1 else f"{base}:{i}" for i in range(outputs)]
        self.nodes.append(helper.make_node(op_type, list(inputs), outs, name=base, **attrs))
        return outs[0] if outputs == 1 else outs

    def model(self, inputs: dict, outputs: list[str], graph_name: str) -> onnx.ModelProto:
        """The model, shape-inferred and checked. ``inputs``: name -> (shape, ONNX elem type)."""
        graph = helper.make_graph(
            self.nodes,
            graph_name,
            [helper.make_tensor_value_info(n, t, list(s)) for n, (s, t) in inputs.items()],
            [helper.make_tensor_value_info(o, TensorProto.FLOAT, None) for o in outputs],
            self.inits,
        )
        model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", OPSET)], producer_name="tvm-taso benchmarks")
        model.ir_version = 8  # what onnxruntime and onnx 1.13+ all read
        model = onnx.shape_inference.infer_shapes(model, strict_mode=True)
        onnx.checker.check_model(model, full_check=True)
        return model

    # --- PyTorch-export-style building blocks --------------------------------------------------

    def linear(self, x: str, n_in: int, n_out: int, name: str = "dense") -> str:
        """``nn.Linear`` on a 3-D input as the exporter writes it: MatMul + Add (bias)."""
        y = self.op("MatMul", x, self.weight(n_in, n_out, fan_in=n_in, name=f"{name}.weight"), name=f"{name}/MatMul")
        return self.op("Add", y, self.weight(n_out, scale=0.02, name=f"{name}.bias"), name=f"{name}/Add")

    def layer_norm(self, x: str, n: int, eps: float, name: str = "LayerNorm") -> str:
        gamma = self.init(1 + 0.1 * self.rng.standard_normal(n), f"{name}.weight")
        beta = self.init(0.1 * self.rng.standard_normal(n), f"{name}.bias")
        return self.op("LayerNormalization", x, gamma, beta, axis=-1, epsilon=eps, name=name)

    def gelu_erf(self, x: str, name: str = "gelu") -> str:
        """``x * 0.5 * (1 + erf(x / sqrt(2)))``: what BERT's exporters write for exact GELU."""
        e = self.op("Erf", self.op("Div", x, self.scalar(np.sqrt(2.0), "sqrt2"), name=f"{name}/Div"), name=f"{name}/Erf")
        e = self.op("Add", e, self.scalar(1.0, "one"), name=f"{name}/Add")
        y = self.op("Mul", x, e, name=f"{name}/Mul")
        return self.op("Mul", y, self.scalar(0.5, "half"), name=f"{name}/Mul_1")

    def conv(self, x: str, cin: int, cout: int, k: int, stride: int = 1, name: str = "conv") -> str:
        w = self.weight(cout, cin, k, k, name=f"{name}.weight")
        return self.op("Conv", x, w, kernel_shape=[k, k], strides=[stride, stride], pads=[k // 2] * 4,
                       dilations=[1, 1], group=1, name=name)

    def batch_norm(self, x: str, c: int, name: str = "bn") -> str:
        gamma = self.init(1 + 0.1 * self.rng.standard_normal(c), f"{name}.weight")
        beta = self.init(0.1 * self.rng.standard_normal(c), f"{name}.bias")
        mean = self.init(0.1 * self.rng.standard_normal(c), f"{name}.running_mean")
        var = self.init(0.5 + self.rng.random(c), f"{name}.running_var")
        return self.op("BatchNormalization", x, gamma, beta, mean, var, epsilon=1e-5, momentum=0.9, name=name)


def bert_base_onnx(
    layers: int = 12,
    seq: int = 128,
    hidden: int = 768,
    heads: int = 12,
    ffn: int = 3072,
    vocab: int | None = 30522,
    max_positions: int = 512,
    type_vocab: int = 2,
    scale_with: str = "Div",
    seed: int = 0,
) -> onnx.ModelProto:
    """BERT-base as ONNX, batch 1.

    With ``vocab`` (default 30522) the model starts from ``input_ids`` (int64, shape (1, seq))
    with BERT's embeddings (word, position and token-type Gathers, Add, LayerNormalization);
    with ``vocab=None`` it starts from the embedded input ``x`` (float32, (1, seq, hidden)), like
    :func:`benchmarks.models.bert_base`. ``scale_with``: ``"Div"`` (by √head_dim, as
    HuggingFace's BERT export) or ``"Mul"`` (by 1/√head_dim). The output is the last hidden
    state, (1, seq, hidden)."""
    if hidden % heads:
        raise ValueError(f"hidden {hidden} is not a multiple of heads {heads}")
    if scale_with not in ("Div", "Mul"):
        raise ValueError(f"scale_with must be 'Div' or 'Mul', not {scale_with!r}")
    hd = hidden // heads
    eps = 1e-12
    g = OnnxGraph(seed)

    if vocab is not None:
        ids = "input_ids"
        inputs = {ids: ((1, seq), TensorProto.INT64)}
        word = g.op("Gather", g.weight(vocab, hidden, scale=0.02, name="embeddings.word_embeddings.weight"), ids,
                    axis=0, name="embeddings/word")
        pos = g.op("Gather", g.weight(max_positions, hidden, scale=0.02, name="embeddings.position_embeddings.weight"),
                   g.ints(np.arange(seq)[None, :], "position_ids"), axis=0, name="embeddings/position")
        typ = g.op("Gather", g.weight(type_vocab, hidden, scale=0.02, name="embeddings.token_type_embeddings.weight"),
                   g.ints(np.zeros((1, seq)), "token_type_ids"), axis=0, name="embeddings/token_type")
        h = g.op("Add", g.op("Add", word, typ, name="embeddings/Add"), pos, name="embeddings/Add_1")
        h = g.layer_norm(h, hidden, eps, name="embeddings/LayerNorm")
    else:
        h = "x"
        inputs = {h: ((1, seq, hidden), TensorProto.FLOAT)}

    to_heads = g.ints([1, seq, heads, hd], "heads_shape")
    to_hidden = g.ints([1, seq, hidden], "hidden_shape")
    sqrt_hd = g.scalar(np.sqrt(hd) if scale_with == "Div" else 1 / np.sqrt(hd), "attention_scale")

    for i in range(layers):
        p = f"encoder.layer.{i}"
        q = g.linear(h, hidden, hidden, name=f"{p}.attention.self.query")
        k = g.linear(h, hidden, hidden, name=f"{p}.attention.self.key")
        v = g.linear(h, hidden, hidden, name=f"{p}.attention.self.value")
        q = g.op("Transpose", g.op("Reshape", q, to_heads, name=f"{p}/q/Reshape"), perm=[0, 2, 1, 3], name=f"{p}/q/Transpose")
        k = g.op("Transpose", g.op("Reshape", k, to_heads, name=f"{p}/k/Reshape"), perm=[0, 2, 3, 1], name=f"{p}/k/Transpose")
        v = g.op("Transpose", g.op("Reshape", v, to_heads, name=f"{p}/v/Reshape"), perm=[0, 2, 1, 3], name=f"{p}/v/Transpose")
        s = g.op("MatMul", q, k, name=f"{p}/scores/MatMul")  # (1, heads, seq, seq)
        s = g.op(scale_with, s, sqrt_hd, name=f"{p}/scores/{scale_with}")
        a = g.op("Softmax", s, axis=-1, name=f"{p}/Softmax")
        c = g.op("MatMul", a, v, name=f"{p}/context/MatMul")  # (1, heads, seq, hd)
        c = g.op("Transpose", c, perm=[0, 2, 1, 3], name=f"{p}/context/Transpose")
        c = g.op("Reshape", c, to_hidden, name=f"{p}/context/Reshape")
        a = g.linear(c, hidden, hidden, name=f"{p}.attention.output.dense")
        h = g.layer_norm(g.op("Add", a, h, name=f"{p}/attention/residual"), hidden, eps, name=f"{p}.attention.output.LayerNorm")
        f = g.gelu_erf(g.linear(h, hidden, ffn, name=f"{p}.intermediate.dense"), name=f"{p}/gelu")
        f = g.linear(f, ffn, hidden, name=f"{p}.output.dense")
        h = g.layer_norm(g.op("Add", f, h, name=f"{p}/output/residual"), hidden, eps, name=f"{p}.output.LayerNorm")

    return g.model(inputs, [h], "bert_base")


def resnet50_onnx(image: int = 224, width: int = 64, classes: int = 1000, seed: int = 0) -> onnx.ModelProto:
    """ResNet-50 v1.5 (stride on the 3x3 conv of each bottleneck) as ONNX, input ``x`` of shape
    (1, 3, image, image). ``width`` is the stem's channels (64 in ResNet-50; the last stage has
    32 x width). Conv without bias, then BatchNormalization, as torchvision defines it (and as
    PyTorch's exporter writes it with ``do_constant_folding=False``)."""
    g = OnnxGraph(seed)

    def conv_bn(x, cin, cout, k, stride=1, relu=False, name="conv"):
        y = g.batch_norm(g.conv(x, cin, cout, k, stride, name=name), cout, name=f"{name}.bn")
        return g.op("Relu", y, name=f"{name}/Relu") if relu else y

    def bottleneck(x, cin, mid, stride, project, name):
        out = 4 * mid
        y = conv_bn(x, cin, mid, 1, relu=True, name=f"{name}.conv1")
        y = conv_bn(y, mid, mid, 3, stride=stride, relu=True, name=f"{name}.conv2")
        y = conv_bn(y, mid, out, 1, name=f"{name}.conv3")
        s = conv_bn(x, cin, out, 1, stride=stride, name=f"{name}.downsample") if project else x
        return g.op("Relu", g.op("Add", y, s, name=f"{name}/Add"), name=f"{name}/Relu")

    h = conv_bn("x", 3, width, 7, stride=2, relu=True, name="conv1")
    h = g.op("MaxPool", h, kernel_shape=[3, 3], strides=[2, 2], pads=[1, 1, 1, 1], name="maxpool")
    cin = width
    for stage, blocks in enumerate((3, 4, 6, 3)):
        mid = width * 2**stage
        for b in range(blocks):
            stride = 2 if (b == 0 and stage > 0) else 1
            h = bottleneck(h, cin, mid, stride, project=(b == 0), name=f"layer{stage + 1}.{b}")
            cin = 4 * mid
    h = g.op("GlobalAveragePool", h, name="avgpool")
    h = g.op("Flatten", h, axis=1, name="flatten")
    w = g.weight(classes, cin, fan_in=cin, name="fc.weight")
    h = g.op("Gemm", h, w, g.weight(classes, scale=0.02, name="fc.bias"), alpha=1.0, beta=1.0, transB=1, name="fc")
    return g.model({"x": ((1, 3, image, image), TensorProto.FLOAT)}, [h], "resnet50")


MODELS = {"bert-base": bert_base_onnx, "resnet50": resnet50_onnx}

QUICK_SIZES = {
    "bert-base": {"layers": 2, "seq": 16, "hidden": 64, "heads": 4, "ffn": 256, "vocab": 1000, "max_positions": 64},
    "resnet50": {"image": 32, "width": 8, "classes": 10},
}
