"""VGG-19 (configuration E, without BatchNorm) as torchvision defines it, in eval mode: sixteen
3x3 convs (pad 1, bias) each followed by Relu, in stages of 64, 64 | 128, 128 | 256 x4 | 512 x4 |
512 x4 channels, each stage ending in a 2x2 stride-2 max pool; flatten; the classifier Gemm
25088 → 4096 → Relu → Gemm 4096 → 4096 → Relu → Gemm 4096 → classes (its Dropouts are the
identity at inference and are left out). ~143.7 M weights (~575 MB as float32).

torchvision pools the features with ``AdaptiveAvgPool2d(7)`` before flattening. At 224 the
feature map is already 7x7, so that pool is the identity and is left out; at other sizes (a
multiple of 32) the flatten size is ``C * (image / 32) ** 2`` instead of ``C * 49``, i.e. the
model is VGG-19 without the adaptive pool, exactly torchvision's only at 224."""

from __future__ import annotations

import numpy as np
import onnx
from onnx import TensorProto

from .onnx_graph import OnnxGraph

_CONFIG_E = [64, 64, "M", 128, 128, "M", 256, 256, 256, 256, "M", 512, 512, 512, 512, "M", 512, 512, 512, 512, "M"]


def vgg19(image: int = 224, width: float = 1.0, classes: int = 1000, seed: int = 0) -> onnx.ModelProto:
    """VGG-19 on ``x`` of shape (1, 3, image, image); ``image`` must be a multiple of 32 (224 as
    torchvision). ``width`` scales the conv channels and the hidden fully connected size
    (``max(1, int(c * width))``). Weights are He-scaled, as there is no BatchNorm. The output is
    (1, classes) logits."""
    if image < 32 or image % 32:
        raise ValueError(f"vgg19 needs image to be a positive multiple of 32, got {image}")
    c = lambda n: max(1, int(n * width))  # noqa: E731
    g = OnnxGraph(seed)
    h, cin, index = "x", 3, 0
    for item in _CONFIG_E:
        if item == "M":
            h = g.op("MaxPool", h, kernel_shape=[2, 2], strides=[2, 2], pads=[0, 0, 0, 0], ceil_mode=0,
                     name=f"features.{index}")
            index += 1
            continue
        cout = c(item)
        w = g.weight(cout, cin, 3, 3, scale=np.sqrt(2.0 / (cin * 9)), name=f"features.{index}.weight")
        b = g.weight(cout, scale=0.02, name=f"features.{index}.bias")
        h = g.op("Conv", h, w, b, kernel_shape=[3, 3], strides=[1, 1], pads=[1, 1, 1, 1], dilations=[1, 1],
                 group=1, name=f"features.{index}")
        h = g.op("Relu", h, name=f"features.{index + 1}")
        cin, index = cout, index + 2
    h = g.op("Flatten", h, axis=1, name="flatten")
    hidden = c(4096)
    n_in = cin * (image // 32) ** 2
    for i, (a, b) in enumerate(((n_in, hidden), (hidden, hidden))):
        w = g.weight(b, a, scale=np.sqrt(2.0 / a), name=f"classifier.{3 * i}.weight")
        h = g.op("Gemm", h, w, g.weight(b, scale=0.02, name=f"classifier.{3 * i}.bias"),
                 alpha=1.0, beta=1.0, transB=1, name=f"classifier.{3 * i}")
        h = g.op("Relu", h, name=f"classifier.{3 * i + 1}")
    h = g.gemm(h, hidden, classes, name="classifier.6")
    return g.model({"x": ((1, 3, image, image), TensorProto.FLOAT)}, [h], "vgg19")
