"""Targets: the one place that parses, canonicalises and classifies TVM targets and finds the
device of this machine that runs code built for one.

A target reaches tvm-taso as a name (``"llvm"``, ``"cuda"``), a tag (``"nvidia/nvidia-h100"``),
a JSON string or dict (``{"kind": "llvm", "num-cores": 2}``), a :class:`tvm.target.Target`, or
``None`` (the enclosing ``with target:``, else this machine's CPU). Keys starting with ``taso:``
are tvm-taso's own annotations (e.g. the MetaSchedule database a measurement used) and are
dropped before TVM sees the target.

A CPU target that names no CPU (``mcpu``) and is not a cross-compile (no ``mtriple``) is for this
machine's CPU: TVM's bare ``llvm`` builds for a generic x86-64 (no AVX2, no AVX-512), and the
kernels priced, measured and shipped should be the ones this CPU runs best. A
:class:`tvm.target.Target` object is taken as given.

``"ort[:provider][,key=value...]"`` (or a :class:`tvm_taso.ort.runtime.OrtRuntime`) names onnxruntime
instead, for ONNX models: the :class:`Target` then carries the runtime, and its TVM target is
the one whose analytic model stands in for the provider's kernels (``llvm`` for the CPU).
"""

from __future__ import annotations

import functools
import json
import logging
import os

from tvm_taso.errors import TargetError

log = logging.getLogger("tvm_taso.target")

GPU_KINDS = ("cuda", "rocm", "vulkan", "metal", "opencl", "webgpu")
CPU_KINDS = ("llvm", "c")
KINDS = CPU_KINDS + GPU_KINDS


def _accepted() -> str:
    return (f"a target kind ({', '.join(KINDS)}), a tag such as 'nvidia/nvidia-h100', "
            "a JSON object such as '{\"kind\": \"llvm\", \"num-cores\": 2}', a tvm.target.Target, "
            "or ort[:provider] for ONNX models timed in onnxruntime")


class Target:
    """A target parsed once (:func:`resolve`): TVM's object, how the user spelled it, and the
    facts tvm-taso asks of it, each worked out once. Every function of this module takes one.
    ``runtime`` is the :class:`~tvm_taso.ort.runtime.OrtRuntime` an ``ort`` target names (None for TVM)."""

    def __init__(self, tvm_target, given=None, runtime=None):
        self.tvm = tvm_target
        self.given = given  # as the user gave it (None: the enclosing target or the CPU)
        self.runtime = runtime
        self.spelling = str(given) if given is not None else str(tvm_target)

    def __str__(self) -> str:
        return self.spelling

    def __repr__(self) -> str:
        return f"Target({self.spelling!r})"

    @functools.cached_property
    def kind(self) -> str:
        return self.tvm.kind.name

    @functools.cached_property
    def canonical(self) -> str:
        # a JSON spelling keeps its annotations (taso:...); any other is TVM's object, parsed once
        spelled_json = isinstance(self.given, str) and self.given.lstrip().startswith("{")
        return canonical(self.given if spelled_json else self.tvm)


def resolve(target=None) -> Target:
    """``target`` (any form :func:`parse` takes) parsed once; ``None`` is the enclosing ``with
    target:``, else this machine's CPU. Raises :class:`TargetError` as :func:`parse` does."""
    if isinstance(target, Target):
        return target
    runtime = _runtime(target)
    if runtime is not None:
        return Target(parse(runtime.proxy), target if isinstance(target, str) else str(runtime), runtime)
    return Target(parse(target), target)


def _runtime(target):
    """The :class:`~tvm_taso.ort.runtime.OrtRuntime` ``target`` names, or None for a TVM target."""
    from tvm_taso.ort import runtime as ort

    if isinstance(target, ort.OrtRuntime):
        return target
    return ort.OrtRuntime.parse(target) if ort.is_spelling(target) else None


