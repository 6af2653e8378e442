"""Peak memory and wall time of ``tvm-taso optimize`` on large models: ``python -m benchmarks.memory``.

Each model is optimized by the command a user runs (``tvm-taso optimize IN -o OUT --target cuda
--report R``) in its own process; its peak resident memory is the kernel's high-water mark of
that process (``VmHWM``), and the resident memory of the whole process tree (the region workers
included) is sampled every 20 ms. The bound (issue 29) is the import baseline (a process that
imports what the command imports whatever the model's size: ``tvm``, ``onnx``, ``tvm_taso`` and,
where installed, onnx-simplifier and onnxruntime's symbolic shape inference, which read a model
that computes shapes at run time; measured the same way) plus twice the model's size on disk (the ``.onnx`` file and its external data). Models: a Llama-style decoder of about 1.1 B
parameters written with external data (:mod:`benchmarks.llama`, float32 and float16), the same
decoder with every layer reading the first layer's weights (ALBERT's sharing, about 0.7 GB: the
written model must not grow with the layers' merged weights; its output size is in the row) and
the largest exports of the zoo (torchvision's VGG-11, Wide ResNet-50 and ViT-B/32, random weights).
The optimized model is checked (``onnx.checker`` on the file) and both models are run in
onnxruntime from their files, one after the other, on the same random inputs (symbolic
dimensions at 8): the largest output difference is reported.

    python -m benchmarks.memory [--only NAMES] [--no-check] [--json OUT] [--markdown OUT]
"""

from __future__ import annotations

import argparse
import json
import logging
import os
import shutil
import subprocess
import sys
import tempfile
import threading
import time
from pathlib import Path

log = logging.getLogger("benchmarks.memory")

RESULTS = Path(__file__).parent / "results" / "memory.json"
# name -> (dtype, layers share their weights: ALBERT's way, whose merges must be folded once)
LLAMA = {"llama-1b-fp32": ("float32", False), "llama-1b-fp16": ("float16", False),
         "llama-shared-fp32": ("float32", True)}
ZOO = {"vgg11": "classic", "wide_resnet50_2": "classic", "vit_b_32": "dynamo"}  # the exporter the zoo uses
# onnxsim 0.8 alone adds about 70 MB: a fixed cost, not one that grows with the model
BASELINE = ("import contextlib, tvm, onnx, tvm_taso\n"
            "for name in ('onnxsim', 'onnxruntime.tools.symbolic_shape_infer'):\n"
            "    with contextlib.suppress(ImportError):\n"
            "        __import__(name)")


def run_measured(argv: list[str], env: dict | None = None) -> dict:
    """Run ``argv``; its exit status, wall seconds, peak resident MB (the process itself: the
    kernel's high-water mark ``VmHWM``, read every 20 ms until it exits) and the sampled peak
    of its process tree's resident memory. (``wait4``'s ``ru_maxrss`` is not used: a child
    started after this process reaped a larger one reports that one's.)"""
    try:
        import psutil
    except ImportError:  # the tree's memory is left out (psutil is in the bench extra)
        psutil = None

    start = time.perf_counter()
    proc = subprocess.Popen(argv, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True, env=env)
    peaks = {"self": 0, "tree": 0}
    done = threading.Event()

    def sample():
        while not done.is_set():
            try:
                peaks["self"] = max(peaks["self"], _high_water(proc.pid))
                if psutil is not None:
                    root = psutil.Process(proc.pid)
                    total = sum(p.memory_info().rss for p in [root, *root.children(recursive=True)])
                    peaks["tree"] = max(peaks["tree"], total)
            except Exception:  # noqa: BLE001 - the process (or a worker) ended between two reads
                pass
            done.wait(0.02)

    sampler = threading.Thread(target=sample, daemon=True)
    sampler.start()
    output = proc.stdout.read()
    proc.wait()
    done.set()
    sampler.join()
    return {"status": proc.returncode, "seconds": round(time.perf_counter() - start, 1),
            "peak_mb": round(peaks["self"] / 2**20), "tree_peak_mb": round(peaks["tree"] / 2**20),
            "output_tail": output[-2000:]}


