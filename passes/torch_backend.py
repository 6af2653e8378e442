"""``torch.compile(model, backend="tvm_taso")``: each graph TorchDynamo captures goes to Relax
(``torch.export`` and TVM's PyTorch frontend, weights as constants), through tvm-taso's search
(:func:`tvm_taso.optimize`), then ``tvm.compile``, and runs on the inputs' device.

Options (``torch.compile(..., options={...})`` or :class:`TasoBackend`'s keywords): ``target``
(default: ``llvm`` for CPU tensors, ``cuda`` for CUDA ones), ``database`` (a MetaSchedule work
dir, ``tvm-taso tune``: its tuned kernels are applied when building; without one, a CPU build is
said once to run untuned kernels), and any keyword of :func:`tvm_taso.optimize` (``search``,
``cost_model``, ``time_limit``, ``budget``, ...).

The backend compiles for inference: the weights are baked into the compiled graph as constants
(the search merges and folds them); one changed in place afterwards (its version counter moves)
makes the graph compile again, and outputs carry no autograd history. A graph with dynamic
shapes (``dynamic=True``, or dynamo's automatic dynamic recompile) is compiled once with its
sizes symbolic (the sizes dynamo passes as ``SymInt`` inputs are read off the tensors they
measure) and serves every size in range. A graph it cannot take (parameters or inputs that need
gradients with grad mode on, a buffer or input changed in place, random draws, a size that is
not a tensor's dimension, an op TVM's frontend lacks, a failed build) runs in eager PyTorch
instead, with one :class:`~tvm_taso.driver.TasoSkippedWarning` naming the reason, and so does a
call with inputs of another dtype, device or rank; the user's forward pass never fails because
of the backend and never differs from eager's without a word.
"""

from __future__ import annotations

import functools
import logging
import re
import warnings

from tvm_taso.errors import first_line

log = logging.getLogger("tvm_taso.torch")

# where a placeholder of a captured graph comes from: module state (baked in: a parameter, a
# buffer, any attribute of a module, such as a norm's eps dynamo passes as a 0-d tensor when
# floats are dynamic) or a user input (a local, an item of one); a size (``.size()[k]``) is not
# an attribute
_STATE_SOURCE = re.compile(r"\.[A-Za-z_]\w*(?![\w(])")


class Unsupported(Exception):
    """A captured graph the backend leaves to eager PyTorch; the message says why."""


class _StateChanged(Exception):
    """A weight the compiled graph baked in was changed in place (its version counter moved)."""


