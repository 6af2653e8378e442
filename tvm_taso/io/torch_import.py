"""PyTorch in: a ``torch.nn.Module`` as a Relax ``IRModule`` through ``torch.export`` and TVM's
PyTorch frontend (``tvm.relax.frontend.torch.from_exported_program``), ready for
:func:`tvm_taso.optimize`, ``TasoOptimize`` or ``tvm.compile``. PyTorch is an optional extra."""

from __future__ import annotations

import re

from tvm_taso.errors import InputError, first_line
from tvm_taso.files import read_regular_file

PROGRAM_BYTES = 8 << 30  # a .pt2 is read whole (its weights too) before torch loads it


def require_torch():
    """The ``torch`` module, or one :class:`InputError` line saying how to install it."""
    try:
        import torch
    except ImportError:
        raise InputError("PyTorch models need torch: pip install 'tvm-taso[torch]'") from None
    return torch


def from_torch(module, example_args, dynamic_shapes=None, keep_params_as_input: bool = False):
    """``module`` (in eval mode, exported with ``torch.export`` on ``example_args``, a tuple of
    tensors, and ``dynamic_shapes`` as ``torch.export`` takes them) as a Relax ``IRModule``.

    Weights are constants of the module by default (what the search folds and merges); with
    ``keep_params_as_input`` they are parameters of ``main`` after its inputs, as TVM's frontend
    makes them. A module ``torch.export`` or the frontend cannot take is one :class:`InputError`
    line naming which and why."""
    torch = require_torch()
    args = tuple(example_args) if isinstance(example_args, (list, tuple)) else (example_args,)
    module = module.eval()
    try:
        with torch.no_grad():
            program = torch.export.export(module, args, dynamic_shapes=dynamic_shapes)
    except Exception as err:  # noqa: BLE001 - torch.export raises many types
        raise InputError(f"torch.export could not export {type(module).__name__}: {first_line(err)}") from None
    return import_program(program, type(module).__name__, keep_params_as_input)


def import_program(program, name: str, keep_params_as_input: bool = False):
    """A ``torch.export`` program as a Relax ``IRModule`` through TVM's PyTorch frontend; one
    :class:`InputError` line when the frontend cannot take it."""
    from tvm.relax.frontend.torch import from_exported_program

    _drop_empty_concat_operands(program)
    try:
        return from_exported_program(program, keep_params_as_input=keep_params_as_input)
    except Exception as err:  # noqa: BLE001 - the frontend raises many types
        raise InputError(f"TVM's PyTorch frontend could not import {name}: {first_line(err)}") from None


def _drop_empty_concat_operands(program) -> None:
    """Leave out of each ``aten.cat`` the empty 1-D operands PyTorch skips (``torch.cat`` of a
    ``(0,)`` tensor with 4-D ones is the 4-D ones), in place: a key/value cache that starts
    empty (transformers' ``DynamicCache``, ``use_cache=True``) concatenates onto one, and TVM's
    frontend refuses operands of different ranks."""
    import torch

    graph, changed = program.graph_module.graph, False
    for node in list(graph.nodes):
        if node.op != "call_function" or node.target is not torch.ops.aten.cat.default:
            continue
        operands = list(node.args[0])
        shapes = [getattr(a.meta.get("val"), "shape", None) if isinstance(a, torch.fx.Node) else None
                  for a in operands]
        empty = [k for k, shape in enumerate(shapes) if shape is not None and tuple(shape) == (0,)]
        if not empty or len(empty) == len(operands) or any(shape is None for shape in shapes):
            continue
        kept = [a for k, a in enumerate(operands) if k not in empty]
        if len(kept) == 1:
            node.replace_all_uses_with(kept[0])
            graph.erase_node(node)
        else:
            node.args = (kept,) + tuple(node.args[1:])
        changed = True
    if changed:
        program.graph_module.recompile()


