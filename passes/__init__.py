"""TVM integration: the Relax passes ``TasoOptimize`` (cost-based search) and ``ApplyRules``
(rules applied wherever they match), and the ``"taso"`` pipeline.

Installed as ``tvm_taso.passes``. Importing :mod:`tvm_taso` registers the pipeline, so
``tvm.compile(mod, target, relax_pipeline=relax.get_pipeline("taso"))`` works.
"""

from .apply_rules import ApplyRules
from .pipeline import register, taso_pipeline
from .taso_optimize import TasoOptimize

__all__ = ["ApplyRules", "TasoOptimize", "taso_pipeline", "register"]
