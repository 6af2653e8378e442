"""The ONNX front end of ``optimize``: the search on an :class:`~tvm_taso.io.onnx_model.OnnxModel`'s
graph (read and written through :mod:`tvm_taso.io.onnx_bridge`), and the guard for ONNX models.

A result the bridge cannot write (a rewrite that would fix the size of a symbolic dimension,
or a node with no ONNX form at the model's opset) is not applied: the ONNX nodes that rewrite
replaced are kept opaque and the search runs again, at most :data:`MAX_ATTEMPTS` times. Any
other write failure searches again with each region's result written as it is found.
"""

from __future__ import annotations

import logging
from collections import Counter

from tvm_taso.cost.model import kernel_count
from tvm_taso.driver.block import SearchRun, search_block
from tvm_taso.driver.relax import Result
from tvm_taso.io.onnx_bridge import OnnxGraph, RewriteRejected
from tvm_taso.io.onnx_model import OnnxModel
from tvm_taso.ir.graph import Graph
from tvm_taso.search import SearchStats

log = logging.getLogger("tvm_taso")

MAX_ATTEMPTS = 6
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


def optimize_onnx(model: OnnxModel, run: SearchRun, stats: SearchStats, skipped: Counter) -> Result:
    """Search ``model``'s graph; the result's facts say which dimensions were priced, which
    rewrites could not be written and why nodes stayed opaque, its ``kernels`` the kernels
    before and after.
    ``skipped`` gets the opaque nodes by ONNX op type, each named once."""
    frozen: set[int] = set()
    rejected: list[str] = []
    checked = False  # each region's result written as it is found (after a write failed)
    for _ in range(MAX_ATTEMPTS):
        bridge = OnnxGraph(model, frozen)
        outcome = search_block(bridge.graph, run, bridge.written if checked else None)
        if not outcome.kept:
            stats.absorb(outcome.stats, kept=False)
            return _done(model, bridge, skipped, rejected, outcome.graph, model, outcome)
        try:
            written = bridge.written(outcome.graph)
        except RewriteRejected as err:
            more = bridge.owners_to_freeze(outcome.graph, err.nids) - frozen
            log.info("rewrite not applied (%s); searching again without it", err)
            rejected.append(str(err))
            stats.absorb(outcome.stats, kept=False)
            if not more:
                break
            frozen |= more
            continue
        except Exception as err:  # noqa: BLE001 - search again, dropping the regions that cannot be written
            if checked:
                raise
            log.warning("%s: the search's result could not be written as ONNX (%s: %s); searching again, "
                        "leaving out the regions that cannot be", model.name, type(err).__name__, err)
            stats.absorb(outcome.stats, kept=False)
            checked = True
            continue
        stats.absorb(outcome.stats, kept=True)
        return _done(model, bridge, skipped, rejected, outcome.graph, written, outcome)
    skipped["rewrites left out: none could be written as ONNX"] += 1
    bridge = OnnxGraph(model)
    cost = run.cost.cost(bridge.graph)
    return _done(model, bridge, skipped, rejected, bridge.graph, model, Result(model, cost, cost))


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


def guard_onnx(before: OnnxModel, after: OnnxModel, target, repeats: int) -> dict:
    """The guard (:func:`tvm_taso.guard.guard`) on both models imported through TVM at the priced
    sizes; a model TVM's importer cannot take keeps the rewrite unmeasured, and says why. For an
    ``ort`` target both models are timed in onnxruntime instead
    (:func:`tvm_taso.guard.guard_in_runtime`), on random inputs at the priced sizes."""
    from tvm_taso import target as targets
    from tvm_taso.guard import guard, guard_in_runtime
    from tvm_taso.io.onnx_import import InputError, import_relax

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
    return guard(mods[0], mods[1], target, repeats)
