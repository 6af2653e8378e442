"""``torch.compile(model, backend="tvm_taso")``: each graph TorchDynamo captures goes to Relax
(``torch.export`` and TVM's PyTorch frontend, weights as constants), through tvm-taso's search
(:func:`tvm_taso.optimize`), then ``tvm.compile``, and runs on the inputs' device.

Options (``torch.compile(..., options={...})`` or :class:`TasoBackend`'s keywords): ``target``
(default: ``llvm`` for CPU tensors, ``cuda`` for CUDA ones), and any keyword of
:func:`tvm_taso.optimize` (``search``, ``cost_model``, ``time_limit``, ``budget``, ...).

The backend compiles for inference: the weights are baked into the compiled graph as constants
(the search merges and folds them), so a model whose weights change afterwards must be compiled
again (``torch._dynamo.reset()``), and outputs carry no autograd history. A graph it cannot
take (an input that needs gradients, a dynamic shape, an op TVM's frontend lacks, a failed
build) runs in eager PyTorch instead, with one :class:`~tvm_taso.driver.TasoSkippedWarning`
naming the reason; the user's forward pass never fails because of the backend.
"""

from __future__ import annotations

import functools
import logging
import warnings

from tvm_taso.errors import first_line

log = logging.getLogger("tvm_taso.torch")

# where a placeholder of a captured graph comes from: module state (baked in) or a user input
_STATE_SOURCES = ("._parameters[", "._buffers[")


class Unsupported(Exception):
    """A captured graph the backend leaves to eager PyTorch; the message says why."""


class TasoBackend:
    """A ``torch.compile`` backend with its options; ``reports`` holds :func:`tvm_taso.optimize`'s
    report of each graph compiled, ``fallbacks`` the reason for each graph left to eager."""

    def __init__(self, target=None, **optimize_options):
        import inspect

        from tvm_taso import target as targets
        from tvm_taso.driver import optimize
        from tvm_taso.search import SearchOptions

        known = set(inspect.signature(optimize).parameters) - {"mod", "target"}
        unknown = sorted(set(optimize_options) - known)
        if unknown:  # a typo is the user's to fix, not a reason to run eagerly
            raise TypeError(f"tvm_taso backend: unknown option(s) {', '.join(unknown)}; "
                            f"known: target, {', '.join(sorted(known))}")
        searched = SearchOptions.keywords() & set(optimize_options)
        SearchOptions.from_keywords(**{k: optimize_options[k] for k in searched})  # a value out of range: one line
        self.target = targets.resolve(target) if target is not None else None
        self.optimize_options = optimize_options
        self.reports: list[dict] = []
        self.fallbacks: list[str] = []

    def __call__(self, gm, example_inputs, **_mode):
        from tvm_taso.driver import TasoSkippedWarning

        try:
            return self._compile(gm, list(example_inputs))
        except Exception as err:  # noqa: BLE001 - never fail the user's forward pass
            reason = str(err) if isinstance(err, Unsupported) else f"{type(err).__name__}: {first_line(err)}"
            log.debug("tvm_taso backend: graph left to eager PyTorch", exc_info=True)
            self.fallbacks.append(reason)
            warnings.warn(f"tvm_taso backend: this graph runs in eager PyTorch ({reason})", TasoSkippedWarning,
                          stacklevel=2)
            return gm.forward

    def _compile(self, gm, example_inputs):
        import torch
        import tvm
        from tvm import relax
        from tvm.relax.frontend.torch import from_exported_program

        from tvm_taso import target as targets
        from tvm_taso.driver import TasoSkippedWarning, optimize
        from tvm_taso.passes.pipeline import build_pipeline

        state, inputs = _split_placeholders(gm, example_inputs)
        device = _device(inputs + list(state.values()))
        frozen = _frozen_module_class()(gm, state, len(example_inputs))
        with torch.no_grad():
            program = torch.export.export(frozen, tuple(inputs))
        mod = from_exported_program(program, keep_params_as_input=False)
        target = self.target or targets.resolve("cuda" if device.type == "cuda" else "llvm")
        with warnings.catch_warnings():  # said once, below, if at all
            warnings.simplefilter("ignore", TasoSkippedWarning)
            new_mod, report = optimize(mod, target, **self.optimize_options)
        self.reports.append(report)
        log.info("tvm_taso backend: cost %.2f -> %.2f us, applied %s", report["cost_before"],
                 report["cost_after"], report["applied"])
        ex = tvm.compile(new_mod, target=target.tvm, relax_pipeline=build_pipeline(target))
        dev = tvm.cuda(device.index or 0) if device.type == "cuda" else tvm.cpu(0)
        vm = relax.VirtualMachine(ex, dev)
        positions = [k for k in range(len(example_inputs)) if k not in state]
        out_spec = program.call_spec.out_spec

        def run(*args):
            flat = _torch_tensors(vm["main"](*[args[k].detach().contiguous() for k in positions]), torch)
            return torch.utils._pytree.tree_unflatten(flat, out_spec)

        return run


