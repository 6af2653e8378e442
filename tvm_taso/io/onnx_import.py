"""``load_onnx``: an ONNX model to a Relax IRModule through TVM's ONNX frontend, with every way
an input can be unusable turned into one clear :class:`InputError` before TVM sees it."""

from __future__ import annotations

import logging
import warnings
from pathlib import Path

import onnx

log = logging.getLogger(__name__)


class InputError(ValueError):
    """A model or argument tvm-taso cannot use; the message says what and how to fix it."""


def read_model(model, name: str | None = None) -> tuple[onnx.ModelProto, str]:
    """(ModelProto, a name for messages) from a path or a ModelProto."""
    if isinstance(model, onnx.ModelProto):
        return model, name or model.graph.name or "<model>"
    path = Path(model)
    if not path.exists():
        raise InputError(f"{path}: no such file")
    if path.is_dir():
        raise InputError(f"{path}: is a directory, not an ONNX file")
    try:
        proto = onnx.load(str(path))
    except Exception as err:  # noqa: BLE001 - protobuf raises several types for bad bytes
        raise InputError(f"{path}: not a readable ONNX model (corrupt or truncated file: {err})") from None
    if not proto.graph.node and not proto.graph.output:
        raise InputError(f"{path}: not a readable ONNX model (no graph in the file)")
    return proto, str(path)


def parse_shape(text: str) -> tuple[str, tuple[int, ...]]:
    """``name=1x3x224x224`` (or ``name=1,3,224,224``) as (name, dims)."""
    name, sep, dims = text.partition("=")
    try:
        if not sep or not name:
            raise ValueError
        shape = tuple(int(d) for d in dims.replace(",", "x").split("x"))
        if any(d <= 0 for d in shape):
            raise ValueError
    except ValueError:
        raise InputError(f"--shape {text!r}: expected NAME=D1xD2x..., e.g. input=1x3x224x224") from None
    return name, shape


def input_shapes(proto: onnx.ModelProto, name: str, shapes: dict | None = None) -> dict[str, tuple[int, ...]]:
    """Static shapes of the graph's real inputs (initializers excluded), with ``shapes``
    overriding; InputError naming any input left with a dynamic dimension."""
    shapes = dict(shapes or {})
    inits = {i.name for i in proto.graph.initializer}
    real = [i for i in proto.graph.input if i.name not in inits]
    unknown = set(shapes) - {i.name for i in real}
    if unknown:
        raise InputError(
            f"{name}: no input named {', '.join(sorted(unknown))} (inputs: {', '.join(i.name for i in real)})"
        )
    result = {}
    for inp in real:
        dims = [d.dim_value if d.HasField("dim_value") and d.dim_value > 0 else (d.dim_param or "?")
                for d in inp.type.tensor_type.shape.dim]
        if inp.name in shapes:
            given = tuple(shapes[inp.name])
            if len(given) != len(dims) or any(isinstance(d, int) and d != g for d, g in zip(dims, given)):
                shown = "x".join(str(d) for d in dims)
                raise InputError(f"{name}: input {inp.name!r} has shape {shown}; --shape gave {'x'.join(map(str, given))}")
            result[inp.name] = given
        elif all(isinstance(d, int) for d in dims):
            result[inp.name] = tuple(dims)
        else:
            shown = "x".join(str(d) for d in dims)
            example = "x".join(str(d) if isinstance(d, int) else "1" for d in dims)
            raise InputError(
                f"{name}: input {inp.name!r} has dynamic dimensions ({shown}); give a static shape, "
                f"e.g. --shape {inp.name}={example}"
            )
    return result


def load_onnx(model, shapes: dict | None = None, keep_params_in_input: bool = False, name: str | None = None):
    """Import an ONNX model (path or ModelProto) as a Relax IRModule.

    Parameters
    ----------
    model : a path to an ``.onnx`` file or an ``onnx.ModelProto``.
    shapes : ``{input name: shape}`` for inputs with dynamic dimensions.
    keep_params_in_input : keep weights as function parameters instead of constants.
    name : what to call the model in messages (default its path or graph name).

    Raises :class:`InputError` for a missing, corrupt or invalid file, an op TVM's ONNX frontend
    cannot import (named, with its node), or an input whose shape is not static.
    """
    from tvm.relax.frontend.onnx import from_onnx
    from tvm.relax.frontend.onnx.onnx_frontend import _get_convert_map

    proto, name = read_model(model, name)
    try:
        onnx.checker.check_model(proto)
    except onnx.checker.ValidationError as err:
        first = str(err).strip().splitlines()[0]
        raise InputError(f"{name}: invalid ONNX model: {first}") from None
    known = _get_convert_map()
    for node in proto.graph.node:
        if node.domain not in ("", "ai.onnx") or node.op_type not in known:
            where = f"node {node.name!r}" if node.name else f"a node with outputs {list(node.output)}"
            domain = f" (domain {node.domain})" if node.domain not in ("", "ai.onnx") else ""
            raise InputError(f"{name}: ONNX op {node.op_type}{domain} at {where} cannot be imported by TVM's ONNX frontend")
    shape_dict = {k: list(v) for k, v in input_shapes(proto, name, shapes).items()}
    try:
        with warnings.catch_warnings():
            warnings.simplefilter("ignore")
            return from_onnx(proto, shape_dict=shape_dict, keep_params_in_input=keep_params_in_input)
    except Exception as err:  # noqa: BLE001 - the frontend raises many types
        first = (str(err).strip().splitlines() or [type(err).__name__])[0]
        raise InputError(f"{name}: TVM's ONNX frontend could not import the model: {first}") from None
