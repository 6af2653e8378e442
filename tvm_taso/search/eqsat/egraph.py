"""An e-graph of tensor programs kept by egglog, read back as Python data after each round.

egglog (its Rust core, through ``egglog.bindings``) holds the e-nodes, the union-find and the
congruence closure, and matches the rules' patterns (compiled by :mod:`tvm_taso.search.eqsat.ematch`
into egglog rules of the ``match`` ruleset, which record each match in a relation); Python adds
terms and unions in one batch per round and reads the rebuilt e-graph and the new matches back
with ``freeze()`` into an :class:`EGraphView`.

The egglog sorts: ``T`` (a tensor, or a multi-output op's tuple) with constructors
``(Leaf i)`` (input or constant number ``i``), ``(N2 op k a b)`` (op number ``op`` with
op-and-attributes number ``k`` on two operands; ``N0`` to ``N4``, and ``(Node op k args)`` on a
``TL`` list for more: one row per e-node, so that a pattern is one atom with its op a constant),
``(Get t i)`` (output ``i`` of a tuple) and ``(Ref n)`` (a name: every term Python adds is
unioned with a fresh ``Ref``, so that later batches can say which e-class they mean).

A batch reaches egglog as rows of ``load`` relations over numbers (``AddN2 ref op key a b``: Ref
``ref`` names ``(N2 op key (Ref a) (Ref b))``; ``Unite a b``: a union), written to tab-separated
files that one ``input`` command per relation reads, then one ``(run load 1)`` turns into terms
and unions: each command costs egglog about 55 us whatever it does (measured: 2,000 facts as
commands 0.11-0.13 s, as two files 6 ms).
"""

from __future__ import annotations

import functools
import importlib.util
import logging
import os
import tempfile
from dataclasses import dataclass, field

