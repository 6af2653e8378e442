"""tvm-taso: TASO's verified graph substitutions and cost-based search, inside Apache TVM.

>>> import tvm_taso
>>> new_mod, report = tvm_taso.optimize(mod, target="cuda")      # a Relax IRModule
>>> model, report = tvm_taso.optimize(tvm_taso.load_onnx("m.onnx"), target="cuda")  # ONNX stays ONNX
>>> new_mod, report = tvm_taso.optimize(tvm_taso.from_torch(module, (x,)), target="cuda")  # PyTorch
>>> ex = tvm.compile(mod, target, relax_pipeline=relax.get_pipeline("taso"))
"""

import os as _os
import sys as _sys


def _import_tvm_without_torch() -> None:
    """In the ``tvm-taso`` command, import TVM without the torch import tvm_ffi makes whenever
    torch is installed (a workaround for Windows): a second of every command's start. Commands
    that read a PyTorch program import torch themselves, later. A library user's process is
    left as it is."""
    argv = getattr(_sys, "orig_argv", _sys.argv)
    command = _os.path.basename(_sys.argv[0]) == "tvm-taso" or any(
        a == "-m" and b.startswith("tvm_taso.cli") for a, b in zip(argv, argv[1:]))
    if not command or "tvm" in _sys.modules or "torch" in _sys.modules:
        return
    _sys.modules["torch"] = None
    try:
        import tvm  # noqa: F401
    finally:
        del _sys.modules["torch"]


_import_tvm_without_torch()

from .cost import AnalyticCost, CostModel, Kernel, kernels
from .errors import InputError
from .io.onnx_export import ExportError
from .io.onnx_model import OnnxModel, export_onnx, load_onnx
from .io.torch_import import from_torch
from .driver import TasoSkippedWarning, optimize
from .rewrite.rule import Rule, RuleSyntaxError, default_rules, parse_rules
from .verify.admit import load_rules
from . import blas, passes

passes.register()
blas.register()  # a module built with the BLAS calls it by name (tvm_taso.blas)

__version__ = "0.1.0"

__all__ = [
    "AnalyticCost",
    "ExportError",
    "InputError",
    "CostModel",
    "Kernel",
    "OnnxModel",
    "Rule",
    "RuleSyntaxError",
    "TasoSkippedWarning",
    "default_rules",
    "export_onnx",
    "load_onnx",
    "kernels",
    "load_rules",
    "optimize",
    "parse_rules",
    "passes",
]
