"""Files and signals on the command line: outputs with the right mode, written all or
none, never half-written or left as temporary files (errors, SIGINT, SIGTERM); every output
path checked before the search; unknown targets, unusable cache directories, inputs that are
not regular files, empty or from the future: one clear line each; a user sees tvm-taso's own
lines only; the measurement worker and the learned model's file run and write nothing foreign."""

from __future__ import annotations

import logging
import os
import stat
import subprocess
import sys
import textwrap
from pathlib import Path

import onnx
import pytest
from onnx import TensorProto, helper
from test_cli import inception_onnx

import tvm_taso
from tvm_taso import examples, files
from tvm_taso.cli.main import main
from tvm_taso.cost.database import MeasurementDB, Record
from tvm_taso.cost.measure import MeasuredCost


@pytest.fixture(autouse=True)
def cache(tmp_path, monkeypatch):
    """A private, empty cache: no measurements or trained models of the user's."""
    path = tmp_path / "cache"
    monkeypatch.setenv("TVM_TASO_CACHE", str(path))
    return path


@pytest.fixture
def model_file(tmp_path):
    path = tmp_path / "in.onnx"
    onnx.save(inception_onnx(), path)
    return path


def _temp_files(directory) -> list:
    return sorted(p.name for p in directory.rglob(files.TEMP_PREFIX + "*"))


def _errors(text: str) -> list[str]:
    return [line for line in text.splitlines() if line.startswith("tvm-taso: error:")]


@pytest.fixture
def umask():
    """Set the process umask for the test, restored after."""
    old = os.umask(0o022)
    yield os.umask
    os.umask(old)


# --- 1. modes; -o equal to the input --------------------------------------------------------------

@pytest.mark.parametrize("mask, mode", [(0o022, 0o644), (0o077, 0o600), (0o002, 0o664)])
def test_outputs_get_the_umasks_mode(tmp_path, umask, mask, mode):
    umask(mask)
    path = tmp_path / "out.txt"
    files.write_text_atomically(path, "new")
    assert stat.S_IMODE(path.stat().st_mode) == mode and path.read_text() == "new"


def test_a_replaced_file_keeps_its_mode(tmp_path, umask):
    umask(0o022)
    path = tmp_path / "out.txt"
    path.write_text("old")
    path.chmod(0o640)
    files.write_text_atomically(path, "new")
    assert stat.S_IMODE(path.stat().st_mode) == 0o640 and path.read_text() == "new"


def test_cli_output_mode_follows_the_umask(model_file, tmp_path, umask):
    umask(0o022)
    out, rep = tmp_path / "out.onnx", tmp_path / "r.json"
    assert main(["optimize", str(model_file), "-o", str(out), "--target", "cuda", "--report", str(rep)]) == 0
    assert stat.S_IMODE(out.stat().st_mode) == 0o644 and stat.S_IMODE(rep.stat().st_mode) == 0o644


def test_output_equal_to_input_is_replaced_atomically_and_said(model_file, capsys):
    assert main(["optimize", str(model_file), "-o", str(model_file), "--target", "cuda"]) == 0
    err = capsys.readouterr().err
    said = [line for line in err.splitlines() if "is the input model" in line]
    assert len(said) == 1 and "atomically" in said[0]
    assert len([n for n in onnx.load(model_file).graph.node if n.op_type == "Conv"]) == 1  # optimized
    assert _temp_files(model_file.parent) == []


def test_only_o_may_name_the_input(model_file, capsys):
    assert main(["optimize", str(model_file), "-o", str(model_file.parent / "o.onnx"),
                 "--report", str(model_file)]) == 2
    err = capsys.readouterr().err
    assert _errors(err) == [f"tvm-taso: error: --report {model_file}: is the input model; choose another file"]


# --- 2. signals -------------------------------------------------------------------------------------

SIGNAL_SCRIPT = textwrap.dedent("""
    import os, signal, sys, time
    import tvm_taso.cli.model_commands as mc
    from tvm_taso import files
    from tvm_taso.cli.main import main

    def write_all(outputs):
        def signalled(write):
            def inner(tmp):
                write(tmp)  # the temporary file is written: now the signal comes
                os.kill(os.getpid(), getattr(signal, sys.argv[1]))
                time.sleep(30)
            return inner
        return files.write_all({p: signalled(w) for p, w in outputs.items()})

    mc.write_all = write_all
    # a user's Ctrl-C, whatever the test runner's process did with SIGINT (a worker that ignores
    # it hands that on to its children, and the signal would never come)
    signal.signal(signal.SIGINT, signal.default_int_handler)
    sys.exit(main(sys.argv[2:]))
""")


