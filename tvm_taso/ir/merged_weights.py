"""Merged weights put in one order and used wherever their blocks are, so that layers sharing
weights share their merges too.

A merge rule turns ``x @ A``, ``x @ B`` into ``split(x @ concat(A, B))``, and the blocks come
in whatever order the search met the matmuls. ALBERT's layers (and any model that reuses a
layer) hold the same ``A`` and ``B``; when one layer merges ``(A, B)`` and the next ``(B, A)``,
folding gives two different arrays, and the written model holds a copy of the merged weight per
order. :func:`order_merged_blocks` sorts the blocks of each merged weight by their contents,
and the split's outputs with them: same blocks, same array (folds are shared by contents,
:func:`~tvm_taso.ir.graph.shared_weight`). A split of a split's output, ``(q, (k, v))``, is
written as one split (``split-of-split``): one kernel where TVM built two (quick NasRNN for
llvm: 26 kernels become 22 by TVM's own count).

A layer whose search was cut short (or a region that straddled two layers) may leave its
projections unmerged while another layer reading the same weights merged them: the written model
then holds both the blocks and the merged copy. :func:`reuse_merged_weights` merges such a
layer with the merged weight already there (``merge-matmul-shared-lhs``, or its convolution
twin, at a site the search did not reach), so the blocks are stored once; the caller keeps that
only where it is not costlier.

A merged weight is recognised by the split it feeds: ``split(op(x, W) [+ b], axis)`` where
``op`` maps the split's blocks to blocks of ``W`` (a matmul's columns, a convolution's output
channels) and ``W`` (and ``b`` where it is not broadcast) were made by folding. A weight the
model holds itself (GPT-2's fused ``c_attn``) is never reordered: that would copy it.
"""

from __future__ import annotations

from collections import Counter
from dataclasses import dataclass

import numpy as np

from tvm_taso.ir.graph import Graph, OpError, Ref, content_digest, shared_weight
from tvm_taso.ir.ops import TensorType


def order_merged_blocks(graph: Graph) -> int:
    """Put the blocks of every merged weight of ``graph`` in order of their contents, in one
    split (in place); returns how many merges were rewritten."""
    reordered = 0
    mapping: dict[Ref, Ref] = {}
    for merged in _merges(graph, _Digests()):
        reordered += _reorder(graph, merged, mapping)
    graph.replace_uses(mapping)
    graph.prune()
    return reordered


def reuse_merged_weights(graph: Graph) -> int:
    """Apply each merged weight of ``graph`` (put in one order first, :func:`order_merged_blocks`)
    wherever its blocks are applied to one input by separate ops, or by smaller merges of them
    (in place); returns how many sites were merged."""
    digests = _Digests()
    merges = sorted(_merges(graph, digests), key=lambda m: -len(m.keys))
    pieces = _pieces(graph, merges, digests)
    taken: set[int] = set()  # ops whose outputs were given a merged weight's
    mapping: dict[Ref, Ref] = {}
    reused = 0
    for merged in merges:
        if merged.op_id in taken:
            continue
        for x, sources in pieces.items():
            if x == graph.nodes[merged.op_id].inputs[0]:
                continue
            chosen = _cover(merged.keys, [s for s in sources if s.op_id not in taken and s.op_id != merged.op_id
                                   and s.attrs == merged.attrs])
            if chosen is None or not _apply(graph, merged, x, chosen, mapping):
                continue
            taken.update(s.op_id for s in chosen)
            reused += 1
    graph.replace_uses(mapping)
    graph.prune()
    return reused


class _Digests:
    """Content digests of arrays and of their blocks, each hashed once (the arrays are held, so
    that their ids stay theirs; a block's copy is dropped once hashed)."""

    def __init__(self):
        self._known: dict[tuple, tuple[np.ndarray, list[bytes]]] = {}

    def __call__(self, array: np.ndarray) -> bytes:
        if array.ndim == 0:
            return content_digest(np.ascontiguousarray(array))
        return self.blocks(array, 0, [(0, array.shape[0])])[0]

    def blocks(self, array: np.ndarray, axis: int, bounds: list[tuple[int, int]]) -> list[bytes]:
        key = (id(array), axis, tuple(bounds))
        known = self._known.get(key)
        if known is None:
            known = self._known[key] = (array, [content_digest(np.ascontiguousarray(b))
                                                for b in _blocks(array, axis, bounds)])
        return known[1]


