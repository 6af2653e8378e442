"""What the generator enumerates over: the domains (input tensors and TASO's constants, with
symbolic sizes) and the operator templates, each standing for a short sequence of Relax ops."""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np

from tvm_taso.ir import ops as _ops

SIZE_BASE = 1 << 12  # base of the symbolic size codes used while enumerating

# Same-size padding of the conv kernels, and the padding that enlarges a kernel to 3x3
SAME_PAD = {(1, 1): (0, 0, 0, 0), (3, 3): (1, 1, 1, 1), (1, 3): (0, 1, 0, 1), (3, 1): (1, 0, 1, 0)}
ENLARGE_PAD = {(1, 1): (0, 0, 0, 0, 1, 1, 1, 1), (1, 3): (0, 0, 0, 0, 1, 1, 0, 0), (3, 1): (0, 0, 0, 0, 0, 0, 1, 1)}

GCONV_GROUPS = 2  # the group count of the grouped-conv templates

ROLE_PREFIX = {"act": "x", "weight": "w", "scalar": "s"}  # how leaves of each role are named


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
        """Symbolic size code of a leaf dim: a literal, or SIZE_BASE**(symbol index + 1)."""
        if isinstance(d, int):
            return d
        return SIZE_BASE ** (list(self.symbols).index(d) + 1)

    def size(self, d) -> int:
        return d if isinstance(d, int) else self.symbols[d]

    def leaf(self, name: str) -> Leaf:
        for lf in self.leaves:
            if lf.name == name:
                return lf
        raise KeyError(name)

    def codes(self) -> dict:
        """Atom ``(leaf name, axis)`` -> symbolic size code (how the enumeration compared sizes)."""
        return {(lf.name, i): self.code(d) for lf in self.leaves for i, d in enumerate(lf.dims)}

    def sizes(self) -> dict:
        """Atom ``(leaf name, axis)`` -> the concrete size the enumeration used."""
        return {(lf.name, i): self.size(d) for lf in self.leaves for i, d in enumerate(lf.dims)}


def domains(constants: bool) -> list[Domain]:
    """The matrix domain (``n x k`` activations, ``k x k`` weights) and the NCHW/OIHW conv
    domain; with ``constants``, TASO's constants too."""
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


def const_value(leaf: Leaf, shape: tuple) -> np.ndarray:
    """The value of one of TASO's constants at ``shape`` (int64)."""
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


@dataclass(frozen=True)
class OpTemplate:
    """One operator of the enumeration (TASO's OpTemp): ``kind`` says how it checks shapes and
    computes; ``group`` is the name ``--ops`` selects it by."""

    name: str
    kind: str  # matmul conv gconv dwconv pool relu add mul smul concat split transpose enlarge
    group: str
    arity: int
    kernel: tuple = ()  # conv kernel (kh, kw)
    relu: bool = False  # conv with a fused relu
    axis: int = 0  # concat / split axis
    pool: str = ""  # "avg" / "max"
    domain: str = ""  # only in this domain ("" both)


def templates(domains_used: set[str], groups: set[str]) -> list[OpTemplate]:
    """The templates of the operator ``groups`` that apply in ``domains_used``, in enumeration order."""
    ts = [OpTemplate("matmul", "matmul", "matmul", 2, domain="mat")]
    for k in ((1, 1), (3, 3), (1, 3), (3, 1)):
        for r in (False, True):
            ts.append(OpTemplate(f"conv{k[0]}x{k[1]}{'r' if r else ''}", "conv", "conv2d", 2, kernel=k, relu=r,
                                 domain="conv"))
    # a conv with two groups, on operands a concat made of two halves (the concat/grouped-conv
    # family: concat(conv(x1, w1), conv(x2, w2)) = conv(concat(x1, x2), concat(w1, w2), groups=2))
    for k in ((1, 1), (3, 3)):
        ts.append(OpTemplate(f"gconv{k[0]}x{k[1]}", "gconv", "conv2d", 2, kernel=k, domain="conv"))
    ts.append(OpTemplate("dwconv3x3", "dwconv", "const", 2, kernel=(3, 3), domain="conv"))
    ts += [
        OpTemplate("avgpool", "pool", "pool", 1, pool="avg", domain="conv"),
        OpTemplate("maxpool", "pool", "pool", 1, pool="max", domain="conv"),
        OpTemplate("enlarge", "enlarge", "enlarge", 1, domain="conv"),
        OpTemplate("relu", "relu", "relu", 1),
        OpTemplate("add", "add", "add", 2),
        OpTemplate("mul", "mul", "multiply", 2),
        OpTemplate("smul", "smul", "scalar", 2),
        OpTemplate("concat0", "concat", "concat", 2, axis=0),
        OpTemplate("concat1", "concat", "concat", 2, axis=1),
        OpTemplate("split0", "split", "split", 1, axis=0),
        OpTemplate("split1", "split", "split", 1, axis=1),
        OpTemplate("transpose", "transpose", "transpose", 1, domain="mat"),
    ]
    return [t for t in ts if t.group in groups and (not t.domain or t.domain in domains_used)]


ALL_GROUPS = ("matmul", "conv2d", "add", "multiply", "scalar", "relu", "concat", "split", "transpose", "pool",
              "enlarge", "const")

TEMPLATES = {t.name: t for t in templates({"mat", "conv"}, set(ALL_GROUPS))}


def base_name(tname: str) -> str:
    """A fused conv+relu template's conv (``conv3x3r`` -> ``conv3x3``)."""
    return tname[:-1] if TEMPLATES[tname].relu else tname


def relax_steps(t: OpTemplate, shape: tuple, split_at: int | None = None) -> list[tuple[str, dict]]:
    """The Relax ops ``(name, attrs)`` that ``t`` stands for, applied in sequence (the first to
    the template's operands, each later one to the previous output), for a first operand of
    ``shape``; attrs are complete (the op table's defaults filled in)."""
    if t.kind == "matmul":
        steps = [("matmul", {})]
    elif t.kind == "conv":
        steps = [("conv2d", {"padding": SAME_PAD[t.kernel]})] + ([("relu", {})] if t.relu else [])
    elif t.kind == "gconv":
        steps = [("conv2d", {"padding": SAME_PAD[t.kernel], "groups": GCONV_GROUPS})]
    elif t.kind == "dwconv":
        steps = [("conv2d", {"padding": SAME_PAD[t.kernel], "groups": shape[1]})]
    elif t.kind == "pool":
        steps = [(f"{t.pool}_pool2d", {"pool_size": (3, 3), "padding": (1, 1, 1, 1)})]
    elif t.kind == "relu":
        steps = [("relu", {})]
    elif t.kind == "add":
        steps = [("add", {})]
    elif t.kind in ("mul", "smul"):
        steps = [("multiply", {})]
    elif t.kind == "concat":
        steps = [("concat", {"axis": t.axis})]
    elif t.kind == "split":
        steps = [("split", {"indices": (split_at,), "axis": t.axis})]
    elif t.kind == "transpose":
        steps = [("permute_dims", {"axes": (1, 0)})]
    elif t.kind == "enlarge":
        steps = [("pad", {"pad_width": ENLARGE_PAD[tuple(shape[2:])]})]
    else:
        raise ValueError(t.kind)
    return [(name, {**_ops.OPS[name].defaults, **attrs}) for name, attrs in steps]
