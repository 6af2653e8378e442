"""BERT-base, faithful to HuggingFace's ``BertModel`` export (unlike TASO's BERT, which has no
LayerNorm, GELU or softmax): word/position/token-type embeddings and their LayerNormalization,
then per layer Q/K/V MatMul+Add, Reshape/Transpose to heads, MatMul QKᵀ, Div by √head_dim,
Softmax, MatMul V, Transpose/Reshape back, output projection, residual Add, LayerNormalization,
feed-forward with exact GELU (``x * 0.5 * (1 + erf(x / √2))``), residual Add, LayerNormalization.
~109 M weights (~440 MB as float32, ~340 MB without the embeddings)."""

from __future__ import annotations

import numpy as np
import onnx
from onnx import TensorProto

from .onnx_graph import OnnxGraph


def bert_base(
    layers: int = 12,
    seq: int = 128,
    hidden: int = 768,
    heads: int = 12,
    ffn: int = 3072,
    vocab: int | None = 30522,
    max_positions: int = 512,
    type_vocab: int = 2,
    scale_with: str = "Div",
    seed: int = 0,
) -> onnx.ModelProto:
    """BERT-base as ONNX, batch 1.

    With ``vocab`` (default 30522) the model starts from ``input_ids`` (int64, shape (1, seq))
    with BERT's embeddings (word, position and token-type Gathers, Add, LayerNormalization);
    with ``vocab=None`` it starts from the embedded input ``x`` (float32, (1, seq, hidden)), like
    a model whose embeddings are done elsewhere. ``scale_with``: ``"Div"`` (by √head_dim, as
    HuggingFace's BERT export) or ``"Mul"`` (by 1/√head_dim). The output is the last hidden
    state, (1, seq, hidden)."""
    if hidden % heads:
        raise ValueError(f"hidden {hidden} is not a multiple of heads {heads}")
    if scale_with not in ("Div", "Mul"):
        raise ValueError(f"scale_with must be 'Div' or 'Mul', not {scale_with!r}")
    hd = hidden // heads
    eps = 1e-12
    g = OnnxGraph(seed)

    if vocab is not None:
        ids = "input_ids"
        inputs = {ids: ((1, seq), TensorProto.INT64)}
        word = g.op("Gather", g.weight(vocab, hidden, scale=0.02, name="embeddings.word_embeddings.weight"), ids,
                    axis=0, name="embeddings/word")
        pos = g.op("Gather", g.weight(max_positions, hidden, scale=0.02, name="embeddings.position_embeddings.weight"),
                   g.ints(np.arange(seq)[None, :], "position_ids"), axis=0, name="embeddings/position")
        typ = g.op("Gather", g.weight(type_vocab, hidden, scale=0.02, name="embeddings.token_type_embeddings.weight"),
                   g.ints(np.zeros((1, seq)), "token_type_ids"), axis=0, name="embeddings/token_type")
        h = g.op("Add", g.op("Add", word, typ, name="embeddings/Add"), pos, name="embeddings/Add_1")
        h = g.layer_norm(h, hidden, eps, name="embeddings/LayerNorm")
    else:
        h = "x"
        inputs = {h: ((1, seq, hidden), TensorProto.FLOAT)}

    to_heads = g.ints([1, seq, heads, hd], "heads_shape")
    to_hidden = g.ints([1, seq, hidden], "hidden_shape")
    sqrt_hd = g.scalar(np.sqrt(hd) if scale_with == "Div" else 1 / np.sqrt(hd), "attention_scale")

    for i in range(layers):
        p = f"encoder.layer.{i}"
        q = g.linear(h, hidden, hidden, name=f"{p}.attention.self.query")
        k = g.linear(h, hidden, hidden, name=f"{p}.attention.self.key")
        v = g.linear(h, hidden, hidden, name=f"{p}.attention.self.value")
        q = g.op("Transpose", g.op("Reshape", q, to_heads, name=f"{p}/q/Reshape"), perm=[0, 2, 1, 3], name=f"{p}/q/Transpose")
        k = g.op("Transpose", g.op("Reshape", k, to_heads, name=f"{p}/k/Reshape"), perm=[0, 2, 3, 1], name=f"{p}/k/Transpose")
        v = g.op("Transpose", g.op("Reshape", v, to_heads, name=f"{p}/v/Reshape"), perm=[0, 2, 1, 3], name=f"{p}/v/Transpose")
        s = g.op("MatMul", q, k, name=f"{p}/scores/MatMul")  # (1, heads, seq, seq)
        s = g.op(scale_with, s, sqrt_hd, name=f"{p}/scores/{scale_with}")
        a = g.op("Softmax", s, axis=-1, name=f"{p}/Softmax")
        c = g.op("MatMul", a, v, name=f"{p}/context/MatMul")  # (1, heads, seq, hd)
        c = g.op("Transpose", c, perm=[0, 2, 1, 3], name=f"{p}/context/Transpose")
        c = g.op("Reshape", c, to_hidden, name=f"{p}/context/Reshape")
        a = g.linear(c, hidden, hidden, name=f"{p}.attention.output.dense")
        h = g.layer_norm(g.op("Add", a, h, name=f"{p}/attention/residual"), hidden, eps, name=f"{p}.attention.output.LayerNorm")
        f = g.gelu_erf(g.linear(h, hidden, ffn, name=f"{p}.intermediate.dense"), name=f"{p}/gelu")
        f = g.linear(f, ffn, hidden, name=f"{p}.output.dense")
        h = g.layer_norm(g.op("Add", f, h, name=f"{p}/output/residual"), hidden, eps, name=f"{p}.output.LayerNorm")

    return g.model(inputs, [h], "bert_base")


