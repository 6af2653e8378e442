"""The tvm-taso command line: the ONNX workflow, reports, and one clear line (with a non-zero
exit status) for every kind of bad input."""

import json
import os
import subprocess
import sys
import tempfile

import numpy as np
import onnx
import pytest
from onnx import TensorProto, helper, numpy_helper

from tvm_taso.cli.main import main
from tvm_taso.numerics import array_relative_error


def inception_onnx(batch=1, size=8, channels=8, dynamic=False):
    """Parallel 1x1/3x3/5x5 convs with bias and relu, concatenated (an Inception block)."""
    rng = np.random.default_rng(0)
    inits, nodes, outs = [], [], []
    for k in (1, 3, 5):
        w = numpy_helper.from_array((rng.standard_normal((channels, channels, k, k)) * 0.2).astype("float32"), f"w{k}")
        b = numpy_helper.from_array((rng.standard_normal(channels) * 0.1).astype("float32"), f"b{k}")
        inits += [w, b]
        nodes.append(helper.make_node("Conv", ["x", f"w{k}", f"b{k}"], [f"c{k}"], pads=[k // 2] * 4))
        nodes.append(helper.make_node("Relu", [f"c{k}"], [f"r{k}"]))
        outs.append(f"r{k}")
    nodes.append(helper.make_node("Concat", outs, ["y"], axis=1))
    shape = ["N" if dynamic else batch, channels, size, size]
    graph = helper.make_graph(
        nodes,
        "inception",
        [helper.make_tensor_value_info("x", TensorProto.FLOAT, shape)],
        [helper.make_tensor_value_info("y", TensorProto.FLOAT, [shape[0], 3 * channels, size, size])],
        inits,
    )
    return helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)])


@pytest.fixture
def model_file(tmp_path):
    path = tmp_path / "inception.onnx"
    onnx.save(inception_onnx(), path)
    return path


CACHE = tempfile.mkdtemp(prefix="tvm-taso-cache-")  # no trained models or measurements of the user's


def run_cli(*args):
    """Run ``tvm-taso`` as a user would (a new process) and return (status, stdout, stderr)."""
    env = dict(os.environ, TVM_TASO_CACHE=CACHE)
    p = subprocess.run(
        [sys.executable, "-m", "tvm_taso.cli", *map(str, args)], capture_output=True, text=True, env=env
    )
    return p.returncode, p.stdout, p.stderr


@pytest.fixture
def run_main(capsys, monkeypatch):
    """``tvm-taso``'s ``main`` in this process (what the command runs, without the seconds a new
    process spends importing TVM): (status, stdout, stderr), like :func:`run_cli`."""
    monkeypatch.setenv("TVM_TASO_CACHE", CACHE)

    def run(*args):
        capsys.readouterr()
        status = main([str(a) for a in args])
        out = capsys.readouterr()
        return status, out.out, out.err

    return run


def test_optimize_check_reports(model_file, tmp_path):
    out, rep, page = tmp_path / "out.onnx", tmp_path / "r.json", tmp_path / "r.html"
    status, stdout, stderr = run_cli(
        "optimize", model_file, "-o", out, "--target", "cuda", "--check", "--report", rep, "--html", page
    )
    assert status == 0, stderr
    assert "merge-conv-bias-relu-enlarge" in stdout and "(ok)" in stdout
    onnx.checker.check_model(onnx.load(out), full_check=True)
    report = json.loads(rep.read_text())
    assert report["cost_after"] < report["cost_before"]
    assert report["check"]["ok"] and report["check"]["max_relative_error"] <= 1e-4
    text = page.read_text()
    assert "<svg" in text and "merge-conv-bias-relu-enlarge" in text and "Search curve" in text
    assert len(list(tmp_path.glob(".tvm-taso-*"))) == 0  # no temporary files left


@pytest.mark.heavy
def test_guard_times_regions_and_remembers_them(model_file, tmp_path):
    cache = tmp_path / "cache"
    env = dict(os.environ, TVM_TASO_CACHE=str(cache))
    reports = []
    for k in range(2):
        out, rep = tmp_path / f"out{k}.onnx", tmp_path / f"r{k}.json"
        p = subprocess.run([sys.executable, "-m", "tvm_taso.cli", "optimize", str(model_file), "-o", str(out),
                            "--target", "llvm", "--cost", "analytic", "--guard", "--report", str(rep)],
                           capture_output=True, text=True, env=env)
        assert p.returncode == 0, p.stderr
        regions = json.loads(rep.read_text())["region_guard"]
        assert regions["regions"] >= 1 and f"regions timed    {regions['regions']}:" in p.stdout
        reports.append(regions)
    assert reports[0]["from_database"] == 0 and reports[0]["seconds"] > 0
    assert reports[1]["from_database"] == reports[1]["regions"] and reports[1]["seconds"] == 0  # nothing measured again
    assert [d["kept"] for d in reports[1]["decisions"]] == [d["kept"] for d in reports[0]["decisions"]]
    assert (cache / "regions.jsonl").is_file()


