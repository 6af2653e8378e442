"""A model's large initializers held outside its ``ModelProto``, so that memory stays near the
model's size: left in the file they are in (the model's own, whose protobuf wire format is
walked over a mapping, or its external data), memory-mapped, never copied into the protobuf
message the optimizer reads and writes, and streamed to the output file when the result is
written.

A tensor held by a :class:`TensorStore` appears in the message as an external tensor whose
``location`` is ``tvm-taso-store:TOKEN``: its name, type and dimensions are there, its bytes
are not. :func:`parse_detached` reads such a message from a file, :func:`detach` makes one from
a loaded message, :func:`attach` gives the complete message back (for a runtime or a user that
needs it whole), and :func:`write_inline` (one file) or :func:`external_layout` with
:func:`write_data` (a file and its external data) write it without ever holding the serialized
model in memory.
"""

from __future__ import annotations

import itertools
import mmap
import os
from dataclasses import dataclass
from pathlib import Path

import numpy as np
import onnx
from onnx import TensorProto, external_data_helper, helper, numpy_helper

PREFIX = "tvm-taso-store:"
# tensors with more elements than this are held in the store (smaller ones stay in the message:
# shape inference reads them as shapes, axes, split sizes)
DETACHED_ELEMENTS = 1024
# bytes copied at a time from a data file to the output: small, so that writing a model adds
# little to the peak of the search it follows
_CHUNK = 2**20
_tokens = itertools.count()


@dataclass(frozen=True)
class _FileRange:
    """Bytes of an external data file: read in place (memory-mapped), copied in chunks."""

    path: Path
    offset: int
    length: int
    dtype: np.dtype
    shape: tuple[int, ...]

    def array(self) -> np.ndarray:
        if self.length == 0:
            return np.zeros(self.shape, self.dtype)
        return np.memmap(self.path, dtype=self.dtype, mode="r", offset=self.offset, shape=self.shape)

    def copy_to(self, out) -> None:
        buffer = memoryview(bytearray(min(_CHUNK, self.length)))
        with open(self.path, "rb") as f:
            f.seek(self.offset)
            left = self.length
            while left:
                read = f.readinto(buffer[:min(len(buffer), left)])
                if not read:
                    raise OSError(f"{self.path}: shorter than its tensors say")
                out.write(buffer[:read])
                left -= read


class TensorStore:
    """Values of the tensors a message names by token: arrays, or ranges of data files."""

    def __init__(self, entries: dict | None = None):
        self._entries: dict[str, np.ndarray | _FileRange] = dict(entries or {})

    def extended(self) -> "TensorStore":
        """A store holding what this one holds, to which new tensors can be added."""
        return TensorStore(self._entries)

    def tensor(self, name: str, value: np.ndarray | _FileRange, data_type: int) -> TensorProto:
        """``value`` held here, as the message's tensor ``name`` of ONNX type ``data_type``."""
        token = f"{PREFIX}{next(_tokens)}"
        self._entries[token] = value
        t = TensorProto(name=name, dims=value.shape, data_type=data_type)
        t.data_location = TensorProto.EXTERNAL
        t.external_data.add(key="location", value=token)
        return t

    def short_files(self) -> list[Path]:
        """Data files shorter than the tensors this store maps from them say."""
        return sorted({e.path for e in self._entries.values() if isinstance(e, _FileRange)
                       and e.path.stat().st_size < e.offset + e.length})

    def holds(self, tensor: TensorProto) -> bool:
        return _token(tensor) in self._entries

    def value(self, tensor: TensorProto) -> np.ndarray:
        """The value of a tensor this store holds (read-only: a data file's bytes are mapped)."""
        entry = self._entries[_token(tensor)]
        return entry.array() if isinstance(entry, _FileRange) else entry

    def nbytes(self, tensor: TensorProto) -> int:
        entry = self._entries[_token(tensor)]
        return entry.length if isinstance(entry, _FileRange) else entry.nbytes

    def write_bytes(self, tensor: TensorProto, out) -> None:
        entry = self._entries[_token(tensor)]
        if isinstance(entry, _FileRange):
            entry.copy_to(out)
        else:
            out.write(memoryview(np.ascontiguousarray(entry)).cast("B"))