@pytest.mark.heavy
@pytest.mark.parametrize("sig, status", [("SIGTERM", 143), ("SIGINT", 130)])
def test_a_signal_during_the_write_leaves_nothing(model_file, tmp_path, sig, status):
    out, rep = tmp_path / "out.onnx", tmp_path / "r.json"
    p = subprocess.run(
        [sys.executable, "-c", SIGNAL_SCRIPT, sig, "optimize", str(model_file), "-o", str(out),
         "--report", str(rep), "--target", "cuda"],
        capture_output=True, text=True, timeout=120, env=dict(os.environ), check=False,
    )
    assert p.returncode == status, p.stderr
    assert "Traceback" not in p.stderr
    lines = [line for line in p.stderr.splitlines() if "SIGINT" in line or "SIGTERM" in line]
    assert len(lines) == 1 and lines[0].startswith("tvm-taso: ") and sig in lines[0]
    assert _temp_files(tmp_path) == [] and not out.exists() and not rep.exists()


# --- 3. output paths checked first; all or none -----------------------------------------------------

@pytest.mark.parametrize("where, message", [
    ("missing/r.json", "does not exist"),
    ("adir", "is a directory"),
    ("afile/r.json", "is not a directory"),
])
def test_bad_output_paths_fail_before_the_search(model_file, tmp_path, capsys, where, message):
    (tmp_path / "adir").mkdir()
    (tmp_path / "afile").write_text("x")
    out, bad = tmp_path / "out.onnx", tmp_path / where
    for option in ("--report", "--html"):
        assert main(["optimize", str(model_file), "-o", str(out), option, str(bad)]) == 2
        err = capsys.readouterr().err
        assert _errors(err) == [line for line in err.splitlines() if line.startswith("tvm-taso: error")]
        assert len(_errors(err)) == 1 and f"{option} {bad}" in err and message in err
        assert "searching" not in err and files.TEMP_PREFIX not in err  # no search time, no temp file named
        assert not out.exists()


@pytest.mark.parametrize("args", [
    ["example", "--json", "{d}/missing/x.json"],
    ["compile", "{m}", "-o", "{d}/missing/x.so"],
    ["bench", "{m}", "--json", "{d}/missing/x.json"],
    ["rules", "generate", "-o", "{d}/missing/x.rules"],
    ["rules", "verify", "--json", "{d}/missing/x.json"],
    ["cost", "train", "-o", "{d}/missing/x.json"],
])
def test_every_command_checks_its_outputs_first(model_file, tmp_path, capsys, args):
    argv = [a.format(d=tmp_path, m=model_file) for a in args]
    status = main(argv)
    err = capsys.readouterr().err
    if "verify" in args and "z3" in err:
        pytest.skip("no z3: the verifier stops before its outputs")
    assert status == 2 and len(_errors(err)) == 1 and "does not exist" in err


def test_same_file_for_two_outputs_is_refused(model_file, tmp_path, capsys):
    out = tmp_path / "out.onnx"
    assert main(["optimize", str(model_file), "-o", str(out), "--report", str(out)]) == 2
    assert "the same file as -o" in capsys.readouterr().err


def test_outputs_are_written_all_or_none(tmp_path):
    a, b = tmp_path / "a.txt", tmp_path / "b.txt"
    a.write_text("old a")

    def fail(tmp):
        raise OSError(28, "No space left on device")

    with pytest.raises(OSError) as err:
        files.write_all({a: lambda tmp: Path(tmp).write_text("new a"), b: fail})
    assert str(err.value) == f"cannot write {b}: No space left on device; nothing written"
    assert a.read_text() == "old a" and not b.exists() and _temp_files(tmp_path) == []


def test_report_write_failure_leaves_no_model(model_file, tmp_path, capsys, monkeypatch):
    """The model is no longer written before the report: a report that fails at the end (after
    the checks passed) leaves neither."""
    from tvm_taso.cli import html_report

    def broken(report):
        raise OSError("the disk went away")

    monkeypatch.setattr(html_report, "render", broken)
    out, rep, page = tmp_path / "out.onnx", tmp_path / "r.json", tmp_path / "r.html"
    assert main(["optimize", str(model_file), "-o", str(out), "--report", str(rep), "--html", str(page)]) == 3
    assert not out.exists() and not rep.exists() and not page.exists() and _temp_files(tmp_path) == []
    assert len(_errors(capsys.readouterr().err)) == 1