class TasoBackend:
    """A ``torch.compile`` backend with its options; ``reports`` holds :func:`tvm_taso.optimize`'s
    report of each graph compiled, ``fallbacks`` the reason for each graph left to eager."""

    def __init__(self, target=None, database=None, **optimize_options):
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
        # a value out of range, or a setting given twice: one line
        SearchOptions.from_keywords(optimize_options.get("options"), **{k: optimize_options[k] for k in searched})
        self.target = targets.resolve(target) if target is not None else None
        if database is not None:
            from tvm_taso.cost.tuning import check_database

            try:
                database = check_database(database)
            except ValueError as err:
                raise ValueError(f"tvm_taso backend: database {err}") from None
        self.database = database
        self.optimize_options = optimize_options
        self.reports: list[dict] = []
        self.fallbacks: list[str] = []
        self.recompiles = 0  # graphs compiled again because a weight they baked in changed
        self._said: dict = {}

    def __call__(self, gm, example_inputs, **_mode):
        try:
            placeholders = _split_placeholders(gm, list(example_inputs))
        except Exception as err:  # noqa: BLE001 - never fail the user's forward pass
            return self._eager(gm, err)
        compiled = None

        def run(*args):
            # built on the first call, outside dynamo's tracing of the user's frame (an export
            # with symbolic sizes inside it would add its guards to the frame's); built again when
            # a weight it baked in changed in place since
            nonlocal compiled
            for _ in range(2):
                if compiled is None:
                    try:
                        compiled = self._compile(gm, placeholders, args)
                    except Exception as err:  # noqa: BLE001 - never fail the user's forward pass
                        compiled = self._eager(gm, err)
                try:
                    return compiled(*args)
                except _StateChanged:
                    log.info("tvm_taso backend: a weight changed in place since the graph was compiled; "
                             "compiling it again")
                    self.recompiles += 1
                    compiled = None
            return gm.forward(*args)

        return run

    def _eager_once(self, gm, reason: str):
        """``gm`` run by eager PyTorch for one call, ``reason`` said once per graph."""
        said = self._said.setdefault(id(gm), set())
        if reason not in said:
            said.add(reason)
            self._eager(gm, Unsupported(reason))
        return gm.forward

    def _eager(self, gm, err: Exception):
        """``gm`` run by eager PyTorch, the reason said in one warning and kept in ``fallbacks``."""
        from tvm_taso.driver import TasoSkippedWarning

        reason = str(err) if isinstance(err, Unsupported) else f"{type(err).__name__}: {first_line(err)}"
        log.debug("tvm_taso backend: graph left to eager PyTorch", exc_info=True)
        self.fallbacks.append(reason)
        warnings.warn(f"tvm_taso backend: this graph runs in eager PyTorch ({reason})", TasoSkippedWarning,
                      stacklevel=3)
        return gm.forward

    def _compile(self, gm, placeholders, args):
        import torch
        import tvm
        from tvm import relax
        from tvm_taso import target as targets
        from tvm_taso.driver import TasoSkippedWarning, optimize
        from tvm_taso.io.torch_import import import_program

        state, sizes = placeholders
        positions = [k for k in range(len(args)) if k not in state and k not in sizes]
        inputs = [args[k] for k in positions]
        device = _device(inputs + list(state.values()))
        frozen = _frozen_module_class()(_scalars_baked_in(gm, state), state, sizes, len(args))
        program = _exported(frozen, inputs, _dynamic_shapes(gm, state, sizes))
        _check_pure(program)
        mod = import_program(program, "the captured graph")
        target = self.target or targets.resolve("cuda" if device.type == "cuda" else "llvm")
        with warnings.catch_warnings():  # said once, below, if at all
            warnings.simplefilter("ignore", TasoSkippedWarning)
            new_mod, report = optimize(mod, target, **self.optimize_options)
        self.reports.append(report)
        log.info("tvm_taso backend: cost %.2f -> %.2f us, applied %s", report["cost_before"],
                 report["cost_after"], report["applied"])
        ex = self._build(new_mod, target)
        dev = tvm.cuda(device.index or 0) if device.type == "cuda" else tvm.cpu(0)
        vm = relax.VirtualMachine(ex, dev)
        out_spec = program.call_spec.out_spec
        kinds = [(a.dtype, a.device, a.dim()) for a in inputs]
        versions = [t._version for t in state.values()]

        def run(*args):
            if [(args[k].dtype, args[k].device, args[k].dim()) for k in positions] != kinds:
                # eager raises (or promotes) where the compiled graph would compute in its own dtype
                return self._eager_once(gm, "called with inputs of another dtype, device or rank than it was "
                                        "compiled for")(*args)
            if [t._version for t in state.values()] != versions:
                raise _StateChanged()
            flat = _torch_tensors(vm["main"](*[args[k].detach().contiguous() for k in positions]), torch)
            return torch.utils._pytree.tree_unflatten(flat, out_spec)

        return run

    def _build(self, mod, target):
        """``tvm.compile`` for ``target`` (:func:`~tvm_taso.cost.kernel_build.build_pipeline`), with
        the database's tuned kernels when there is one."""
        import tvm
        from tvm_taso import target as targets
        from tvm_taso.cost.kernel_build import build_pipeline, build_target

        if self.database is None and not targets.is_gpu(target):
            from tvm_taso.cost.tuning import untuned_notice

            untuned_notice("`tvm-taso tune MODEL -o DB`, then torch.compile(..., options={'database': DB})")
        built_for = build_target(target, self.database)
        return tvm.compile(mod, target=built_for, relax_pipeline=build_pipeline(built_for, self.database))


def tvm_taso_backend(gm, example_inputs, options: dict | None = None, **mode):
    """The backend registered as ``"tvm_taso"`` (the ``torch_dynamo_backends`` entry point):
    :class:`TasoBackend` with ``options``."""
    return TasoBackend(**(options or {}))(gm, example_inputs, **mode)


