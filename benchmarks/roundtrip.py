"""ONNX round trip: load → optimize → onnxruntime, on the benchmark models and (with ``--torch``)
on models written in plain PyTorch and exported with ``torch.onnx.export``.

    python -m benchmarks.roundtrip [--torch] [--quick] [--target cuda|llvm] [--models NAME ...]
        [--json OUT] [-v]

For each model: ``tvm_taso.load_onnx`` → ``tvm_taso.optimize(model, target=...)`` (ONNX in,
ONNX out) → ``onnx.checker.check_model(full_check=True)`` on the result → onnxruntime on the
original and the result with the same random inputs (:func:`tvm_taso.output_check.check_onnx`).
It prints a markdown table (stdout): ONNX nodes, search seconds, rules applied, estimated cost
after/before, max relative error (:mod:`tvm_taso.numerics`, within the tolerance of each
output's dtype), pass/fail; the exit status is 1 when a model fails.

Models: every model of :mod:`benchmarks.models` (``bert-base`` starts from token ids through
BERT's embeddings; ``bert-base-x`` is BERT-base from the embedded input); with
``--torch`` also ``torch-resnet18`` (a ResNet-18 with BatchNorm, eval mode),
``torch-bert`` (token embedding + ``nn.TransformerEncoder``, post-norm, GELU, batch_first) and
``torch-vit`` (patch conv with stride = patch, class token, position embedding, hand-written
pre-norm attention blocks, head on the class token). ``torch`` is not a dependency of
tvm-taso: install it to run these. ``--quick`` uses tiny sizes. Diagnostics go through
``logging`` (``-v`` for more).
"""

from __future__ import annotations

import argparse
import io
import json
import logging
import sys
import time
import traceback
import warnings

import onnx

import tvm_taso
from tvm_taso.output_check import check_onnx

from . import models

log = logging.getLogger("benchmarks.roundtrip")

TARGETS = {"cuda": "cuda", "llvm": {"kind": "llvm", "num-cores": 2}}


# -- models ------------------------------------------------------------------------------------


def onnx_builders(quick: bool) -> dict:
    """name -> () -> ModelProto: every model of :mod:`benchmarks.models`, plus ``bert-base-x``."""
    builders = {name: (lambda name=name: models.build(name, quick)) for name in models.MODELS}
    bert_x = {k: v for k, v in models.QUICK_SIZES["bert-base"].items() if k not in ("vocab", "max_positions")}
    builders["bert-base-x"] = lambda: models.bert.bert_base(vocab=None, scale_with="Mul", **(bert_x if quick else {}))
    return builders


TORCH_SIZES = {
    # full: ResNet-18 at 224; BERT-base-sized encoder (12 x 768, seq 128); ViT-B/16 at 224
    "torch-resnet18": ({"image": 224, "width": 64, "classes": 1000}, {"image": 32, "width": 8, "classes": 10}),
    "torch-bert": (
        {"vocab": 30522, "seq": 128, "d": 768, "heads": 12, "ffn": 3072, "layers": 12},
        {"vocab": 1000, "seq": 16, "d": 64, "heads": 4, "ffn": 256, "layers": 2},
    ),
    "torch-vit": (
        {"image": 224, "patch": 16, "d": 768, "heads": 12, "ffn": 3072, "layers": 12, "classes": 1000},
        {"image": 32, "patch": 8, "d": 64, "heads": 4, "ffn": 256, "layers": 2, "classes": 10},
    ),
}


def torch_builders(quick: bool) -> dict:
    """name -> () -> ModelProto, for models defined in PyTorch and exported to ONNX."""
    return {name: (lambda name=name: export_torch(name, TORCH_SIZES[name][1 if quick else 0])) for name in TORCH_SIZES}


