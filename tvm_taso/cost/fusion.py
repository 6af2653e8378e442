"""The kernels TVM builds from a graph: FuseOps' partition run on the search's graph.

TVM's default pipelines (cuda and llvm alike) legalize every Relax op to a TIR function, give it
a fusion pattern (``AnnotateTIROpPattern``), fold constant expressions (``FoldConstant``), group
the calls (``FuseOps``, the post-dominator partitioner TVM shares with Relay) and make each group
one kernel (``FuseTIR``); a group that is only a reshape becomes a view
(``RewriteDataflowReshape``). :func:`partition` runs that partitioner on a
:class:`~tvm_taso.ir.graph.Graph`, with each op's pattern as ``AnnotateTIROpPattern`` gives it in
0.27 (:data:`PATTERN`); an op the graph keeps opaque is legalized once to learn its pattern. It
takes microseconds per region, where running TVM's passes takes 0.1-1 s: the search prices
thousands of candidates. TVM's own count, to check it against, is
:func:`tvm_taso.cost.kernel_build.tvm_kernel_count`.
"""

from __future__ import annotations

from dataclasses import dataclass, field

from tvm_taso.ir import ops
from tvm_taso.ir.graph import LEAVES, Graph

# TVM's OpPatternKind
ELEMWISE, BROADCAST, INJECTIVE, COMM_REDUCE, OUT_EWISE_FUSABLE, TUPLE, OPAQUE = 0, 1, 2, 3, 4, 7, 8

# AnnotateTIROpPattern on each op legalized (0.27): elementwise ops, broadcasting or not, are
# kElemWise; data movement is kInjective (reshape included: it is a call_tir until it is left
# alone in its group); every op with a reduction (conv2d, matmul, pools, softmax, layer_norm,
# mean) is kOutEWiseFusable -- but batch_norm in inference mode (the only one the op table
# models) is a scale and shift: kInjective, so it fuses with what follows, not with its conv.
PATTERN = {ops.ELEMWISE: ELEMWISE, ops.INJECTIVE: INJECTIVE, ops.VIEW: INJECTIVE, ops.KERNEL: OUT_EWISE_FUSABLE,
           ops.REDUCE: OUT_EWISE_FUSABLE}
PATTERN_OF_OP = {"batch_norm": INJECTIVE}


def op_pattern(op: str) -> int:
    """The pattern AnnotateTIROpPattern gives ``op`` of the op table, legalized."""
    return PATTERN_OF_OP.get(op, PATTERN[ops.OPS[op].kind])
MAX_FUSE_DEPTH = 256  # FuseOps' default limit on ops per group (relax.FuseOps.max_depth)


@dataclass
class _Node:
    key: object  # graph node id, or (node id, index) for a tuple element read by TupleGetItem
    pattern: int
    launches: int  # call_tir bindings this node is (0 for TupleGetItem, shape ops)
    extern: bool = False  # a value used after the block: nothing fuses after it
    outputs: list = field(default_factory=list)  # (consumer position, edge pattern)


@dataclass(frozen=True)
class Group:
    """One kernel-to-be: graph node ids in topological order; ``launches`` is how many kernels
    it launches (1, or 0 for a group TVM leaves without a kernel: a lone reshape, a tuple
    access; more for an opaque op that legalizes to several)."""

    members: tuple
    launches: int


