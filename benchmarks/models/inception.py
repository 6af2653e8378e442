"""Inception-v3 as torchvision defines it, in eval mode without the auxiliary head and without
``transform_input``: the stem (Conv2d_1a_3x3 stride 2, 2a, 2b, max pool 3x3 stride 2, 3b 1x1,
4a 3x3, max pool), InceptionA x3 (Mixed_5b-d, pool features 32, 64, 64), InceptionB (Mixed_6a),
InceptionC x4 (Mixed_6b-e, channels_7x7 128, 160, 160, 192, with the asymmetric 1x7 / 7x1
convs), InceptionD (Mixed_7a), InceptionE x2 (Mixed_7b-c, whose 1x3 and 3x1 convs run side by
side and are concatenated), global average pool, flatten, fully connected. Every conv is
torchvision's ``BasicConv2d``: Conv (no bias) → BatchNormalization (eps 1e-3) → Relu. The branch
average pools are what ``F.avg_pool2d(x, 3, stride=1, padding=1)`` exports: AveragePool 3x3,
stride 1, pads 1, ``count_include_pad=1``. ~23.8 M weights (plus the BatchNorm statistics)."""

from __future__ import annotations

import onnx
from onnx import TensorProto

from .onnx_graph import OnnxGraph


def _channels(width: float):
    return lambda c: max(1, int(c * width))


def _basic_conv(g: OnnxGraph, x: str, cin: int, cout: int, k, stride: int = 1, pads=0, name: str = "conv") -> str:
    """torchvision's ``BasicConv2d``: Conv (no bias) → BatchNormalization(eps=1e-3) → Relu, with
    ``pads`` in ONNX order (top, left, bottom, right) or one int for all four."""
    y = g.conv(x, cin, cout, k, stride, pads=pads, name=f"{name}.conv")
    bn = f"{name}.bn"
    gamma = g.init(1 + 0.1 * g.rng.standard_normal(cout), f"{bn}.weight")
    beta = g.init(0.1 * g.rng.standard_normal(cout), f"{bn}.bias")
    mean = g.init(0.1 * g.rng.standard_normal(cout), f"{bn}.running_mean")
    var = g.init(0.5 + g.rng.random(cout), f"{bn}.running_var")
    y = g.op("BatchNormalization", y, gamma, beta, mean, var, epsilon=1e-3, momentum=0.9, name=bn)
    return g.op("Relu", y, name=f"{name}/Relu")


def _avg_pool(g: OnnxGraph, x: str, name: str) -> str:
    """``F.avg_pool2d(x, kernel_size=3, stride=1, padding=1)`` as PyTorch exports it."""
    return g.op("AveragePool", x, kernel_shape=[3, 3], strides=[1, 1], pads=[1, 1, 1, 1],
                count_include_pad=1, ceil_mode=0, name=name)


def _max_pool(g: OnnxGraph, x: str, name: str) -> str:
    """``MaxPool2d(kernel_size=3, stride=2)`` (no padding, floor mode)."""
    return g.op("MaxPool", x, kernel_shape=[3, 3], strides=[2, 2], pads=[0, 0, 0, 0], ceil_mode=0, name=name)


_1x7 = [0, 3, 0, 3]  # (1, 7) kernel, padding (0, 3)
_7x1 = [3, 0, 3, 0]  # (7, 1) kernel, padding (3, 0)
_1x3 = [0, 1, 0, 1]
_3x1 = [1, 0, 1, 0]


