"""The ONNX workflow on models as users have them: Hugging Face architectures (random weights,
built from a config: nothing is downloaded) exported by PyTorch, through ``tvm-taso optimize
--check``.

    python -m benchmarks.onnx_models [--target cuda] [--search backtrack eqsat auto]
        [--models bert gpt2 ...] [--exporters classic dynamo] [--axes static dynamic] [--json OUT]

For every model x exporter (``torch.onnx.export(dynamo=False)`` and ``dynamo=True``) x axes
(static, or dynamic batch / sequence): ``tvm-taso optimize --check`` (onnxruntime, inputs and
outputs by name, dynamic dimensions at two sizes), ``onnx.checker.check_model(full_check=True)``
on the result, and its interface (input and output names, element types, dimensions, symbolic
ones included) compared with the original's. Prints a table and the rules applied per model,
writes ``benchmarks/results/onnx_models.json``. With several ``--search`` values, each exported
model is optimized by each search in turn, and a side-by-side table compares their estimated
costs and search seconds. Needs ``torch``, ``transformers`` and, for the dynamo exporter,
``onnxscript`` (``pip install -e ".[onnx-models]"``).
"""

from __future__ import annotations

import argparse
import contextlib
import io
import json
import logging
import sys
import tempfile
import time
import traceback
import warnings
from pathlib import Path
from typing import Callable

import onnx

from tvm_taso.files import write_text_atomically

log = logging.getLogger("benchmarks.onnx_models")

RESULTS = Path(__file__).parent / "results" / "onnx_models.json"
TEXT, VISION = ("batch", "seq"), ("batch",)


def _text(model_cls, config, vocab: int, seq: int = 16, mask: bool = True, batch: int = 2):
    import torch

    ids = torch.randint(0, vocab, (batch, seq))
    inputs = {"input_ids": ids}
    if mask:
        inputs["attention_mask"] = torch.ones(batch, seq, dtype=torch.int64)
    return model_cls(config), inputs, TEXT


def _vision(model_cls, config, image: int, batch: int = 2):
    import torch

    return model_cls(config), {"pixel_values": torch.randn(batch, 3, image, image)}, VISION


def import_torchvision():
    """``torchvision`` (None when it is not installed), imported so that it works on the CPU
    build of torch. Call it before using a ``transformers`` model class: transformers imports
    torchvision whenever it is installed, and fails with it."""
    import importlib.util

    if importlib.util.find_spec("torchvision") is None:
        return None
    import torch

    # torchvision 0.28's wheel registers fake kernels for its C++ ops when imported; the CPU build
    # of torch lacks those ops, so `import torchvision` fails ("operator torchvision::nms does not
    # exist"). The fakes only serve tracing detection ops (nms, roi_align...) that no model here
    # uses: register_fake is a no-op decorator during the import, and restored right after.
    register_fake = torch.library.register_fake
    torch.library.register_fake = lambda *args, **kwargs: (lambda fn: fn)
    try:
        import torchvision
    finally:
        torch.library.register_fake = register_fake
    return torchvision


def builders() -> dict:
    """name -> () -> (torch module, example inputs by name, dynamic axis names)."""
    import_torchvision()
    import transformers as tf

    small = dict(hidden_size=64, num_hidden_layers=2, num_attention_heads=4, intermediate_size=128)
    return {
        "bert": lambda: _text(tf.BertModel, tf.BertConfig(vocab_size=100, max_position_embeddings=256, **small), 100),
        "gpt2": lambda: _text(tf.GPT2Model, tf.GPT2Config(vocab_size=100, n_positions=256, n_embd=64, n_layer=2,
                                                          n_head=4), 100, mask=False),
        "vit": lambda: _vision(tf.ViTModel, tf.ViTConfig(image_size=32, patch_size=8, **small), 32),
        "resnet50": lambda: _vision(tf.ResNetModel, tf.ResNetConfig(
            embedding_size=16, hidden_sizes=[32, 64, 128, 256], depths=[3, 4, 6, 3], layer_type="bottleneck"), 64),
        # rotary position embeddings, a gated (SiLU) MLP, RMSNorm, grouped-query attention
        "llama": lambda: _text(tf.LlamaModel, tf.LlamaConfig(vocab_size=100, max_position_embeddings=256,
                                                             num_key_value_heads=2, **small), 100),
        # depthwise convolutions, TF-style computed padding
        "mobilenet_v2": lambda: _vision(tf.MobileNetV2Model, tf.MobileNetV2Config(
            image_size=64, depth_multiplier=0.35), 64),
        # depthwise 7x7 convolutions, channels-last LayerNorm, GELU
        "convnext": lambda: _vision(tf.ConvNextModel, tf.ConvNextConfig(
            depths=[1, 1, 2, 1], hidden_sizes=[16, 32, 64, 128]), 64),
        # squeeze-and-excitation blocks, grouped convolutions
        "regnet_y": lambda: _vision(tf.RegNetModel, tf.RegNetConfig(
            layer_type="y", depths=[1, 1, 2, 1], hidden_sizes=[16, 32, 64, 128], groups_width=8), 64),
    }