def load_program(path, trust_pickle: bool = False):
    """The ``torch.export`` program saved at ``path`` (``torch.export.save``, a ``.pt2`` file);
    one :class:`InputError` line when it is not one.

    ``torch.export.load`` unpickles with ``weights_only=False`` whatever the archive marks as
    pickled (tensor subclasses, custom and opaque objects, sample inputs the restricted
    unpickler refuses) and loads AOTInductor libraries: a crafted file runs its code on
    loading. Unless ``trust_pickle``, an archive holding anything but tensors stored raw, JSON
    and sample inputs that load with ``weights_only=True`` is refused before torch reads it."""
    import io
    from pathlib import Path

    torch = require_torch()
    data = read_regular_file(Path(path), PROGRAM_BYTES, "a saved torch.export program (.pt2)")
    if not trust_pickle:
        unsafe = _code_running_entry(data, torch)
        if unsafe:
            raise InputError(f"{path}: refused: loading it would run code from the file ({unsafe}); "
                             "if you trust its author, pass --trust-pickle (trust_pickle=True)")
    try:
        return torch.export.load(io.BytesIO(data))
    except Exception as err:  # noqa: BLE001 - torch.export.load raises many types
        raise InputError(f"{path}: not a saved torch.export program ({first_line(err)})") from None


# What torch.export.save writes that loading never unpickles (paths below the archive's root
# folder): the format markers, the programs as JSON, their payload configs, raw tensor bytes,
# sample inputs (checked apart) and extra files (read as text).
_DATA_ENTRIES = re.compile(r"archive_format|archive_version|byteorder|\.data/version|\.data/serialization_id"
                           r"|models/[^/]+\.json|data/(weights|constants)/[^/]+_(weights|constants)_config\.json"
                           r"|data/weights/weight_\d+|data/constants/tensor_\d+|data/sample_inputs/[^/]+\.pt|extra/.+")


def _code_running_entry(data: bytes, torch) -> str | None:
    """What in the ``.pt2`` archive ``data`` would make ``torch.export.load`` run code from it,
    in words, or None when nothing would."""
    import io
    import json
    import zipfile

    try:
        archive = zipfile.ZipFile(io.BytesIO(data))
        names = archive.namelist()
    except (zipfile.BadZipFile, ValueError):
        return None  # torch cannot read it either, and says so
    roots = {name.split("/", 1)[0] for name in names}
    if len(roots) != 1 or any("/" not in name for name in names):
        return "entries outside one archive folder (an older format loaded with pickle)"
    entries = {name.split("/", 1)[1]: name for name in names if not name.endswith("/")}
    if entries.get("archive_format") is None or archive.read(entries["archive_format"]) != b"pt2":
        return "no pt2 archive_format marker (an older format loaded with pickle)"
    for entry, name in sorted(entries.items()):
        if not _DATA_ENTRIES.fullmatch(entry):
            return f"entry {entry}: not tensor data or JSON"
        if entry.endswith("_config.json"):
            try:
                config = json.loads(archive.read(name))["config"]
                raw = ("weight_", "tensor_")  # tensors stored as bytes; custom_obj_ and opaque_obj_ are pickles
                pickled = [fqn for fqn, meta in config.items()
                           if meta.get("use_pickle") or not str(meta.get("path_name", "")).startswith(raw)]
            except (ValueError, KeyError, TypeError, AttributeError):
                return f"entry {entry}: not a payload config"
            if pickled:
                return f"{pickled[0]} is stored pickled"
        elif entry.startswith("data/sample_inputs/"):
            try:
                torch.load(io.BytesIO(archive.read(name)), weights_only=True)
            except Exception as err:  # noqa: BLE001 - the restricted unpickler raises many types
                return f"its sample inputs need a full unpickler: {first_line(err)}"
    return None


def is_program_path(path) -> bool:
    """Whether ``path`` names a saved ``torch.export`` program (by its ``.pt2`` suffix)."""
    return str(path).lower().endswith(".pt2")
