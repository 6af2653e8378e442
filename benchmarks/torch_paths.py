"""PyTorch in two ways, side by side: the torch frontend (``tvm_taso.from_torch``: ``torch.export``
and TVM's PyTorch frontend) against the ONNX path (``torch.onnx.export``, ``load_onnx``), and
``torch.compile(backend="tvm_taso")`` against eager and inductor. An on-demand benchmark.

    python -m benchmarks.torch_paths [--only NAMES] [--search backtrack eqsat] [--target cuda] [--time-limit S]
        [--latency] [--rounds N] [--json OUT] [--markdown OUT]

1. **Search.** For each model (Hugging Face BERT as the issue gave it: BERT-base's sizes, two
   layers, 128 tokens; a Llama-style decoder and ViT from small configs; torchvision's ResNet-50, ResNeXt-50 and Inception-v3, random weights, batch 1), the
   same module in eval mode goes both ways and through ``optimize`` (analytic cost model, priced
   for ``--target``): estimated cost before and after, rules applied and their families (a
   rule's name up to its second hyphen: ``merge-matmul``, ``fold-scalar``...), and the torch
   path's optimized cost against the ONNX path's (the issue asks for within 2%).
2. **Latency** (``--latency``). On this machine's CPU, the model in eager PyTorch, compiled by
   inductor (``torch.compile``'s default) and by this backend, timed alternating in one run
   (``--rounds`` rounds, rotated order): medians with quartiles, ratios against eager. CPU numbers
   only: nothing here says what a GPU would do.

Writes ``benchmarks/results/torch_paths.json`` (after every model). Needs
``pip install -e ".[zoo]"`` (torch, torchvision, transformers, onnxscript).
"""

from __future__ import annotations

import argparse
import json
import logging
import statistics
import tempfile
import time
import warnings
from pathlib import Path

from tvm_taso.files import write_text_atomically

from .cli import print_markdown
from .onnx_models import builders as hf_builders
from .onnx_models import import_torchvision

log = logging.getLogger("benchmarks.torch_paths")

RESULTS = Path(__file__).parent / "results" / "torch_paths.json"
HF = ("bert", "llama", "vit")
TORCHVISION = {"resnet50": ({}, 224), "resnext50_32x4d": ({}, 224),
               "inception_v3": ({"aux_logits": False, "init_weights": True}, 299)}
MODELS = HF + tuple(TORCHVISION)


def build(name: str):
    """(module in eval mode returning one tensor, example inputs as a tuple) of model ``name``."""
    import torch

    if name in TORCHVISION:
        kwargs, image = TORCHVISION[name]
        module = getattr(import_torchvision().models, name)(weights=None, **kwargs)
        return module.eval(), (torch.randn(1, 3, image, image),)
    if name == "bert":  # the issue's own example: BERT-base's sizes, two layers, 128 tokens
        import transformers

        import_torchvision()  # transformers' model classes import torchvision (see onnx_models)
        module = transformers.BertModel(transformers.BertConfig(num_hidden_layers=2), add_pooling_layer=False)
        inputs = {"input_ids": torch.randint(0, 1000, (1, 128)), "attention_mask": torch.ones(1, 128, dtype=torch.int64)}
    else:
        module, inputs, _ = hf_builders()[name]()
    module.config.use_cache = False  # no key/value cache: TVM's frontend cannot take its empty start
    names = list(inputs)

    class FirstOutput(torch.nn.Module):
        def __init__(self, inner):
            super().__init__()
            self.inner = inner

        def forward(self, *args):
            return self.inner(**dict(zip(names, args)))[0]

    return FirstOutput(module).eval(), tuple(v[:1] for v in inputs.values())


def family(rule: str) -> str:
    return "-".join(rule.split("-")[:2])


def _optimized(model, target: str, time_limit: float, search: str) -> dict:
    import tvm_taso

    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        t0 = time.perf_counter()
        _, report = tvm_taso.optimize(model, target=target, cost_model="analytic", time_limit=time_limit,
                                      search=search)
    return {"cost_before": report["cost_before"], "cost_after": report["cost_after"],
            "seconds": time.perf_counter() - t0, "applied": report["applied"],
            "families": sorted({family(r) for r in report["applied"]})}