def _token(tensor: TensorProto) -> str | None:
    if tensor.data_location != TensorProto.EXTERNAL:
        return None
    location = next((e.value for e in tensor.external_data if e.key == "location"), "")
    return location if location.startswith(PREFIX) else None


_STORED = (TensorProto.FLOAT, TensorProto.FLOAT16, TensorProto.DOUBLE, TensorProto.BFLOAT16, TensorProto.INT8,
           TensorProto.INT16, TensorProto.INT32, TensorProto.INT64, TensorProto.UINT8, TensorProto.UINT16,
           TensorProto.UINT32, TensorProto.UINT64, TensorProto.BOOL)


def storable_dtype(data_type: int) -> np.dtype | None:
    """The numpy dtype whose bytes are the raw data of ONNX type ``data_type``, or None for a
    type whose tensors stay in the message (strings, packed and 8-bit float types)."""
    return np.dtype(helper.tensor_dtype_to_np_dtype(data_type)) if data_type in _STORED else None


def detach(proto: onnx.ModelProto, base_dir: Path | None,
           store: TensorStore | None = None) -> tuple[onnx.ModelProto, TensorStore]:
    """``proto`` as a message without the bytes of its large main-graph initializers (held by the
    returned store, ``store`` when given, which may already hold some: data files beside the
    model, ``base_dir``, are mapped, not read) and with every other external tensor's data
    loaded into it."""
    store = store if store is not None else TensorStore()
    out = onnx.ModelProto()
    copy_fields(out, proto, skip=("graph",))
    copy_fields(out.graph, proto.graph, skip=("initializer",))
    for init in proto.graph.initializer:
        out.graph.initializer.append(_detached(init, store, base_dir))
    for tensor in external_data_helper._get_all_tensors(out):
        if external_data_helper.uses_external_data(tensor) and not store.holds(tensor):
            external_data_helper.load_external_data_for_tensor(tensor, os.fspath(base_dir or "."))
            tensor.data_location = TensorProto.DEFAULT
            del tensor.external_data[:]
    return out, store


def parse_detached(f, path: Path) -> tuple[onnx.ModelProto, TensorStore]:
    """The model in the open file ``f`` (at ``path``) parsed without the bytes of its large
    main-graph initializers, which stay in the file, mapped (:func:`detach` of the message, made
    without reading them): the protobuf wire format is walked over a read-only mapping of the
    file, and only the rest is parsed."""
    size = os.fstat(f.fileno()).st_size
    if size == 0:
        return onnx.ModelProto(), TensorStore()
    store = TensorStore()
    with mmap.mmap(f.fileno(), 0, access=mmap.ACCESS_READ) as mm:
        out, held, pos = bytearray(), {}, 0
        while pos < size:
            key, start = _read_varint(mm, pos)
            end = _skip(mm, start, key & 7)
            if key == (7 << 3 | 2):  # ModelProto.graph
                length, body = _read_varint(mm, start)
                graph = _strip_graph(mm, body, body + length, held)
                out += _key(7) + _varint(len(graph)) + graph
            else:
                out += mm[pos:end]
            pos = end
        proto = onnx.ModelProto.FromString(bytes(out))
        for k, (offset, length) in held.items():
            init = proto.graph.initializer[k]
            dtype, shape = storable_dtype(init.data_type), tuple(int(d) for d in init.dims)
            elements = int(np.prod(shape, dtype=np.int64))
            if dtype is not None and elements > DETACHED_ELEMENTS and elements * dtype.itemsize == length:
                t = store.tensor(init.name, _FileRange(path, offset, length, dtype, shape), init.data_type)
                init.data_location = t.data_location
                init.external_data.extend(t.external_data)
            else:  # small (shape inference reads it), or its bytes are not simply its values
                init.raw_data = mm[offset:offset + length]
    return proto, store


