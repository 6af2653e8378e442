"""The kernel partition and the :class:`CostModel` interface.

A graph's cost is the sum of the costs of the kernels TVM builds from it. :func:`kernels`
groups ops as TVM's own passes do (:mod:`.fusion`: FuseOps' partition; weight-only expressions
are folded away before codegen, a lone reshape is a view); a :class:`CostModel` prices one
:class:`Kernel`. The models themselves live beside this module:
:mod:`.analytic` (roofline), :mod:`.measure` (timed), :mod:`.learned` (predicted).
"""

from __future__ import annotations

import abc
import functools
from dataclasses import dataclass

from tvm_taso.cost.fusion import Group, partition
from tvm_taso.ir import dims, ops
from tvm_taso.ir.graph import Graph, weight_only


@dataclass(frozen=True)
class Kernel:
    """One fused kernel: its ops in order, with each operand either an external tensor type
    or the index of an earlier op in the kernel."""

    ops: tuple  # (op, attrs, operands) where operand = ("in", TensorType) | ("op", k, out idx)
    outputs: tuple  # TensorTypes the kernel writes

    @property
    def anchor(self) -> str:
        return self.ops[0][0]

    @functools.cached_property
    def symbolic(self) -> bool:
        """Whether a type or attribute of the kernel holds a symbolic size."""
        return any(t is not None and t.symbolic for t in self.outputs) or any(
            dims.is_symbolic(attrs) or any(o[0] == "in" and o[1] is not None and o[1].symbolic for o in operands)
            for _, attrs, operands in self.ops)

    def at(self, point) -> "Kernel":
        """The kernel with its symbols at the sizes ``point`` (itself when it has none)."""
        return _kernel_at(self, point) if self.symbolic else self

    def to_json(self) -> dict:
        """Plain data (for the measurement database); :meth:`from_json` inverts it."""

        def operand(o):
            if o[0] == "in":
                return ["in", list(o[1].shape), o[1].dtype] if o[1] is not None else ["in", None, None]
            return ["op", o[1], o[2]]

        return {
            "ops": [[op, [[k, _jsonable(v)] for k, v in attrs], [operand(o) for o in operands]]
                    for op, attrs, operands in self.ops],
            "outputs": [[list(t.shape), t.dtype] for t in self.outputs],
        }

    @staticmethod
    def from_json(data: dict) -> "Kernel":
        def operand(o):
            if o[0] == "in":
                return ("in", ops.TensorType(tuple(o[1]), o[2]) if o[1] is not None else None)
            return ("op", o[1], o[2])

        body = tuple(
            (op, tuple((k, _hashable(v)) for k, v in attrs), tuple(operand(o) for o in operands))
            for op, attrs, operands in data["ops"]
        )
        return Kernel(body, tuple(ops.TensorType(tuple(s), d) for s, d in data["outputs"]))

    def key(self) -> str:
        """A stable digest of the kernel (same kernel, same key, in any process)."""
        import hashlib
        import json

        return hashlib.sha256(json.dumps(self.to_json(), sort_keys=True).encode()).hexdigest()[:32]


@functools.lru_cache(maxsize=1 << 16)
def _kernel_at(kernel: Kernel, point) -> Kernel:
    body = tuple((op, tuple((k, dims.value(v, point)) for k, v in attrs),
                  tuple(("in", o[1].at(point) if o[1] is not None else None) if o[0] == "in" else o for o in operands))
                 for op, attrs, operands in kernel.ops)
    return Kernel(body, tuple(t.at(point) for t in kernel.outputs))


def _jsonable(v):
    return list(_jsonable(x) for x in v) if isinstance(v, tuple) else v


def _hashable(v):
    return tuple(_hashable(x) for x in v) if isinstance(v, list) else v


def groups(g: Graph) -> list[Group]:
    """The kernels TVM builds for ``g``, as groups of node ids (:func:`.fusion.partition`)."""
    return g.derived("fusion_groups", lambda g: partition(g, weight_only(g)))


def kernel_count(g: Graph) -> int:
    """How many kernels TVM launches for ``g``, opaque ops included."""
    return sum(group.launches for group in groups(g))


