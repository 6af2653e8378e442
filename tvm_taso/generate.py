"""The rule generator: TASO's substitution generator, writing tvm-taso's rule language.

``tvm-taso rules generate [--max-ops 3] [--ops ...] [--time-limit S] [-o FILE]``

1. **Enumerate** every graph of up to ``max_ops`` operators over TASO's operator set mapped to
   Relax ops (conv2d 1x1/3x3/1x3/3x1 with and without a fused relu, matmul, add, multiply,
   scalar multiply, relu, concat and split on axes 0/1, transpose, avg/max pool 3x3, enlarge)
   on a few small input tensors of *symbolic* sizes (two domains: matrices ``n x k`` / ``k x k``
   and NCHW activations with OIHW kernels), plus TASO's constants (identity matrix, identity
   conv kernel, ones, pooling kernel). Shapes are checked symbolically (every size is a linear
   expression of the symbols), so no two sizes agree by accident. Like TASO, a split only cuts a
   tensor at a boundary that a concat made (the cut point is tracked through the ops).
2. **Fingerprint** each graph's outputs (every output no op of the graph consumes; one or two
   of them) with exact integer arithmetic modulo the prime ``P`` (ReLU replaced by TASO's
   polynomial ``x(x+1)+1``, average pooling as a window sum times the modular inverse of the
   window count, max pooling as the max of residues), group graphs with equal fingerprints and
   pair each with the smallest graph of its group (TASO's pairing), then **confirm** every pair
   with a float64 test on random data using the reference semantics of :mod:`tvm_taso.ops`.
3. **Prune** (counts after each step are reported): identical graphs; TASO's common-subgraph
   test (both sides apply the same op to the same inputs; a fused conv+relu contains its conv)
   and common-supergraph test (same op on both sides over a smaller equivalent pair); input
   renamings (one pair per class of renamings, output orders and add/multiply operand orders;
   a two-output pair that equals itself renamed only reorders outputs and is dropped); graphs
   that recompute a value they already have pair only with inputs alone (``split(concat(a, b))
   = a, b``; TASO drops them outright); pairs the rule language cannot state (TASO's constants
   have no spelling in it); rules whose text repeats another's up to variable names; and rules
   that up to three applications of smaller rules reproduce on an instance, up to the operand
   order of add/multiply (checked with the rule engine itself).
4. **Emit** both directions of each pair by default (``--one-direction``: only smaller graph ->
   larger, the direction TASO stores), each rule general in its shapes: tensor sizes are
   unknowns, the linear constraints both graphs put on them are solved, and only constraints the
   rule engine does not enforce by itself (it checks matmul/conv/concat operands and equal output
   shapes, but add/multiply broadcast) become conditions; a split's cut point is a ``dim``
   expression. Every emitted rule is parsed back and checked numerically on two instances with
   random sizes by matching and applying it with :mod:`tvm_taso.match` (proof status ``checked``).

Deterministic for a given seed; uses a process pool (2 workers by default).
"""

from __future__ import annotations

import argparse
import itertools
import math
import multiprocessing as mp
import sys
import time
from collections import Counter, defaultdict
from dataclasses import dataclass, field
from fractions import Fraction

import numpy as np

from . import ops as _ops

P = 33554393  # the largest prime below 2**25: products of two residues fit in 2**50
_B = 1 << 12  # base of the symbolic size codes used while enumerating


# =============================================================================================
# Domains: the leaves (inputs and constants) and the symbolic sizes
# =============================================================================================


@dataclass(frozen=True)
class Leaf:
    name: str
    role: str  # "act", "weight", "scalar"
    dims: tuple  # each a symbol name or a literal int
    const: str | None = None  # TASO constant kind, or None for an input


@dataclass(frozen=True)
class Domain:
    name: str
    symbols: dict  # symbol -> concrete size used for fingerprints and the float check
    leaves: tuple

    def code(self, d) -> int:
        """Symbolic size code of a leaf dim: a literal, or B**(symbol index + 1)."""
        if isinstance(d, int):
            return d
        return _B ** (list(self.symbols).index(d) + 1)

    def size(self, d) -> int:
        return d if isinstance(d, int) else self.symbols[d]


def _domains(constants: bool) -> list[Domain]:
    mat = [
        Leaf("x1", "act", ("n", "k")),
        Leaf("x2", "act", ("n", "k")),
        Leaf("x3", "act", ("n", "k")),
        Leaf("w1", "weight", ("k", "k")),
        Leaf("w2", "weight", ("k", "k")),
        Leaf("w3", "weight", ("k", "k")),
        Leaf("s", "scalar", ()),
    ]
    conv = [
        Leaf("i1", "act", ("N", "C", "H", "W")),
        Leaf("i2", "act", ("N", "C", "H", "W")),
        Leaf("i3", "act", ("N", "C", "H", "W")),
        Leaf("k1", "weight", ("C", "C", 3, 3)),
        Leaf("k2", "weight", ("C", "C", 3, 3)),
        Leaf("k3", "weight", ("C", "C", 3, 3)),
        Leaf("h1", "weight", ("C", "C", 1, 3)),
        Leaf("h2", "weight", ("C", "C", 1, 3)),
        Leaf("v1", "weight", ("C", "C", 3, 1)),
        Leaf("v2", "weight", ("C", "C", 3, 1)),
        Leaf("p1", "weight", ("C", "C", 1, 1)),
        Leaf("p2", "weight", ("C", "C", 1, 1)),
        Leaf("s", "scalar", ()),
    ]
    if constants:
        mat.append(Leaf("imm", "weight", ("k", "k"), const="identity-matrix"))
        conv += [
            Leaf("iconv", "weight", ("C", "C", 3, 3), const="identity-conv"),
            Leaf("ones", "act", ("N", "C", "H", "W"), const="ones"),
            Leaf("poolk", "weight", ("C", 1, 3, 3), const="pool-kernel"),
        ]
    return [
        Domain("mat", {"n": 2, "k": 3}, tuple(mat)),
        Domain("conv", {"N": 1, "C": 2, "H": 4, "W": 5}, tuple(conv)),
    ]