def parse(target=None):
    """``target`` as a :class:`tvm.target.Target`; ``None`` is the current target, else ``llvm``.

    Raises :class:`TargetError` (one line, listing what is accepted) for anything TVM does not
    know or that is not a target at all.
    """
    import tvm

    if isinstance(target, Target):
        return target.tvm
    if target is None:
        return tvm.target.Target.current(allow_none=True) or _for_this_cpu(tvm.target.Target("llvm"))
    runtime = _runtime(target)
    if runtime is not None:
        return parse(runtime.proxy)
    if isinstance(target, tvm.target.Target):
        return target
    data = target
    if isinstance(data, str) and data.lstrip().startswith("{"):
        try:
            data = json.loads(data)
        except ValueError:
            raise TargetError(f"target {target!r} is not valid JSON; expected {_accepted()}") from None
    if isinstance(data, dict):
        data = {k: v for k, v in data.items() if not str(k).startswith("taso:")}
    elif not isinstance(data, str) or not data.strip():
        raise TargetError(f"target {target!r} is not a target; expected {_accepted()}")
    try:
        parsed = tvm.target.Target(_with_cuda_arch(data))
    except Exception:  # noqa: BLE001 - TVM raises several types for unknown kinds and tags
        raise TargetError(f"unknown target {target!r}; expected {_accepted()}") from None
    return _for_this_cpu(parsed)


@functools.cache
def host_cpu() -> tuple[str, str]:
    """This machine's CPU as LLVM names it (``"znver3"``, ``"skylake-avx512"``; ``""`` if LLVM
    does not know it) and its target triple."""
    from tvm.target import codegen

    try:
        name, triple = str(codegen.llvm_get_system_cpu()), str(codegen.llvm_get_system_triple())
    except Exception:  # noqa: BLE001 - a TVM built without LLVM
        return "", ""
    return ("" if name == "generic" else name), triple


def _for_this_cpu(parsed):
    """An llvm target naming no CPU and no other triple, for this machine's CPU (the module
    docstring says why); said once in the log."""
    import tvm

    cpu, triple = host_cpu()
    attrs = parsed.attrs
    if parsed.kind.name != "llvm" or attrs.get("mcpu") or not cpu or attrs.get("mtriple", triple) != triple:
        return parsed
    if not getattr(_for_this_cpu, "said", False):
        _for_this_cpu.said = True
        log.info("llvm targets that name no CPU are built for this machine's (mcpu=%s); give an mcpu or "
                 "an mtriple to build for another", cpu)
    return tvm.target.Target(dict(parsed.export(), mcpu=cpu))


@functools.cache
def _cuda_gpu_present() -> bool:
    import tvm

    try:
        return bool(tvm.cuda(0).exist)
    except Exception:  # noqa: BLE001 - no driver at all
        return False


def _with_cuda_arch(data):
    """A cuda target that names no ``arch``, on a machine without a CUDA GPU, with TVM's default
    ``sm_50`` set explicitly: the same target, but TVM does not print "Unable to detect CUDA
    version" on stderr each time one is made. Said once in the log instead."""
    name = data.get("kind") if isinstance(data, dict) else data.strip()
    if name != "cuda" or (isinstance(data, dict) and "arch" in data) or _cuda_gpu_present():
        return data
    if not getattr(_with_cuda_arch, "said", False):
        _with_cuda_arch.said = True
        log.info("no CUDA GPU on this machine: cuda targets without an arch are taken as sm_50 "
                 "(give one, e.g. {\"kind\": \"cuda\", \"arch\": \"sm_90\"})")
    return dict(data, arch="sm_50") if isinstance(data, dict) else {"kind": "cuda", "arch": "sm_50"}


def kind(target=None) -> str:
    """``"llvm"``, ``"cuda"``, ... of any target form (a canonical string included)."""
    if isinstance(target, Target):
        return target.kind
    return str(_attributes(target).get("kind", ""))


def is_gpu(target=None) -> bool:
    """Whether ``target`` runs on a GPU."""
    return kind(target) in GPU_KINDS


