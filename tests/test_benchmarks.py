"""The benchmark suite: every model builds at full size as TASO describes it, and the harness
(``python -m benchmarks.run --quick``) runs end to end on tiny versions -- search, TVM timing
with and without TasoOptimize, onnxruntime timing of the exported model, numerical check."""

import collections
import json
import sys
from pathlib import Path

import onnx
import pytest

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))  # benchmarks/ is not installed
from benchmarks import models, run  # noqa: E402

pytest.importorskip("onnxruntime")


def _ops(model):
    return collections.Counter(n.op_type for n in model.graph.node)


def _params(model):
    return sum(int(onnx.numpy_helper.to_array(t).size) for t in model.graph.initializer)


def test_cnn_builders_follow_torchvision():
    resnext = models.build("resnext50")
    grouped = [n for n in resnext.graph.node if n.op_type == "Conv" and any(a.name == "group" and a.i == 32 for a in n.attribute)]
    assert len(grouped) == 16 and _ops(resnext)["Conv"] == 53
    assert abs(_params(resnext) - 25.03e6) < 0.1e6  # torchvision's resnext50_32x4d, plus BN statistics
    squeeze = models.build("squeezenet1.1")
    assert _ops(squeeze)["Concat"] == 8 and _params(squeeze) == 1_235_496
    inception = models.build("inception-v3", image=75, width=0.125)
    assert _ops(inception)["Concat"] == 11 + 4  # 11 blocks, E's two inner concats x2
    nasnet = models.build("nasnet-a", image=32, channels=8)
    assert _ops(nasnet)["Concat"] == 18  # 3 stages x (5 normal + 1 reduction) cells


def test_transformer_and_rnn_builders():
    bert = models.build("bert-base", layers=2, seq=8, hidden=32, heads=4, ffn=64, vocab=50, max_positions=8)
    ops = _ops(bert)
    assert ops["MatMul"] == 2 * 8 and ops["LayerNormalization"] == 2 * 2 + 1 and ops["Softmax"] == 2
    rnn = models.build("nasrnn")
    assert _ops(rnn)["MatMul"] == 5 * 16  # 5 steps x 8 (input, hidden) matmul pairs
    assert len(rnn.graph.input) == 5


ROW_KEYS = {
    "model", "size", "target", "build_seconds", "onnx_nodes", "params", "import_seconds", "relax_ops_before",
    "relax_ops_after", "cost_model", "search_seconds", "regions", "expanded", "applied", "rules_applied",
    "cost_before_us", "cost_after_us", "guard", "skipped", "unchanged", "taso_search_seconds",
    "tensat_search_seconds", "search_vs_taso", "search_vs_tensat", "tvm", "ort", "check", "region_guard",
}  # fmt: skip