def _inception_a(g, x, cin, pool_features, c, name):
    b1 = _basic_conv(g, x, cin, c(64), 1, name=f"{name}.branch1x1")
    b5 = _basic_conv(g, x, cin, c(48), 1, name=f"{name}.branch5x5_1")
    b5 = _basic_conv(g, b5, c(48), c(64), 5, pads=2, name=f"{name}.branch5x5_2")
    b3 = _basic_conv(g, x, cin, c(64), 1, name=f"{name}.branch3x3dbl_1")
    b3 = _basic_conv(g, b3, c(64), c(96), 3, pads=1, name=f"{name}.branch3x3dbl_2")
    b3 = _basic_conv(g, b3, c(96), c(96), 3, pads=1, name=f"{name}.branch3x3dbl_3")
    bp = _avg_pool(g, x, name=f"{name}/AveragePool")
    bp = _basic_conv(g, bp, cin, c(pool_features), 1, name=f"{name}.branch_pool")
    y = g.op("Concat", b1, b5, b3, bp, axis=1, name=f"{name}/Concat")
    return y, c(64) + c(64) + c(96) + c(pool_features)


def _inception_b(g, x, cin, c, name):
    b3 = _basic_conv(g, x, cin, c(384), 3, stride=2, name=f"{name}.branch3x3")
    bd = _basic_conv(g, x, cin, c(64), 1, name=f"{name}.branch3x3dbl_1")
    bd = _basic_conv(g, bd, c(64), c(96), 3, pads=1, name=f"{name}.branch3x3dbl_2")
    bd = _basic_conv(g, bd, c(96), c(96), 3, stride=2, name=f"{name}.branch3x3dbl_3")
    bp = _max_pool(g, x, name=f"{name}/MaxPool")
    y = g.op("Concat", b3, bd, bp, axis=1, name=f"{name}/Concat")
    return y, c(384) + c(96) + cin


def _inception_c(g, x, cin, channels_7x7, c, name):
    c7 = c(channels_7x7)
    b1 = _basic_conv(g, x, cin, c(192), 1, name=f"{name}.branch1x1")
    b7 = _basic_conv(g, x, cin, c7, 1, name=f"{name}.branch7x7_1")
    b7 = _basic_conv(g, b7, c7, c7, (1, 7), pads=_1x7, name=f"{name}.branch7x7_2")
    b7 = _basic_conv(g, b7, c7, c(192), (7, 1), pads=_7x1, name=f"{name}.branch7x7_3")
    bd = _basic_conv(g, x, cin, c7, 1, name=f"{name}.branch7x7dbl_1")
    bd = _basic_conv(g, bd, c7, c7, (7, 1), pads=_7x1, name=f"{name}.branch7x7dbl_2")
    bd = _basic_conv(g, bd, c7, c7, (1, 7), pads=_1x7, name=f"{name}.branch7x7dbl_3")
    bd = _basic_conv(g, bd, c7, c7, (7, 1), pads=_7x1, name=f"{name}.branch7x7dbl_4")
    bd = _basic_conv(g, bd, c7, c(192), (1, 7), pads=_1x7, name=f"{name}.branch7x7dbl_5")
    bp = _avg_pool(g, x, name=f"{name}/AveragePool")
    bp = _basic_conv(g, bp, cin, c(192), 1, name=f"{name}.branch_pool")
    y = g.op("Concat", b1, b7, bd, bp, axis=1, name=f"{name}/Concat")
    return y, 4 * c(192)


def _inception_d(g, x, cin, c, name):
    b3 = _basic_conv(g, x, cin, c(192), 1, name=f"{name}.branch3x3_1")
    b3 = _basic_conv(g, b3, c(192), c(320), 3, stride=2, name=f"{name}.branch3x3_2")
    b7 = _basic_conv(g, x, cin, c(192), 1, name=f"{name}.branch7x7x3_1")
    b7 = _basic_conv(g, b7, c(192), c(192), (1, 7), pads=_1x7, name=f"{name}.branch7x7x3_2")
    b7 = _basic_conv(g, b7, c(192), c(192), (7, 1), pads=_7x1, name=f"{name}.branch7x7x3_3")
    b7 = _basic_conv(g, b7, c(192), c(192), 3, stride=2, name=f"{name}.branch7x7x3_4")
    bp = _max_pool(g, x, name=f"{name}/MaxPool")
    y = g.op("Concat", b3, b7, bp, axis=1, name=f"{name}/Concat")
    return y, c(320) + c(192) + cin


