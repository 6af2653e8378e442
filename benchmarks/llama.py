"""A Llama-style decoder written straight as ONNX, its weights streamed to an external data file
(random, never all in memory at once): what a user exporting a billion-parameter decoder brings.

Per layer: RMSNorm, attention with rotary embeddings and a causal mask (``q``, ``k``, ``v`` and
``o`` projections, no bias), RMSNorm, a SwiGLU MLP (``gate``, ``up``, ``down``); then a final
RMSNorm and the LM head. Inputs ``input_ids [batch, seq]`` (int64); output ``logits [batch,
seq, vocab]``; both dimensions symbolic, the sequence sliced out of position tables of
``max_positions`` rows by shape code, as exporters write it. Default sizes give 1.1 B
parameters (TinyLlama's widths, with as many key/value heads as query heads); ``--shared``
makes every layer read the first layer's weights, as ALBERT shares them (0.18 B parameters).

    python -m benchmarks.llama OUT.onnx [--dtype float16] [--layers 22] [--hidden 2048] ...
"""

from __future__ import annotations

import argparse
import os
from dataclasses import dataclass
from pathlib import Path

import numpy as np
import onnx
from onnx import TensorProto, helper


@dataclass(frozen=True)
class LlamaConfig:
    layers: int = 22
    hidden: int = 2048
    heads: int = 32
    intermediate: int = 5632
    vocab: int = 32000
    max_positions: int = 2048
    dtype: str = "float32"
    shared: bool = False  # every layer reads the first layer's weights, as ALBERT's do

    @property
    def parameters(self) -> int:
        h, i = self.hidden, self.intermediate
        return (1 if self.shared else self.layers) * (4 * h * h + 3 * h * i + 2 * h) + 2 * self.vocab * h + h


class _DataWriter:
    """Initializers whose bytes go to one external data file as they are made."""

    def __init__(self, model_path: Path):
        self.location = model_path.name + ".data"
        self.file = open(model_path.parent / self.location, "wb")
        self.tensors: list[TensorProto] = []
        self.names: set[str] = set()
        self.rng = np.random.default_rng(0)

    def add(self, name: str, array: np.ndarray) -> str:
        if name in self.names:  # a weight layers share: written once
            return name
        self.names.add(name)
        array = np.asarray(array, order="C")
        if array.nbytes < 1024:
            self.tensors.append(onnx.numpy_helper.from_array(array, name))
            return name
        offset = self.file.tell()
        self.file.write(array.tobytes())
        tensor = TensorProto(name=name, dims=array.shape, data_type=helper.np_dtype_to_tensor_dtype(array.dtype))
        tensor.data_location = TensorProto.EXTERNAL
        for key, value in (("location", self.location), ("offset", str(offset)), ("length", str(array.nbytes))):
            tensor.external_data.add(key=key, value=value)
        self.tensors.append(tensor)
        return name

    def weight(self, name: str, shape: tuple, dtype: str) -> str:
        if name in self.names:
            return name
        scale = 1.0 / np.sqrt(shape[0])
        return self.add(name, (self.rng.standard_normal(shape, dtype=np.float32) * scale).astype(dtype))


