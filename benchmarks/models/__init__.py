"""The benchmark models, TASO's workloads as ONNX built node by node (no downloads).

``MODELS`` maps each model's name to its builder; ``QUICK_SIZES`` holds the keyword arguments
of a tiny version of each (built and optimized in seconds, for tests and ``--quick``);
``build(name, quick)`` returns the checked :class:`onnx.ModelProto`.
"""

from __future__ import annotations

import onnx

from . import bert, inception, nasnet, nasrnn, resnet, squeezenet, vgg

MODELS = {
    "resnet50": resnet.resnet50,
    "resnext50": resnet.resnext50,
    "inception-v3": inception.inception_v3,
    "squeezenet1.1": squeezenet.squeezenet1_1,
    "vgg19": vgg.vgg19,
    "nasnet-a": nasnet.nasnet_a,
    "nasrnn": nasrnn.nasrnn,
    "bert-base": bert.bert_base,
}

QUICK_SIZES = {
    "resnet50": {"image": 32, "width": 8, "classes": 10},
    "resnext50": {"image": 32, "width": 8, "classes": 10, "groups": 4, "group_width": 2},
    "inception-v3": {"image": 75, "width": 0.125, "classes": 10},
    "squeezenet1.1": {"image": 64, "width": 0.25, "classes": 10},
    "vgg19": {"image": 32, "width": 0.0625, "classes": 10},
    "nasnet-a": {"image": 32, "channels": 8, "cells": 1, "classes": 10},
    "nasrnn": {"hidden": 16, "steps": 3},
    "bert-base": {"layers": 2, "seq": 16, "hidden": 64, "heads": 4, "ffn": 256, "vocab": 1000, "max_positions": 64},
}


def build(name: str, quick: bool = False, **overrides) -> onnx.ModelProto:
    """Model ``name`` at full size (or its tiny version with ``quick``), batch 1."""
    if name not in MODELS:
        raise KeyError(f"unknown model {name!r}; choose from {', '.join(MODELS)}")
    kwargs = dict(QUICK_SIZES[name]) if quick else {}
    kwargs.update(overrides)
    return MODELS[name](**kwargs)
