"""GPU check: fill the measurement database with CUDA kernel times and compare end-to-end
latency without TasoOptimize, with the analytic cost model and with measured costs.

Meant for one short run on a GPU machine (see ``benchmarks/gpu_check.sh``, which unpacks a
packed TVM first), bounded by ``--deadline`` seconds in all:

    python -m benchmarks.gpu_check [--target cuda] [--deadline 360] [--out DIR]
        [--models NAME ...] [--measure-limit S] [--quick] [--compile-only]

For each model (small to large; the ones that no longer fit in the deadline are skipped; a
Llama-style decoder with a symbolic length, run at the length in :data:`RUN_SIZES`) it
compiles and times the original module, then ``tvm_taso.optimize`` with
``cost_model="analytic"`` and with a :class:`~tvm_taso.cost.measure.MeasuredCost` (each new kernel
built with the target's default pipeline and timed on the device, recorded in
``$TVM_TASO_CACHE/measurements.jsonl``), compiles and times both results, checks their
outputs against the original's, and prints a markdown table. ``--out`` receives
``gpu_check.json`` (rewritten after each model). ``--compile-only`` builds everything (no
device needed: CUDA compiles on a CPU machine with a stub libcuda) and times nothing.
``--quick`` uses tiny sizes (what a CPU dry run uses).

Then the ONNX path for onnxruntime (:func:`check_ort`): for each of ``--ort`` (default
``ort:cuda ort:tensorrt``) that this machine's onnxruntime has, the ONNX benchmark models are
optimized with that target (kernels and regions timed with the provider) and the original and
optimized models timed side by side in it. A provider onnxruntime does not have here is a row
that says so (``onnxruntime-gpu``'s wheel in ``.devicepkgs/whl`` is installed by
``gpu_check.sh``; its 200 MB do not fit a 64 MiB carry to a lent device machine, where the rows
say the provider is missing). ``--ort ort:cpu`` runs the stage on a CPU machine.
"""

from __future__ import annotations

import argparse
import json
import logging
import os
import sys
import time
import traceback
import warnings

import numpy as np

log = logging.getLogger("benchmarks.gpu_check")


def relax_of(name: str, quick: bool = False):
    """Benchmark model ``name`` (built as ONNX) imported by TVM's ONNX importer, as benchmarks.run does."""
    from tvm_taso.io.onnx_import import import_relax

    from . import models

    return import_relax(models.build(name, quick=quick))


def model_builders(quick: bool):
    from tvm_taso import examples

    if quick:
        return {
            "parallel_matmuls": lambda: examples.parallel_matmuls(seq=8, hidden=16),
            "llama_dynamic": lambda: examples.llama_decoder(layers=1, hidden=32, heads=2, intermediate=64),
            "inception_block": lambda: examples.inception_block(size=8, channels=8),
            "resnet_bottleneck": lambda: examples.resnet_bottleneck(size=8, channels=16),
            "bert": lambda: relax_of("bert-base", quick=True),
            "resnet50": lambda: relax_of("resnet50", quick=True),
        }
    return {
        "parallel_matmuls": lambda: examples.parallel_matmuls(seq=128, hidden=768),
        "llama_dynamic": lambda: examples.llama_decoder(layers=2, hidden=1024, heads=16, intermediate=2816),
        "inception_block": lambda: examples.inception_block(size=28, channels=64),
        "resnet_bottleneck": lambda: examples.resnet_bottleneck(size=14, channels=64),
        "bert": lambda: relax_of("bert-base"),
        "resnet50": lambda: relax_of("resnet50"),
    }


# the sizes a model with symbolic dimensions is run and timed at (its search prices the defaults)
RUN_SIZES = {"llama_dynamic": {"seq_len": 128}}


def compile_and_time(mod, target, inputs, compile_only: bool, repeat: int) -> dict:
    """Compile with the target's default pipeline; time the whole ``main`` on the device."""
    import tvm
    from tvm import relax

    from tvm_taso.runtime import flatten

    t0 = time.perf_counter()
    with target:
        ex = tvm.compile(mod, target=target)
    out = {"compile_s": round(time.perf_counter() - t0, 2)}
    if compile_only:
        return out
    kind = target.kind.name
    dev = tvm.cpu(0) if kind in ("llvm", "c") else tvm.device(kind, 0)
    vm = relax.VirtualMachine(ex, dev)
    args = [tvm.runtime.tensor(a, dev) for a in inputs]
    result = vm["main"](*args)
    dev.sync()
    timer = vm.time_evaluator("main", dev, number=1, repeat=repeat, min_repeat_ms=20)
    samples = [s * 1e6 for s in timer(*args).results]
    out.update(latency_us=float(np.median(samples)), outputs=flatten(result))
    return out