def export(name: str, exporter: str, axes: str, path: Path) -> None:
    """Export model ``name`` to ``path`` with the ``classic`` or ``dynamo`` exporter, ``static``
    or with ``dynamic`` batch (and sequence) axes; the output is the model's last hidden state."""
    export_module(*builders()[name](), exporter, axes, path)


def export_module(module, inputs: dict, dyn: tuple, exporter: str, axes: str, path: Path) -> None:
    """Export the torch ``module`` called on ``inputs`` (by name, at most two) to ``path`` with the
    ``classic`` or ``dynamo`` exporter, ``static`` or with the ``dyn`` axes of every input
    ``dynamic`` (named, in order); the output is the module's first output."""
    import torch

    names = list(inputs)

    class FirstOutput(torch.nn.Module):
        """The model's last hidden state, its inputs by position (as the classic exporter passes them)."""

        def __init__(self, inner):
            super().__init__()
            self.inner = inner

        def forward(self, first, second=None):
            return self.inner(**dict(zip(names, (first, second)[: len(names)])))[0]

    module = FirstOutput(module).eval()
    dynamic_axes = dynamic_shapes = None
    if axes == "dynamic" and exporter == "classic":
        dynamic_axes = {n: dict(enumerate(dyn)) for n in names}
    elif axes == "dynamic":
        dims = {d: torch.export.Dim(d, min=2, max=256) for d in dyn}
        dynamic_shapes = tuple({k: dims[d] for k, d in enumerate(dyn)} for _ in names)
    with torch.no_grad(), warnings.catch_warnings():
        warnings.simplefilter("ignore")
        torch.onnx.export(module, tuple(inputs.values()), str(path), input_names=names, output_names=["output"],
                          dynamo=exporter == "dynamo", opset_version=18,
                          **({"dynamic_shapes": dynamic_shapes} if exporter == "dynamo"
                             else {"dynamic_axes": dynamic_axes, "do_constant_folding": True}))


def interface(model: onnx.ModelProto) -> list[bytes]:
    """The graph's inputs and outputs (names, element types, dimensions) as comparable bytes."""
    return [v.SerializeToString() for v in list(model.graph.input) + list(model.graph.output)]


