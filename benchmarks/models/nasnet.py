"""NasNet-A as TASO's example ``examples/nasnet_a.py`` builds it: three stages, each of ``cells``
(5) normal cells followed by one reduction cell -- TASO's order: the normal cells of a stage run
at its ``out_channels``, then ``out_channels`` doubles and the reduction cell halves the image.

Every cell first brings its two inputs to ``out_channels``: the current one by ``squeeze`` (1x1
conv + Relu), the previous one by ``fit`` (the same, or a 3x3 stride-2 conv + Relu when its image
is larger -- never the case in this network, kept as TASO writes it). A separable conv is a
depthwise conv (group = channels, no activation) followed by a 1x1 conv without activation,
TASO's ``seperable_conv``. The normal cell adds five pairs of {separable 3x3, identity, 3x3 average
pool} branches, the reduction cell five pairs of stride-2 separable 7x7/5x5 convs and 3x3
max/average pools (two of its pairs reading its first sum at the reduced size), and each
cell concatenates its five sums along channels (5 x ``out_channels`` channels). Convs have no
bias and there is no BatchNormalization, as in TASO's graph. Pools use TASO's padding:
symmetric, ``k // 2`` (its "SAME" on even image sizes), and average pools exclude the padding
from the count (``count_include_pad=0``, as TASO's ``CUDNN_POOLING_AVERAGE_COUNT_EXCLUDE_PADDING``).

Where it deviates from TASO's example, which starts from a 1x128x56x56 feature map: a stem takes
the 1x3x224x224 image there (7x7 stride-2 conv + Relu to ``channels``, 3x3 stride-2 max pool, as
ResNet's stem), TASO's 1x1 identity max pool on the input is left out, and a classifier
(GlobalAveragePool, Flatten, Gemm) ends the network on the last reduction cell's 5 x 8 x
``channels`` = 5120 channels at 7x7. Weights are ``1 / sqrt(fan_in)``-scaled (the stem's
``sqrt(2 / fan_in)``): each Relu halves what each two-branch Add doubles, so activations stay
O(1) over the whole depth (standard deviation ~2.5 after the first cell, ~7 at the logits).
~45 M weights at the default size (5.1 M of them in the classifier).
"""

from __future__ import annotations

import numpy as np
import onnx
from onnx import TensorProto

from .onnx_graph import OnnxGraph


