"""The operator properties the verifier proves rules from (TASO's axioms): the catalogue.

Each axiom is a function over an algebra returning ``Eq``, ``Def`` or ``Fact``
(:mod:`tvm_taso.verify.statements`), with a spec for each variable that says its sort and how
to draw it for the numeric check (:mod:`tvm_taso.verify.soundness`). :data:`AXIOMS` lists them
in the order they are defined here, grouped by the ops they relate.
"""

from __future__ import annotations

from tvm_taso.rewrite.rule import FUNCTIONS
from tvm_taso.verify.statements import Axiom, Bool, Def, DType, Eq, Fact, Int, Real, Tup, make_axiom

AXIOMS: list[Axiom] = []
_GROUP = ["?"]


def group(name: str) -> None:
    """Put the axioms defined after this in group ``name``."""
    _GROUP[0] = name


def axiom(**specs):
    """Register the decorated function as an axiom; keyword arguments give each variable's
    spec (a string is a tensor template)."""

    def deco(fn):
        AXIOMS.append(make_axiom(fn.__name__.replace("_", "-"), fn, _GROUP[0], **specs))
        return fn

    return deco


# Attribute samplers used below.
def _last(name):
    return Int(lambda s: s.rank(name) - 1)


_AXIS = Int(lambda s: s.int(0, 1))
_STRIDES = Tup(lambda s: (s.int(1, 2), s.int(1, 2)))
_PADDING = Tup(lambda s: s.pads(4, 0, 1))
_DILATION = Tup(lambda s: s.choice(((1, 1), (1, 1), (2, 1), (1, 2))))
_GROUPS = Int(lambda s: s.size("g"))
_POOL = Tup(lambda s: (s.int(1, 3), s.int(1, 2)))
_FALSE = Bool(lambda s: False)
_ANYBOOL = Bool(lambda s: s.choice((False, True)))
_PERM = Tup(lambda s: s.perm(s.rank("x")))


# --- elementwise add and multiply: commutative, associative, distributive ----------------------
group("elementwise")


@axiom(x="* m n", y="* m n")
def add_comm(A, x, y):
    """x + y = y + x (with broadcasting)."""
    return Eq(A.add(x, y), A.add(y, x))


@axiom(x="* m n", y="* m n", z="* m n")
def add_assoc(A, x, y, z):
    """(x + y) + z = x + (y + z)."""
    return Eq(A.add(A.add(x, y), z), A.add(x, A.add(y, z)))


@axiom(x="* m n", y="* m n", z="* m n")
def add_assoc_rev(A, x, y, z):
    """x + (y + z) = (x + y) + z."""
    return Eq(A.add(x, A.add(y, z)), A.add(A.add(x, y), z))


@axiom(x="* m n", y="* m n")
def mul_comm(A, x, y):
    """x * y = y * x."""
    return Eq(A.multiply(x, y), A.multiply(y, x))


@axiom(x="* m n", y="* m n", z="* m n")
def mul_assoc(A, x, y, z):
    """(x * y) * z = x * (y * z)."""
    return Eq(A.multiply(A.multiply(x, y), z), A.multiply(x, A.multiply(y, z)))


@axiom(x="* m n", y="* m n", z="* m n")
def mul_assoc_rev(A, x, y, z):
    """x * (y * z) = (x * y) * z."""
    return Eq(A.multiply(x, A.multiply(y, z)), A.multiply(A.multiply(x, y), z))


@axiom(x="* m n", y="* m n", z="* m n")
def mul_distrib(A, x, y, z):
    """x * (y + z) = x * y + x * z."""
    return Eq(A.multiply(x, A.add(y, z)), A.add(A.multiply(x, y), A.multiply(x, z)))


@axiom(x="* m n", y="* m n", z="* m n")
def mul_factor(A, x, y, z):
    """x * y + x * z = x * (y + z)."""
    return Eq(A.add(A.multiply(x, y), A.multiply(x, z)), A.multiply(x, A.add(y, z)))


@axiom(x="* m n")
def relu_idem(A, x):
    """relu(relu(x)) = relu(x)."""
    return Eq(A.relu(A.relu(x)), A.relu(x))


# --- constants (TASO's scalar constants: 0, 1, folding) ----------------------------------------
group("constants")
_ONE = Real(lambda s: 1.0)
_ZERO = Real(lambda s: 0.0)
_VALUE = Real(lambda s: s.choice((-1.5, 0.0, 0.5, 2.0)))
_DT = DType(lambda s: "float64")


@axiom(x="* m n", v=_ONE, d=_DT)
def mul_one(A, x, v, d):
    """x * 1 = x (the scalar has x's dtype)."""
    return Eq(A.multiply(x, A.scalar(v, d)), x, A.And(v == 1, d == A.dt(x)))


@axiom(x="* m n", v=_ZERO, d=_DT)
def add_zero(A, x, v, d):
    """x + 0 = x."""
    return Eq(A.add(x, A.scalar(v, d)), x, A.And(v == 0, d == A.dt(x)))


@axiom(a=_VALUE, b=_VALUE, d=_DT)
def mul_scalars(A, a, b, d):
    """scalar(a) * scalar(b) = scalar(a·b)."""
    return Eq(A.multiply(A.scalar(a, d), A.scalar(b, d)), A.scalar(a * b, d))


@axiom(a=_VALUE, b=_VALUE, d=_DT)
def add_scalars(A, a, b, d):
    """scalar(a) + scalar(b) = scalar(a + b)."""
    return Eq(A.add(A.scalar(a, d), A.scalar(b, d)), A.scalar(a + b, d))


# --- matmul: associative, linear in each argument ----------------------------------------------
group("matmul")


@axiom(a="* m n", b="* n p", c="* p q")
def matmul_assoc(A, a, b, c):
    """(a·b)·c = a·(b·c), batch dims broadcasting."""
    return Eq(A.matmul(A.matmul(a, b), c), A.matmul(a, A.matmul(b, c)))


@axiom(a="* m n", b="* n p", c="* p q")
def matmul_assoc_rev(A, a, b, c):
    """a·(b·c) = (a·b)·c."""
    return Eq(A.matmul(a, A.matmul(b, c)), A.matmul(A.matmul(a, b), c))


@axiom(x="* m n", a="* n p", b="* n p")
def matmul_linear_rhs(A, x, a, b):
    """x·(a + b) = x·a + x·b for a, b of one shape."""
    return Eq(A.matmul(x, A.add(a, b)), A.add(A.matmul(x, a), A.matmul(x, b)), A.shp(a) == A.shp(b))


@axiom(x="* m n", a="* n p", b="* n p")
def matmul_factor_rhs(A, x, a, b):
    """x·a + x·b = x·(a + b) for a, b of one shape."""
    return Eq(A.add(A.matmul(x, a), A.matmul(x, b)), A.matmul(x, A.add(a, b)), A.shp(a) == A.shp(b))


@axiom(a="* m n", b="* m n", w="* n p")
def matmul_linear_lhs(A, a, b, w):
    """(a + b)·w = a·w + b·w for a, b of one shape."""
    return Eq(A.matmul(A.add(a, b), w), A.add(A.matmul(a, w), A.matmul(b, w)), A.shp(a) == A.shp(b))