def search_row(name: str, search: str, target: str, time_limit: float, work: Path) -> dict:
    """Both paths of model ``name``, searched by ``search``."""
    import torch

    import tvm_taso

    module, args = build(name)
    row = {"model": name, "search": search}
    try:
        row["torch"] = _optimized(tvm_taso.from_torch(module, args), target, time_limit, search)
    except tvm_taso.InputError as err:  # the frontend's own limits: a row saying so
        row["torch"] = {"error": str(err)}
    path = work / f"{name}.onnx"
    with torch.no_grad(), warnings.catch_warnings():
        warnings.simplefilter("ignore")
        torch.onnx.export(module, args, str(path), input_names=[f"input{k}" for k in range(len(args))],
                          output_names=["output"], dynamo=False, opset_version=18, do_constant_folding=True)
    row["onnx"] = _optimized(tvm_taso.load_onnx(str(path)), target, time_limit, search)
    if "error" in row["torch"]:
        return row
    row["torch_over_onnx"] = row["torch"]["cost_after"] / row["onnx"]["cost_after"]
    row["families_only_onnx"] = sorted(set(row["onnx"]["families"]) - set(row["torch"]["families"]))
    row["families_only_torch"] = sorted(set(row["torch"]["families"]) - set(row["onnx"]["families"]))
    return row


def latency_row(name: str, rounds: int, time_limit: float) -> dict:
    """Eager, inductor and this backend on this CPU, alternating; medians and quartiles (ms)."""
    import numpy as np
    import torch

    from tvm_taso.cost.latency import side_by_side
    from tvm_taso.numerics import relative_error
    from tvm_taso.passes import TasoBackend

    torch._dynamo.reset()  # each model from a clean cache: the models share FirstOutput.forward's code,
    # and a second shape for one code object makes TorchDynamo trace it again with dynamic shapes
    module, args = build(name)
    backend = TasoBackend(cost_model="analytic", time_limit=time_limit)
    runs = {"eager": module, "inductor": torch.compile(module), "tvm_taso": torch.compile(module, backend=backend)}
    compile_seconds = {}

    def sampler(fn):
        def sample() -> float:
            start = time.perf_counter()
            fn(*args)
            return (time.perf_counter() - start) * 1e3
        return sample

    outputs = {}
    with torch.no_grad():
        for k, fn in runs.items():  # compile (first call) outside the timed rounds
            start = time.perf_counter()
            outputs[k] = fn(*args).numpy()
            compile_seconds[k] = time.perf_counter() - start
        samples = side_by_side({k: sampler(fn) for k, fn in runs.items()}, rounds)
    row = {"model": name, "compile_seconds": compile_seconds, "fallbacks": backend.fallbacks,
           "graphs": len(backend.reports),
           "relative_error": {k: relative_error([outputs["eager"]], [outputs[k]]) for k in ("inductor", "tvm_taso")}}
    for k, ms in samples.items():
        low, mid, high = np.percentile(ms, [25, 50, 75])
        ratios = np.asarray(samples["eager"]) / np.asarray(ms)
        row[k] = {"ms": float(mid), "ms_low": float(low), "ms_high": float(high),
                  "speedup_vs_eager": float(statistics.median(ratios)),
                  "speedup_low": float(np.percentile(ratios, 25)), "speedup_high": float(np.percentile(ratios, 75))}
    return row


