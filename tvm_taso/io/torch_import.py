"""PyTorch in: a ``torch.nn.Module`` as a Relax ``IRModule`` through ``torch.export`` and TVM's
PyTorch frontend (``tvm.relax.frontend.torch.from_exported_program``), ready for
:func:`tvm_taso.optimize`, ``TasoOptimize`` or ``tvm.compile``. PyTorch is an optional extra."""

from __future__ import annotations

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

    try:
        return from_exported_program(program, keep_params_as_input=keep_params_as_input)
    except Exception as err:  # noqa: BLE001 - the frontend raises many types
        raise InputError(f"TVM's PyTorch frontend could not import {name}: {first_line(err)}") from None


def load_program(path):
    """The ``torch.export`` program saved at ``path`` (``torch.export.save``, a ``.pt2`` file);
    one :class:`InputError` line when it is not one."""
    import io
    from pathlib import Path

    torch = require_torch()
    data = read_regular_file(Path(path), PROGRAM_BYTES, "a saved torch.export program (.pt2)")
    try:
        return torch.export.load(io.BytesIO(data))
    except Exception as err:  # noqa: BLE001 - torch.export.load raises many types
        raise InputError(f"{path}: not a saved torch.export program ({first_line(err)})") from None


def is_program_path(path) -> bool:
    """Whether ``path`` names a saved ``torch.export`` program (by its ``.pt2`` suffix)."""
    return str(path).lower().endswith(".pt2")
