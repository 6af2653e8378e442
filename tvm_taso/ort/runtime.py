"""onnxruntime as the runtime an ONNX model is optimized for: ``target="ort[:provider][,key=value...]"``.

The ONNX workflow writes a model that runs in onnxruntime (or TensorRT through it), whose
kernels, fusions and layouts are not TVM's. An :class:`OrtRuntime` names an execution provider
as onnxruntime does (``cpu``, ``cuda``, ``tensorrt``, ... or the full ``CUDAExecutionProvider``),
the provider's options and the session's (``intra_op_num_threads=2``: any attribute of
``onnxruntime.SessionOptions``, or a session configuration entry such as
``session.intra_op.allow_spinning=0``; every other key is the provider's). Sessions run with
onnxruntime's graph optimizations on, as a user's do, so a rewrite that breaks one of its
fusions measures slower.

:class:`OrtSession` is one model loaded in a session with inputs to run it, timed like
:class:`~tvm_taso.cost.latency.CompiledModule` (and compared with
:func:`~tvm_taso.cost.latency.compare_builds`). :mod:`.pricing` writes search graphs and fused
kernels as small ONNX models and times them with these.
"""

from __future__ import annotations

import functools
import importlib.util
import json
import logging
import os
import platform
import tempfile
import time

import numpy as np

from tvm_taso.errors import TargetError

log = logging.getLogger("tvm_taso.ort")

PREFIX = "ort"
# short names -> onnxruntime's provider names
PROVIDERS = {
    "cpu": "CPUExecutionProvider",
    "cuda": "CUDAExecutionProvider",
    "tensorrt": "TensorrtExecutionProvider",
    "rocm": "ROCMExecutionProvider",
    "migraphx": "MIGraphXExecutionProvider",
    "openvino": "OpenVINOExecutionProvider",
    "dnnl": "DnnlExecutionProvider",
    "directml": "DmlExecutionProvider",
    "coreml": "CoreMLExecutionProvider",
}
# the TVM target whose analytic model stands in for a provider's kernels (the search's fallback
# pricing); a provider not named here runs on the CPU
PROXY = {"CUDAExecutionProvider": "cuda", "TensorrtExecutionProvider": "cuda", "ROCMExecutionProvider": "rocm",
         "MIGraphXExecutionProvider": "rocm"}
GRAPH_OPTIMIZATION = {"disable": "ORT_DISABLE_ALL", "basic": "ORT_ENABLE_BASIC", "extended": "ORT_ENABLE_EXTENDED",
                      "all": "ORT_ENABLE_ALL"}


def is_spelling(text) -> bool:
    """Whether ``text`` names onnxruntime (``ort``, ``ort:cuda``, ``ort,intra_op_num_threads=1``)."""
    if not isinstance(text, str):
        return False
    head = text.strip().split(",", 1)[0]
    return head == PREFIX or head.startswith(PREFIX + ":")


def _provider_name(name: str) -> str:
    """onnxruntime's name of the provider ``name`` calls by a short name (:data:`PROVIDERS`, else
    any installed provider's name without ``ExecutionProvider``: ``azure``), or ``name``."""
    if name.lower() in PROVIDERS:
        return PROVIDERS[name.lower()]
    try:
        import onnxruntime as ort
    except ImportError:
        return name
    return next((p for p in ort.get_available_providers()
                 if p.lower() in (name.lower(), name.lower() + "executionprovider")), name)


def _value(text: str):
    for kind in (int, float):
        try:
            return kind(text)
        except ValueError:
            pass
    return text