def _split_placeholders(gm, example_inputs) -> tuple[dict, dict]:
    """The captured graph's module state (position -> tensor: parameters and buffers, to bake
    in) and its sizes (position -> (position of the tensor input, dimension) it measures: dynamo
    passes a dynamic size as a ``SymInt`` input); every other placeholder is a user input.
    Raises :class:`Unsupported` for an input the backend cannot take."""
    import torch

    state, sizes = {}, {}
    placeholders = [n for n in gm.graph.nodes if n.op == "placeholder"]
    if len(placeholders) != len(example_inputs):
        raise Unsupported(f"{len(example_inputs)} inputs for {len(placeholders)} placeholders")
    sources = [_source(node) for node in placeholders]
    for k, (node, value) in enumerate(zip(placeholders, example_inputs)):
        if isinstance(value, torch.SymInt):
            sizes[k] = _measured(node, sources)
            continue
        if not isinstance(value, torch.Tensor):
            raise Unsupported(f"input {node.name} is a {type(value).__name__}, not a tensor")
        source = sources[k]
        if value.requires_grad and torch.is_grad_enabled():
            what = "parameter" if isinstance(value, torch.nn.Parameter) else "input"
            raise Unsupported(f"{what} {node.name} requires grad with grad mode on: the backend compiles inference "
                              "only (run the model under torch.no_grad() or torch.inference_mode())")
        if isinstance(value, torch.nn.Parameter) or _STATE_SOURCE.search(source):
            state[k] = value.detach()  # shares the version counter: an in-place change is seen
    return state, sizes


def _scalars_baked_in(gm, state: dict):
    """``gm`` (a copy) with each number it reads off a 0-d state tensor (``eps.item()``: dynamo
    passes a module's float attribute so when floats are dynamic) replaced by its value, as the
    weights are baked in: ``torch.export`` would see a value it cannot trace through."""
    import torch

    graph = None
    placeholders = [n for n in gm.graph.nodes if n.op == "placeholder"]
    for k, tensor in state.items():
        reads = [u for u in placeholders[k].users if u.op == "call_method" and u.target == "item"]
        if tensor.ndim != 0 or not reads:
            continue
        if graph is None:
            graph, copies = torch.fx.Graph(), {}
            graph.output(graph.graph_copy(gm.graph, copies))
        for read in reads:
            node = copies[read]

            def baked(arg, node=node, value=tensor.item()):
                return value if arg is node else arg

            for user in list(node.users):
                user.args = torch.fx.node.map_arg(user.args, baked)
                user.kwargs = torch.fx.node.map_arg(user.kwargs, baked)
            graph.erase_node(node)
    return gm if graph is None else torch.fx.GraphModule(gm, graph)


def _exported(frozen, inputs: list, dynamic_shapes):
    """``torch.export`` of ``frozen`` on ``inputs``. A dimension marked dynamic that the program
    fixes (``Dim.AUTO`` specializes it, yet leaves a constant ``SymInt`` that TVM's frontend would
    read as a size named ``64``) is exported again as static."""
    import torch

    with torch.no_grad():
        program = torch.export.export(frozen, tuple(inputs), dynamic_shapes=dynamic_shapes)
    if dynamic_shapes is None:
        return program
    def fixed(size) -> bool:
        return isinstance(size, torch.SymInt) and size.node.expr.is_number

    user = [n for n in program.graph.nodes if n.op == "placeholder"][-len(inputs):]
    spec = tuple({d: dim for d, dim in (given or {}).items() if not fixed(node.meta["val"].shape[d])} or None
                 for node, given in zip(user, dynamic_shapes[0]))
    if spec == dynamic_shapes[0]:
        return program
    with torch.no_grad():
        return torch.export.export(frozen, tuple(inputs), dynamic_shapes=(spec,) if any(spec) else None)


# ops whose result depends on more than their operands: random draws (dropout in training mode)
_RANDOM = ("bernoulli", "dropout", "native_dropout", "rand", "randn", "randint", "rand_like", "randn_like",
           "randint_like", "normal", "uniform", "multinomial")


def _check_pure(program) -> None:
    """:class:`Unsupported` for a program a compiled graph would run wrongly: one that mutates a
    buffer (``self.count += 1``, batch norm in training mode updating its running statistics)
    or an input (``x.add_(1)``: the compiled graph returns values, it changes nothing), or that
    draws random numbers (dropout in training mode)."""
    signature = program.graph_signature
    mutated = [_root(node.args[k]) for node in program.graph.nodes for k in _written_arguments(node)]
    if signature.buffers_to_mutate or signature.user_inputs_to_mutate or any(
            root is not None and root.op == "placeholder" for root in mutated):
        raise Unsupported("the graph changes a buffer or an input in place (training-mode batch norm, a counter, "
                          "x.add_(...)); the compiled graph would not")
    for node in program.graph.nodes:
        name = getattr(node.target, "__name__", str(node.target)).split(".")[0]
        if node.op == "call_function" and name in _RANDOM and _argument(node, "train", True) is not False:
            raise Unsupported(f"the graph draws random numbers ({name}: dropout in training mode?); "
                              "call model.eval() for inference")