@dataclass
class _Merged:
    """A merged weight: ``split(op(x, weight) [+ bias])``, its blocks flattened (``parts``:
    ``(start, stop, ref)``) and each block's key (its weight's and bias's contents)."""

    split_id: int
    op_id: int
    op: str
    attrs: tuple
    weight: Ref
    w_axis: int
    bias: Ref | None
    bias_axis: int | None
    parts: list
    keys: list

    @property
    def sizes(self) -> list[int]:
        return [stop - start for start, stop, _ in self.parts]


@dataclass
class _Source:
    """Ops that apply blocks to one input: one op (one block), or a merged weight's blocks."""

    op_id: int
    attrs: tuple
    keys: list
    refs: list
    merged: bool


def _whole_used(graph: Graph) -> set[int]:
    whole = {r[0] for node in graph.nodes.values() for r in node.inputs if r[1] < 0}
    return whole | {r[0] for r in graph.outputs if r[1] < 0}


def _merges(graph: Graph, digests: _Digests) -> list[_Merged]:
    users, whole_used = graph.users(), _whole_used(graph)
    found = []
    for nid in graph.topo_order():
        split = graph.nodes[nid]
        if split.op != "split" or nid in whole_used:
            continue
        under = _merge_under(graph, users, split)
        if under is None:
            continue
        op_id, w_axis, bias, bias_axis = under
        op = graph.nodes[op_id]
        parts = _parts(graph, users, whole_used, nid, 0)
        bounds = [(start, stop) for start, stop, _ in parts]
        w_keys = digests.blocks(_folded(graph, op.inputs[1]), w_axis, bounds)
        if bias_axis is not None:
            b_keys = digests.blocks(_folded(graph, bias), bias_axis, bounds)
        else:
            b_keys = [_bias_key(graph, bias, None, digests)] * len(parts)
        found.append(_Merged(nid, op_id, op.op, op.attrs, op.inputs[1], w_axis, bias, bias_axis, parts,
                             list(zip(w_keys, b_keys))))
    return found


def _bias_key(graph: Graph, bias: Ref | None, bias_axis: int | None, digests: _Digests) -> bytes:
    """How a block's bias is told apart: none, its block's contents, or (broadcast along the
    blocks) the whole bias's contents, or the tensor it is when not a constant."""
    if bias is None:
        return b""
    node = graph.nodes[bias[0]]
    if node.op != "const":
        return f"ref{bias}".encode()
    value = digests(node.payload[0])
    return value if bias_axis is not None else b"all" + value


def _pieces(graph: Graph, merges: list[_Merged], digests: _Digests) -> dict[Ref, list[_Source]]:
    """For each input that ops apply constant weights to, those ops as :class:`_Source` s."""
    users = graph.users()
    by_op = {m.op_id: m for m in merges}
    kinds = {(m.op, m.attrs) for m in merges}
    # a weight is hashed only if it could be a block (a model's weights may be mapped from disk)
    block_types = {_block_type(graph.type_of(m.weight), m.w_axis, size) for m in merges for size in m.sizes}
    pieces: dict[Ref, list[_Source]] = {}
    for nid, node in graph.nodes.items():
        if (node.op, node.attrs) not in kinds or graph.is_constant(node.inputs[0]):
            continue
        merged = by_op.get(nid)
        if merged is not None:
            source = _Source(nid, node.attrs, merged.keys, [ref for _, _, ref in merged.parts], True)
        elif graph.is_constant(node.inputs[1]) and graph.type_of(node.inputs[1]) in block_types:
            source = _single(graph, users, nid, node, digests)
        else:
            continue
        pieces.setdefault(node.inputs[0], []).append(source)
    return pieces


def _block_type(whole, axis: int, size: int):
    shape = list(whole.shape)
    shape[axis] = size
    return TensorType(tuple(shape), whole.dtype)