def _high_water(pid: int) -> int:
    """Bytes: the highest resident memory process ``pid`` has had (Linux's ``VmHWM``)."""
    with open(f"/proc/{pid}/status") as f:
        for line in f:
            if line.startswith("VmHWM:"):
                return int(line.split()[1]) * 1024
    return 0


def model_bytes(path: Path) -> int:
    """The model file and its external data file: ``<file name>.data`` beside it, where
    :mod:`benchmarks.llama` and ``tvm-taso optimize`` put it (the zoo's exports have none).
    (Sizes on disk: reading the model to list its data files would load a one-file model
    into this process, which is to stay small.)"""
    data = path.parent / (path.name + ".data")
    return path.stat().st_size + (data.stat().st_size if data.exists() else 0)


def make_model(name: str, work: Path) -> Path:
    path = work / f"{name}.onnx"
    if name in LLAMA:
        from .llama import LlamaConfig, write_llama

        dtype, shared = LLAMA[name]
        return write_llama(path, LlamaConfig(dtype=dtype, shared=shared))
    from .zoo import export

    export(name, ZOO[name], "static", path)
    return path


def _in_child(*args: str) -> str:
    """Run this module's ``--child`` step in a process of its own and return its last line:
    this process stays small, so that the memory of what it ran (torch for an export,
    onnxruntime for a comparison) is not counted in the next measured child, which starts as
    its copy."""
    done = subprocess.run([sys.executable, "-m", "benchmarks.memory", "--child", *args], capture_output=True,
                          text=True)
    if done.returncode != 0:
        lines = (done.stderr or done.stdout).strip().splitlines() or ["failed"]
        raise RuntimeError(lines[-1])
    return done.stdout.strip().splitlines()[-1]


def measure(name: str, work: Path, baseline_mb: float, check: bool) -> dict:
    path = Path(_in_child("make", name, str(work)))
    size = model_bytes(path)
    out, report = work / f"{name}.taso.onnx", work / f"{name}.report.json"
    row = {"model": name, "size_mb": round(size / 2**20), "bound_mb": round(baseline_mb + 2 * size / 2**20)}
    run = run_measured([sys.executable, "-m", "tvm_taso.cli", "optimize", str(path), "-o", str(out),
                        "--target", "cuda", "--report", str(report)])
    row.update({k: run[k] for k in ("status", "seconds", "peak_mb", "tree_peak_mb")})
    row["within_bound"] = run["peak_mb"] <= row["bound_mb"]
    if run["status"] != 0:
        row["error"] = run["output_tail"].strip().splitlines()[-1] if run["output_tail"].strip() else "failed"
        return row
    rep = json.loads(report.read_text())
    row.update({"rules_applied": sum(rep["applied"].values()), "cost_ratio": round(rep["cost_after"] / rep["cost_before"], 4),
                "output_mb": round(model_bytes(out) / 2**20)})
    _in_child("checker", str(out))
    if check:
        row["max_abs_error"], row["max_abs_output"] = json.loads(_in_child("compare", str(path), str(out)))
    for f in work.glob(f"{name}*"):
        f.unlink()
    return row


def compare_outputs(original: Path, optimized: Path, seq: int = 8) -> tuple[float, float]:
    """The largest difference between the two models' outputs in onnxruntime, on random inputs
    at small sizes (a sequence of ``seq``), and the largest output: each model run from its
    file, one at a time (two sessions of a 1 B model would not both fit beside the first)."""
    import gc

    import numpy as np

    import tvm_taso
    from tvm_taso.io.onnx_feeds import integer_ranges, random_feeds
    from tvm_taso.ort.runtime import OrtRuntime

    model = tvm_taso.load_onnx(original, shapes={})
    dims = {k: (1 if v == 1 else seq) for k, v in model.dims.items()}
    feeds = random_feeds(model, dims, integer_ranges(model))
    del model
    outputs = []
    for path in (original, optimized):
        session = OrtRuntime("cpu").session(path)
        outputs.append([np.asarray(o, np.float64) for o in session.run(None, feeds)])
        del session
        gc.collect()
    error = max(float(np.abs(a - b).max()) for a, b in zip(*outputs))
    return error, max(float(np.abs(a).max()) for a in outputs[0])