class _NasNet:
    """The cell builders of TASO's example on one :class:`OnnxGraph`; tensors are (name, C, H)."""

    def __init__(self, g: OnnxGraph):
        self.g = g

    def conv(self, x, cin, cout, k, stride=1, group=1, relu=False, gain=1.0, name="conv"):
        """Conv without bias, symmetric ``k // 2`` padding, then Relu where TASO asks for it;
        weights ``gain / sqrt(fan_in)``-scaled."""
        fan_in = cin // group * k * k
        w = self.g.weight(cout, cin // group, k, k, scale=gain / float(np.sqrt(fan_in)), name=f"{name}.weight")
        y = self.g.op("Conv", x, w, kernel_shape=[k, k], strides=[stride, stride], pads=[k // 2] * 4,
                      dilations=[1, 1], group=group, name=name)
        return self.g.op("Relu", y, name=f"{name}/Relu") if relu else y

    def squeeze(self, t, cout, name):
        x, c, h = t
        return self.conv(x, c, cout, 1, relu=True, name=name), cout, h

    def fit(self, cur, t, name):
        """``t`` brought to ``cur``'s channels (and image size, by a 3x3 stride-2 conv)."""
        x, c, h = t
        if h == cur[2]:
            return self.squeeze(t, cur[1], name)
        return self.conv(x, c, cur[1], 3, stride=2, relu=True, name=name), cur[1], (h + 1) // 2

    def sep(self, t, k, stride, name):
        """TASO's ``seperable_conv``: depthwise k x k conv, then 1x1 conv, no activation."""
        x, c, h = t
        y = self.conv(x, c, c, k, stride=stride, group=c, name=f"{name}.depthwise")
        return self.conv(y, c, c, 1, name=f"{name}.pointwise"), c, (h - 1) // stride + 1

    def pool(self, kind, t, stride, name):
        x, c, h = t
        attrs = dict(kernel_shape=[3, 3], strides=[stride, stride], pads=[1, 1, 1, 1])
        if kind == "AveragePool":
            attrs["count_include_pad"] = 0
        return self.g.op(kind, x, name=name, **attrs), c, (h - 1) // stride + 1

    def add(self, a, b, name):
        return self.g.op("Add", a[0], b[0], name=name), a[1], a[2]

    def concat(self, ts, name):
        return self.g.op("Concat", *(t[0] for t in ts), axis=1, name=name), sum(t[1] for t in ts), ts[0][2]

    def normal_cell(self, prev, cur, cout, name):
        cur = self.squeeze(cur, cout, f"{name}.squeeze")
        prev = self.fit(cur, prev, f"{name}.fit")
        pairs = [
            (self.sep(cur, 3, 1, f"{name}.sep0"), cur),
            (self.sep(prev, 3, 1, f"{name}.sep1"), self.sep(cur, 3, 1, f"{name}.sep2")),
            (self.pool("AveragePool", cur, 1, f"{name}.avgpool0"), prev),
            (self.pool("AveragePool", prev, 1, f"{name}.avgpool1"),
             self.pool("AveragePool", prev, 1, f"{name}.avgpool2")),
            (self.sep(prev, 3, 1, f"{name}.sep3"), self.sep(prev, 3, 1, f"{name}.sep4")),
        ]
        outs = [self.add(a, b, f"{name}/Add_{i}") for i, (a, b) in enumerate(pairs)]
        return self.concat(outs, f"{name}/Concat")

    def reduction_cell(self, prev, cur, cout, name):
        cur = self.squeeze(cur, cout, f"{name}.squeeze")
        prev = self.fit(cur, prev, f"{name}.fit")
        o0 = self.add(self.sep(prev, 7, 2, f"{name}.sep0"), self.sep(cur, 5, 2, f"{name}.sep1"), f"{name}/Add_0")
        o1 = self.add(self.pool("MaxPool", cur, 2, f"{name}.maxpool0"), self.sep(prev, 7, 2, f"{name}.sep2"),
                      f"{name}/Add_1")
        o2 = self.add(self.pool("AveragePool", cur, 2, f"{name}.avgpool0"), self.sep(prev, 5, 2, f"{name}.sep3"),
                      f"{name}/Add_2")
        o3 = self.add(self.pool("MaxPool", cur, 2, f"{name}.maxpool1"), self.sep(o0, 3, 1, f"{name}.sep4"),
                      f"{name}/Add_3")
        o4 = self.add(self.pool("AveragePool", o0, 1, f"{name}.avgpool1"), o1, f"{name}/Add_4")
        return self.concat([o0, o1, o2, o3, o4], f"{name}/Concat")


def nasnet_a(image: int = 224, channels: int = 128, cells: int = 5, classes: int = 1000,
             seed: int = 0) -> onnx.ModelProto:
    """NasNet-A on ``x`` of shape (1, 3, image, image): stem to ``channels`` at image / 4 (TASO's
    1x128x56x56 input), then 3 stages of ``cells`` normal cells and one reduction cell, the
    cells' width ``channels``, 2x, 4x and (the last reduction cell) 8x ``channels``; ``image``
    must be a multiple of 32."""
    if image % 32:
        raise ValueError(f"image must be a multiple of 32, got {image}")
    g = OnnxGraph(seed)
    net = _NasNet(g)
    h = net.conv("x", 3, channels, 7, stride=2, relu=True, gain=float(np.sqrt(2)), name="stem.conv")
    h = g.op("MaxPool", h, kernel_shape=[3, 3], strides=[2, 2], pads=[1, 1, 1, 1], name="stem.maxpool")
    t = (h, channels, image // 4)
    cout = channels
    for stage in range(3):
        prev = cur = t
        for j in range(cells):
            prev, cur = cur, net.normal_cell(prev, cur, cout, f"stage{stage + 1}.normal{j}")
        cout *= 2
        t = net.reduction_cell(prev, cur, cout, f"stage{stage + 1}.reduction")
    y = g.classifier(t[0], t[1], classes)
    return g.model({"x": ((1, 3, image, image), TensorProto.FLOAT)}, [y], "nasnet_a")
