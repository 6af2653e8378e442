"""tvm-taso: TASO's verified graph substitutions and cost-based search, inside Apache TVM.

>>> import tvm_taso
>>> new_mod, report = tvm_taso.optimize(mod, target="cuda")
>>> ex = tvm.compile(mod, target, relax_pipeline=relax.get_pipeline("taso"))
"""

from .cost import AnalyticCost, CostModel, Kernel, kernels
from .optimize import TasoSkippedWarning, optimize
from .rule import Rule, RuleSyntaxError, default_rules, load_rules, parse_rules
from . import passes

passes.register()

__version__ = "0.1.0"

__all__ = [
    "AnalyticCost",
    "CostModel",
    "Kernel",
    "Rule",
    "RuleSyntaxError",
    "TasoSkippedWarning",
    "default_rules",
    "kernels",
    "load_rules",
    "optimize",
    "parse_rules",
    "passes",
]
