"""A broad zoo of PyTorch models through ``tvm-taso optimize --check``: every torchvision
classification family (the smallest variant of each, random weights) and Hugging Face
architectures beyond the eight of :mod:`benchmarks.onnx_models` (encoders, decoders, vision;
random weights from small configs: nothing is downloaded). An on-demand benchmark, not a test.

    python -m benchmarks.zoo [--only NAMES] [--source torchvision hf] [--exporters classic dynamo]
        [--axes static dynamic] [--fp16 | --no-fp16] [--search backtrack eqsat] [--target cuda]
        [--json OUT] [--markdown OUT]

Every model x exporter (``torch.onnx.export(dynamo=False)`` and ``dynamo=True``) x axes (static,
or a dynamic batch) x dtype (float32; float16 for a few models, ``model.half()`` on float16
inputs) is exported once and optimized by each search, through the path
:func:`benchmarks.onnx_models.run` takes (``optimize --check --report``, ``onnx.checker``, the
interface compared). A row per model x exporter x axes x dtype x search: the exit status, the
interface kept, the check's error, rules applied, estimated cost ratio, search seconds, node
counts and, without a rewrite, why (nothing matched / nothing cheaper / opaque ops and the
reason the engine gave). A model an exporter cannot export, or exports into a model onnxruntime
cannot load, is a row saying so; every other failure is a row too, and makes the exit status
non-zero. Writes
``benchmarks/results/zoo.json`` (after every model, so an interrupted run keeps what it did).
Needs ``pip install -e ".[zoo]"``.
"""

from __future__ import annotations

import argparse
import contextlib
import io
import json
import logging
import re
import shutil
import statistics
import sys
import tempfile
import time
from collections import Counter
from pathlib import Path

from tvm_taso.files import write_text_atomically

from .onnx_models import TEXT, VISION, _text, _vision, export_module, import_torchvision, run

log = logging.getLogger("benchmarks.zoo")

RESULTS = Path(__file__).parent / "results" / "zoo.json"
SEARCHES = ("backtrack", "eqsat")

# torchvision: the smallest variant of each classification family
TORCHVISION = ("alexnet", "vgg11", "resnet18", "resnext50_32x4d", "wide_resnet50_2", "densenet121", "inception_v3",
               "googlenet", "squeezenet1_1", "shufflenet_v2_x0_5", "mobilenet_v2", "mobilenet_v3_small", "mnasnet0_5",
               "efficientnet_b0", "efficientnet_v2_s", "regnet_y_400mf", "convnext_tiny", "vit_b_32", "swin_t",
               "maxvit_t")
# constructor arguments and image size where the defaults (none, 224x224) do not do: without the
# auxiliary classifiers (they only run in training), initialized as the paper says (no warning)
NEEDS = {"inception_v3": ({"aux_logits": False, "init_weights": True}, 299),
         "googlenet": ({"aux_logits": False, "init_weights": True}, 224)}

# the models also exported in half precision
FP16 = ("resnet18", "efficientnet_b0", "distilbert", "qwen2")