# --- 4. unknown targets, every command --------------------------------------------------------------

@pytest.mark.parametrize("target", ["cdua", '{"kind": "nonsense"}', "42"])
@pytest.mark.parametrize("command", ["example", "optimize", "compile", "bench", "cost train"])
def test_unknown_target_is_one_line_for_every_command(model_file, tmp_path, capsys, command, target):
    argv = command.split() + ["--target", target]
    if command in ("optimize", "compile"):
        argv += [str(model_file), "-o", str(tmp_path / "out")]
    elif command == "bench":
        argv += [str(model_file)]
    assert main(argv) == 2
    err = capsys.readouterr().err
    assert len(_errors(err)) == 1 and "expected a target kind (llvm, c, cuda" in err, err
    assert "Traceback" not in err and not (tmp_path / "out").exists()


# --- 5. the cache directory -------------------------------------------------------------------------

def _record(key: str, target: str = '{"kind":"llvm"}') -> Record:
    return Record(key=key, target=target, kernel={"ops": [], "outputs": []}, status="ok",
                  median_us=1.0, samples_us=[1.0])


def _cache_warnings(caplog) -> list[str]:
    return [r.getMessage() for r in caplog.records if "TVM_TASO_CACHE" in r.getMessage()]


def test_cache_that_is_a_file_falls_back_to_memory(cache, caplog):
    cache.parent.mkdir(exist_ok=True)
    cache.write_text("not a directory")
    with caplog.at_level(logging.WARNING):
        db = MeasurementDB()
        db.add(_record("k1"))
        again = MeasurementDB()
        again.add(_record("k2"))
    assert db.in_memory and db.get("k1", '{"kind":"llvm"}') is not None and len(db.records()) == 1
    said = _cache_warnings(caplog)
    assert len(said) == 1 and str(cache) in said[0]
    assert db.summary()["records"] == 1


def test_read_only_cache_warns_once_and_measures_on(cache, caplog, monkeypatch):
    """A read-only cache (simulated: the tests may run as root) used to print a traceback per
    kernel; now one warning, and the measurements are kept in memory."""
    from tvm_taso.cost import database

    def read_only(path, flags, mode=0o777):
        raise PermissionError(13, "Permission denied", str(path))

    monkeypatch.setattr(database.os, "open", read_only)
    cost = MeasuredCost("llvm", isolate=False, fn="test_measure:fake_ok")
    mod = examples.parallel_matmuls(seq=8, hidden=16)
    with caplog.at_level(logging.WARNING):
        _, first = tvm_taso.optimize(mod, target="llvm", cost_model=cost, time_limit=20)
        _, second = tvm_taso.optimize(mod, target="llvm", cost_model=cost, time_limit=20)
    assert len(_cache_warnings(caplog)) == 1
    assert not [r for r in caplog.records if r.exc_info]
    a, b = first["cost_model"], second["cost_model"]  # the counters add up over the model's life
    assert a["measured"] > 0 and b["measured"] == a["measured"]  # nothing measured twice
    assert cost.db.in_memory and len(cost.db.records()) == a["measured"]


def _fake_measure_kernel(kernel, target=None, repeats=10, timeout=60.0, **kw):
    from tvm_taso.cost.measure import result_record

    us = 10.0 * len(kernel.ops)
    return result_record(kernel, tvm_taso.target.canonical(target), {"status": "ok", "median_us": us, "samples_us": [us]})


def test_unusable_cache_never_fails_the_pass_or_the_cli(cache, model_file, tmp_path, caplog, capsys, monkeypatch):
    from tvm_taso.passes import TasoOptimize

    from tvm_taso.cost import measure

    cache.parent.mkdir(exist_ok=True)
    cache.write_text("not a directory")
    monkeypatch.setattr(measure, "measure_kernel", _fake_measure_kernel)
    mod = examples.parallel_matmuls(seq=8, hidden=16)
    with caplog.at_level(logging.WARNING):
        TasoOptimize(target="llvm", cost_model="measure", time_limit=20)(mod)  # used to raise
        assert main(["optimize", str(model_file), "-o", str(tmp_path / "o.onnx"), "--cost", "measure"]) == 0
    assert (tmp_path / "o.onnx").exists()
    assert _cache_warnings(caplog) and all(str(cache) in m for m in _cache_warnings(caplog))


# --- 6. input files ---------------------------------------------------------------------------------

