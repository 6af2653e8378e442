"""The kernel partition and the :class:`CostModel` interface.

A graph's cost is the sum of the costs of the kernels TVM builds from it. :func:`kernels`
groups ops as TVM's own passes do (:mod:`.fusion`: FuseOps' partition; weight-only expressions
are folded away before codegen, a lone reshape is a view); a :class:`CostModel` prices one
:class:`Kernel`. The models themselves live beside this module:
:mod:`.analytic` (roofline), :mod:`.measure` (timed), :mod:`.learned` (predicted).
"""

from __future__ import annotations

import abc
from dataclasses import dataclass

from tvm_taso.cost.fusion import Group, partition
from tvm_taso.ir import ops
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
    """The fused kernels TVM builds for ``g`` that hold a known op, each with its known ops
    (opaque ops are not priced: no rewrite changes them; a group that is only a reshape is a
    view, no kernel)."""
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
        return g.derived(f"cost:{id(self)}", self._graph_cost)

    def _graph_cost(self, g: Graph) -> float:
        total = 0.0
        for k in kernels(g):
            c = self._memo.get(k)
            if c is None:
                c = self._memo[k] = self.kernel_cost(k)
            total += c
        return total

    def describe(self) -> dict:
        return {"name": self.name}