@axiom(a="* m n", b="* m n", w="* n p")
def matmul_factor_lhs(A, a, b, w):
    """a·w + b·w = (a + b)·w for a, b of one shape."""
    return Eq(A.add(A.matmul(a, w), A.matmul(b, w)), A.matmul(A.add(a, b), w), A.shp(a) == A.shp(b))


@axiom(x="* m n", w="* n p", s="")
def matmul_scalar_rhs(A, x, w, s):
    """x·(w * s) = (x·w) * s for a rank-0 s (scalar multiplication commutes with matmul)."""
    return Eq(A.matmul(x, A.multiply(w, s)), A.multiply(A.matmul(x, w), s), A.rank(s) == 0)


@axiom(x="* m n", w="* n p", s="")
def matmul_scalar_lhs(A, x, w, s):
    """(x * s)·w = (x·w) * s for a rank-0 s."""
    return Eq(A.matmul(A.multiply(x, s), w), A.multiply(A.matmul(x, w), s), A.rank(s) == 0)


@axiom(x="* m n", w="* n p", s="")
def scalar_into_matmul(A, x, w, s):
    """(x·w) * s = x·(w * s) for a rank-0 s."""
    return Eq(A.multiply(A.matmul(x, w), s), A.matmul(x, A.multiply(w, s)), A.rank(s) == 0)


# --- matmul over concat (TASO: matmul distributes over concat of either operand) ----------------


@axiom(x="* m n", a="* n p", b="* n q", k=_last("a"))
def matmul_concat_rhs(A, x, a, b, k):
    """x·[a b] = [x·a x·b]: concat on the columns of the right operand."""
    return Def(
        A.matmul(x, A.concat(k, a, b)),
        A.concat(A.rank(A.matmul(x, a)) - 1, A.matmul(x, a), A.matmul(x, b)),
        k == A.rank(a) - 1,
    )


@axiom(x="* m n", a="n p", b="n q", j=Int(lambda s: s.rank("x") - 1))
def concat_matmul_rhs(A, x, a, b, j):
    """[x·a x·b] = x·[a b] for 2-d a, b."""
    return Def(
        A.concat(j, A.matmul(x, a), A.matmul(x, b)),
        A.matmul(x, A.concat(A.rank(a) - 1, a, b)),
        A.And(j == A.rank(A.matmul(x, a)) - 1, A.rank(a) == 2, A.rank(b) == 2),
    )


@axiom(a="* m n", b="* p n", w="* n q", k=Int(lambda s: s.rank("a") - 2))
def matmul_concat_lhs(A, a, b, w, k):
    """[a; b]·w = [a·w; b·w]: concat on the rows of the left operand."""
    return Def(
        A.matmul(A.concat(k, a, b), w),
        A.concat(A.rank(A.matmul(a, w)) - 2, A.matmul(a, w), A.matmul(b, w)),
        k == A.rank(a) - 2,
    )


@axiom(a="m n", b="p n", w="n q", j=Int(lambda s: 0))
def concat_matmul_lhs(A, a, b, w, j):
    """[a·w; b·w] = [a; b]·w for 2-d a, b, w."""
    return Def(
        A.concat(j, A.matmul(a, w), A.matmul(b, w)),
        A.matmul(A.concat(0, a, b), w),
        A.And(j == 0, A.rank(a) == 2, A.rank(b) == 2, A.rank(w) == 2),
    )


@axiom(a="* m n", b="* m p", c="* n q", d="* p q", k=_last("a"), j=Int(lambda s: s.rank("c") - 2))
def matmul_concat_inner(A, a, b, c, d, k, j):
    """[a b]·[c; d] = a·c + b·d when the cut points agree."""
    return Def(
        A.matmul(A.concat(k, a, b), A.concat(j, c, d)),
        A.add(A.matmul(a, c), A.matmul(b, d)),
        A.And(k == A.rank(a) - 1, j == A.rank(c) - 2, A.dim(A.rank(a) - 1, a) == A.dim(A.rank(c) - 2, c)),
    )


@axiom(a="* m n", b="* m p", c="n q", d="p q")
def matmul_sum_inner(A, a, b, c, d):
    """a·c + b·d = [a b]·[c; d] when the products have one shape and c, d are 2-d."""
    return Def(
        A.add(A.matmul(a, c), A.matmul(b, d)),
        A.matmul(A.concat(A.rank(a) - 1, a, b), A.concat(0, c, d)),
        A.And(A.rank(a) == A.rank(b), A.rank(c) == 2, A.rank(d) == 2, A.shp(A.matmul(a, c)) == A.shp(A.matmul(b, d))),
    )


# --- conv2d: linear in each argument, over concat, enlarge --------------------------------------
group("conv2d")
_X = "n g*c H W"
_W = "g*o c h w"


@axiom(s=_STRIDES, p=_PADDING, d=_DILATION, g=_GROUPS, x=_X, a=_W, b=_W)
def conv_linear_w(A, s, p, d, g, x, a, b):
    """conv(x, a + b) = conv(x, a) + conv(x, b) for kernels of one shape."""
    return Eq(
        A.conv2d(s, p, d, g, x, A.add(a, b)),
        A.add(A.conv2d(s, p, d, g, x, a), A.conv2d(s, p, d, g, x, b)),
        A.shp(a) == A.shp(b),
    )


@axiom(s=_STRIDES, p=_PADDING, d=_DILATION, g=_GROUPS, x=_X, a=_W, b=_W)
def conv_factor_w(A, s, p, d, g, x, a, b):
    """conv(x, a) + conv(x, b) = conv(x, a + b) for kernels of one shape."""
    return Eq(
        A.add(A.conv2d(s, p, d, g, x, a), A.conv2d(s, p, d, g, x, b)),
        A.conv2d(s, p, d, g, x, A.add(a, b)),
        A.shp(a) == A.shp(b),
    )


@axiom(s=_STRIDES, p=_PADDING, d=_DILATION, g=_GROUPS, x=_X, y=_X, w=_W)
def conv_linear_x(A, s, p, d, g, x, y, w):
    """conv(x + y, w) = conv(x, w) + conv(y, w) for inputs of one shape."""
    return Eq(
        A.conv2d(s, p, d, g, A.add(x, y), w),
        A.add(A.conv2d(s, p, d, g, x, w), A.conv2d(s, p, d, g, y, w)),
        A.shp(x) == A.shp(y),
    )


@axiom(s=_STRIDES, p=_PADDING, d=_DILATION, g=_GROUPS, x=_X, w=_W, k="")
def conv_scalar_w(A, s, p, d, g, x, w, k):
    """conv(x, w * k) = conv(x, w) * k for a rank-0 k."""
    return Eq(A.conv2d(s, p, d, g, x, A.multiply(w, k)), A.multiply(A.conv2d(s, p, d, g, x, w), k), A.rank(k) == 0)