def _strip_graph(mm, pos: int, end: int, held: dict) -> bytes:
    """The GraphProto bytes ``mm[pos:end]`` without the raw data of initializers that may be held
    apart (over :data:`DETACHED_ELEMENTS` bytes: a tensor of more elements has at least that
    many); ``held`` gets {initializer index: (offset, length)} of each."""
    out, index = bytearray(), 0
    while pos < end:
        key, start = _read_varint(mm, pos)
        stop = _skip(mm, start, key & 7)
        if stop > end:
            raise ValueError("a field runs past the end of its graph")
        if key == (5 << 3 | 2):  # GraphProto.initializer
            length, body = _read_varint(mm, start)
            tensor, raw = bytearray(), None
            p = body
            while p < body + length:
                k, s = _read_varint(mm, p)
                e = _skip(mm, s, k & 7)
                if k == (9 << 3 | 2) and raw is None:  # TensorProto.raw_data
                    n, data = _read_varint(mm, s)
                    if n > DETACHED_ELEMENTS:
                        raw = (data, n)
                        p = e
                        continue
                tensor += mm[p:e]
                p = e
            if raw is not None:
                held[index] = raw
            out += _key(5) + _varint(len(tensor)) + tensor
            index += 1
        else:
            out += mm[pos:stop]
        pos = stop
    return bytes(out)


def _read_varint(mm, pos: int) -> tuple[int, int]:
    value = shift = 0
    while True:
        if pos >= len(mm):
            raise ValueError("the file ends inside a field")
        byte = mm[pos]
        pos += 1
        value |= (byte & 0x7F) << shift
        if not byte & 0x80:
            return value, pos
        shift += 7
        if shift > 63:
            raise ValueError("a malformed varint")


def _skip(mm, pos: int, wire: int) -> int:
    """The end of the field whose value starts at ``pos`` (wire type ``wire``)."""
    if wire == 0:
        end = _read_varint(mm, pos)[1]
    elif wire == 1:
        end = pos + 8
    elif wire == 2:
        n, start = _read_varint(mm, pos)
        end = start + n
    elif wire == 5:
        end = pos + 4
    else:
        raise ValueError(f"wire type {wire}: not a protobuf message this reader walks")
    if end > len(mm):
        raise ValueError("the file ends inside a field")
    return end


def _detached(init: TensorProto, store: TensorStore, base_dir: Path | None) -> TensorProto:
    if store.holds(init):
        return _metadata(init, keep_data=True)
    dtype = storable_dtype(init.data_type)
    shape = tuple(int(d) for d in init.dims)
    if dtype is None or int(np.prod(shape, dtype=np.int64)) <= DETACHED_ELEMENTS or init.segment.end:
        return _metadata(init, keep_data=True)
    if external_data_helper.uses_external_data(init):
        info = external_data_helper.ExternalDataInfo(init)  # its location checked on reading
        path = Path(base_dir or ".") / info.location
        length = info.length if info.length is not None else int(np.prod(shape)) * dtype.itemsize
        if length != int(np.prod(shape)) * dtype.itemsize:
            return _metadata(init, keep_data=True)
        value = _FileRange(path, info.offset or 0, length, dtype, shape)
    else:  # values in the typed fields (raw data this large stayed in the file: parse_detached)
        value = numpy_helper.to_array(init)
    t = store.tensor(init.name, value, init.data_type)
    meta = _metadata(init, keep_data=False)
    meta.data_location = t.data_location
    meta.external_data.extend(t.external_data)
    return meta


_DESCRIPTION = ("name", "dims", "data_type", "doc_string", "metadata_props")  # a tensor's fields but its data


def _metadata(init: TensorProto, keep_data: bool) -> TensorProto:
    """A copy of ``init``; without ``keep_data``, only what describes it (name, type, dims, doc)."""
    t = TensorProto()
    copy_fields(t, init, only=None if keep_data else _DESCRIPTION)
    return t


def copy_fields(dst, src, skip: tuple[str, ...] = (), only: tuple[str, ...] | None = None) -> None:
    """Copy every field set in the message ``src`` to ``dst`` but those in ``skip`` (of those in
    ``only``, when given)."""
    for field, value in src.ListFields():
        if field.name in skip or (only is not None and field.name not in only):
            continue
        target = getattr(dst, field.name)
        if field.is_repeated:
            target.extend(value)
        elif field.message_type is not None:
            target.CopyFrom(value)
        else:
            setattr(dst, field.name, value)