def markdown(result: dict) -> str:
    lines = [f"Estimated cost (µs, analytic model priced for {result['target']}), torch frontend against ONNX path:",
             "", "| model | search | ONNX path | torch frontend | torch / ONNX | rule families only one path applied |",
             "|---|---|---|---|---|---|"]
    for r in result["search"]:
        if "error" in r["torch"]:
            lines.append(f"| {r['model']} | {r['search']} | {r['onnx']['cost_before']:.1f} → "
                         f"{r['onnx']['cost_after']:.1f} | not imported: {r['torch']['error']} | | |")
            continue
        only = "; ".join(f"{side}: {', '.join(r[f'families_only_{side}'])}" for side in ("onnx", "torch")
                         if r[f"families_only_{side}"]) or "none"
        lines.append(f"| {r['model']} | {r['search']} | {r['onnx']['cost_before']:.1f} → {r['onnx']['cost_after']:.1f} | "
                     f"{r['torch']['cost_before']:.1f} → {r['torch']['cost_after']:.1f} | "
                     f"{r['torch_over_onnx']:.3f} | {only} |")
    if result.get("latency"):
        lines += ["", f"Latency on this machine's CPU ({result['machine']}), median ms (quartiles), "
                  f"{result['rounds']} alternating rounds; speedup = eager / variant, median of per-round ratios:", "",
                  "| model | eager | inductor | tvm_taso | inductor vs eager | tvm_taso vs eager | graphs / eager fallbacks "
                  "| tvm_taso's error against eager |", "|---|---|---|---|---|---|---|---|"]
        for r in result["latency"]:
            cells = [f"{r[k]['ms']:.2f} ({r[k]['ms_low']:.2f}–{r[k]['ms_high']:.2f})" for k in
                     ("eager", "inductor", "tvm_taso")]
            ratios = [f"{r[k]['speedup_vs_eager']:.2f}× ({r[k]['speedup_low']:.2f}–{r[k]['speedup_high']:.2f})"
                      for k in ("inductor", "tvm_taso")]
            lines.append(f"| {r['model']} | {' | '.join(cells)} | {' | '.join(ratios)} | "
                         f"{r['graphs']} / {len(r['fallbacks'])} | {r['relative_error']['tvm_taso']:.1e} |")
    return "\n".join(lines) + "\n"


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(prog="python -m benchmarks.torch_paths", description=__doc__.split("\n\n")[0])
    ap.add_argument("--only", nargs="+", choices=MODELS, default=list(MODELS))
    ap.add_argument("--search", nargs="+", choices=["backtrack", "eqsat", "auto"], default=["backtrack", "eqsat"])
    ap.add_argument("--target", default="cuda", help="the target the cost model prices for (default cuda)")
    ap.add_argument("--time-limit", type=float, default=120.0, help="search seconds per model and path")
    ap.add_argument("--latency", action="store_true", help="also time eager, inductor and tvm_taso on this CPU")
    ap.add_argument("--rounds", type=int, default=10, help="alternating timing rounds (default 10)")
    ap.add_argument("--json", type=Path, default=RESULTS)
    ap.add_argument("--markdown", type=Path)
    args = ap.parse_args(argv)
    logging.basicConfig(level=logging.INFO, format="%(asctime)s %(levelname)s %(name)s: %(message)s",
                        datefmt="%H:%M:%S")
    logging.getLogger("tvm_taso").setLevel(logging.WARNING)
    import os
    import platform

    result = {"target": args.target, "time_limit": args.time_limit, "rounds": args.rounds,
              "machine": f"{platform.processor() or platform.machine()}, {os.cpu_count()} cores",
              "search": [], "latency": []}
    with tempfile.TemporaryDirectory() as work:
        for name in args.only:
            for search in args.search:
                row = search_row(name, search, args.target, args.time_limit, Path(work))
                log.info("%s, %s: torch/onnx %s", name, search, row.get("torch_over_onnx", row["torch"].get("error")))
                result["search"].append(row)
                write_text_atomically(args.json, json.dumps(result, indent=2))
    if args.latency:
        for name in args.only:
            row = latency_row(name, args.rounds, args.time_limit)
            log.info("%s: eager %.2f ms, inductor %.2fx, tvm_taso %.2fx", name, row["eager"]["ms"],
                     row["inductor"]["speedup_vs_eager"], row["tvm_taso"]["speedup_vs_eager"])
            result["latency"].append(row)
            write_text_atomically(args.json, json.dumps(result, indent=2))
    print_markdown(markdown(result), args.markdown)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