@axiom(s=_STRIDES, p=_PADDING, d=_DILATION, g=_GROUPS, x=_X, w=_W, k="")
def scalar_into_conv(A, s, p, d, g, x, w, k):
    """conv(x, w) * k = conv(x, w * k) for a rank-0 k."""
    return Eq(A.multiply(A.conv2d(s, p, d, g, x, w), k), A.conv2d(s, p, d, g, x, A.multiply(w, k)), A.rank(k) == 0)


_G1 = Int(lambda s: 1)


@axiom(s=_STRIDES, p=_PADDING, d=_DILATION, g=_G1, x="n c H W", a="o c h w", b="q c h w", k=Int(lambda s: 0))
def conv_concat_w(A, s, p, d, g, x, a, b, k):
    """conv(x, [a; b]) = [conv(x, a) conv(x, b)]: stacking kernels stacks output channels."""
    return Def(
        A.conv2d(s, p, d, g, x, A.concat(k, a, b)),
        A.concat(1, A.conv2d(s, p, d, g, x, a), A.conv2d(s, p, d, g, x, b)),
        A.And(k == 0, g == 1),
    )


@axiom(s=_STRIDES, p=_PADDING, d=_DILATION, g=_G1, x="n c H W", a="o c h w", b="q c h w", j=Int(lambda s: 1))
def concat_conv_w(A, s, p, d, g, x, a, b, j):
    """[conv(x, a) conv(x, b)] = conv(x, [a; b]) for kernels of one size."""
    return Def(
        A.concat(j, A.conv2d(s, p, d, g, x, a), A.conv2d(s, p, d, g, x, b)),
        A.conv2d(s, p, d, g, x, A.concat(0, a, b)),
        A.And(j == 1, g == 1, A.dim(2, a) == A.dim(2, b), A.dim(3, a) == A.dim(3, b)),
    )


@axiom(
    s=_STRIDES, p=_PADDING, d=_DILATION, g=_G1, x="n c H W", y="n e H W", a="o c h w", b="o e h w",
    k=Int(lambda s: 1), j=Int(lambda s: 1),
)
def conv_concat_x(A, s, p, d, g, x, y, a, b, k, j):
    """conv([x y], [a b]) = conv(x, a) + conv(y, b): concat on input channels."""
    return Def(
        A.conv2d(s, p, d, g, A.concat(k, x, y), A.concat(j, a, b)),
        A.add(A.conv2d(s, p, d, g, x, a), A.conv2d(s, p, d, g, y, b)),
        A.And(k == 1, j == 1, g == 1, A.dim(1, x) == A.dim(1, a)),
    )


@axiom(s=_STRIDES, p=_PADDING, d=_DILATION, g=_GROUPS, x=_X, y=_X, w=_W, k=Int(lambda s: 0))
def conv_concat_batch(A, s, p, d, g, x, y, w, k):
    """conv([x; y] on the batch axis, w) = [conv(x, w); conv(y, w)]."""
    return Def(
        A.conv2d(s, p, d, g, A.concat(k, x, y), w),
        A.concat(0, A.conv2d(s, p, d, g, x, w), A.conv2d(s, p, d, g, y, w)),
        k == 0,
    )


@axiom(s=_STRIDES, p=_PADDING, d=_DILATION, g=_GROUPS, x=_X, y=_X, w=_W, j=Int(lambda s: 0))
def concat_conv_batch(A, s, p, d, g, x, y, w, j):
    """[conv(x, w); conv(y, w)] = conv([x; y], w) for inputs that agree off the batch axis."""
    return Def(
        A.concat(j, A.conv2d(s, p, d, g, x, w), A.conv2d(s, p, d, g, y, w)),
        A.conv2d(s, p, d, g, A.concat(0, x, y), w),
        A.And(j == 0, A.dim(1, x) == A.dim(1, y), A.dim(2, x) == A.dim(2, y), A.dim(3, x) == A.dim(3, y)),
    )


@axiom(s=_STRIDES, p=_PADDING, d=_DILATION, g=_GROUPS, x=_X, w=_W, k="")
def conv_scalar_x(A, s, p, d, g, x, w, k):
    """conv(x * k, w) = conv(x, w) * k for a rank-0 k (zero padding scales too)."""
    return Eq(A.conv2d(s, p, d, g, A.multiply(x, k), w), A.multiply(A.conv2d(s, p, d, g, x, w), k), A.rank(k) == 0)


@axiom(s=_STRIDES, p=_PADDING, d=_DILATION, g=_GROUPS, x=_X, w=_W, k="")
def scalar_into_conv_x(A, s, p, d, g, x, w, k):
    """conv(x, w) * k = conv(x * k, w) for a rank-0 k."""
    return Eq(A.multiply(A.conv2d(s, p, d, g, x, w), k), A.conv2d(s, p, d, g, A.multiply(x, k), w), A.rank(k) == 0)


def _enlarge_width(s):
    return (0, 0, 0, 0) + s.pads(4, 0, 2)


@axiom(
    s=_STRIDES, q=Tup(lambda s: tuple(e + s.int(0, 1) for e in s.values["e"][4:])), d=Tup(lambda s: (1, 1)),
    g=_GROUPS, x=_X, w=_W, e=Tup(_enlarge_width), v=_ZERO,
)
def conv_enlarge(A, s, e, q, d, g, x, w, v):
    """TASO's enlarge: zero-padding the kernel by (t, b, l, r) and the input by as much more
    computes the same convolution: conv(x, pad(w, e), padding q) = conv(x, w, padding q - e)."""
    n = A.tnth
    return Def(
        A.conv2d(s, q, d, g, x, A.pad(e, v, w)),
        A.conv2d(s, A.tup(n(q, 0) - n(e, 4), n(q, 1) - n(e, 6), n(q, 2) - n(e, 5), n(q, 3) - n(e, 7)), d, g, x, w),
        A.And(
            v == 0, d == A.tup(1, 1), A.tlen(e) == 8, A.tlen(q) == 4,
            n(e, 0) == 0, n(e, 1) == 0, n(e, 2) == 0, n(e, 3) == 0,
            n(e, 4) >= 0, n(e, 5) >= 0, n(e, 6) >= 0, n(e, 7) >= 0,
            n(q, 0) >= n(e, 4), n(q, 1) >= n(e, 6), n(q, 2) >= n(e, 5), n(q, 3) >= n(e, 7),
        ),
    )


# --- grouped convolutions: concat of convs, TASO's merge_gconv ----------------------------------
group("grouped-conv")
_GX, _GW = "n u*v*c H W", "u*v*o c h w"  # u*v groups of c input and o output channels


@axiom(
    s=_STRIDES, p=_PADDING, d=_DILATION, h=Int(lambda s: s.size("u")), g=Int(lambda s: s.size("u") * s.size("v")),
    k=Int(lambda s: s.size("v")), x=_GX, w=_GW,
)
def conv_merge_groups(A, s, p, d, h, g, k, x, w):
    """TASO's merge_gconv: the conv with h = g/k groups of the widened weight merge_groups(w, g,
    k) is the conv with g groups of w (the widened weight is zero where a merged group reads
    channels of another old group)."""
    return Def(
        A.conv2d(s, p, d, h, x, A.merge_groups(g, k, w)),
        A.conv2d(s, p, d, g, x, w),
        A.And(g == h * k, h >= 1, k >= 1),
    )


