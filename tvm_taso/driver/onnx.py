"""The ONNX front end of ``optimize`` (:class:`OnnxFrontEnd`): the search on an
:class:`~tvm_taso.io.onnx_model.OnnxModel`'s graph (read and written through
:mod:`tvm_taso.io.onnx_bridge`), and the guard for ONNX models.

A result the bridge cannot write (a rewrite that would fix the size of a symbolic dimension,
or a node with no ONNX form at the model's opset) is not applied: the ONNX nodes that rewrite
replaced are kept opaque and the search runs again (:func:`~tvm_taso.driver.block.search_written`,
the retry loop both front ends share). Any other write failure searches again with each
region's result written as it is found.
"""

from __future__ import annotations

import logging
from collections import Counter

from tvm_taso.cost.model import kernel_count
from tvm_taso.driver.block import Result, SearchRun, search_written
from tvm_taso.io.onnx_bridge import OnnxGraph, RewriteRejected
from tvm_taso.errors import InputError
from tvm_taso.io.onnx_model import OnnxModel
from tvm_taso.ir.graph import Graph
from tvm_taso.search import SearchStats

log = logging.getLogger("tvm_taso")

GROWTH = 1.05  # weights growing more than this with the rewrites are said (merges alone do not grow them)


def weight_bytes(proto) -> int:
    """The bytes of the main graph's initializers (from their types: held-apart ones included)."""
    import numpy as np
    from onnx import helper

    total = 0
    for init in proto.graph.initializer:
        try:
            itemsize = np.dtype(helper.tensor_dtype_to_np_dtype(init.data_type)).itemsize
        except (KeyError, TypeError, ValueError):
            itemsize = 1
        total += int(np.prod(init.dims, dtype=np.int64)) * itemsize
    return total


class OnnxFrontEnd:
    """An ONNX model as ``optimize`` reads, writes, guards and counts it
    (:class:`~tvm_taso.driver.front_end.FrontEnd`). An internal failure keeps the model, with a
    line in the report's ``skipped``."""

    def __init__(self, model: OnnxModel):
        self.model = model
        self.opset = model.opset  # regions are judged as ONNX at the model's opset

    def check(self, target, sizes: dict) -> None:
        if sizes:
            raise ValueError("shapes: an ONNX model's sizes are given to tvm_taso.load_onnx(path, shapes=...)")

    def search(self, run: SearchRun, report) -> Result:
        try:
            result = optimize_onnx(self.model, run, report.stats, report.skipped)
        except InputError:
            raise
        except Exception as err:  # noqa: BLE001 - the pass's promise: an internal failure keeps the model
            log.debug("optimizing %s failed", self.model.name, exc_info=True)
            report.skipped[f"{self.model.name}: left as is after an internal error ({type(err).__name__}: {err})"] += 1
            report.stats.forget_results()
            return Result(self.model)
        report.facts = result.facts
        return result

    def guard(self, new: OnnxModel, target, repeats: int, database: str | None = None) -> dict:
        return guard_onnx(self.model, new, target, repeats, database)

    def kernels(self, result: Result, new: OnnxModel, target) -> tuple[int | None, int | None]:
        """The fusion model's counts on the engine graph (TVM's importer refuses many exports)."""
        before, after = result.kernels or (None, None)
        return before, before if new is self.model else after


def optimize_onnx(model: OnnxModel, run: SearchRun, stats: SearchStats, skipped: Counter) -> Result:
    """Search ``model``'s graph; the result's facts say which dimensions were priced, which
    rewrites could not be written and why nodes stayed opaque, its ``kernels`` the kernels
    before and after.
    ``skipped`` gets the opaque nodes by ONNX op type, each named once."""
    source = _Model(model)
    searched = search_written(source, run, stats)
    if searched is None:
        skipped["rewrites left out: none could be written as ONNX"] += 1
        bridge = OnnxGraph(model)
        cost = run.cost.cost(bridge.graph)
        return _done(model, bridge, skipped, source.rejected, bridge.graph, model, Result(model, cost, cost))
    outcome, written = searched
    return _done(model, source.bridge, skipped, source.rejected, outcome.graph,
                 model if written is None else written, outcome)


