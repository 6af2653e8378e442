"""The output check (``tvm-taso optimize --check``, the benchmarks' checks): an original model
and its optimized form run on the same random inputs, every output compared by name."""

from __future__ import annotations

import math

import numpy as np

from tvm_taso.errors import InputError, first_line
from tvm_taso.io.onnx_feeds import integer_ranges, random_feeds
from tvm_taso.numerics import TOLERANCE, array_relative_error, tolerance
from tvm_taso.ort import runtime as ort


class CheckFailed(RuntimeError):
    """``--check`` found different outputs."""


# A float output may differ by its dtype's tolerance plus NOISE_FACTOR times the original's own
# rounding noise (what one ulp on the inputs does to it; both models round, each its own way).
NOISE_FACTOR = 4.0


def check_onnx(original, optimized, seed: int = 0) -> dict:
    """Run ``original`` and ``optimized`` (:class:`~tvm_taso.io.onnx_model.OnnxModel`) in
    onnxruntime on the same random inputs, fed by name, and compare every output by name: the
    same NaN/+inf/-inf positions and a relative error (:mod:`tvm_taso.numerics`) within the
    tolerance of its dtype, plus the original's own rounding noise on that output (an output
    near zero, a difference of equal terms, is all noise; :func:`_rounding_noise`). A model with symbolic dimensions runs at the priced sizes and at a
    second size. Integer inputs are drawn below the size of the table they index where the graph
    shows one (token ids below the vocabulary), else from ``DEFAULT_INT_RANGE``.

    Raises :class:`InputError` when onnxruntime is missing or rejects the *original* model,
    :class:`CheckFailed` when it rejects the optimized one.
    """
    if not ort.installed():
        raise InputError("--check runs both models in onnxruntime: pip install onnxruntime")
    try:
        before = ort.REFERENCE.session(original.proto)
    except Exception as err:  # noqa: BLE001 - onnxruntime raises its own types
        raise InputError(f"{original.name}: onnxruntime cannot load the original model ({first_line(err)}); "
                         "--check needs a model onnxruntime runs") from None
    try:
        after = ort.REFERENCE.session(optimized.proto)
    except Exception as err:  # noqa: BLE001
        raise CheckFailed(f"--check: onnxruntime cannot load the optimized model ({first_line(err)}); "
                          "nothing written") from None
    ranges = integer_ranges(original)
    sizes = [original.dims] + ([original.second_dims()] if original.dims else [])
    comparison = _Comparison()
    runs = comparison.runs
    cases = []
    for k, dims in enumerate(sizes):
        feeds = random_feeds(original, dims, ranges, seed + k)
        cases.append((dims, feeds))
        flags = [n for n, a in feeds.items() if a.dtype == np.bool_ and a.ndim == 0]
        if flags:  # a flag the model may branch on (an If's condition): both values
            cases.append((dims, {n: (np.asarray(~a) if n in flags else a) for n, a in feeds.items()}))
    for k, (dims, feeds) in enumerate(cases):
        try:
            expected = dict(zip([o.name for o in before.get_outputs()], before.run(None, feeds)))
        except Exception as err:  # noqa: BLE001
            if k == 0:
                raise InputError(f"{original.name}: onnxruntime cannot run the original model ({first_line(err)}); "
                                 "--check needs a model onnxruntime runs") from None
            runs.append({"dims": dims, "skipped": f"the original does not run at these sizes: {first_line(err)}"})
            continue
        try:
            got = dict(zip([o.name for o in after.get_outputs()], after.run(None, feeds)))
        except Exception as err:  # noqa: BLE001
            raise CheckFailed(f"--check: the optimized model fails in onnxruntime at {dims or 'its shapes'} "
                              f"({first_line(err)}); nothing written") from None
        names = [o.name for o in before.get_outputs()]
        noise = _rounding_noise(lambda f: dict(zip(names, before.run(None, f))), feeds, expected, seed + k)
        comparison.add(expected, got, noise)
        runs.append({"dims": dims, "inputs": {n: list(a.shape) for n, a in feeds.items()}})
    return comparison.result("onnxruntime")


def check_exported(program, optimized, seed: int = 0) -> dict:
    """Run a ``torch.export`` program in eager PyTorch and ``optimized`` (the Relax module made
    from it, then optimized) through TVM on this CPU, on the same random inputs, and compare
    their outputs in order as :func:`check_onnx` does (the result has the same fields). A program
    with dynamic dimensions runs at two sizes of each (:func:`tvm_taso.runtime.check_sizes`), on one
    build.

    Raises :class:`InputError` when the program does not run in eager PyTorch, :class:`CheckFailed`
    when the optimized module does not build or run."""
    import torch

    from tvm_taso import runtime

    cases = [dict(enumerate(runtime.inputs_for(optimized, seed=seed + k, sizes=sizes)))
             for k, sizes in enumerate(runtime.check_sizes(optimized))]
    eager = program.module()

    def run_eager(f: dict) -> dict:
        with torch.no_grad():
            out = eager(*[torch.from_numpy(np.ascontiguousarray(a)) for _, a in sorted(f.items())])
        return {f"output {k}": t.detach().numpy() for k, t in enumerate(torch.utils._pytree.tree_leaves(out))}

    try:
        expected = [run_eager(feeds) for feeds in cases]
    except Exception as err:  # noqa: BLE001 - PyTorch raises many types
        raise InputError(f"eager PyTorch cannot run the program ({first_line(err)}); --check needs one it runs") \
            from None
    try:
        got = runtime.run(optimized, [[a for _, a in sorted(feeds.items())] for feeds in cases])
    except Exception as err:  # noqa: BLE001 - TVM raises many types
        raise CheckFailed(f"--check: the optimized module does not build or run through TVM ({first_line(err)}); "
                          "nothing written") from None
    comparison = _Comparison()
    for k, (feeds, want, outputs) in enumerate(zip(cases, expected, got)):
        comparison.add(want, dict(zip(want, outputs)), _rounding_noise(run_eager, feeds, want, seed + k))
        comparison.runs.append({"dims": runtime.check_sizes(optimized)[k],
                                "inputs": {f"input {i}": list(a.shape) for i, a in feeds.items()}})
    return comparison.result("PyTorch eager against TVM (llvm)")


