"""Reading ONNX input: ``read_model`` (a path or proto, every way a file can be unusable one
clear :class:`InputError`), the sizes of symbolic dimensions (``bind_dims``), and
``import_relax``, the model as a Relax IRModule through TVM's ONNX frontend."""

from __future__ import annotations

import logging
import warnings
from pathlib import Path

import onnx

from tvm_taso.errors import InputError, first_line
from tvm_taso.files import contained_data_file, open_regular_file, read_regular_file
from tvm_taso.io import onnx_tensors


log = logging.getLogger(__name__)


MAX_MODEL_BYTES = 2**31  # protobuf's limit for one message (larger weights live in external data)
_warned_opsets: set[tuple[str, int]] = set()  # (model, opset) already warned about, once per run


def read_model(model, name: str | None = None, data_files: list | None = None) -> tuple[onnx.ModelProto, str]:
    """(ModelProto, a name for messages) from a path or a ModelProto.

    A path must name a regular file (a device such as ``/dev/zero``, a FIFO or a socket would be
    read forever or block) of at most :data:`MAX_MODEL_BYTES`; external data files beside it are
    loaded (and their paths appended to ``data_files`` when given). An opset newer than the
    installed ``onnx`` knows is said in one warning.
    """
    if isinstance(model, onnx.ModelProto):
        name = name or model.graph.name or "<model>"
        return _opset_checked(model, name), name
    path = Path(model)
    proto = _parse(path, data_files)
    try:
        onnx.external_data_helper.load_external_data_for_model(proto, str(path.parent))
    except Exception as err:  # noqa: BLE001 - a missing or short data file
        raise InputError(f"{path}: not a readable ONNX model (its external data: {err})") from None
    return _opset_checked(proto, str(path)), str(path)


def read_detached(path, data_files: list | None = None) -> tuple[onnx.ModelProto, onnx_tensors.TensorStore, str]:
    """:func:`read_model` of a path, its large initializers held outside the message
    (:func:`tvm_taso.io.onnx_tensors.detach`: external data files are mapped, not read):
    (message, store, name)."""
    path = Path(path)
    with open_regular_file(path, MAX_MODEL_BYTES, "an ONNX file", " (keep large weights as external data)") as f:
        try:
            proto, held = onnx_tensors.parse_detached(f, path)
        except Exception as err:  # noqa: BLE001 - protobuf raises several types for bad bytes
            raise InputError(f"{path}: not a readable ONNX model (corrupt or truncated file: {err})") from None
    _read_checked(proto, path, data_files)
    try:
        structure, store = onnx_tensors.detach(proto, path.parent, held)
    except (OSError, ValueError) as err:  # a short data file, read for a small tensor
        raise InputError(f"{path}: not a readable ONNX model (its external data: {err})") from None
    del proto
    if store.short_files():
        raise InputError(f"{path}: not a readable ONNX model (its external data: {store.short_files()[0]} is "
                         "shorter than its tensors say)")
    return _opset_checked(structure, str(path)), store, str(path)


def _parse(path: Path, data_files: list | None) -> onnx.ModelProto:
    data = _read_regular_file(path)
    try:
        proto = onnx.load_model_from_string(data)
    except Exception as err:  # noqa: BLE001 - protobuf raises several types for bad bytes
        raise InputError(f"{path}: not a readable ONNX model (corrupt or truncated file: {err})") from None
    del data
    _read_checked(proto, path, data_files)
    return proto


def _read_checked(proto: onnx.ModelProto, path: Path, data_files: list | None) -> None:
    """A model just parsed from ``path``: one with no graph is refused, and so is one whose
    external data would be read from outside its folder (:func:`contained_data_file`); the
    data files go to ``data_files`` when given."""
    if not proto.graph.node and not proto.graph.output:
        raise InputError(f"{path}: not a readable ONNX model (no graph in the file)")
    files = sorted({contained_data_file(path.parent, location, str(path))
                    for location in _external_locations(proto.graph)})
    if data_files is not None:
        data_files.extend(files)


def _opset_checked(proto: onnx.ModelProto, name: str) -> onnx.ModelProto:
    """``proto``, an opset newer than the installed ``onnx`` knows said in one warning."""
    known = onnx.defs.onnx_opset_version()
    for opset in proto.opset_import:
        if opset.domain in ("", "ai.onnx") and opset.version > known and (name, opset.version) not in _warned_opsets:
            _warned_opsets.add((name, opset.version))
            log.warning("%s: opset %d is newer than the installed onnx package knows (%d): ops whose meaning "
                        "changed after opset %d may be imported wrongly; upgrade onnx, or check the result "
                        "with --check", name, opset.version, known, known)
    return proto


def _external_locations(graph) -> set[str]:
    """The external data files the tensors of ``graph`` (its subgraphs included) are stored in."""
    found = set()
    tensors = list(graph.initializer)
    for node in graph.node:
        for attr in node.attribute:
            tensors += [attr.t] if attr.HasField("t") else []
            tensors += list(attr.tensors)
            for sub in ([attr.g] if attr.HasField("g") else []) + list(attr.graphs):
                found |= _external_locations(sub)
    for tensor in tensors:  # (tensors this process holds apart name no file)
        found |= {entry.value for entry in tensor.external_data
                  if entry.key == "location" and not entry.value.startswith(onnx_tensors.PREFIX)}
    return found


def _read_regular_file(path: Path) -> bytes:
    """The bytes of ``path``: a regular file within protobuf's 2 GiB (InputError otherwise)."""
    return read_regular_file(path, MAX_MODEL_BYTES, "an ONNX file", " (keep large weights as external data)")


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
    if any(d >= 2**63 for d in shape):
        raise InputError(f"--shape {text!r}: a size must be below 2^63 (an int64)")
    return name, shape


