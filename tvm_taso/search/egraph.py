"""An e-graph of tensor programs kept by egglog, read back as Python data after each round.

egglog (its Rust core, through ``egglog.bindings``) holds the e-nodes, the union-find and the
congruence closure; Python adds terms and unions in one batch per round and reads the rebuilt
e-graph back with ``freeze()`` into an :class:`EGraphView`. Matching and conditions stay in
Python (:mod:`tvm_taso.search.ematch`) because the rule language computes attributes and
checks shapes, which egglog would need a shape analysis for.

The egglog sorts: ``T`` (a tensor, or a multi-output op's tuple) with constructors
``(Leaf i)`` (input or constant number ``i``), ``(Node k args)`` (op-and-attributes number
``k`` applied to a ``TL`` list), ``(Get t i)`` (output ``i`` of a tuple) and ``(Ref n)`` (a
name: every term Python adds is unioned with a fresh ``Ref``, so that later batches can say
which e-class they mean). Python's unions are ``Same`` facts, which one ``(run 1)`` per batch
turns into unions: a ``union`` command costs egglog a rebuild each, growing with the e-graph,
where a fact costs a constant.
"""

from __future__ import annotations

import functools
import importlib.util
import logging
from dataclasses import dataclass, field

from tvm_taso.ir.ops import TensorType

# egglog's Rust core logs every command it runs at INFO through Python's logging (pyo3-log): with
# logging at INFO, thousands of lines per region, and a Python call each. Quiet unless the
# application set a level for it.
if logging.getLogger("egglog").level == logging.NOTSET:
    logging.getLogger("egglog").setLevel(logging.WARNING)


@functools.cache
def _bindings():
    """egglog's bindings, imported on first use: importing them starts a thread, and a process
    forked after that (a region-search worker from its fork server) could deadlock in egglog."""
    try:
        from egglog import bindings
    except ImportError:  # pragma: no cover - depends on the environment
        return None
    return bindings

MISSING = (
    "search='eqsat' needs the egglog package: pip install 'tvm-taso[eqsat]' (or pip install 'egglog>=13')"
)

_SCHEMA = """
(sort T)
(sort TL)
(constructor Leaf (i64) T)
(constructor Node (i64 TL) T)
(constructor Get (T i64) T)
(constructor Ref (i64) T)
(constructor Nil () TL)
(constructor Cons (T TL) TL)
(relation Same (T T))
(rule ((Same a b)) ((union a b)))
"""

COMMANDS_PER_PROGRAM = 32

# An e-node as Python sees it: ("leaf", leaf number, ()), ("node", op key, child classes) or
# ("get", output index, (tuple class,)). Classes are named by their smallest Ref number.
ENode = tuple


def available() -> bool:
    return importlib.util.find_spec("egglog") is not None


@dataclass
class EGraphView:
    """One round's snapshot: e-classes with their e-nodes and types."""

    classes: dict[int, list[ENode]]
    class_of: dict[ENode, int]  # hash-cons: e-node -> its class
    types: dict[int, tuple]  # class -> output types (one per output; a tensor has one)
    canonical: dict[int, int]  # every Ref number -> its class
    by_op: dict[str, list[tuple[int, ENode]]] = field(default_factory=dict)  # op -> (class, e-node)

    def __post_init__(self):
        self.size = sum(len(ns) for ns in self.classes.values())  # e-nodes
        self._parents: dict[int, set[int]] | None = None

    def find(self, ref: int) -> int:
        return self.canonical[ref]

    def is_tuple(self, cid: int) -> bool:
        return len(self.types[cid]) != 1

    def changed_since(self, old: EGraphView) -> set[int]:
        """Classes that are new since ``old`` or hold other e-nodes (a union, a new e-node, a
        child renamed by a union below)."""
        return {cid for cid, ens in self.classes.items()
                if cid not in old.classes or set(ens) != set(old.classes[cid])}

    def ancestors(self, classes: set[int], steps: int) -> set[int]:
        """``classes`` and the classes reading them within ``steps`` e-node steps."""
        if self._parents is None:
            self._parents = {}
            for cid, ens in self.classes.items():
                for e in ens:
                    for ch in e[2]:
                        self._parents.setdefault(ch, set()).add(cid)
        found, frontier = set(classes), set(classes)
        for _ in range(steps):
            frontier = {p for c in frontier for p in self._parents.get(c, ()) if p not in found}
            if not frontier:
                break
            found |= frontier
        return found