def hf_builders() -> dict:
    """name -> (batch) -> (torch module, example inputs by name, dynamic axis names): Hugging
    Face architectures from small configs, none of them among :func:`benchmarks.onnx_models.builders`."""
    import_torchvision()  # before any transformers model class (they import torchvision)
    import torch
    import transformers as tf

    small = dict(hidden_size=64, num_hidden_layers=2, num_attention_heads=4, intermediate_size=128)
    lm = dict(vocab_size=100, max_position_embeddings=256, use_cache=False)

    def text(model_cls, config, **kw):
        return lambda batch: _text(model_cls, config, 100, batch=batch, **kw)

    def vision(model_cls, config, image: int):
        return lambda batch: _vision(model_cls, config, image, batch=batch)

    def whisper_encoder(batch: int):
        from transformers.models.whisper.modeling_whisper import WhisperEncoder

        config = tf.WhisperConfig(num_mel_bins=16, d_model=64, encoder_layers=2, encoder_attention_heads=4,
                                  encoder_ffn_dim=128, max_source_positions=32, vocab_size=100, pad_token_id=0,
                                  bos_token_id=1, eos_token_id=2, decoder_start_token_id=1)
        # log-mel frames: twice the encoder's positions (its second convolution has stride 2)
        return WhisperEncoder(config), {"input_features": torch.randn(batch, 16, 64)}, VISION

    return {
        # encoders
        "distilbert": text(tf.DistilBertModel, tf.DistilBertConfig(vocab_size=100, max_position_embeddings=256,
                                                                   dim=64, n_layers=2, n_heads=4, hidden_dim=128)),
        "roberta": text(tf.RobertaModel, tf.RobertaConfig(vocab_size=100, max_position_embeddings=256, **small)),
        # factorized embeddings, one layer's weights shared by all layers
        "albert": text(tf.AlbertModel, tf.AlbertConfig(vocab_size=100, embedding_size=32, **small)),
        "electra": text(tf.ElectraModel, tf.ElectraConfig(vocab_size=100, embedding_size=32, **small)),
        # disentangled attention: relative positions in both directions
        "deberta_v2": text(tf.DebertaV2Model, tf.DebertaV2Config(vocab_size=100, max_position_embeddings=256,
                                                                 **small)),
        # RMSNorm without bias, relative position buckets
        "t5_encoder": text(tf.T5EncoderModel, tf.T5Config(vocab_size=100, d_model=64, d_kv=16, d_ff=128,
                                                          num_layers=2, num_heads=4, use_cache=False)),
        # encoder-decoder (decoder inputs: the input ids shifted right), cross-attention
        "bart": text(tf.BartModel, tf.BartConfig(vocab_size=100, d_model=64, encoder_layers=2, decoder_layers=2,
                                                 encoder_attention_heads=4, decoder_attention_heads=4,
                                                 encoder_ffn_dim=128, decoder_ffn_dim=128,
                                                 max_position_embeddings=256, use_cache=False)),
        "whisper_encoder": whisper_encoder,
        # decoders
        "opt": text(tf.OPTModel, tf.OPTConfig(vocab_size=100, max_position_embeddings=256, hidden_size=64,
                                              num_hidden_layers=2, num_attention_heads=4, ffn_dim=128,
                                              word_embed_proj_dim=64, use_cache=False)),
        # alternating global and local (windowed) attention
        "gpt_neo": text(tf.GPTNeoModel, tf.GPTNeoConfig(vocab_size=100, max_position_embeddings=256, hidden_size=64,
                                                        num_layers=2, num_heads=4, intermediate_size=128,
                                                        attention_types=[[["global", "local"], 1]], window_size=8,
                                                        bos_token_id=0, eos_token_id=0, use_cache=False)),
        # sliding-window attention, grouped-query attention
        "mistral": text(tf.MistralModel, tf.MistralConfig(num_key_value_heads=2, sliding_window=8, **lm, **small)),
        # biased q/k/v projections
        "qwen2": text(tf.Qwen2Model, tf.Qwen2Config(num_key_value_heads=2, **lm, **small)),
        # attention and MLP in parallel, partial rotary embeddings
        "phi": text(tf.PhiModel, tf.PhiConfig(partial_rotary_factor=0.5, **lm, **small)),
        # GeGLU MLP, scaled embeddings, multi-query attention
        "gemma": text(tf.GemmaModel, tf.GemmaConfig(head_dim=16, num_key_value_heads=1, **lm, **small)),
        # vision
        # shifted windows, relative position bias, patch merging
        "swin": vision(tf.SwinModel, tf.SwinConfig(image_size=64, patch_size=4, embed_dim=16, depths=[1, 1, 2, 1],
                                                   num_heads=[1, 2, 4, 8], window_size=2), 64),
        # a distillation token beside the class token
        "deit": vision(tf.DeiTModel, tf.DeiTConfig(image_size=32, patch_size=8, **small), 32),
        # relative position bias, layer scale
        "beit": vision(tf.BeitModel, tf.BeitConfig(image_size=32, patch_size=8, use_relative_position_bias=True,
                                                   **small), 32),
        # efficient self-attention (reduced keys), Mix-FFN (depthwise convolution)
        "segformer": vision(tf.SegformerModel, tf.SegformerConfig(
            depths=[1, 1, 1, 1], hidden_sizes=[16, 32, 64, 128], num_attention_heads=[1, 2, 4, 8],
            decoder_hidden_size=64), 64),
        # convolutions and transformers on unfolded patches
        "mobilevit": vision(tf.MobileViTModel, tf.MobileViTConfig(
            image_size=64, hidden_sizes=[64, 80, 96], neck_hidden_sizes=[16, 16, 24, 48, 64, 80, 320]), 64),
    }