def _symbol(inp, axis: int, dim) -> str:
    """The name a dynamic dimension is bound by: its ``dim_param``, else ``input[axis]``."""
    return dim.dim_param or f"{inp.name}[{axis}]"


def bind_dims(proto: onnx.ModelProto, name: str, shapes: dict | None = None, default=None) -> dict[str, int]:
    """Sizes of the symbolic dimensions of the graph's real inputs (initializers excluded):
    ``{dim_param (or "input[axis]"): size}`` read from ``shapes`` (``{input name: shape}``).

    A dimension ``shapes`` leaves unbound gets ``default(symbol, axis)``; with ``default=None`` it is an
    InputError that names the input and shows a ``--shape`` to give. An unknown input name, a
    shape of the wrong rank, one that contradicts a static dimension, or two shapes giving one
    symbol different sizes are InputErrors too.
    """
    shapes = dict(shapes or {})
    real = real_inputs(proto)
    unknown = set(shapes) - {i.name for i in real}
    if unknown:
        raise InputError(
            f"{name}: no input named {', '.join(sorted(unknown))} (inputs: {', '.join(i.name for i in real)})"
        )
    bound: dict[str, int] = {}
    unbound: list = []
    for inp in real:
        if tensor_type_of(inp) is None:
            continue  # a sequence or a map: no dimensions to bind
        dims = list(tensor_type_of(inp).shape.dim)
        shown = "x".join(str(d.dim_value) if _static(d) else (d.dim_param or "?") for d in dims)
        if any(d.HasField("dim_value") and d.dim_value == 0 for d in dims):  # static but empty, not dynamic
            shown = "x".join(str(d.dim_value) if d.HasField("dim_value") else (d.dim_param or "?") for d in dims)
            raise InputError(f"{name}: input {inp.name!r} has a zero-size dimension ({shown}): an empty "
                             "tensor leaves nothing to optimize; export the model with non-empty inputs")
        if inp.name in shapes:
            given = tuple(shapes[inp.name])
            if len(given) != len(dims) or any(_static(d) and d.dim_value != g for d, g in zip(dims, given)):
                raise InputError(f"{name}: input {inp.name!r} has shape {shown}; --shape gave {'x'.join(map(str, given))}")
            for axis, (d, g) in enumerate(zip(dims, given)):
                if not _static(d):
                    symbol = _symbol(inp, axis, d)
                    if bound.setdefault(symbol, g) != g:
                        raise InputError(f"{name}: --shape gives dimension {symbol!r} two sizes ({bound[symbol]} and {g})")
            continue
        for axis, d in enumerate(dims):
            if not _static(d):
                unbound.append((inp, axis, d, shown))
    for inp, axis, d, shown in unbound:
        symbol = _symbol(inp, axis, d)
        if symbol in bound:
            continue
        if default is None:
            example = "x".join(str(x.dim_value) if _static(x) else "1" for x in tensor_type_of(inp).shape.dim)
            raise InputError(
                f"{name}: input {inp.name!r} has dynamic dimensions ({shown}); give a static shape, "
                f"e.g. --shape {inp.name}={example}"
            )
        bound[symbol] = default(symbol, axis)
    return bound


def _static(dim) -> bool:
    return dim.HasField("dim_value") and dim.dim_value > 0


def tensor_type_of(value_info):
    """The tensor type of a graph input that is a tensor or an optional tensor (fed a tensor
    either way), else None (a sequence, a map)."""
    ty = value_info.type
    if ty.HasField("tensor_type"):
        return ty.tensor_type
    if ty.HasField("optional_type") and ty.optional_type.elem_type.HasField("tensor_type"):
        return ty.optional_type.elem_type.tensor_type
    return None


def real_inputs(proto: onnx.ModelProto) -> list:
    """The graph inputs a caller feeds: those without an initializer of the same name."""
    inits = {i.name for i in proto.graph.initializer}
    return [i for i in proto.graph.input if i.name not in inits]


def input_symbols(proto: onnx.ModelProto) -> dict[str, tuple]:
    """The shapes of the real inputs with each symbolic dimension as the name it is bound by
    (:func:`bind_dims`), static ones as ints."""
    return {inp.name: tuple(d.dim_value if _static(d) else _symbol(inp, axis, d)
                            for axis, d in enumerate(tensor_type_of(inp).shape.dim))
            for inp in real_inputs(proto) if tensor_type_of(inp) is not None}


def input_shapes(proto: onnx.ModelProto, dims: dict[str, int]) -> dict[str, tuple[int, ...]]:
    """Static shapes of the real inputs with the symbolic dimensions at the sizes ``dims``."""
    result = {}
    for inp in real_inputs(proto):
        if tensor_type_of(inp) is None:
            continue
        result[inp.name] = tuple(
            d.dim_value if _static(d) else dims[_symbol(inp, axis, d)]
            for axis, d in enumerate(tensor_type_of(inp).shape.dim)
        )
    return result


def import_relax(model, shapes: dict | None = None, keep_params_in_input: bool = False, name: str | None = None):
    """Import an ONNX model (path or ModelProto) as a Relax IRModule through TVM's ONNX frontend
    (the TVM path: ``tvm-taso compile``, ``bench``; :func:`tvm_taso.load_onnx` keeps the model as ONNX).

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
    shape_dict = {k: list(v) for k, v in input_shapes(proto, bind_dims(proto, name, shapes)).items()}
    try:
        with warnings.catch_warnings():
            warnings.simplefilter("ignore")
            return from_onnx(proto, shape_dict=shape_dict, keep_params_in_input=keep_params_in_input)
    except Exception as err:  # noqa: BLE001 - the frontend raises many types
        first = first_line(err)
        raise InputError(f"{name}: TVM's ONNX frontend could not import the model: {first}") from None