def run(name: str, exporter: str, axes: str, target: str, work: Path, search: str = "backtrack", *,
        export: Callable[..., None] = export, fields: dict | None = None,
        describe: Callable[[dict], dict] | None = None) -> dict:
    """One row: model ``name`` exported by ``export(name, exporter, axes, path, **fields)`` into
    ``work`` (once: the next search's run reuses the file, or the export's failure), through
    ``tvm-taso optimize --check --report`` with ``search``, its result checked with
    ``onnx.checker`` and its interface compared with the original's. ``fields`` go into the row
    and the exported file's name; ``describe(report)`` adds its own entries to the row."""
    from tvm_taso.cli.main import main as cli

    fields = fields or {}
    row = {"model": name, "exporter": exporter, "axes": axes, **fields, "search": search, "ok": False,
           "stage": "export"}
    stem = "-".join([name, exporter, axes, *map(str, fields.values())])
    src, failed = work / f"{stem}.onnx", work / f"{stem}.export-failed"
    out, rep = work / "out.onnx", work / "report.json"
    t0 = time.perf_counter()
    try:
        if failed.exists():  # another search's run could not export it: no second try
            raise ExportFailed(failed.read_text())
        if not src.exists():  # another search's run exported it already
            try:
                export(name, exporter, axes, src, **fields)
            except Exception as err:
                failed.write_text(_one_line(err))
                raise ExportFailed(failed.read_text()) from err
            row["export_seconds"] = time.perf_counter() - t0
        original = onnx.load(src)
        row["nodes_before"] = len(original.graph.node)
        row["stage"] = "tvm-taso optimize --check"
        t1 = time.perf_counter()
        stderr = io.StringIO()
        with contextlib.redirect_stderr(_Tee(sys.stderr, stderr)):
            status = cli(["optimize", str(src), "-o", str(out), "--target", target, "--search", search, "--check",
                          "--report", str(rep)])
        row["optimize_seconds"] = time.perf_counter() - t1
        row["exit_status"] = status
        if status in (130, 143):  # the command caught SIGINT or SIGTERM: stop here too
            raise KeyboardInterrupt if status == 130 else SystemExit(status)
        if status != 0:
            errors = [ln for ln in stderr.getvalue().splitlines() if ln.startswith("tvm-taso: error: ")]
            raise RuntimeError(f"tvm-taso optimize exited with {status}"
                               + (f": {errors[-1].removeprefix('tvm-taso: error: ')}" if errors else ""))
        report = json.loads(rep.read_text())
        optimized = onnx.load(out)
        row.update(nodes_after=len(optimized.graph.node), applied=report["applied"],
                   search_seconds=report["search_seconds"], cost_ratio=report["cost_after"] / report["cost_before"]
                   if report["cost_before"] else 1.0, skipped=[s["what"] for s in report["skipped"]],
                   max_rel_err=report["check"]["max_relative_error"],
                   check_runs=[r.get("dims") for r in report["check"]["runs"] if "skipped" not in r],
                   priced_dims=report.get("priced_dims"))
        if describe is not None:
            row.update(describe(report))
        row["stage"] = "check_model"
        onnx.checker.check_model(optimized, full_check=True)
        row["stage"] = "interface"
        row["interface_same"] = interface(optimized) == interface(original)
        if not row["interface_same"]:
            raise AssertionError("the optimized model's inputs or outputs differ from the original's")
        if axes == "dynamic" and len(row["check_runs"]) < 2:
            raise AssertionError("the dynamic model was not checked at two sizes")
        row["ok"], row["stage"] = True, "done"
    except Exception as err:  # noqa: BLE001 - one failing model is a row, not the end of the run
        row["failed"] = str(err) if isinstance(err, ExportFailed) else _one_line(err)
        log.debug("%s", traceback.format_exc())
    row["seconds"] = time.perf_counter() - t0
    return row


def _one_line(err: Exception) -> str:
    return f"{type(err).__name__}: {' '.join(str(err).split())[:500]}"


class ExportFailed(Exception):
    """The exporter could not export the model (the message is the exporter's error)."""


class _Tee(io.TextIOBase):
    """A text stream writing to each of ``streams`` (the console, and a buffer to read back)."""

    def __init__(self, *streams):
        super().__init__()
        self.streams = streams

    def write(self, text: str) -> int:
        for stream in self.streams:
            stream.write(text)
        return len(text)

    def flush(self) -> None:
        for stream in self.streams:
            stream.flush()


def table(rows: list[dict]) -> str:
    lines = ["| model | exporter | axes | search | nodes | search s | est. cost ratio | max rel err | result |",
             "|---|---|---|---|---|---|---|---|---|"]
    for r in rows:
        nodes = f"{r['nodes_before']}→{r['nodes_after']}" if "nodes_after" in r else str(r.get("nodes_before", "—"))
        lines.append(f"| {r['model']} | {r['exporter']} | {r['axes']} | {r['search']} | {nodes} | "
                     f"{r.get('search_seconds', float('nan')):.2f} | {r.get('cost_ratio', float('nan')):.3f} | "
                     f"{r.get('max_rel_err', float('nan')):.1e} | "
                     f"{'pass' if r['ok'] else 'FAIL at ' + r['stage'] + ': ' + r.get('failed', '')} |")
    return "\n".join(lines)