def _inception_e(g, x, cin, c, name):
    b1 = _basic_conv(g, x, cin, c(320), 1, name=f"{name}.branch1x1")
    b3 = _basic_conv(g, x, cin, c(384), 1, name=f"{name}.branch3x3_1")
    b3a = _basic_conv(g, b3, c(384), c(384), (1, 3), pads=_1x3, name=f"{name}.branch3x3_2a")
    b3b = _basic_conv(g, b3, c(384), c(384), (3, 1), pads=_3x1, name=f"{name}.branch3x3_2b")
    b3 = g.op("Concat", b3a, b3b, axis=1, name=f"{name}.branch3x3/Concat")
    bd = _basic_conv(g, x, cin, c(448), 1, name=f"{name}.branch3x3dbl_1")
    bd = _basic_conv(g, bd, c(448), c(384), 3, pads=1, name=f"{name}.branch3x3dbl_2")
    bda = _basic_conv(g, bd, c(384), c(384), (1, 3), pads=_1x3, name=f"{name}.branch3x3dbl_3a")
    bdb = _basic_conv(g, bd, c(384), c(384), (3, 1), pads=_3x1, name=f"{name}.branch3x3dbl_3b")
    bd = g.op("Concat", bda, bdb, axis=1, name=f"{name}.branch3x3dbl/Concat")
    bp = _avg_pool(g, x, name=f"{name}/AveragePool")
    bp = _basic_conv(g, bp, cin, c(192), 1, name=f"{name}.branch_pool")
    y = g.op("Concat", b1, b3, bd, bp, axis=1, name=f"{name}/Concat")
    return y, c(320) + 4 * c(384) + c(192)


def inception_v3(image: int = 299, width: float = 1.0, classes: int = 1000, seed: int = 0) -> onnx.ModelProto:
    """Inception-v3 on ``x`` of shape (1, 3, image, image) (299 as torchvision; at least 75, the
    smallest size whose feature maps stay non-empty). ``width`` scales every channel count
    (``max(1, int(c * width))``), so ``width=0.125, image=75`` is a tiny version. The output is
    (1, classes) logits."""
    if image < 75:
        raise ValueError(f"inception_v3 needs image >= 75, got {image}")
    c = _channels(width)
    g = OnnxGraph(seed)
    h = _basic_conv(g, "x", 3, c(32), 3, stride=2, name="Conv2d_1a_3x3")
    h = _basic_conv(g, h, c(32), c(32), 3, name="Conv2d_2a_3x3")
    h = _basic_conv(g, h, c(32), c(64), 3, pads=1, name="Conv2d_2b_3x3")
    h = _max_pool(g, h, name="maxpool1")
    h = _basic_conv(g, h, c(64), c(80), 1, name="Conv2d_3b_1x1")
    h = _basic_conv(g, h, c(80), c(192), 3, name="Conv2d_4a_3x3")
    h = _max_pool(g, h, name="maxpool2")
    cin = c(192)
    for name, pool_features in (("Mixed_5b", 32), ("Mixed_5c", 64), ("Mixed_5d", 64)):
        h, cin = _inception_a(g, h, cin, pool_features, c, name)
    h, cin = _inception_b(g, h, cin, c, "Mixed_6a")
    for name, channels_7x7 in (("Mixed_6b", 128), ("Mixed_6c", 160), ("Mixed_6d", 160), ("Mixed_6e", 192)):
        h, cin = _inception_c(g, h, cin, channels_7x7, c, name)
    h, cin = _inception_d(g, h, cin, c, "Mixed_7a")
    for name in ("Mixed_7b", "Mixed_7c"):
        h, cin = _inception_e(g, h, cin, c, name)
    h = g.classifier(h, cin, classes)
    return g.model({"x": ((1, 3, image, image), TensorProto.FLOAT)}, [h], "inception_v3")