def _const_value(leaf: Leaf, shape: tuple) -> np.ndarray:
    if leaf.const == "identity-matrix":
        return np.eye(shape[0], dtype=np.int64)
    if leaf.const == "identity-conv":
        v = np.zeros(shape, dtype=np.int64)
        for c in range(shape[0]):
            v[c, c, shape[2] // 2, shape[3] // 2] = 1
        return v
    if leaf.const in ("ones", "pool-kernel"):
        return np.ones(shape, dtype=np.int64)
    raise ValueError(leaf.const)


# =============================================================================================
# Operator templates
# =============================================================================================

SAME_PAD = {(1, 1): (0, 0, 0, 0), (3, 3): (1, 1, 1, 1), (1, 3): (0, 1, 0, 1), (3, 1): (1, 0, 1, 0)}
ENLARGE_PAD = {(1, 1): (0, 0, 0, 0, 1, 1, 1, 1), (1, 3): (0, 0, 0, 0, 1, 1, 0, 0), (3, 1): (0, 0, 0, 0, 0, 0, 1, 1)}


@dataclass(frozen=True)
class OpT:
    """One operator of the enumeration (TASO's OpTemp): ``kind`` says how it checks shapes and
    computes; ``group`` is the name ``--ops`` selects it by."""

    name: str
    kind: str  # matmul conv dwconv pool relu add mul smul concat split transpose enlarge
    group: str
    arity: int
    kernel: tuple = ()  # conv kernel (kh, kw)
    relu: bool = False  # conv with a fused relu
    axis: int = 0  # concat / split axis
    pool: str = ""  # "avg" / "max"
    domain: str = ""  # only in this domain ("" both)


def _templates(domains_used: set[str], groups: set[str]) -> list[OpT]:
    ts = [OpT("matmul", "matmul", "matmul", 2, domain="mat")]
    for k in ((1, 1), (3, 3), (1, 3), (3, 1)):
        for r in (False, True):
            ts.append(OpT(f"conv{k[0]}x{k[1]}{'r' if r else ''}", "conv", "conv2d", 2, kernel=k, relu=r, domain="conv"))
    ts.append(OpT("dwconv3x3", "dwconv", "const", 2, kernel=(3, 3), domain="conv"))
    ts += [
        OpT("avgpool", "pool", "pool", 1, pool="avg", domain="conv"),
        OpT("maxpool", "pool", "pool", 1, pool="max", domain="conv"),
        OpT("enlarge", "enlarge", "enlarge", 1, domain="conv"),
        OpT("relu", "relu", "relu", 1),
        OpT("add", "add", "add", 2),
        OpT("mul", "mul", "multiply", 2),
        OpT("smul", "smul", "scalar", 2),
        OpT("concat0", "concat", "concat", 2, axis=0),
        OpT("concat1", "concat", "concat", 2, axis=1),
        OpT("split0", "split", "split", 1, axis=0),
        OpT("split1", "split", "split", 1, axis=1),
        OpT("transpose", "transpose", "transpose", 1, domain="mat"),
    ]
    return [t for t in ts if t.group in groups and (not t.domain or t.domain in domains_used)]


ALL_GROUPS = ("matmul", "conv2d", "add", "multiply", "scalar", "relu", "concat", "split", "transpose", "pool",
              "enlarge", "const")


# =============================================================================================
# Integer (fingerprint) semantics
# =============================================================================================


def _windows(x, kh, kw):
    n, c, h, w = x.shape
    s = x.strides
    return np.lib.stride_tricks.as_strided(
        x, shape=(n, c, h - kh + 1, w - kw + 1, kh, kw), strides=(s[0], s[1], s[2], s[3], s[2], s[3]), writeable=False
    )


def _pad_hw(x, pad, value=0):
    t, l, b, r = pad
    n, c, h, w = x.shape
    out = np.full((n, c, h + t + b, w + l + r), value, dtype=x.dtype)
    out[:, :, t:t + h, l:l + w] = x
    return out


def _relu_poly(x):
    return (x * (x + 1) + 1) % P


def _int_conv(x, w, pad, groups=1):
    xp = np.ascontiguousarray(_pad_hw(x, pad))
    o, i, kh, kw = w.shape
    win = _windows(xp, kh, kw)
    og = o // groups
    outs = []
    for g in range(groups):
        outs.append(np.einsum("nchwij,ocij->nohw", win[:, g * i:(g + 1) * i], w[g * og:(g + 1) * og]) % P)
    return np.concatenate(outs, axis=1) if groups > 1 else outs[0]


_INV_CACHE: dict = {}


def _inv_counts(h, w):
    key = (h, w)
    if key not in _INV_CACHE:
        ones = _pad_hw(np.ones((1, 1, h, w), dtype=np.int64), (1, 1, 1, 1))
        cnt = _windows(np.ascontiguousarray(ones), 3, 3).sum(axis=(4, 5))
        _INV_CACHE[key] = np.vectorize(lambda c: pow(int(c), P - 2, P))(cnt).astype(np.int64)
    return _INV_CACHE[key]


def _int_eval(t: OpT, arrays, split_at=None):
    if t.kind == "matmul":
        return [(arrays[0] @ arrays[1]) % P]
    if t.kind == "conv":
        y = _int_conv(arrays[0], arrays[1], SAME_PAD[t.kernel])
        return [_relu_poly(y) if t.relu else y]
    if t.kind == "dwconv":
        return [_int_conv(arrays[0], arrays[1], SAME_PAD[t.kernel], groups=arrays[0].shape[1])]
    if t.kind == "pool":
        x = arrays[0]
        if t.pool == "avg":
            s = _windows(np.ascontiguousarray(_pad_hw(x, (1, 1, 1, 1))), 3, 3).sum(axis=(4, 5)) % P
            return [(s * _inv_counts(x.shape[2], x.shape[3])) % P]
        return [_windows(np.ascontiguousarray(_pad_hw(x, (1, 1, 1, 1), -1)), 3, 3).max(axis=(4, 5))]
    if t.kind == "relu":
        return [_relu_poly(arrays[0])]
    if t.kind == "add":
        return [(arrays[0] + arrays[1]) % P]
    if t.kind in ("mul", "smul"):
        return [(arrays[0] * arrays[1]) % P]
    if t.kind == "concat":
        return [np.concatenate(arrays, axis=t.axis)]
    if t.kind == "split":
        return np.split(arrays[0], [split_at], axis=t.axis)
    if t.kind == "transpose":
        return [np.ascontiguousarray(arrays[0].T)]
    if t.kind == "enlarge":
        pw = ENLARGE_PAD[arrays[0].shape[2:]]
        return [np.pad(arrays[0], [(pw[2 * i], pw[2 * i + 1]) for i in range(4)])]
    raise ValueError(t.kind)


# =============================================================================================
# Enumeration (TASO's dfs)
# =============================================================================================


class Tensor:
    """A value in the enumeration pool."""

    __slots__ = ("arr", "dims", "parts", "role", "sig", "h", "leaf", "const")

    def __init__(self, arr, dims, parts, role, sig, leaf=-1, const=False):
        self.arr = arr
        self.dims = dims  # symbolic size codes
        self.parts = parts  # per dim: None or tuple of (code, size) pieces made by concat
        self.role = role
        self.sig = sig  # structural signature (op order key)
        self.leaf = leaf
        self.const = const
        self.h = _fingerprint(arr, dims)


_HASH_KEYS = np.random.default_rng(20190527).integers(1, 2**63, size=4096, dtype=np.int64).astype(np.uint64) | 1


def _fingerprint(arr, dims) -> int:
    """64-bit fingerprint of a tensor's residues and symbolic shape (a random linear hash,
    wrapping mod 2**64; the keys are fixed, so it is the same in every process)."""
    flat = arr.reshape(-1).astype(np.uint64)
    with np.errstate(over="ignore"):
        h = int((flat * _HASH_KEYS[: flat.size]).sum())
    return (h ^ (hash(dims) & 0xFFFFFFFFFFFFFFFF) * 0x9E3779B97F4A7C15 ^ flat.size) & 0xFFFFFFFFFFFFFFFF


def _pieces(t: Tensor, axis: int):
    return t.parts[axis] if t.parts[axis] is not None else ((t.dims[axis], t.arr.shape[axis]),)


def _same_parts(a, b):
    return a if a == b else None


def _check(t: OpT, ins: list[Tensor]):
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


def _input_choices(t: OpT, pool: list[Tensor], index: dict | None = None):
    """Input tuples for ``t`` that can pass :func:`_check` (a superset), from an index of the
    pool by shape (see :func:`_index`)."""
    n = len(pool)
    if index is None:
        index = _index(pool)
    if t.kind == "matmul":
        return [(i, j) for i in index["rank", 2] for j in index["d0", pool[i].dims[1]] if i != j]
    if t.kind in ("conv", "dwconv"):
        return [(i, j) for i in index["act4"] for j in index["w", pool[i].dims[1] if t.kind == "conv" else 1, t.kernel]]
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
    return [(i,) for i in range(n)] if t.arity == 1 else [(i, j) for i in range(n) for j in range(n) if i != j]


def _index(pool: list[Tensor]) -> dict:
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


class Enumerator:
    """Depth-first enumeration of one domain (TASO's ``dfs``), with fingerprints."""

    def __init__(self, domain: Domain, cfg: EnumConfig):
        self.domain = domain
        self.cfg = cfg
        self.templates = _templates({domain.name}, set(cfg.groups))
        rng = np.random.default_rng([cfg.seed, sum(map(ord, domain.name))])
        self.leaves = [lf for lf in domain.leaves if lf.const is None or "const" in cfg.groups]
        if "scalar" not in cfg.groups:
            self.leaves = [lf for lf in self.leaves if lf.role != "scalar"]
        self.base: list[Tensor] = []
        for li, lf in enumerate(self.leaves):
            shape = tuple(domain.size(d) for d in lf.dims)
            arr = _const_value(lf, shape) if lf.const else rng.integers(0, P, size=shape, dtype=np.int64)
            dims = tuple(domain.code(d) for d in lf.dims)
            self.base.append(Tensor(arr, dims, (None,) * len(dims), lf.role, (0, li), leaf=li, const=bool(lf.const)))
        self.records: list = []  # (key, graph)
        self.nodes = 0
        self.deadline = None
        self.stopped = False

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
        recordable = 1 <= dangling <= self.cfg.max_outputs and len(comps) == 1
        extendable = left > 0 and len(comps) - 1 <= left and dangling - left <= self.cfg.max_outputs
        if not (recordable or extendable):
            return
        try:
            arrs = _int_eval(t, [a.arr for a in args], split_at)
        except ValueError:
            return
        self.nodes += 1
        if self.deadline is not None and self.nodes % 512 == 0 and time.monotonic() > self.deadline:
            self.stopped = True
        new = []
        dup = False
        for k, ((dims, parts, role), arr) in enumerate(zip(outs, arrs)):
            tt = Tensor(arr, dims, parts, role, (1, opsig, k))
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

    def _expand(self) -> None:
        index = _index(self.pool)
        # the last op must join every component (a recorded graph is connected)
        comps = self.comps if len(self.ops) + 1 == self.cfg.max_ops else ()
        for ti, t in enumerate(self.templates):
            for ins in _input_choices(t, self.pool, index):
                if comps and not all(any(i in c for i in ins) for c in comps):
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


# =============================================================================================
# Symbolic sizes for emission: linear expressions over the leaves' dims
# =============================================================================================


class LE:
    """A linear expression over atoms ``(leaf name, axis)`` with integer coefficients."""

    __slots__ = ("t", "c")

    def __init__(self, terms=(), c=0):
        self.t = tuple(sorted((a, k) for a, k in terms if k))
        self.c = c

    @staticmethod
    def atom(a) -> LE:
        return LE(((a, 1),))

    @staticmethod
    def lit(c: int) -> LE:
        return LE((), c)

    def _merge(self, other, sign):
        if isinstance(other, int):
            other = LE.lit(other)
        d = dict(self.t)
        for a, k in other.t:
            d[a] = d.get(a, 0) + sign * k
        return LE(d.items(), self.c + sign * other.c)

    def __add__(self, o):
        return self._merge(o, 1)

    def __sub__(self, o):
        return self._merge(o, -1)

    def __neg__(self):
        return LE(((a, -k) for a, k in self.t), -self.c)

    def __eq__(self, o):
        return isinstance(o, LE) and self.t == o.t and self.c == o.c

    def __hash__(self):
        return hash((self.t, self.c))

    def __repr__(self):
        return " + ".join([f"{k}*{a[0]}.{a[1]}" for a, k in self.t] + [str(self.c)])

    def is_zero(self) -> bool:
        return not self.t and self.c == 0

    def value(self, env: dict) -> int:
        return self.c + sum(k * env[a] for a, k in self.t)

    def atoms(self):
        return [a for a, _ in self.t]


class Inexpressible(Exception):
    """A graph the rule language cannot state (TASO's constants, a bare leaf as a source)."""


@dataclass
class Shapes:
    """What :func:`walk` found: dims and concat pieces of every ref, constraint equations
    (``LE == 0``) and each split's cut point."""

    dims: dict = field(default_factory=dict)
    parts: dict = field(default_factory=dict)
    strict: list = field(default_factory=list)  # enforced by the rule engine's shape checks
    needed: list = field(default_factory=list)  # must be stated as conditions unless implied
    # add/multiply broadcast in Relax: their operands' equal shapes are conditions that only
    # equations not derived through an add/multiply output ("pure" ones) may make redundant
    tainted: dict = field(default_factory=dict)  # ref -> dims derived through add/multiply
    pure: list = field(default_factory=list)  # strict equations over untainted dims
    broadcast: list = field(default_factory=list)  # add/multiply operand equalities
    split_at: dict = field(default_factory=dict)  # op position -> LE
    rank4: set = field(default_factory=set)  # leaves read directly by conv2d/pool (rank implied)


def _leaf_of(domain: Domain, name: str) -> Leaf:
    for lf in domain.leaves:
        if lf.name == name:
            return lf
    raise KeyError(name)


def _codes(domain: Domain) -> dict:
    """Atom -> symbolic size code (how the enumeration compared sizes)."""
    out = {}
    for lf in domain.leaves:
        for i, d in enumerate(lf.dims):
            out[(lf.name, i)] = domain.code(d)
    return out


TEMPLATES = {t.name: t for t in _templates({"mat", "conv"}, set(ALL_GROUPS))}


def walk(domain: Domain, ops_: tuple, codes: dict, sh: Shapes | None = None, tag: str = "") -> Shapes:
    """Symbolic shapes of a graph (``tag`` keeps two graphs' refs apart in one :class:`Shapes`)."""
    sh = sh or Shapes()

    def code(e: LE) -> int:
        return e.c + sum(k * codes[a] for a, k in e.t)

    def same(p, q):
        if p is None or q is None:
            return None
        return p if len(p) == len(q) and all(code(a) == code(b) for a, b in zip(p, q)) else None

    def get(ref):
        if ref[0] == "L":
            lf = _leaf_of(domain, ref[1])
            key = ("L", ref[1])
            if key not in sh.dims:
                sh.dims[key] = tuple(LE.atom((lf.name, i)) for i in range(len(lf.dims)))
                sh.parts[key] = (None,) * len(lf.dims)
                sh.tainted[key] = False
            return key
        return (tag, ref)

    for pos, (tname, refs) in enumerate(ops_):
        t = TEMPLATES[tname]
        keys = [get(r) for r in refs]
        d = [sh.dims[k] for k in keys]
        pp = [sh.parts[k] for k in keys]
        taint = any(sh.tainted[k] for k in keys)
        n_strict = len(sh.strict)
        outs = []
        if t.kind == "matmul":
            sh.strict.append(d[0][1] - d[1][0])
            outs.append(((d[0][0], d[1][1]), (pp[0][0], pp[1][1])))
        elif t.kind in ("conv", "dwconv"):
            x, w = d
            kh, kw = t.kernel
            pt, pl, pb, pr = SAME_PAD[t.kernel]
            if t.kind == "conv":
                sh.strict.append(x[1] - w[1])
            else:
                sh.needed.append(w[1] - 1)
                sh.needed.append(w[0] - x[1])
            sh.needed += [w[2] - kh, w[3] - kw]
            outs.append(((x[0], w[0], x[2] + (pt + pb + 1) - w[2], x[3] + (pl + pr + 1) - w[3]),
                         (pp[0][0], pp[1][0], None, None)))
            for r in refs:
                if r[0] == "L":
                    sh.rank4.add(r[1])
        elif t.kind == "pool":
            outs.append((d[0], (pp[0][0], pp[0][1], None, None)))
            if refs[0][0] == "L":
                sh.rank4.add(refs[0][1])
        elif t.kind in ("relu", "smul"):
            outs.append((d[0], pp[0]))
        elif t.kind in ("add", "mul"):
            sh.broadcast += [a - b for a, b in zip(d[0], d[1])]
            taint = True
            outs.append((d[0], tuple(same(p, q) for p, q in zip(pp[0], pp[1]))))
        elif t.kind == "concat":
            ax = t.axis
            sh.strict += [d[0][i] - d[1][i] for i in range(len(d[0])) if i != ax]
            dims = list(d[0])
            dims[ax] = d[0][ax] + d[1][ax]
            parts = [same(p, q) for p, q in zip(pp[0], pp[1])]
            parts[ax] = (pp[0][ax] or (d[0][ax],)) + (pp[1][ax] or (d[1][ax],))
            outs.append((tuple(dims), tuple(parts)))
        elif t.kind == "split":
            ax = t.axis
            pieces = pp[0][ax]
            left, right = pieces[:-1], pieces[-1]
            cut = left[0]
            for q in left[1:]:
                cut = cut + q
            sh.split_at[(tag, pos)] = cut
            d0, d1 = list(d[0]), list(d[0])
            d0[ax], d1[ax] = cut, right
            p0, p1 = list(pp[0]), list(pp[0])
            p0[ax] = left if len(left) >= 2 else None
            p1[ax] = None
            outs += [(tuple(d0), tuple(p0)), (tuple(d1), tuple(p1))]
        elif t.kind == "transpose":
            outs.append(((d[0][1], d[0][0]), (pp[0][1], pp[0][0])))
        elif t.kind == "enlarge":
            w = d[0]
            kh0, kw0 = code(w[2]), code(w[3])
            pw = ENLARGE_PAD[(kh0, kw0)]
            sh.needed += [w[2] - kh0, w[3] - kw0]
            dims = (w[0], w[1], w[2] + (pw[4] + pw[5]), w[3] + (pw[6] + pw[7]))
            outs.append((dims, (pp[0][0], pp[0][1], None, None)))
        else:
            raise ValueError(t.kind)
        if not taint:
            sh.pure += sh.strict[n_strict:]
        for j, (dims, parts) in enumerate(outs):
            sh.dims[(tag, (pos, j))] = dims
            sh.parts[(tag, (pos, j))] = parts
            sh.tainted[(tag, (pos, j))] = taint
    return sh


def _steps(t: OpT, split_at=None) -> list:
    """The Relax ops (name, attrs) an enumeration op stands for, applied in sequence."""
    if t.kind == "matmul":
        return [("matmul", {})]
    if t.kind == "conv":
        st = [("conv2d", {"padding": SAME_PAD[t.kernel]})]
        return st + [("relu", {})] if t.relu else st
    if t.kind == "dwconv":
        return [("conv2d", {"padding": SAME_PAD[t.kernel], "groups": "C"})]
    if t.kind == "pool":
        return [(f"{t.pool}_pool2d", {"pool_size": (3, 3), "padding": (1, 1, 1, 1)})]
    if t.kind == "relu":
        return [("relu", {})]
    if t.kind == "add":
        return [("add", {})]
    if t.kind in ("mul", "smul"):
        return [("multiply", {})]
    if t.kind == "concat":
        return [("concat", {"axis": t.axis})]
    if t.kind == "split":
        return [("split", {"indices": (split_at,), "axis": t.axis})]
    if t.kind == "transpose":
        return [("permute_dims", {"axes": (1, 0)})]
    if t.kind == "enlarge":
        return [("pad", {"pad_width": "enlarge"})]
    raise ValueError(t.kind)


# =============================================================================================
# Graphs after the enumeration: float evaluation, structure tests, printing
# =============================================================================================


@dataclass(frozen=True)
class Gr:
    """A graph of the enumeration: ops, its outputs (refs) and their fingerprints."""

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

    def kinds(self) -> set:
        return {TEMPLATES[t].kind for t, _ in self.ops}

    def sortkey(self):
        return (len(self.ops), repr(self.ops), repr(self.outs))


def _float_eval(domain: Domain, g: Gr, feeds: dict, env: dict, sh: Shapes, tag: str) -> list:
    vals = {}

    def val(r):
        return feeds[r[1]] if r[0] == "L" else vals[r]

    for pos, (tname, refs) in enumerate(g.ops):
        t = TEMPLATES[tname]
        args = [val(r) for r in refs]
        cut = sh.split_at[(tag, pos)].value(env) if t.kind == "split" else None
        outs = None
        for k, (name, attrs) in enumerate(_steps(t, cut)):
            attrs = dict(attrs)
            if attrs.get("groups") == "C":
                attrs["groups"] = args[0].shape[1]
            if attrs.get("pad_width") == "enlarge":
                pw = ENLARGE_PAD[args[0].shape[2:]]
                attrs["pad_width"] = pw
            full = dict(_ops.OPS[name].defaults)
            full.update(attrs)
            outs = _ops.evaluate(name, args if k == 0 else [outs[0]], full)
        for j, o in enumerate(outs):
            vals[(pos, j)] = np.asarray(o, dtype=np.float64)
    return [val(r) for r in g.outs]


def _leaf_feeds(domain: Domain, names, env: dict, rng) -> dict:
    feeds = {}
    for name in names:
        lf = _leaf_of(domain, name)
        shape = tuple(env[(name, i)] for i in range(len(lf.dims)))
        if lf.const:
            feeds[name] = _const_value(lf, shape).astype(np.float64)
        else:
            feeds[name] = rng.standard_normal(shape)
    return feeds


def _template_env(domain: Domain) -> dict:
    return {(lf.name, i): domain.size(d) for lf in domain.leaves for i, d in enumerate(lf.dims)}


def _rel_err(a, b) -> float:
    if a.shape != b.shape:
        return math.inf
    return float(np.abs(a - b).max() / (np.abs(a).max() + 1e-30)) if a.size else 0.0


def _align(a: Gr, b: Gr) -> tuple | None:
    """perm[i]: the output of ``b`` that equals output ``i`` of ``a`` (by fingerprint)."""
    if len(set(a.hashes)) != len(a.hashes) or sorted(a.hashes) != sorted(b.hashes):
        return None
    return tuple(b.hashes.index(h) for h in a.hashes)


def float_confirm(domain: Domain, a: Gr, b: Gr, seed: int, trials: int = 2) -> bool:
    perm = _align(a, b)
    if perm is None:
        return False
    codes = _codes(domain)
    sh = walk(domain, a.ops, codes, tag="a")
    walk(domain, b.ops, codes, sh, tag="b")
    env = _template_env(domain)
    names = sorted(set(a.leaves()) | set(b.leaves()))
    rng = np.random.default_rng(seed)
    for _ in range(trials):
        feeds = _leaf_feeds(domain, names, env, rng)
        va = _float_eval(domain, a, feeds, env, sh, "a")
        vb = _float_eval(domain, b, feeds, env, sh, "b")
        if any(_rel_err(va[i], vb[perm[i]]) > 1e-7 for i in range(len(va))):
            return False
    return True


def _leaf_ops(g: Gr) -> set:
    return {(_base(t), refs) for t, refs in g.ops if all(r[0] == "L" for r in refs)}


def common_subgraph(a: Gr, b: Gr) -> bool:
    """TASO: both graphs apply the same op to the same inputs (leaves). A fused conv+relu
    contains its conv (it is ``relu(conv2d(...))`` in Relax)."""
    return bool(_leaf_ops(a) & _leaf_ops(b))


def common_supergraph(a: Gr, b: Gr, perm) -> bool:
    """TASO: every output is the same op on both sides, with all inputs but one the same
    leaves; the pair follows from the smaller pair of the differing inputs."""
    if not a.ops or not b.ops:
        return False
    for i, ra in enumerate(a.outs):
        rb = b.outs[perm[i]]
        if ra[1] != rb[1]:
            return False
        oa, ob = a.ops[ra[0]], b.ops[rb[0]]
        if oa[0] != ob[0]:
            return False
        diff = sum(1 for x, y in zip(oa[1], ob[1]) if not (x == y and x[0] == "L"))
        if diff > 1:
            return False
    return True


# -- printing ---------------------------------------------------------------------------------

_PREFIX = {"act": "x", "weight": "w", "scalar": "s"}


def _name_leaves(domain: Domain, graphs) -> dict:
    names, count = {}, Counter()
    for g in graphs:
        for leaf in g.leaves_in_print_order():
            if leaf not in names:
                lf = _leaf_of(domain, leaf)
                if lf.const:
                    names[leaf] = f"${lf.const}"
                    continue
                p = _PREFIX[lf.role]
                count[p] += 1
                names[leaf] = f"{p}{count[p]}"
    return names


def _print_order(g: Gr):
    """Leaves in the order the printer meets them (outputs in order, depth first)."""
    seen = []

    def visit(r):
        if r[0] == "L":
            if r[1] not in seen:
                seen.append(r[1])
            return
        for x in g.ops[r[0]][1]:
            visit(x)

    for r in g.outs:
        visit(r)
    return seen


Gr.leaves_in_print_order = _print_order


def _fmt_tuple(vals) -> str:
    return "[" + " ".join(str(v) for v in vals) + "]"


def _dim_text(atom, names) -> str:
    return f"(dim ?{names[atom[0]]} {atom[1]})"


def _sum_text(terms: list[str]) -> str:
    if not terms:
        return "0"
    text = terms[0]
    for x in terms[1:]:
        text = f"(+ {text} {x})"
    return text


def le_text(e: LE, names) -> str:
    """An attribute expression for a linear expression of tensor dims."""

    def terms(lst, c):
        out = [_dim_text(a, names) if k == 1 else f"(* {k} {_dim_text(a, names)})" for a, k in lst]
        return out + [str(c)] if c else out

    pos = terms([(a, k) for a, k in e.t if k > 0], max(e.c, 0))
    neg = terms([(a, -k) for a, k in e.t if k < 0], max(-e.c, 0))
    return _sum_text(pos) if not neg else f"(- {_sum_text(pos)} {_sum_text(neg)})"


def eq_text(e: LE, names) -> str:
    """``(= LHS RHS)`` for ``e == 0``, positive terms on each side."""
    if e.t and e.t[0][1] < 0:
        e = -e
    lhs = LE(((a, k) for a, k in e.t if k > 0), max(e.c, 0))
    rhs = LE(((a, -k) for a, k in e.t if k < 0), max(-e.c, 0))
    return f"(= {le_text(lhs, names)} {le_text(rhs, names)})"


class Printer:
    """Prints one graph as rule patterns (source) or expressions (target)."""

    def __init__(self, domain: Domain, g: Gr, sh: Shapes, tag: str, names: dict, source: bool, cut_vars: dict):
        self.domain, self.g, self.sh, self.tag, self.names = domain, g, sh, tag, names
        self.source = source
        self.cut_vars = cut_vars  # (tag, pos) -> attribute var name (sources)
        self.memo = {}

    def op(self, pos: int) -> str:
        if pos in self.memo:
            return self.memo[pos]
        tname, refs = self.g.ops[pos]
        t = TEMPLATES[tname]
        args = " ".join(self.ref(r) for r in refs)
        if t.kind == "matmul":
            s = f"(matmul {args})"
        elif t.kind == "conv":
            s = f"(conv2d {args} :padding {_fmt_tuple(SAME_PAD[t.kernel])})"
            if t.relu:
                s = f"(relu {s})"
        elif t.kind == "dwconv":
            raise Inexpressible("depthwise conv with TASO's pooling constant")
        elif t.kind == "pool":
            s = f"({t.pool}_pool2d {args} :pool_size [3 3] :padding [1 1 1 1])"
        elif t.kind == "relu":
            s = f"(relu {args})"
        elif t.kind == "add":
            s = f"(add {args})"
        elif t.kind in ("mul", "smul"):
            s = f"(multiply {args})"
        elif t.kind == "concat":
            s = f"(concat {args} :axis {t.axis})"
        elif t.kind == "split":
            key = (self.tag, pos)
            if self.source:
                cut = "?" + self.cut_vars.setdefault(key, f"i{len(self.cut_vars) + 1}")
            else:
                cut = le_text(self.sh.split_at[key], self.names)
            s = f"(split {args} :indices [{cut}] :axis {t.axis})"
        elif t.kind == "transpose":
            s = f"(permute_dims {args} :axes [1 0])"
        elif t.kind == "enlarge":
            w = self.sh.dims[self._key(refs[0])]
            codes = _codes(self.domain)
            k = tuple(e.c + sum(c * codes[a] for a, c in e.t) for e in w[2:])
            s = f"(pad {args} :pad_width {_fmt_tuple(ENLARGE_PAD[k])})"
        else:
            raise ValueError(t.kind)
        self.memo[pos] = s
        return s

    def _key(self, r):
        return ("L", r[1]) if r[0] == "L" else (self.tag, r)

    def ref(self, r) -> str:
        if r[0] == "L":
            name = self.names[r[1]]
            if name.startswith("$"):
                raise Inexpressible(f"TASO constant {name[1:]}")
            return "?" + name
        pos, j = r
        if TEMPLATES[self.g.ops[pos][0]].kind == "split":
            return f"(get {self.op(pos)} {j})"
        return self.op(pos)

    def roots(self, order) -> list[str]:
        """One pattern per output in ``order``; both outputs of one split, in order, print as
        the split itself."""
        refs = [self.g.outs[i] for i in order]
        out, i = [], 0
        while i < len(refs):
            r = refs[i]
            if (r[0] != "L" and TEMPLATES[self.g.ops[r[0]][0]].kind == "split" and r[1] == 0
                    and i + 1 < len(refs) and refs[i + 1] == (r[0], 1)):
                out.append(self.op(r[0]))
                i += 2
                continue
            if self.source and r[0] == "L":
                raise Inexpressible("a bare tensor as a source")
            out.append(self.ref(r))
            i += 1
        return out


# =============================================================================================
# Linear algebra on size constraints
# =============================================================================================


class Span:
    """Linear equations ``LE == 0`` in echelon form (exact, with fractions)."""

    def __init__(self):
        self.rows: list = []  # (pivot atom, {atom: Fraction}, const)

    def reduce(self, e: LE):
        d = {a: Fraction(k) for a, k in e.t}
        c = Fraction(e.c)
        for p, row, rc in self.rows:
            f = d.get(p)
            if f:
                for a, k in row.items():
                    d[a] = d.get(a, 0) - f * k
                c -= f * rc
                d = {a: k for a, k in d.items() if k}
        return d, c

    def add(self, e: LE) -> bool:
        d, c = self.reduce(e)
        if not d:
            if c != 0:
                raise ValueError("inconsistent size constraints")
            return False
        p = min(d)
        f = d[p]
        self.rows.append((p, {a: k / f for a, k in d.items()}, c / f))
        return True

    def solve(self, atoms, rng, lo=2, hi=5, tries=60) -> dict | None:
        """Positive integer sizes satisfying every equation, the free ones drawn at random."""
        pivots = {p for p, _, _ in self.rows}
        free = [a for a in atoms if a not in pivots]
        for _ in range(tries):
            env = {a: Fraction(int(rng.integers(lo, hi + 1))) for a in free}
            for p, row, c in reversed(self.rows):
                env[p] = -(c + sum(k * env[a] for a, k in row.items() if a != p))
            if all(v.denominator == 1 and v > 0 for v in env.values()):
                return {a: int(v) for a, v in env.items()}
        return None


# =============================================================================================
# Rules from pairs
# =============================================================================================


@dataclass
class Pair:
    domain: str
    a: Gr
    b: Gr
    perm: tuple  # output i of a equals output perm[i] of b

    def kinds(self) -> set:
        return self.a.kinds() | self.b.kinds()

    def leaves(self) -> set:
        return set(self.a.leaves()) | set(self.b.leaves())


FAMILIES = [
    ("enlarge", lambda k, n: "enlarge" in k),
    ("merge-matmul", lambda k, n: n == 2 and "matmul" in k and "split" in k),
    ("merge-conv", lambda k, n: n == 2 and "conv" in k and "split" in k),
    ("matmul-concat", lambda k, n: "matmul" in k and k & {"concat", "split"}),
    ("conv-concat", lambda k, n: "conv" in k and k & {"concat", "split"}),
    ("matmul-add", lambda k, n: "matmul" in k and "add" in k),
    ("conv-add", lambda k, n: "conv" in k and "add" in k),
    ("matmul-transpose", lambda k, n: k == {"matmul", "transpose"}),
    ("matmul-assoc", lambda k, n: k == {"matmul"}),
    ("transpose", lambda k, n: "transpose" in k),
    ("relu-concat", lambda k, n: "relu" in k and k & {"concat", "split"} and k <= {"relu", "concat", "split"}),
    ("concat-split", lambda k, n: k <= {"concat", "split"}),
    ("pool", lambda k, n: "pool" in k),
    ("scalar", lambda k, n: "smul" in k),
    ("matmul", lambda k, n: "matmul" in k),
    ("conv", lambda k, n: "conv" in k),
    ("elementwise-concat", lambda k, n: k & {"concat", "split"}),
    ("elementwise", lambda k, n: True),
]


def family(pair: Pair) -> str:
    k, n = pair.kinds(), len(pair.a.outs)
    for name, pred in FAMILIES:
        if pred(k, n):
            return name
    return "misc"


def _expressible(src: Gr, dst: Gr, domain: Domain) -> bool:
    if not src.ops or any(r[0] == "L" for r in src.outs):
        return False
    if not set(dst.leaves()) <= set(src.leaves()):
        return False
    for name in set(src.leaves()) | set(dst.leaves()):
        if _leaf_of(domain, name).const:
            return False
    return not ({"dwconv"} & (src.kinds() | dst.kinds()))


def _direct_rank4(g: Gr) -> set:
    out = set()
    for tname, refs in g.ops:
        kind = TEMPLATES[tname].kind
        if kind in ("conv", "pool"):
            out |= {r[1] for r in refs if r[0] == "L"}
    return out


@dataclass
class Emitted:
    """One rule of the generated file."""

    name: str
    family: str
    text: str  # the rule (one logical line, continuation lines indented)
    size: int  # ops on both sides
    pair: int  # index of its pair
    src_tag: str


def _pair_shapes(domain: Domain, pair: Pair, pin: bool):
    codes = _codes(domain)
    sh = walk(domain, pair.a.ops, codes, tag="a")
    walk(domain, pair.b.ops, codes, sh, tag="b")

    def key(tag, r):
        return ("L", r[1]) if r[0] == "L" else (tag, r)

    for i, r in enumerate(pair.a.outs):
        ka, kb = key("a", r), key("b", pair.b.outs[pair.perm[i]])
        eqs = [x - y for x, y in zip(sh.dims[ka], sh.dims[kb])]
        sh.strict += eqs
        if not (sh.tainted[ka] or sh.tainted[kb]):
            sh.pure += eqs
    if pin:  # the enumeration's own size sharing, for rules that do not hold more generally
        first = {}
        for leaf in sorted(pair.leaves()):
            for i in range(len(_leaf_of(domain, leaf).dims)):
                a = (leaf, i)
                if codes[a] in first:
                    sh.needed.append(LE.atom(a) - LE.atom(first[codes[a]]))
                else:
                    first[codes[a]] = a
    conds, seen = [], set()
    # first the operand shapes of add/multiply, against equations that do not assume them
    enforced = Span()
    for e in sh.pure:
        enforced.add(e)
    for e in sh.broadcast:
        if not e.is_zero() and e not in seen:
            seen.add(e)
            if enforced.add(e):
                conds.append(e)
    # with those, every dim expression is exact: all shape checks count
    for e in sh.strict:
        enforced.add(e)
    for e in sh.needed:
        if e.is_zero() or e in seen:
            continue
        seen.add(e)
        if enforced.add(e):
            conds.append(e)
    full = Span()
    for e in sh.strict + sh.broadcast + sh.needed:
        full.add(e)
    return sh, conds, full


def rule_text(domain: Domain, pair: Pair, sh: Shapes, conds: list, forward: bool, name: str) -> str:
    src, dst = (pair.a, pair.b) if forward else (pair.b, pair.a)
    stag, dtag = ("a", "b") if forward else ("b", "a")
    if forward:
        sorder, dorder = list(range(len(src.outs))), list(pair.perm)
    else:
        inv = [0] * len(pair.perm)
        for i, j in enumerate(pair.perm):
            inv[j] = i
        sorder, dorder = list(range(len(src.outs))), inv
    names = _name_leaves(domain, [src])
    cut_vars: dict = {}
    sp = Printer(domain, src, sh, stag, names, True, cut_vars)
    roots = sp.roots(sorder)
    dp = Printer(domain, dst, sh, dtag, names, False, {})
    targets = dp.roots(dorder)
    cs = []
    rank4 = _direct_rank4(src)
    for leaf in src.leaves_in_print_order():
        if leaf not in rank4:
            cs.append(f"(= (rank ?{names[leaf]}) {len(_leaf_of(domain, leaf).dims)})")
    cs += [eq_text(e, names) for e in conds]
    for key, var in cut_vars.items():
        cs.append(f"(= ?{var} {le_text(sh.split_at[key], names)})")
    text = f"{name} [generated, checked]: {', '.join(roots)}\n    => {', '.join(targets)}"
    if cs:
        text += "\n    if " + ", ".join(cs)
    return text


def _instance(domain: Domain, g: Gr, sh: Shapes, tag: str, env: dict, rng):
    """The graph ``g`` at sizes ``env`` as a rule-engine :class:`~tvm_taso.graph.Graph` with
    random float64 inputs: (graph, feeds)."""
    from .graph import Graph
    from .ops import TensorType

    G = Graph()
    ids, feeds = {}, {}
    for leaf in sorted(g.leaves()):
        lf = _leaf_of(domain, leaf)
        shape = tuple(env[(leaf, i)] for i in range(len(lf.dims)))
        nid = G.add_leaf("input", TensorType(shape, "float64"), None, key=leaf)
        ids[leaf] = (nid, 0)
        feeds[nid] = rng.standard_normal(shape)
    vals = {}

    def ref(r):
        return ids[r[1]] if r[0] == "L" else vals[r]

    for pos, (tname, refs) in enumerate(g.ops):
        t = TEMPLATES[tname]
        args = [ref(r) for r in refs]
        cut = sh.split_at[(tag, pos)].value(env) if t.kind == "split" else None
        cur = None
        for k, (name, attrs) in enumerate(_steps(t, cut)):
            attrs = dict(attrs)
            if attrs.get("pad_width") == "enlarge":
                attrs["pad_width"] = ENLARGE_PAD[G.type_of(args[0]).shape[2:]]
            nid = G.add(name, args if k == 0 else [cur], attrs)
            cur = (nid, 0)
        n = len(G.nodes[cur[0]].types)
        for j in range(n):
            vals[(pos, j)] = (cur[0], j)
    G.outputs = [ref(r) for r in g.outs]
    return G, feeds


def engine_check(rule, G, feeds, tol: float = 1e-7) -> tuple[bool, str]:
    """Match ``rule`` on ``G`` and apply it at every site; every rewrite must compute the same
    outputs, and at least one must apply."""
    from .match import apply, find_matches

    expected = G.evaluate(feeds)
    applied = 0
    for m in find_matches(G, rule):
        new = apply(G, m)
        if new is None:
            continue
        got = new.evaluate(feeds)
        for ro, rn in zip(G.outputs, new.outputs):
            if _rel_err(np.asarray(expected[ro], np.float64), np.asarray(got[rn], np.float64)) > tol:
                return False, "wrong values"
        applied += 1
    return (applied > 0), ("ok" if applied else "no site")


def make_rules(domain: Domain, pair: Pair, index: int, seed: int) -> dict:
    """Both directions of a pair as checked rule texts: ``{"rules": [(forward, text,
    instances)], "why": reason for a missing direction}``."""
    from .rule import parse_rule

    fam = family(pair)
    out = {"rules": [], "why": []}
    for forward in (True, False):
        src, dst = (pair.a, pair.b) if forward else (pair.b, pair.a)
        if not _expressible(src, dst, domain):
            out["why"].append("inexpressible")
            continue
        ok = False
        for pin in (False, True):
            sh, conds, full = _pair_shapes(domain, pair, pin)
            try:
                text = rule_text(domain, pair, sh, conds, forward, "r")
            except Inexpressible:
                break
            lhs, rhs = text.split("\n    => ")
            if lhs.split(": ", 1)[1] == rhs.split("\n")[0]:
                out["why"].append("identical")
                break
            rule = parse_rule(text)
            rng = np.random.default_rng([seed, index, int(forward), int(pin)])
            atoms = sorted({(leaf, i) for leaf in pair.leaves() for i in range(len(_leaf_of(domain, leaf).dims))})
            envs = [full.solve(atoms, rng) for _ in range(2)]
            if any(e is None for e in envs):
                envs = [_template_env(domain)]
            good = True
            for env in envs:
                G, feeds = _instance(domain, src, sh, "a" if forward else "b", env, rng)
                passed, _ = engine_check(rule, G, feeds)
                if not passed:
                    good = False
                    break
            if good:
                out["rules"].append((forward, text, envs[0], pin))
                ok = True
                break
        if not ok:
            out["why"].append("failed check")
    out["family"] = fam
    return out


# =============================================================================================
# An instance of a rule from its text alone (used by the tests and the implication check)
# =============================================================================================


def rule_instance(rule, seed: int = 0, tries: int = 60):
    """A graph holding one site of ``rule``'s source at random sizes that satisfy its
    conditions, with random float64 inputs: ``(graph, feeds)``. Handles the forms the generator
    writes (rank and linear dim conditions, split cut variables); raises ValueError otherwise."""
    from .graph import Graph
    from .ops import TensorType
    from .rule import Call, Get, Op, Tup, Var

    ranks: dict = {}
    eqs: list = []
    cuts: dict = {}

    def le(x) -> LE:
        if isinstance(x, bool):
            raise ValueError("boolean in a size expression")
        if isinstance(x, int):
            return LE.lit(x)
        if isinstance(x, Var):
            if x.name in cuts:
                return cuts[x.name]
            raise ValueError(f"unbound ?{x.name}")
        if isinstance(x, Call):
            if x.fn == "dim":
                return LE.atom((x.args[0].name, x.args[1]))
            a = [le(y) for y in x.args]
            if x.fn == "+":
                return a[0] + a[1]
            if x.fn == "-":
                return a[0] - a[1]
            if x.fn == "*":
                k, e = (a[0], a[1]) if not a[0].t else (a[1], a[0])
                if k.t:
                    raise ValueError("non-linear size expression")
                return LE(((v, c * k.c) for v, c in e.t), e.c * k.c)
        raise ValueError(f"unsupported size expression {x!r}")

    def visit_rank4(p):
        if isinstance(p, Get):
            return visit_rank4(p.expr)
        if isinstance(p, Op):
            for a in p.args:
                if isinstance(a, Var) and p.op in ("conv2d", "avg_pool2d", "max_pool2d"):
                    ranks.setdefault(a.name, 4)
                visit_rank4(a)

    for p in rule.src:
        visit_rank4(p)
    for c in rule.conds:
        if isinstance(c, Call) and c.fn == "=" and isinstance(c.args[0], Call) and c.args[0].fn == "rank":
            ranks[c.args[0].args[0].name] = c.args[1]
    for c in rule.conds:
        if not (isinstance(c, Call) and c.fn == "="):
            raise ValueError(f"unsupported condition {c!r}")
        lhs, rhs = c.args
        if isinstance(lhs, Call) and lhs.fn == "rank":
            continue
        if isinstance(lhs, Var):
            cuts[lhs.name] = le(rhs)
        else:
            eqs.append(le(lhs) - le(rhs))

    def attrs_of(p) -> dict:
        def val(x):
            if isinstance(x, Tup):
                return tuple(val(i) for i in x.items)
            if isinstance(x, Var):
                return cuts[x.name]
            if isinstance(x, Call):
                return le(x)
            return x
        return {k: val(v) for k, v in p.attrs}

    memo: dict = {}

    def dims(p) -> list:
        """Output dims (one tuple per output) of a source pattern, with its typing equations."""
        if isinstance(p, Var):
            return [tuple(LE.atom((p.name, i)) for i in range(ranks[p.name]))]
        if isinstance(p, Get):
            return [dims(p.expr)[p.index]]
        if id(p) in memo:
            return memo[id(p)]
        a = [dims(x)[0] for x in p.args]
        at = attrs_of(p)
        if p.op == "matmul":
            eqs.append(a[0][1] - a[1][0])
            out = [(a[0][0], a[1][1])]
        elif p.op == "conv2d":
            x, w = a
            pt, pl, pb, pr = at.get("padding", (0, 0, 0, 0))
            eqs.append(x[1] - w[1])
            out = [(x[0], w[0], x[2] + (pt + pb + 1) - w[2], x[3] + (pl + pr + 1) - w[3])]
        elif p.op in ("avg_pool2d", "max_pool2d"):
            (x,) = a
            kh, kw = at["pool_size"]
            pt, pl, pb, pr = at.get("padding", (0, 0, 0, 0))
            out = [(x[0], x[1], x[2] + (pt + pb + 1 - kh), x[3] + (pl + pr + 1 - kw))]
        elif p.op == "relu":
            out = [a[0]]
        elif p.op in ("add", "multiply"):
            if len(a[1]) == len(a[0]):
                eqs.extend(x - y for x, y in zip(a[0], a[1]))
            out = [a[0]]
        elif p.op == "concat":
            ax = at["axis"]
            eqs.extend(a[0][i] - a[1][i] for i in range(len(a[0])) if i != ax)
            d = list(a[0])
            d[ax] = a[0][ax] + a[1][ax]
            out = [tuple(d)]
        elif p.op == "split":
            ax = at["axis"]
            (cut,) = at["indices"]
            d0, d1 = list(a[0]), list(a[0])
            d0[ax], d1[ax] = cut, a[0][ax] - cut
            out = [tuple(d0), tuple(d1)]
        elif p.op == "permute_dims":
            out = [tuple(a[0][i] for i in at["axes"])]
        elif p.op == "pad":
            pw = at["pad_width"]
            out = [tuple(d + (pw[2 * i] + pw[2 * i + 1]) for i, d in enumerate(a[0]))]
        else:
            raise ValueError(f"op {p.op} is not handled")
        memo[id(p)] = out
        return out

    # the target's shape checks and equal output shapes hold wherever the rule applies
    src_dims = [d for p in rule.src for d in dims(p)]
    dst_dims = [d for p in rule.dst for d in dims(p)]
    if len(src_dims) != len(dst_dims):
        raise ValueError(f"{rule.name}: {len(src_dims)} source outputs, {len(dst_dims)} targets")
    for a, b in zip(src_dims, dst_dims):
        if len(a) != len(b):
            raise ValueError(f"{rule.name}: output ranks differ")
        eqs.extend(x - y for x, y in zip(a, b))
    span = Span()
    for e in eqs:
        span.add(e)
    atoms = sorted({(v, i) for v, r in ranks.items() for i in range(r)})
    rng = np.random.default_rng(seed)
    env = span.solve(atoms, rng, tries=tries)
    if env is None:
        raise ValueError(f"no positive sizes satisfy {rule.name}")
    G = Graph()
    refs, feeds = {}, {}
    for v in sorted(ranks):
        shape = tuple(env[(v, i)] for i in range(ranks[v]))
        nid = G.add_leaf("input", TensorType(shape, "float64"), None, key=v)
        refs[v] = (nid, 0)
        feeds[nid] = rng.standard_normal(shape)

    built: dict = {}

    def build(p) -> list:
        if isinstance(p, Var):
            return [refs[p.name]]
        if isinstance(p, Get):
            return [build(p.expr)[p.index]]
        if id(p) in built:
            return built[id(p)]
        args = [build(x)[0] for x in p.args]
        at = attrs_of(p)
        if p.op == "split":
            at["indices"] = tuple(c.value(env) for c in at["indices"])
        nid = G.add(p.op, args, at)
        built[id(p)] = [(nid, j) for j in range(len(G.nodes[nid].types))]
        return built[id(p)]

    G.outputs = [r for p in rule.src for r in (build(p) if isinstance(p, Op) else build(p))]
    return G, feeds


# =============================================================================================
# Canonical forms (identical graphs, renamings)
# =============================================================================================


def _expr(g: Gr, r, names: dict | None, domain: Domain | None, flips=frozenset()) -> str:
    if r[0] == "L":
        if names is None:
            return r[1]
        if r[1] not in names:
            lf = _leaf_of(domain, r[1])
            if lf.const:
                names[r[1]] = "$" + lf.const
            else:
                p = _PREFIX[lf.role] + "".join(str(d) if isinstance(d, int) else "*" for d in lf.dims)
                names[r[1]] = f"{p}_{sum(1 for v in names.values() if v.startswith(p + '_')) + 1}"
        return names[r[1]]
    tname, refs = g.ops[r[0]]
    t = TEMPLATES[tname]
    if r[0] in flips:
        refs = refs[::-1]
    s = f"{_base(tname)}({','.join(_expr(g, x, names, domain, flips) for x in refs)})"
    if t.relu:
        s = f"relu({s})"
    return s + f"#{r[1]}" if t.kind == "split" else s


def _base(tname: str) -> str:
    """A fused conv+relu template's conv (``conv3x3r`` -> ``conv3x3``)."""
    return tname[:-1] if TEMPLATES[tname].relu else tname


def graph_canon(g: Gr) -> tuple:
    order = sorted(range(len(g.outs)), key=lambda i: g.hashes[i])
    return tuple(_expr(g, g.outs[i], None, None) for i in order)


def _flip_sets(g: Gr):
    """Every choice of operand order for the commutative ops (add, multiply) of ``g``."""
    comm = [k for k, (t, _) in enumerate(g.ops) if TEMPLATES[t].kind in ("add", "mul")]
    for n in range(len(comm) + 1):
        for c in itertools.combinations(comm, n):
            yield frozenset(c)


def pair_canon(domain: Domain, pair: Pair) -> tuple:
    """The same for every renaming of the inputs, either direction, either output order and
    either operand order of add/multiply."""
    inv = [0] * len(pair.perm)
    for i, j in enumerate(pair.perm):
        inv[j] = i
    best = None
    for g1, g2, perm in ((pair.a, pair.b, pair.perm), (pair.b, pair.a, tuple(inv))):
        for order in itertools.permutations(range(len(g1.outs))):
            for f1 in _flip_sets(g1):
                for f2 in _flip_sets(g2):
                    names: dict = {}
                    s1 = tuple(_expr(g1, g1.outs[i], names, domain, f1) for i in order)
                    s2 = tuple(_expr(g2, g2.outs[perm[i]], names, domain, f2) for i in order)
                    key = (s1, s2)
                    if best is None or key < best:
                        best = key
    return best


def self_renaming(domain: Domain, pair: Pair, flips: bool = False) -> bool:
    """Whether one side is the other with its inputs renamed (and its outputs reordered): such
    a rule never changes a graph. With ``flips``, also up to the operand order of add and
    multiply (associativity and commutativity: cost-neutral, but they enable other rules)."""
    def forms(g, perm):
        out = set()
        for order in itertools.permutations(range(len(g.outs))):
            for f in (_flip_sets(g) if flips else [frozenset()]):
                names: dict = {}
                out.add(tuple(_expr(g, g.outs[perm[i]], names, domain, f) for i in order))
        return out

    ident = tuple(range(len(pair.a.outs)))
    return bool(forms(pair.a, ident) & forms(pair.b, pair.perm))


# =============================================================================================
# The pipeline
# =============================================================================================


@dataclass
class GenConfig:
    max_ops: int = 3
    groups: tuple = ALL_GROUPS
    seed: int = 0
    time_limit: float = 600.0
    workers: int = 2
    progress: bool = True
    implied: bool = True  # prune rules that two applications of smaller rules reproduce
    domains: tuple = ("mat", "conv")
    both_directions: bool = True  # False: one rule per pair, smaller graph -> larger (TASO)
    implied_by: tuple = ()  # texts of rule files whose rules also count for the implication test


@dataclass
class GenResult:
    rules: list
    stats: dict
    families: dict
    seconds: float
    truncated: bool

    def text(self) -> str:
        return render(self)


_W: dict = {}


def _init_worker(cfg: GenConfig):
    _W.clear()
    _W["cfg"] = cfg
    _W["domains"] = {d.name: d for d in _domains("const" in cfg.groups)}
    _W["enum"] = {
        name: Enumerator(d, EnumConfig(cfg.max_ops, cfg.groups, cfg.seed)) for name, d in _W["domains"].items()
    }


def _enum_task(task):
    idx, dom, first, deadline = task
    e = _W["enum"][dom]
    recs = e.run(first, deadline)
    return idx, dom, recs, e.nodes, e.stopped


def _confirm_task(task):
    idx, pair = task
    return idx, float_confirm(_W["domains"][pair.domain], pair.a, pair.b, _W["cfg"].seed + idx)


def _emit_task(task):
    idx, pair = task
    return idx, make_rules(_W["domains"][pair.domain], pair, idx, _W["cfg"].seed)


def _init_implied(cfg: GenConfig, texts: list, domains: list):
    from .rule import parse_rule, parse_rules

    _init_worker(cfg)
    _W["rules"] = [parse_rule(t) for t in texts]
    _W["rule_domain"] = domains
    _W["external"] = [r for t in cfg.implied_by for r in parse_rules(t)]


def _implied_task(task):
    idx, pair, forward, env = task
    earlier = _W["external"] + [q for q, d in zip(_W["rules"][:idx], _W["rule_domain"]) if d == pair.domain]
    return idx, _is_implied(_W["domains"][pair.domain], _W["rules"][idx], pair, forward, env, earlier)


class _Runner:
    """Runs tasks in a process pool (or inline with one worker), results in task order."""

    def __init__(self, cfg: GenConfig, init=_init_worker, args=None):
        self.cfg = cfg
        self.pool = None
        args = (cfg,) if args is None else args
        if cfg.workers > 1:
            ctx = mp.get_context("fork") if "fork" in mp.get_all_start_methods() else mp.get_context()
            self.pool = ctx.Pool(cfg.workers, initializer=init, initargs=args)
        else:
            init(*args)

    def map(self, fn, tasks, desc: str, deadline: float | None = None, chunksize: int = 1):
        from tqdm import tqdm

        results = {}
        bar = tqdm(total=len(tasks), desc=desc, disable=not self.cfg.progress, file=sys.stderr, leave=True,
                   dynamic_ncols=True)
        it = self.pool.imap_unordered(fn, tasks, chunksize) if self.pool else map(fn, tasks)
        try:
            for res in it:
                results[res[0]] = res
                bar.update(1)
                if deadline is not None and time.monotonic() > deadline:
                    break
        finally:
            bar.close()
        return [results[k] for k in sorted(results)]

    def close(self):
        if self.pool:
            self.pool.terminate()
            self.pool.join()


_COMMUTATIVE = ("add", "multiply")


def _chash(g) -> tuple:
    """A hash of what a rule-engine graph computes, blind to the operand order of add and
    multiply."""
    memo: dict = {}
    for nid in g.topo_order():
        n = g.nodes[nid]
        if n.op in ("input", "const"):
            memo[nid] = ("leaf", n.attrs)
            continue
        ins = [(memo[s], i) for s, i in n.inputs]
        if n.op in _COMMUTATIVE:
            ins.sort(key=repr)
        memo[nid] = hash((n.op, n.attrs, tuple(ins)))
    return tuple((memo[s], i) for s, i in g.outputs)


def _commuted(g, limit: int = 3) -> list:
    """``g`` with the operands of some of its add/multiply nodes swapped (every choice)."""
    from .graph import Graph

    order = g.topo_order()
    comm = [nid for nid in order if g.nodes[nid].op in _COMMUTATIVE and len(set(g.nodes[nid].inputs)) == 2][:limit]
    out = []
    for mask in range(1, 1 << len(comm)):
        flip = {nid for k, nid in enumerate(comm) if mask >> k & 1}
        h = Graph()
        m: dict = {}
        for nid in order:
            n = g.nodes[nid]
            if n.op in ("input", "const"):
                m[nid] = h.add_leaf(n.op, n.types[0], n.payload, dict(n.attrs)["key"])
                continue
            ins = [(m[s], i) for s, i in n.inputs]
            if nid in flip:
                ins = ins[::-1]
            m[nid] = h.add(n.op, ins, dict(n.attrs))
        h.outputs = [(m[s], i) for s, i in g.outputs]
        out.append(h)
    return out


def _is_implied(domain: Domain, rule, pair: Pair, forward: bool, env: dict, earlier: list,
                depth: int = 3, width: int = 48) -> bool:
    """Whether up to ``depth`` applications of the ``earlier`` rules rewrite the rule's source
    (at sizes ``env``) into a graph the rule itself produces, up to the operand order of
    add/multiply (at most ``width`` graphs are kept per step)."""
    from .match import apply, find_matches, index_by_op

    sh, _, _ = _pair_shapes(domain, pair, False)
    src = pair.a if forward else pair.b
    G, _ = _instance(domain, src, sh, "a" if forward else "b", env, np.random.default_rng(0))
    goals = set()
    for m in find_matches(G, rule):
        new = apply(G, m)
        if new is not None:
            goals.add(_chash(new))
    if not goals:
        return False
    frontier = [G] + _commuted(G)
    seen = {g.structural_hash() for g in frontier}
    for _depth in range(depth):
        nxt = []
        for g in frontier:
            by_op = index_by_op(g)
            for q in earlier:
                if any(op not in by_op for op in q.root_ops):
                    continue
                for m in find_matches(g, q, by_op):
                    new = apply(g, m)
                    if new is None:
                        continue
                    h = new.structural_hash()
                    if h in seen:
                        continue
                    seen.add(h)
                    if _chash(new) in goals:
                        return True
                    nxt.append(new)
        if _depth + 1 < depth:
            frontier = []
            for g in nxt[:width]:
                frontier.append(g)
                for c in _commuted(g):
                    if c.structural_hash() not in seen:
                        seen.add(c.structural_hash())
                        frontier.append(c)
    return False


def _leaf_graphs(domain: Domain, cfg: GenConfig) -> list:
    e = Enumerator(domain, EnumConfig(cfg.max_ops, cfg.groups, cfg.seed))
    out = []
    for t in e.base:
        name = e.leaves[t.leaf].name
        out.append(((t.h,), Gr(domain.name, (), (("L", name),), (t.h,))))
    for s, t in itertools.combinations(e.base, 2):
        a, b = e.leaves[s.leaf].name, e.leaves[t.leaf].name
        out.append((tuple(sorted((s.h, t.h))), Gr(domain.name, (), (("L", a), ("L", b)), (s.h, t.h))))
    return out


def generate(cfg: GenConfig | None = None, log=None) -> GenResult:
    """Run the whole generator; see the module docstring."""
    cfg = cfg or GenConfig()
    t0 = time.monotonic()
    deadline = t0 + cfg.time_limit
    log = log or (lambda msg: print(f"tvm-taso generate: {msg}", file=sys.stderr, flush=True) if cfg.progress else None)
    domains = {d.name: d for d in _domains("const" in cfg.groups) if d.name in cfg.domains}
    stats: dict = {}
    runner = _Runner(cfg)
    truncated = False
    try:
        # -- 1. enumerate -------------------------------------------------------------------
        tasks = []
        for name, d in domains.items():
            e = Enumerator(d, EnumConfig(cfg.max_ops, cfg.groups, cfg.seed))
            for first in e.first_ops():
                tasks.append((len(tasks), name, first, t0 + 0.6 * cfg.time_limit))
        results = runner.map(_enum_task, tasks, "enumerate", deadline=t0 + 0.65 * cfg.time_limit)
        buckets: dict = defaultdict(list)
        nodes = graphs = 0
        for _, dom, recs, n, stopped in results:
            nodes += n
            truncated |= stopped
            for key, ops_, outs, hs, redundant in recs:
                buckets[(dom, key)].append((ops_, outs, hs, redundant))
                graphs += 1
        truncated |= len(results) < len(tasks)
        del results
        for name, d in domains.items():
            for key, g in _leaf_graphs(d, cfg):
                buckets[(name, key)].append((g.ops, g.outs, g.hashes, False))
        stats["graphs enumerated"] = nodes
        stats["graphs fingerprinted (1-2 outputs, connected)"] = graphs
        log(f"enumerated {nodes} graphs ({graphs} fingerprinted) in {time.monotonic() - t0:.1f} s"
            + (" -- stopped at the time limit" if truncated else ""))

        # -- 2. candidate pairs and TASO's structural pruning --------------------------------
        cand = trivial = sub = sup = 0
        pairs = []
        for bkey in sorted(k for k, v in buckets.items() if len(v) > 1):
            members = sorted((Gr(bkey[0], *m) for m in buckets[bkey]), key=Gr.sortkey)
            cand += len(members) - 1
            uniq, seen = [], set()
            for g in members:
                c = graph_canon(g)
                if c not in seen:
                    seen.add(c)
                    uniq.append(g)
            trivial += len(uniq) - 1
            for j in range(1, len(uniq)):
                g = uniq[j]
                chosen, passed_sub = None, False
                for h in uniq[:j]:
                    if (g.redundant or h.redundant) and (h.size and g.size):
                        continue  # a redundant graph pairs only with inputs alone
                    perm = _align(h, g)
                    if perm is None or common_subgraph(h, g):
                        continue
                    passed_sub = True
                    if not common_supergraph(h, g, perm):
                        chosen = (h, perm)
                        break
                sub += passed_sub
                if chosen:
                    sup += 1
                    pairs.append(Pair(g.domain, chosen[0], g, chosen[1]))
        stats["candidate pairs (equal fingerprints)"] = cand
        stats["after removing identical graphs"] = trivial
        stats["after common-subgraph pruning"] = sub
        stats["after common-supergraph pruning"] = sup
        canon: dict = {}
        for p in pairs:
            canon.setdefault(pair_canon(domains[p.domain], p), p)
        # a two-output graph equal to itself with its inputs renamed only reorders a split's
        # outputs; single-output ones (associativity) are kept and sorted last below
        pairs = [canon[k] for k in sorted(canon)
                 if len(canon[k].a.outs) == 1 or not self_renaming(domains[canon[k].domain], canon[k])]
        stats["after input-renaming pruning"] = len(pairs)
        log(f"{cand} candidate pairs -> {len(pairs)} after structural pruning")

        # -- 3. float confirmation ------------------------------------------------------------
        res = runner.map(_confirm_task, list(enumerate(pairs)), "float check", chunksize=8)
        pairs = [pairs[i] for i, ok in res if ok]
        stats["after float64 confirmation"] = len(pairs)
        expressible = [p for p in pairs
                       if _expressible(p.a, p.b, domains[p.domain]) or _expressible(p.b, p.a, domains[p.domain])]
        stats["expressible in the rule language"] = len(expressible)
        pairs = expressible

        # -- 4. rules, checked by the rule engine ----------------------------------------------
        res = runner.map(_emit_task, list(enumerate(pairs)), "emit + check", deadline=deadline - 0.05 * cfg.time_limit,
                         chunksize=4)
        truncated |= len(res) < len(pairs)
        cands = []
        failed = 0
        for i, r in res:
            failed += r["why"].count("failed check")
            for forward, text, env, pin in r["rules"]:
                cands.append((pairs[i], r["family"], forward, text, env, pin))
                if not cfg.both_directions:
                    break
        stats["rules checked by the engine" + (" (both directions)" if cfg.both_directions else "")] = len(cands)
        uniq, seen_text = [], set()
        for c in cands:
            norm = _normalized(c[3])
            if norm not in seen_text:
                seen_text.add(norm)
                uniq.append(c)
        stats["after removing duplicate rules (same text up to renaming)"] = len(uniq)
        cands = uniq
        stats["directions failing the engine check"] = failed
        stats["pairs whose two sides are the same Relax graph"] = sum(r["why"].count("identical") for _, r in res) // 2

        # -- 5. rules implied by smaller ones ------------------------------------------------------
        def size(c):
            return c[0].a.size + c[0].b.size

        # general rules first (a rule with a repeated input is a special case of one without),
        # mere reorderings of add/multiply operands last
        perm = {id(c[0]): self_renaming(domains[c[0].domain], c[0], flips=True) for c in cands}
        perm = {k: int(v) for k, v in perm.items()}
        cands.sort(key=lambda c: (size(c), perm[id(c[0])], -len(c[0].leaves()), c[1], c[3]))
        keep = [True] * len(cands)
        if cfg.implied and time.monotonic() < deadline:
            runner.close()
            runner = _Runner(cfg, _init_implied, (cfg, [c[3] for c in cands], [c[0].domain for c in cands]))
            jobs = [(i, c[0], c[2], c[4]) for i, c in enumerate(cands)]
            res = runner.map(_implied_task, jobs, "implied", deadline=deadline, chunksize=4)
            if len(res) < len(jobs):
                truncated = True
                stats["rules not tested for implication (time limit)"] = len(jobs) - len(res)
            for i, implied in res:
                keep[i] = not implied
        cands = [c for c, k in zip(cands, keep) if k]
        stats["after removing rules implied by smaller rules"] = len(cands)
    finally:
        runner.close()

    # -- 6. names ----------------------------------------------------------------------------
    by_pair: dict = defaultdict(list)
    for c in cands:
        by_pair[id(c[0])].append(c)
    groups = sorted(by_pair.values(), key=lambda cs: (cs[0][1], cs[0][0].a.size + cs[0][0].b.size,
                                                      pair_canon(domains[cs[0][0].domain], cs[0][0])))
    count: Counter = Counter()
    emitted = []
    for cs in groups:
        fam = cs[0][1]
        count[fam] += 1
        for p, _, forward, text, env, pin in sorted(cs, key=lambda c: not c[2]):
            name = f"gen-{fam}-{count[fam]}" + ("" if forward else "-rev")
            emitted.append(Emitted(name, fam, name + text[1:], p.a.size + p.b.size, count[fam],
                                   "a" if forward else "b"))
    families = Counter(e.family for e in emitted)
    stats["rules written"] = len(emitted)
    return GenResult(emitted, stats, dict(sorted(families.items())), time.monotonic() - t0, truncated)


def _normalized(text: str) -> str:
    """A rule's text without its name, variables renamed in order of appearance."""
    import re

    body = text.split(" ", 1)[1]
    names: dict = {}

    def sub(m):
        return "?" + names.setdefault(m.group(1), f"v{len(names) + 1}")

    return re.sub(r"\?([A-Za-z]\w*)", sub, body)


def render(result: GenResult) -> str:
    lines = [
        "# Generated by `tvm-taso rules generate` (tvm_taso/generate.py): TASO's generator over the",
        "# operators of tvm_taso/ops.py. Every rule was found by integer fingerprints, confirmed on",
        "# float64 data, and checked by matching and applying it on two instances with random sizes",
        "# (proof status `checked`). `gen-F-N` rewrites the smaller graph of pair N into the larger;",
        "# `gen-F-N-rev` is the other direction. Do not edit: regenerate.",
        "#",
    ]
    for k, v in result.stats.items():
        lines.append(f"# {k}: {v}")
    lines.append(f"# families: " + ", ".join(f"{k} {v}" for k, v in result.families.items()))
    fam = None
    for e in result.rules:
        if e.family != fam:
            fam = e.family
            lines += ["", f"# --- {fam} " + "-" * max(3, 86 - len(fam))]
        lines.append(e.text)
    return "\n".join(lines) + "\n"


# =============================================================================================
# Command line
# =============================================================================================


def add_generate_command(subparsers) -> argparse.ArgumentParser:
    """Add ``generate`` to the ``tvm-taso rules`` subcommands."""
    p = subparsers.add_parser(
        "generate",
        help="generate rules by enumerating small graphs (TASO's generator)",
        description="Enumerate graphs of up to --max-ops operators, pair those with equal integer "
        "fingerprints, confirm on float data, prune (renamings, common sub/supergraphs, implied "
        "rules) and write the rules, each checked by the rule engine.",
    )
    p.add_argument("--max-ops", type=int, default=3, choices=[1, 2, 3, 4], help="operators per graph (default 3)")
    p.add_argument("--ops", default=",".join(ALL_GROUPS),
                   help=f"comma-separated operator groups (default all: {','.join(ALL_GROUPS)})")
    p.add_argument("--time-limit", type=float, default=600.0, help="seconds; stops with what it has (default 600)")
    p.add_argument("--workers", type=int, default=2, help="processes (default 2)")
    p.add_argument("--seed", type=int, default=0, help="seed of the fingerprint and test data (default 0)")
    p.add_argument("--no-implied", action="store_true", help="keep rules implied by smaller ones")
    p.add_argument("--implied-by", action="append", metavar="FILE", default=[],
                   help="also drop rules that this rule file implies (e.g. rules/core.rules); repeatable")
    p.add_argument("--one-direction", action="store_true",
                   help="one rule per pair, from the smaller graph to the larger (as TASO loads them); "
                   "default: both directions")
    p.add_argument("-o", "--output", help="rule file to write (default: standard output)")
    p.set_defaults(func=cmd_generate)
    return p


def cmd_generate(args) -> int:
    groups = tuple(g.strip() for g in args.ops.split(",") if g.strip())
    unknown = [g for g in groups if g not in ALL_GROUPS]
    if unknown:
        print(f"tvm-taso: error: unknown --ops {', '.join(unknown)} (known: {', '.join(ALL_GROUPS)})", file=sys.stderr)
        return 2
    cfg = GenConfig(max_ops=args.max_ops, groups=groups, seed=args.seed, time_limit=args.time_limit,
                    workers=max(1, args.workers), implied=not args.no_implied,
                    both_directions=not args.one_direction,
                    implied_by=tuple(open(f).read() for f in args.implied_by))
    result = generate(cfg)
    text = render(result)
    if args.output:
        import os
        import tempfile

        directory = os.path.dirname(os.path.abspath(args.output))
        fd, tmp = tempfile.mkstemp(prefix=".tvm-taso-", suffix=".rules", dir=directory)
        with os.fdopen(fd, "w") as f:
            f.write(text)
        os.replace(tmp, args.output)
    else:
        sys.stdout.write(text)
    for k, v in result.stats.items():
        print(f"{k:48s} {v}", file=sys.stderr)
    print(f"{'families':48s} " + ", ".join(f"{k} {v}" for k, v in result.families.items()), file=sys.stderr)
    print(f"{'seconds':48s} {result.seconds:.1f}" + (" (stopped at the time limit)" if result.truncated else ""),
          file=sys.stderr)
    if args.output:
        print(f"written {args.output} ({len(result.rules)} rules)", file=sys.stderr)
    return 0


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(prog="tvm-taso rules")
    add_generate_command(parser.add_subparsers(dest="rules_command", required=True))
    args = parser.parse_args(argv)
    return args.func(args)


if __name__ == "__main__":
    sys.exit(main())
