"""Running Relax modules: inputs for their parameters, compiling and running them on the CPU."""

from __future__ import annotations

import numpy as np
import tvm
from tvm import relax

from tvm_taso.errors import InputError


def inputs_for(mod, given: dict | None = None, seed: int = 0) -> list[np.ndarray]:
    """Arrays for ``mod["main"]``'s parameters: ``given`` by name (shapes checked), else random."""
    rng = np.random.default_rng(seed)
    given = dict(given or {})
    arrays = []
    params = mod["main"].params
    names = {p.name for p in params}
    if set(given) - names:
        raise InputError(f"no input named {', '.join(sorted(set(given) - names))} (inputs: {', '.join(sorted(names))})")
    for p in params:
        shape = tuple(int(d) for d in p.ty.shape)
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


def run(mod: tvm.IRModule, inputs: list[np.ndarray], target="llvm", relax_pipeline="default") -> list[np.ndarray]:
    """Compile ``mod`` for ``target`` and run ``main`` on the CPU; the outputs as numpy arrays."""
    ex = tvm.compile(mod, target=target, relax_pipeline=relax_pipeline)
    vm = relax.VirtualMachine(ex, tvm.cpu())
    result = vm["main"](*[tvm.runtime.tensor(a) for a in inputs])
    return flatten(result)


def flatten(value) -> list[np.ndarray]:
    """A runtime value (tensor or nested tuple of tensors) as a flat list of numpy arrays."""
    if hasattr(value, "numpy"):
        return [value.numpy()]
    out = []
    for v in value:
        out.extend(flatten(v))
    return out
