"""``OnnxGraph``: the builder every benchmark model is written with -- nodes added one by one
with ``onnx.helper`` the way PyTorch's exporter writes them (opset 17), float32 weights drawn
from a seeded numpy generator (no downloads), and the finished model shape-inferred and passed
through ``onnx.checker.check_model(full_check=True)``.
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

    def conv(self, x: str, cin: int, cout: int, k, stride: int = 1, pads=None, group: int = 1,
             bias: bool = False, name: str = "conv") -> str:
        """``nn.Conv2d``: kernel ``k`` (int or (kh, kw)), "same" padding unless ``pads`` is given
        (ONNX order: top, left, bottom, right), ``group`` groups, optional bias."""
        kh, kw = (k, k) if isinstance(k, int) else k
        if pads is None:
            pads = [kh // 2, kw // 2, kh // 2, kw // 2]
        elif isinstance(pads, int):
            pads = [pads] * 4
        inputs = [x, self.weight(cout, cin // group, kh, kw, name=f"{name}.weight")]
        if bias:
            inputs.append(self.weight(cout, scale=0.02, name=f"{name}.bias"))
        return self.op("Conv", *inputs, kernel_shape=[kh, kw], strides=[stride, stride], pads=list(pads),
                       dilations=[1, 1], group=group, name=name)

    def batch_norm(self, x: str, c: int, name: str = "bn") -> str:
        gamma = self.init(1 + 0.1 * self.rng.standard_normal(c), f"{name}.weight")
        beta = self.init(0.1 * self.rng.standard_normal(c), f"{name}.bias")
        mean = self.init(0.1 * self.rng.standard_normal(c), f"{name}.running_mean")
        var = self.init(0.5 + self.rng.random(c), f"{name}.running_var")
        return self.op("BatchNormalization", x, gamma, beta, mean, var, epsilon=1e-5, momentum=0.9, name=name)

    def conv_bn(self, x: str, cin: int, cout: int, k, stride: int = 1, relu: bool = True, pads=None,
                group: int = 1, name: str = "conv") -> str:
        """Conv (no bias) → BatchNormalization → optional Relu, as torchvision's CNNs export."""
        y = self.conv(x, cin, cout, k, stride, pads=pads, group=group, name=name)
        y = self.batch_norm(y, cout, name=f"{name}.bn")
        return self.op("Relu", y, name=f"{name}/Relu") if relu else y

    def gemm(self, x: str, n_in: int, n_out: int, name: str = "fc") -> str:
        """``nn.Linear`` on a 2-D input as the exporter writes it: Gemm with transB."""
        w = self.weight(n_out, n_in, fan_in=n_in, name=f"{name}.weight")
        return self.op("Gemm", x, w, self.weight(n_out, scale=0.02, name=f"{name}.bias"),
                       alpha=1.0, beta=1.0, transB=1, name=name)

    def classifier(self, x: str, channels: int, classes: int, name: str = "fc") -> str:
        """GlobalAveragePool → Flatten → Gemm: the head of torchvision's CNNs."""
        h = self.op("GlobalAveragePool", x, name="avgpool")
        h = self.op("Flatten", h, axis=1, name="flatten")
        return self.gemm(h, channels, classes, name=name)