@axiom(g=Int(lambda s: s.size("u") * s.size("v")), k=Int(lambda s: s.size("v")), w=_GW)
def merge_groups_shape(A, g, k, w):
    """merge_groups(w, g, k) keeps rank 4, output channels, kernel size and dtype, and has k
    times w's input channels."""
    t = A.merge_groups(g, k, w)
    return Fact(
        A.And(
            A.rank(t) == 4, A.rank(w) == 4, A.dim(0, t) == A.dim(0, w), A.dim(1, t) == k * A.dim(1, w),
            A.dim(2, t) == A.dim(2, w), A.dim(3, t) == A.dim(3, w), A.dt(t) == A.dt(w), k >= 1,
        ),
        defined=[t],
    )


_TWO = dict(s=_STRIDES, p=_PADDING, d=_DILATION, x=_GX, y=_GX, a=_GW, b=_GW)


def _same_shapes(A, x, y, a, b):
    return A.And(A.shp(x) == A.shp(y), A.shp(a) == A.shp(b))


# two convs whose groups have one shape (c input and o output channels each): g and h of them
_TWO_COUNTS = dict(
    s=_STRIDES, p=_PADDING, d=_DILATION, x="n u*c H W", y="n v*c H W", a="u*o c h w", b="v*o c h w",
    g=Int(lambda s: s.size("u")), h=Int(lambda s: s.size("v")),
)


@axiom(**_TWO_COUNTS, j=Int(lambda s: 1))
def concat_group_convs(A, s, p, d, x, y, a, b, g, h, j):
    """[conv(x, a) conv(y, b)] on channels, with g and h groups of one shape (c input and o
    output channels each), is one conv with g + h groups of [x y] and [a; b]."""
    return Def(
        A.concat(j, A.conv2d(s, p, d, g, x, a), A.conv2d(s, p, d, h, y, b)),
        A.conv2d(s, p, d, g + h, A.concat(1, x, y), A.concat(0, a, b)),
        A.And(
            j == 1, A.dim(0, x) == A.dim(0, y), A.dim(2, x) == A.dim(2, y), A.dim(3, x) == A.dim(3, y),
            A.dim(1, a) == A.dim(1, b), A.dim(2, a) == A.dim(2, b), A.dim(3, a) == A.dim(3, b),
            A.dim(0, a) * h == A.dim(0, b) * g,
        ),
    )


@axiom(**_TWO_COUNTS, m=Int(lambda s: s.size("u") + s.size("v")))
def split_group_conv(A, s, p, d, x, y, a, b, g, h, m):
    """A conv with m = g + h groups over [x y] and [a; b] is [conv(x, a) conv(y, b)] with g and
    h groups, when the two halves' groups have one shape. The group counts are not in the left
    side, so the trigger is the merged conv together with the two convs it equals (present
    when a rule merges or splits them)."""
    merged = A.conv2d(s, p, d, m, A.concat(1, x, y), A.concat(0, a, b))
    left, right = A.conv2d(s, p, d, g, x, a), A.conv2d(s, p, d, h, y, b)
    return Def(
        merged, A.concat(1, left, right),
        A.And(
            m == g + h, g >= 1, h >= 1, A.dim(1, x) == g * A.dim(1, a), A.dim(1, y) == h * A.dim(1, b),
            A.dim(1, a) == A.dim(1, b), A.dim(0, a) * h == A.dim(0, b) * g,
        ),
        patterns=[[merged, left, right]],
    )


@axiom(**_TWO, h=Int(lambda s: 2 * s.size("u") * s.size("v")), k=Int(lambda s: 1), j=Int(lambda s: 0))
def group_conv_of_concats(A, s, p, d, x, y, a, b, h, k, j):
    """A conv with an even number h of groups over [x y] and [a; b] of one shape each is
    [conv(x, a) conv(y, b)], each with h/2 groups."""
    half = A.floordiv(h, A.lit(2, "Int"))
    return Def(
        A.conv2d(s, p, d, h, A.concat(k, x, y), A.concat(j, a, b)),
        A.concat(1, A.conv2d(s, p, d, half, x, a), A.conv2d(s, p, d, half, y, b)),
        A.And(k == 1, j == 0, h == 2 * half, _same_shapes(A, x, y, a, b)),
    )


# --- pooling over concat (channel or batch axis), avg pool is linear ---------------------------
group("pool")
_PS = dict(size=_POOL, s=_STRIDES, p=Tup(lambda s: (0, 0, 0, 0)), d=Tup(lambda s: (1, 1)), c=_FALSE)


@axiom(**_PS, a="n c H W", b="n e H W", k=_AXIS)
def maxpool_concat(A, size, s, p, d, c, a, b, k):
    """maxpool([a b]) = [maxpool(a) maxpool(b)] along the batch or channel axis."""
    f = lambda t: A.max_pool2d(size, s, p, d, c, t)  # noqa: E731
    return Def(f(A.concat(k, a, b)), A.concat(k, f(a), f(b)), A.And(k >= 0, k <= 1))


@axiom(**_PS, a="n c H W", b="n e H W", k=_AXIS)
def concat_maxpool(A, size, s, p, d, c, a, b, k):
    """[maxpool(a) maxpool(b)] = maxpool([a b]) for inputs that agree off the axis."""
    f = lambda t: A.max_pool2d(size, s, p, d, c, t)  # noqa: E731
    return Def(
        A.concat(k, f(a), f(b)),
        f(A.concat(k, a, b)),
        A.And(k >= 0, k <= 1, A.dim(1 - k, a) == A.dim(1 - k, b), A.dim(2, a) == A.dim(2, b), A.dim(3, a) == A.dim(3, b)),
    )


@axiom(**_PS, i=_ANYBOOL, a="n c H W", b="n e H W", k=_AXIS)
def avgpool_concat(A, size, s, p, d, c, i, a, b, k):
    """avgpool([a b]) = [avgpool(a) avgpool(b)] along the batch or channel axis."""
    f = lambda t: A.avg_pool2d(size, s, p, d, c, i, t)  # noqa: E731
    return Def(f(A.concat(k, a, b)), A.concat(k, f(a), f(b)), A.And(k >= 0, k <= 1))


@axiom(**_PS, i=_ANYBOOL, a="n c H W", b="n e H W", k=_AXIS)
def concat_avgpool(A, size, s, p, d, c, i, a, b, k):
    """[avgpool(a) avgpool(b)] = avgpool([a b]) for inputs that agree off the axis."""
    f = lambda t: A.avg_pool2d(size, s, p, d, c, i, t)  # noqa: E731
    return Def(
        A.concat(k, f(a), f(b)),
        f(A.concat(k, a, b)),
        A.And(k >= 0, k <= 1, A.dim(1 - k, a) == A.dim(1 - k, b), A.dim(2, a) == A.dim(2, b), A.dim(3, a) == A.dim(3, b)),
    )