def tvm_taso_backend(gm, example_inputs, options: dict | None = None, **mode):
    """The backend registered as ``"tvm_taso"`` (the ``torch_dynamo_backends`` entry point):
    :class:`TasoBackend` with ``options``."""
    return TasoBackend(**(options or {}))(gm, example_inputs, **mode)


def _split_placeholders(gm, example_inputs) -> tuple[dict, list]:
    """The captured graph's module state (position -> tensor: parameters and buffers, to bake
    in) and its user inputs. Raises :class:`Unsupported` for an input the backend cannot take."""
    import torch

    state, inputs = {}, []
    placeholders = [n for n in gm.graph.nodes if n.op == "placeholder"]
    if len(placeholders) != len(example_inputs):
        raise Unsupported(f"{len(example_inputs)} inputs for {len(placeholders)} placeholders")
    for k, (node, value) in enumerate(zip(placeholders, example_inputs)):
        if not isinstance(value, torch.Tensor):
            raise Unsupported(f"input {node.name} is a {type(value).__name__}, not a tensor "
                              "(a dynamic shape: compile with dynamic=False)")
        grapharg = node.meta.get("grapharg")
        source = grapharg.source.name if grapharg is not None and grapharg.source is not None else ""
        if isinstance(value, torch.nn.Parameter) or any(s in source for s in _STATE_SOURCES):
            state[k] = value.detach()
        elif value.requires_grad and torch.is_grad_enabled():
            raise Unsupported(f"input {node.name} requires grad: the backend compiles inference only")
        else:
            inputs.append(value)
    return state, inputs


def _device(tensors):
    """The one device of the graph's tensors (Unsupported for several, or for one TVM has no
    target for)."""
    devices = {(t.device.type, t.device.index) for t in tensors}
    if len(devices) != 1:
        raise Unsupported(f"tensors on {len(devices)} devices")
    device = tensors[0].device
    if device.type not in ("cpu", "cuda"):
        raise Unsupported(f"tensors on {device.type}, which the backend does not run on")
    return device


@functools.cache
def _frozen_module_class():
    import torch

    class Frozen(torch.nn.Module):
        """The captured graph with its module state as this module's buffers, so that
        ``torch.export`` lifts them as constants and the inputs are the user's only."""

        def __init__(self, gm, state: dict, count: int):
            super().__init__()
            self.gm, self.count = gm, count
            self.slots = sorted(state)
            for k in self.slots:
                self.register_buffer(f"state_{k}", state[k])

        def forward(self, *inputs):
            args, rest = [], iter(inputs)
            for k in range(self.count):
                args.append(getattr(self, f"state_{k}") if k in self.slots else next(rest))
            return self.gm(*args)

    return Frozen


def _torch_tensors(value, torch) -> list:
    """The VM's result (a tensor or nested tuples of them) as a flat list of torch tensors,
    shared through DLPack rather than copied."""
    if isinstance(value, torch.Tensor):
        return [value]
    if hasattr(value, "__dlpack__") or hasattr(value, "numpy"):
        return [torch.from_dlpack(value)]
    return [t for v in value for t in _torch_tensors(v, torch)]