def max_rel_err(a: list, b: list) -> float | None:
    if not a or not b or len(a) != len(b):
        return None
    err = 0.0
    for x, y in zip(a, b):
        x, y = np.asarray(x, dtype=np.float64), np.asarray(y, dtype=np.float64)
        if x.shape != y.shape:
            return float("inf")
        err = max(err, float(np.max(np.abs(x - y)) / (np.max(np.abs(x)) + 1e-6)) if x.size else 0.0)
    return err


def local_cuda_target():
    """``cuda`` with this GPU's arch and limits (dlight's schedules read them), else ``cuda``."""
    import tvm

    dev = tvm.cuda(0)
    if not dev.exist:
        return "cuda"
    try:
        return {
            "kind": "cuda",
            "arch": "sm_" + dev.compute_version.replace(".", ""),
            "max_shared_memory_per_block": int(dev.max_shared_memory_per_block),
            "max_threads_per_block": int(dev.max_threads_per_block),
            "thread_warp_size": int(dev.warp_size),
        }
    except Exception:  # noqa: BLE001
        return "cuda"


def build_kernels_only(mod, target) -> dict:
    """``--compile-only``: build every kernel of the original graph the way
    :func:`~tvm_taso.cost.measure.measure_kernel` does (in this process, nothing timed)."""
    from collections import Counter

    from tvm_taso.cost.model import kernels
    from tvm_taso.cost.kernel_build import build_kernel
    from tvm_taso.ir.relax_bridge import BlockGraph

    built, failed, t0 = 0, [], time.perf_counter()
    for block in mod["main"].body.blocks:
        for k in set(kernels(BlockGraph(block, Counter()).graph)):
            try:
                build_kernel(k, target)
                built += 1
            except Exception as err:  # noqa: BLE001
                failed.append(f"{[o[0] for o in k.ops]}: {type(err).__name__}: {str(err)[:200]}")
    return {"kernels_built": built, "kernels_failed": failed, "build_s": round(time.perf_counter() - t0, 2)}


def check_model(name, build, target, args, deadline) -> dict:
    import tvm_taso
    from tvm_taso.runtime import inputs_for
    from tvm_taso.cost.measure import MeasuredCost

    row: dict = {"model": name}
    t0 = time.perf_counter()
    mod = build()
    row["build_model_s"] = round(time.perf_counter() - t0, 2)
    inputs = inputs_for(mod, sizes=RUN_SIZES.get(name))
    base = compile_and_time(mod, target, inputs, args.compile_only, args.repeat)
    row["original"] = {k: v for k, v in base.items() if k != "outputs"}
    variants = {"analytic": "analytic", "measure": None}
    for label, cost_model in variants.items():
        left = deadline - time.time()
        if left < 30:
            row[label] = {"skipped": "deadline"}
            continue
        if cost_model is None:
            if args.compile_only:
                row[label] = build_kernels_only(mod, target)
                continue
            cost_model = MeasuredCost(
                target, repeats=args.kernel_repeats, timeout=args.kernel_timeout,
                time_limit=min(args.measure_limit, max(10.0, left - 60)),
            )
        t0 = time.perf_counter()
        with warnings.catch_warnings():
            warnings.simplefilter("ignore")
            new_mod, report = tvm_taso.optimize(
                mod, target=target, cost_model=cost_model,
                time_limit=min(args.search_limit + (args.measure_limit if label == "measure" else 0), max(10.0, left - 30)),
            )
        entry = {
            "optimize_s": round(time.perf_counter() - t0, 2),
            "cost_before": report["cost_before"],
            "cost_after": report["cost_after"],
            "applied": report["applied"],
            "cost_model": report["cost_model"],
        }
        try:
            res = compile_and_time(new_mod, target, inputs, args.compile_only, args.repeat)
            entry.update({k: v for k, v in res.items() if k != "outputs"})
            if "latency_us" in res and "latency_us" in base:
                entry["speedup"] = base["latency_us"] / res["latency_us"]
                entry["max_rel_err"] = max_rel_err(base.get("outputs"), res.get("outputs"))
        except Exception as err:  # noqa: BLE001
            entry["error"] = f"{type(err).__name__}: {str(err)[:500]}"
        row[label] = entry
    return row


