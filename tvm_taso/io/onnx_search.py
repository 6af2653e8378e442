"""``optimize`` for an :class:`~tvm_taso.io.onnx_model.OnnxModel`: the search on the model's ONNX
graph (through :mod:`.onnx_bridge`), written back as ONNX; and the guard for ONNX models.

A result the bridge cannot write (a rewrite that would fix the size of a symbolic dimension,
or a node with no ONNX form at the model's opset) is not applied: the ONNX nodes that rewrite
replaced are kept opaque and the search runs again, at most :data:`MAX_ATTEMPTS` times.
"""

from __future__ import annotations

import logging
import time
from collections import Counter

from tvm_taso.cost.model import kernel_count
from tvm_taso.io.onnx_bridge import OnnxGraph, RewriteRejected
from tvm_taso.io.onnx_model import OnnxModel
from tvm_taso.ir.graph import fold_constants
from tvm_taso.search.backtrack import SearchStats
from tvm_taso.search import search

log = logging.getLogger("tvm_taso")

MAX_ATTEMPTS = 6


def optimize_onnx(model: OnnxModel, rules, cost, alpha, budget, deadline, region_size, stats: SearchStats,
                  skipped: Counter, bar=None, min_gain: float = 1e-6,
                  kind: str = "backtrack", judge=None) -> tuple[OnnxModel, float, float, int, dict]:
    """Search ``model``'s graph; returns (optimized model, cost before, cost after, constants
    folded, facts for the report), with the search ``kind`` (one of
    :data:`tvm_taso.search.SEARCHES`) and the region ``judge`` (:class:`tvm_taso.guard.RegionGuard`)
    if any. ``stats`` and ``skipped`` (opaque nodes by ONNX op type,
    each named once) are updated."""
    frozen: set[int] = set()
    rejected: list[str] = []
    checked = False  # each region's result written as it is found (after a write failed)
    for attempt in range(MAX_ATTEMPTS):
        bridge = OnnxGraph(model, frozen)
        g0 = bridge.graph
        c0 = cost.cost(g0)
        bstats = SearchStats()
        g = search(g0, rules, cost, alpha, budget, max(0.0, deadline - time.perf_counter()), region_size, bstats,
                   progress=bar.update if bar is not None else None, min_gain=min_gain, kind=kind, judge=judge,
                   accept=bridge.write if checked else None)
        folded = fold_constants(g)
        c1 = cost.cost(g)
        facts = {"priced_dims": dict(model.dims), "rejected_rewrites": rejected}
        if not c1 < c0 * (1.0 - min_gain) or g.structural_hash() == g0.structural_hash():
            stats.absorb(bstats, kept=False)
            return _done(model, bridge, skipped, c0, c0, 0, facts, model.proto, g0)
        try:
            proto = bridge.write(g)
        except RewriteRejected as err:
            more = bridge.owners_to_freeze(g, err.nids) - frozen
            log.info("rewrite not applied (%s); searching again without it", err)
            rejected.append(str(err))
            stats.absorb(bstats, kept=False)
            if not more:
                break
            frozen |= more
            continue
        except Exception as err:  # noqa: BLE001 - search again, dropping the regions that cannot be written
            if checked:
                raise
            log.warning("%s: the search's result could not be written as ONNX (%s: %s); searching again, "
                        "leaving out the regions that cannot be", model.name, type(err).__name__, err)
            stats.absorb(bstats, kept=False)
            checked = True
            continue
        stats.absorb(bstats, kept=True)
        return _done(model, bridge, skipped, c0, c1, folded, facts, proto, g)
    skipped["rewrites left out: none could be written as ONNX"] += 1
    bridge = OnnxGraph(model)
    c0 = cost.cost(bridge.graph)
    return _done(model, bridge, skipped, c0, c0, 0, {"priced_dims": dict(model.dims), "rejected_rewrites": rejected},
                 model.proto, bridge.graph)


def _done(model, bridge, skipped, before, after, folded, facts, proto, graph):
    """The result tuple of :func:`optimize_onnx`, ``graph`` the one written (the kernels it
    launches, against the bridge's original graph, go in the facts)."""
    skipped.update(bridge.skipped)
    facts["kernels_before"], facts["kernels_after"] = kernel_count(bridge.graph), kernel_count(graph)
    if facts["rejected_rewrites"]:
        skipped["rewrites not applied: they would fix a symbolic size or have no ONNX form"] += len(
            facts["rejected_rewrites"])
    facts["opaque_reasons"] = dict(sorted(bridge.reasons.items()))
    new = model if proto is model.proto else model.with_proto(proto)
    return new, before, after, folded, facts


def guard_onnx(before: OnnxModel, after: OnnxModel, target, repeats: int) -> dict:
    """The guard (:func:`tvm_taso.guard.guard`) on both models imported through TVM at the priced
    sizes; a model TVM's importer cannot take keeps the rewrite unmeasured, and says why."""
    from tvm_taso.guard import guard
    from tvm_taso.io.onnx_import import InputError, import_relax

    try:
        mods = [import_relax(m.proto, shapes=m.shapes(), name=m.name) for m in (before, after)]
    except InputError as err:
        log.warning("guard: %s; keeping the rewrite unmeasured", err)
        return {"kept": True, "measured": False, "reason": f"not timed through TVM: {err}"}
    return guard(mods[0], mods[1], target, repeats)