@axiom(size=_POOL, s=_STRIDES, p=_PADDING, d=_DILATION, c=_FALSE, i=_ANYBOOL, x="n c H W", y="n c H W")
def avgpool_linear(A, size, s, p, d, c, i, x, y):
    """avgpool(x + y) = avgpool(x) + avgpool(y) for inputs of one shape."""
    f = lambda t: A.avg_pool2d(size, s, p, d, c, i, t)  # noqa: E731
    return Eq(f(A.add(x, y)), A.add(f(x), f(y)), A.shp(x) == A.shp(y))


@axiom(size=_POOL, s=_STRIDES, p=_PADDING, d=_DILATION, c=_FALSE, i=_ANYBOOL, x="n c H W", k="")
def avgpool_scalar(A, size, s, p, d, c, i, x, k):
    """avgpool(x * k) = avgpool(x) * k for a rank-0 k."""
    f = lambda t: A.avg_pool2d(size, s, p, d, c, i, t)  # noqa: E731
    return Eq(f(A.multiply(x, k)), A.multiply(f(x), k), A.rank(k) == 0)


@axiom(size=_POOL, s=_STRIDES, p=_PADDING, d=_DILATION, c=_FALSE, i=_ANYBOOL, x="n c H W", k="")
def scalar_into_avgpool(A, size, s, p, d, c, i, x, k):
    """avgpool(x) * k = avgpool(x * k) for a rank-0 k."""
    f = lambda t: A.avg_pool2d(size, s, p, d, c, i, t)  # noqa: E731
    return Eq(A.multiply(f(x), k), f(A.multiply(x, k)), A.rank(k) == 0)


_POINTWISE = dict(
    size=_POOL, s=_STRIDES, p=_PADDING, d=_DILATION, c=_FALSE, i=_ANYBOOL,
    cs=Tup(lambda s: (1, 1)), cp=Tup(lambda s: (0, 0, 0, 0)), cd=_DILATION, g=_GROUPS,
    x="n g*c H W", w="g*o c 1 1",
)


def _pointwise_guard(A, cs, cp, w):
    return A.And(cs == A.tup(1, 1), cp == A.tup(0, 0, 0, 0), A.dim(2, w) == 1, A.dim(3, w) == 1)


@axiom(**_POINTWISE)
def conv1x1_avgpool(A, size, s, p, d, c, i, cs, cp, cd, g, x, w):
    """A 1×1 convolution (stride 1, no padding) mixes channels pixel by pixel, so it commutes
    with average pooling: conv(avgpool(x), w) = avgpool(conv(x, w))."""
    f = lambda t: A.avg_pool2d(size, s, p, d, c, i, t)  # noqa: E731
    h = lambda t: A.conv2d(cs, cp, cd, g, t, w)  # noqa: E731
    return Def(h(f(x)), f(h(x)), _pointwise_guard(A, cs, cp, w))


@axiom(size=_POOL, s=_STRIDES, p=Tup(lambda s: (0, 0, 0, 0)), d=_DILATION, c=_FALSE, x="n c H W")
def maxpool_relu(A, size, s, p, d, c, x):
    """maxpool(relu(x)) = relu(maxpool(x)) without padding (relu is monotone)."""
    f = lambda t: A.max_pool2d(size, s, p, d, c, t)  # noqa: E731
    return Eq(f(A.relu(x)), A.relu(f(x)), p == A.tup(0, 0, 0, 0))


# --- concat and split geometry ----------------------------------------------------------------
group("concat-split")
_ANYAXIS = Int(lambda s: s.int(0, 2))


@axiom(a="m n p", b="m n p", c="m n p", k=_ANYAXIS)
def concat_assoc(A, a, b, c, k):
    """[[a b] c] = [a [b c]]."""
    return Eq(A.concat(k, A.concat(k, a, b), c), A.concat(k, a, A.concat(k, b, c)))


@axiom(a="m n p", b="m n p", c="m n p", k=_ANYAXIS)
def concat_assoc_rev(A, a, b, c, k):
    """[a [b c]] = [[a b] c]."""
    return Eq(A.concat(k, a, A.concat(k, b, c)), A.concat(k, A.concat(k, a, b), c))


@axiom(a="m n", b="m p", c="q n", d="q p", i=Int(lambda s: 1), j=Int(lambda s: 0))
def concat_swap(A, a, b, c, d, i, j):
    """TASO's concat geometry: concatenating a 2×2 block matrix by rows then columns equals
    columns then rows: [[a b]; [c d]] = [[a; c] [b; d]] when the blocks line up."""
    return Def(
        A.concat(j, A.concat(i, a, b), A.concat(i, c, d)),
        A.concat(i, A.concat(j, a, c), A.concat(j, b, d)),
        A.And(i >= 0, j >= 0, i != j, A.dim(i, a) == A.dim(i, c)),
    )


@axiom(a="m n", b="m n", k=_AXIS, s=Int(lambda s: 0), e=Int(lambda s: s.dim("a", s.values["k"])))
def slice_concat_left(A, a, b, k, s, e):
    """split0(concat(a, b)) = a: the first part of [a b] cut at a's size."""
    return Def(A.slice(k, A.concat(k, a, b), s, e), a, A.And(s == 0, e == A.dim(k, a)))


@axiom(
    a="m n", b="m n", k=_AXIS, s=Int(lambda s: s.dim("a", s.values["k"])),
    e=Int(lambda s: s.dim("a", s.values["k"]) + s.dim("b", s.values["k"])),
)
def slice_concat_right(A, a, b, k, s, e):
    """split1(concat(a, b)) = b."""
    return Def(A.slice(k, A.concat(k, a, b), s, e), b, A.And(s == A.dim(k, a), e == A.dim(k, a) + A.dim(k, b)))


@axiom(x="m n", k=_AXIS, s=Int(lambda s: 0), e=Int(lambda s: s.dim("x", s.values["k"])))
def slice_full(A, x, k, s, e):
    """The part of x from 0 to its whole size is x."""
    return Def(A.slice(k, x, s, e), x, A.And(s == 0, e == A.dim(k, x)))


def _cut(var):
    """Ordered cut points along x's axis k for concat_slices / slice_slice (drawn once per
    sample): concat_slices uses a <= b = c <= e, slice_slice x[a:b][c:e] with c < e <= b - a."""

    def fn(s):
        if "_cuts" not in s.sizes:
            d = s.dim("x", s.values["k"])
            a, b, e = sorted(int(v) for v in s.rng.integers(0, d + 1, size=3))
            c = int(s.rng.integers(0, max(e - a, 1)))
            s.sizes["_cuts"] = {"a": a, "b": b, "e": e, "c": c, "c2": c, "e2": min(e - a, c + 1 + s.int(0, 1))}
        return s.sizes["_cuts"][var]

    return fn


@axiom(x="m N", k=_AXIS, a=Int(_cut("a")), b=Int(_cut("b")), c=Int(_cut("b")), e=Int(_cut("e")))
def concat_slices(A, x, k, a, b, c, e):
    """[x[a:b] x[b:e]] = x[a:e] (concat of split)."""
    return Def(A.concat(k, A.slice(k, x, a, b), A.slice(k, x, c, e)), A.slice(k, x, a, e), b == c)


