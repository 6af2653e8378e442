"""Every shipped rule has a numeric test: a concrete instance of its source, on random shapes
that satisfy its conditions, is matched, rewritten, and the rewritten graph computes what the
original computed (numpy reference semantics of ``tvm_taso/ops.py``, float64).

A rule added to ``rules/*.rules`` without a case in :data:`CASES` fails
``test_every_shipped_rule_has_a_case``.
"""

from __future__ import annotations

import numpy as np
import pytest

import tvm_taso
from tvm_taso.ir.graph import Graph, Ref
from tvm_taso.rewrite.match import apply, find_matches
from tvm_taso.ir.ops import TensorType
from tvm_taso.numerics import array_relative_error

DTYPE = "float64"
TOL = 1e-4
RULES = {r.name: r for r in tvm_taso.default_rules() if r.provenance == "hand"}  # generated rules: test_generate.py


class Case:
    """A small graph under construction, with random values for its inputs."""

    def __init__(self, seed: int = 0):
        self.g = Graph()
        self.rng = np.random.default_rng(seed)
        self.feeds: dict[int, np.ndarray] = {}
        self._n = 0

    def d(self, lo: int = 1, hi: int = 5) -> int:
        """A random size in [lo, hi]."""
        return int(self.rng.integers(lo, hi + 1))

    def batch(self) -> tuple:
        """No batch dimension, or one or two of them."""
        return tuple(self.d(1, 3) for _ in range(self.d(0, 2)))

    def _key(self) -> str:
        self._n += 1
        return f"leaf{self._n}"

    def input(self, *shape) -> Ref:
        nid = self.g.add_leaf("input", TensorType(tuple(shape), DTYPE), None, key=self._key())
        self.feeds[nid] = self.rng.standard_normal(shape).astype(DTYPE)
        return (nid, 0)

    def const(self, *shape, positive: bool = False) -> Ref:
        value = self.rng.standard_normal(shape)
        if positive:
            value = 0.5 + np.abs(value)
        value = np.ascontiguousarray(value.astype(DTYPE))
        nid = self.g.add_leaf("const", TensorType(tuple(shape), DTYPE), (value, None), key=self._key())
        return (nid, 0)

    def op(self, name: str, *inputs: Ref, **attrs):
        """One op; its single output ref, or the list of its output refs."""
        nid = self.g.add(name, inputs, attrs)
        n = len(self.g.nodes[nid].types)
        return (nid, 0) if n == 1 else [(nid, i) for i in range(n)]

    def conv(self, x: Ref, w: Ref, **attrs) -> Ref:
        return self.op("conv2d", x, w, **attrs)


def rel_err(a: np.ndarray, b: np.ndarray) -> float:
    assert a.shape == b.shape, (a.shape, b.shape)
    return array_relative_error(a, b)


def pad4(t, left=None, bottom=None, right=None):
    return (t, t if left is None else left, t if bottom is None else bottom, t if right is None else right)


# -- one builder per rule: returns the source's output refs --------------------------------------
# Sizes are drawn per seed (``c.d()``: 1..5 unless said otherwise) within the rule's conditions.


def merge_matmul_shared_lhs(c):
    h = c.d(2, 8)
    x = c.input(*c.batch(), c.d(), h)
    return [c.op("matmul", x, c.const(h, c.d())), c.op("matmul", x, c.const(h, c.d()))]


def merge_matmul_bias_shared_lhs(c):
    h, n, m = c.d(2, 8), c.d(), c.d()
    x = c.input(*c.batch(), c.d(), h)
    a, b = c.const(h, n), c.input(h, m)  # a constant and a parameter weight
    return [
        c.op("add", c.op("matmul", x, a), c.const(n)),
        c.op("add", c.op("matmul", x, b), c.const(m)),
    ]


def merge_conv_shared_input(c):
    cin, k = c.d(), c.d(1, 3)
    x = c.input(c.d(1, 2), cin, c.d(5, 9), c.d(5, 9))
    attrs = dict(strides=(c.d(1, 2), c.d(1, 2)), padding=pad4(c.d(0, 1), c.d(0, 2)), dilation=(1, 1))
    return [c.conv(x, c.const(c.d(), cin, k, k), **attrs), c.conv(x, c.const(c.d(), cin, k, k), **attrs)]


