"""Enumeration (TASO's ``dfs``): every graph of up to ``max_ops`` operator templates over a
domain's leaves, shape-checked symbolically (every size is a linear combination of the symbols'
codes, so no two sizes agree by accident) and fingerprinted; plus the small graph type the later
steps work on (:class:`SmallGraph`) and pairs of equivalent ones (:class:`Pair`).

Like TASO, a split only cuts a tensor at a boundary that a concat made (the cut point is tracked
through the ops as the tensor's concat pieces)."""

from __future__ import annotations

import itertools
import time
from collections import defaultdict
from dataclasses import dataclass

import numpy as np

from tvm_taso.generate.fingerprint import P, evaluate_mod_p, fingerprint
from tvm_taso.generate.search_space import (
    ALL_GROUPS,
    ENLARGE_PAD,
    GCONV_GROUPS,
    SIZE_BASE,
    TEMPLATES,
    Domain,
    OpTemplate,
    const_value,
    templates,
)


@dataclass(frozen=True)
class SmallGraph:
    """A graph of the enumeration as plain data: ``ops`` are ``(template name, (ref, ...))``, a
    ref is ``("L", leaf name)`` or ``(op position, output index)``; ``outs`` are refs and
    ``hashes`` their fingerprints."""

    domain: str
    ops: tuple
    outs: tuple
    hashes: tuple
    redundant: bool = False  # recomputes a value it already has

    @property
    def size(self) -> int:
        return len(self.ops)

    def leaves(self) -> list[str]:
        seen = []
        for r in self._refs():
            if r[0] == "L" and r[1] not in seen:
                seen.append(r[1])
        return seen

    def _refs(self):
        for _, refs in self.ops:
            yield from refs
        yield from self.outs

    def leaves_in_print_order(self) -> list[str]:
        """Leaves in the order a printer meets them (outputs in order, depth first)."""
        seen = []

        def visit(r):
            if r[0] == "L":
                if r[1] not in seen:
                    seen.append(r[1])
                return
            for x in self.ops[r[0]][1]:
                visit(x)

        for r in self.outs:
            visit(r)
        return seen

    def kinds(self) -> set:
        return {TEMPLATES[t].kind for t, _ in self.ops}

    def sortkey(self):
        return (len(self.ops), repr(self.ops), repr(self.outs))


@dataclass
class Pair:
    """Two graphs with equal fingerprints: output ``i`` of ``a`` equals output ``perm[i]`` of ``b``."""

    domain: str
    a: SmallGraph
    b: SmallGraph
    perm: tuple

    def kinds(self) -> set:
        return self.a.kinds() | self.b.kinds()

    def leaves(self) -> set:
        return set(self.a.leaves()) | set(self.b.leaves())


def align(a: SmallGraph, b: SmallGraph) -> tuple | None:
    """perm[i]: the output of ``b`` that equals output ``i`` of ``a`` (by fingerprint)."""
    if len(set(a.hashes)) != len(a.hashes) or sorted(a.hashes) != sorted(b.hashes):
        return None
    return tuple(b.hashes.index(h) for h in a.hashes)


# =============================================================================================
# The enumeration
# =============================================================================================


class Tensor:
    """A value in the enumeration pool."""

    __slots__ = ("arr", "dims", "parts", "role", "sig", "h", "leaf", "const")

    def __init__(self, arr, dims, parts, role, sig, leaf=-1, const=False, *, h=None):
        self.arr = arr
        self.dims = dims  # symbolic size codes
        self.parts = parts  # per dim: None or tuple of (code, size) pieces made by concat
        self.role = role
        self.sig = sig  # structural signature (op order key)
        self.leaf = leaf
        self.const = const
        self.h = fingerprint(arr, dims) if h is None else h


def _pieces(t: Tensor, axis: int):
    return t.parts[axis] if t.parts[axis] is not None else ((t.dims[axis], t.arr.shape[axis]),)


def _same_parts(a, b):
    return a if a == b else None


def half_cut(pieces) -> int | None:
    """How many of the concat ``pieces`` (``(code, size)``) make up exactly half of the whole
    (the cut a two-group conv needs there), or None."""
    if pieces is None:
        return None
    total, acc = sum(p[0] for p in pieces), 0
    for k, p in enumerate(pieces[:-1]):
        acc += p[0]
        if GCONV_GROUPS * acc == total:
            return k + 1
    return None


