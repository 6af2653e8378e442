"""The peer of TasoOptimize in TVM itself: Relax 0.27's own passes that make TASO-style graph
rewrites, applied instead of the search, so that the benchmark shows what TASO adds over them.

Each pass runs on what the previous ones left; a pass that raises (``CombineParallelMatmul``
on NasRNN as imported: ``TypeError: Cannot treat type ir.GenericConst as type ir.Var``) is
skipped and named in the result, never hidden.
"""

from __future__ import annotations

import logging
import time

log = logging.getLogger("benchmarks.peer")

# In the order a user would run them: batch norms into convs first, then matmul rewrites.
PASSES = (
    "FoldBatchnormToConv2D",  # TASO's conv+BN fold
    "CombineParallelMatmul",  # TASO's merge of matmuls sharing an input (parameters only, not constants)
    "ExpandMatmulOfSum",  # x (A + B) -> x A + x B
    "AdjustMatmulOrder",  # (A B) C <-> A (B C) by size
    "ReorderPermuteDimsAfterConcat",  # concat(transpose...) -> transpose(concat...)
    "ReorderTakeAfterMatmul",  # take(A) B -> take(A B)
    "FuseTransposeMatmul",  # matmul(x, transpose(w)) as one op
)


# FuseTransposeMatmul replaces matmuls by a call_tir of its own TIR: outside the op table, so the
# cost model cannot price it; the peer is priced before it and timed after it.
UNPRICED = ("FuseTransposeMatmul",)


def apply_peer_passes(mod) -> tuple[object, object, dict]:
    """``mod`` after every pass of :data:`PASSES` that runs on it (to time), the same before the
    :data:`UNPRICED` ones (to price), and a summary: which passes ran, which failed (with their
    error, one line) and how many seconds they took."""
    import tvm_ffi
    from tvm import relax

    original, ran, failed = mod, [], {}
    t0 = time.perf_counter()
    priced = None
    for name in PASSES:
        if name in UNPRICED and priced is None:
            priced = mod
        try:
            new = getattr(relax.transform, name)()(mod)
            new = relax.transform.DeadCodeElimination()(new)
            if not relax.analysis.check_well_formed(new):
                raise ValueError("the result is not well formed")
        except Exception as err:  # noqa: BLE001 - a failing pass is a result to report
            first = str(err).strip().splitlines()[-1] if str(err).strip() else ""
            failed[name] = f"{type(err).__name__}: {first}"[:200]
            log.warning("TVM pass %s failed: %s", name, failed[name])
            continue
        ran.append(name)
        mod = new
    summary = {"passes": ran, "unpriced": list(UNPRICED), "failed": failed, "seconds": time.perf_counter() - t0,
               "changed": not tvm_ffi.structural_equal(original, mod)}
    return mod, mod if priced is None else priced, summary


def price(mod, cost) -> float:
    """The cost model's price of every dataflow block of ``mod`` (microseconds), as the search
    prices them."""
    from tvm_taso.ir.relax_bridge import block_graphs

    return sum(cost.cost(g) for g in block_graphs(mod))