def merge_conv_enlarge(c):
    cin = c.d()
    x = c.input(1, cin, c.d(4, 8), c.d(4, 8))
    s = c.d(1, 2)
    return [
        c.conv(x, c.const(c.d(), cin, 1, 1), strides=(s, s)),
        c.conv(x, c.const(c.d(), cin, 3, 3), strides=(s, s), padding=pad4(1)),
    ]


def merge_conv_bias_shared_input(c):
    cin, o1, o2 = c.d(), c.d(), c.d()
    x = c.input(1, cin, c.d(3, 7), c.d(3, 7))
    attrs = dict(padding=pad4(1))
    return [
        c.op("add", c.conv(x, c.const(o1, cin, 3, 3), **attrs), c.const(1, o1, 1, 1)),
        c.op("add", c.conv(x, c.const(o2, cin, 3, 3), **attrs), c.const(1, o2, 1, 1)),
    ]


def merge_conv_bias_relu_shared_input(c):
    cin, o1, o2 = c.d(), c.d(), c.d()
    x = c.input(1, cin, c.d(3, 8), c.d(3, 8))
    attrs = dict(strides=(2, 2))
    return [
        c.op("relu", c.op("add", c.conv(x, c.const(o1, cin, 1, 1), **attrs), c.const(1, o1, 1, 1))),
        c.op("relu", c.op("add", c.conv(x, c.const(o2, cin, 1, 1), **attrs), c.const(1, o2, 1, 1))),
    ]


def merge_conv_bias_enlarge(c):
    cin, o1, o2 = c.d(), c.d(), c.d()
    x = c.input(1, cin, c.d(5, 9), c.d(5, 9))
    return [
        c.op("add", c.conv(x, c.const(o1, cin, 3, 3), padding=pad4(1)), c.const(1, o1, 1, 1)),
        c.op("add", c.conv(x, c.const(o2, cin, 5, 5), padding=pad4(2)), c.const(1, o2, 1, 1)),
    ]


def merge_conv_bias_relu_enlarge(c):
    # a 1x3 kernel (padding left/right only) and a 3x3 kernel (padding all round)
    cin, o1, o2 = c.d(), c.d(), c.d()
    x = c.input(c.d(1, 2), cin, c.d(3, 7), c.d(3, 7))
    return [
        c.op("relu", c.op("add", c.conv(x, c.const(o1, cin, 1, 3), padding=(0, 1, 0, 1)), c.const(1, o1, 1, 1))),
        c.op("relu", c.op("add", c.conv(x, c.const(o2, cin, 3, 3), padding=pad4(1)), c.const(1, o2, 1, 1))),
    ]