def test_optimized_onnx_matches_original_in_onnxruntime(model_file, tmp_path):
    ort = pytest.importorskip("onnxruntime")
    out = tmp_path / "out.onnx"
    assert main(["optimize", str(model_file), "-o", str(out), "--target", "cuda"]) == 0
    x = np.random.default_rng(1).standard_normal((1, 8, 8, 8)).astype("float32")
    a = ort.InferenceSession(str(model_file)).run(None, {"x": x})[0]
    b = ort.InferenceSession(str(out)).run(None, {"x": x})[0]
    assert array_relative_error(a, b) <= 1e-4
    convs = [n for n in onnx.load(out).graph.node if n.op_type == "Conv"]
    assert len(convs) == 1  # the three branches became one conv


@pytest.mark.parametrize(
    "setup, args, message",
    [
        ("none", [], "no such file"),
        ("corrupt", [], "not a readable ONNX model"),
        ("truncated", [], "not a readable ONNX model"),
        ("good", ["--shape", "x=2x8x8x8"], "input 'x' has shape 1x8x8x8; --shape gave 2x8x8x8"),
        ("good", ["--shape", "y=1x8x8x8"], "no input named y"),
        ("good", ["--shape", "x=oops"], "expected NAME=D1xD2x"),
        ("good", ["--cost", "learned"], "--cost learned: no model trained"),
        ("good", ["--target", "nosuchtarget"], "unknown target 'nosuchtarget'; expected a target kind"),
        ("good", ["--target", '{"kind": "llvm",'], "is not valid JSON"),
    ],
)
def test_optimize_bad_input(tmp_path, run_main, setup, args, message):
    path = tmp_path / "in.onnx"
    good = inception_onnx().SerializeToString()
    if setup == "corrupt":
        path.write_bytes(b"this is not a protobuf at all \x00\xff" * 10)
    elif setup == "truncated":
        path.write_bytes(good[: len(good) // 2])
    elif setup == "good":
        path.write_bytes(good)
    out = tmp_path / "out.onnx"
    status, stdout, stderr = run_main("optimize", path, "-o", out, *args)
    assert status == 2
    assert message in stderr
    errors = [line for line in stderr.splitlines() if line.startswith("tvm-taso: error:")]
    assert "Traceback" not in stderr and len(errors) == 1
    assert not out.exists()


def _bad_model(path, setup):
    if setup == "unknown-op":
        m = inception_onnx()
        m.graph.node.append(helper.make_node("FancyOp", ["y"], ["z"], name="weird", domain="com.example"))
        m.graph.output[0].name = "z"
        m.opset_import.append(helper.make_opsetid("com.example", 1))
    else:
        m = inception_onnx(dynamic=True)
    path.write_bytes(m.SerializeToString())


@pytest.mark.parametrize(
    "setup, message",
    [
        ("unknown-op", "ONNX op FancyOp (domain com.example) at node 'weird' cannot be imported"),
        ("dynamic", "has dynamic dimensions (Nx8x8x8); give a static shape, e.g. --shape x=1x8x8x8"),
    ],
)
def test_compile_input_tvm_cannot_import(tmp_path, run_main, setup, message):
    """``compile`` imports with TVM: what its importer cannot take is one line, with what to do."""
    path, out = tmp_path / "in.onnx", tmp_path / "out.so"
    _bad_model(path, setup)
    status, _, stderr = run_main("compile", path, "-o", out)
    assert status == 2 and message in stderr
    errors = [line for line in stderr.splitlines() if line.startswith("tvm-taso: error:")]
    assert "Traceback" not in stderr and len(errors) == 1
    assert not out.exists()
    if setup == "unknown-op":
        assert "`tvm-taso optimize` still optimizes the model as ONNX" in stderr


@pytest.mark.parametrize("setup", ["unknown-op", "dynamic"])
def test_optimize_keeps_what_tvm_cannot_import(tmp_path, setup):
    """``optimize`` works on the ONNX graph: an unknown op stays as it is (named once in the
    report), dynamic dimensions are priced at a stated default and stay dynamic."""
    path, out, rep = tmp_path / "in.onnx", tmp_path / "out.onnx", tmp_path / "r.json"
    _bad_model(path, setup)
    status, stdout, stderr = run_cli("optimize", path, "-o", out, "--target", "cuda", "--report", rep)
    assert status == 0, stderr
    original, optimized = onnx.load(path), onnx.load(out)
    assert [v.SerializeToString() for v in list(optimized.graph.input) + list(optimized.graph.output)] == \
        [v.SerializeToString() for v in list(original.graph.input) + list(original.graph.output)]
    report = json.loads(rep.read_text())
    if setup == "unknown-op":
        assert {"what": "ONNX op com.example.FancyOp", "count": 1} in report["skipped"]
        fancy = [n for n in optimized.graph.node if n.op_type == "FancyOp"]
        assert [n.SerializeToString() for n in fancy] == [original.graph.node[-1].SerializeToString()]
    else:
        assert "symbolic dimensions priced at N=1" in stderr
        assert sum(n.op_type == "Conv" for n in optimized.graph.node) == 1


def test_dynamic_input_with_shape_works(tmp_path):
    path, out = tmp_path / "in.onnx", tmp_path / "out.onnx"
    onnx.save(inception_onnx(dynamic=True), path)
    assert main(["optimize", str(path), "-o", str(out), "--shape", "x=1x8x8x8", "--target", "cuda"]) == 0
    assert out.exists()


def test_verbose_shows_traceback(tmp_path):
    status, _, stderr = run_cli("-v", "optimize", tmp_path / "missing.onnx", "-o", tmp_path / "o.onnx")
    assert status != 0 and "Traceback" in stderr


@pytest.mark.heavy
def test_bench_side_by_side_and_wrong_input_shape(model_file, tmp_path):
    status, stdout, stderr = run_cli("bench", model_file, "--repeat", "2", "--json", tmp_path / "b.json")
    assert status == 0, stderr
    assert "TVM + TasoOptimize" in stdout and "speedup" in stdout
    result = json.loads((tmp_path / "b.json").read_text())
    pairs = np.array(result["default"]["samples_ms"]) / np.array(result["taso"]["samples_ms"])
    assert result["speedup"] == pytest.approx(float(np.median(pairs)))  # ratios pair by pair, then the median
    assert result["speedup_quartiles"][0] <= result["speedup"] <= result["speedup_quartiles"][1]
    wrong = tmp_path / "x.npy"
    np.save(wrong, np.zeros((1, 8, 4, 4), "float32"))
    status, _, stderr = run_cli("bench", model_file, "--input-file", f"x={wrong}")
    assert status == 2 and "input 'x' must have shape 1x8x8x8, got 1x8x4x4" in stderr


def test_compile_writes_library(model_file, tmp_path):
    out = tmp_path / "model.so"
    status, _, stderr = run_cli("compile", model_file, "-o", out)
    assert status == 0, stderr
    assert out.stat().st_size > 0


def test_help_is_complete():
    status, stdout, _ = run_cli("optimize", "--help")
    assert status == 0
    for flag in ("--target", "--cost", "--alpha", "--budget", "--time-limit", "--check", "--report", "--html", "--shape"):
        assert flag in stdout


@pytest.mark.parametrize("spelling", ["cuda", '{"kind": "cuda", "arch": "sm_80"}', "llvm"])
def test_the_target_is_parsed_once_per_command(tmp_path, monkeypatch, spelling):
    """--target is resolved by the command line and the Target goes down: no layer parses the
    spelling again (it was parsed 7 times for one `optimize`: resolve 3 times, kind 3, canonical)."""
    from tvm_taso import target as targets

    parsed = []
    parse = targets.parse

    def counting(target=None):
        if isinstance(target, (str, dict)):
            parsed.append(target)
        return parse(target)

    monkeypatch.setattr(targets, "parse", counting)
    path = tmp_path / "m.onnx"
    onnx.save(inception_onnx(), path)
    assert main(["optimize", str(path), "-o", str(tmp_path / "out.onnx"), "--target", spelling,
                 "--time-limit", "10"]) == 0
    assert parsed == [spelling]


def test_the_cli_reference_is_what_the_parser_renders():
    """``tutorials/cli.md`` is generated from the parser (``python -m tvm_taso.cli.reference
    tutorials/cli.md``): an option added, renamed or redocumented without regenerating it fails
    here. Every command and subcommand has its section."""
    from pathlib import Path

    from tvm_taso.cli import reference
    from tvm_taso.cli.main import build_parser

    page = Path(__file__).resolve().parent.parent / "tutorials" / "cli.md"
    rendered = reference.render()
    assert page.read_text() == rendered, "tutorials/cli.md is stale: python -m tvm_taso.cli.reference tutorials/cli.md"
    for words, _ in reference._commands(build_parser()):
        assert f"## `{' '.join(('tvm-taso',) + words)}`" in rendered
    assert "--max-weight-growth" in rendered and "tvm-taso rules verify" in rendered