@axiom(x="m N", k=_AXIS, a=Int(_cut("a")), b=Int(_cut("e")), c=Int(_cut("c2")), e=Int(_cut("e2")))
def slice_slice(A, x, k, a, b, c, e):
    """x[a:b][c:e] = x[a+c : a+e] (split of a split)."""
    return Def(A.slice(k, A.slice(k, x, a, b), c, e), A.slice(k, x, a + c, a + e))


@axiom(a="m n p", b="m n p", j=_ANYAXIS, k=_ANYAXIS, s=Int(lambda s: 0), e=Int(lambda s: 1))
def slice_concat_other(A, a, b, j, k, s, e):
    """Cutting [a b] along another axis cuts a and b: [a b][s:e on j] = [a[s:e] b[s:e]]."""
    return Def(
        A.slice(j, A.concat(k, a, b), s, e),
        A.concat(k, A.slice(j, a, s, e), A.slice(j, b, s, e)),
        A.And(j != k, j >= 0, k >= 0),
    )


# --- elementwise ops with concat and split -----------------------------------------------------
group("elementwise-concat")


@axiom(a="m n", b="m p", c="m n", d="m p", k=Int(lambda s: 1))
def add_concat(A, a, b, c, d, k):
    """[a b] + [c d] = [a+c b+d] for matching parts."""
    return Eq(
        A.add(A.concat(k, a, b), A.concat(k, c, d)),
        A.concat(k, A.add(a, c), A.add(b, d)),
        A.And(A.shp(a) == A.shp(c), A.shp(b) == A.shp(d)),
    )


@axiom(a="m n", b="m p", c="m n", d="m p", k=Int(lambda s: 1))
def concat_add(A, a, b, c, d, k):
    """[a+c b+d] = [a b] + [c d] for matching parts."""
    return Eq(
        A.concat(k, A.add(a, c), A.add(b, d)),
        A.add(A.concat(k, a, b), A.concat(k, c, d)),
        A.And(A.shp(a) == A.shp(c), A.shp(b) == A.shp(d)),
    )


@axiom(a="m n", b="m p", c="m n", d="m p", k=Int(lambda s: 1))
def mul_concat(A, a, b, c, d, k):
    """[a b] * [c d] = [a*c b*d] for matching parts."""
    return Eq(
        A.multiply(A.concat(k, a, b), A.concat(k, c, d)),
        A.concat(k, A.multiply(a, c), A.multiply(b, d)),
        A.And(A.shp(a) == A.shp(c), A.shp(b) == A.shp(d)),
    )


@axiom(a="m n", b="m p", c="m n", d="m p", k=Int(lambda s: 1))
def concat_mul(A, a, b, c, d, k):
    """[a*c b*d] = [a b] * [c d] for matching parts."""
    return Eq(
        A.concat(k, A.multiply(a, c), A.multiply(b, d)),
        A.multiply(A.concat(k, a, b), A.concat(k, c, d)),
        A.And(A.shp(a) == A.shp(c), A.shp(b) == A.shp(d)),
    )


@axiom(a="m n", b="m p", k=Int(lambda s: 1))
def relu_concat(A, a, b, k):
    """relu([a b]) = [relu(a) relu(b)]."""
    return Eq(A.relu(A.concat(k, a, b)), A.concat(k, A.relu(a), A.relu(b)))


@axiom(a="m n", b="m p", k=Int(lambda s: 1))
def concat_relu(A, a, b, k):
    """[relu(a) relu(b)] = relu([a b])."""
    return Eq(A.concat(k, A.relu(a), A.relu(b)), A.relu(A.concat(k, a, b)))


@axiom(a="m n", b="m p", k=Int(lambda s: 1), c="")
def scalar_concat(A, a, b, k, c):
    """[a b] * c = [a*c b*c] for a rank-0 c."""
    return Eq(A.multiply(A.concat(k, a, b), c), A.concat(k, A.multiply(a, c), A.multiply(b, c)), A.rank(c) == 0)


@axiom(a="m n", b="m p", k=Int(lambda s: 1), c="")
def concat_scalar(A, a, b, k, c):
    """[a*c b*c] = [a b] * c for a rank-0 c."""
    return Eq(A.concat(k, A.multiply(a, c), A.multiply(b, c)), A.multiply(A.concat(k, a, b), c), A.rank(c) == 0)


_SLICE = dict(k=_AXIS, s=Int(lambda s: s.int(0, 1)), e=Int(lambda s: s.int(2, 3)))


@axiom(x="M N", **_SLICE)
def slice_relu(A, x, k, s, e):
    """relu(x)[s:e] = relu(x[s:e])."""
    return Eq(A.slice(k, A.relu(x), s, e), A.relu(A.slice(k, x, s, e)))


@axiom(x="M N", **_SLICE)
def relu_slice(A, x, k, s, e):
    """relu(x[s:e]) = relu(x)[s:e]."""
    return Eq(A.relu(A.slice(k, x, s, e)), A.slice(k, A.relu(x), s, e))


def _ew_slice(f):
    def build(A, x, y, k, s, e):
        j = k - A.rank(x) + A.rank(y)  # the same axis of y, dims aligned from the right
        return Eq(
            A.slice(k, f(A, x, y), s, e),
            f(A, A.slice(k, x, s, e), A.slice(j, y, s, e)),
            A.And(k >= 0, A.rank(x) >= A.rank(y), j >= 0, A.dim(k, x) == A.dim(j, y)),
        )

    return build


_EW_SLICE = dict(x="* M N", y="* M N", **_SLICE)


@axiom(**_EW_SLICE)
def slice_add(A, x, y, k, s, e):
    """(x + y)[s:e] = x[s:e] + y[s:e] on an axis where y is not broadcast (y may have fewer
    dims, aligned from the right)."""
    return _ew_slice(lambda A, a, b: A.add(a, b))(A, x, y, k, s, e)


@axiom(**_EW_SLICE)
def slice_mul(A, x, y, k, s, e):
    """(x * y)[s:e] = x[s:e] * y[s:e] on an axis where y is not broadcast."""
    return _ew_slice(lambda A, a, b: A.multiply(a, b))(A, x, y, k, s, e)


# --- transpose: composition, identity, involution, distribution --------------------------------
group("transpose")


@axiom(x="m n p", p=_PERM, q=_PERM)
def transpose_compose(A, x, p, q):
    """transpose(transpose(x, p), q) = transpose(x, compose(p, q))."""
    return Def(A.transpose(q, A.transpose(p, x)), A.transpose(A.compose(p, q), x))


@axiom(x="m n p", p=Tup(lambda s: tuple(range(s.rank("x")))))
def transpose_identity(A, x, p):
    """transpose(x, identity) = x."""
    return Def(A.transpose(p, x), x, A.isid(p))


@axiom(x="m n p", p=_PERM)
def transpose_inverse(A, x, p):
    """transpose(transpose(x, p), inverse(p)) = x (involution when p is its own inverse)."""
    return Def(A.transpose(A.inverse(p), A.transpose(p, x)), x)


@axiom(x="m n p", p=_PERM)
def transpose_relu(A, x, p):
    """transpose(relu(x)) = relu(transpose(x))."""
    return Eq(A.transpose(p, A.relu(x)), A.relu(A.transpose(p, x)))