def _even(code: int) -> bool:
    """Whether a size code is a multiple of the group count in every symbol (not just here)."""
    while code:
        if code % SIZE_BASE % GCONV_GROUPS:
            return False
        code //= SIZE_BASE
    return True


def _check(t: OpTemplate, ins: list[Tensor]):
    """Symbolic shape check: (dims, parts, role, split point) of the output(s), or None."""
    if t.kind == "matmul":
        a, b = ins
        if len(a.dims) != 2 or len(b.dims) != 2 or a.dims[1] != b.dims[0]:
            return None
        role = "act" if "act" in (a.role, b.role) else "weight"
        return [((a.dims[0], b.dims[1]), (a.parts[0], b.parts[1]), role)], None
    if t.kind in ("conv", "dwconv"):
        x, w = ins
        if x.role != "act" or w.role != "weight" or len(x.dims) != 4 or len(w.dims) != 4:
            return None
        if w.dims[2:] != t.kernel:
            return None
        if t.kind == "conv" and x.dims[1] != w.dims[1]:
            return None
        if t.kind == "dwconv" and (w.dims[1] != 1 or w.dims[0] != x.dims[1]):
            return None
        return [((x.dims[0], w.dims[0], x.dims[2], x.dims[3]), (x.parts[0], w.parts[0], None, None), "act")], None
    if t.kind == "gconv":
        # the groups must be the halves a concat made, on the input channels and on the kernels
        x, w = ins
        if x.role != "act" or w.role != "weight" or len(x.dims) != 4 or len(w.dims) != 4 or w.dims[2:] != t.kernel:
            return None
        if x.dims[1] != GCONV_GROUPS * w.dims[1] or half_cut(x.parts[1]) is None or half_cut(w.parts[0]) is None:
            return None
        return [((x.dims[0], w.dims[0], x.dims[2], x.dims[3]), (x.parts[0], w.parts[0], None, None), "act")], None
    if t.kind == "pool":
        (x,) = ins
        if x.role != "act" or len(x.dims) != 4:
            return None
        return [(x.dims, (x.parts[0], x.parts[1], None, None), "act")], None
    if t.kind == "relu":
        (x,) = ins
        if x.role != "act":
            return None
        return [(x.dims, x.parts, "act")], None
    if t.kind in ("add", "mul"):
        a, b = ins
        if a.dims != b.dims or a.role != b.role or a.role == "scalar":
            return None
        return [(a.dims, tuple(_same_parts(p, q) for p, q in zip(a.parts, b.parts)), a.role)], None
    if t.kind == "smul":
        x, s = ins
        if s.role != "scalar" or x.role == "scalar":
            return None
        return [(x.dims, x.parts, x.role)], None
    if t.kind == "concat":
        a, b = ins
        ax = t.axis
        if len(a.dims) != len(b.dims) or ax >= len(a.dims) or a.role != b.role or a.role == "scalar":
            return None
        if any(a.dims[i] != b.dims[i] for i in range(len(a.dims)) if i != ax):
            return None
        dims = list(a.dims)
        dims[ax] = a.dims[ax] + b.dims[ax]
        parts = [_same_parts(p, q) for p, q in zip(a.parts, b.parts)]
        parts[ax] = _pieces(a, ax) + _pieces(b, ax)
        return [(tuple(dims), tuple(parts), a.role)], None
    if t.kind == "split":
        (x,) = ins
        ax = t.axis
        if ax >= len(x.dims) or x.parts[ax] is None:
            return None
        pieces = x.parts[ax]
        left, right = pieces[:-1], pieces[-1]
        lcode, lsize = sum(p[0] for p in left), sum(p[1] for p in left)
        d0, d1 = list(x.dims), list(x.dims)
        d0[ax], d1[ax] = lcode, right[0]
        p0, p1 = list(x.parts), list(x.parts)
        p0[ax] = left if len(left) >= 2 else None
        p1[ax] = None
        return [(tuple(d0), tuple(p0), x.role), (tuple(d1), tuple(p1), x.role)], lsize
    if t.kind == "transpose":
        (x,) = ins
        if len(x.dims) != 2:
            return None
        return [((x.dims[1], x.dims[0]), (x.parts[1], x.parts[0]), x.role)], None
    if t.kind == "enlarge":
        (w,) = ins
        if w.leaf < 0 or w.const or w.role != "weight" or len(w.dims) != 4 or w.dims[2:] not in ENLARGE_PAD:
            return None
        return [((w.dims[0], w.dims[1], 3, 3), (w.parts[0], w.parts[1], None, None), "weight")], None
    raise ValueError(t.kind)