def build(name: str, batch: int, dtype: str):
    """(torch module in eval mode, example inputs by name, dynamic axis names) of model ``name``,
    in ``dtype`` (``float16``: the module's weights and its float inputs)."""
    import torch

    if name in TORCHVISION:
        kwargs, image = NEEDS.get(name, ({}, 224))
        models = import_torchvision().models
        module, inputs, dyn = getattr(models, name)(weights=None, **kwargs), \
            {"x": torch.randn(batch, 3, image, image)}, VISION
    else:
        module, inputs, dyn = hf_builders()[name](batch)
        dyn = VISION if dyn == TEXT else dyn  # a dynamic batch only: the sequence stays static
    module = module.eval()
    if dtype == "float16":
        module = module.half()
        inputs = {k: v.half() if v.is_floating_point() else v for k, v in inputs.items()}
    return module, inputs, dyn


def export(name: str, exporter: str, axes: str, path: Path, dtype: str = "float32") -> None:
    """Model ``name`` exported to ``path``: at batch 1 when static, at batch 2 with the batch
    dynamic (the dynamo exporter specializes a size-1 dimension to 1)."""
    export_module(*build(name, 2 if axes == "dynamic" else 1, dtype), exporter, axes, path)


def why_no_rewrite(report: dict) -> dict:
    """The report's facts behind the row: known ONNX ops the engine left opaque (and why) and,
    when nothing was applied, the reason (``no_rewrite``): ``opaque ops: ...`` when no rule
    matched and known ops were left opaque, ``nothing matched`` when no rule matched otherwise,
    ``nothing cheaper`` when rewrites were tried and none was cheaper (``rewrites not written``
    when the cheaper ones could not be written as ONNX)."""
    opaque = {what.removeprefix("ONNX op "): reason for what, reason in report.get("opaque_reasons", {}).items()}
    facts = {"candidates": report["candidates"], "regions": report["regions"],
             "regions_stopped": report["regions_stopped"], "opaque": opaque,
             "rejected_rewrites": report.get("rejected_rewrites", [])}
    if report["applied"]:
        return facts
    by_reason: dict[str, list[str]] = {}
    for op, reason in opaque.items():  # tensor names left out: one line per reason
        by_reason.setdefault(re.sub(r"'[^']*'", "a tensor", reason), []).append(op)
    ops = "; ".join(f"{', '.join(names)}: {reason}" for reason, names in by_reason.items())
    if facts["rejected_rewrites"]:
        why = "rewrites not written: " + facts["rejected_rewrites"][0]
    elif report["candidates"]:
        why = "nothing cheaper" + (f" (opaque ops: {ops})" if ops else "")
    elif ops:
        why = f"opaque ops: {ops}"
    else:
        why = "nothing matched"
    return {**facts, "no_rewrite": why}


def outcome(row: dict) -> str:
    """``cannot export``, ``export rejected by onnxruntime`` (it cannot load the exported model:
    the exporter's fault, not tvm-taso's), ``failed``, ``rewritten`` or the no-rewrite class of a
    row. An exported model onnxruntime loads but does not run on ``--check``'s inputs is a failure."""
    if not row["ok"]:
        if row["stage"] == "export":
            return "cannot export"
        return "export rejected by onnxruntime" if "cannot load the original model" in row["failed"] else "failed"
    if row.get("applied"):
        return "rewritten"
    return "no rewrite: " + re.split(r"[:(]", row["no_rewrite"])[0].strip()


def table(rows: list[dict]) -> str:
    lines = ["| model | exporter | axes | dtype | search | exit | interface | nodes | max rel err | est. cost ratio "
             "| search s | rules applied / why not / failure |",
             "|---|---|---|---|---|---|---|---|---|---|---|---|"]

    def num(r, key, fmt):
        return format(r[key], fmt) if r.get(key) is not None else "—"

    for r in rows:
        nodes = f"{r['nodes_before']}→{r['nodes_after']}" if "nodes_after" in r else str(r.get("nodes_before", "—"))
        same = {True: "same", False: "CHANGED", None: "—"}[r.get("interface_same")]
        if not r["ok"]:
            kind = outcome(r)
            what = (f"FAIL at {r['stage']}: " if kind == "failed" else f"{kind}: ") + r.get("failed", "")
        elif r.get("applied"):
            what = ", ".join(f"{k} x{v}" for k, v in r["applied"].items())
        else:
            what = "no rewrite: " + r["no_rewrite"]
        lines.append(f"| {r['model']} | {r['exporter']} | {r['axes']} | {r['dtype']} | {r['search']} | "
                     f"{r.get('exit_status', '—')} | {same} | {nodes} | {num(r, 'max_rel_err', '.1e')} | "
                     f"{num(r, 'cost_ratio', '.3f')} | {num(r, 'search_seconds', '.2f')} | "
                     f"{what.replace('|', '/')} |")
    return "\n".join(lines)