class EGraph:
    """The egglog e-graph plus the Python tables its numbers refer to."""

    def __init__(self):
        egglog = _bindings()
        if egglog is None:
            raise ImportError(MISSING)
        self._eg = egglog.EGraph()
        self._eg.run_program(*self._eg.parse_program(_SCHEMA))
        self._run = self._eg.parse_program("(run 1)")  # the batch's Same facts become unions
        self.op_keys: list[tuple[str, tuple]] = []  # op key -> (op, sorted attribute pairs)
        self._op_key_of: dict[tuple[str, tuple], int] = {}
        self.leaves: list[tuple] = []  # leaf number -> (op, type, payload, node key, graph node id or None)
        self.node_ids: dict[int, int] = {}  # Ref of a loaded graph's op -> its node id in that graph
        self.ref_types: dict[int, tuple] = {}
        self.const_refs: set[int] = set()  # Refs named for constant leaves
        self._next_ref = 0
        self._pending: list[str] = []
        self.view: EGraphView | None = None

    # -- adding (batched until commit) ------------------------------------------------------
    def op_key(self, op: str, attrs: tuple) -> int:
        key = (op, attrs)
        k = self._op_key_of.get(key)
        if k is None:
            k = self._op_key_of[key] = len(self.op_keys)
            self.op_keys.append(key)
        return k

    def _name(self, term: str, types: tuple) -> int:
        ref = self._next_ref
        self._next_ref += 1
        self.ref_types[ref] = types
        self._pending.append(f"(Same (Ref {ref}) {term})")
        return ref

    def add_leaf(self, op: str, ty: TensorType, payload, key, node_id: int | None) -> int:
        self.leaves.append((op, ty, payload, key, node_id))
        ref = self._name(f"(Leaf {len(self.leaves) - 1})", (ty,))
        if op == "const":
            self.const_refs.add(ref)
        return ref

    def add_node(self, op_key: int, children: tuple[int, ...], types: tuple) -> int:
        args = "(Nil)"
        for c in reversed(children):
            args = f"(Cons (Ref {c}) {args})"
        return self._name(f"(Node {op_key} {args})", types)

    def add_get(self, tup: int, index: int, ty: TensorType) -> int:
        return self._name(f"(Get (Ref {tup}) {index})", (ty,))

    def union(self, a: int, b: int) -> None:
        self._pending.append(f"(Same (Ref {a}) (Ref {b}))")

    @property
    def pending(self) -> int:
        return len(self._pending)

    def commit(self) -> EGraphView:
        """Send the batch to egglog, let it rebuild, and read the e-graph back."""
        if self._pending or self.view is None:
            pending, self._pending = self._pending, []
            # egglog's cost per command grows with the program's length (measured: 2,000
            # unions in one program 2.5 s, in programs of 32 commands 0.15 s)
            for start in range(0, len(pending), COMMANDS_PER_PROGRAM):
                self._eg.run_program(*self._eg.parse_program("\n".join(pending[start:start + COMMANDS_PER_PROGRAM])))
            self._eg.run_program(*self._run)
            self.view = self._read()
        return self.view

    # -- reading back ----------------------------------------------------------------------
    def _read(self) -> EGraphView:
        eg = self._eg
        functions = eg.freeze().functions
        as_int = eg.value_to_i64
        name_of: dict = {}  # egglog class value -> smallest Ref number
        canonical: dict[int, int] = {}
        refs = [(as_int(r.inputs[0]), r.output) for r in functions["Ref"].rows]
        for ref, value in sorted(refs, key=lambda rv: rv[0]):
            canonical[ref] = name_of.setdefault(value, ref)
        lists: dict = {}
        for r in functions["Nil"].rows:
            lists[r.output] = ()
        cons = {r.output: (r.inputs[0], r.inputs[1]) for r in functions["Cons"].rows}

        def resolve(tl):
            if tl not in lists:
                head, tail = cons[tl]
                lists[tl] = (name_of[head],) + resolve(tail)
            return lists[tl]

        classes: dict[int, list[ENode]] = {cid: [] for cid in set(canonical.values())}
        class_of: dict[ENode, int] = {}
        by_op: dict[str, list] = {}

        def put(value, enode):
            cid = name_of[value]
            if enode not in class_of:
                class_of[enode] = cid
                classes[cid].append(enode)
                if enode[0] == "node":
                    by_op.setdefault(self.op_keys[enode[1]][0], []).append((cid, enode))

        for r in functions["Leaf"].rows:
            put(r.output, ("leaf", as_int(r.inputs[0]), ()))
        for r in functions["Node"].rows:
            put(r.output, ("node", as_int(r.inputs[0]), resolve(r.inputs[1])))
        for r in functions["Get"].rows:
            put(r.output, ("get", as_int(r.inputs[1]), (name_of[r.inputs[0]],)))
        types = {cid: self.ref_types[cid] for cid in classes}
        for entries in by_op.values():
            entries.sort(key=lambda ce: (ce[0], ce[1][1], ce[1][2]))
        return EGraphView(classes, class_of, types, canonical, by_op)