def _single(graph: Graph, users, nid: int, node, digests: _Digests) -> _Source:
    """One op applying one weight, with the constant it adds if that is its only use."""
    y = (nid, 0)
    ref, bias_key = y, b""
    readers = users.get(nid, [])
    if len(readers) == 1 and _only_use(graph, users, y):
        add = graph.nodes[readers[0]]
        if add.op == "add" and add.inputs[0] == y and graph.is_constant(add.inputs[1]):
            axis = len(graph.type_of(y).shape) - 1 if node.op == "matmul" else 1
            bias_key = _bias_key(graph, add.inputs[1], _bias_axis(graph, y, add.inputs[1], axis), digests)
            ref = (readers[0], 0)
    weight = graph.nodes[node.inputs[1][0]].payload[0]
    return _Source(nid, node.attrs, [(digests(weight), bias_key)], [ref], False)


def _cover(want: list, sources: list[_Source]) -> list[_Source] | None:
    """Sources whose blocks are, together, exactly ``want`` (a multiset); None if there are none
    (or only a merge of the same blocks, which already shares the weight)."""
    left = Counter(want)
    chosen = []
    for source in sources:
        need = Counter(source.keys)
        if all(left[k] >= n for k, n in need.items()):
            left -= need
            chosen.append(source)
    if +left or not chosen or (len(chosen) == 1 and chosen[0].merged):
        return None
    return chosen


def _apply(graph: Graph, merged: _Merged, x: Ref, chosen: list[_Source], mapping: dict[Ref, Ref]) -> bool:
    """Give ``chosen``'s outputs the blocks of ``merged`` applied to ``x``."""
    try:
        new = _merged_op(graph, merged, x, merged.weight, merged.bias, merged.sizes)
    except OpError:
        return False
    free = list(range(len(merged.keys)))
    given = {}
    for source in chosen:
        for key, ref in zip(source.keys, source.refs):
            position = next(j for j in free if merged.keys[j] == key)
            free.remove(position)
            if graph.type_of((new, position)) != graph.type_of(ref):
                return False
            given[ref] = (new, position)
    mapping.update(given)
    return True


def _merged_op(graph: Graph, merged: _Merged, x: Ref, weight: Ref, bias: Ref | None, sizes: list[int]) -> int:
    """``split(op(x, weight) [+ bias])`` with ``merged``'s op, attributes and split axis, its
    blocks ``sizes`` long: the split's node id. Raises OpError if the types do not check."""
    y = graph.add(merged.op, (x, weight), dict(merged.attrs)), 0
    if bias is not None:
        y = graph.add("add", (y, bias), {}), 0
    axis = graph.nodes[merged.split_id].attr["axis"]
    return graph.add("split", (y,), {"indices": tuple(np.cumsum(sizes[:-1]).tolist()), "axis": axis})


def _bias_axis(graph: Graph, y: Ref, bias: Ref, axis: int) -> int | None:
    """The axis of ``bias`` that ``y``'s ``axis`` meets when added, or None where the bias is
    broadcast along it (it has no such axis, or a size 1 there)."""
    b_shape = graph.type_of(bias).shape
    bias_axis = axis - (len(graph.type_of(y).shape) - len(b_shape))
    return None if bias_axis < 0 or b_shape[bias_axis] == 1 else bias_axis


def _folded(graph: Graph, ref: Ref) -> np.ndarray | None:
    """The value of ``ref`` if it is a constant the optimizer made (not one the model holds)."""
    node = graph.nodes[ref[0]]
    return node.payload[0] if node.op == "const" and node.payload[1] is None else None


def _only_use(graph: Graph, users, ref: Ref) -> bool:
    return len(users.get(ref[0], [])) == 1 and ref not in graph.outputs


