"""Dynamic shapes, static against dynamic: each model with a symbolic size is optimized as it is
(priced at its representative sizes) and as its static twins (the same model at each of those
sizes), and the estimated cost at each size is compared, with the rules each applied. An
on-demand benchmark (analytic cost model; estimates, not measurements).

    python -m benchmarks.dynamic [--only NAMES] [--target cuda] [--time-limit S] [--json OUT] [--markdown OUT]

Models: a Llama-style decoder written with ``tvm.relax.frontend.nn`` (its length symbolic,
priced at the default sizes and, a second row, at bounds up to 2048); a 2-layer BERT encoder
through ``tvm_taso.from_torch`` with a ``torch.export.Dim`` sequence; a transformers Llama with
its key/value cache (``use_cache=True``) through ``from_torch``; DistilBERT exported to ONNX by
PyTorch's dynamo exporter with a dynamic batch (the ONNX path). Writes
``benchmarks/results/dynamic.json`` (after every model). Needs torch and transformers
(``pip install -e ".[test]"``) and onnxscript for the ONNX row.
"""

from __future__ import annotations

import argparse
import json
import logging
import tempfile
import time
import warnings
from pathlib import Path

from tvm_taso.files import write_text_atomically

from .cli import print_markdown

log = logging.getLogger("benchmarks.dynamic")

RESULTS = Path(__file__).parent / "results" / "dynamic.json"


def _llama(bound=None):
    """(dynamic model, {size: static twin}) of the relax.frontend.nn decoder."""
    import tvm

    from tvm_taso import examples

    mod = examples.llama_decoder()
    if bound is not None:
        mod = tvm.IRModule({"main": mod["main"].with_attr("tir_var_upper_bound", {"seq_len": bound})})
    return mod, lambda n: examples.llama_decoder(seq=n)


def _bert():
    import torch

    import tvm_taso
    from benchmarks.models.torch_models import Bert

    torch.manual_seed(0)
    model = Bert().eval()
    mod = tvm_taso.from_torch(model, (torch.randn(1, 16, 64),),
                              dynamic_shapes=({1: torch.export.Dim("seq", min=2, max=512)},))
    return mod, lambda n: tvm_taso.from_torch(model, (torch.randn(1, n, 64),))


def _llama_with_cache():
    import torch

    import tvm_taso
    from benchmarks.models.torch_models import llama_with_cache

    module = llama_with_cache(vocab=1000, hidden=256, layers=2, intermediate=512, positions=256)
    mod = tvm_taso.from_torch(module, (torch.randint(0, 1000, (1, 8)),),
                              dynamic_shapes=({1: torch.export.Dim("seq", min=2, max=256)},))
    return mod, lambda n: tvm_taso.from_torch(module, (torch.randint(0, 1000, (1, n)),))


def _distilbert(work: Path):
    import tvm_taso
    from benchmarks import zoo

    paths = {axes: work / f"distilbert_{axes}.onnx" for axes in ("static", "dynamic")}
    for axes, path in paths.items():
        zoo.export("distilbert", "dynamo", axes, path)
    return tvm_taso.load_onnx(paths["dynamic"]), lambda n: tvm_taso.load_onnx(paths["static"])


MODELS = {
    "llama (relax.frontend.nn)": ("Relax", lambda work: _llama()),
    "llama (relax.frontend.nn), bound 2048": ("Relax", lambda work: _llama(2048)),
    "bert (from_torch, Dim)": ("PyTorch", lambda work: _bert()),
    "transformers llama, kv cache (from_torch)": ("PyTorch", lambda work: _llama_with_cache()),
    "distilbert (dynamo ONNX, dynamic batch)": ("ONNX", _distilbert),
}


def _optimized(model, target: str, time_limit: float) -> dict:
    import tvm_taso

    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        t0 = time.perf_counter()
        _, report = tvm_taso.optimize(model, target=target, cost_model="analytic", time_limit=time_limit)
    return {"cost_before": report["cost_before"], "cost_after": report["cost_after"], "applied": report["applied"],
            "seconds": time.perf_counter() - t0, "priced_sizes": report.get("priced_sizes"),
            "priced_dims": report.get("priced_dims"), "cost_at_sizes": report.get("cost_at_sizes")}