def conv_layouts(target=None) -> dict | None:
    """The layouts a build gives convolutions for ``target`` (Relax ``ConvertLayout``'s desired
    layouts), or None to keep the model's. On a CPU, channels last: NHWC data and HWIO weights,
    so the output channels a kernel vectorizes over are contiguous in the weights and the
    output (measured: ``benchmarks/README.md``, "Tuned kernels on this CPU"). GPUs keep the
    model's: their dlight rules are written for it."""
    if is_gpu(target):
        return None
    return {"relax.nn.conv2d": ["NHWC", "HWIO"]}


def wants_blas(target=None) -> bool:
    """Whether a build for ``target`` is to hand its matmuls and convolutions to a BLAS in the
    process that runs it (:func:`tvm_taso.blas.used_for` adds whether there is one): a CPU
    target's ``libs`` says (``["blas"]``: yes; any list without it, e.g. ``["tvm"]``: no); one
    that does not say, yes when it is for this machine (no ``mtriple`` or ``mcpu`` of another)."""
    attrs = _attributes(target)
    if attrs.get("kind") != "llvm":
        return False
    libs = attrs.get("libs")
    if libs:
        return "blas" in [str(lib) for lib in libs]
    cpu, triple = host_cpu()
    return attrs.get("mtriple", triple) == triple and attrs.get("mcpu", cpu) == cpu


def _attributes(target) -> dict:
    """The target's attributes and kind as a dict: a JSON string (a canonical target) or a dict
    read as it is, without parsing it again; any other form parsed."""
    if isinstance(target, str) and target.lstrip().startswith("{"):
        try:
            return dict(json.loads(target))
        except (ValueError, TypeError, AttributeError):
            pass
    if isinstance(target, dict) and "kind" in target:
        return dict(target)
    t = parse(target)
    return dict(t.attrs, kind=t.kind.name)


def without_blas(target=None):
    """``target`` parsed, built without the BLAS (``"libs": ["tvm"]`` on a CPU target that uses
    it): for a module run in another process than this one's, e.g. on an RPC device."""
    import tvm

    t = parse(target)
    if not wants_blas(t):
        return t
    return tvm.target.Target(dict(t.export(), libs=["tvm"]))


def num_cores(target=None) -> int:
    """The target's ``num-cores`` attribute, 0 when it does not say."""
    return int(parse(target).attrs.get("num-cores", 0) or 0)


def available_cores() -> int:
    """The cores this process may run on."""
    try:
        return len(os.sched_getaffinity(0))
    except AttributeError:  # not Linux
        return os.cpu_count() or 1


def with_cores(target=None):
    """``target`` parsed, and for a CPU target that does not say how many cores it has, with
    ``num-cores`` set to the cores this process may use: MetaSchedule needs it to tune, and a
    database is applied for the target it was tuned for, so tuning, building with the
    database and pricing from it all use this one."""
    import tvm

    t = parse(target)
    if is_gpu(t) or num_cores(t):
        return t
    return tvm.target.Target(dict(t.export(), **{"num-cores": available_cores()}))


def canonical(target=None) -> str:
    """The target as a canonical string: ``tvm.target.Target``'s JSON with sorted keys.

    A string that already is such a JSON object is returned normalized without importing TVM
    (``taso:`` annotations kept: they tell measurements apart).
    """
    if isinstance(target, Target):
        return target.canonical
    if isinstance(target, str) and target.lstrip().startswith("{"):
        try:
            return json.dumps(json.loads(target), sort_keys=True, separators=(",", ":"))
        except ValueError:
            pass
    text = str(parse(target))
    try:
        return json.dumps(json.loads(text), sort_keys=True, separators=(",", ":"))
    except ValueError:
        return text


def device(target=None):
    """The device of this machine that runs code built for ``target``, or None."""
    import tvm

    name = kind(target)
    dev = tvm.cpu(0) if name in CPU_KINDS else tvm.device(name, 0)
    try:
        return dev if dev.exist else None
    except Exception:  # noqa: BLE001 - no driver for the kind at all
        return None


def device_type(target=None) -> str:
    """The device type an RPC session opens for ``target`` (``"cpu"`` for CPU kinds)."""
    name = kind(target)
    return "cpu" if name in CPU_KINDS else name