@pytest.mark.heavy
def test_quick_harness_end_to_end(tmp_path, monkeypatch):
    monkeypatch.setenv("TVM_TASO_CACHE", str(tmp_path / "cache"))  # no trained models or measurements of the user's
    names = ["resnext50", "squeezenet1.1", "nasrnn"]
    status = run.main(["--quick", "--models", *names, "--repeats", "2", "--min-repeat-ms", "5",
                       "--out", str(tmp_path)])
    assert status == 0
    result = json.loads((tmp_path / "results.json").read_text())
    assert result["settings"]["quick"] and result["settings"]["models"] == names
    rows = {r["model"]: r for r in result["rows"]}
    assert set(rows) == set(names)
    for r in rows.values():
        assert "error" not in r, r["error"]
        assert ROW_KEYS <= set(r), ROW_KEYS - set(r)
        assert r["size"] == "quick" and r["onnx_nodes"] > 0 and r["relax_ops_before"] > 0 and r["regions"] > 0
        # TVM without and with the rewrites, and the exported ONNX in onnxruntime, each against the original
        assert set(r["check"]["max_relative_error"]) == {"tvm_without", "tvm_with", "ort_exported"}
        assert r["check"]["ok"] and max(r["check"]["max_relative_error"].values()) <= 1e-4
        assert r["tvm"]["rounds"] == 2 and r["tvm"]["before_ms"] > 0 and r["ort"]["after_ms"] > 0
        # the search never raises the estimate, and the row counts what it applied
        assert 0 < r["cost_after_us"] <= r["cost_before_us"]
        assert r["rules_applied"] == sum(r["applied"].values())
        assert r["search_vs_taso"] == pytest.approx(r["search_seconds"] / r["taso_search_seconds"])
        # the guard keeps a rewrite only when it measured faster; otherwise the model is untouched
        if "kept" in r["guard"]:
            assert r["guard"]["kept"] == (not r["unchanged"]), r["guard"]
        else:  # no rewrite reached the guard: nothing was applied
            assert r["unchanged"] and r["applied"] == {}
        # ... and each rewritten region only when it measured faster than the original region
        regions = r["region_guard"]
        assert regions["kept"] + regions["dropped"] == regions["regions"] == len(regions["decisions"])
        assert all(d["kept"] == (d["ratio_low"] > 1.0) for d in regions["decisions"] if "ratio_low" in d)
        if r["unchanged"]:
            assert r["applied"] == {} and r["cost_after_us"] == r["cost_before_us"]
            assert r["relax_ops_after"] == r["relax_ops_before"]
    # every batch norm of ResNeXt folds into its conv (the row keeps only a count when the guard reverted)
    batch_norms = _ops(models.build("resnext50", True))["BatchNormalization"]
    resnext = rows["resnext50"]
    # a fold undone by a measurement is in a dropped region's rules, or among the guard's reverted rules
    dropped = sum(d["rules"].count("fold-batch-norm-into-conv") for d in resnext["region_guard"]["decisions"]
                  if not d["kept"])
    if resnext["unchanged"]:
        assert resnext["guard"]["reverted_rules"] + dropped >= batch_norms
    else:
        # a window dropped in the first pass may be searched again in the shifted second pass
        assert resnext["applied"].get("fold-batch-norm-into-conv", 0) <= batch_norms
        assert resnext["applied"].get("fold-batch-norm-into-conv", 0) + dropped >= batch_norms
        assert resnext["relax_ops_after"] < resnext["relax_ops_before"]
    table = (tmp_path / "results.md").read_text()
    assert all(f"| {n} |" in table for n in names)
    assert (tmp_path / "results.png").stat().st_size > 10_000


def test_readme_section_is_rewritten(tmp_path):
    readme = tmp_path / "README.md"
    readme.write_text(f"# x\n\n## Results\n\n{run.README_START}\nold\n{run.README_END}\n\nafter\n")
    result = {"date": "2026-12-02", "machine": "m", "command": "c", "rows": [],
              "settings": {"target": "llvm", "cost": "auto", "tune_trials": 0, "guard": True, "repeats": 3}}
    run.update_readme(result, readme, None)
    text = readme.read_text()
    assert "old" not in text and "| model |" in text and text.endswith("after\n") and "2026-12-02" in text


def test_the_zoo_pages_are_what_the_results_file_renders(tmp_path):
    """``zoo.md`` and the per-model zoo table of ``benchmarks/README.md`` come from ``zoo.json``
    (``python -m benchmarks.zoo --render``): a figure cannot drift from its file."""
    from benchmarks import zoo

    page = tmp_path / "zoo.md"
    assert zoo.main(["--render", "--json", str(zoo.RESULTS), "--markdown", str(page)]) == 0
    rendered = page.read_text()
    assert rendered == (zoo.RESULTS.parent / "zoo.md").read_text()
    per_model = rendered.split("## Per model\n\n", 1)[1].split("\n\n## Every row", 1)[0]
    assert per_model in (Path(__file__).parent.parent / "benchmarks" / "README.md").read_text()


def test_the_results_pages_are_what_the_results_file_renders(tmp_path):
    """The README's summary table and the results section of ``benchmarks/README.md`` are what
    ``results.json`` renders (``python -m benchmarks.run --render ... --readme``)."""
    root = Path(__file__).parent.parent
    result = json.loads((root / "benchmarks" / "results" / "results.json").read_text())
    for page, render in ((root / "README.md", lambda p: run.update_summary(result, p)),
                         (root / "benchmarks" / "README.md",
                          lambda p: run.update_readme(result, p, p.parent / "results" / "results.png"))):
        copy = tmp_path / page.relative_to(root)
        copy.parent.mkdir(parents=True, exist_ok=True)
        copy.write_text(page.read_text())
        render(copy)
        assert copy.read_text() == page.read_text(), f"{page.relative_to(root)} differs from what results.json renders"
