"""The Relax front end of ``optimize``: every dataflow block of every Relax function searched
(:func:`~tvm_taso.driver.block.search_block`) and written back."""

from __future__ import annotations

import logging
from collections import Counter
from dataclasses import dataclass, field

import tvm
from tvm import relax

from tvm_taso.driver.block import SearchRun, search_block
from tvm_taso.ir.ops import OpError
from tvm_taso.ir.relax_bridge import BlockGraph, FunctionSymbols, foreign_function
from tvm_taso.search import SearchStats

log = logging.getLogger("tvm_taso")


@dataclass
class Result:
    """What a front end made of a model: the new one (the same object when nothing was
    applied), the costs before and after, the weight expressions folded, facts for the report
    and the kernels before and after when the front end counts them (the ONNX one's)."""

    model: object
    cost_before: float = 0.0
    cost_after: float = 0.0
    folded: int = 0
    facts: dict = field(default_factory=dict)
    kernels: tuple[int, int] | None = None


def optimize_relax(mod: tvm.IRModule, run: SearchRun, stats: SearchStats, skipped: Counter) -> Result:
    """Search every Relax function of ``mod`` but those marked ``Primitive``, ``Composite`` or
    ``Codegen``; a function whose search fails is kept as it was, with a line in ``skipped``."""
    result = Result(mod)
    for gvar, func in mod.functions.items():
        if not isinstance(func, relax.Function):
            continue
        if foreign_function(func):
            log.debug("@%s has the %s attribute: left alone", gvar.name_hint, foreign_function(func))
            continue
        fname = gvar.name_hint
        fstats = SearchStats()
        try:
            new_func, one = _optimize_function(func, fname, run, fstats, skipped)
        except Exception as err:  # noqa: BLE001 - never fail the user's pipeline
            log.debug("optimizing %s failed", fname, exc_info=True)
            skipped[f"@{fname}: left as is after an internal error ({type(err).__name__}: {err})"] += 1
            stats.absorb(fstats, kept=False)
            continue
        kept = new_func is not func
        if kept:
            candidate = result.model.clone()
            candidate.update_func(gvar, new_func)
            if not relax.analysis.check_well_formed(candidate):
                skipped[f"@{fname}: rewritten function was not well formed; kept the original"] += 1
                one.cost_after, kept = one.cost_before, False
            else:
                result.model = candidate
                result.folded += one.folded
        stats.absorb(fstats, kept)
        result.cost_before += one.cost_before
        result.cost_after += one.cost_after
        if one.facts.get("priced_sizes"):
            result.facts.setdefault("priced_sizes", {}).update(one.facts["priced_sizes"])
        for row in one.facts.get("cost_at_sizes", []):
            add_costs_at(result.facts, (tuple(row["sizes"].items()),), (row["before"],),
                         (row["after"] if kept else row["before"],))
    return result


def _optimize_function(func: relax.Function, fname: str, run: SearchRun, stats: SearchStats,
                       skipped: Counter) -> tuple[relax.Function, Result]:
    """(the function with its dataflow blocks searched, or ``func`` itself; the costs)."""
    body = func.body
    total = Result(func)
    if not isinstance(body, relax.SeqExpr):
        skipped[f"@{fname}: body is not a sequence of blocks"] += 1
        return func, total
    try:
        symbols = FunctionSymbols(func, run.shapes)
    except OpError as err:
        skipped[f"@{fname}: {err}"] += 1
        return func, total
    blocks = []
    changed = False
    for block in body.blocks:
        new_block = None
        if not isinstance(block, relax.DataflowBlock):
            if len(block.bindings):
                skipped[f"@{fname}: non-dataflow block"] += 1
        else:
            new_block = _optimize_block(block, fname, run, stats, skipped, total, symbols)
        blocks.append(new_block or block)
        changed |= new_block is not None
    if not changed:
        return func, total
    seq = relax.BlockBuilder().normalize(relax.SeqExpr(blocks, body.body))
    return relax.Function(func.params, seq, func.ret_ty, func.is_pure, func.attrs, func.span), total


def _optimize_block(block: relax.DataflowBlock, fname: str, run: SearchRun, stats: SearchStats,
                    skipped: Counter, total: Result, symbols: FunctionSymbols) -> relax.DataflowBlock | None:
    """The block searched and written back, or None (nothing kept); its costs added to ``total``
    (at each priced size, for a block with symbolic sizes). A result that cannot be written back
    is searched again, each region's result written as it is found, so that only the regions
    that cannot be are left out."""
    local = Counter()
    try:
        bg = BlockGraph(block, local, symbols.variables)
    except OpError as err:
        skipped[f"@{fname}: dataflow block ({err})"] += 1
        return None
    for what, n in local.items():
        skipped[f"@{fname}: {what}"] += n
    sources = symbols.price(bg.graph)
    if sources:
        total.facts.setdefault("priced_sizes", {}).update(sources)
    new_block = None
    for accept in (None, bg.to_block):
        outcome = search_block(bg.graph, run, accept)
        if not outcome.kept:
            break
        try:
            new_block = bg.to_block(outcome.graph)
            break
        except Exception as err:  # noqa: BLE001 - search again, each region's result written as it is found
            if accept is not None:
                raise
            log.warning("@%s: the search's result could not be written back (%s: %s); searching again, "
                        "leaving out the regions that cannot be", fname, type(err).__name__, err)
            stats.absorb(outcome.stats, kept=False)
    stats.absorb(outcome.stats, kept=new_block is not None)
    total.cost_before += outcome.cost_before
    total.cost_after += outcome.cost_after
    if bg.graph.sizes:
        after = outcome.costs_after if new_block is not None else outcome.costs_before
        add_costs_at(total.facts, bg.graph.sizes, outcome.costs_before, after)
    if new_block is not None:
        total.folded += outcome.folded
    return new_block


def add_costs_at(facts: dict, points: tuple, before: tuple, after: tuple) -> None:
    """Add a block's costs at each of its priced ``points`` to ``facts["cost_at_sizes"]``."""
    rows = facts.setdefault("cost_at_sizes", [])
    for point, b, a in zip(points, before, after):
        sizes = dict(point)
        row = next((r for r in rows if r["sizes"] == sizes), None)
        if row is None:
            rows.append({"sizes": sizes, "before": b, "after": a})
        else:
            row["before"] += b
            row["after"] += a