@axiom(x="m n p", y="m n p", p=_PERM)
def transpose_add(A, x, y, p):
    """transpose(x + y) = transpose(x) + transpose(y) for operands of one shape."""
    return Eq(A.transpose(p, A.add(x, y)), A.add(A.transpose(p, x), A.transpose(p, y)), A.shp(x) == A.shp(y))


@axiom(x="m n p", y="m n p", p=_PERM)
def transpose_mul(A, x, y, p):
    """transpose(x * y) = transpose(x) * transpose(y) for operands of one shape."""
    return Eq(
        A.transpose(p, A.multiply(x, y)), A.multiply(A.transpose(p, x), A.transpose(p, y)), A.shp(x) == A.shp(y)
    )


@axiom(x="m n p", k="", p=_PERM)
def transpose_scalar(A, x, k, p):
    """transpose(x * k) = transpose(x) * k for a rank-0 k."""
    return Eq(A.transpose(p, A.multiply(x, k)), A.multiply(A.transpose(p, x), k), A.rank(k) == 0)


@axiom(x="m n p", k="", p=_PERM)
def scalar_transpose(A, x, k, p):
    """transpose(x) * k = transpose(x * k) for a rank-0 k."""
    return Eq(A.multiply(A.transpose(p, x), k), A.transpose(p, A.multiply(x, k)), A.rank(k) == 0)


@axiom(x="m n p", p=_PERM)
def relu_transpose(A, x, p):
    """relu(transpose(x)) = transpose(relu(x))."""
    return Eq(A.relu(A.transpose(p, x)), A.transpose(p, A.relu(x)))


@axiom(a="* m n", b="* n p", p=Tup(lambda s: FUNCTIONS["last-two-swapped"](max(s.rank("a"), s.rank("b")))))
def transpose_matmul(A, a, b, p):
    """(a·b)ᵀ = bᵀ·aᵀ (ᵀ swaps the last two axes)."""
    return Eq(
        A.transpose(p, A.matmul(a, b)),
        A.matmul(A.transpose(A.lts(A.rank(b)), b), A.transpose(A.lts(A.rank(a)), a)),
        p == A.lts(A.rank(A.matmul(a, b))),
    )


@axiom(
    a="* n m", b="* p n", p=Tup(lambda s: FUNCTIONS["last-two-swapped"](s.rank("a"))),
    q=Tup(lambda s: FUNCTIONS["last-two-swapped"](s.rank("b"))),
)
def matmul_transposes(A, a, b, p, q):
    """aᵀ·bᵀ = (b·a)ᵀ."""
    return Eq(
        A.matmul(A.transpose(p, a), A.transpose(q, b)),
        A.transpose(A.lts(A.rank(A.matmul(b, a))), A.matmul(b, a)),
        A.And(p == A.lts(A.rank(a)), q == A.lts(A.rank(b))),
    )


@axiom(a="m n p", b="m n p", p=Tup(lambda s: s.perm(3)), k=_ANYAXIS)
def transpose_concat(A, a, b, p, k):
    """transpose([a b] on axis k) = [transpose(a) transpose(b)] on the axis k moves to."""
    return Def(
        A.transpose(p, A.concat(k, a, b)),
        A.concat(A.tnth(A.inverse(p), k), A.transpose(p, a), A.transpose(p, b)),
        k >= 0,
    )


@axiom(a="m n p", b="m n p", p=Tup(lambda s: s.perm(3)), j=_ANYAXIS)
def concat_transpose(A, a, b, p, j):
    """[transpose(a) transpose(b)] on axis j = transpose([a b] on axis p[j])."""
    return Def(
        A.concat(j, A.transpose(p, a), A.transpose(p, b)),
        A.transpose(p, A.concat(A.tnth(p, j), a, b)),
        j >= 0,
    )


# --- shape facts (what ops.infer says about result shapes) ------------------------------------
group("shapes")


@axiom(x="m n p", k=Int(lambda s: s.int(-3, -1)))
def dim_negative(A, x, k):
    """dim(k) for a negative k reads from the end: dim(k, x) = dim(k + rank, x)."""
    return Fact(A.dim(k, x) == A.dim(k + A.rank(x), x), guard=A.And(k < 0, k >= -A.rank(x)), patterns=[[A.dim(k, x)]])


@axiom(a="* m n", b="* m n")
def shape_ext(A, a, b):
    """Shapes with the same rank and the same dims are the same shape (ranks up to 6)."""
    same = [
        A.Implies(A.And(A.rank(a) == n, A.rank(b) == n, *[A.dim(i, a) == A.dim(i, b) for i in range(n)]), A.shp(a) == A.shp(b))
        for n in range(7)
    ]
    return Fact(A.And(*same), patterns=[[A.shp(a), A.shp(b)]])


@axiom(x="* m n")
def relu_shape(A, x):
    """relu keeps shape and dtype (⊥ included)."""
    return Fact(A.And(A.shp(A.relu(x)) == A.shp(x), A.dt(A.relu(x)) == A.dt(x)), patterns=[[A.relu(x)]])


def _ew_shape(f):
    def build(A, x, y):
        t = f(A, x, y)
        return Fact(
            A.And(
                A.rank(t) == A.max(A.rank(x), A.rank(y)),
                A.dt(t) == A.dt(x),
                A.dt(y) == A.dt(x),
                A.Implies(A.shp(x) == A.shp(y), A.shp(t) == A.shp(x)),
            ),
            defined=[t],
        )

    return build


def _ew_dims(f):
    def build(A, x, y, j):
        t = f(A, x, y)
        r = A.rank(t)
        jx, jy = j - r + A.rank(x), j - r + A.rank(y)  # the same axis of x and y (right-aligned)
        dx, dy = A.dim(jx, x), A.dim(jy, y)
        return Fact(
            A.dim(j, t) == A.If(jx >= 0, A.If(jy >= 0, A.max(dx, dy), dx), dy),
            defined=[t],
            guard=A.And(j >= 0, j < r),
            patterns=[[A.dim(j, t)]],
        )

    return build


@axiom(x="* m n", y="* m n", j=Int(lambda s: s.int(0, 3)))
def add_dims(A, x, y, j):
    """x + y broadcasts: each dim is the larger of the aligned dims (the other is 1 or equal)."""
    return _ew_dims(lambda A, a, b: A.add(a, b))(A, x, y, j)


@axiom(x="* m n", y="* m n", j=Int(lambda s: s.int(0, 3)))
def mul_dims(A, x, y, j):
    """x * y broadcasts like x + y."""
    return _ew_dims(lambda A, a, b: A.multiply(a, b))(A, x, y, j)


@axiom(x="* m n", y="* m n")
def add_shape(A, x, y):
    """x + y has the larger rank, the dtype of both, and x's shape when shapes agree."""
    return _ew_shape(lambda A, a, b: A.add(a, b))(A, x, y)


@axiom(x="* m n", y="* m n")
def mul_shape(A, x, y):
    """x * y has the larger rank, the dtype of both, and x's shape when shapes agree."""
    return _ew_shape(lambda A, a, b: A.multiply(a, b))(A, x, y)