def kernels(g: Graph) -> list[Kernel]:
    """The kernels a cost model prices for ``g`` (:func:`kernels_at` of each of its priced
    points, one after another; those of a static graph once)."""
    return g.derived("priced_kernels", lambda g: [k for at_point in kernels_at(g) for k in at_point])


def kernels_at(g: Graph) -> list[list[Kernel]]:
    """The kernels of :func:`fused_kernels` at each of ``g.sizes`` (one list per point, the
    static kernels in each); one list, as they are, for a static graph."""
    fused = fused_kernels(g)
    if not g.sizes:
        return [fused]
    return g.derived("kernels_at", lambda g: [[k.at(point) for k in fused] for point in g.sizes])


def fused_kernels(g: Graph) -> list[Kernel]:
    """The fused kernels TVM builds for ``g`` that hold a known op, each with its known ops
    (opaque ops are not priced: no rewrite changes them; a group that is only a reshape is a
    view, no kernel); their types and attributes may hold symbolic sizes."""
    return g.derived("fused_kernels", _fused_kernels)


def _fused_kernels(g: Graph) -> list[Kernel]:
    users = g.users()
    outside = set(g.outputs)
    result = []
    for group in groups(g):
        ids = [nid for nid in group.members if g.nodes[nid].op != "opaque"]
        if not group.launches or not ids:
            continue
        local = {nid: k for k, nid in enumerate(ids)}
        body = []
        for nid in ids:
            n = g.nodes[nid]
            operands = tuple(
                ("op", local[s], i) if s in local else ("in", g.type_of((s, i)) if i >= 0 else None)
                for s, i in n.inputs
            )
            body.append((n.op, n.attrs, operands))
        outs = []
        for nid in ids:
            n = g.nodes[nid]
            escapes = any(u not in local for u in users[nid]) or any(r[0] == nid for r in outside)
            if escapes:
                outs.extend(t for t in n.types if t is not None)
        result.append(Kernel(tuple(body), tuple(outs)))
    return result


def no_size_costlier(after: tuple, before: tuple, noise: float = 1e-12) -> bool:
    """Whether costs ``after`` (a graph's :meth:`CostModel.costs_at`) are no higher than
    ``before`` at any priced size (to ``noise``, the float rounding two summations differ by):
    a rewrite of a graph with symbolic sizes is kept only when it pays at every size."""
    return all(a <= b * (1.0 + noise) for a, b in zip(after, before))


class CostModel(abc.ABC):
    """Prices kernels; a graph costs the sum of its kernels. Costs are in microseconds."""

    name = "abstract"
    measures = False  # times kernels on this machine (searches must not share its cores meanwhile)

    def __init__(self):
        self._memo: dict[Kernel, float] = {}

    @abc.abstractmethod
    def kernel_cost(self, kernel: Kernel) -> float:
        """Estimated (or measured) time of one kernel, in microseconds."""

    def cost(self, g: Graph) -> float:
        """The cost of ``g``: the sum of its kernels' costs, at each of its priced sizes
        (``g.sizes``) for a graph with symbolic sizes: the sum of :meth:`costs_at`."""
        return g.derived(f"cost:{id(self)}", self._graph_cost)

    def _graph_cost(self, g: Graph) -> float:
        return sum(self._priced(k) for k in kernels(g))

    def _priced(self, kernel: Kernel) -> float:
        c = self._memo.get(kernel)
        if c is None:
            c = self._memo[kernel] = self.kernel_cost(kernel)
        return c

    def costs_at(self, g: Graph) -> tuple[float, ...]:
        """The cost of ``g`` at each of its priced sizes (one value for a static graph)."""
        self.cost(g)  # a model that prices a graph's kernels together does so first
        return tuple(sum(self._priced(k) for k in at_point) for at_point in kernels_at(g))

    def price(self, kernel: Kernel, sizes: tuple) -> float:
        """The cost of ``kernel`` summed over the priced points ``sizes`` (a graph's), as
        :meth:`cost` counts it: once per point (once, for a graph without symbols)."""
        if not sizes:
            return self._priced(kernel)
        return sum(self._priced(kernel.at(point)) for point in sizes)

    def describe(self) -> dict:
        return {"name": self.name}