def partition(g: Graph, folded: set[int]) -> list[Group]:
    """FuseOps' groups of ``g``'s runtime ops (``folded``: the nodes FoldConstant removes)."""
    nodes = _forward_graph(g, folded)
    parent, dom_pattern = _post_dominators(nodes)
    fuser = _Fuser(nodes, parent, dom_pattern)
    fuser.run(phase=0)
    fuser.run(phase=1)
    # phase 2 only fuses into tuple bindings, which a graph never has (concat's tuple is inline)
    by_root: dict[int, list[int]] = {}
    for k in range(len(nodes)):
        by_root.setdefault(fuser.root(k), []).append(k)
    groups = []
    for ks in sorted(by_root.values()):
        members = tuple(dict.fromkeys(nodes[k].key for k in ks if not isinstance(nodes[k].key, tuple)))
        launches = sum(nodes[k].launches for k in ks)
        if launches and not any(nodes[k].extern for k in ks) and all(_is_view(g, nid) for nid in members):
            launches = 0  # RewriteDataflowReshape: a group that only reshapes is a view (inside the block)
        elif len(ks) > 1:
            launches = min(launches, 1)  # FuseTIR makes a group one kernel
        if members:
            groups.append(Group(members, launches))
    return groups


def _forward_graph(g: Graph, folded: set[int]) -> list[_Node]:
    """FuseOps' IndexedForwardGraph of ``g``: one node per runtime binding in binding order,
    a TupleGetItem node per element read from a multi-output op, edges labelled with the
    consumer's pattern. Leaves and folded constants are opaque in TVM and never fuse; they are
    left out."""
    nodes: list[_Node] = []
    position: dict = {}

    def add(key, pattern, launches):
        position[key] = len(nodes)
        nodes.append(_Node(key, pattern, launches))
        return position[key]

    def source(ref) -> int | None:
        nid, idx = ref
        if nid not in position:
            return None
        if idx >= 0 and len(g.nodes[nid].types) > 1:
            if ref not in position:
                k = add(ref, INJECTIVE, 0)
                nodes[position[nid]].outputs.append((k, INJECTIVE))
            return position[ref]
        return position[nid]

    constant = set(folded)
    for nid in g.topo_order():
        n = g.nodes[nid]
        if n.op in LEAVES or nid in folded:
            continue
        if n.inputs and all(s in constant or g.nodes[s].op == "const" for s, _ in n.inputs) or _folded_opaque(g, n):
            constant.add(nid)  # FoldConstant evaluates an opaque op of constants too (shape_of, take...)
            continue
        if n.op == "opaque":
            pattern, launches = opaque_pattern(n.payload)
        else:
            pattern, launches = op_pattern(n.op), 1
        srcs = [source(ref) for ref in n.inputs]
        k = add(nid, pattern, launches)
        for s in srcs:
            if s is not None:
                nodes[s].outputs.append((k, pattern))
    for ref in g.outputs:
        s = source(ref) if ref[0] in position else None
        if s is not None:
            nodes[s].extern = True
    return nodes


def _is_view(g: Graph, nid: int) -> bool:
    """A reshape, or a transpose that only moves axes of size 1: the data stays in place, so
    RewriteDataflowReshape finds a reshape pattern in its kernel and launches none."""
    n = g.nodes[nid]
    if n.op == "permute_dims":
        shape = g.type_of(n.inputs[0]).shape
        axes = n.attr.get("axes")
        moved = [a for a in (range(len(shape) - 1, -1, -1) if axes is None else axes) if shape[a] != 1]
        return moved == sorted(moved)
    return n.op != "opaque" and ops.OPS[n.op].kind == ops.VIEW


def _folded_opaque(g: Graph, n) -> bool:
    """Does ``FoldConstant`` evaluate opaque node ``n`` although it reads no constant? An op
    with no tensor operand and a static result (``R.arange``, ``R.full`` of a fixed shape:
    PyTorch exports build position ids and masks from them), and ``R.shape_of`` of a tensor
    whose shape is known (PyTorch exports compute index arithmetic from it)."""
    if n.op != "opaque" or len(n.inputs) > 1:  # most nodes: on the partition's hot path
        return False
    import tvm
    from tvm import relax

    payload = n.payload
    if not isinstance(payload, relax.Call) or not isinstance(payload.op, tvm.ir.Op):
        return False
    if not n.inputs:
        return bool(n.types) and all(t is not None for t in n.types)
    if payload.op.name != "relax.shape_of":
        return False
    ty = g.nodes[n.inputs[0][0]].types[n.inputs[0][1]] if n.inputs[0][1] >= 0 else None
    return ty is not None and all(isinstance(d, int) for d in ty.shape)