def attach(proto: onnx.ModelProto, store: TensorStore) -> onnx.ModelProto:
    """The complete message: ``proto`` with the bytes of every tensor ``store`` holds in it."""
    out = onnx.ModelProto()
    out.CopyFrom(proto)
    for init in out.graph.initializer:
        if store.holds(init):
            value = store.value(init)
            init.raw_data = np.ascontiguousarray(value).tobytes()
            init.ClearField("data_location")
            del init.external_data[:]
    return out


def checkable(proto: onnx.ModelProto, store: TensorStore) -> onnx.ModelProto:
    """``proto`` as ``onnx.checker`` can check it in memory: each held tensor a typed graph
    input instead (its bytes were checked against its type when it was mapped)."""
    out = onnx.ModelProto()
    out.CopyFrom(proto)
    inputs = {i.name for i in out.graph.input}
    kept = [i for i in out.graph.initializer if not store.holds(i)]
    for init in out.graph.initializer:
        if store.holds(init) and init.name not in inputs:
            out.graph.input.append(helper.make_tensor_value_info(init.name, init.data_type, list(init.dims)))
    del out.graph.initializer[:]
    out.graph.initializer.extend(kept)
    return out


def stored_bytes(proto: onnx.ModelProto, store: TensorStore) -> int:
    return sum(store.nbytes(i) for i in proto.graph.initializer if store.holds(i))


def write_inline(proto: onnx.ModelProto, store: TensorStore, path) -> None:
    """Write the complete model to one file, each held tensor's bytes copied in place from the
    store (protobuf accepts a message's fields in any order: the initializers go last)."""
    graph, head = onnx.GraphProto(), onnx.ModelProto()
    copy_fields(graph, proto.graph, skip=("initializer",))
    copy_fields(head, proto, skip=("graph",))
    entries = []
    for init in proto.graph.initializer:
        if store.holds(init):
            meta = _metadata(init, keep_data=False).SerializeToString()
            n = store.nbytes(init)
            size = len(meta) + 1 + _varint_size(n) + n
            entries.append((init, meta, n, size))
        else:
            body = init.SerializeToString()
            entries.append((None, body, 0, len(body)))
    graph_bytes = graph.SerializeToString()
    graph_size = len(graph_bytes) + sum(1 + _varint_size(size) + size for *_, size in entries)
    with open(path, "wb") as f:
        f.write(head.SerializeToString())
        f.write(_key(7) + _varint(graph_size) + graph_bytes)  # ModelProto.graph
        for init, body, n, size in entries:
            f.write(_key(5) + _varint(size) + body)  # GraphProto.initializer
            if init is not None:
                f.write(_key(9) + _varint(n))  # TensorProto.raw_data
                store.write_bytes(init, f)


def external_layout(proto: onnx.ModelProto, store: TensorStore, location: str) -> onnx.ModelProto:
    """``proto`` with each held tensor pointing at its place in one data file ``location``, in
    order (what :func:`write_data` writes)."""
    out = onnx.ModelProto()
    out.CopyFrom(proto)
    offset = 0
    for init in out.graph.initializer:
        if store.holds(init):
            n = store.nbytes(init)
            del init.external_data[:]
            for key, value in (("location", location), ("offset", str(offset)), ("length", str(n))):
                init.external_data.add(key=key, value=value)
            offset += n
    return out


def write_data(proto: onnx.ModelProto, store: TensorStore, path) -> None:
    """The data file of :func:`external_layout`: every held tensor's bytes, in order."""
    with open(path, "wb") as f:
        for init in proto.graph.initializer:
            if store.holds(init):
                store.write_bytes(init, f)


def _key(field: int) -> bytes:
    return _varint(field << 3 | 2)  # a length-delimited field


def _varint(n: int) -> bytes:
    out = bytearray()
    while True:
        byte, n = n & 0x7F, n >> 7
        out.append(byte | (0x80 if n else 0))
        if not n:
            return bytes(out)


def _varint_size(n: int) -> int:
    return len(_varint(n))