from tvm_taso.ir.ops import OPS, TensorType
from tvm_taso.rewrite.semantics import attributes_matched

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
(constructor N0 (i64 i64) T)
(constructor N1 (i64 i64 T) T)
(constructor N2 (i64 i64 T T) T)
(constructor N3 (i64 i64 T T T) T)
(constructor N4 (i64 i64 T T T T) T)
(constructor Node (i64 i64 TL) T)
(constructor Get (T i64) T)
(constructor Ref (i64) T)
(constructor Nil () TL)
(constructor Cons (T TL) TL)
(constructor L (i64) TL)
(union (L -1) (Nil))
(relation Fits (i64 i64))
(relation Orig (T))
(relation AddOrig (i64))
(relation AddLeaf (i64 i64))
(relation AddN0 (i64 i64 i64))
(relation AddN1 (i64 i64 i64 i64))
(relation AddN2 (i64 i64 i64 i64 i64))
(relation AddN3 (i64 i64 i64 i64 i64 i64))
(relation AddN4 (i64 i64 i64 i64 i64 i64 i64))
(relation AddNode (i64 i64 i64 i64))
(relation AddCons (i64 i64 i64))
(relation AddGet (i64 i64 i64))
(relation Unite (i64 i64))
(ruleset load)
(rule ((AddLeaf r i)) ((union (Ref r) (Leaf i))) :ruleset load)
(rule ((AddN0 r op k)) ((union (Ref r) (N0 op k))) :ruleset load)
(rule ((AddN1 r op k a)) ((union (Ref r) (N1 op k (Ref a)))) :ruleset load)
(rule ((AddN2 r op k a b)) ((union (Ref r) (N2 op k (Ref a) (Ref b)))) :ruleset load)
(rule ((AddN3 r op k a b c)) ((union (Ref r) (N3 op k (Ref a) (Ref b) (Ref c)))) :ruleset load)
(rule ((AddN4 r op k a b c d)) ((union (Ref r) (N4 op k (Ref a) (Ref b) (Ref c) (Ref d)))) :ruleset load)
(rule ((AddCons l h t)) ((union (L l) (Cons (Ref h) (L t)))) :ruleset load)
(rule ((AddNode r op k l)) ((union (Ref r) (Node op k (L l)))) :ruleset load)
(rule ((AddGet r t i)) ((union (Ref r) (Get (Ref t) i))) :ruleset load)
(rule ((Unite a b)) ((union (Ref a) (Ref b))) :ruleset load)
(rule ((AddOrig r)) ((Orig (Ref r))) :ruleset load)
(ruleset read)
(ruleset match)
"""

# the load relations a batch fills (and Fits), in the order egglog reads them
LOADED = ("Fits", "AddOrig", "AddLeaf", "AddN0", "AddN1", "AddN2", "AddN3", "AddN4", "AddCons", "AddNode", "AddGet", "Unite")

OP_NUMBERS = {op: k for k, op in enumerate(sorted(OPS))}  # an e-node's op, its term's first argument
MAX_FLAT_ARITY = 4  # e-nodes of up to this many operands are one row (N0 ... N4); others a list


def node_term(op: int, key: str, children: list[str]) -> str:
    """The egglog term (or pattern) of an e-node: op number ``op``, op key ``key`` (a number or
    a pattern variable), operand terms ``children``."""
    if len(children) <= MAX_FLAT_ARITY:
        return f"(N{len(children)} {op} {key}{''.join(' ' + c for c in children)})"
    args = "(Nil)"
    for c in reversed(children):
        args = f"(Cons {c} {args})"
    return f"(Node {op} {key} {args})"

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
    # match relation -> the rows egglog recorded since the last snapshot (a row a union changed
    # is new), classes named as this snapshot names them
    rows: dict[str, list[tuple]] = field(default_factory=dict)

    def __post_init__(self):
        self.size = sum(len(ns) for ns in self.classes.values())  # e-nodes

    def find(self, ref: int) -> int:
        return self.canonical[ref]

    def is_tuple(self, cid: int) -> bool:
        return len(self.types[cid]) != 1


class Matching:
    """An egglog e-graph holding the schema and compiled rules (``(relation, class columns,
    program)``, and the op patterns ``fits`` their ``Fits`` facts number), made once per search:
    egglog takes about 1.5 ms to register a rule, and each region's :class:`EGraph` is a
    ``(push)`` of this one, popped when the region is done."""

    def __init__(self, programs: list[tuple[str, int, str]], fits: list):
        egglog = _bindings()
        if egglog is None:
            raise ImportError(MISSING)
        self.eg = egglog.EGraph()
        self.eg.run_program(*self.eg.parse_program(_SCHEMA))
        self.fits_by_op: dict[str, list[tuple[int, object]]] = {}  # op -> (Fits number, op pattern)
        for number, pat in enumerate(fits):
            self.fits_by_op.setdefault(pat.op, []).append((number, pat))
        self.relations = {relation: columns for relation, columns, _ in programs}
        for _, _, program in programs:
            self.eg.run_program(*self.eg.parse_program(program))
        self.push, self.pop = self.eg.parse_program("(push)"), self.eg.parse_program("(pop)")
        self.current: EGraph | None = None  # the e-graph pushed now (one at a time)


class EGraph:
    """The egglog e-graph plus the Python tables its numbers refer to: a push of ``matching``'s,
    whose rules' sites egglog records (``view.rows``), until :meth:`close` (use it as a context
    manager), or until another e-graph of ``matching`` is made."""

    def __init__(self, matching: Matching):
        if matching.current is not None:
            matching.current.close()
        matching.current = self
        self._matching, self.closed = matching, False
        self._eg = matching.eg
        self._eg.run_program(*matching.push)
        self._relations = matching.relations  # match relation -> how many of its columns are classes
        self.op_keys: list[tuple[str, tuple]] = []  # op key -> (op, sorted attribute pairs)
        self._op_key_of: dict[tuple[str, tuple], int] = {}
        self.leaves: list[tuple] = []  # leaf number -> (op, type, payload, node key, graph node id or None)
        self.node_ids: dict[int, int] = {}  # Ref of a loaded graph's op -> its node id in that graph
        self.ref_types: dict[int, tuple] = {}
        self.const_refs: set[int] = set()  # Refs named for constant leaves
        self._next_ref = 0
        self._batch: dict[str, list[tuple]] = {relation: [] for relation in LOADED}
        self._facts = 0  # terms named, unions and Fits facts in the batch
        self._next_list = 0
        self.view: EGraphView | None = None
        self._load = self._eg.parse_program("(run load 1)")
        self._match = self._eg.parse_program("(run match 1)")
        self._read_done = self._eg.parse_program("(run read 1)")

    def close(self) -> None:
        """Give the e-graph back to its :class:`Matching` (as it was before this one)."""
        if not self.closed:
            self._eg.run_program(*self._matching.pop)
            self._matching.current = None
        self.closed = True

    def __enter__(self) -> EGraph:
        return self

    def __exit__(self, *exc) -> None:
        self.close()

    # -- adding (batched until commit) ------------------------------------------------------
    def op_key(self, op: str, attrs: tuple) -> int:
        key = (op, attrs)
        k = self._op_key_of.get(key)
        if k is None:
            k = self._op_key_of[key] = len(self.op_keys)
            self.op_keys.append(key)
            for number, pat in self._matching.fits_by_op.get(op, ()):  # the op patterns whose own attributes it fits
                if attributes_matched(pat, attrs, {}) is not None:
                    self._batch["Fits"].append((number, k))
                    self._facts += 1
        return k

    def _name(self, relation: str, row: tuple, types: tuple) -> int:
        """A fresh Ref for the term ``row`` of the load relation ``relation`` describes."""
        ref = self._next_ref
        self._next_ref += 1
        self.ref_types[ref] = types
        self._batch[relation].append((ref,) + row)
        self._facts += 1
        return ref

    def add_leaf(self, op: str, ty: TensorType, payload, key, node_id: int | None) -> int:
        self.leaves.append((op, ty, payload, key, node_id))
        ref = self._name("AddLeaf", (len(self.leaves) - 1,), (ty,))
        if op == "const":
            self.const_refs.add(ref)
        return ref

    def add_node(self, op_key: int, children: tuple[int, ...], types: tuple) -> int:
        op = OP_NUMBERS.get(self.op_keys[op_key][0], -1)
        if len(children) <= MAX_FLAT_ARITY:
            return self._name(f"AddN{len(children)}", (op, op_key) + tuple(children), types)
        tail = -1  # (L -1) is (Nil)
        for c in reversed(children):
            self._batch["AddCons"].append((self._next_list, c, tail))
            tail, self._next_list = self._next_list, self._next_list + 1
        return self._name("AddNode", (op, op_key, tail), types)

    def add_get(self, tup: int, index: int, ty: TensorType) -> int:
        return self._name("AddGet", (tup, index), (ty,))

    def union(self, a: int, b: int) -> None:
        self._batch["Unite"].append((a, b))
        self._facts += 1

    def mark_loaded(self) -> None:
        """State ``(Orig c)`` for the class of every term named so far: the input graph's
        values, as the rules' merge filter reads them (:func:`.ematch.original_roots`)."""
        self._batch["AddOrig"].extend((ref,) for ref in range(self._next_ref))

    @property
    def pending(self) -> int:
        return self._facts

    def commit(self) -> EGraphView:
        """Send the batch to egglog, let it rebuild, and read the e-graph back."""
        if self.closed:
            raise RuntimeError("the e-graph was closed (another e-graph of its Matching was made)")
        if self._facts or self.view is None:
            # a folder per batch, removed once egglog has read it (a worker process ends without
            # running exit handlers, so nothing may outlive the batch)
            with tempfile.TemporaryDirectory(prefix="tvm-taso-egraph-") as folder:
                reads = []
                for relation, rows in self._batch.items():
                    if rows:
                        path = os.path.join(folder, f"{relation}.tsv")
                        with open(path, "w") as f:
                            f.write("".join("\t".join(map(str, row)) + "\n" for row in rows))
                        reads.append(f'(input {relation} "{path}")')
                        rows.clear()
                if reads:
                    self._eg.run_program(*self._eg.parse_program("\n".join(reads)))
            self._facts = 0
            self._eg.run_program(*self._load)
            self._eg.run_program(*self._match)
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

        def put(value, enode):
            cid = name_of[value]
            if enode not in class_of:
                class_of[enode] = cid
                classes[cid].append(enode)

        for r in functions["Leaf"].rows:
            put(r.output, ("leaf", as_int(r.inputs[0]), ()))
        for arity in range(MAX_FLAT_ARITY + 1):
            for r in functions[f"N{arity}"].rows:
                put(r.output, ("node", as_int(r.inputs[1]), tuple(name_of[v] for v in r.inputs[2:])))
        for r in functions["Node"].rows:
            put(r.output, ("node", as_int(r.inputs[1]), resolve(r.inputs[2])))
        for r in functions["Get"].rows:
            put(r.output, ("get", as_int(r.inputs[1]), (name_of[r.inputs[0]],)))
        types = {cid: self.ref_types[cid] for cid in classes}
        rows = {}
        named = name_of.__getitem__
        for relation, n in self._relations.items():  # map over builtins: hundreds of thousands of rows
            rows[relation] = [tuple(map(named, inputs[:n])) + tuple(map(as_int, inputs[n:]))
                              for inputs in (r.inputs for r in functions[relation].rows)]
        eg.run_program(*self._read_done)
        return EGraphView(classes, class_of, types, canonical, rows)