def side_by_side(rows: list[dict], searches: list[str]) -> str:
    """Each model x exporter x axes that every search optimized: est. cost ratio and search
    seconds per search, the first search the reference for the rest."""
    by_case: dict = {}
    for r in rows:
        if r["ok"]:
            by_case.setdefault((r["model"], r["exporter"], r["axes"]), {})[r["search"]] = r
    head = " | ".join(f"{s}: cost ratio, s" for s in searches)
    lines = [f"| model | exporter | axes | {head} | " + " | ".join(f"{s} cost / {searches[0]}, time / {searches[0]}"
                                                              for s in searches[1:]) + " |",
             "|---|---|---|" + "---|" * (2 * len(searches) - 1)]
    for (model, exporter, axes), found in by_case.items():
        if len(found) < len(searches):
            continue
        ref = found[searches[0]]
        cells = [f"{found[s]['cost_ratio']:.3f}, {found[s]['search_seconds']:.2f}" for s in searches]
        cells += [f"{found[s]['cost_ratio'] / ref['cost_ratio']:.3f}, "
                  f"{found[s]['search_seconds'] / max(ref['search_seconds'], 1e-9):.2f}" for s in searches[1:]]
        lines.append(f"| {model} | {exporter} | {axes} | " + " | ".join(cells) + " |")
    return "\n".join(lines)


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(prog="python -m benchmarks.onnx_models", description=__doc__.split("\n\n")[0])
    ap.add_argument("--target", default="cuda", help="what the cost model prices for (default cuda)")
    ap.add_argument("--search", nargs="+", default=["backtrack"], choices=["backtrack", "eqsat", "auto"],
                    help="the searches tvm-taso optimize runs, each on every exported model (default backtrack)")
    ap.add_argument("--models", nargs="+", help="only these models (default all)")
    ap.add_argument("--exporters", nargs="+", default=["classic", "dynamo"], choices=["classic", "dynamo"])
    ap.add_argument("--axes", nargs="+", default=["static", "dynamic"], choices=["static", "dynamic"])
    ap.add_argument("--json", default=str(RESULTS), help=f"where to write the rows (default {RESULTS})")
    ap.add_argument("-v", "--verbose", action="store_true")
    args = ap.parse_args(argv)
    logging.basicConfig(level=logging.DEBUG if args.verbose else logging.INFO, format="%(name)s: %(message)s")
    names = args.models or list(builders())
    rows = []
    with tempfile.TemporaryDirectory(prefix="tvm-taso-onnx-models-") as tmp:
        for name in names:
            for exporter in args.exporters:
                for axes in args.axes:
                    for search in args.search:
                        row = run(name, exporter, axes, args.target, Path(tmp), search)
                        log.info("%s %s %s %s: %s in %.1f s %s", name, exporter, axes, search,
                                 "pass" if row["ok"] else "FAIL", row["seconds"], row.get("failed", ""))
                        rows.append(row)
    print(table(rows))
    if len(args.search) > 1:
        print("\nside by side (est. cost ratio: after / before under the analytic model; search seconds):")
        print(side_by_side(rows, args.search))
    print("\nrules applied per model:")
    for r in rows:
        applied = ", ".join(f"{k} x{v}" for k, v in (r.get("applied") or {}).items()) or "none"
        print(f"  {r['model']:13s} {r['exporter']:8s} {r['axes']:8s} {r['search']:9s} {applied}")
    Path(args.json).parent.mkdir(parents=True, exist_ok=True)
    write_text_atomically(args.json, json.dumps({"target": args.target, "search": args.search, "rows": rows},
                                                indent=1, default=str) + "\n")
    print(f"\nwrote {args.json}")
    return 0 if all(r["ok"] for r in rows) else 1


if __name__ == "__main__":
    sys.exit(main())
