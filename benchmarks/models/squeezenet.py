"""SqueezeNet 1.1 as torchvision defines it, in eval mode: Conv 3x3 stride 2 (64, bias) → Relu,
max pool 3 stride 2, Fire(64, 16, 64, 64) and Fire(128, 16, 64, 64), max pool,
Fire(128, 32, 128, 128) and Fire(256, 32, 128, 128), max pool, Fire(256, 48, 192, 192),
Fire(384, 48, 192, 192), Fire(384, 64, 256, 256), Fire(512, 64, 256, 256); the classifier's
Dropout is the identity at inference and is left out: Conv 1x1 to ``classes`` (bias) → Relu →
GlobalAveragePool → Flatten. A Fire module is a squeeze 1x1 conv (bias) → Relu, then an expand
1x1 conv and an expand 3x3 conv (pad 1), both with bias and Relu, side by side, concatenated on
the channels. ~1.24 M weights.

torchvision's max pools use ``ceil_mode=True``; the optimizer treats ceil-mode pooling as an op
it does not know, so the pools here are written with ``ceil_mode=0``. The builder checks that,
for the requested image size, floor and ceil give the same output size at every pool (they do
at 224: 111 → 55 → 27 → 13), so the graph computes exactly what torchvision's does."""

from __future__ import annotations

import numpy as np
import onnx
from onnx import TensorProto

from .onnx_graph import OnnxGraph


def _conv_relu(g: OnnxGraph, x: str, cin: int, cout: int, k: int, stride: int = 1, pad: int = 0,
               conv: str = "conv", relu: str = "relu") -> str:
    """Conv with bias (He-scaled weights, as there is no BatchNorm to renormalise) → Relu."""
    w = g.weight(cout, cin, k, k, scale=np.sqrt(2.0 / (cin * k * k)), name=f"{conv}.weight")
    b = g.weight(cout, scale=0.02, name=f"{conv}.bias")
    y = g.op("Conv", x, w, b, kernel_shape=[k, k], strides=[stride, stride], pads=[pad] * 4,
             dilations=[1, 1], group=1, name=conv)
    return g.op("Relu", y, name=relu)


def _fire(g: OnnxGraph, x: str, cin: int, squeeze: int, expand1x1: int, expand3x3: int, name: str) -> str:
    s = _conv_relu(g, x, cin, squeeze, 1, conv=f"{name}.squeeze", relu=f"{name}.squeeze_activation")
    e1 = _conv_relu(g, s, squeeze, expand1x1, 1, conv=f"{name}.expand1x1", relu=f"{name}.expand1x1_activation")
    e3 = _conv_relu(g, s, squeeze, expand3x3, 3, pad=1, conv=f"{name}.expand3x3",
                    relu=f"{name}.expand3x3_activation")
    return g.op("Concat", e1, e3, axis=1, name=f"{name}/Concat")


def _pool_sizes(image: int) -> list[int]:
    """Spatial size after the stem conv and after each max pool; raises ValueError where a pool
    would give a different size in floor and in ceil mode (or nothing at all)."""
    size = (image - 3) // 2 + 1
    sizes = [size]
    for _ in range(3):
        if size < 3 or (size - 3) % 2:
            raise ValueError(
                f"squeezenet1_1 at image {image}: a 3x3 stride-2 max pool on a {size}x{size} map gives "
                "different sizes in floor and ceil mode (torchvision uses ceil mode); choose an image size "
                "where every pool input is odd and >= 3, such as 224, 64 or 32")
        size = (size - 3) // 2 + 1
        sizes.append(size)
    return sizes


def squeezenet1_1(image: int = 224, width: float = 1.0, classes: int = 1000, seed: int = 0) -> onnx.ModelProto:
    """SqueezeNet 1.1 on ``x`` of shape (1, 3, image, image). ``width`` scales every channel
    count but the classes (``max(1, int(c * width))``). ``image`` must keep floor- and ceil-mode
    pooling in agreement (224, 64 and 32 do; ValueError otherwise). The output is (1, classes)."""
    _pool_sizes(image)
    c = lambda n: max(1, int(n * width))  # noqa: E731
    g = OnnxGraph(seed)

    def max_pool(x, index):
        return g.op("MaxPool", x, kernel_shape=[3, 3], strides=[2, 2], pads=[0, 0, 0, 0], ceil_mode=0,
                    name=f"features.{index}")

    h = _conv_relu(g, "x", 3, c(64), 3, stride=2, conv="features.0", relu="features.1")
    h = max_pool(h, 2)
    cin = c(64)
    index = 3
    for item in ((16, 64), (16, 64), "M", (32, 128), (32, 128), "M", (48, 192), (48, 192), (64, 256), (64, 256)):
        if item == "M":
            h = max_pool(h, index)
        else:
            squeeze, expand = item
            h = _fire(g, h, cin, c(squeeze), c(expand), c(expand), name=f"features.{index}")
            cin = 2 * c(expand)
        index += 1
    h = _conv_relu(g, h, cin, classes, 1, conv="classifier.1", relu="classifier.2")
    h = g.op("GlobalAveragePool", h, name="classifier.3")
    h = g.op("Flatten", h, axis=1, name="flatten")
    return g.model({"x": ((1, 3, image, image), TensorProto.FLOAT)}, [h], "squeezenet1_1")