def _post_dominators(nodes: list[_Node]) -> tuple[list, list]:
    """TVM's DominatorTree::PostDom: each node's immediate post-dominator and the strongest
    edge pattern on the way to it (a value used after the block has none)."""
    n = len(nodes)
    parent: list = [None] * n
    depth = [0] * n
    pattern = [ELEMWISE] * n

    def lca(a, b, p):
        while a != b:
            if a is None or b is None:
                return None, p
            if depth[a] < depth[b]:
                p, b = max(p, pattern[b]), parent[b]
            elif depth[b] < depth[a]:
                p, a = max(p, pattern[a]), parent[a]
            else:
                p = max(p, pattern[a], pattern[b])
                a, b = parent[a], parent[b]
        return a, p

    for k in reversed(range(n)):
        node = nodes[k]
        if node.extern or not node.outputs:
            parent[k], depth[k], pattern[k] = None, 1, OPAQUE if node.extern else ELEMWISE
            continue
        p = ELEMWISE
        dom, p = node.outputs[0][0], max(p, node.outputs[0][1])
        for out, edge in node.outputs[1:]:
            dom, p = lca(dom, out, p)
            p = max(p, edge)
        parent[k], pattern[k] = dom, p
        depth[k] = depth[dom] + 1 if dom is not None else 1
    return parent, pattern


class _Fuser:
    """GraphPartitioner::RunFuse, CheckPath and CommitFuse, on union-find groups."""

    def __init__(self, nodes: list[_Node], dom_parent: list, dom_pattern: list):
        self.nodes, self.dom_parent, self.dom_pattern = nodes, dom_parent, dom_pattern
        self.up = list(range(len(nodes)))
        self.pattern = [node.pattern for node in nodes]
        self.anchor = [node.pattern == OUT_EWISE_FUSABLE for node in nodes]
        self.size = [1] * len(nodes)

    def root(self, k: int) -> int:
        while self.up[k] != k:
            self.up[k] = self.up[self.up[k]]
            k = self.up[k]
        return k

    def _merge(self, child: int, parent: int) -> None:
        child, parent = self.root(child), self.root(parent)
        if child == parent:
            return
        self.size[parent] += self.size[child]
        self.up[child] = parent
        if self.anchor[child]:
            self.anchor[parent] = True
            self.pattern[parent] = max(self.pattern[child], self.pattern[parent])

    def _check_path(self, src: int, sink: int, ok) -> bool:
        seen: set[int] = set()

        def visit(k: int) -> bool:
            if k in seen:
                return True
            seen.add(k)
            if not ok(self.pattern[self.root(k)], k == sink):
                return False
            return k == sink or all(visit(o) for o, _ in self.nodes[k].outputs)

        return all(visit(o) for o, _ in self.nodes[src].outputs)

    def _commit(self, src: int, sink: int) -> None:
        target, seen, stack = sink, set(), [src]
        while stack:
            k = stack.pop()
            if k == sink or k in seen:
                continue
            seen.add(k)
            self._merge(k, target)
            stack.extend(o for o, _ in self.nodes[k].outputs)

    def _count_upto(self, src: int, sink: int) -> int:
        seen, stack, total = set(), [src], 0
        while stack:
            k = stack.pop()
            if k == sink or k in seen:
                continue
            seen.add(k)
            total += 1
            stack.extend(o for o, _ in self.nodes[k].outputs)
        return self.size[self.root(sink)] + total

    def run(self, phase: int) -> None:
        """One phase of RunFuse: 0 fuses kernels with what follows, 1 fuses injective ops."""
        for k in range(len(self.nodes)):
            # TVM reads the pattern of the node's own group object (the root's only in CheckPath)
            pattern, dom = self.pattern[k], self.dom_parent[k]
            if pattern == OPAQUE or dom is None or self.root(k) == self.root(dom):
                continue
            if pattern == OUT_EWISE_FUSABLE:
                fuse = phase == 0 and self.dom_pattern[k] == ELEMWISE and \
                    self._check_path(k, dom, lambda kind, sink: kind <= BROADCAST)
            elif pattern <= BROADCAST:
                fuse = (self.dom_pattern[k] <= INJECTIVE or self.dom_pattern[k] == COMM_REDUCE) and \
                    self._check_path(k, dom, _into_anchor)
            elif pattern == INJECTIVE:
                fuse = phase == 1 and self._check_path(k, dom, lambda kind, sink: kind <= INJECTIVE)
            else:
                fuse = False
            if fuse and self._count_upto(k, dom) <= MAX_FUSE_DEPTH:
                self._commit(k, dom)


