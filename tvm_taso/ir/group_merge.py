"""TASO's ``merge_gconv``, the op ``merge_groups`` of :mod:`tvm_taso.ir.ops`: the weight of a
grouped convolution widened so that the same convolution runs with fewer groups.

``merge_groups(w, groups=G, factor=k)`` takes an OIHW weight ``w`` of a conv with ``G`` groups
(``O`` output channels, ``I`` input channels per group) and returns the ``(O, k*I, kh, kw)``
weight of the conv with ``G/k`` groups that computes the same values: each new group joins
``k`` old ones, and output channel ``o`` (old group ``o // (O/G)``) keeps its kernel in input
block ``(o // (O/G)) % k`` and has zeros in the others, so the widened conv reads the other
groups' channels with zero weights. A weight-only op, folded to a constant after the search;
its Relax form (mask multiplies and a concat) is there for weights that are not constants.
"""

from __future__ import annotations

import numpy as np


def merged_shape(shape: tuple, groups: int, factor: int) -> tuple:
    """The widened weight's shape; ValueError unless ``shape`` is OIHW with ``O`` a multiple
    of ``groups`` and ``groups`` a multiple of ``factor``."""
    if len(shape) != 4:
        raise ValueError("merge_groups needs an OIHW weight")
    if groups < 1 or factor < 1 or groups % factor or shape[0] % groups:
        raise ValueError(f"merge_groups of {shape[0]} output channels: groups {groups}, factor {factor}")
    o, i, kh, kw = shape
    return (o, i * factor, kh, kw)


def _mask(o: int, groups: int, factor: int, dtype) -> np.ndarray:
    """``mask[j, o]`` is 1 where output channel ``o``'s kernel sits in input block ``j``."""
    block = (np.arange(o) // (o // groups)) % factor
    return (block[None, :] == np.arange(factor)[:, None]).astype(dtype)


def merge(w: np.ndarray, groups: int, factor: int) -> np.ndarray:
    merged_shape(w.shape, groups, factor)
    mask = _mask(w.shape[0], groups, factor, w.dtype)
    return np.concatenate([w * mask[j][:, None, None, None] for j in range(factor)], axis=1)


def build(w, groups: int, factor: int):
    """The same as Relax ops: one masked copy of ``w`` per input block, concatenated."""
    from tvm import relax

    o = int(w.ty.shape[0])
    dtype = str(w.ty.dtype)
    mask = _mask(o, groups, factor, dtype)
    parts = [relax.op.multiply(w, relax.const(mask[j].reshape(o, 1, 1, 1), dtype)) for j in range(factor)]
    return relax.op.concat(parts, axis=1)
