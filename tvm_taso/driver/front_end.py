"""What ``optimize`` asks of a model, whatever its kind: the :class:`FrontEnd` protocol, one
implementation per kind (Relax, :class:`~tvm_taso.driver.relax.RelaxFrontEnd`; ONNX,
:class:`~tvm_taso.driver.onnx.OnnxFrontEnd`; a ``torch.export`` program arrives as Relax), and
:func:`front_end_for`, the one place that tells the kinds apart."""

from __future__ import annotations

from typing import Protocol

from tvm_taso.driver.block import Result, SearchRun
from tvm_taso.driver.onnx import OnnxFrontEnd
from tvm_taso.driver.relax import RelaxFrontEnd
from tvm_taso.driver.report import Report
from tvm_taso.io.onnx_model import OnnxModel


class FrontEnd(Protocol):
    """A model of one kind: read, searched and written back, guarded, its kernels counted."""

    model: object
    opset: int | None  # the ONNX opset a region judge writes regions at (None: regions as Relax)

    def check(self, target, sizes: dict) -> None:
        """Raise (one line) for what this kind of model cannot be optimized with: a target
        (:class:`~tvm_taso.target.Target`), sizes given for its symbols."""

    def search(self, run: SearchRun, report: Report) -> Result:
        """The model searched and written back; statistics, what was left as it was, and the
        front end's facts go to ``report``. ``Result.model`` is the model itself when nothing
        was applied."""

    def guard(self, new, target, repeats: int, database: str | None = None) -> dict:
        """The measured verdict on ``new`` against the model (:func:`tvm_taso.guard.guard`; built
        with ``database``'s tuned schedules when given)."""

    def kernels(self, result: Result, new, target) -> tuple[int | None, int | None]:
        """The kernels the model and ``new`` launch on ``target``."""


def front_end_for(model) -> FrontEnd:
    """The front end for ``model``: an :class:`~tvm_taso.io.onnx_model.OnnxModel`, else a Relax
    ``IRModule``."""
    return OnnxFrontEnd(model) if isinstance(model, OnnxModel) else RelaxFrontEnd(model)