def _fmt(v, spec=".1f"):
    return "-" if v is None else format(v, spec)


def table(rows: list) -> str:
    lines = [
        "| model | original µs | analytic µs (×) | measured µs (×) | kernels measured / cached / failed | measure s | rules (measured) |",
        "| --- | ---: | ---: | ---: | ---: | ---: | --- |",
    ]
    for r in rows:
        if "error" in r:
            lines.append(f"| {r['model']} | error: {r['error'][:80]} | | | | | |")
            continue
        a, m = r.get("analytic", {}), r.get("measure", {})
        cm = m.get("cost_model", {})
        lines.append(
            f"| {r['model']} | {_fmt(r['original'].get('latency_us'))} "
            f"| {_fmt(a.get('latency_us'))} ({_fmt(a.get('speedup'), '.2f')}) "
            f"| {_fmt(m.get('latency_us'))} ({_fmt(m.get('speedup'), '.2f')}) "
            f"| {cm.get('measured', '-')} / {cm.get('cached', '-')} / {cm.get('failed', '-')} "
            f"| {cm.get('measure_seconds', '-')} | {', '.join(f'{k}×{v}' for k, v in (m.get('applied') or {}).items())} |"
        )
    return "\n".join(lines)


def main(argv=None) -> int:
    p = argparse.ArgumentParser(prog="python -m benchmarks.gpu_check")
    p.add_argument("--target", default="cuda", help="cuda (default), llvm, or a target JSON")
    p.add_argument("--models", nargs="*", default=None)
    p.add_argument("--deadline", type=float, default=360.0, help="seconds for everything (models past it are skipped)")
    p.add_argument("--measure-limit", type=float, default=90.0, help="seconds of kernel measurement per model")
    p.add_argument("--search-limit", type=float, default=30.0, help="search seconds per model besides measuring")
    p.add_argument("--kernel-repeats", type=int, default=20)
    p.add_argument("--kernel-timeout", type=float, default=60.0)
    p.add_argument("--repeat", type=int, default=20, help="end-to-end timing repeats")
    p.add_argument("--quick", action="store_true", help="tiny model sizes")
    p.add_argument("--compile-only", action="store_true", help="build everything, time nothing (no GPU needed)")
    p.add_argument("--out", default=os.environ.get("OUT"), help="folder for gpu_check.json")
    p.add_argument("--ort", nargs="*", default=["ort:cuda", "ort:tensorrt"],
                   help="onnxruntime targets to optimize and time the ONNX models for (default ort:cuda ort:tensorrt; "
                   "none: skip the stage)")
    p.add_argument("--ort-models", nargs="*", default=["resnext50", "inception-v3", "bert-base"])
    p.add_argument("--ort-search-limit", type=float, default=40.0, help="search seconds per model and provider")
    p.add_argument("-v", "--verbose", action="store_true")
    args = p.parse_args(argv)
    logging.basicConfig(level=logging.INFO if args.verbose else logging.WARNING, format="%(name)s: %(message)s")
    deadline = time.time() + args.deadline

    import tvm

    from tvm_taso.cost.database import MeasurementDB

    logging.getLogger("tvm.s_tir.dlight").setLevel(logging.ERROR)  # one line per kernel otherwise
    target_spec = json.loads(args.target) if args.target.startswith("{") else args.target
    if target_spec == "cuda":
        target_spec = local_cuda_target()
    target = tvm.target.Target(target_spec)
    info = {"tvm": tvm.__version__, "target": str(target), "python": sys.version.split()[0]}
    if target.kind.name == "cuda":
        dev = tvm.cuda(0)
        info.update(cuda_exist=bool(dev.exist))
        if dev.exist:
            info.update(device=dev.device_name, compute_version=dev.compute_version)
        elif not args.compile_only:
            print("no CUDA device: use --compile-only", file=sys.stderr)
            return 2
    print(json.dumps(info), flush=True)
    builders = model_builders(args.quick)
    names = args.models or list(builders)
    rows: list = []
    out_path = os.path.join(args.out, "gpu_check.json") if args.out else None
    if args.out:
        os.makedirs(args.out, exist_ok=True)
    for name in names:
        if deadline - time.time() < 45:
            rows.append({"model": name, "error": "skipped: deadline"})
            continue
        t0 = time.perf_counter()
        try:
            row = check_model(name, builders[name], target, args, deadline)
        except Exception as err:  # noqa: BLE001 - one model's failure must not end the check
            traceback.print_exc()
            row = {"model": name, "error": f"{type(err).__name__}: {str(err)[:500]}"}
        row["seconds"] = round(time.perf_counter() - t0, 1)
        rows.append(row)
        print(json.dumps(row, default=str), flush=True)
        _save(out_path, info, rows, [])
    ort_rows = check_ort(args, deadline, lambda so_far: _save(out_path, info, rows, so_far))
    _save(out_path, info, rows, ort_rows)
    print()
    print(table(rows))
    print()
    print(ort_table(ort_rows))
    print()
    print(json.dumps(MeasurementDB().summary(), indent=1))
    return 0


