"""tvm-taso: TASO's verified graph substitutions and cost-based search, inside Apache TVM.

>>> import tvm_taso
>>> new_mod, report = tvm_taso.optimize(mod, target="cuda")      # a Relax IRModule
>>> model, report = tvm_taso.optimize(tvm_taso.load_onnx("m.onnx"), target="cuda")  # ONNX stays ONNX
>>> new_mod, report = tvm_taso.optimize(tvm_taso.from_torch(module, (x,)), target="cuda")  # PyTorch
>>> ex = tvm.compile(mod, target, relax_pipeline=relax.get_pipeline("taso"))
"""

from .cost import AnalyticCost, CostModel, Kernel, kernels
from .errors import InputError
from .io.onnx_export import ExportError
from .io.onnx_model import OnnxModel, export_onnx, load_onnx
from .io.torch_import import from_torch
from .driver import TasoSkippedWarning, optimize
from .rewrite.rule import Rule, RuleSyntaxError, default_rules, parse_rules
from .verify.admit import load_rules
from . import passes

passes.register()

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
