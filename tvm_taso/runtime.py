"""Running Relax modules: inputs for their parameters, compiling and running them on the CPU."""

from __future__ import annotations

import numpy as np
import tvm
from tvm import relax

from tvm_taso.errors import InputError, OpError
from tvm_taso.ir import dims, ops


def input_symbols(mod, func: str = "main") -> frozenset:
    """The names of the symbolic sizes in the shapes of ``mod[func]``'s parameters."""
    return frozenset().union(*(dims.symbols_of(ops.tensor_type(p.ty).shape) for p in mod[func].params
                               if isinstance(p.ty, relax.TensorType) and p.ty.shape is not None))


CHECK_SPAN = 15  # a dynamic dimension is run at its least size and this much above it


def check_sizes(mod, func: str = "main") -> list[dict]:
    """The sizes a module's dynamic input dimensions are run at to check or time it: ``[{}]``
    for a static one; else two, the least each may take (its ``tir_var_lower_bound``, else 1)
    and :data:`CHECK_SPAN` above it (within its upper bound)."""
    symbols = sorted(input_symbols(mod, func))
    if not symbols:
        return [{}]
    attrs = mod[func].attrs if mod[func].attrs is not None else {}
    lower, upper = (attrs.get(key) or {} for key in ("tir_var_lower_bound", "tir_var_upper_bound"))
    least = {s: max(1, int(lower.get(s, 1))) for s in symbols}
    return [least, {s: min(least[s] + CHECK_SPAN, int(upper.get(s, least[s] + CHECK_SPAN))) for s in symbols}]


def inputs_for(mod, given: dict | None = None, seed: int = 0, sizes: dict | None = None,
               func: str = "main") -> list[np.ndarray]:
    """Arrays for ``mod[func]``'s parameters: ``given`` by name (shapes checked), else random,
    symbolic sizes at ``sizes`` (``{symbol: size}``; InputError for one it does not give)."""
    rng = np.random.default_rng(seed)
    given = dict(given or {})
    arrays = []
    params = mod[func].params
    names = {p.name for p in params}
    if set(given) - names:
        raise InputError(f"no input named {', '.join(sorted(set(given) - names))} (inputs: {', '.join(sorted(names))})")
    for p in params:
        try:
            shape = dims.value(ops.tensor_type(p.ty).shape, sizes or {})
        except (OpError, KeyError) as err:
            raise InputError(f"input {p.name!r} has dynamic dimensions; give sizes for them ({err})") from None
        dtype = str(p.ty.dtype)
        if p.name in given:
            a = np.asarray(given[p.name])
            if a.shape != shape:
                raise InputError(f"input {p.name!r} must have shape {'x'.join(map(str, shape))}, "
                                 f"got {'x'.join(map(str, a.shape))}")
            arrays.append(a.astype(dtype))
        elif dtype.startswith("float"):
            arrays.append(rng.standard_normal(shape).astype(dtype))
        else:
            arrays.append(rng.integers(0, 2, size=shape).astype(dtype))
    return arrays


def run(mod: tvm.IRModule, inputs, target="llvm", relax_pipeline="default", func: str = "main") -> list:
    """Compile ``mod`` for ``target`` and run ``mod[func]`` on the CPU; the outputs as numpy arrays.
    ``inputs`` is one list of arrays, or several (each run on the one build: a module with
    symbolic sizes at several sizes), then a list of output lists."""
    ex = tvm.compile(mod, target=target, relax_pipeline=relax_pipeline)
    vm = relax.VirtualMachine(ex, tvm.cpu())
    several = bool(inputs) and isinstance(inputs[0], (list, tuple))
    results = [flatten(vm[func](*[tvm.runtime.tensor(a) for a in case])) for case in (inputs if several else [inputs])]
    return results if several else results[0]


def flatten(value) -> list[np.ndarray]:
    """A runtime value (tensor or nested tuple of tensors) as a flat list of numpy arrays."""
    if hasattr(value, "numpy"):
        return [value.numpy()]
    out = []
    for v in value:
        out.extend(flatten(v))
    return out
