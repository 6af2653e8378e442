"""BLAS in CPU builds (:mod:`tvm_taso.blas`): which matmuls and convolutions are handed to it,
that the build computes what TVM's own computes, which targets use it, and how measurements and
the ``tuned`` cost model account for it."""

from __future__ import annotations

import json

import numpy as np
import pytest
import tvm
from tvm import relax

from tvm_taso import blas
from tvm_taso import target as targets
from tvm_taso.cost.database import db_target, measured_target
from tvm_taso.cost.kernel_build import build_pipeline, fused_module
from tvm_taso.runtime import run

pytestmark = pytest.mark.skipif(not blas.available(), reason="numpy has no BLAS here")

RNG = np.random.default_rng(0)


def _const(*shape, dtype="float32"):
    return relax.const(RNG.standard_normal(shape).astype(dtype))


def _module(params, body):
    """A ``main`` over ``params`` (name: (shape, dtype)) whose dataflow block ``body(bb, vars)``
    fills, returning what ``body`` returns."""
    bb = relax.BlockBuilder()
    vars_ = [relax.Var(name, relax.TensorType(shape, dtype)) for name, (shape, dtype) in params.items()]
    with bb.function("main", vars_):
        with bb.dataflow():
            out = bb.emit_output(body(bb, vars_))
        bb.emit_func_output(out)
    return bb.get()


def _library_calls(mod, target="llvm"):
    return blas.library_calls(fused_module(mod, targets.parse(target)))


def _same_as_tvm(mod, inputs, target="llvm"):
    """The BLAS build's outputs against TVM's own pipeline's, to float32 accumulation order."""
    parsed = targets.parse(target)
    want = run(mod, inputs, "llvm", "default")
    got = run(mod, inputs, parsed, build_pipeline(parsed))
    for w, g in zip(want, got, strict=True):
        np.testing.assert_allclose(g, w, rtol=1e-4, atol=1e-4 * float(np.abs(w).max()))


def _convs(bb, params):
    """Convolutions the dispatch rewrites in every way: 3x3 stride 2 (im2col), 1x1 (the input
    is the matrix), asymmetric padding with dilation, a 7x7 on 3 channels; then a grouped one and
    a tiny one, which stay TVM's."""
    (x,) = params
    y = bb.emit(relax.op.nn.relu(relax.op.nn.conv2d(x, _const(32, 16, 3, 3), strides=2, padding=1)))
    y = bb.emit(relax.op.nn.conv2d(y, _const(128, 32, 1, 1)))
    y = bb.emit(relax.op.nn.conv2d(y, _const(64, 128, 3, 3), padding=(1, 0, 2, 1), dilation=2))
    y = bb.emit(relax.op.nn.conv2d(y, _const(64, 8, 3, 3), padding=1, groups=8))
    return bb.emit(relax.op.nn.conv2d(y, _const(4, 64, 1, 1)))


def test_convolutions_are_handed_to_the_blas_and_compute_what_tvm_computes():
    mod = _module({"x": ((1, 16, 24, 24), "float32")}, _convs)
    calls = _library_calls(mod)
    # 3x3/2: 144 output pixels x 144 patch values; 1x1: the pixels x 32 channels; dilated, padded
    # (1, 0, 2, 1) on 12x12: 11x9 pixels x 1152
    assert calls == [((144, 144), (144, 32), "float32"), ((144, 32), (32, 128), "float32"),
                     ((99, 1152), (1152, 64), "float32")]
    fused = fused_module(mod, targets.parse("llvm"))
    im2col = [gv.name_hint for gv, f in fused.functions_items() if "im2col" in gv.name_hint]
    assert len(im2col) == 2  # the 1x1 convolution needs none
    _same_as_tvm(mod, [RNG.standard_normal((1, 16, 24, 24)).astype("float32")])


def test_matmuls_are_handed_to_the_blas_with_numpys_semantics():
    def body(bb, v):
        x, w = v
        y = bb.emit(relax.op.matmul(x, w))  # 2-D by a parameter
        h = bb.emit(relax.op.reshape(y, (2, 64, 4, 32)))
        h = bb.emit(relax.op.permute_dims(h, (0, 2, 1, 3)))
        scores = bb.emit(relax.op.matmul(h, relax.op.permute_dims(h, (0, 1, 3, 2))))  # batched
        mixed = bb.emit(relax.op.matmul(scores, _const(64, 16)))  # a broadcast right operand
        small = bb.emit(relax.op.matmul(mixed, _const(16, 2)))  # under MIN_FLOPS: TVM's
        return small

    mod = _module({"x": ((128, 256), "float32"), "w": ((256, 128), "float32")}, body)
    assert _library_calls(mod) == [((128, 256), (256, 128), "float32"),
                                   ((2, 4, 64, 32), (2, 4, 32, 64), "float32"),
                                   ((2, 4, 64, 64), (64, 16), "float32")]
    _same_as_tvm(mod, [RNG.standard_normal((128, 256)).astype("float32"),
                       RNG.standard_normal((256, 128)).astype("float32")])