def _torch_modules():
    """The PyTorch model classes (defined here so that importing this module needs no torch)."""
    import torch
    from torch import nn

    class BasicBlock(nn.Module):
        def __init__(self, cin, cout, stride):
            super().__init__()
            self.conv1 = nn.Conv2d(cin, cout, 3, stride, 1, bias=False)
            self.bn1 = nn.BatchNorm2d(cout)
            self.conv2 = nn.Conv2d(cout, cout, 3, 1, 1, bias=False)
            self.bn2 = nn.BatchNorm2d(cout)
            self.down = None
            if stride != 1 or cin != cout:
                self.down = nn.Sequential(nn.Conv2d(cin, cout, 1, stride, bias=False), nn.BatchNorm2d(cout))

        def forward(self, x):
            y = torch.relu(self.bn1(self.conv1(x)))
            y = self.bn2(self.conv2(y))
            return torch.relu(y + (x if self.down is None else self.down(x)))

    class ResNet18(nn.Module):
        def __init__(self, width=64, classes=1000):
            super().__init__()
            self.stem = nn.Sequential(
                nn.Conv2d(3, width, 7, 2, 3, bias=False), nn.BatchNorm2d(width), nn.ReLU(), nn.MaxPool2d(3, 2, 1)
            )
            blocks, cin = [], width
            for stage in range(4):
                cout = width * 2**stage
                for b in range(2):
                    blocks.append(BasicBlock(cin, cout, 2 if (b == 0 and stage > 0) else 1))
                    cin = cout
            self.layers = nn.Sequential(*blocks)
            self.pool = nn.AdaptiveAvgPool2d(1)
            self.fc = nn.Linear(cin, classes)

        def forward(self, x):
            return self.fc(torch.flatten(self.pool(self.layers(self.stem(x))), 1))

    class BertEncoder(nn.Module):
        def __init__(self, vocab, seq, d, heads, ffn, layers):
            super().__init__()
            self.tok = nn.Embedding(vocab, d)
            self.pos = nn.Parameter(0.02 * torch.randn(1, seq, d))
            self.norm = nn.LayerNorm(d, eps=1e-12)
            layer = nn.TransformerEncoderLayer(d, heads, ffn, dropout=0.0, activation="gelu", batch_first=True,
                                               layer_norm_eps=1e-12)
            self.encoder = nn.TransformerEncoder(layer, layers, enable_nested_tensor=False)

        def forward(self, ids):
            return self.encoder(self.norm(self.tok(ids) + self.pos))

    class Attention(nn.Module):
        def __init__(self, d, heads):
            super().__init__()
            self.heads, self.hd = heads, d // heads
            self.q, self.k, self.v, self.o = (nn.Linear(d, d) for _ in range(4))

        def forward(self, x):
            b, n, d = x.shape
            q = self.q(x).reshape(b, n, self.heads, self.hd).transpose(1, 2)
            k = self.k(x).reshape(b, n, self.heads, self.hd).transpose(1, 2)
            v = self.v(x).reshape(b, n, self.heads, self.hd).transpose(1, 2)
            a = torch.softmax(q @ k.transpose(-2, -1) * self.hd**-0.5, dim=-1)
            return self.o((a @ v).transpose(1, 2).reshape(b, n, d))

    class VitBlock(nn.Module):
        def __init__(self, d, heads, ffn):
            super().__init__()
            self.norm1, self.attn = nn.LayerNorm(d, eps=1e-6), Attention(d, heads)
            self.norm2 = nn.LayerNorm(d, eps=1e-6)
            self.mlp = nn.Sequential(nn.Linear(d, ffn), nn.GELU(), nn.Linear(ffn, d))

        def forward(self, x):
            x = x + self.attn(self.norm1(x))
            return x + self.mlp(self.norm2(x))

    class ViT(nn.Module):
        def __init__(self, image, patch, d, heads, ffn, layers, classes):
            super().__init__()
            n = (image // patch) ** 2
            self.patch = nn.Conv2d(3, d, patch, stride=patch)
            self.cls = nn.Parameter(0.02 * torch.randn(1, 1, d))
            self.pos = nn.Parameter(0.02 * torch.randn(1, n + 1, d))
            self.blocks = nn.Sequential(*(VitBlock(d, heads, ffn) for _ in range(layers)))
            self.norm = nn.LayerNorm(d, eps=1e-6)
            self.head = nn.Linear(d, classes)

        def forward(self, x):
            x = self.patch(x).flatten(2).transpose(1, 2)
            x = torch.cat([self.cls.expand(x.shape[0], -1, -1), x], dim=1) + self.pos
            x = self.norm(self.blocks(x))
            return self.head(x[:, 0])

    return ResNet18, BertEncoder, ViT


def export_torch(name: str, size: dict, seed: int = 0) -> onnx.ModelProto:
    """Build the PyTorch model ``name`` (seeded, eval mode) and export it with the legacy
    TorchScript exporter (``dynamo=False``), opset 17, constant folding on."""
    import torch

    ResNet18, BertEncoder, ViT = _torch_modules()
    torch.manual_seed(seed)
    if name == "torch-resnet18":
        model = ResNet18(size["width"], size["classes"])
        with torch.no_grad():  # BatchNorm statistics that are not the identity
            for m in model.modules():
                if isinstance(m, torch.nn.BatchNorm2d):
                    m.running_mean.normal_(0, 0.1)
                    m.running_var.uniform_(0.5, 1.5)
        args = (torch.randn(1, 3, size["image"], size["image"]),)
        names = ["x"]
    elif name == "torch-bert":
        model = BertEncoder(**size)
        with torch.no_grad():  # nn.TransformerEncoder deep-copies one layer: give each its own weights
            for p in model.encoder.parameters():
                if p.dim() > 1:
                    p.copy_(torch.randn_like(p) / p.shape[-1] ** 0.5)
        args = (torch.randint(0, size["vocab"], (1, size["seq"])),)
        names = ["input_ids"]
    elif name == "torch-vit":
        model = ViT(**size)
        args = (torch.randn(1, 3, size["image"], size["image"]),)
        names = ["x"]
    else:
        raise KeyError(name)
    with torch.no_grad():  # PyTorch initializes norms to 1/0 and attention biases to 0: make them random
        for p in model.parameters():
            if p.dim() == 1:
                p.add_(0.1 * torch.randn_like(p))
    model.eval()
    f = io.BytesIO()
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        torch.onnx.export(model, args, f, dynamo=False, opset_version=17, input_names=names,
                          output_names=["y"], do_constant_folding=True)
    return onnx.load_from_string(f.getvalue())


# -- the round trip ----------------------------------------------------------------------------


def roundtrip(name: str, proto: onnx.ModelProto, target, seed: int = 0, **optimize_options) -> dict:
    """One model through load_onnx → optimize → check_model → onnxruntime (``--check``'s
    comparison: inputs and outputs by name, dynamic dimensions at two sizes). Returns a row; a
    failing stage is named in ``row["failed"]`` with its error (and no exception).
    ``optimize_options`` (budget, time_limit, ...) go to :func:`tvm_taso.optimize`."""
    row = {"model": name, "onnx_nodes": len(proto.graph.node), "ok": False, "stage": "load"}
    t0 = time.perf_counter()
    try:
        model = tvm_taso.load_onnx(proto, name=name)
        row["stage"] = "optimize"
        with warnings.catch_warnings(record=True) as caught:
            warnings.simplefilter("always", tvm_taso.TasoSkippedWarning)
            new, report = tvm_taso.optimize(model, target=target, **optimize_options)
        for w in caught:
            if issubclass(w.category, tvm_taso.TasoSkippedWarning):
                log.info("%s: %s", name, w.message)
        row.update(
            search_seconds=report["search_seconds"],
            applied=report["applied"],
            skipped=report["skipped"],
            cost_model=report["cost_model"]["name"],
            cost_before_us=report["cost_before"],
            cost_after_us=report["cost_after"],
            cost_ratio=(report["cost_after"] / report["cost_before"]) if report["cost_before"] else 1.0,
        )
        row["internal_error"] = any("internal error" in s["what"] for s in report["skipped"])
        row["exported_nodes"] = len(new.proto.graph.node)
        row["stage"] = "check_model"
        onnx.checker.check_model(new.proto, full_check=True)
        row["stage"] = "onnxruntime"
        check = check_onnx(model, new, seed=seed)
        row["max_rel_err"] = check["max_relative_error"]
        row["check"] = check
        row["ok"] = bool(check["ok"])
        row["stage"] = "done"
        if not row["ok"]:
            log.error("%s: output %s differs: relative error %.3g > %g", name, check["worst_output"],
                      check["max_relative_error"], check["tolerance"])
    except Exception as err:  # noqa: BLE001 - a failing model is a row, not the end of the run
        row["failed"] = f"{type(err).__name__}: {' '.join(str(err).split())}"
        row["traceback"] = traceback.format_exc()
        log.error("%s: %s failed: %s", name, row["stage"], row["failed"])
        log.debug("%s", row["traceback"])
    row["seconds"] = time.perf_counter() - t0
    return row


def markdown(rows: list[dict]) -> str:
    cols = ["model", "ONNX nodes before→after", "search s", "rules applied", "cost after/before",
            "max rel err", "check_model", "result"]
    lines = ["| " + " | ".join(cols) + " |", "|" + "---|" * len(cols)]
    for r in rows:
        applied = ", ".join(f"{k} ×{v}" for k, v in r.get("applied", {}).items()) or "—"
        if r.get("internal_error"):
            applied += " (discarded: internal error, function kept as is)"
        stage = r["stage"]
        cells = [
            r["model"],
            f"{r['onnx_nodes']}→{r['exported_nodes']}" if "exported_nodes" in r else str(r["onnx_nodes"]),
            f"{r['search_seconds']:.2f}" if "search_seconds" in r else "—",
            applied,
            f"{r['cost_ratio']:.3f}" if "cost_ratio" in r else "—",
            f"{r['max_rel_err']:.2e}" if "max_rel_err" in r else "—",
            "ok" if stage in ("onnxruntime", "done") else ("FAIL" if stage == "check_model" else "—"),
            "pass" if r["ok"] else f"FAIL ({stage}: {r.get('failed', 'mismatch')})",
        ]
        lines.append("| " + " | ".join(c.replace("|", "\\|") for c in cells) + " |")
    return "\n".join(lines)


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(prog="python -m benchmarks.roundtrip", description=__doc__.split("\n\n")[0])
    ap.add_argument("--torch", action="store_true", help="also models written in PyTorch, exported with torch.onnx.export")
    ap.add_argument("--quick", action="store_true", help="tiny sizes")
    ap.add_argument("--target", default="cuda", help="cuda or llvm: what the cost model prices for (default cuda)")
    ap.add_argument("--models", nargs="+", help="only these models (default: all)")
    ap.add_argument("--json", metavar="OUT", help="also write the rows as JSON to OUT")
    ap.add_argument("-v", "--verbose", action="store_true")
    args = ap.parse_args(argv)
    logging.basicConfig(level=logging.DEBUG if args.verbose else logging.INFO, format="%(levelname)s %(name)s: %(message)s")
    if not args.verbose:
        logging.getLogger("tvm_taso").setLevel(logging.WARNING)

    builders = onnx_builders(args.quick)
    if args.torch:
        builders.update(torch_builders(args.quick))
    if args.models:
        unknown = set(args.models) - set(builders)
        if unknown:
            ap.error(f"unknown models {sorted(unknown)} (choose from {sorted(builders)}; torch-* need --torch)")
        builders = {k: v for k, v in builders.items() if k in args.models}

    rows = []
    for name, build in builders.items():
        t0 = time.perf_counter()
        try:
            proto = build()
        except Exception as err:  # noqa: BLE001
            log.error("%s: building/exporting the ONNX model failed: %s: %s", name, type(err).__name__, err)
            rows.append({"model": name, "onnx_nodes": 0, "ok": False, "stage": "build",
                         "failed": f"{type(err).__name__}: {err}", "traceback": traceback.format_exc()})
            continue
        ops = sorted({n.op_type for n in proto.graph.node})
        log.info("%s: %d ONNX nodes (%s), %.0f MB, built in %.1f s", name, len(proto.graph.node), ", ".join(ops),
                 proto.ByteSize() / 1e6, time.perf_counter() - t0)
        row = roundtrip(name, proto, TARGETS.get(args.target, args.target))
        row["build_seconds"] = time.perf_counter() - t0 - row["seconds"]
        row["onnx_op_types"] = ops
        log.info("%s: %s in %.1f s", name, "pass" if row["ok"] else "FAIL", row["seconds"])
        rows.append(row)
        del proto
    print(markdown(rows))
    if args.json:
        with open(args.json, "w") as f:
            json.dump({"rows": rows, "target": args.target, "quick": args.quick,
                       "argv": sys.argv[1:] if argv is None else argv}, f, indent=2, default=str)
        log.info("wrote %s", args.json)
    return 0 if all(r["ok"] for r in rows) else 1


if __name__ == "__main__":
    sys.exit(main())