def fold_batch_norm_into_conv(c):
    groups = c.d(1, 2)
    cin, o = groups * c.d(1, 3), groups * c.d(1, 3)
    x = c.input(c.d(1, 2), cin, c.d(3, 6), c.d(3, 6))
    y = c.conv(x, c.const(o, cin // groups, 3, 3), padding=pad4(1), groups=groups)
    bn = c.op(
        "batch_norm",
        y,
        c.const(o),
        c.const(o),
        c.const(o),
        c.const(o, positive=True),
        axis=1,
        epsilon=1e-5,
        momentum=0.9,
        training=False,
    )
    return [bn[0]]


def fold_batch_norm_into_conv_bias(c):
    """PyTorch's form: the conv's bias added before the batch norm."""
    cin, o = c.d(1, 3), c.d(1, 4)
    x = c.input(c.d(1, 2), cin, c.d(3, 6), c.d(3, 6))
    y = c.op("add", c.conv(x, c.const(o, cin, 3, 3), padding=pad4(1)), c.const(1, o, 1, 1))
    bn = c.op("batch_norm", y, c.const(o), c.const(o), c.const(o), c.const(o, positive=True), axis=1, epsilon=1e-5,
              momentum=0.1, training=False)
    return [bn[0]]


def fold_channel_mul_into_conv(c):
    cin, o = c.d(), c.d()
    x = c.input(1, cin, c.d(3, 6), c.d(3, 6))
    return [c.op("multiply", c.conv(x, c.const(o, cin, 3, 3), padding=pad4(1)), c.const(1, o, 1, 1))]


def fold_channel_mul_into_conv_rank3(c):
    cin, o = c.d(), c.d()
    x = c.input(1, cin, c.d(3, 6), c.d(3, 6))
    return [c.op("multiply", c.conv(x, c.const(o, cin, 3, 3), strides=(2, 2)), c.const(o, 1, 1))]


def fold_scalar_mul_into_conv(c):
    cin = c.d()
    x = c.input(1, cin, c.d(3, 6), c.d(3, 6))
    return [c.op("multiply", c.conv(x, c.const(c.d(), cin, 3, 3), padding=pad4(1)), c.const())]


def fold_scalar_mul_into_matmul(c):
    h = c.d(2, 8)
    x = c.input(*c.batch(), c.d(), h)
    return [c.op("multiply", c.op("matmul", x, c.const(h, c.d())), c.const())]


def matmul_over_concat(c):
    h, batch = c.d(2, 8), c.batch()
    x = c.input(*batch, c.d(), h)
    return [c.op("concat", c.op("matmul", x, c.const(h, c.d())), c.op("matmul", x, c.const(h, c.d())), axis=len(batch) + 1)]


def matmul_of_concat(c):
    h = c.d(2, 8)
    x = c.input(*c.batch(), c.d(), h)
    return [c.op("matmul", x, c.op("concat", c.const(h, c.d()), c.input(h, c.d()), axis=1))]


def matmul_over_row_concat(c):
    h = c.d(2, 8)
    w = c.const(h, c.d())
    return [c.op("concat", c.op("matmul", c.input(c.d(), h), w), c.op("matmul", c.input(c.d(), h), w), axis=0)]


def matmul_sum_same_lhs(c):
    h, n = c.d(2, 8), c.d()
    x = c.input(*c.batch(), c.d(), h)
    return [c.op("add", c.op("matmul", x, c.const(h, n)), c.op("matmul", x, c.const(h, n)))]


def matmul_sum_to_concat(c):
    batch, m, n, h1, h2 = c.batch(), c.d(), c.d(), c.d(), c.d()
    x, y = c.input(*batch, m, h1), c.input(*batch, m, h2)
    return [c.op("add", c.op("matmul", x, c.const(h1, n)), c.op("matmul", y, c.const(h2, n)))]


def conv_sum_same_input(c):
    groups = c.d(1, 2)
    cin, o = groups * c.d(1, 3), groups * c.d(1, 3)
    x = c.input(1, cin, c.d(3, 7), c.d(3, 7))
    attrs = dict(strides=(2, 2), padding=pad4(1), groups=groups)
    w = (o, cin // groups, 3, 3)
    return [c.op("add", c.conv(x, c.const(*w), **attrs), c.conv(x, c.const(*w), **attrs))]


def _flattened_rows(c, bias: bool):
    """A matmul of a batch of rows flattened to a matrix, reshaped back (PyTorch's Linear)."""
    lead, k, n = (c.d(1, 3), c.d(1, 3), c.d()), c.d(), c.d()
    x = c.input(*lead, k)
    rows = int(np.prod(lead))
    y = c.op("matmul", c.op("reshape", x, shape=(rows, k)), c.const(k, n))
    if bias:
        y = c.op("add", y, c.const(n))
    return [c.op("reshape", y, shape=(*lead, n))]


def matmul_of_flattened_rows(c):
    return _flattened_rows(c, bias=False)


def matmul_bias_of_flattened_rows(c):
    return _flattened_rows(c, bias=True)


def batch_matmul_of_flattened(c):
    b, h, m, k, p = c.d(1, 2), c.d(1, 3), c.d(), c.d(), c.d()
    a, w = c.input(b, h, m, k), c.input(b, h, k, p)
    y = c.op("matmul", c.op("reshape", a, shape=(b * h, m, k)), c.op("reshape", w, shape=(b * h, k, p)))
    return [c.op("reshape", y, shape=(b, h, m, p))]


def matmul_assoc_right(c):
    k, n = c.d(), c.d()
    return [c.op("matmul", c.op("matmul", c.input(*c.batch(), c.d(), k), c.const(k, n)), c.const(n, c.d()))]


def matmul_assoc_left(c):
    k, n = c.d(), c.d()
    return [c.op("matmul", c.input(*c.batch(), c.d(), k), c.op("matmul", c.const(k, n), c.input(n, c.d())))]


def _two_shapes(c, rank=3):
    """Two shapes that differ only along a random axis; (shape a, shape b, axis)."""
    base = [c.d() for _ in range(rank)]
    axis = int(c.rng.integers(rank))
    sa, sb = list(base), list(base)
    sb[axis] = c.d()
    return tuple(sa), tuple(sb), axis


def add_of_concats(c):
    sa, sb, k = _two_shapes(c)
    a, b, cc, d = c.input(*sa), c.input(*sb), c.input(*sa), c.const(*sb)
    return [c.op("add", c.op("concat", a, b, axis=k), c.op("concat", cc, d, axis=k))]


def concat_of_adds(c):
    sa, sb, k = _two_shapes(c, rank=2)
    a, b, cc, d = c.input(*sa), c.input(*sb), c.input(*sa), c.const(*sb)
    return [c.op("concat", c.op("add", a, cc), c.op("add", b, d), axis=k)]


def mul_of_concats(c):
    sa, sb, k = _two_shapes(c, rank=2)
    a, b, cc, d = c.input(*sa), c.input(*sb), c.input(*sa), c.input(*sb)
    return [c.op("multiply", c.op("concat", a, b, axis=k), c.op("concat", cc, d, axis=k))]


def concat_of_muls(c):
    sa, sb, k = _two_shapes(c, rank=4)
    a, b, cc, d = c.input(*sa), c.input(*sb), c.const(*sa), c.input(*sb)
    return [c.op("concat", c.op("multiply", a, cc), c.op("multiply", b, d), axis=k)]


def relu_of_concat(c):
    sa, sb, k = _two_shapes(c)
    return [c.op("relu", c.op("concat", c.input(*sa), c.input(*sb), axis=k))]


def concat_of_relus(c):
    sa, sb, k = _two_shapes(c, rank=2)
    return [c.op("concat", c.op("relu", c.input(*sa)), c.op("relu", c.input(*sb)), axis=k)]


def _split_point(c, rank=3, min_len=2):
    """A shape, an axis and a cut point inside it."""
    shape = [c.d() for _ in range(rank)]
    k = int(c.rng.integers(rank))
    shape[k] = c.d(min_len, 8)
    return tuple(shape), k, int(c.rng.integers(1, shape[k]))


def concat_of_split(c):
    shape, k, i = _split_point(c)
    parts = c.op("split", c.op("tanh", c.input(*shape)), indices=(i,), axis=k)
    return [c.op("concat", parts[0], parts[1], axis=k)]


def split_of_concat(c):
    sa, sb, k = _two_shapes(c)
    return c.op("split", c.op("concat", c.input(*sa), c.input(*sb), axis=k), indices=(sa[k],), axis=k)


def relu_over_split(c):
    shape, k, i = _split_point(c)
    parts = c.op("split", c.input(*shape), indices=(i,), axis=k)
    return [c.op("relu", parts[0]), c.op("relu", parts[1])]


def add_over_split(c):
    shape, k, i = _split_point(c)
    parts = c.op("split", c.input(*shape), indices=(i,), axis=k)
    # the biases broadcast over one other axis (the same for both, so they concatenate)
    other = (k + 1) % len(shape)
    bias_a, bias_b = list(c.g.type_of(parts[0]).shape), list(c.g.type_of(parts[1]).shape)
    bias_a[other] = bias_b[other] = 1
    return [c.op("add", parts[0], c.const(*bias_a)), c.op("add", parts[1], c.const(*bias_b))]


def split_of_split_tail(c):
    shape, k, i = _split_point(c, rank=2, min_len=3)
    i = int(c.rng.integers(1, shape[k] - 1))  # leave at least 2 for the tail
    first = c.op("split", c.input(*shape), indices=(i,), axis=k)
    second = c.op("split", first[1], indices=(int(c.rng.integers(1, shape[k] - i)),), axis=k)
    return first + second


def split_of_split_head(c):
    shape, k, i = _split_point(c, rank=3, min_len=3)
    i = int(c.rng.integers(2, shape[k]))  # leave at least 2 for the head
    first = c.op("split", c.input(*shape), indices=(i,), axis=k)
    second = c.op("split", first[0], indices=(int(c.rng.integers(1, i)),), axis=k)
    return first + second


def transpose_of_transpose(c):
    x = c.input(*[c.d() for _ in range(4)])
    p = tuple(int(a) for a in c.rng.permutation(4))
    q = tuple(int(a) for a in c.rng.permutation(4))
    return [c.op("permute_dims", c.op("permute_dims", x, axes=p), axes=q)]


def identity_transpose(c):
    rank = c.d(1, 4)
    return [c.op("permute_dims", c.op("sigmoid", c.input(*[c.d() for _ in range(rank)])), axes=tuple(range(rank)))]


def merge_matmul_relu_shared_lhs(c):
    h = c.d(2, 8)
    x = c.input(*c.batch(), c.d(), h)
    return [c.op("relu", c.op("matmul", x, c.const(h, c.d()))), c.op("relu", c.op("matmul", x, c.input(h, c.d())))]


def merge_matmul_bias_relu_shared_lhs(c):
    h, n, m = c.d(2, 8), c.d(), c.d()
    x = c.input(*c.batch(), c.d(), h)
    return [
        c.op("relu", c.op("add", c.op("matmul", x, c.const(h, n)), c.const(n))),
        c.op("relu", c.op("add", c.op("matmul", x, c.const(h, m)), c.const(m))),
    ]


def _group_conv_attrs(c):
    return dict(strides=(c.d(1, 2), c.d(1, 2)), padding=pad4(c.d(0, 1), c.d(0, 2)), dilation=(c.d(1, 2), 1))


def merge_conv_groups(c):
    g = 2 * c.d(1, 3)  # an even group count
    i, og, k = c.d(1, 3), c.d(1, 3), c.d(1, 3)
    x = c.input(c.d(1, 2), g * i, c.d(6, 9), c.d(6, 9))
    return [c.conv(x, c.const(g * og, i, k, k), groups=g, **_group_conv_attrs(c))]


def _parallel_convs(c):
    """Two convs of one shape (g groups) on two inputs: (x, a, y, b, attrs, g)."""
    g, i, o, k = c.d(1, 2), c.d(1, 3), c.d(1, 3), c.d(1, 3)
    shape = (c.d(1, 2), g * i, c.d(6, 9), c.d(6, 9))
    attrs = dict(_group_conv_attrs(c), groups=g)
    return c.input(*shape), c.const(g * o, i, k, k), c.input(*shape), c.const(g * o, i, k, k), attrs, g * o


def concat_of_convs_to_group_conv(c):
    x, a, y, b, attrs, _ = _parallel_convs(c)
    return [c.op("concat", c.conv(x, a, **attrs), c.conv(y, b, **attrs), axis=1)]


def group_conv_of_concats(c):
    x, a, y, b, attrs, _ = _parallel_convs(c)
    attrs["groups"] *= 2
    return [c.conv(c.op("concat", x, y, axis=1), c.op("concat", a, b, axis=0), **attrs)]


def merge_parallel_convs(c):
    x, a, y, b, attrs, _ = _parallel_convs(c)
    return [c.conv(x, a, **attrs), c.conv(y, b, **attrs)]


def merge_parallel_convs_bias(c):
    x, a, y, b, attrs, o = _parallel_convs(c)
    return [c.op("add", c.conv(x, a, **attrs), c.const(1, o, 1, 1)), c.op("add", c.conv(y, b, **attrs), c.const(1, o, 1, 1))]


def merge_parallel_convs_bias_relu(c):
    return [c.op("relu", out) for out in merge_parallel_convs_bias(c)]


CASES = {
    "merge-matmul-shared-lhs": merge_matmul_shared_lhs,
    "merge-matmul-bias-shared-lhs": merge_matmul_bias_shared_lhs,
    "merge-conv-shared-input": merge_conv_shared_input,
    "merge-conv-enlarge": merge_conv_enlarge,
    "merge-conv-bias-shared-input": merge_conv_bias_shared_input,
    "merge-conv-bias-relu-shared-input": merge_conv_bias_relu_shared_input,
    "merge-conv-bias-enlarge": merge_conv_bias_enlarge,
    "merge-conv-bias-relu-enlarge": merge_conv_bias_relu_enlarge,
    "merge-matmul-relu-shared-lhs": merge_matmul_relu_shared_lhs,
    "merge-matmul-bias-relu-shared-lhs": merge_matmul_bias_relu_shared_lhs,
    "merge-conv-groups": merge_conv_groups,
    "concat-of-convs-to-group-conv": concat_of_convs_to_group_conv,
    "group-conv-of-concats": group_conv_of_concats,
    "merge-parallel-convs": merge_parallel_convs,
    "merge-parallel-convs-bias": merge_parallel_convs_bias,
    "merge-parallel-convs-bias-relu": merge_parallel_convs_bias_relu,
    "fold-batch-norm-into-conv": fold_batch_norm_into_conv,
    "fold-batch-norm-into-conv-bias": fold_batch_norm_into_conv_bias,
    "fold-channel-mul-into-conv": fold_channel_mul_into_conv,
    "fold-scalar-mul-into-conv": fold_scalar_mul_into_conv,
    "fold-scalar-mul-into-matmul": fold_scalar_mul_into_matmul,
    "matmul-over-concat": matmul_over_concat,
    "matmul-of-concat": matmul_of_concat,
    "matmul-over-row-concat": matmul_over_row_concat,
    "matmul-sum-same-lhs": matmul_sum_same_lhs,
    "matmul-sum-to-concat": matmul_sum_to_concat,
    "conv-sum-same-input": conv_sum_same_input,
    "matmul-of-flattened-rows": matmul_of_flattened_rows,
    "matmul-bias-of-flattened-rows": matmul_bias_of_flattened_rows,
    "batch-matmul-of-flattened": batch_matmul_of_flattened,
    "matmul-assoc-right": matmul_assoc_right,
    "matmul-assoc-left": matmul_assoc_left,
    "add-of-concats": add_of_concats,
    "concat-of-adds": concat_of_adds,
    "mul-of-concats": mul_of_concats,
    "concat-of-muls": concat_of_muls,
    "relu-of-concat": relu_of_concat,
    "concat-of-relus": concat_of_relus,
    "concat-of-split": concat_of_split,
    "split-of-concat": split_of_concat,
    "relu-over-split": relu_over_split,
    "add-over-split": add_over_split,
    "split-of-split-tail": split_of_split_tail,
    "split-of-split-head": split_of_split_head,
    "transpose-of-transpose": transpose_of_transpose,
    "identity-transpose": identity_transpose,
}

# Further instances of some rules (other condition branches, other shapes).
VARIANTS = [
    ("fold-channel-mul-into-conv", fold_channel_mul_into_conv_rank3),
]


def _all_cases():
    items = [(name, builder) for name, builder in CASES.items()] + VARIANTS
    return [pytest.param(name, builder, id=f"{name}:{builder.__name__}") for name, builder in items]


def check_rule(name: str, builder, seed: int = 0) -> int:
    """Build the case, rewrite it at every site the rule finds, compare; returns the number of
    sites that were rewritten."""
    rule = RULES[name]
    c = Case(seed)
    c.g.outputs = list(builder(c))
    g = c.g
    g.topo_order()  # a valid DAG
    expected = g.evaluate(c.feeds)
    sites = list(find_matches(g, rule))
    assert sites, f"{name} found no site in its own test case"
    applied = 0
    for site in sites:
        new = apply(g, site)
        if new is None:
            continue
        applied += 1
        assert new is not g
        assert new.structural_hash() != g.structural_hash()
        assert len(new.outputs) == len(g.outputs)
        got = new.evaluate(c.feeds)
        for old_ref, new_ref in zip(g.outputs, new.outputs):
            assert g.type_of(old_ref) == new.type_of(new_ref)
            err = rel_err(expected[old_ref], got[new_ref])
            assert err <= TOL, f"{name} at {site.roots}: output {old_ref} differs by {err:.3g}"
        # the original graph is untouched (copy on write)
        again = g.evaluate(c.feeds)
        for ref in g.outputs:
            np.testing.assert_array_equal(again[ref], expected[ref])
    assert applied >= 1, f"{name}: apply returned None at each of its {len(sites)} sites"
    return applied


@pytest.mark.parametrize("name,builder", _all_cases())
@pytest.mark.parametrize("seed", range(6))
def test_rule_preserves_values(name, builder, seed):
    check_rule(name, builder, seed)


def test_every_shipped_rule_has_a_case():
    shipped = [r.name for r in tvm_taso.default_rules(include_unverified=True) if r.provenance == "hand"]
    missing = [n for n in shipped if n not in CASES]
    assert not missing, f"rules without a numeric test in tests/test_rules.py: {missing}"
    stale = [n for n in CASES if n not in shipped]
    assert not stale, f"cases for rules that no longer exist: {stale}"


def test_checked_rules_say_so():
    # "checked" in a rule header means this file tests it. The labels as the files write them:
    # default_rules() alone leaves unverified rules out, so it could not fail.
    shipped = tvm_taso.default_rules(include_unverified=True)
    assert len(shipped) > 200
    for rule in shipped:
        assert rule.proof in ("checked", "proved"), rule.name


# -- rules do not fire where their conditions fail ----------------------------------------------


def _no_sites(name: str, builder) -> None:
    c = Case(0)
    c.g.outputs = list(builder(c))
    sites = list(find_matches(c.g, RULES[name]))
    assert sites == [], f"{name} fired where it must not: {sites}"


def test_matmul_bias_merge_needs_vector_biases():
    def build(c):
        x = c.input(7, 8)
        return [
            c.op("add", c.op("matmul", x, c.const(8, 6)), c.const(1, 6)),  # (1, 6), not (6,)
            c.op("add", c.op("matmul", x, c.const(8, 4)), c.const(4)),
        ]

    _no_sites("merge-matmul-bias-shared-lhs", build)


def test_conv_merge_needs_equal_strides():
    def build(c):
        x = c.input(1, 4, 8, 8)
        return [
            c.conv(x, c.const(6, 4, 3, 3), strides=(1, 1), padding=pad4(1)),
            c.conv(x, c.const(5, 4, 3, 3), strides=(2, 2), padding=pad4(1)),
        ]

    _no_sites("merge-conv-shared-input", build)
    _no_sites("merge-conv-enlarge", build)


def test_conv_merge_needs_equal_kernels_and_enlarge_needs_aligned_padding():
    def build(c):
        x = c.input(1, 4, 8, 8)
        # 1x1 pad 0 and 3x3 pad 0: the outputs differ in size, no zero padding aligns them
        return [c.conv(x, c.const(6, 4, 1, 1)), c.conv(x, c.const(5, 4, 3, 3))]

    _no_sites("merge-conv-shared-input", build)
    _no_sites("merge-conv-enlarge", build)


def test_conv_merge_needs_default_groups():
    def build(c):
        x = c.input(1, 4, 8, 8)
        return [c.conv(x, c.const(6, 2, 3, 3), groups=2), c.conv(x, c.const(4, 2, 3, 3), groups=2)]

    _no_sites("merge-conv-shared-input", build)


def test_batch_norm_fold_needs_inference_mode_and_channel_axis():
    def training(c):
        y = c.conv(c.input(1, 3, 5, 5), c.const(4, 3, 3, 3))
        bn = c.op("batch_norm", y, *[c.const(4, positive=True) for _ in range(4)], axis=1, training=True)
        return [bn[0]]

    def other_axis(c):
        y = c.conv(c.input(1, 3, 5, 5), c.const(4, 3, 3, 3))
        bn = c.op("batch_norm", y, *[c.const(3, positive=True) for _ in range(4)], axis=3)
        return [bn[0]]

    _no_sites("fold-batch-norm-into-conv", training)
    _no_sites("fold-batch-norm-into-conv", other_axis)


def test_channel_mul_fold_needs_a_per_channel_factor():
    def build(c):
        y = c.conv(c.input(1, 3, 5, 5), c.const(4, 3, 3, 3))
        return [c.op("multiply", y, c.const(1, 1, 3, 1))]  # varies along H, not channels

    _no_sites("fold-channel-mul-into-conv", build)
    _no_sites("fold-scalar-mul-into-conv", build)


def test_split_of_concat_needs_the_cut_at_the_seam():
    def build(c):
        return c.op("split", c.op("concat", c.input(2, 3), c.input(2, 4), axis=1), indices=(4,), axis=1)

    _no_sites("split-of-concat", build)


def test_concat_of_split_needs_the_same_axis():
    def build(c):
        parts = c.op("split", c.input(4, 4), indices=(2,), axis=0)
        return [c.op("concat", parts[0], parts[1], axis=1)]

    _no_sites("concat-of-split", build)


def test_add_over_split_needs_matching_bias_extents():
    def build(c):
        parts = c.op("split", c.input(2, 6, 4), indices=(2,), axis=1)
        # the first bias broadcasts along the split axis: concat would not line up
        return [c.op("add", parts[0], c.const(1, 1, 4)), c.op("add", parts[1], c.const(1, 4, 4))]

    _no_sites("add-over-split", build)


def test_identity_transpose_only_for_the_identity():
    def build(c):
        return [c.op("permute_dims", c.input(2, 3, 4), axes=(0, 2, 1))]

    _no_sites("identity-transpose", build)


def test_matmul_sum_same_lhs_needs_the_same_lhs():
    def build(c):
        return [c.op("add", c.op("matmul", c.input(3, 8), c.const(8, 5)), c.op("matmul", c.input(3, 8), c.const(8, 5)))]

    _no_sites("matmul-sum-same-lhs", build)


# -- apply refuses rewrites that would create a cycle ---------------------------------------------


def test_merge_is_refused_when_one_weight_depends_on_the_other_output():
    """matmul(x, a) feeds (through relu and reshape) the weight of matmul(x, b): merging the two
    would make the merged matmul depend on its own split."""
    c = Case(0)
    x = c.input(4, 8)
    m1 = c.op("matmul", x, c.const(8, 8))  # (4, 8)
    w2 = c.op("reshape", c.op("relu", m1), shape=(8, 4))
    m2 = c.op("matmul", x, w2)  # (4, 4)
    c.g.outputs = [m1, m2]
    sites = list(find_matches(c.g, RULES["merge-matmul-shared-lhs"]))
    assert sites, "the rule's pattern does match (only the cycle check stops it)"
    assert all(apply(c.g, s) is None for s in sites)


def test_conv_merge_is_refused_when_it_would_create_a_cycle():
    c = Case(1)
    x = c.input(1, 2, 3, 3)
    y1 = c.conv(x, c.const(2, 2, 3, 3), padding=pad4(1))  # (1, 2, 3, 3)
    w2 = c.op("reshape", c.op("sigmoid", y1), shape=(1, 2, 3, 3))
    y2 = c.conv(x, w2, padding=pad4(1))
    c.g.outputs = [y1, y2]
    sites = list(find_matches(c.g, RULES["merge-conv-shared-input"]))
    assert sites
    assert all(apply(c.g, s) is None for s in sites)


def test_batch_norm_fold_with_bias_needs_inference_mode_and_a_channel_bias():
    def training(c):
        y = c.op("add", c.conv(c.input(1, 3, 5, 5), c.const(4, 3, 3, 3)), c.const(1, 4, 1, 1))
        bn = c.op("batch_norm", y, *[c.const(4, positive=True) for _ in range(4)], axis=1, training=True)
        return [bn[0]]

    def not_a_channel_bias(c):  # a bias per pixel is not a per-channel constant to fold
        y = c.op("add", c.conv(c.input(1, 3, 5, 5), c.const(4, 3, 3, 3), padding=pad4(1)), c.const(1, 4, 5, 5))
        bn = c.op("batch_norm", y, *[c.const(4, positive=True) for _ in range(4)], axis=1)
        return [bn[0]]

    _no_sites("fold-batch-norm-into-conv-bias", training)
    _no_sites("fold-batch-norm-into-conv-bias", not_a_channel_bias)


def test_flattened_rows_rules_need_the_rows_flattened_whole():
    """A reshape that does not keep the last axis (the rows' width) is not a flattened batch
    of rows: the matmul then mixes elements of different rows."""
    def regrouped(c):
        x = c.input(2, 4, 6)
        y = c.op("matmul", c.op("reshape", x, shape=(4, 12)), c.const(12, 6))
        return [c.op("reshape", y, shape=(2, 2, 6))]

    def other_shape_back(c):
        x = c.input(2, 4, 6)
        y = c.op("matmul", c.op("reshape", x, shape=(8, 6)), c.const(6, 5))
        return [c.op("reshape", y, shape=(4, 2, 5))]

    for build in (regrouped, other_shape_back):
        _no_sites("matmul-of-flattened-rows", build)