def test_integer_matmuls_and_symbolic_sizes():
    """An integer matmul stays TVM's; one over a symbolic sequence is handed to the BLAS and runs
    at any size."""
    n = tvm.tirx.Var("n", "int64")

    def body(bb, v):
        x, i = v
        y = bb.emit(relax.op.matmul(x, _const(512, 512)))
        j = bb.emit(relax.op.matmul(i, relax.const(np.ones((64, 64), "int32"))))
        return relax.Tuple([y, j])

    mod = _module({"x": ((n, 512), "float32"), "i": ((64, 64), "int32")}, body)
    calls = _library_calls(mod)
    assert len(calls) == 1 and calls[0][1:] == ((512, 512), "float32") and str(calls[0][0][0]) == "n"
    parsed = targets.parse("llvm")
    ints = RNG.integers(0, 3, (64, 64)).astype("int32")
    for rows in (1, 17):
        x = RNG.standard_normal((rows, 512)).astype("float32")
        want = run(mod, [x, ints], "llvm", "default")
        got = run(mod, [x, ints], parsed, build_pipeline(parsed))
        np.testing.assert_allclose(got[0], want[0], rtol=1e-4, atol=1e-3)
        np.testing.assert_array_equal(got[1], want[1])


def test_which_targets_use_the_blas():
    assert blas.used_for("llvm") and targets.wants_blas("llvm")
    assert not blas.used_for({"kind": "llvm", "libs": ["tvm"]})
    assert blas.used_for({"kind": "llvm", "libs": ["blas"]})
    assert not blas.used_for({"kind": "llvm", "mtriple": "aarch64-linux-gnu"})  # another machine
    assert not blas.used_for({"kind": "llvm", "mcpu": "cortex-a72", "mtriple": "aarch64-linux-gnu"})
    assert not blas.used_for("cuda")
    assert not blas.used_for(targets.without_blas("llvm"))
    assert str(targets.without_blas("cuda")) == str(targets.parse("cuda"))
    mod = _module({"x": ((1, 16, 24, 24), "float32")}, _convs)
    assert not _library_calls(mod, {"kind": "llvm", "libs": ["tvm"]})
    # the model's layouts (what a report counts kernels in) keep the model's ops
    assert not blas.library_calls(fused_module(mod, targets.parse("llvm"), model_layouts=True))


def test_measurements_of_blas_builds_are_other_facts():
    """A measurement of a build that calls the BLAS is marked with it (timings from before, or of
    builds without it, are not reused); an RPC device builds without it, and its records are not
    marked."""
    from tvm_taso.cost.rpc.measurer import RPCMeasurer

    mark = json.loads(measured_target("llvm")).get("taso:blas")
    assert mark == blas.name() and mark.strip()
    assert "taso:blas" not in json.loads(measured_target(targets.without_blas("llvm")))
    assert "taso:blas" not in json.loads(measured_target("cuda"))
    remote = RPCMeasurer(host="127.0.0.1", port=9, tag="board")
    record = json.loads(remote.record_target(db_target(targets.canonical("llvm"), None)))
    assert "taso:blas" not in record and record["taso:device"] == "board"


def test_the_tuned_cost_model_times_the_library_call(tmp_path):
    """A kernel the build hands to the BLAS costs the call, timed here: no database entry, no
    prediction needed."""
    from tvm_taso.cost.model import Kernel
    from tvm_taso.cost.tuned import TunedCost
    from tvm_taso.ir.ops import TensorType

    db = tmp_path / "db"
    db.mkdir()
    (db / "database_workload.json").write_text("")
    (db / "database_tuning_record.json").write_text("")
    a, b = TensorType((256, 512), "float32"), TensorType((512, 512), "float32")
    kernel = Kernel((("matmul", (("out_dtype", "void"),), (("in", a), ("in", b))),), (TensorType((256, 512), "float32"),))
    model = TunedCost("llvm", str(db))
    cost = model.kernel_cost(kernel)
    timed = blas.matmul_seconds((256, 512), (512, 512), "float32") * 1e6
    assert cost == pytest.approx(timed) and cost > 0
    assert model.describe()["library_calls"] == 1 and model.describe()["fallback"] == 0


def test_the_kernel_profile_accounts_for_every_call(tmp_path, monkeypatch):
    """``benchmarks.kernel_profile`` on a tiny ResNet-50 (every convolution handed to the BLAS,
    however small) with an empty database: the BLAS calls are counted with their work, and every
    other kernel is on its default schedule."""
    import sys
    from pathlib import Path

    sys.path.insert(0, str(Path(__file__).resolve().parents[1]))  # benchmarks/ is not installed
    from benchmarks import kernel_profile
    from tvm_taso.cost import tuning

    monkeypatch.setattr(blas, "MIN_FLOPS", 0)
    (tmp_path / "db" / "resnet50").mkdir(parents=True)
    tuning.open_database(tmp_path / "db" / "resnet50")
    out = tmp_path / "profile.json"
    assert kernel_profile.main(["--models", "resnet50", "--quick", "--database", str(tmp_path / "db"),
                                "--runs", "2", "--json", str(out)]) == 0
    (row,) = json.loads(out.read_text())["rows"]
    assert row["tasks_held"] == 0 and "TVM, tuned" not in row["median_ms"]
    assert row["blas"]["calls"] > 0 and row["blas"]["gflop"] > 0 and row["median_ms"]["BLAS matmul"] > 0
    assert row["median_ms"]["TVM, default schedule"] > 0
    assert row["total_ms"] == pytest.approx(sum(row["median_ms"].values()))
    top = row["top_kernels"]
    assert top and [k["ms"] for k in top] == sorted((k["ms"] for k in top), reverse=True)
    assert any(k["name"] == blas.FUNCTION and k["group"] == "BLAS matmul" for k in top)
