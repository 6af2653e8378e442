"""Memory near the model's size (issue 29): a model read from a file keeps its large weights out
of the message the optimizer works on (mapped from the model's file or its external data), the
optimized model streams them to its file, and ``tvm-taso optimize`` on a decoder with external
data stays within the import baseline plus twice the model's size, computing what the
original computes."""

from __future__ import annotations

import sys
import time

import numpy as np
import onnx
import onnxruntime as ort
import pytest

import tvm_taso
from benchmarks.llama import LlamaConfig, write_llama
from benchmarks.memory import BASELINE, run_measured
from tvm_taso.io import onnx_model

SMALL = LlamaConfig(layers=2, hidden=64, heads=4, intermediate=160, vocab=50, max_positions=32)


def _outputs(path, ids) -> np.ndarray:
    return ort.InferenceSession(str(path), providers=["CPUExecutionProvider"]).run(None, {"input_ids": ids})[0]


def _ids(seq: int = 12) -> np.ndarray:
    return np.random.default_rng(0).integers(0, SMALL.vocab, (2, seq)).astype(np.int64)


@pytest.mark.parametrize("dtype", ["float32", "float16"])
def test_external_weights_are_mapped_merged_and_streamed_to_the_output(tmp_path, dtype):
    path = write_llama(tmp_path / "llama.onnx", LlamaConfig(**{**SMALL.__dict__, "dtype": dtype}))
    model = tvm_taso.load_onnx(path, shapes={"input_ids": (1, 16)})
    held = [i for i in model.structure.graph.initializer if model.store.holds(i)]
    assert held and all(not i.raw_data for i in held)  # the message holds no weight bytes
    assert all(isinstance(model.initializer_value(i), np.memmap) for i in held)
    new, report = tvm_taso.optimize(model, target="cuda")
    assert report["applied"].get("merge-matmul-shared-lhs", 0) >= 2 * SMALL.layers  # q/k/v and gate/up merged
    out = tmp_path / "out.onnx"
    new.save(out)
    onnx.checker.check_model(str(out), full_check=True)
    written = onnx.load(out)
    assert written.SerializeToString() == new.proto.SerializeToString()  # streamed = the complete message
    assert [i.name for i in written.graph.input] == ["input_ids"] and written.graph.output[0].name == "logits"
    for seq in (12, 5):  # the sequence stays dynamic
        want, got = _outputs(path, _ids(seq)), _outputs(out, _ids(seq))
        np.testing.assert_allclose(got, want, rtol=1e-2 if dtype == "float16" else 1e-4, atol=1e-3)


def test_a_large_result_is_written_with_external_data_streamed(tmp_path, monkeypatch):
    path = write_llama(tmp_path / "llama.onnx", SMALL)
    new, _ = tvm_taso.optimize(tvm_taso.load_onnx(path), target="cuda")
    monkeypatch.setattr(onnx_model, "LARGE_MODEL_BYTES", 10_000)
    out = tmp_path / "out.onnx"
    new.save(out)
    data = tmp_path / "out.onnx.data"
    assert data.stat().st_size > 10_000 and out.stat().st_size < data.stat().st_size
    loaded = tvm_taso.load_onnx(out)
    assert any(i.data_location == onnx.TensorProto.EXTERNAL for i in onnx.load(out, load_external_data=False).graph.initializer)
    np.testing.assert_allclose(_outputs(out, _ids()), _outputs(path, _ids()), rtol=1e-4, atol=1e-4)
    assert loaded.proto.SerializeToString() == new.proto.SerializeToString()


def test_an_inline_model_read_from_a_file_leaves_its_weights_in_the_file(tmp_path):
    path = write_llama(tmp_path / "llama.onnx", SMALL)
    inline = tmp_path / "inline.onnx"
    onnx.save_model(onnx.load(path), inline)  # the same model, its weights in the one file
    model = tvm_taso.load_onnx(inline)
    held = [i for i in model.structure.graph.initializer if model.store.holds(i)]
    assert held and model.structure.ByteSize() < 64 * 1024
    assert all(isinstance(model.initializer_value(i), np.memmap) for i in held)  # left in the file, mapped
    new, _ = tvm_taso.optimize(model, target="cuda")
    out = tmp_path / "out.onnx"
    new.save(out)
    assert not (tmp_path / "out.onnx.data").exists()
    np.testing.assert_allclose(_outputs(out, _ids()), _outputs(inline, _ids()), rtol=1e-4, atol=1e-4)


def test_a_missing_or_short_data_file_is_one_line(tmp_path):
    path = write_llama(tmp_path / "llama.onnx", SMALL)
    data = tmp_path / "llama.onnx.data"
    whole = data.read_bytes()
    for kept in (100, len(whole) - 100):  # a small tensor or a mapped one cut off
        data.write_bytes(whole[:kept])
        with pytest.raises(tvm_taso.InputError, match="not a readable ONNX model .its external data"):
            tvm_taso.load_onnx(path)
    data.unlink()
    with pytest.raises(tvm_taso.InputError, match="is missing"):
        tvm_taso.load_onnx(path)


def _peak_mb(argv) -> tuple[int, str]:
    run = run_measured(argv)
    assert run["status"] == 0, run["output_tail"]
    return run["peak_mb"], run["output_tail"]


@pytest.mark.heavy
def test_optimize_stays_within_the_import_baseline_plus_twice_the_model(tmp_path):
    """The bound of issue 29 on a 90 MB decoder with external data (the 1 B decoders and the
    zoo's largest models are in ``python -m benchmarks.memory``)."""
    path = write_llama(tmp_path / "llama.onnx", LlamaConfig(layers=4, hidden=512, heads=8, intermediate=1536,
                                                             vocab=8000, max_positions=256))
    size_mb = (path.stat().st_size + (tmp_path / "llama.onnx.data").stat().st_size) / 2**20
    baseline, _ = _peak_mb([sys.executable, "-c", BASELINE])
    start = time.perf_counter()
    peak, output = _peak_mb([sys.executable, "-m", "tvm_taso.cli", "optimize", str(path), "-o", str(tmp_path / "o.onnx"),
                             "--target", "cuda", "-j", "1"])
    assert "merge-matmul-shared-lhs" in output
    assert peak <= baseline + 2 * size_mb, (peak, baseline, size_mb, time.perf_counter() - start)


def test_external_data_outside_the_models_folder_is_refused(tmp_path):
    path = write_llama(tmp_path / "llama.onnx", SMALL)
    proto = onnx.load(path, load_external_data=False)
    for init in proto.graph.initializer:
        for entry in init.external_data:
            if entry.key == "location":
                entry.value = "../llama.onnx.data"
    (tmp_path / "sub").mkdir()
    onnx.save_model(proto, tmp_path / "sub" / "m.onnx")
    with pytest.raises(tvm_taso.InputError, match="outside the model's folder"):
        tvm_taso.load_onnx(tmp_path / "sub" / "m.onnx")
