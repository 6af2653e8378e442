"""``torch.compile(model, backend="tvm_taso", options={"database": DB})`` against eager PyTorch
and inductor on this CPU, timed alternating in one run: whether a tuned build is at least as
fast as eager.

    python -m benchmarks.torch_tuned --database DIR [--rounds 10] [--no-inductor] [--quick]

The model is ResNet-50 as torchvision defines it (:class:`benchmarks.models.torch_models.ResNet50`:
torchvision is not needed), batch 1, 224x224, eval mode, random weights. ``DIR`` is a
``tvm-taso tune`` work dir, for instance the one ``python -m benchmarks.tuned --models resnet50
--work-dir DIR`` filled from the ONNX model of the same network. The row says how many of the
torch graph's kernels (as :func:`tvm_taso.from_torch` imports it and TasoOptimize rewrites it, the
backend's own steps) the database holds: a kernel it lacks is built with the default schedule.
Ratios are eager's time over the variant's, medians of per-round ratios with quartiles. Writes
``benchmarks/results/torch_tuned.json`` (``--json``) and prints a table.
"""

from __future__ import annotations

import argparse
import json
import logging
import platform
import sys
import time
from datetime import date
from pathlib import Path

import numpy as np

from benchmarks.run import model_table, ratio_text

ROOT = Path(__file__).resolve().parent.parent
RESULTS = ROOT / "benchmarks" / "results" / "torch_tuned.json"
log = logging.getLogger("benchmarks.torch_tuned")


def database_coverage(module, args, database: str) -> dict:
    """How many of the tasks of ``module``'s graph, as the backend builds it for this CPU, the
    database holds."""
    import tvm_taso
    from tvm_taso import target as targets
    from tvm_taso.cost import tuning

    target = targets.with_cores("llvm")
    optimized, _ = tvm_taso.optimize(tvm_taso.from_torch(module, args), target=target, guard=False)
    db = tuning.open_database(database)
    tasks = tuning.tasks_of(optimized, target)
    held = [t.task_name for t in tasks if db.has_workload(t.dispatched[0])]
    return {"tasks": len(tasks), "in_database": len(held),
            "missing": sorted(t.task_name for t in tasks if t.task_name not in held)}


def bench(args) -> dict:
    import torch

    from benchmarks.models.torch_models import ResNet50
    from tvm_taso.cost.latency import side_by_side, speedup
    from tvm_taso.numerics import relative_error
    from tvm_taso.passes import TasoBackend

    torch.set_num_threads(args.threads)
    module = ResNet50(width=8 if args.quick else 64, classes=10 if args.quick else 1000)
    inputs = (torch.randn(1, 3, 32 if args.quick else 224, 32 if args.quick else 224),)
    backend = TasoBackend(database=args.database)
    runs = {"eager": module, "tvm_taso + database": torch.compile(module, backend=backend)}
    if args.inductor:
        runs["inductor"] = torch.compile(module)
    compile_seconds, outputs = {}, {}
    with torch.no_grad():
        for name, fn in runs.items():  # compiled at the first call, outside the timed rounds
            start = time.perf_counter()
            outputs[name] = fn(*inputs).numpy()
            compile_seconds[name] = time.perf_counter() - start

        def sampler(fn):
            def sample() -> float:
                start, calls = time.perf_counter(), 0
                while calls == 0 or time.perf_counter() - start < args.min_repeat_ms / 1e3:
                    fn(*inputs)
                    calls += 1
                return (time.perf_counter() - start) * 1e3 / calls
            return sample

        samples = side_by_side({name: sampler(fn) for name, fn in runs.items()}, args.rounds)
    row = {"model": "resnet50", "size": "quick" if args.quick else "full",
           "coverage": database_coverage(module, inputs, args.database),
           "graphs": len(backend.reports), "eager_fallbacks": len(backend.fallbacks),
           "compile_seconds": compile_seconds,
           "relative_error": {k: relative_error([outputs["eager"]], [outputs[k]]) for k in runs if k != "eager"},
           "median_ms": {k: float(np.median(v)) for k, v in samples.items()}, "samples_ms": samples,
           "vs_eager": {k: speedup(samples["eager"], samples[k]) for k in samples if k != "eager"}}
    return row


def table(result: dict) -> str:
    def cells(r):
        m, v = r["median_ms"], r["vs_eager"]
        return [f"{r['coverage']['in_database']} of {r['coverage']['tasks']}", f"{m['eager']:.4g}",
                f"{m['tvm_taso + database']:.4g}", f"{m['inductor']:.4g}" if "inductor" in m else "",
                ratio_text(v["tvm_taso + database"]), ratio_text(v["inductor"]) if "inductor" in v else "",
                f"{r['relative_error']['tvm_taso + database']:.1e}"]

    return model_table(["model", "kernels in the database", "eager ms", "tvm_taso + database ms", "inductor ms",
                        "tvm_taso + database vs eager", "inductor vs eager", "error against eager"],
                       result["rows"], cells)


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(prog="python -m benchmarks.torch_tuned", description=__doc__.split("\n\n")[0])
    ap.add_argument("--database", required=True, help="a `tvm-taso tune` work dir")
    ap.add_argument("--rounds", type=int, default=10, help="alternating timing rounds (default 10)")
    ap.add_argument("--min-repeat-ms", type=int, default=200, help="each sample averages calls for this long")
    ap.add_argument("--threads", type=int, default=2, help="torch's threads (default 2: this machine's cores)")
    ap.add_argument("--no-inductor", dest="inductor", action="store_false", help="leave inductor out")
    ap.add_argument("--quick", action="store_true", help="a narrow ResNet-50 on 32x32 images")
    ap.add_argument("--json", type=Path, default=RESULTS)
    args = ap.parse_args(argv)
    logging.basicConfig(level=logging.INFO, format="%(asctime)s %(name)s: %(message)s", datefmt="%H:%M:%S")
    from tvm_taso.files import write_text_atomically

    result = {"date": date.today().isoformat(), "machine": f"{platform.processor() or platform.machine()}",
              "command": "python -m benchmarks.torch_tuned " + " ".join(sys.argv[1:] if argv is None else argv),
              "rows": [bench(args)]}
    write_text_atomically(args.json, json.dumps(result, indent=1))
    print(table(result))
    return 0


if __name__ == "__main__":
    sys.exit(main())
