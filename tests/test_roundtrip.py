"""ONNX round trip on tiny versions of the benchmark models (benchmarks/models/):
import → optimize → export gives a model that passes ``onnx.checker.check_model(full_check=True)``
and computes in onnxruntime what the original computes (relative error ≤ 1e-4)."""

import collections
import sys
from pathlib import Path

import onnx
import pytest

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))  # benchmarks/ is not installed
from benchmarks import models, roundtrip  # noqa: E402

pytest.importorskip("onnxruntime")

TINY = {
    "bert": lambda: models.bert.bert_base(layers=1, seq=16, hidden=64, heads=4, ffn=256, vocab=None),
    "bert-embeddings": lambda: models.bert.bert_base(
        layers=1, seq=16, hidden=64, heads=4, ffn=256, vocab=100, max_positions=16, scale_with="Mul"
    ),
    "resnet50": lambda: models.resnet.resnet50(image=32, width=4, classes=10),
}


@pytest.mark.parametrize("name", sorted(TINY))
def test_round_trip_matches_onnxruntime(name):
    model = TINY[name]()
    onnx.checker.check_model(model, full_check=True)
    budget = 20 if name == "resnet50" else 200  # every batch norm is still folded; keeps the test fast
    row = roundtrip.roundtrip(name, model, target="cuda", budget=budget)
    assert row["stage"] == "done", row.get("traceback")  # check_model on the export passed, ort ran
    assert row["max_rel_err"] <= 1e-4
    assert row["ok"]
    if name == "resnet50":
        assert row["applied"].get("fold-batch-norm-into-conv") == 53


def test_builders_are_faithful():
    bert = models.bert.bert_base(layers=2, seq=8, hidden=32, heads=4, ffn=64, vocab=50, max_positions=8)
    ops = collections.Counter(n.op_type for n in bert.graph.node)
    assert ops["MatMul"] == 2 * 8 and ops["LayerNormalization"] == 2 * 2 + 1 and ops["Erf"] == 2
    assert ops["Softmax"] == 2 and ops["Div"] == 2 * 2 and ops["Gather"] == 3
    assert bert.opset_import[0].version == 17
    resnet = models.resnet.resnet50(image=32, width=4, classes=10)
    ops = collections.Counter(n.op_type for n in resnet.graph.node)
    assert ops["Conv"] == ops["BatchNormalization"] == 53 and ops["Gemm"] == 1 and ops["MaxPool"] == 1
    assert [d.dim_value for d in resnet.graph.output[0].type.tensor_type.shape.dim] == [1, 10]


def test_bert_qkv_merged_in_export():
    """Without the embeddings, the three Q/K/V projections of a layer become one MatMul."""
    model = TINY["bert"]()
    mod = roundtrip.tvm_taso.io.onnx_import.import_relax(model)
    new, report = roundtrip.tvm_taso.optimize(mod, target="cuda")
    exported = roundtrip.tvm_taso.export_onnx(new)
    before = sum(n.op_type == "MatMul" for n in model.graph.node)
    after = sum(n.op_type == "MatMul" for n in exported.graph.node)
    assert report["cost_after"] < report["cost_before"] and after == before - 2


def test_bert_with_embeddings_is_optimized():
    model = TINY["bert-embeddings"]()
    row = roundtrip.roundtrip("bert-embeddings", model, target="cuda")
    assert not row["internal_error"] and row["cost_ratio"] < 1


def test_gather_with_scalar_index_round_trips():
    import numpy as np
    from onnx import TensorProto, helper, numpy_helper

    idx = numpy_helper.from_array(np.array(0, dtype=np.int64), "idx")
    graph = helper.make_graph(
        [helper.make_node("Gather", ["x", "idx"], ["y"], axis=1)], "g",
        [helper.make_tensor_value_info("x", TensorProto.FLOAT, [1, 5, 8])],
        [helper.make_tensor_value_info("y", TensorProto.FLOAT, [1, 8])], [idx])
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)])
    row = roundtrip.roundtrip("gather-scalar", model, target="cuda")
    assert row["stage"] == "done" and row["ok"], row.get("failed")