def _into_anchor(kind: int, is_sink: bool) -> bool:
    """An elementwise group may fuse through injective ops, into any kernel but an opaque one."""
    if not is_sink:
        return kind <= INJECTIVE
    return kind <= INJECTIVE or kind in (COMM_REDUCE, OUT_EWISE_FUSABLE)


def opaque_pattern(value) -> tuple[int, int]:
    """(pattern, kernels launched) of a binding the graph keeps opaque, as TVM legalizes it."""
    from tvm import relax

    if isinstance(value, relax.TupleGetItem):
        return INJECTIVE, 0
    if not isinstance(value, relax.Call):
        return OPAQUE, 0
    import tvm

    if not isinstance(value.op, tvm.ir.Op):
        return OPAQUE, 0  # a call of another Relax function: its kernels are counted there
    if value.op.name in ("relax.call_tir", "relax.call_tir_inplace", "relax.call_dps_packed"):
        return OPAQUE, 1  # already a kernel (its pattern lives in a module this graph does not see)
    key = (value.op.name, str(value.attrs), tuple(str(getattr(a, "ty", type(a).__name__)) for a in value.args))
    return _legalized_pattern(key, value)


_PATTERNS: dict = {}  # (op, attrs, argument types) -> (pattern, launches): one legalization each


def _legalized_pattern(key, value) -> tuple[int, int]:
    if key not in _PATTERNS:
        _PATTERNS[key] = _legalize_one(value)
    return _PATTERNS[key]


def _legalize_one(value) -> tuple[int, int]:
    """Legalize ``value`` alone (its variables as parameters) and read its call_tir's pattern."""
    import tvm
    from tvm import relax

    params: list = []
    mapping: dict = {}

    def arg(e):
        if isinstance(e, relax.Var):
            if e not in mapping:
                mapping[e] = relax.Var(f"p{len(params)}", e.ty)
                params.append(mapping[e])
            return mapping[e]
        if isinstance(e, relax.Tuple):
            return relax.Tuple([arg(f) for f in e.fields])
        return e

    try:
        call = relax.Call(value.op, [arg(a) for a in value.args], value.attrs, list(value.ty_args))
        bb = relax.BlockBuilder()
        with bb.function("main", params):
            with bb.dataflow():
                out = bb.emit_output(call)
            bb.emit_func_output(out)
        mod = tvm.transform.Sequential([relax.transform.LegalizeOps(), relax.transform.AnnotateTIROpPattern()])(bb.get())
    except Exception:  # noqa: BLE001 - an op TVM cannot legalize alone: a barrier to fusion
        return OPAQUE, 1
    calls = []

    def visit(e):
        if isinstance(e, relax.Call) and isinstance(e.op, tvm.ir.Op) and e.op.name == "relax.call_tir":
            calls.append(e)

    relax.analysis.post_order_visit(mod["main"], visit)
    if len(calls) != 1:
        return OPAQUE, len(calls)
    func = mod[calls[0].args[0]] if calls[0].args[0] in mod.functions else None
    pattern = func.attrs["op_pattern"] if func is not None and func.attrs and "op_pattern" in func.attrs else OPAQUE
    return int(pattern), 1
