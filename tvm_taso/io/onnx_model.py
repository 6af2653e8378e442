"""The ONNX form of a model: ``load_onnx`` keeps the user's ``ModelProto`` as it is, with the
sizes its symbolic dimensions are priced at, and ``export_onnx`` writes it back.

Shapes come from ONNX's own shape inference (strict where the model allows it), run on a
skeleton of the model (large initializers become typed inputs, so a model over protobuf's
2 GB limit is inferred too) at two bindings of the symbolic dimensions: the priced sizes and
twice them. A dimension whose size differs between the two depends on a symbolic one.
"""

from __future__ import annotations

import logging
import math
import os
import tempfile
from contextlib import contextmanager
from dataclasses import dataclass
from functools import cached_property
from pathlib import Path

import numpy as np
import onnx
from onnx import external_data_helper, helper, numpy_helper

from tvm_taso.errors import InputError, first_line
from tvm_taso.files import TEMP_PREFIX, write_all
from tvm_taso.io import onnx_tensors
from tvm_taso.io.onnx_import import bind_dims, input_shapes, input_symbols, read_detached, read_model
from tvm_taso.io.onnx_tensors import TensorStore, attach
from tvm_taso.ir import dims

log = logging.getLogger("tvm_taso.io")

# Above this many bytes a model is saved with its tensors in an external data file, as onnx
# does: protobuf cannot serialize a message of 2 GiB.
LARGE_MODEL_BYTES = 2**31 - 2**26
# Initializers with at most this many elements stay in the skeleton that shape inference
# reads (their values can be shapes, axes, split sizes: data propagation needs them).
SMALL_INITIALIZER = 1024

# Sizes priced for symbolic dimensions no shape was given for: a batch of one, 128 elsewhere
# (a sequence length, an image side).
DEFAULT_BATCH, DEFAULT_OTHER = 1, 128


def default_size(axis: int) -> int:
    """The priced size of an unbound symbolic dimension at ``axis``."""
    return DEFAULT_BATCH if axis == 0 else DEFAULT_OTHER


