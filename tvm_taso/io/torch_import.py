"""PyTorch in: a ``torch.nn.Module`` as a Relax ``IRModule`` through ``torch.export`` and TVM's
PyTorch frontend (``tvm.relax.frontend.torch.from_exported_program``), ready for
:func:`tvm_taso.optimize`, ``TasoOptimize`` or ``tvm.compile``. PyTorch is an optional extra."""

from __future__ import annotations

from tvm_taso.errors import InputError


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
    from tvm.relax.frontend.torch import from_exported_program

    args = tuple(example_args) if isinstance(example_args, (list, tuple)) else (example_args,)
    module = module.eval()
    try:
        with torch.no_grad():
            program = torch.export.export(module, args, dynamic_shapes=dynamic_shapes)
    except Exception as err:  # noqa: BLE001 - torch.export raises many types
        raise InputError(f"torch.export could not export {type(module).__name__}: {_first_line(err)}") from None
    try:
        return from_exported_program(program, keep_params_as_input=keep_params_as_input)
    except Exception as err:  # noqa: BLE001 - the frontend raises many types
        raise InputError(f"TVM's PyTorch frontend could not import {type(module).__name__}: {_first_line(err)}") \
            from None


def _first_line(err) -> str:
    return (str(err).strip().splitlines() or [type(err).__name__])[0]