def _zero_dim_model():
    x = helper.make_tensor_value_info("x", TensorProto.FLOAT, [1, 0, 4])
    y = helper.make_tensor_value_info("y", TensorProto.FLOAT, [1, 0, 4])
    graph = helper.make_graph([helper.make_node("Relu", ["x"], ["y"])], "empty", [x], [y])
    return helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)])


def test_zero_size_dimension_is_refused_not_called_dynamic(tmp_path, capsys):
    path = tmp_path / "empty.onnx"
    onnx.save(_zero_dim_model(), path)
    assert main(["optimize", str(path), "-o", str(tmp_path / "o.onnx")]) == 2
    err = capsys.readouterr().err
    assert len(_errors(err)) == 1 and "zero-size dimension (1x0x4)" in err
    assert "dynamic" not in err and "--shape" not in err


@pytest.mark.parametrize("kind", ["dev-zero", "fifo"])
def test_input_that_is_not_a_regular_file_is_refused(tmp_path, capsys, kind):
    if kind == "fifo":
        path = tmp_path / "pipe.onnx"
        os.mkfifo(path)
    else:
        path = "/dev/zero"
    assert main(["optimize", str(path), "-o", str(tmp_path / "o.onnx")]) == 2  # returns: no endless read
    err = capsys.readouterr().err
    assert _errors(err) == [f"tvm-taso: error: {path}: not a regular file (a device, FIFO or socket); give an ONNX file"]


def test_opset_from_the_future_is_said(tmp_path, caplog):
    path = tmp_path / "future.onnx"
    m = inception_onnx()
    m.opset_import[0].version = 99
    onnx.save(m, path)
    with caplog.at_level(logging.WARNING):
        assert main(["optimize", str(path), "-o", str(tmp_path / "o.onnx"), "--target", "cuda"]) == 0
    said = [r.getMessage() for r in caplog.records if "opset 99" in r.getMessage()]
    assert len(said) == 1 and "newer than the installed onnx" in said[0]


# --- 7. a search cut short --------------------------------------------------------------------------

def test_search_cut_short_is_said(model_file, tmp_path, capsys):
    assert main(["optimize", str(model_file), "-o", str(tmp_path / "o.onnx"), "--time-limit", "1e-9"]) == 0
    out = capsys.readouterr().out
    lines = [line for line in out.splitlines() if line.startswith("cut short")]
    assert len(lines) == 1 and "1 region(s)" in lines[0]


# --- 8. only tvm-taso's own lines -------------------------------------------------------------------

def _own_lines_only(stderr: str) -> list[str]:
    lines = [seg.strip() for line in stderr.splitlines() for seg in line.split("\r") if seg.strip()]
    return [line for line in lines if not line.startswith("tvm-taso")]


def test_example_prints_only_its_own_lines():
    p = subprocess.run([sys.executable, "-m", "tvm_taso.cli", "example", "--time-limit", "5"],
                       capture_output=True, text=True, timeout=300, env=dict(os.environ), check=False)
    assert p.returncode == 0, p.stderr
    assert "Unable to detect CUDA version" not in p.stderr
    assert _own_lines_only(p.stderr) == []


WARNING_SCRIPT = textwrap.dedent("""
    import sys, warnings
    import tvm_taso.cli.model_commands as mc
    from tvm_taso.cli.main import main

    def noisy(args):
        warnings.warn("something odd", UserWarning, stacklevel=2)
        return 0

    mc.cmd_example = noisy
    sys.exit(main(["example"]))
""")


def test_python_warnings_are_one_line_without_source():
    p = subprocess.run([sys.executable, "-c", WARNING_SCRIPT], capture_output=True, text=True, timeout=120, check=False)
    assert p.returncode == 0, p.stderr
    assert p.stderr.splitlines() == ["tvm-taso: warning: UserWarning: something odd"]


# --- 9. foreign code --------------------------------------------------------------------------------
# The measurement worker never imports from the working directory:
# tests/test_measure.py::test_worker_never_imports_from_the_working_directory.

def test_learned_model_file_follows_no_symlink(tmp_path):
    from tvm_taso.cost.training import train
    from tvm_taso.driver.kernels import search_kernels

    kernels = search_kernels(examples.parallel_matmuls(seq=8, hidden=16), target="llvm", time_limit=5)
    recs = [Record(key=k.key(), target=tvm_taso.target.canonical("llvm"), kernel=k.to_json(), status="ok",
                   median_us=1.0 + i, samples_us=[1.0 + i]) for i, k in enumerate(kernels)]
    model, _ = train(recs, test_fraction=0)
    victim = tmp_path / "victim.txt"
    victim.write_text("precious")
    dest = tmp_path / "learned.json"
    dest.symlink_to(victim)
    for guess in (".learned.json.tmp", "learned.json.tmp", "learned.tmp"):  # the old predictable names
        (tmp_path / guess).symlink_to(victim)
    model.save(dest)
    assert victim.read_text() == "precious"
    assert dest.is_file() and not dest.is_symlink() and _temp_files(tmp_path) == []