def _input_choices(t: OpTemplate, pool: list[Tensor], index: dict):
    """Input tuples for ``t`` that can pass :func:`_check` (a superset), from an index of the
    pool by shape (see :func:`_index`)."""
    n = len(pool)
    if t.kind == "matmul":
        return [(i, j) for i in index["rank", 2] for j in index["d0", pool[i].dims[1]] if i != j]
    if t.kind in ("conv", "dwconv"):
        return [(i, j) for i in index["act4"] for j in index["w", pool[i].dims[1] if t.kind == "conv" else 1, t.kernel]]
    if t.kind == "gconv":
        return [(i, j) for i in index["act4"] if _even(pool[i].dims[1])
                for j in index["w", pool[i].dims[1] // GCONV_GROUPS, t.kernel]]
    if t.kind in ("add", "mul"):  # commutative: one order (TASO)
        out = []
        for group in index["same"].values():
            out += [(group[a], group[b]) for a in range(len(group)) for b in range(a + 1, len(group))]
        return sorted(out)
    if t.kind == "smul":
        return [(i, j) for i in range(n) if pool[i].role != "scalar" for j in index["scalar"]]
    if t.kind == "concat":
        out = []
        for (ax, _), group in index["off"].items():
            if ax == t.axis:
                out += [(i, j) for i in group for j in group if i != j]
        return sorted(out)
    if t.kind == "split":
        return [(i,) for i in range(n) if len(pool[i].dims) > t.axis and pool[i].parts[t.axis] is not None]
    if t.kind in ("pool",):
        return [(i,) for i in index["act4"]]
    if t.kind == "relu":
        return [(i,) for i in range(n) if pool[i].role == "act"]
    if t.kind == "transpose":
        return [(i,) for i in index["rank", 2]]
    if t.kind == "enlarge":
        return [(i,) for i in range(n) if pool[i].leaf >= 0 and pool[i].role == "weight"]
    raise ValueError(t.kind)


def _index(pool: list[Tensor]) -> dict:
    """Pool positions by rank, leading dim, conv role, scalar role, full shape ("same") and
    shape without one axis ("off"): the operand lists :func:`_input_choices` draws from."""
    index: dict = defaultdict(list)
    same: dict = defaultdict(list)
    off: dict = defaultdict(list)
    for i, x in enumerate(pool):
        r = len(x.dims)
        index["rank", r].append(i)
        if r == 2:
            index["d0", x.dims[0]].append(i)
        if r == 4 and x.role == "act":
            index["act4"].append(i)
        if r == 4 and x.role == "weight":
            index["w", x.dims[1], x.dims[2:]].append(i)
        if x.role == "scalar":
            index["scalar"].append(i)
        else:
            same[x.dims, x.role].append(i)
            for ax in range(r):
                off[(ax, (x.role, r, x.dims[:ax] + x.dims[ax + 1:]))].append(i)
    index["same"] = same
    index["off"] = off
    return index


@dataclass
class EnumConfig:
    max_ops: int = 3
    groups: tuple = ALL_GROUPS
    seed: int = 0
    max_outputs: int = 2
    parallel: bool = True  # also record two ops of one template on disjoint inputs (TASO does)


class Enumerator:
    """Depth-first enumeration of one domain (TASO's ``dfs``), with fingerprints."""

    def __init__(self, domain: Domain, cfg: EnumConfig):
        self.domain = domain
        self.cfg = cfg
        self.templates = templates({domain.name}, set(cfg.groups))
        rng = np.random.default_rng([cfg.seed, sum(map(ord, domain.name))])
        self.leaves = [lf for lf in domain.leaves if lf.const is None or "const" in cfg.groups]
        if "scalar" not in cfg.groups:
            self.leaves = [lf for lf in self.leaves if lf.role != "scalar"]
        self.base: list[Tensor] = []
        for li, lf in enumerate(self.leaves):
            shape = tuple(domain.size(d) for d in lf.dims)
            arr = const_value(lf, shape) if lf.const else rng.integers(0, P, size=shape, dtype=np.int64)
            dims = tuple(domain.code(d) for d in lf.dims)
            self.base.append(Tensor(arr, dims, (None,) * len(dims), lf.role, (0, li), leaf=li, const=bool(lf.const)))
        self.records: list = []  # (fingerprint key, ops, outs, output fingerprints, redundant)
        self.nodes = 0
        self.deadline = None
        self.stopped = False
        # (template, operand fingerprints, split) -> outputs' (residues, fingerprint), for every run
        self.values: dict = {}

    # first-level choices: the unit of parallel work
    def first_ops(self) -> list:
        out = []
        pool = self.base
        index = _index(pool)
        for ti, t in enumerate(self.templates):
            for ins in _input_choices(t, pool, index):
                if _check(t, [pool[i] for i in ins]) is not None:
                    out.append((ti, ins))
        return out

    def run(self, first: tuple | None = None, deadline: float | None = None):
        self.deadline = deadline
        self.records = []
        self.nodes = 0
        self.stopped = False
        self.pool = list(self.base)
        self.uses = [0] * len(self.pool)
        self.ops: list = []  # (ti, ins, outs, opsig)
        self.sigs: set = set()
        self.hashes = {t.h: i for i, t in enumerate(self.pool)}
        self.comps: list = []  # sets of pool indices, one per connected component
        self.dangling = 0  # op outputs no op reads
        self.dup_depth = 0  # ops so far whose output equals an earlier tensor
        if first is None:
            self._expand()
        else:
            self._try(*first)
        return self.records

    def _try(self, ti: int, ins: tuple) -> None:
        t = self.templates[ti]
        args = [self.pool[i] for i in ins]
        opsig = (ti, tuple(a.sig for a in args))
        if opsig in self.sigs:
            return
        # canonical order of independent ops: a new op that does not read the previous op's
        # outputs must sort after it
        if self.ops:
            prev = self.ops[-1]
            if not any(i in prev[2] for i in ins) and opsig <= prev[3]:
                return
        chk = _check(t, args)
        if chk is None:
            return
        outs, split_at = chk
        # structure after this op: can it be recorded or extended at all?
        base = len(self.pool)
        out_idx = tuple(range(base, base + len(outs)))
        touching = [c for c in self.comps if any(i in c for i in ins)]
        comps = [c for c in self.comps if not any(i in c for i in ins)]
        merged = set(ins).union(out_idx, *touching)
        comps.append(merged)
        nb = len(self.base)
        dangling = self.dangling + len(outs) - len({i for i in ins if i >= nb and self.uses[i] == 0})
        left = self.cfg.max_ops - len(self.ops) - 1
        recordable = 1 <= dangling <= self.cfg.max_outputs and (len(comps) == 1 or self._parallel(ti, len(outs), comps))
        extendable = left > 0 and len(comps) - 1 <= left and dangling - left <= self.cfg.max_outputs
        if not (recordable or extendable):
            return
        values = self._values(ti, args, split_at, outs)
        if values is None:
            return
        self.nodes += 1
        if self.deadline is not None and self.nodes % 512 == 0 and time.monotonic() > self.deadline:
            self.stopped = True
        new = []
        dup = False
        for k, ((dims, parts, role), (arr, h)) in enumerate(zip(outs, values)):
            tt = Tensor(arr, dims, parts, role, (1, opsig, k), h=h)
            if tt.h in self.hashes:
                dup = True
            new.append(tt)
        old_comps, old_dangling = self.comps, self.dangling
        self.comps, self.dangling = comps, dangling
        self.dup_depth += dup
        for i in ins:
            self.uses[i] += 1
        self.pool.extend(new)
        self.uses.extend([0] * len(new))
        self.ops.append((ti, ins, out_idx, opsig))
        self.sigs.add(opsig)
        added = []
        for k, tt in enumerate(new):
            if tt.h not in self.hashes:
                self.hashes[tt.h] = base + k
                added.append(tt.h)
        self._visit(dup, recordable, extendable)
        self.dup_depth -= dup
        self.comps, self.dangling = old_comps, old_dangling
        for h in added:
            del self.hashes[h]
        self.sigs.discard(opsig)
        self.ops.pop()
        del self.pool[base:]
        del self.uses[base:]
        for i in ins:
            self.uses[i] -= 1

    def _values(self, ti: int, args: list, split_at, outs) -> list | None:
        """Each output's residues and fingerprint, or None where the op is undefined on them. An
        op on the same values recurs across the search: each first op's subtree (a run) applies
        the other first ops again, so results are kept for every run (within one run they
        rarely recur: 42.6 s against 57.8 s for a 3-op conv generation, +13% memory)."""
        key = (ti, tuple(a.h for a in args), split_at)
        if key not in self.values:
            try:
                arrs = evaluate_mod_p(self.templates[ti], [a.arr for a in args], split_at)
            except ValueError:
                self.values[key] = None
            else:
                self.values[key] = [(arr, fingerprint(arr, dims)) for (dims, _, _), arr in zip(outs, arrs)]
        return self.values[key]

    def _visit(self, dup: bool, recordable: bool, extendable: bool) -> None:
        if recordable:
            nb = len(self.base)
            outputs = [i for i in range(nb, len(self.pool)) if self.uses[i] == 0]
            hs = tuple(self.pool[i].h for i in outputs)
            ops_, outs = self.graph(outputs)
            # a graph that recomputes a value it already has (TASO drops these) is kept only
            # to be paired with a graph of inputs alone: split(concat(a, b)) = a, b
            self.records.append((tuple(sorted(hs)), ops_, outs, hs, self.dup_depth > 0))
        if extendable and not dup and not self.stopped:
            self._expand()

    def _parallel(self, ti: int, n_outs: int, comps: list) -> bool:
        """Whether the graph with op ``ti`` added is two ops of one template on disjoint
        inputs, one output each: the source of a rule like ``relu(a), relu(b) =>
        split(relu(concat(a, b)))``, whose outputs share no input (the only disconnected
        graphs recorded, so that a matcher looks at pairs of same-op nodes only)."""
        return (self.cfg.parallel and len(comps) == 2 and len(self.ops) == 1 and self.ops[0][0] == ti
                and n_outs == 1 and len(self.ops[0][2]) == 1)

    def _expand(self) -> None:
        index = _index(self.pool)
        # the last op must join every component (a recorded graph is connected, or a parallel pair)
        comps = self.comps if len(self.ops) + 1 == self.cfg.max_ops else ()
        for ti, t in enumerate(self.templates):
            for ins in _input_choices(t, self.pool, index):
                if comps and not all(any(i in c for i in ins) for c in comps) and not (
                    len(self.ops) == 1 and self.ops[0][0] == ti and self.cfg.parallel
                ):
                    continue
                if self.stopped:
                    return
                self._try(ti, ins)

    def graph(self, outputs) -> tuple:
        """The current graph as plain data: ``(ops, outs)`` with ops ``((template name, (ref,
        ...)), ...)``; a ref is ``("L", leaf name)`` or ``(op position, output index)``."""
        where = {}
        for k, (_, _, outs, _) in enumerate(self.ops):
            for j, i in enumerate(outs):
                where[i] = (k, j)
        g = []
        for ti, ins, _, _ in self.ops:
            refs = tuple(("L", self.leaves[i].name) if i < len(self.base) else where[i] for i in ins)
            g.append((self.templates[ti].name, refs))
        return tuple(g), tuple(where[i] for i in outputs)


def leaf_graphs(domain: Domain, cfg: EnumConfig) -> list:
    """Graphs of leaves alone (one or two outputs, no op), keyed by fingerprint like the
    enumeration's records: what a graph that recomputes its inputs pairs with."""
    e = Enumerator(domain, cfg)
    out = []
    for t in e.base:
        name = e.leaves[t.leaf].name
        out.append(((t.h,), SmallGraph(domain.name, (), (("L", name),), (t.h,))))
    for s, t in itertools.combinations(e.base, 2):
        a, b = e.leaves[s.leaf].name, e.leaves[t.leaf].name
        out.append((tuple(sorted((s.h, t.h))), SmallGraph(domain.name, (), (("L", a), ("L", b)), (s.h, t.h))))
    return out