class OnnxModel:
    """An ONNX model as tvm-taso optimizes it: ``structure``, the model's message (never modified;
    a model read from a file holds its large initializers outside it, in ``store``, see
    :mod:`tvm_taso.io.onnx_tensors`), a ``name`` for messages, and ``dims``, the size each
    symbolic input dimension is priced at. ``proto`` is the complete message."""

    def __init__(self, proto: onnx.ModelProto, name: str, dims: dict[str, int], store: TensorStore | None = None):
        self.structure = proto
        self.store = store
        self.name = name
        self.dims = dict(dims)

    def __repr__(self) -> str:
        return f"OnnxModel({self.name!r}, {len(self.structure.graph.node)} nodes, dims={self.dims})"

    @cached_property
    def proto(self) -> onnx.ModelProto:
        """The complete ``ModelProto`` (made once, on first use, when the weights are held apart)."""
        return self.structure if self.store is None else attach(self.structure, self.store)

    def initializer_value(self, init: onnx.TensorProto) -> np.ndarray:
        """The value of the main graph's initializer ``init`` (read-only when it is held apart)."""
        if self.store is not None and self.store.holds(init):
            return self.store.value(init)
        return numpy_helper.to_array(init)

    @property
    def opset(self) -> int:
        """The version of the default ONNX domain the model imports (0 when it imports none)."""
        return next((o.version for o in self.structure.opset_import if o.domain in ("", "ai.onnx")), 0)

    def shapes(self, dims: dict[str, int] | None = None) -> dict[str, tuple[int, ...]]:
        """Static shapes of the inputs a caller feeds, at ``dims`` (default the priced sizes)."""
        return input_shapes(self.structure, self.dims if dims is None else dims)

    def second_dims(self) -> dict[str, int]:
        """Another size for every symbolic dimension (half, or 2 for a size of 1): where
        ``--check`` runs a dynamic model a second time."""
        return {k: (v // 2 if v >= 2 else 2) for k, v in self.dims.items()}

    def doubled_dims(self) -> dict[str, int]:
        """Every symbolic dimension at twice its priced size (how the bridge tells which
        dimensions depend on symbolic ones)."""
        return {k: 2 * v for k, v in self.dims.items()}

    @cached_property
    def _priced(self) -> "Inferred":
        return infer(self.structure, self.shapes())

    @cached_property
    def _doubled(self) -> "Inferred":
        return infer(self.structure, self.shapes(self.doubled_dims())) if self.dims else self._priced

    @property
    def types(self) -> dict[str, tuple[int, tuple | None]]:
        """``{tensor name: (ONNX element type, shape)}`` at the priced sizes (see :func:`infer`)."""
        return self._priced.types

    @property
    def doubled_types(self) -> dict[str, tuple[int, tuple | None]]:
        """:attr:`types` with every symbolic dimension at twice its priced size."""
        return self._doubled.types

    @cached_property
    def symbolic_types(self) -> dict[str, tuple[int, tuple | None]]:
        """``{tensor name: (ONNX element type, shape)}`` inferred with the inputs' symbolic
        dimensions kept: a dimension is an int, a symbolic size over the inputs' symbols (the
        names they are priced under, :mod:`tvm_taso.ir.dims`), the name of a size inference
        made up (``unk__N``), or None. onnxruntime's symbolic shape inference (which follows
        shape code: ``Shape -> Gather -> Concat -> Reshape``, ``Expand``, ``Slice``) where
        onnxruntime is installed and it succeeds without merging sizes it cannot prove equal,
        else ONNX's own (with data propagation). Empty for a model without symbolic dimensions."""
        if not self.dims:
            return {}
        symbols = input_symbols(self.structure)
        found = _onnxruntime_symbolic_types(self.structure, symbols)
        if found is not None:
            return found
        try:
            inferred = onnx.shape_inference.infer_shapes(_skeleton(self.structure, symbols), data_prop=True)
        except Exception as err:  # noqa: BLE001 - inference raises several types
            log.info("%s: symbolic shape inference failed (%s)", self.name, first_line(err))
            return {}
        return _collect(inferred, symbolic=True)

    @cached_property
    def known_values(self) -> dict[str, np.ndarray]:
        """Tensors the model computes at run time whose values are nevertheless fixed: shape
        code (``Shape -> Gather -> Concat -> Reshape``) evaluated at the priced sizes, and the
        same at twice them (a value that changes with a symbolic dimension is not known)."""
        priced, doubled = self._priced.values, self._doubled.values
        return {name: value for name, value in priced.items()
                if name in doubled and doubled[name].shape == value.shape and np.array_equal(doubled[name], value)}

    def with_proto(self, proto: onnx.ModelProto, store: TensorStore | None = None) -> "OnnxModel":
        """The same model (name, priced sizes) with another message (its weights held apart in
        ``store``): an optimized version of it."""
        return OnnxModel(proto, self.name, self.dims, store)

    def save(self, path, data_location: str | None = None) -> None:
        """Write the model to ``path``, all or nothing (:meth:`writers`)."""
        write_all(self.writers(path, data_location))

    def writers(self, path, data_location: str | None = None) -> dict:
        """``{file: write(tmp)}`` for :func:`tvm_taso.files.write_all`: the model at ``path``
        and, for a model over :data:`LARGE_MODEL_BYTES`, its tensors in the external data file
        ``data_location`` (default ``<file name>.data``) beside it. The data file is written
        whole (never appended to, as ``onnx.save_model`` does to an existing one) and replaced
        together with the model. Weights held apart are streamed to the files, never assembled
        in memory."""
        location = data_location or Path(path).name + ".data"
        if self.store is not None:
            held = onnx_tensors.stored_bytes(self.structure, self.store)
            if self.structure.ByteSize() + held <= LARGE_MODEL_BYTES:
                return {path: lambda tmp: onnx_tensors.write_inline(self.structure, self.store, tmp)}
            layout = onnx_tensors.external_layout(self.structure, self.store, location)
            return {Path(path).parent / location: lambda tmp: onnx_tensors.write_data(self.structure, self.store, tmp),
                    path: lambda tmp: onnx.save_model(layout, os.fspath(tmp))}
        if not is_large(self.proto):
            return {path: lambda tmp: onnx.save_model(self.proto, os.fspath(tmp))}
        copy = onnx.ModelProto()
        copy.CopyFrom(self.proto)  # saving with external data moves the tensors out of the proto

        def write_data(tmp):
            external_data_helper.convert_model_to_external_data(copy, all_tensors_to_one_file=True,
                                                                location=location, size_threshold=1024)
            with tempfile.TemporaryDirectory(prefix=TEMP_PREFIX, dir=Path(tmp).parent) as scratch:
                external_data_helper.write_external_data_tensors(copy, scratch)
                os.replace(Path(scratch) / location, tmp)

        return {Path(path).parent / location: write_data, path: lambda tmp: onnx.save_model(copy, os.fspath(tmp))}


def is_large(proto: onnx.ModelProto) -> bool:
    """True when ``proto`` is too large to serialize as one protobuf message."""
    try:
        return proto.ByteSize() > LARGE_MODEL_BYTES
    except Exception:  # noqa: BLE001 - protobuf raises when the size itself overflows
        return True


def load_onnx(model, shapes: dict | None = None, name: str | None = None, simplify: bool = False,
              data_files: list | None = None) -> OnnxModel:
    """An ONNX model (a path or an ``onnx.ModelProto``) as an :class:`OnnxModel` for
    :func:`tvm_taso.optimize`.

    ``shapes`` (``{input name: shape}``) gives the sizes symbolic dimensions are priced at; any
    left out are priced at 1 on the first axis and 128 elsewhere, said in one log line. The
    model stays dynamic: the optimized one accepts every size the original does. Shape code the
    model runs (``Shape -> Gather -> Concat -> Reshape``, as PyTorch exports it) is evaluated
    to know its shapes and written back as it is; with ``simplify`` the model is replaced by
    onnx-simplifier's simplification of it first (shape code folded into constants, the same
    inputs and outputs), which is what the optimized model is then built on. Raises
    :class:`InputError` for a missing, corrupt or invalid model or bad ``shapes``.

    A model read from a file keeps its large weights outside the message it optimizes: they
    stay in the file they are in (the model's or its external data), memory-mapped, and are
    copied straight to the output; the paths of the external data files read are appended to
    ``data_files`` when given.
    """
    store = None
    if isinstance(model, onnx.ModelProto) or simplify:
        proto, name = read_model(model, name, data_files)
        proto = simplified(proto, name) if simplify else proto
    else:
        proto, store, read_name = read_detached(model, data_files)
        name = name or read_name
    try:
        if store is not None:  # not the file: the checker would read every weight
            onnx.checker.check_model(onnx_tensors.checkable(proto, store))
        elif is_large(proto) and not isinstance(model, onnx.ModelProto):
            onnx.checker.check_model(os.fspath(model))
        elif not is_large(proto):
            onnx.checker.check_model(proto)
    except (onnx.checker.ValidationError, ValueError) as err:
        first = first_line(err)
        raise InputError(f"{name}: invalid ONNX model: {first}") from None
    defaulted: dict[str, int] = {}

    def default(symbol: str, axis: int) -> int:
        defaulted[symbol] = default_size(axis)
        return defaulted[symbol]

    dims = bind_dims(proto, name, shapes, default=default)
    if defaulted:
        log.warning("%s: symbolic dimensions priced at %s (the output stays dynamic; give shapes= or "
                    "--shape NAME=D1xD2x... to price other sizes)", name,
                    ", ".join(f"{k}={v}" for k, v in sorted(defaulted.items())))
    return OnnxModel(proto, name, dims, store)


def export_onnx(model, path=None, **relax_options):
    """Write ``model`` as ONNX and return the ``ModelProto``.

    An :class:`OnnxModel` (what :func:`tvm_taso.optimize` returns for one) is written as it is,
    with external data when it is over 2 GB. A Relax ``IRModule`` goes through the Relax -> ONNX
    exporter (:func:`tvm_taso.io.onnx_export.relax_to_onnx`, which takes ``relax_options``).
    """
    if isinstance(model, OnnxModel):
        if path is not None:
            model.save(path)
        return model.proto
    from tvm_taso.io import onnx_export

    return onnx_export.relax_to_onnx(model, path, **relax_options)


def simplified(proto: onnx.ModelProto, name: str) -> onnx.ModelProto:
    """``proto`` as onnx-simplifier simplifies it (constant folding, dead code, its fusions),
    with the original's inputs and outputs (symbolic dimensions stay symbolic); the original
    with a warning when onnxsim is missing or fails."""
    try:
        import onnxsim
    except ImportError:
        raise InputError("--simplify needs onnx-simplifier: pip install onnxsim") from None
    try:
        with _native_output_logged():
            simple, _ = onnxsim.simplify(proto, check_n=0)
    except Exception as err:  # noqa: BLE001 - onnxsim raises what onnxruntime and onnx raise
        log.warning("%s: onnxsim could not simplify the model (%s); optimizing it as it is", name,
                    first_line(err))
        return proto
    for field in ("input", "output"):
        getattr(simple.graph, field).clear()
        getattr(simple.graph, field).extend(getattr(proto.graph, field))
    return simple


# -- shape inference ----------------------------------------------------------------------------


@dataclass
class Inferred:
    """What is known of a model's tensors at one binding of its symbolic dimensions."""

    types: dict[str, tuple[int, tuple | None]]  # name -> (ONNX element type, shape or None)
    values: dict[str, np.ndarray]  # name -> value, for tensors computed from shapes alone


def infer(proto: onnx.ModelProto, shapes: dict[str, tuple[int, ...]]) -> Inferred:
    """Types of every value of the main graph at input ``shapes`` (:func:`value_types`); where
    the model computes shapes at run time (it reads ``Shape`` or ``Size``, or a type is left
    unknown), that shape code is evaluated too (:func:`fold_shape_code`): its values, and the
    types it resolves."""
    skeleton = _skeleton(proto, shapes)
    types = value_types(proto, shapes, skeleton)
    unknown = any(t[1] is None or None in t[1] for t in types.values())
    if not unknown and not any(n.op_type in ("Shape", "Size") and n.domain in ("", "ai.onnx")
                               for n in skeleton.graph.node):
        return Inferred(types, {})
    folded = fold_shape_code(skeleton, types)
    if folded is None:
        return Inferred(types, {})
    more_types, values = folded
    for name, entry in more_types.items():
        if name in types and (types[name][1] is None or None in types[name][1]) and entry[1] is not None:
            types[name] = entry
    return Inferred(types, values)


def fold_shape_code(skeleton: onnx.ModelProto, types: dict) -> tuple[dict, dict[str, np.ndarray]] | None:
    """onnx-simplifier's constant folding and shape inference on ``skeleton`` (static inputs;
    no fusions), with every value whose rank ``types`` knows made a graph output, so that
    onnxsim keeps its name and its value (it rewrites what only nodes read: a folded Reshape
    target becomes an equivalent one with -1): the values it folded and the types it found,
    by name. None (logged) without onnxsim or when it fails."""
    try:
        import onnxsim
    except ImportError:
        log.warning("the model computes shapes at run time and onnxsim is not installed: those shapes stay "
                    "unknown (pip install onnxsim)")
        return None
    probe = onnx.ModelProto()
    probe.CopyFrom(skeleton)
    outputs = {o.name for o in probe.graph.output}
    for node in probe.graph.node:
        for name in node.output:
            if name and name not in outputs and name in types and types[name][1] is not None:
                probe.graph.output.append(helper.make_tensor_value_info(name, types[name][0], list(types[name][1])))
                outputs.add(name)
    try:
        with _native_output_logged():
            simple, _ = onnxsim.simplify(probe, perform_optimization=False, skip_fuse_bn=True, check_n=0)
    except Exception as err:  # noqa: BLE001 - onnxsim raises what onnxruntime and onnx raise
        log.info("onnxsim could not fold the model's shape code (%s)", (str(err).splitlines() or [""])[0])
        return None
    values = {i.name: numpy_helper.to_array(i) for i in simple.graph.initializer if i.name in outputs}
    for node in simple.graph.node:
        if node.op_type == "Constant" and node.domain in ("", "ai.onnx") and node.output[0] in outputs:
            value = constant_value(node)
            if value is not None:
                values[node.output[0]] = value
    initializers = {i.name for i in skeleton.graph.initializer}
    return _collect(simple), {k: v for k, v in values.items() if k not in initializers}


@contextmanager
def _scratch_directory():
    """The working directory is a fresh temporary one meanwhile: onnxruntime's symbolic shape
    inference saves the model it could not finish (``sym_shape_infer_temp.onnx`` and a data file
    per tensor) in the working directory, which is the user's."""
    previous = os.getcwd()
    with tempfile.TemporaryDirectory(prefix=TEMP_PREFIX) as scratch:
        os.chdir(scratch)
        try:
            yield
        finally:
            os.chdir(previous)


@contextmanager
def _native_output_logged():
    """onnxsim's C++ core prints warnings on the process's stdout and stderr (file descriptors
    1 and 2, out of reach of Python's redirection): send them to the log at DEBUG instead."""
    saved = [os.dup(1), os.dup(2)]
    with tempfile.TemporaryFile() as sink:
        for fd in (1, 2):
            os.dup2(sink.fileno(), fd)
        try:
            yield
        finally:
            for fd, copy in zip((1, 2), saved):
                os.dup2(copy, fd)
                os.close(copy)
            sink.seek(0)
            text = sink.read().decode(errors="replace").strip()
            if text:
                log.debug("onnxsim: %s", text)


def value_types(proto: onnx.ModelProto, shapes: dict[str, tuple[int, ...]],
                skeleton: onnx.ModelProto | None = None) -> dict[str, tuple[int, tuple | None]]:
    """``{tensor name: (element type, shape or None)}`` for every value of the main graph, by
    ONNX shape inference with the real inputs at ``shapes``; a dimension inference leaves
    unknown is None. Strict mode first; a model strict inference rejects (ops of other domains
    without a schema, say) is inferred leniently. Dimensions ONNX leaves unknown are taken from
    onnxruntime's symbolic shape inference when onnxruntime is installed."""
    skeleton = skeleton if skeleton is not None else _skeleton(proto, shapes)
    try:
        inferred = onnx.shape_inference.infer_shapes(skeleton, check_type=True, strict_mode=True, data_prop=True)
    except Exception as err:  # noqa: BLE001 - inference raises several types
        log.info("strict shape inference failed (%s); inferring leniently", str(err).splitlines()[0] if str(err) else err)
        try:
            inferred = onnx.shape_inference.infer_shapes(skeleton, data_prop=True)
        except Exception as err2:  # noqa: BLE001
            first = first_line(err2)
            raise InputError(f"ONNX shape inference failed on the model: {first}") from None
    types = _collect(inferred)
    if any(t[1] is None or None in t[1] for t in types.values()):
        # ONNX's data propagation stops at shapes computed at run time (Slice, Expand, Range on
        # Shape outputs, as PyTorch writes for dynamic axes); onnxruntime's symbolic shape
        # inference evaluates those shape computations at the bound sizes
        for name, entry in _onnxruntime_types(skeleton).items():
            if name not in types or types[name][1] is None or None in types[name][1]:
                types[name] = entry
    for init in proto.graph.initializer:
        types[init.name] = (init.data_type, tuple(init.dims))
    return types


def _collect(model: onnx.ModelProto, symbolic: bool = False) -> dict[str, tuple[int, tuple | None]]:
    """Every typed value of ``model``'s main graph: (element type, shape); a dimension without
    a value is None, or with ``symbolic`` its ``dim_param`` when it has one."""
    types: dict[str, tuple[int, tuple | None]] = {}
    g = model.graph
    for vi in list(g.input) + list(g.value_info) + list(g.output):
        if vi.type.HasField("tensor_type"):
            tt = vi.type.tensor_type
            shape = tuple(d.dim_value if d.HasField("dim_value") else (d.dim_param or None) if symbolic else None
                          for d in tt.shape.dim) if tt.HasField("shape") else None
            if vi.name not in types or (types[vi.name][1] is None and shape is not None):
                types[vi.name] = (tt.elem_type, shape)
    return types


def _onnxruntime_types(skeleton: onnx.ModelProto) -> dict[str, tuple[int, tuple | None]]:
    """Types by onnxruntime's symbolic shape inference, when onnxruntime is installed."""
    try:
        from onnxruntime.tools.symbolic_shape_infer import SymbolicShapeInference
    except ImportError:
        return {}
    try:
        with _scratch_directory():
            return _collect(SymbolicShapeInference.infer_shapes(skeleton, auto_merge=True))
    except Exception as err:  # noqa: BLE001 - it raises on ops it does not know
        log.info("onnxruntime's symbolic shape inference failed (%s)", (str(err).splitlines() or [""])[0])
        return {}


def _onnxruntime_symbolic_types(proto: onnx.ModelProto, symbols: dict[str, tuple]) -> dict | None:
    """:attr:`OnnxModel.symbolic_types` by onnxruntime's symbolic shape inference (its sizes
    are SymPy expressions, read into sizes by :func:`_size_of`), or None without onnxruntime or
    when it fails. It runs without ``auto_merge``: sizes it cannot prove equal stay apart (the
    inference fails rather than assume them equal)."""
    try:
        from onnxruntime.tools.symbolic_shape_infer import SymbolicShapeInference
    except ImportError:
        return None
    names = sorted({d for shape in symbols.values() for d in shape if isinstance(d, str)})
    safe = {name: f"tvm_taso_size_{k}" for k, name in enumerate(names)}  # identifiers SymPy parses
    skeleton = _skeleton(proto, {inp: tuple(safe.get(d, d) for d in shape) for inp, shape in symbols.items()})
    try:
        with _native_output_logged(), _scratch_directory():
            inferred = SymbolicShapeInference.infer_shapes(skeleton, auto_merge=False)
    except Exception as err:  # noqa: BLE001 - it raises on ops it does not know, and on conflicts
        log.info("onnxruntime's symbolic shape inference failed (%s)", first_line(err))
        return None
    original = {v: k for k, v in safe.items()}
    return {name: (elem, tuple(_size_of(d, original) for d in shape) if shape is not None else None)
            for name, (elem, shape) in _collect(inferred, symbolic=True).items()}


def _size_of(dim, names: dict[str, str]):
    """A dimension onnxruntime's inference wrote (an int, or the text of a SymPy expression
    over the identifiers ``names`` maps to the model's symbols) as a size: an int, a symbolic
    size, the name of a size it made up, or None for an expression sizes do not model."""
    if dim is None or isinstance(dim, int):
        return dim
    import sympy

    try:
        expr = sympy.sympify(dim, locals={k: sympy.Symbol(k) for k in names})
    except (sympy.SympifyError, TypeError, SyntaxError):
        return None
    if expr.is_Symbol and expr.name not in names:
        return expr.name
    return _from_sympy(expr, names)


def _from_sympy(expr, names: dict[str, str]):
    """``expr`` (integer arithmetic over the symbols in ``names``) as a size, or None."""
    import sympy

    if expr.is_Integer:
        return int(expr)
    if expr.is_Symbol:
        return dims.symbol(names[expr.name]) if expr.name in names else None
    if isinstance(expr, sympy.floor) and isinstance(expr.args[0], sympy.Mul):
        numerator, denominator = sympy.fraction(sympy.together(expr.args[0]))
        a, b = _from_sympy(numerator, names), _from_sympy(denominator, names)
        return None if a is None or not isinstance(b, int) or b <= 0 else a // b
    if isinstance(expr, sympy.Mod):
        a, b = (_from_sympy(x, names) for x in expr.args)
        return None if a is None or not isinstance(b, int) or b <= 0 else a % b
    if isinstance(expr, sympy.Pow) and expr.exp.is_Integer and int(expr.exp) > 0:
        base = _from_sympy(expr.base, names)
        return None if base is None else math.prod([base] * int(expr.exp), start=1)
    if isinstance(expr, (sympy.Add, sympy.Mul)):
        parts = [_from_sympy(x, names) for x in expr.args]
        if any(p is None for p in parts):
            return None
        return sum(parts[1:], parts[0]) if isinstance(expr, sympy.Add) else math.prod(parts, start=1)
    return None


def _skeleton(proto: onnx.ModelProto, shapes: dict[str, tuple[int, ...]]) -> onnx.ModelProto:
    """``proto`` for shape inference: real inputs at ``shapes``, large initializers as typed
    inputs (without their data), value_info left out (inference recomputes it)."""
    m = onnx.ModelProto()
    m.ir_version = proto.ir_version
    m.opset_import.extend(proto.opset_import)
    m.functions.extend(proto.functions)
    g, src = m.graph, proto.graph
    g.name = src.name
    g.node.extend(src.node)
    inits = {i.name for i in src.initializer}
    for inp in src.input:
        if inp.name in shapes and inp.type.HasField("tensor_type"):
            elem = inp.type.tensor_type.elem_type
            g.input.append(helper.make_tensor_value_info(inp.name, elem, list(shapes[inp.name])))
        elif inp.name in shapes:  # an optional tensor: its shape set, still optional
            elem = inp.type.optional_type.elem_type.tensor_type.elem_type
            g.input.append(helper.make_value_info(inp.name, helper.make_optional_type_proto(
                helper.make_tensor_type_proto(elem, list(shapes[inp.name])))))
        elif inp.name not in inits:
            g.input.append(inp)
    for init in src.initializer:
        if int(np.prod(init.dims, dtype=np.int64)) <= SMALL_INITIALIZER:
            g.initializer.append(init)
        else:
            g.input.append(helper.make_tensor_value_info(init.name, init.data_type, list(init.dims)))
    g.sparse_initializer.extend(src.sparse_initializer)
    g.output.extend(src.output)
    return m


def constant_value(node) -> np.ndarray | None:
    """The value of a ``Constant`` node, or None for a sparse or string one."""
    for attr in node.attribute:
        if attr.name == "value":
            return numpy_helper.to_array(attr.t) if attr.t.data_type != onnx.TensorProto.STRING else None
        if attr.name in ("value_float", "value_floats"):
            return np.asarray(helper.get_attribute_value(attr), np.float32)
        if attr.name in ("value_int", "value_ints"):
            return np.asarray(helper.get_attribute_value(attr), np.int64)
    return None