class _Comparison:
    """Outputs compared over one or more runs: for each, its largest relative error, within the
    tolerance of its dtype plus the original's rounding noise."""

    def __init__(self):
        self.outputs: dict[str, dict] = {}
        self.runs: list[dict] = []

    def add(self, expected: dict, got: dict, noise: dict) -> None:
        for name, value in expected.items():
            err = array_relative_error(value, got[name]) if name in got else math.inf
            tol = tolerance(np.asarray(value).dtype)
            allowed = tol + NOISE_FACTOR * noise.get(name, 0.0)
            entry = self.outputs.setdefault(name, {"max_relative_error": 0.0, "tolerance": tol, "noise": 0.0,
                                                   "dtype": str(np.asarray(value).dtype), "ok": True})
            entry["noise"] = max(entry["noise"], noise.get(name, 0.0))
            if err > entry["max_relative_error"]:
                entry["max_relative_error"] = err
                entry["where"] = _where(value, got.get(name))
            entry["ok"] = entry["ok"] and err <= allowed

    def result(self, runtime: str) -> dict:
        outputs, runs = self.outputs, self.runs
        worst = max(outputs, key=lambda n: (not outputs[n]["ok"],
                                            outputs[n]["max_relative_error"] - outputs[n]["tolerance"]), default=None)
        by_dtype: dict[str, float] = {}
        for entry in outputs.values():
            by_dtype[entry["dtype"]] = max(by_dtype.get(entry["dtype"], 0.0), entry["max_relative_error"])
        return {
            "ok": all(o["ok"] for o in outputs.values()),
            "max_relative_error": max(by_dtype.values(), default=0.0),
            "max_relative_error_by_dtype": by_dtype,
            "tolerance": outputs[worst]["tolerance"] if worst else TOLERANCE,
            "worst_output": worst,
            "outputs": outputs,
            "runs": runs,
            "skipped": [f"{r['dims']}: {r['skipped']}" for r in runs if "skipped" in r],
            "runtime": runtime,
        }


def _rounding_noise(run, feeds: dict, expected: dict, seed: int) -> dict[str, float]:
    """How far each float output of the original moves when its float inputs move by one unit
    in the last place: the rounding noise of the computation itself. An output whose exact value
    is near zero (a difference of equal terms) is all noise, and a rewrite that computes it more
    exactly differs from the original by that much; the check allows it. ``run(feeds)``: the
    original's outputs by name."""
    rng = np.random.default_rng(seed)
    nudged = {name: np.nextafter(a, np.where(rng.random(a.shape) < 0.5, np.inf, -np.inf).astype(a.dtype))
              if a.dtype.kind == "f" else a for name, a in feeds.items()}
    try:
        moved = run(nudged)
    except Exception:  # noqa: BLE001 - no estimate: no allowance
        return {}
    return {name: array_relative_error(value, moved[name]) for name, value in expected.items()
            if np.asarray(value).dtype.kind == "f" and name in moved}


def _where(expected, got) -> str:
    """Where two outputs differ most: the index and both values (or why there is none)."""
    if got is None:
        return "missing from the optimized model"
    a, b = np.asarray(expected, np.float64), np.asarray(got, np.float64)
    if a.shape != b.shape:
        return f"shape {list(b.shape)} instead of {list(a.shape)}"
    diff = np.abs(np.nan_to_num(a - b, nan=np.inf))
    k = np.unravel_index(int(np.argmax(diff)), a.shape) if a.size else ()
    return f"at {list(map(int, k))}: {a[k]!r} in the original, {b[k]!r} optimized" if a.size else "empty"


def failure_line(result: dict) -> str:
    """What a failed check says: the output, its error against its tolerance, and where."""
    name = result["worst_output"]
    entry = result["outputs"][name]
    noise = f" + the original's rounding noise {entry['noise']:.2g}" if entry.get("noise") else ""
    return (f"--check: optimized model differs from the original in output {name!r} (max relative error "
            f"{entry['max_relative_error']:.3g} > {entry['tolerance']:g}{noise}, {entry.get('where', '')}); "
            "nothing written")


def check_line(result: dict) -> str:
    """The summary of a passed check: the largest error per output dtype, and what was skipped."""
    errors = ", ".join(f"{err:.2e} ({dtype})" for dtype, err in sorted(result["max_relative_error_by_dtype"].items()))
    skipped = "; skipped: " + "; ".join(result["skipped"]) if result["skipped"] else ""
    return f"max relative error {errors or 'none (no outputs)'} via {result['runtime']} (ok{skipped})"


def graph_input_names(proto, count: int) -> list[str]:
    """The first ``count`` graph inputs of ``proto`` that are not initializers."""
    inits = {i.name for i in proto.graph.initializer}
    names = [i.name for i in proto.graph.input if i.name not in inits]
    return names[:count]
