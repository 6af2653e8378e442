"""The Relax front end of ``optimize`` (:class:`RelaxFrontEnd`): every dataflow block of every
Relax function searched and written back (:func:`~tvm_taso.driver.block.search_written`)."""

from __future__ import annotations

import logging
from collections import Counter

import tvm
import tvm_ffi
from tvm import relax

from tvm_taso.cost.kernel_build import launched_kernels
from tvm_taso.driver.block import Result, SearchRun, search_written
from tvm_taso.errors import TargetError
from tvm_taso.guard import guard as measured_guard
from tvm_taso.ir.ops import OpError
from tvm_taso.ir.relax_bridge import BlockGraph, FunctionSymbols, foreign_function, with_functions
from tvm_taso.search import SearchStats

log = logging.getLogger("tvm_taso")


class RelaxFrontEnd:
    """A Relax module as ``optimize`` reads, writes, guards and counts it
    (:class:`~tvm_taso.driver.front_end.FrontEnd`). A ``torch.export`` program arrives as one."""

    opset = None  # regions are judged as Relax

    def __init__(self, mod: tvm.IRModule):
        self.model = mod

    def check(self, target, sizes: dict) -> None:
        if target.runtime is not None:
            raise TargetError(f"target {target} times ONNX models in onnxruntime; give the model from "
                              "tvm_taso.load_onnx, or a TVM target for a Relax module")

    def search(self, run: SearchRun, report) -> Result:
        result = optimize_relax(self.model, run, report.stats, report.skipped)
        if result.model is not self.model and tvm_ffi.structural_equal(result.model, self.model):
            # every rewrite was undone by a later one: the module is the same, so nothing was applied
            result.model, result.cost_after = self.model, result.cost_before
            report.stats.forget_results()
        report.facts = result.facts
        return result

    def guard(self, new: tvm.IRModule, target, repeats: int, database: str | None = None) -> dict:
        return measured_guard(self.model, new, target, repeats, database)

    def kernels(self, result: Result, new: tvm.IRModule, target) -> tuple[int | None, int | None]:
        before = launched_kernels(self.model, target)
        return before, before if new is self.model else launched_kernels(new, target)


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
            candidate = with_functions(result.model, {gvar: new_func})
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
    # a block refuses nothing it could leave out: a second result it cannot write raises
    outcome, new_block = search_written(_Block(bg, f"@{fname}"), run, stats)
    total.cost_before += outcome.cost_before
    total.cost_after += outcome.cost_after
    if bg.graph.sizes:
        after = outcome.costs_after if new_block is not None else outcome.costs_before
        add_costs_at(total.facts, bg.graph.sizes, outcome.costs_before, after)
    if new_block is not None:
        total.folded += outcome.folded
    return new_block


class _Block:
    """A dataflow block's graph, written back as a block (:class:`~tvm_taso.driver.block.Writable`)."""

    def __init__(self, bg: BlockGraph, name: str):
        self.bg, self.name = bg, name

    @property
    def graph(self):
        return self.bg.graph

    def write(self, graph) -> relax.DataflowBlock:
        return self.bg.to_block(graph)

    def leave_out(self, graph, err: Exception) -> None:
        return None


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