# --- second round (issue 25): bad input is exit 2, one line, naming the option as typed, first ---


@pytest.mark.parametrize("rules", ["/dev/zero", "fifo", "missing.rules", "."])
def test_rules_that_are_not_a_regular_file_are_one_line_before_any_work(rules, model_file, tmp_path, capsys):
    """``--rules /dev/zero`` read until memory ran out, a FIFO blocked forever: regular files
    only, refused before the model is read."""
    if rules == "fifo":
        rules = str(tmp_path / "rules.fifo")
        os.mkfifo(rules)
    elif rules != "/dev/zero":
        rules = str(tmp_path / rules)
    status = main(["optimize", str(model_file), "-o", str(tmp_path / "out.onnx"), "--rules", rules])
    err = capsys.readouterr().err
    assert status == 2 and len(_errors(err)) == 1 and "error: --rules: cannot read rule file" in err
    assert "reading" not in err and "Error:" not in _errors(err)[0]


def test_an_oversized_rule_file_is_refused(tmp_path):
    from tvm_taso.rewrite.rule import MAX_RULE_FILE_BYTES, RuleSyntaxError, read_rules

    big = tmp_path / "big.rules"
    with open(big, "wb") as f:
        f.truncate(MAX_RULE_FILE_BYTES + 1)
    with pytest.raises(RuleSyntaxError, match="over the"):
        read_rules(big)


@pytest.mark.parametrize("option, value, said", [
    ("--budget", "0", "--budget must be an integer >= 1"),
    ("--alpha", "0.5", "--alpha must be a finite number >= 1.0"),
    ("--time-limit", "-1", "--time-limit must be >= 0"),
    ("--shape", "x=1x99999999999999999999x8x8", "a size must be below 2^63"),
])
def test_bad_options_are_exit_2_naming_the_option_as_typed(option, value, said, model_file, tmp_path, capsys):
    status = main(["optimize", str(model_file), "-o", str(tmp_path / "out.onnx"), option, value])
    err = capsys.readouterr().err
    assert status == 2 and _errors(err) == [f"tvm-taso: error: {_errors(err)[0].split('error: ')[1]}"]
    assert said in err and "ValueError" not in err and "--verbose" not in err and "reading" not in err


def test_an_interrupted_search_clears_its_progress_bar_first(monkeypatch):
    """The progress bar and the final "interrupted" line shared one terminal line: the bar is
    closed (its line cleared) however the search ends."""
    from tvm_taso.driver.relax import RelaxFrontEnd

    driver = sys.modules["tvm_taso.driver.optimize"]

    class Bar:
        closed = False

        def update(self, n=1):
            pass

        def close(self):
            Bar.closed = True

    def interrupted(*args, **kwargs):
        raise KeyboardInterrupt

    monkeypatch.setattr(driver, "progress_bar", lambda desc, unit, total=None: Bar())
    monkeypatch.setattr(RelaxFrontEnd, "search", interrupted)
    with pytest.raises(KeyboardInterrupt):
        driver.optimize(examples.EXAMPLES["qkv"](), target="llvm", cost_model="analytic", progress=True)
    assert Bar.closed


def test_o_naming_the_inputs_external_data_file_is_refused_before_the_search(tmp_path, capsys):
    """``-o`` naming the input's external-data file overwrote it: the input was destroyed and
    the exit status 0. Refused in one line before the search, the data file untouched; so is an
    ``-o`` whose own data file (``OUT.data``, for a model over 2 GB) would be the input's."""
    path = tmp_path / "in.onnx"
    onnx.save_model(inception_onnx(), path, save_as_external_data=True, all_tensors_to_one_file=True,
                    location="out.onnx.data", size_threshold=0)
    weights = (tmp_path / "out.onnx.data").read_bytes()
    for output in ("out.onnx.data", "out.onnx"):
        status = main(["optimize", str(path), "-o", str(tmp_path / output)])
        err = capsys.readouterr().err
        assert status == 2 and len(_errors(err)) == 1 and "external data file" in err and "searching" not in err
    assert (tmp_path / "out.onnx.data").read_bytes() == weights
    assert main(["optimize", str(path), "-o", str(tmp_path / "other.onnx")]) == 0