def _merge_under(graph: Graph, users, split) -> tuple | None:
    """``(op node id, weight axis, bias ref, bias axis)`` when ``split``'s blocks are blocks of
    a folded weight along ``weight axis`` (and of a bias along ``bias axis``, None when the bias
    is broadcast along the split or there is none); None otherwise."""
    axis = split.attr["axis"]
    if not isinstance(split.attr["indices"], tuple):
        return None  # equal parts of a symbolic length
    y = split.inputs[0]
    length = graph.type_of(y).shape[axis]
    if not isinstance(length, (int, np.integer)) or not _only_use(graph, users, y):
        return None
    bias, bias_axis = None, None
    node = graph.nodes[y[0]]
    if node.op == "add":
        bias = node.inputs[1]
        bias_axis = _bias_axis(graph, y, bias, axis)
        if bias_axis is not None and _folded(graph, bias) is None:
            return None
        y = node.inputs[0]
        if not _only_use(graph, users, y):
            return None
        node = graph.nodes[y[0]]
    if len(node.inputs) != 2 or _folded(graph, node.inputs[1]) is None:
        return None
    rank, w_shape = len(graph.type_of(y).shape), graph.type_of(node.inputs[1]).shape
    if node.op == "matmul" and len(w_shape) >= 2 and axis == rank - 1 and w_shape[-1] == length:
        return y[0], len(w_shape) - 1, bias, bias_axis
    at = node.attr
    if (node.op == "conv2d" and at.get("groups") == 1 and axis == 1 and w_shape[0] == length
            and (at.get("data_layout"), at.get("kernel_layout"), at.get("out_layout") or "NCHW")
            == ("NCHW", "OIHW", "NCHW")):
        return y[0], 0, bias, bias_axis
    return None


def _blocks(array: np.ndarray, axis: int, bounds: list[tuple[int, int]]) -> list[np.ndarray]:
    index = [slice(None)] * array.ndim
    out = []
    for start, stop in bounds:
        index[axis] = slice(start, stop)
        out.append(array[tuple(index)])
    return out


def _parts(graph: Graph, users, whole_used: set[int], nid: int, offset: int) -> list[tuple[int, int, Ref]]:
    """The blocks split ``nid`` cuts, as ``(start, stop, ref)``: an output read only by another
    split along the same axis (a merge of a merge: ``(q, (k, v))``) is that split's blocks."""
    split = graph.nodes[nid]
    axis = split.attr["axis"]
    length = graph.type_of(split.inputs[0]).shape[axis]
    points = [0, *split.attr["indices"], length]
    parts = []
    for i, (start, stop) in enumerate(zip(points, points[1:])):
        ref = (nid, i)
        readers = [u for u in users.get(nid, []) if ref in graph.nodes[u].inputs]
        inner = graph.nodes[readers[0]] if len(readers) == 1 else None
        if (inner is not None and inner.op == "split" and inner.attr["axis"] == axis
                and isinstance(inner.attr["indices"], tuple) and readers[0] not in whole_used
                and ref not in graph.outputs):
            parts += _parts(graph, users, whole_used, readers[0], offset + start)
        else:
            parts.append((offset + start, offset + stop, ref))
    return parts


def _reorder(graph: Graph, merged: _Merged, mapping: dict[Ref, Ref]) -> int:
    order = sorted(range(len(merged.keys)), key=merged.keys.__getitem__)
    nested = any(ref[0] != merged.split_id for _, _, ref in merged.parts)
    if order == list(range(len(merged.keys))) and not nested:
        return 0
    op = graph.nodes[merged.op_id]
    bounds = [(start, stop) for start, stop, _ in merged.parts]

    def leaf(ref: Ref, axis: int) -> Ref:
        blocks = _blocks(_folded(graph, ref), axis, bounds)
        array = shared_weight(np.concatenate([blocks[i] for i in order], axis=axis))
        return graph.add_leaf("const", graph.type_of(ref), (array, None), key=("ordered", merged.split_id, ref)), 0

    bias = leaf(merged.bias, merged.bias_axis) if merged.bias_axis is not None else merged.bias
    new = _merged_op(graph, merged, op.inputs[0], leaf(merged.weight, merged.w_axis), bias,
                     [merged.sizes[i] for i in order])
    for position, block in enumerate(order):
        mapping[merged.parts[block][2]] = (new, position)
    return 1