def table(result: dict) -> str:
    lines = [f"Import baseline: {result['baseline_mb']} MB. Bound: baseline + 2 x the model's size.", "",
             "| model | size MB | peak MB | bound MB | within | tree peak MB | wall s | rules | est. cost ratio | "
             "max output difference |",
             "|---|---|---|---|---|---|---|---|---|---|"]
    for r in result["rows"]:
        if "error" in r and "peak_mb" not in r:
            lines.append(f"| {r['model']} | error: {r['error']} |||||||||")
            continue
        lines.append(f"| {r['model']} | {r['size_mb']} | {r['peak_mb']} | {r['bound_mb']} | "
                     f"{'yes' if r['within_bound'] else '**no**'} | {r['tree_peak_mb']} | {r['seconds']} | "
                     f"{r.get('rules_applied', '-')} | {r.get('cost_ratio', '-')} | "
                     f"{_error(r)} |")
    return "\n".join(lines) + "\n"


def _child(step: str, *args: str) -> int:
    if step == "make":
        print(make_model(args[0], Path(args[1])))
    elif step == "checker":
        import onnx

        onnx.checker.check_model(args[0])
        print("ok")
    else:
        print(json.dumps(compare_outputs(Path(args[0]), Path(args[1]))))
    return 0


def _error(row: dict) -> str:
    if "error" in row:
        return row["error"]
    if "max_abs_error" not in row:
        return "-"
    return f"{row['max_abs_error']:.2g} (of {row['max_abs_output']:.3g})"


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(prog="python -m benchmarks.memory", description=__doc__.split("\n\n")[0])
    ap.add_argument("--only", nargs="+", metavar="NAME", help=f"only these ({', '.join([*LLAMA, *ZOO])})")
    ap.add_argument("--no-check", action="store_true", help="do not compare the outputs in onnxruntime")
    ap.add_argument("--json", default=str(RESULTS))
    ap.add_argument("--markdown", metavar="OUT")
    ap.add_argument("--child", nargs="+", help=argparse.SUPPRESS)
    args = ap.parse_args(argv)
    if args.child:
        return _child(*args.child)
    logging.basicConfig(level=logging.INFO, format="%(name)s: %(message)s")
    names = [n for n in [*LLAMA, *ZOO] if not args.only or n in args.only]
    baseline = run_measured([sys.executable, "-c", BASELINE])
    log.info("import baseline: %d MB", baseline["peak_mb"])
    work = Path(tempfile.mkdtemp(prefix="tvm-taso-memory-"))
    rows = []
    try:
        for name in names:
            log.info("%s ...", name)
            try:
                row = measure(name, work, baseline["peak_mb"], not args.no_check)
            except Exception as err:  # noqa: BLE001 - one model's failure is a row
                log.exception("%s failed", name)
                row = {"model": name, "error": f"{type(err).__name__}: {err}".splitlines()[0]}
            log.info("  %s", row)
            rows.append(row)
    finally:
        shutil.rmtree(work, ignore_errors=True)
    result = {"date": time.strftime("%Y-%m-%d"), "machine": f"{os.cpu_count()} cores", "baseline_mb": baseline["peak_mb"],
              "rows": rows}
    from tvm_taso.files import write_text_atomically

    write_text_atomically(args.json, json.dumps(result, indent=1) + "\n")
    text = table(result)
    print(text)
    if args.markdown:
        write_text_atomically(args.markdown, text)
    return 0 if all(r.get("within_bound") and r.get("status") == 0 for r in rows) else 1


if __name__ == "__main__":
    raise SystemExit(main())