def per_model(rows: list[dict]) -> str:
    """One line per model over all its rows (exporters, axes, dtypes, searches): what ran and
    passed, exit statuses, interfaces, the largest check error, the rules applied, the range of
    estimated cost ratios, the median search seconds, and the reasons for rows without a rewrite."""
    lines = ["| model | source | rows passed | exit | interface | max rel err | rules applied | est. cost ratio "
             "| search s (median) | without a rewrite: why |",
             "|---|---|---|---|---|---|---|---|---|---|"]
    by_model: dict[str, list[dict]] = {}
    for r in rows:
        by_model.setdefault(r["model"], []).append(r)
    for name, mine in by_model.items():
        ran = [r for r in mine if outcome(r) not in ("cannot export", "export rejected by onnxruntime")]
        ok = [r for r in ran if r["ok"]]
        statuses = Counter(str(r.get("exit_status", "—")) for r in ran)
        same = {r.get("interface_same") for r in ran}
        errors = [r["max_rel_err"] for r in ok if r.get("max_rel_err") is not None]
        rules = Counter()
        for r in ok:
            rules.update(r.get("applied") or {})
        ratios = sorted(r["cost_ratio"] for r in ok if r.get("cost_ratio") is not None)
        seconds = [r["search_seconds"] for r in ok if r.get("search_seconds") is not None]
        whys = Counter(r["no_rewrite"] for r in ok if not r.get("applied") and r.get("no_rewrite"))
        skipped = Counter(outcome(r) for r in mine if r not in ran)
        passed = f"{len(ok)}/{len(ran)}" + "".join(f"; {k} {n}" for k, n in skipped.items())
        lines.append(
            f"| {name} | {mine[0].get('source', '')} | {passed} | "
            + ", ".join(f"{k}×{n}" for k, n in sorted(statuses.items())) + " | "
            + ("same" if same == {True} else "—" if not ran else "CHANGED") + " | "
            + (f"{max(errors):.1e}" if errors else "—") + " | "
            + (", ".join(sorted(rules)) or "none") + " | "
            + (f"{ratios[0]:.3f}–{ratios[-1]:.3f}" if ratios else "—") + " | "
            + (f"{statistics.median(seconds):.2f}" if seconds else "—") + " | "
            + "; ".join(f"{why} (×{n})" for why, n in whys.most_common()).replace("|", "/") + " |")
    return "\n".join(lines)


def write_markdown(args, rows: list[dict]) -> None:
    Path(args.markdown).parent.mkdir(parents=True, exist_ok=True)
    write_text_atomically(args.markdown, f"# tvm-taso zoo (target {args.target})\n\n{summary(rows)}\n\n"
                                         f"## Per model\n\n{per_model(rows)}\n\n## Every row\n\n{table(rows)}\n")
    print(f"wrote {args.markdown}")


