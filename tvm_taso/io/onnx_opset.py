"""How each ONNX opset spells the ops whose form changed between opsets.

The two ONNX writers, :mod:`.onnx_ops` (engine nodes written into a user's model, at that
model's opset) and :mod:`.onnx_export` (a Relax module written at the opset asked for), and the
readers of :mod:`.onnx_ops` all ask this module, so that each change is recorded once: the opset
that brought it (the ``*_SINCE`` data below, from the ONNX operator changelog) and, for an operand
that moved from an attribute to an input, a helper giving its :class:`Spelling` at an opset. The
writers make the constants of a spelling themselves, as each names its initializers its own way.

Changes that came before the exporter's lowest opset (:data:`LAYER_NORMALIZATION_OP_SINCE`), in
ops that only the exporter writes (Clip's bounds, Unsqueeze's axes and Slice's starts as inputs),
have no entry: every opset it writes has the new form.
"""

from __future__ import annotations

from typing import NamedTuple

import numpy as np

PAD_INPUTS_SINCE = 11  # Pad's pads and constant value are inputs, no longer attributes
SOFTMAX_ONE_AXIS_SINCE = 13  # Softmax normalizes along `axis` alone (default -1), no longer over
#                              the flattened axes from `axis` on (default 1)
SPLIT_SIZES_INPUT_SINCE = 13  # Split's sizes are an input, no longer the `split` attribute
SPLIT_NUM_OUTPUTS_SINCE = 18  # Split without sizes needs `num_outputs` (before: as many as outputs)
LAYER_NORMALIZATION_OP_SINCE = 17  # LayerNormalization is an op
GELU_OP_SINCE = 20  # Gelu is an op; before, it is written as the arithmetic of its formula
# the Reduce ops' axes are an input, no longer an attribute (ReduceSum went first)
REDUCE_AXES_INPUT_SINCE = {"ReduceSum": 13, "ReduceMean": 18, "ReduceMax": 18, "ReduceMin": 18, "ReduceProd": 18}
POOL_DILATIONS_SINCE = {"MaxPool": 10, "AveragePool": 19}  # the pool has a `dilations` attribute


class Spelling(NamedTuple):
    """How an opset takes some operands of an op: as constant inputs, or as attributes."""

    inputs: list[np.ndarray]  # constants that follow the op's tensor operands, in input order
    attributes: dict[str, object]


def has_gelu(opset: int) -> bool:
    return opset >= GELU_OP_SINCE


def has_layer_normalization(opset: int) -> bool:
    return opset >= LAYER_NORMALIZATION_OP_SINCE


def has_pool_dilations(opset: int, op_type: str) -> bool:
    """Can ``op_type`` (MaxPool or AveragePool) be dilated at ``opset``?"""
    return opset >= POOL_DILATIONS_SINCE[op_type]


def softmax_default_axis(opset: int) -> int:
    return -1 if opset >= SOFTMAX_ONE_AXIS_SINCE else 1


def softmax_over_axis(opset: int, axis: int, rank: int) -> bool:
    """Does Softmax at ``opset`` with attribute ``axis`` normalize along that axis alone? Before
    :data:`SOFTMAX_ONE_AXIS_SINCE` it does only for the last axis, ``rank - 1``: the one flattened
    tail that is a single axis."""
    return opset >= SOFTMAX_ONE_AXIS_SINCE or axis == rank - 1


def pad_takes_inputs(opset: int) -> bool:
    return opset >= PAD_INPUTS_SINCE


def pad(opset: int, begins, ends, value, dtype) -> Spelling:
    """Pad's pads (``begins`` then ``ends``, one per axis) and constant ``value`` (of ``dtype``
    as an input; None for a mode without one) at ``opset``."""
    pads = [int(p) for p in begins] + [int(p) for p in ends]
    if pad_takes_inputs(opset):
        inputs = [np.asarray(pads, np.int64)]
        if value is not None:
            inputs.append(np.asarray(value, dtype))
        return Spelling(inputs, {})
    return Spelling([], {"pads": pads} if value is None else {"pads": pads, "value": float(value)})


def split(opset: int, sizes) -> Spelling:
    """Split's output ``sizes`` along its axis at ``opset``; ``sizes`` an int: that many equal
    parts (sizes of a symbolic dimension: none is written, the dimension is divided evenly)."""
    if isinstance(sizes, int):
        return Spelling([], {"num_outputs": sizes} if opset >= SPLIT_NUM_OUTPUTS_SINCE else {})
    if opset >= SPLIT_SIZES_INPUT_SINCE:
        return Spelling([np.asarray(sizes, np.int64)], {})
    return Spelling([], {"split": [int(s) for s in sizes]})


def reduce_axes(opset: int, op_type: str, axes) -> Spelling:
    """The ``axes`` of the Reduce op ``op_type`` at ``opset``."""
    axes = [int(a) for a in axes]
    if opset >= REDUCE_AXES_INPUT_SINCE[op_type]:
        return Spelling([np.asarray(axes, np.int64)], {})
    return Spelling([], {"axes": axes})