class _Model:
    """An ONNX model's graph, written back as the model (:class:`~tvm_taso.driver.block.Writable`).
    A rewrite the bridge refuses (:class:`RewriteRejected`: it would fix a symbolic size, or has
    no ONNX form at the model's opset) is left out by keeping the nodes it replaced opaque."""

    def __init__(self, model: OnnxModel):
        self.model, self.name = model, model.name
        self.frozen: set[int] = set()
        self.rejected: list[str] = []
        self.bridge = OnnxGraph(model)

    @property
    def graph(self) -> Graph:
        return self.bridge.graph

    def write(self, graph: Graph) -> OnnxModel:
        return self.bridge.written(graph)

    def leave_out(self, graph: Graph, err: Exception) -> bool | None:
        if not isinstance(err, RewriteRejected):
            return None
        log.info("rewrite not applied (%s); searching again without it", err)
        self.rejected.append(str(err))
        more = self.bridge.owners_to_freeze(graph, err.nids) - self.frozen
        if not more:
            return False
        self.frozen |= more
        self.bridge = OnnxGraph(self.model, self.frozen)
        return True


def _done(model: OnnxModel, bridge: OnnxGraph, skipped: Counter, rejected: list[str], graph: Graph,
          new: OnnxModel, costs) -> Result:
    """The result of :func:`optimize_onnx`: ``graph`` is the one written as ``new`` (the
    kernels it launches, against the bridge's original graph, go in the result); ``costs`` has
    ``cost_before``, ``cost_after`` and, when kept, ``folded``."""
    skipped.update(bridge.skipped)
    if rejected:
        skipped["rewrites not applied: they would fix a symbolic size or have no ONNX form"] += len(rejected)
    weights = {"before": weight_bytes(model.structure), "after": weight_bytes(new.structure)}
    if weights["after"] > GROWTH * weights["before"]:
        log.warning("%s: the rewrites make the model's weights %.1fx larger (%d -> %d bytes)", model.name,
                    weights["after"] / max(weights["before"], 1), weights["before"], weights["after"])
    facts = {"priced_dims": dict(model.dims), "rejected_rewrites": rejected,
             "opaque_reasons": dict(sorted(bridge.reasons.items())), "weight_bytes": weights}
    return Result(new, costs.cost_before, costs.cost_after, costs.folded, facts,
                  (kernel_count(bridge.graph), kernel_count(graph)))


def guard_onnx(before: OnnxModel, after: OnnxModel, target, repeats: int, database: str | None = None) -> dict:
    """The guard (:func:`tvm_taso.guard.guard`) on both models imported through TVM at the priced
    sizes; a model TVM's importer cannot take keeps the rewrite unmeasured, and says why. For an
    ``ort`` target both models are timed in onnxruntime instead
    (:func:`tvm_taso.ort.guard.guard_in_runtime`), on random inputs at the priced sizes."""
    from tvm_taso import target as targets
    from tvm_taso.guard import guard
    from tvm_taso.ort.guard import guard_in_runtime
    from tvm_taso.io.onnx_import import import_relax

    runtime = targets.resolve(target).runtime
    if runtime is not None:
        from tvm_taso.io.onnx_feeds import integer_ranges, random_feeds

        feeds = random_feeds(before, before.dims, integer_ranges(before))
        return guard_in_runtime(before.proto, after.proto, feeds, runtime, repeats)

    try:
        mods = [import_relax(m.proto, shapes=m.shapes(), name=m.name) for m in (before, after)]
    except InputError as err:
        log.warning("guard: %s; keeping the rewrite unmeasured", err)
        return {"kept": True, "measured": False, "reason": f"not timed through TVM: {err}"}
    return guard(mods[0], mods[1], target, repeats, database)
