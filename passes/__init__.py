"""TVM integration: the Relax passes ``TasoOptimize`` (cost-based search) and ``ApplyRules``
(rules applied wherever they match), the ``"taso"`` pipeline, and the ``torch.compile``
backend ``"tvm_taso"`` (:class:`TasoBackend`).

Installed as ``tvm_taso.passes``. Importing :mod:`tvm_taso` registers the pipeline, so
``tvm.compile(mod, target, relax_pipeline=relax.get_pipeline("taso"))`` works.
"""

from .apply_rules import ApplyRules
from .pipeline import register, taso_pipeline
from .taso_optimize import TasoOptimize
from .torch_backend import TasoBackend

__all__ = ["ApplyRules", "TasoBackend", "TasoOptimize", "taso_pipeline", "register"]