def test_a_large_models_data_file_is_replaced_whole_with_the_model(tmp_path, monkeypatch):
    """Over 2 GB the tensors go to ``OUT.data``: each rerun to the same ``-o`` appended the
    model's size to it again, outside the all-or-nothing write. Now it is written whole and
    renamed into place with the model; an error leaves neither."""
    from tvm_taso.io import onnx_model

    monkeypatch.setattr(onnx_model, "LARGE_MODEL_BYTES", 1000)
    source = tmp_path / "in.onnx"
    onnx.save(inception_onnx(), source)
    out, data = tmp_path / "out.onnx", tmp_path / "out.onnx.data"
    sizes = []
    for _ in range(2):
        assert main(["optimize", str(source), "-o", str(out), "--target", "cuda", "--cost", "analytic"]) == 0
        sizes.append(data.stat().st_size)
    assert sizes[0] == sizes[1] > 0
    loaded = tvm_taso.load_onnx(out)
    assert all(i.data_location == onnx.TensorProto.DEFAULT for i in loaded.proto.graph.initializer)
    assert _temp_files(tmp_path) == []

    def fail(*args, **kwargs):
        raise OSError(28, "No space left on device")

    monkeypatch.setattr(onnx, "save_model", fail)
    out2 = tmp_path / "out2.onnx"
    assert main(["optimize", str(source), "-o", str(out2), "--target", "cuda", "--cost", "analytic"]) == 3
    assert not out2.exists() and not (tmp_path / "out2.onnx.data").exists() and _temp_files(tmp_path) == []


def test_checking_a_users_rules_counts_in_the_time_limit(tmp_path, capsys):
    """5,000 rules took 240 s with --time-limit 10 and the summary said "search 0.056 s": the
    check is bounded by --time-limit, the rules not reached are not used, and the summary says
    how many and how long the check took."""
    rule = "my-transpose-{k} [hand, unverified]: (permute_dims (permute_dims ?x :axes [1 0]) :axes [1 0]) => ?x\n"
    path = tmp_path / "many.rules"
    path.write_text("".join(rule.format(k=k) for k in range(400)))
    model = tmp_path / "in.onnx"
    onnx.save(inception_onnx(), model)
    status = main(["optimize", str(model), "-o", str(tmp_path / "out.onnx"), "--rules", str(path),
                   "--time-limit", "0.5", "--report", str(tmp_path / "r.json")])
    out, err = capsys.readouterr()
    assert status == 0, err
    assert "not checked within the time limit (not used)" in out
    import json

    report = json.loads((tmp_path / "r.json").read_text())
    late = [r for r in report["rules_refused"] if r["reason"] == "not checked within the time limit"]
    assert 0 < len(late) < 400 and report["rules_check_seconds"] >= 0.5


@pytest.mark.heavy
@pytest.mark.parametrize("sig, status", [(2, 130), (15, 143)])
def test_a_signal_during_the_rule_check_stops_the_process(sig, status, tmp_path):
    """SIGINT and SIGTERM while a user's rules were being checked were swallowed (raised inside
    a Z3 finalizer): the process must stop, clean up and exit 130 / 143 whenever they come."""
    import signal as signals
    import time

    rule = "my-transpose-{k} [hand, unverified]: (permute_dims (permute_dims ?x :axes [1 0]) :axes [1 0]) => ?x\n"
    rules = tmp_path / "many.rules"
    rules.write_text("".join(rule.format(k=k) for k in range(2000)))
    model = tmp_path / "in.onnx"
    onnx.save(inception_onnx(), model)
    proc = subprocess.Popen([sys.executable, "-m", "tvm_taso.cli", "optimize", str(model), "-o",
                             str(tmp_path / "out.onnx"), "--rules", str(rules), "--time-limit", "600"],
                            stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    deadline = time.time() + 60
    while time.time() < deadline and "searching (2000 rules" not in (proc.stderr.readline() or ""):
        pass
    time.sleep(1.5)  # checking the rules: about 20 a second
    assert proc.poll() is None
    proc.send_signal(sig)
    try:
        _, err = proc.communicate(timeout=30)
    except subprocess.TimeoutExpired:
        proc.kill()
        raise AssertionError("the signal was swallowed: still checking after 30 s")
    assert proc.returncode == status, err
    assert not (tmp_path / "out.onnx").exists() and _temp_files(tmp_path) == []