def _argument(node, name: str, default):
    """The value ``node``'s call passes for its op's argument ``name`` (``default`` when the op
    has no such argument or the call leaves it out): ``torch.export`` keeps an inference model's
    ``aten.dropout(x, p, train=False)``, an identity."""
    if name in node.kwargs:
        return node.kwargs[name]
    schema = getattr(node.target, "_schema", None)
    names = [a.name for a in schema.arguments] if schema is not None else []
    return node.args[names.index(name)] if name in names and names.index(name) < len(node.args) else default


def _written_arguments(node) -> list[int]:
    """The positions of the arguments the op of ``node`` writes to (``x.add_(1)``: 0)."""
    schema = getattr(node.target, "_schema", None) if node.op == "call_function" else None
    if schema is None:
        return []
    return [k for k, arg in enumerate(schema.arguments[:len(node.args)])
            if arg.alias_info is not None and arg.alias_info.is_write]


def _root(value):
    """The node whose storage the FX value ``value`` is, through views (a mutation of a view of
    an input mutates the input); None for a value that is not a node."""
    import torch

    while isinstance(value, torch.fx.Node) and value.op == "call_function":
        schema = getattr(value.target, "_schema", None)
        if schema is None or not schema.arguments or schema.arguments[0].alias_info is None or not value.args:
            break
        value = value.args[0]  # a view: aliases its first argument
    return value if isinstance(value, torch.fx.Node) else None


def _source(node) -> str:
    """Where dynamo took a placeholder's value from (``L['x']``, ``L['x'].size()[1]``), or ""."""
    grapharg = node.meta.get("grapharg")
    return grapharg.source.name if grapharg is not None and grapharg.source is not None else ""


def _measured(node, sources: list[str]) -> tuple[int, int]:
    """(position of the tensor placeholder, dimension) whose size the ``SymInt`` placeholder
    ``node`` is; :class:`Unsupported` for a size computed otherwise (a stride, an expression)."""
    found = re.fullmatch(r"(.+)\.size\(\)\[(\d+)\]", _source(node))
    if found is None or found.group(1) not in sources:
        raise Unsupported(f"input {node.name} is a size that is not a tensor input's dimension "
                          f"({_source(node) or 'no source'})")
    return sources.index(found.group(1)), int(found.group(2))


def _dynamic_shapes(gm, state: dict, sizes: dict):
    """``torch.export``'s ``dynamic_shapes`` for the user inputs (the frozen module's one
    ``*inputs`` argument): every dimension dynamo made symbolic (a ``SymInt`` in the
    placeholder's example value) dynamic again; None when none is."""
    import torch

    placeholders = [n for n in gm.graph.nodes if n.op == "placeholder"]
    spec, dynamic = [], False
    for k, node in enumerate(placeholders):
        if k in state or k in sizes:
            continue
        example = node.meta.get("example_value")
        shape = example.shape if isinstance(example, torch.Tensor) else ()
        dims = {d: torch.export.Dim.AUTO for d, size in enumerate(shape) if isinstance(size, torch.SymInt)}
        dynamic |= bool(dims)
        spec.append(dims or None)
    return (tuple(spec),) if dynamic else None


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
        ``torch.export`` lifts them as constants, and its sizes read off the tensors they
        measure: the inputs are the user's tensors only."""

        def __init__(self, gm, state: dict, sizes: dict, count: int):
            super().__init__()
            self.gm, self.count, self.sizes = gm, count, dict(sizes)
            self.slots = sorted(state)
            for k in self.slots:
                self.register_buffer(f"state_{k}", state[k])

        def forward(self, *inputs):
            args, rest = {}, iter(inputs)
            for k in range(self.count):
                if k in self.slots:
                    args[k] = getattr(self, f"state_{k}")
                elif k not in self.sizes:
                    args[k] = next(rest)
            for k, (tensor, dim) in self.sizes.items():
                args[k] = args[tensor].shape[dim]
            return self.gm(*[args[k] for k in range(self.count)])

    return Frozen


def _torch_tensors(value, torch) -> list:
    """The VM's result (a tensor or nested tuples of them) as a flat list of torch tensors,
    shared through DLPack rather than copied."""
    if isinstance(value, torch.Tensor):
        return [value]
    if hasattr(value, "__dlpack__") or hasattr(value, "numpy"):
        return [torch.from_dlpack(value)]
    return [t for v in value for t in _torch_tensors(v, torch)]