class OrtRuntime:
    """An onnxruntime execution provider with its options and the session options to time in.

    ``provider``: a short name (:data:`PROVIDERS`) or onnxruntime's own; ``provider_options``
    and ``session_options``: dicts of plain values. :attr:`key` tells measurements apart
    (runtime, version, provider, options, device)."""

    def __init__(self, provider: str = "cpu", provider_options: dict | None = None,
                 session_options: dict | None = None):
        self.provider = _provider_name(provider) if provider else PROVIDERS["cpu"]
        self.provider_options = dict(provider_options or {})
        self.session_options = dict(session_options or {})

    @staticmethod
    def parse(text: str) -> "OrtRuntime":
        """``ort[:provider][,key=value...]`` as an :class:`OrtRuntime`; :class:`TargetError` for
        anything else."""
        head, *pairs = [part.strip() for part in text.strip().split(",")]
        if not is_spelling(head):
            raise TargetError(f"{text!r} is not an onnxruntime target; expected ort[:provider][,key=value...]")
        provider = head.partition(":")[2] or "cpu"
        session_keys = _session_option_names()
        provider_options, session_options = {}, {}
        for pair in pairs:
            key, sep, value = pair.partition("=")
            if not sep or not key:
                raise TargetError(f"target {text!r}: {pair!r} is not key=value")
            is_session = key in session_keys or _is_config_entry(key)
            (session_options if is_session else provider_options)[key] = _value(value)
        return OrtRuntime(provider, provider_options, session_options)

    @property
    def proxy(self) -> str:
        """The TVM target kind whose analytic cost model prices for this provider when nothing is
        measured (``llvm`` for CPU providers)."""
        return PROXY.get(self.provider, "llvm")

    def __str__(self) -> str:
        short = next((k for k, v in PROVIDERS.items() if v == self.provider), self.provider)
        options = {**self.session_options, **self.provider_options}
        return f"{PREFIX}:{short}" + "".join(f",{k}={v}" for k, v in options.items())

    def __repr__(self) -> str:
        return f"OrtRuntime({str(self)!r})"

    @functools.cached_property
    def key(self) -> str:
        """The measurement database's target string for timings made with this runtime here."""
        import onnxruntime as ort

        return json.dumps({"runtime": "onnxruntime", "version": ort.__version__, "provider": self.provider,
                           "provider_options": self.provider_options, "session_options": self.session_options,
                           "device": self.device()}, sort_keys=True, separators=(",", ":"))

    def device(self) -> str:
        """What the provider runs on: the CPU's model name, or the GPU's ``device_id``."""
        if self.proxy == "llvm":
            return _cpu_name()
        return f"{self.proxy}:{self.provider_options.get('device_id', 0)}:{_gpu_name(self.provider_options.get('device_id', 0))}"

    def check(self) -> None:
        """Raise :class:`TargetError` (one line) unless onnxruntime is installed, has this provider,
        and runs a model on it with these options."""
        _check(self.provider, json.dumps(self.provider_options, sort_keys=True),
               json.dumps(self.session_options, sort_keys=True))

    def session(self, proto):
        """``proto`` (an ``onnx.ModelProto``, or a model file's path: a large model read where it
        lies) loaded in an ``InferenceSession`` with this provider and options, graph
        optimizations on unless the session options say otherwise."""
        import onnxruntime as ort

        opts = ort.SessionOptions()
        opts.log_severity_level = 3  # its warnings about unused initializers are not the user's
        for name, value in self.session_options.items():
            if _is_config_entry(name):
                opts.add_session_config_entry(name, str(value))
                continue
            if name == "graph_optimization_level" and isinstance(value, str):
                value = getattr(ort.GraphOptimizationLevel, GRAPH_OPTIMIZATION.get(value, value))
            elif name == "execution_mode" and isinstance(value, str):
                value = getattr(ort.ExecutionMode, {"sequential": "ORT_SEQUENTIAL",
                                                    "parallel": "ORT_PARALLEL"}.get(value, value))
            elif isinstance(getattr(opts, name), bool):
                value = bool(value)
            setattr(opts, name, value)
        providers = [(self.provider, {k: str(v) for k, v in self.provider_options.items()})]
        if isinstance(proto, (str, os.PathLike)):
            return ort.InferenceSession(os.fspath(proto), opts, providers=providers)
        if _weight_bytes(proto) < LARGE:
            return ort.InferenceSession(proto.SerializeToString(), opts, providers=providers)
        import onnx

        with tempfile.TemporaryDirectory(prefix="tvm-taso-ort-") as tmp:  # over 2 GB: external data
            path = os.path.join(tmp, "model.onnx")
            onnx.save_model(proto, path, save_as_external_data=True, location="model.onnx.data")
            return ort.InferenceSession(path, opts, providers=providers)


# the reference executor (the output check): the CPU provider with graph optimizations off, so that
# onnxruntime computes each node as written
REFERENCE = OrtRuntime("cpu", session_options={"graph_optimization_level": "disable"})


def installed() -> bool:
    """Whether onnxruntime is installed here."""
    return importlib.util.find_spec("onnxruntime") is not None


LARGE = 1 << 30  # weights from which a model is handed to onnxruntime as a file with external data


def _weight_bytes(proto) -> int:
    return sum(len(t.raw_data) for t in proto.graph.initializer)


@functools.cache
def _is_config_entry(key: str) -> bool:
    """Whether ``key`` is one of onnxruntime's session configuration entries (dotted names such as
    ``session.intra_op.allow_spinning``), set with ``add_session_config_entry``."""
    return key.startswith("session.")


def _session_option_names() -> frozenset:
    try:
        import onnxruntime as ort
    except ImportError:
        return frozenset(("intra_op_num_threads", "inter_op_num_threads", "graph_optimization_level",
                          "execution_mode"))
    return frozenset(n for n in dir(ort.SessionOptions) if not n.startswith("_")
                     and not callable(getattr(ort.SessionOptions, n)))