@axiom(a="* m n", b="* n p")
def matmul_shape(A, a, b):
    """a·b: rank max(rank a, rank b) >= 2, rows of a, columns of b, inner dims agree."""
    t = A.matmul(a, b)
    ra, rb, rt = A.rank(a), A.rank(b), A.rank(t)
    return Fact(
        A.And(
            rt == A.max(ra, rb), ra >= 2, rb >= 2,
            A.dim(ra - 1, a) == A.dim(rb - 2, b),
            A.dim(rt - 1, t) == A.dim(rb - 1, b),
            A.dim(rt - 2, t) == A.dim(ra - 2, a),
            A.dt(t) == A.dt(a), A.dt(b) == A.dt(a),
        ),
        defined=[t],
    )


@axiom(s=_STRIDES, p=_PADDING, d=_DILATION, g=_GROUPS, x=_X, w=_W)
def conv_shape(A, s, p, d, g, x, w):
    """conv2d: NCHW in and out, batch of x, output channels of w, channels of x = groups × w's."""
    t = A.conv2d(s, p, d, g, x, w)
    return Fact(
        A.And(
            A.rank(t) == 4, A.rank(x) == 4, A.rank(w) == 4,
            A.dim(0, t) == A.dim(0, x), A.dim(1, t) == A.dim(0, w),
            A.dim(1, x) == g * A.dim(1, w),
            A.dt(t) == A.dt(x), A.dt(w) == A.dt(x),
            A.tlen(p) == 4, A.tnth(p, 0) >= 0, A.tnth(p, 1) >= 0, A.tnth(p, 2) >= 0, A.tnth(p, 3) >= 0,
        ),
        defined=[t],
    )


@axiom(size=_POOL, s=_STRIDES, p=_PADDING, d=_DILATION, c=_FALSE, x="n c H W")
def maxpool_shape(A, size, s, p, d, c, x):
    """max_pool2d keeps rank 4, batch, channels and dtype."""
    t = A.max_pool2d(size, s, p, d, c, x)
    return Fact(
        A.And(A.rank(t) == 4, A.rank(x) == 4, A.dim(0, t) == A.dim(0, x), A.dim(1, t) == A.dim(1, x), A.dt(t) == A.dt(x)),
        defined=[t],
    )


@axiom(size=_POOL, s=_STRIDES, p=_PADDING, d=_DILATION, c=_FALSE, i=_ANYBOOL, x="n c H W")
def avgpool_shape(A, size, s, p, d, c, i, x):
    """avg_pool2d keeps rank 4, batch, channels and dtype."""
    t = A.avg_pool2d(size, s, p, d, c, i, x)
    return Fact(
        A.And(A.rank(t) == 4, A.rank(x) == 4, A.dim(0, t) == A.dim(0, x), A.dim(1, t) == A.dim(1, x), A.dt(t) == A.dt(x)),
        defined=[t],
    )


@axiom(a="m n", b="m p", k=Int(lambda s: 1))
def concat_shape(A, a, b, k):
    """concat: one rank and dtype, sizes add up on the (in-range) axis."""
    t = A.concat(k, a, b)
    return Fact(
        A.And(
            A.rank(t) == A.rank(a), A.rank(b) == A.rank(a), A.dt(t) == A.dt(a), A.dt(b) == A.dt(a),
            k >= -A.rank(a), k < A.rank(a),
            A.dim(k, t) == A.dim(k, a) + A.dim(k, b),
        ),
        defined=[t],
    )


@axiom(a="m n p", b="m n p", k=_ANYAXIS, j=_ANYAXIS)
def concat_shape_off_axis(A, a, b, k, j):
    """concat: a, b and the result agree on every other axis."""
    t = A.concat(k, a, b)
    return Fact(
        A.And(A.dim(j, t) == A.dim(j, a), A.dim(j, b) == A.dim(j, a)),
        defined=[t],
        guard=A.And(k >= 0, j >= 0, j != k, j < A.rank(a)),
        patterns=[[A.dim(j, t)], [t, A.dim(j, a)], [t, A.dim(j, b)]],
    )


@axiom(x="m N", k=_AXIS, a=Int(lambda s: s.int(0, 2)), b=Int(lambda s: s.int(2, 5)))
def slice_shape(A, x, k, a, b):
    """slice(k, x, a, b): 0 <= a < b <= dim(k, x); b - a on the axis; rank and dtype of x."""
    t = A.slice(k, x, a, b)
    return Fact(
        A.And(
            A.rank(t) == A.rank(x), A.dt(t) == A.dt(x),
            k >= -A.rank(x), k < A.rank(x),
            0 <= a, a < b, b <= A.dim(k, x), A.dim(k, t) == b - a,
        ),
        defined=[t],
    )


@axiom(x="m N", k=_AXIS, j=_AXIS, a=Int(lambda s: s.int(0, 2)), b=Int(lambda s: s.int(2, 5)))
def slice_shape_off_axis(A, x, k, j, a, b):
    """slice keeps every other axis."""
    t = A.slice(k, x, a, b)
    return Fact(
        A.dim(j, t) == A.dim(j, x),
        defined=[t],
        guard=A.And(k >= 0, j >= 0, j != k, j < A.rank(x)),
        patterns=[[A.dim(j, t)]],
    )


@axiom(x="m n p", p=_PERM, j=_ANYAXIS)
def transpose_shape(A, x, p, j):
    """transpose: same rank and dtype; axis j of the result is axis p[j] of x."""
    t = A.transpose(p, x)
    return Fact(
        A.And(A.rank(t) == A.rank(x), A.tlen(p) == A.rank(x), A.dt(t) == A.dt(x), A.dim(j, t) == A.dim(A.tnth(p, j), x)),
        defined=[t],
        guard=A.And(j >= 0, j < A.rank(x)),
        patterns=[[A.dim(j, t)]],
    )


@axiom(x="m n p", p=_PERM)
def transpose_rank(A, x, p):
    """transpose keeps rank and dtype."""
    t = A.transpose(p, x)
    return Fact(A.And(A.rank(t) == A.rank(x), A.tlen(p) == A.rank(x), A.dt(t) == A.dt(x)), defined=[t])


@axiom(x="m n p", w=Tup(lambda s: s.pads(6, 0, 2)), v=_ZERO, j=_ANYAXIS)
def pad_shape(A, x, w, v, j):
    """pad: dim j grows by pad_width[2j] + pad_width[2j+1]."""
    t = A.pad(w, v, x)
    return Fact(
        A.And(A.rank(t) == A.rank(x), A.tlen(w) == 2 * A.rank(x), A.dt(t) == A.dt(x),
              A.dim(j, t) == A.dim(j, x) + A.tnth(w, 2 * j) + A.tnth(w, 2 * j + 1)),
        defined=[t],
        guard=A.And(j >= 0, j < A.rank(x)),
        patterns=[[A.dim(j, t)]],
    )


@axiom(v=_VALUE, d=_DT)
def scalar_shape(A, v, d):
    """A scalar has rank 0 and the given dtype."""
    t = A.scalar(v, d)
    return Fact(A.And(A.rank(t) == 0, A.dt(t) == d), defined=[t])