def write_llama(path, config: LlamaConfig = LlamaConfig()) -> Path:
    """Write the decoder to ``path`` (``path.data`` beside it) and return ``path``."""
    path = Path(path)
    c, dt = config, config.dtype
    head = c.hidden // c.heads
    data = _DataWriter(path)
    nodes: list = []
    count = iter(range(10**9))

    def op(op_type, inputs, n_out=1, **attrs):
        outs = [f"{op_type.lower()}_{next(count)}" for _ in range(n_out)]
        nodes.append(helper.make_node(op_type, inputs, outs, name=outs[0] + "_node", **attrs))
        return outs[0] if n_out == 1 else outs

    def const(name, array):
        return data.add(name, np.asarray(array))

    eps = const("rms_eps", np.array(1e-5, dt))
    two = const("two", np.array(2.0, dt))

    def rms_norm(x, prefix):
        w = data.add(f"{prefix}.weight", np.ones(c.hidden, dt))
        mean = op("ReduceMean", [op("Pow", [x, two])], axes=[-1], keepdims=1)
        return op("Mul", [op("Div", [x, op("Sqrt", [op("Add", [mean, eps])])]), w])

    # positions: the first seq rows of the tables, seq read from the input's shape
    seq = op("Gather", [op("Shape", ["input_ids"]), const("one_index", np.array(1, np.int64))], axis=0)
    seq1 = op("Unsqueeze", [seq, const("axis0", np.array([0], np.int64))])
    zero1 = const("zero1", np.array([0], np.int64))
    inv = 1.0 / (10000 ** (np.arange(0, head, 2) / head))
    angles = np.outer(np.arange(c.max_positions), inv)
    angles = np.concatenate([angles, angles], axis=1)
    cos = op("Slice", [const("rope_cos", np.cos(angles).astype(dt)), zero1, seq1, zero1])
    sin = op("Slice", [const("rope_sin", np.sin(angles).astype(dt)), zero1, seq1, zero1])
    mask_table = np.triu(np.full((c.max_positions, c.max_positions), -1e4 if dt == "float16" else -1e9, dt), 1)
    mask = op("Slice", [op("Slice", [const("causal_mask", mask_table), zero1, seq1, zero1]),
                        zero1, seq1, const("one1", np.array([1], np.int64))])
    heads_shape = const("heads_shape", np.array([0, -1, c.heads, head], np.int64))
    merged_shape = const("merged_shape", np.array([0, -1, c.hidden], np.int64))
    half = const("half", np.array([head // 2, head // 2], np.int64))
    scale = const("attn_scale", np.array(1.0 / np.sqrt(head), dt))

    def rotary(x):  # x: [batch, heads, seq, head]
        first, second = op("Split", [x, half], n_out=2, axis=-1)
        rotated = op("Concat", [op("Neg", [second]), first], axis=-1)
        return op("Add", [op("Mul", [x, cos]), op("Mul", [rotated, sin])])

    def split_heads(x):
        return op("Transpose", [op("Reshape", [x, heads_shape])], perm=[0, 2, 1, 3])

    x = op("Gather", [data.weight("embed_tokens", (c.vocab, c.hidden), dt), "input_ids"], axis=0)
    for layer in range(c.layers):
        p = "layers.0" if c.shared else f"layers.{layer}"
        h = rms_norm(x, f"{p}.input_norm")
        q, k, v = (op("MatMul", [h, data.weight(f"{p}.attn.{n}", (c.hidden, c.hidden), dt)]) for n in "qkv")
        q, k, v = rotary(split_heads(q)), rotary(split_heads(k)), split_heads(v)
        scores = op("Add", [op("Mul", [op("MatMul", [q, op("Transpose", [k], perm=[0, 1, 3, 2])]), scale]), mask])
        attn = op("MatMul", [op("Softmax", [scores], axis=-1), v])
        attn = op("Reshape", [op("Transpose", [attn], perm=[0, 2, 1, 3]), merged_shape])
        x = op("Add", [x, op("MatMul", [attn, data.weight(f"{p}.attn.o", (c.hidden, c.hidden), dt)])])
        h = rms_norm(x, f"{p}.post_norm")
        gate = op("MatMul", [h, data.weight(f"{p}.mlp.gate", (c.hidden, c.intermediate), dt)])
        up = op("MatMul", [h, data.weight(f"{p}.mlp.up", (c.hidden, c.intermediate), dt)])
        act = op("Mul", [op("Mul", [gate, op("Sigmoid", [gate])]), up])
        x = op("Add", [x, op("MatMul", [act, data.weight(f"{p}.mlp.down", (c.intermediate, c.hidden), dt)])])
    logits = op("MatMul", [rms_norm(x, "final_norm"), data.weight("lm_head", (c.hidden, c.vocab), dt)])
    nodes[-1].output[0] = "logits"
    data.file.close()
    elem = helper.np_dtype_to_tensor_dtype(np.dtype(dt))
    graph = helper.make_graph(
        nodes, "llama", [helper.make_tensor_value_info("input_ids", TensorProto.INT64, ["batch", "seq"])],
        [helper.make_tensor_value_info("logits", elem, ["batch", "seq", c.vocab])], initializer=data.tensors)
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)], producer_name="benchmarks.llama")
    model.ir_version = 8
    onnx.save_model(model, os.fspath(path))
    return path


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(prog="python -m benchmarks.llama", description=__doc__.split("\n\n")[0])
    ap.add_argument("out")
    defaults = LlamaConfig()
    for field in ("layers", "hidden", "heads", "intermediate", "vocab", "max_positions"):
        ap.add_argument(f"--{field.replace('_', '-')}", type=int, default=getattr(defaults, field))
    ap.add_argument("--dtype", choices=("float32", "float16"), default="float32")
    ap.add_argument("--shared", action="store_true", help="every layer reads the first layer's weights (ALBERT's way)")
    args = ap.parse_args(argv)
    config = LlamaConfig(args.layers, args.hidden, args.heads, args.intermediate, args.vocab, args.max_positions,
                         args.dtype, args.shared)
    write_llama(args.out, config)
    print(f"{args.out}: {config.parameters / 1e9:.2f} B parameters, {args.dtype}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