@functools.cache
def _check(provider: str, provider_options: str, session_options: str) -> None:
    try:
        import onnxruntime as ort
    except ImportError:
        raise TargetError("target ort times models in onnxruntime: pip install 'tvm-taso[ort]' "
                          "(or onnxruntime-gpu for the CUDA and TensorRT providers)") from None
    available = ort.get_available_providers()
    if provider not in available:
        raise TargetError(f"onnxruntime {ort.__version__} has no {provider} here; available: "
                          f"{', '.join(available)} (ort:cpu, or install the onnxruntime build with it)")
    runtime = OrtRuntime(provider, json.loads(provider_options), json.loads(session_options))
    _check_session_options(runtime.session_options)
    probe = _probe_model()
    try:
        session = runtime.session(probe)
        session.run(None, {"x": np.ones((1, 4), np.float32)})
    except Exception as err:  # noqa: BLE001 - onnxruntime raises its own types
        raise TargetError(f"onnxruntime cannot run a model on {provider} with options {runtime}: "
                          f"{str(err).strip().splitlines()[0] if str(err).strip() else type(err).__name__}") from None
    if session.get_providers()[0] != provider:  # it fell back: no device for the provider
        raise TargetError(f"onnxruntime has {provider} but no device for it here (it fell back to "
                          f"{session.get_providers()[0]}); available: {', '.join(available)}")
    known = session.get_provider_options().get(provider, {})
    unknown = sorted(set(runtime.provider_options) - set(known))
    if unknown:  # onnxruntime drops options a provider does not have, without a word
        raise TargetError(f"{provider} has no option {', '.join(unknown)} (its options: "
                          f"{', '.join(sorted(known)) or 'none'}; session options: "
                          f"{', '.join(sorted(_session_option_names()))})")


def _check_session_options(options: dict) -> None:
    """TargetError (one line) for a session option whose value is not of its type (an int for
    ``intra_op_num_threads``, a level name for ``graph_optimization_level``)."""
    import onnxruntime as ort

    defaults = ort.SessionOptions()
    names = {"graph_optimization_level": GRAPH_OPTIMIZATION,
             "execution_mode": {"sequential": "ORT_SEQUENTIAL", "parallel": "ORT_PARALLEL"}}
    for name, value in options.items():
        if _is_config_entry(name):
            continue  # onnxruntime checks its own entries when the session is made
        kind = type(getattr(defaults, name))
        if name in names:
            if str(value) not in set(names[name]) | set(names[name].values()):
                raise TargetError(f"session option {name}={value}: expected one of {', '.join(names[name])}")
        elif kind in (bool, int) and not isinstance(value, int) or kind is str and not isinstance(value, str):
            raise TargetError(f"session option {name}={value}: expected {'0 or 1' if kind is bool else kind.__name__}")


def _probe_model():
    from onnx import TensorProto, helper

    graph = helper.make_graph([helper.make_node("Relu", ["x"], ["y"])], "probe",
                              [helper.make_tensor_value_info("x", TensorProto.FLOAT, [1, 4])],
                              [helper.make_tensor_value_info("y", TensorProto.FLOAT, [1, 4])])
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)])
    model.ir_version = 8
    return model


@functools.cache
def _cpu_name() -> str:
    try:
        with open("/proc/cpuinfo") as f:
            for line in f:
                if line.startswith("model name"):
                    return line.split(":", 1)[1].strip()
    except OSError:
        pass
    return platform.processor() or platform.machine()


@functools.cache
def _gpu_name(device_id) -> str:
    import subprocess

    try:
        out = subprocess.run(["nvidia-smi", "--query-gpu=name", "--format=csv,noheader", f"--id={device_id}"],
                             capture_output=True, text=True, timeout=10)
        return out.stdout.strip() or "unknown"
    except (OSError, subprocess.SubprocessError):
        return "unknown"


class OrtSession:
    """``proto`` loaded by ``runtime`` with ``feeds`` (inputs by name) to run it on; timed like a
    :class:`~tvm_taso.cost.latency.CompiledModule`."""

    def __init__(self, runtime: OrtRuntime, proto, feeds: dict[str, np.ndarray]):
        t0 = time.perf_counter()
        self.session = runtime.session(proto)
        self.compile_seconds = time.perf_counter() - t0
        names = {i.name for i in self.session.get_inputs()}
        self.feeds = {k: v for k, v in feeds.items() if k in names}

    def run(self) -> list[np.ndarray]:
        return self.session.run(None, self.feeds)

    def time_ms(self, min_repeat_ms: int = 100) -> float:
        """One sample: mean milliseconds per call over at least ``min_repeat_ms``, after one call
        not timed (timed side by side, the other session's threads may still be spinning)."""
        self.session.run(None, self.feeds)
        calls, t0 = 0, time.perf_counter()
        while True:
            self.session.run(None, self.feeds)
            calls += 1
            elapsed = time.perf_counter() - t0
            if elapsed * 1e3 >= min_repeat_ms:
                return elapsed * 1e3 / calls
