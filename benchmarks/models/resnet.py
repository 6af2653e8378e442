"""ResNet-50 and ResNeXt-50 (32x4d) as torchvision defines them (v1.5: the stride sits on the
3x3 conv of each bottleneck): 7x7 stem, max pool, bottleneck stages [3, 4, 6, 3], global average
pool, fully connected. Conv without bias, then BatchNormalization, as PyTorch's exporter writes
them with ``do_constant_folding=False``. ~25.6 M (ResNet-50) and ~25.0 M (ResNeXt-50) weights."""

from __future__ import annotations

import onnx
from onnx import TensorProto

from .onnx_graph import OnnxGraph


def _resnet(name: str, image: int, width: int, classes: int, groups: int, group_width: int | None,
            seed: int) -> onnx.ModelProto:
    g = OnnxGraph(seed)

    def bottleneck(x, cin, planes, stride, project, name):
        out = 4 * planes
        # torchvision's ResNeXt: 2^stage x groups x group_width channels in the grouped 3x3
        mid = planes if group_width is None else planes // width * groups * group_width
        y = g.conv_bn(x, cin, mid, 1, name=f"{name}.conv1")
        y = g.conv_bn(y, mid, mid, 3, stride=stride, group=groups, name=f"{name}.conv2")
        y = g.conv_bn(y, mid, out, 1, relu=False, name=f"{name}.conv3")
        s = g.conv_bn(x, cin, out, 1, stride=stride, relu=False, name=f"{name}.downsample") if project else x
        return g.op("Relu", g.op("Add", y, s, name=f"{name}/Add"), name=f"{name}/Relu")

    h = g.conv_bn("x", 3, width, 7, stride=2, name="conv1")
    h = g.op("MaxPool", h, kernel_shape=[3, 3], strides=[2, 2], pads=[1, 1, 1, 1], name="maxpool")
    cin = width
    for stage, blocks in enumerate((3, 4, 6, 3)):
        planes = width * 2**stage
        for b in range(blocks):
            stride = 2 if (b == 0 and stage > 0) else 1
            h = bottleneck(h, cin, planes, stride, project=(b == 0), name=f"layer{stage + 1}.{b}")
            cin = 4 * planes
    h = g.classifier(h, cin, classes)
    return g.model({"x": ((1, 3, image, image), TensorProto.FLOAT)}, [h], name)


def resnet50(image: int = 224, width: int = 64, classes: int = 1000, seed: int = 0) -> onnx.ModelProto:
    """ResNet-50 on ``x`` of shape (1, 3, image, image). ``width`` is the stem's channels (64;
    the last stage outputs 32 x width)."""
    return _resnet("resnet50", image, width, classes, groups=1, group_width=None, seed=seed)


def resnext50(image: int = 224, width: int = 64, classes: int = 1000, groups: int = 32, group_width: int = 4,
              seed: int = 0) -> onnx.ModelProto:
    """ResNeXt-50 32x4d: ResNet-50 whose bottleneck 3x3 is a grouped conv of ``groups`` groups,
    each ``group_width`` x 2^stage channels wide (128 ... 1024 channels in all)."""
    return _resnet("resnext50", image, width, classes, groups=groups, group_width=group_width, seed=seed)