def _save(out_path, info, rows, ort_rows) -> None:
    from tvm_taso.cost.database import MeasurementDB

    if out_path:
        with open(out_path, "w") as f:
            json.dump({"info": info, "rows": rows, "ort": ort_rows, "db": MeasurementDB().summary()}, f, indent=1,
                      default=str)


def check_ort(args, deadline: float, save) -> list:
    """The ONNX benchmark models optimized for each onnxruntime target of ``args.ort`` and timed
    there against the original (see the module docstring); one row per model and provider."""
    import tvm_taso
    from tvm_taso.ort.bench import bench_in_runtime
    from tvm_taso.errors import TargetError
    from tvm_taso.target import resolve

    from . import models

    rows: list = []
    for spelling in args.ort or []:
        try:
            resolve(spelling).runtime.check()
        except (TargetError, ImportError) as err:
            rows.append({"runtime": spelling, "error": f"skipped: {err}"})
            print(json.dumps(rows[-1]), flush=True)
            continue
        for name in args.ort_models:
            if deadline - time.time() < 30 + args.ort_search_limit:
                rows.append({"runtime": spelling, "model": name, "error": "skipped: deadline"})
                continue
            t0 = time.perf_counter()
            try:
                model = tvm_taso.load_onnx(models.build(name, quick=args.quick), name=name)
                with warnings.catch_warnings():
                    warnings.simplefilter("ignore")
                    new, report = tvm_taso.optimize(model, target=spelling, time_limit=args.ort_search_limit)
                timing = bench_in_runtime(model, new, spelling, repeat=args.repeat)
                regions = report.get("region_guard") or {}
                row = {"runtime": spelling, "model": name, "speedup": timing["speedup"],
                       "speedup_quartiles": timing["speedup_quartiles"], "original_ms": timing["original"]["median_ms"],
                       "optimized_ms": timing["optimized"]["median_ms"], "regions_timed": regions.get("regions", 0),
                       "regions_kept": regions.get("kept", 0), "kernels_measured": report["cost_model"].get("measured"),
                       "guard": report.get("guard"), "applied": report["applied"]}
            except Exception as err:  # noqa: BLE001 - one model's failure must not end the check
                traceback.print_exc()
                row = {"runtime": spelling, "model": name, "error": f"{type(err).__name__}: {str(err)[:500]}"}
            row["seconds"] = round(time.perf_counter() - t0, 1)
            rows.append(row)
            print(json.dumps(row, default=str), flush=True)
            save(rows)
    return rows


def ort_table(rows: list) -> str:
    lines = ["| runtime | model | original ms | optimized ms | speedup (quartiles) | regions timed / kept | rules |",
             "| --- | --- | ---: | ---: | ---: | ---: | --- |"]
    for r in rows:
        if "error" in r:
            lines.append(f"| {r['runtime']} | {r.get('model', '')} | {r['error'][:100]} | | | | |")
            continue
        low, high = r["speedup_quartiles"]
        lines.append(f"| {r['runtime']} | {r['model']} | {r['original_ms']:.3f} | {r['optimized_ms']:.3f} "
                     f"| {r['speedup']:.3f} ({low:.3f}–{high:.3f}) | {r['regions_timed']} / {r['regions_kept']} "
                     f"| {', '.join(f'{k}×{v}' for k, v in r['applied'].items()) or 'none'} |")
    return "\n".join(lines)


if __name__ == "__main__":
    sys.exit(main())
