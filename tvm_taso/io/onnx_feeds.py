"""Inputs to run an ONNX model on: random arrays by name at the priced sizes, integer inputs
kept below the size of the tables they index (used by ``--check`` and by timing in onnxruntime)."""

from __future__ import annotations

import numpy as np

# Ops an integer input passes through unchanged in value on its way to an index (a Gather's).
_VALUE_PRESERVING = ("Cast", "Unsqueeze", "Squeeze", "Reshape", "Flatten", "Expand", "Identity")
DEFAULT_INT_RANGE = (0, 10)  # an integer input no index tells us about (a mask, a count)
MASK_RANGE = (0, 2)  # an input summed into positions (CumSum) is a 0/1 mask


def random_feeds(model, dims: dict, ranges: dict, seed: int = 0) -> dict[str, np.ndarray]:
    """Random arrays for ``model``'s real inputs, by name, with symbolic dimensions at ``dims``:
    floats standard normal, booleans half true, integers in ``ranges[name]`` (low, high)."""
    from onnx import helper

    from tvm_taso.io.onnx_import import real_inputs, tensor_type_of

    rng = np.random.default_rng(seed)
    shapes = model.shapes(dims)
    feeds = {}
    for inp in real_inputs(model.structure):
        if inp.name not in shapes:
            continue
        dtype = np.dtype(helper.tensor_dtype_to_np_dtype(tensor_type_of(inp).elem_type))
        shape = shapes[inp.name]
        if dtype.kind == "f":
            feeds[inp.name] = rng.standard_normal(shape).astype(dtype)
        elif dtype.kind == "b":
            feeds[inp.name] = np.asarray(rng.random(shape) < 0.5)  # rank 0: an array, not a numpy.bool
        else:
            low, high = ranges.get(inp.name, DEFAULT_INT_RANGE)
            feeds[inp.name] = rng.integers(low, high, size=shape).astype(dtype)
    return feeds


def integer_ranges(model) -> dict[str, tuple[int, int]]:
    """``{input: (low, high)}`` for integer inputs that reach the indices of a Gather (through
    casts and reshapes): ``[0, rows)`` of the smallest table indexed, as the graph gives it; and
    for those summed by a CumSum, 0 or 1: an attention mask that positions are counted from (OPT
    indexes its position table with the running sum of its mask, which a mask of 2s overruns)."""
    consumers: dict[str, list] = {}
    for node in model.structure.graph.node:
        for k, name in enumerate(node.input):
            consumers.setdefault(name, []).append((node, k))
    result = {}
    for inp in model.structure.graph.input:
        bound, stack, seen = None, [inp.name], set()
        while stack:
            name = stack.pop()
            if name in seen:
                continue
            seen.add(name)
            for node, k in consumers.get(name, []):
                if node.op_type in _VALUE_PRESERVING and k == 0:
                    stack.extend(node.output)
                elif node.op_type == "CumSum" and k == 0:
                    bound = MASK_RANGE[1] if bound is None else min(bound, MASK_RANGE[1])
                elif node.op_type in ("Gather", "GatherElements") and k == 1:
                    axis = next((a.i for a in node.attribute if a.name == "axis"), 0)
                    shape = (model.types.get(node.input[0]) or (0, None))[1]
                    if shape and -len(shape) <= axis < len(shape) and shape[axis]:
                        rows = shape[axis]
                        bound = rows if bound is None else min(bound, rows)
        if bound:
            result[inp.name] = (0, bound)
    return result