def row(name: str, target: str, time_limit: float, work: Path) -> dict:
    """Model ``name``: the dynamic one optimized, and its static twin at each priced size."""
    front_end, build = MODELS[name]
    dynamic_model, twin_at = build(work)
    dynamic = _optimized(dynamic_model, target, time_limit)
    sizes = []
    if dynamic["cost_at_sizes"]:  # Relax: one point per priced size of the one symbol
        for point in dynamic["cost_at_sizes"]:
            (size,) = point["sizes"].values()
            twin = _optimized(twin_at(size), target, time_limit)
            sizes.append({"size": size, "dynamic": [point["before"], point["after"]],
                          "static": [twin["cost_before"], twin["cost_after"]], "static_applied": twin["applied"]})
    else:  # ONNX: priced at one size per dimension
        twin = _optimized(twin_at(None), target, time_limit)
        sizes.append({"size": dynamic["priced_dims"], "dynamic": [dynamic["cost_before"], dynamic["cost_after"]],
                      "static": [twin["cost_before"], twin["cost_after"]], "static_applied": twin["applied"]})
    for s in sizes:
        s["dynamic_ratio"] = s["dynamic"][1] / s["dynamic"][0]
        s["static_ratio"] = s["static"][1] / s["static"][0]
    return {"model": name, "front_end": front_end, "applied": dynamic["applied"], "seconds": dynamic["seconds"],
            "priced": dynamic["priced_sizes"] or dynamic["priced_dims"], "sizes": sizes}


def markdown(result: dict) -> str:
    lines = ["| model | front end | size | static: cost before → after (ratio) "
             "| dynamic: cost before → after (ratio) | rules applied (dynamic) | same rules as the twin |",
             "|---|---|---|---|---|---|---|"]
    for r in result["rows"]:
        rules = ", ".join(f"{k} ×{v}" for k, v in sorted(r["applied"].items())) or "none"
        for s in r["sizes"]:
            size = s["size"] if not isinstance(s["size"], dict) else ", ".join(f"{k}={v}" for k, v in s["size"].items())
            lines.append(f"| {r['model']} | {r['front_end']} | {size} "
                         f"| {s['static'][0]:.2f} → {s['static'][1]:.2f} ({s['static_ratio']:.3f}) "
                         f"| {s['dynamic'][0]:.2f} → {s['dynamic'][1]:.2f} ({s['dynamic_ratio']:.3f}) | {rules} "
                         f"| {'yes' if s['static_applied'] == r['applied'] else 'no'} |")
    return "\n".join(lines)


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(prog="python -m benchmarks.dynamic", description=__doc__.split("\n\n")[0])
    ap.add_argument("--only", nargs="+", choices=list(MODELS), default=list(MODELS))
    ap.add_argument("--target", default="cuda", help="what the cost model prices for (default cuda)")
    ap.add_argument("--time-limit", type=float, default=60.0, help="search seconds per optimize (default 60)")
    ap.add_argument("--json", type=Path, default=RESULTS)
    ap.add_argument("--markdown", type=Path)
    args = ap.parse_args(argv)
    logging.basicConfig(level=logging.INFO, format="%(asctime)s %(levelname)s %(name)s: %(message)s",
                        datefmt="%H:%M:%S")
    logging.getLogger("tvm_taso").setLevel(logging.ERROR)
    result = {"target": args.target, "cost_model": "analytic (an estimate)", "time_limit": args.time_limit,
              "date": time.strftime("%Y-%m-%d"), "rows": []}
    with tempfile.TemporaryDirectory() as work:
        for name in args.only:
            result["rows"].append(row(name, args.target, args.time_limit, Path(work)))
            log.info("%s: %s", name, [(s["size"], round(s["static_ratio"], 3), round(s["dynamic_ratio"], 3))
                                      for s in result["rows"][-1]["sizes"]])
            write_text_atomically(args.json, json.dumps(result, indent=2))
    print_markdown(markdown(result), args.markdown)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
