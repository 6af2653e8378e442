"""Where a tuned CPU build's time goes: each kernel call of a run timed, grouped by what runs it.

    python -m benchmarks.kernel_profile --database DIR [--models resnet50 bert-base] [--runs 10]

Per model: the module TasoOptimize makes for this CPU (analytic cost), built as ``compile`` builds
it with the database ``DIR/MODEL`` (``python -m benchmarks.tuned --work-dir DIR`` fills it), run
``--runs`` times with the Relax VM's instrument hook timing every call. Calls are grouped: the
BLAS's matmuls (:mod:`tvm_taso.blas`; with their shapes, and their rate beside the same calls
timed alone in ``numpy.matmul``), im2col kernels, TVM kernels the database tuned, TVM kernels on
the default schedule, and the VM's own builtins. Medians over the runs of each group's sum, and
of each of the :data:`TOP_KERNELS` slowest kernels' (all its calls). A
measurement of this machine; the hook adds a few microseconds per call, so the groups sum to a
little more than a plain run. Writes ``benchmarks/results/kernel_profile.json`` (``--json``).
"""

from __future__ import annotations

import logging
import sys
import time
from collections import defaultdict
from pathlib import Path

import numpy as np

from benchmarks import models
from benchmarks.run import harness_parser, run_models, model_table

ROOT = Path(__file__).resolve().parent.parent
RESULTS = ROOT / "benchmarks" / "results" / "kernel_profile.json"
log = logging.getLogger("benchmarks.kernel_profile")
TOP_KERNELS = 8  # the kernels (by name, all calls) a row lists with their time


def profile_model(name: str, args) -> dict:
    import tvm
    from tvm import relax

    import tvm_taso
    from tvm_taso import blas
    from tvm_taso import target as targets
    from tvm_taso.cost import tuning
    from tvm_taso.cost.kernel_build import build_pipeline
    from tvm_taso.io.onnx_import import import_relax
    from tvm_taso.runtime import inputs_for

    target = targets.with_cores("llvm")
    original = import_relax(models.build(name, args.quick))
    optimized, _ = tvm_taso.optimize(original, target=target, cost_model="analytic", guard=False)
    database = args.database / name
    ex = tvm.compile(optimized, target=target, relax_pipeline=build_pipeline(target, database))
    held = {t.task_name for t in tuning.tasks_of(optimized, target)
            if tuning.recorded_trials(tuning.open_database(database), t.dispatched[0])}
    vm = relax.VirtualMachine(ex, tvm.cpu())
    inputs = [tvm.runtime.tensor(a) for a in inputs_for(optimized, seed=0)]
    for _ in range(3):
        vm["main"](*inputs)

    runs: list[dict] = []
    kernels: list[dict] = []  # per run: seconds by kernel name
    shapes: list = []
    started: list[float] = []

    def group(symbol: str) -> str:
        if symbol == blas.FUNCTION:
            return "BLAS matmul"
        if "im2col" in symbol:
            return "im2col"
        if symbol.startswith("vm.builtin."):
            return "VM builtins"
        return "TVM, tuned" if symbol in held else "TVM, default schedule"

    def hook(_func, symbol, before, _ret, *args):
        symbol = str(symbol)
        if before:
            started.append(time.perf_counter())
            if symbol == blas.FUNCTION and len(runs) == 1:
                shapes.append((tuple(args[0].shape), tuple(args[1].shape), str(args[0].dtype)))
        else:
            seconds = time.perf_counter() - started.pop()
            runs[-1][group(symbol)] += seconds
            kernels[-1][symbol] += seconds
        return 0

    vm.set_instrument(hook)
    for _ in range(args.runs):
        runs.append(defaultdict(float))
        kernels.append(defaultdict(float))
        vm["main"](*inputs)
    groups = sorted({g for r in runs for g in r})
    median_ms = {g: float(np.median([r.get(g, 0.0) for r in runs])) * 1e3 for g in groups}
    by_kernel = {k: float(np.median([r.get(k, 0.0) for r in kernels])) * 1e3 for k in {k for r in kernels for k in r}}
    top = sorted(by_kernel.items(), key=lambda kv: -kv[1])[:TOP_KERNELS]
    flops = sum(2.0 * np.prod(a) * b[-1] for a, b, _ in shapes)
    alone_ms = sum(blas.matmul_seconds(a, b, dtype) for a, b, dtype in shapes) * 1e3
    return {"model": name, "size": "quick" if args.quick else "full", "runs": args.runs,
            "median_ms": median_ms, "total_ms": sum(median_ms.values()),
            "blas": {"calls": len(shapes), "gflop": flops / 1e9, "in_model_ms": median_ms.get("BLAS matmul", 0.0),
                     "alone_ms": alone_ms,
                     "gflops_in_model": flops / 1e6 / median_ms["BLAS matmul"] if shapes else None,
                     "gflops_alone": flops / 1e6 / alone_ms if shapes else None},
            "top_kernels": [{"name": k, "group": group(k), "ms": ms} for k, ms in top],
            "tasks_held": len(held)}


def table(result: dict) -> str:
    groups = ["BLAS matmul", "im2col", "TVM, tuned", "TVM, default schedule", "VM builtins"]

    def cells(r):
        b = r["blas"]
        return ([f"{r['median_ms'].get(g, 0.0):.1f}" for g in groups] + [f"{r['total_ms']:.1f}", str(b["calls"]),
                f"{b['gflops_in_model']:.0f} ({b['gflops_alone']:.0f})" if b["calls"] else "—"])

    return model_table(["model", *[f"{g} ms" for g in groups], "sum ms", "BLAS calls",
                        "BLAS GFLOP/s in the model (alone)"], result["rows"], cells)


def main(argv: list[str] | None = None) -> int:
    ap = harness_parser("benchmarks.kernel_profile", __doc__, RESULTS)
    ap.add_argument("--database", type=Path, required=True, help="the work dir of `benchmarks.tuned` (DIR/MODEL)")
    ap.add_argument("--runs", type=int, default=10)
    args = ap.parse_args(argv)
    return run_models("benchmarks.kernel_profile", args, argv, lambda name: profile_model(name, args), table)


if __name__ == "__main__":
    sys.exit(main())