def summary(rows: list[dict]) -> str:
    outcomes = Counter(outcome(r) for r in rows)
    no_rewrite = ", ".join(f"{k.removeprefix('no rewrite: ')} {n}" for k, n in sorted(outcomes.items())
                           if k.startswith("no rewrite"))
    return (f"{len(rows)} rows: {sum(r['ok'] for r in rows)} passed, {outcomes['failed']} failed, "
            f"{outcomes['cannot export']} cannot export, {outcomes['export rejected by onnxruntime']} exported but "
            f"rejected by onnxruntime; {outcomes['rewritten']} with a rewrite, "
            f"{sum(n for k, n in outcomes.items() if k.startswith('no rewrite'))} without"
            + (f" ({no_rewrite})" if no_rewrite else ""))


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(prog="python -m benchmarks.zoo", description=__doc__.split("\n\n")[0])
    ap.add_argument("--only", nargs="+", metavar="NAME", help="only these models (default all)")
    ap.add_argument("--source", nargs="+", default=["torchvision", "hf"], choices=["torchvision", "hf"])
    ap.add_argument("--exporters", nargs="+", default=["classic", "dynamo"], choices=["classic", "dynamo"])
    ap.add_argument("--axes", nargs="+", default=["static", "dynamic"], choices=["static", "dynamic"])
    ap.add_argument("--fp16", action=argparse.BooleanOptionalAction, default=True,
                    help=f"also export {', '.join(FP16)} in float16 (default on)")
    ap.add_argument("--search", nargs="+", default=list(SEARCHES), choices=["backtrack", "eqsat", "auto"],
                    help="the searches tvm-taso optimize runs, each on every exported model (default backtrack eqsat)")
    ap.add_argument("--target", default="cuda", help="what the cost model prices for (default cuda)")
    ap.add_argument("--json", default=str(RESULTS), help=f"where to write the rows (default {RESULTS})")
    ap.add_argument("--markdown", metavar="OUT", help="also write the table as markdown to OUT")
    ap.add_argument("--render", action="store_true",
                    help="run nothing: write --markdown from the rows in --json (a figure cannot drift from its file)")
    ap.add_argument("-v", "--verbose", action="store_true")
    args = ap.parse_args(argv)
    if args.render:
        if not args.markdown:
            ap.error("--render writes --markdown: give it")
        write_markdown(args, json.loads(Path(args.json).read_text())["rows"])
        return 0
    logging.basicConfig(level=logging.DEBUG if args.verbose else logging.INFO, format="%(name)s: %(message)s")
    sources = {"torchvision": list(TORCHVISION), "hf": list(hf_builders())}
    known = [n for names in sources.values() for n in names]
    unknown = sorted(set(args.only or ()) - set(known))
    if unknown:
        ap.error(f"unknown model(s) {', '.join(unknown)}; choose from {', '.join(known)}")
    names = [n for s in args.source for n in sources[s] if not args.only or n in args.only]
    if args.only and len(names) < len(set(args.only)):
        log.warning("--only names models outside --source %s: %s", " ".join(args.source),
                    ", ".join(sorted(set(args.only) - set(names))))
    rows: list[dict] = []
    t0 = time.perf_counter()
    for k, name in enumerate(names, 1):
        source = "torchvision" if name in TORCHVISION else "hf"
        log.info("[%d/%d] %s (%s)", k, len(names), name, source)
        work = Path(tempfile.mkdtemp(prefix="tvm-taso-zoo-"))
        try:
            for dtype in ["float32"] + (["float16"] if args.fp16 and name in FP16 else []):
                for exporter in args.exporters:
                    for axes in args.axes:
                        for search in args.search:
                            # the command's own lines only with --verbose: its results are the row
                            with contextlib.redirect_stdout(io.StringIO()) as said, \
                                    contextlib.redirect_stderr(said):
                                row = run(name, exporter, axes, args.target, work, search, export=export,
                                          fields={"dtype": dtype}, describe=why_no_rewrite)
                            log.debug("%s", said.getvalue())
                            row["source"] = source
                            log.info("  %s %s %s %s: %s in %.1f s", exporter, axes, dtype, search,
                                     outcome(row) + (f" ({row['failed']})" if not row["ok"] else ""), row["seconds"])
                            rows.append(row)
        finally:
            shutil.rmtree(work, ignore_errors=True)
        write(args, rows, time.perf_counter() - t0)
    print(table(rows))
    if args.markdown:
        write_markdown(args, rows)
    print(f"wrote {args.json}")
    print(summary(rows) + f" ({time.perf_counter() - t0:.0f} s)")
    return 1 if any(outcome(r) == "failed" for r in rows) else 0


def write(args, rows: list[dict], seconds: float) -> None:
    """The rows so far as JSON, atomically."""
    Path(args.json).parent.mkdir(parents=True, exist_ok=True)
    write_text_atomically(args.json, json.dumps({"target": args.target, "search": args.search, "seconds": seconds,
                                                 "summary": summary(rows), "rows": rows}, indent=1, default=str)
                          + "\n")


if __name__ == "__main__":
    sys.exit(main())
