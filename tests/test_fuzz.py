"""Differential fuzzing: 200 seeded random small Relax modules over the supported ops, each
optimized with ``tvm_taso.optimize(mod, target="cuda")`` (analytic cost), must compute what
the original computed.

All 200 are compared through the numpy reference semantics (the dataflow block read back with
:class:`~tvm_taso.ir.relax_bridge.BlockGraph` and run with ``Graph.evaluate``); every 10th seed
is also compiled and run with TVM (llvm), both before and after, and checked against the numpy
reference of the original. The generator is built from motifs that give the rules something
to do (parallel matmuls and convs sharing an input, grouped convs, conv + batch_norm, concats of relus,
splits followed by elementwise ops, transposes of transposes, ...), and the test asserts that
rewrites did happen, with many distinct rules.
"""

from __future__ import annotations

import collections
import warnings

import numpy as np
import pytest
from tvm import relax

import tvm_taso
from tvm_taso.ir import ops
from tvm_taso.ir.graph import Graph
from tvm_taso.ir.ops import OpError, TensorType
from tvm_taso.ir.relax_bridge import BlockGraph
from tvm_taso.numerics import relative_error
from tvm_taso.runtime import inputs_for, run

N_SEEDS = 200
TVM_EVERY = 10
TOL = 1e-4
MIN_APPLIED = 250  # rewrites over the 200 graphs (about 475 at the time of writing)
MIN_DISTINCT_RULES = 18  # distinct rules that fired (29 at the time of writing)
DTYPE = "float32"


# -- the generator ------------------------------------------------------------------------------


class Plan:
    """A random program under construction: a list of ops over numbered values, with static
    shapes (checked by tvm_taso's shape inference as we go and by Relax's when emitted)."""

    def __init__(self, seed: int):
        self.rng = np.random.default_rng(seed)
        self.params: list[int] = []  # value ids of the function parameters
        self.shapes: dict[int, tuple] = {}
        self.steps: list[tuple] = []  # (value id or None for tuples, op, args, attrs)
        self.uses: collections.Counter = collections.Counter()
        self.n_ops = 0
        self._next = 0

    # values
    def _new(self, shape) -> int:
        vid = self._next
        self._next += 1
        self.shapes[vid] = tuple(int(d) for d in shape)
        return vid

    def param(self, *shape) -> int:
        vid = self._new(shape)
        self.params.append(vid)
        return vid

    def const(self, *shape, scale=None, positive=False):
        fan_in = int(np.prod(shape[1:])) if len(shape) > 1 else 1
        s = scale if scale is not None else 1.0 / np.sqrt(max(fan_in, 1))
        a = self.rng.standard_normal(shape) * s
        if positive:
            a = 0.5 + np.abs(a)
        return ("const", np.ascontiguousarray(a.astype(DTYPE)))

    def _type(self, a) -> TensorType:
        if isinstance(a, tuple) and a[0] == "const":
            return TensorType(a[1].shape, DTYPE)
        return TensorType(self.shapes[a], DTYPE)

    def op(self, name: str, *args, **attrs):
        """Plan one op; its value id (a list of ids for split/batch_norm's outputs)."""
        full = dict(ops.OPS[name].defaults)
        full.update(attrs)
        if name == "split":
            full["indices"] = tuple(attrs["indices"])
        out_types = ops.infer(name, [self._type(a) for a in args], full)
        for a in args:
            if isinstance(a, int):
                self.uses[a] += 1
        self.n_ops += 1
        if len(out_types) == 1:
            vid = self._new(out_types[0].shape)
            self.steps.append((vid, name, args, attrs))
            return vid
        tup = ("tuple", len(self.steps))
        self.steps.append((tup, name, args, attrs))
        outs = []
        wanted = 1 if name == "batch_norm" else len(out_types)
        for i in range(wanted):
            vid = self._new(out_types[i].shape)
            self.steps.append((vid, "get", (tup, i), {}))
            outs.append(vid)
        return outs

    # choices
    def pick(self, seq):
        return seq[int(self.rng.integers(len(seq)))]

    def chance(self, p: float) -> bool:
        return bool(self.rng.random() < p)

    def values(self, rank=None, pred=None) -> list[int]:
        out = []
        for vid, shape in self.shapes.items():
            if rank is not None and (len(shape) not in rank if isinstance(rank, tuple) else len(shape) != rank):
                continue
            if pred is not None and not pred(shape):
                continue
            if vid == self.weight_param:
                continue  # the weight parameter is only used as a matmul operand
            out.append(vid)
        return out

    weight_param = None

    def sinks(self) -> list[int]:
        return [vid for vid, *_ in self.steps if isinstance(vid, int) and self.uses[vid] == 0]


def _fresh_bias(p: Plan, v: int):
    """A bias that broadcasts against v: per channel for NCHW, per column otherwise."""
    shape = p.shapes[v]
    if len(shape) == 4:
        return p.const(1, shape[1], 1, 1, scale=0.1)
    return p.const(shape[-1], scale=0.1)


# Motifs: each plans a few ops on existing values; returns False when it does not apply.


def m_parallel_matmuls(p: Plan) -> bool:
    xs = p.values(rank=(2, 3))
    if not xs:
        return False
    x = p.pick(xs)
    h = p.shapes[x][-1]
    k = int(p.rng.integers(2, 4))
    bias, act = p.chance(0.5), p.chance(0.3)
    for _ in range(k):
        w = p.weight_param if p.weight_param is not None and p.shapes[p.weight_param][0] == h and p.chance(0.4) else None
        if w is None:
            w = p.const(h, p.pick([3, 4, 6, 8]))
        y = p.op("matmul", x, w)
        if bias:
            y = p.op("add", y, _fresh_bias(p, y))
        if act:
            y = p.op("relu", y)
    return True


def m_matmul_chain(p: Plan) -> bool:
    xs = p.values(rank=(2, 3))
    if not xs:
        return False
    x = p.pick(xs)
    h = p.shapes[x][-1]
    n = p.pick([3, 5, 8])
    y = p.op("matmul", x, p.const(h, n))
    y = p.op("matmul", y, p.const(n, p.pick([2, 4, 6])))
    return True


def m_matmul_sum(p: Plan) -> bool:
    xs = p.values(rank=(2, 3))
    if not xs:
        return False
    x = p.pick(xs)
    h = p.shapes[x][-1]
    n = p.pick([4, 6])
    others = [v for v in xs if v != x and p.shapes[v][:-1] == p.shapes[x][:-1]]
    if others and p.chance(0.5):
        y = p.pick(others)
        p.op("add", p.op("matmul", x, p.const(h, n)), p.op("matmul", y, p.const(p.shapes[y][-1], n)))
    else:
        p.op("add", p.op("matmul", x, p.const(h, n)), p.op("matmul", x, p.const(h, n)))
    return True


def m_concat_matmuls(p: Plan) -> bool:
    xs = p.values(rank=(2, 3))
    if not xs:
        return False
    x = p.pick(xs)
    h, r = p.shapes[x][-1], len(p.shapes[x])
    a = p.op("matmul", x, p.const(h, p.pick([2, 4])))
    b = p.op("matmul", x, p.const(h, p.pick([3, 4])))
    p.op("concat", a, b, axis=p.pick([-1, r - 1]))
    return True


def m_row_concat_matmuls(p: Plan) -> bool:
    xs = p.values(rank=2)
    if not xs:
        return False
    a = p.pick(xs)
    others = [v for v in xs if p.shapes[v][1] == p.shapes[a][1]]
    b = p.pick(others)
    w = p.const(p.shapes[a][1], p.pick([3, 5]))
    p.op("concat", p.op("matmul", a, w), p.op("matmul", b, w), axis=0)
    return True


def m_scaled_matmul(p: Plan) -> bool:
    xs = p.values(rank=(2, 3))
    if not xs:
        return False
    x = p.pick(xs)
    y = p.op("matmul", x, p.const(p.shapes[x][-1], p.pick([4, 6])))
    p.op("multiply", y, ("const", np.array(p.rng.uniform(0.5, 2.0), DTYPE)))
    return True


def m_parallel_convs(p: Plan) -> bool:
    xs = p.values(rank=4, pred=lambda s: min(s[2:]) >= 3)
    if not xs:
        return False
    x = p.pick(xs)
    c = p.shapes[x][1]
    k = int(p.rng.integers(2, 4))
    stride = 2 if p.chance(0.2) else 1
    bias, act = p.chance(0.5), p.chance(0.5)
    kernels = [p.pick([1, 3, 5]) for _ in range(k)] if p.chance(0.6) else [p.pick([1, 3])] * k
    outs = []
    for ks in kernels:
        y = p.op("conv2d", x, p.const(p.pick([2, 3, 4]), c, ks, ks), strides=(stride, stride), padding=(ks // 2,) * 4)
        if bias:
            y = p.op("add", y, _fresh_bias(p, y))
        if act:
            y = p.op("relu", y)
        outs.append(y)
    if p.chance(0.4):
        p.op("concat", *outs, axis=1)
    return True


def m_conv_bn(p: Plan) -> bool:
    xs = p.values(rank=4, pred=lambda s: min(s[2:]) >= 3)
    if not xs:
        return False
    x = p.pick(xs)
    c = p.shapes[x][1]
    o = p.pick([2, 4, 6])
    ks = p.pick([1, 3])
    y = p.op("conv2d", x, p.const(o, c, ks, ks), padding=(ks // 2,) * 4)
    (y,) = p.op(
        "batch_norm",
        y,
        p.const(o, scale=0.3, positive=True),
        p.const(o, scale=0.1),
        p.const(o, scale=0.1),
        p.const(o, scale=0.5, positive=True),
        axis=1,
        epsilon=1e-5,
        momentum=0.9,
        training=False,
    )
    if p.chance(0.6):
        p.op("relu", y)
    return True


def m_conv_scale(p: Plan) -> bool:
    xs = p.values(rank=4, pred=lambda s: min(s[2:]) >= 3)
    if not xs:
        return False
    x = p.pick(xs)
    c, o = p.shapes[x][1], p.pick([2, 3, 4])
    y = p.op("conv2d", x, p.const(o, c, 3, 3), padding=(1, 1, 1, 1))
    if p.chance(0.5):
        p.op("multiply", y, p.const(1, o, 1, 1, scale=1.0))
    else:
        p.op("multiply", y, ("const", np.array(p.rng.uniform(0.5, 2.0), DTYPE)))
    return True


def m_conv_sum(p: Plan) -> bool:
    xs = p.values(rank=4, pred=lambda s: min(s[2:]) >= 3)
    if not xs:
        return False
    x = p.pick(xs)
    c, o, ks = p.shapes[x][1], p.pick([2, 3]), p.pick([1, 3])
    attrs = dict(padding=(ks // 2,) * 4)
    p.op("add", p.op("conv2d", x, p.const(o, c, ks, ks), **attrs), p.op("conv2d", x, p.const(o, c, ks, ks), **attrs))
    return True


def m_pool(p: Plan) -> bool:
    xs = p.values(rank=4, pred=lambda s: min(s[2:]) >= 4)
    if not xs:
        return False
    x = p.pick(xs)
    name = p.pick(["avg_pool2d", "max_pool2d"])
    if p.chance(0.5):
        p.op(name, x, pool_size=(3, 3), strides=(1, 1), padding=(1, 1, 1, 1), count_include_pad=name == "avg_pool2d")
    else:
        p.op(name, x, pool_size=(2, 2), strides=(2, 2))
    return True


def m_unary(p: Plan) -> bool:
    x = p.pick(p.values())
    p.op(p.pick(["relu", "sigmoid", "tanh"]), x)
    return True


def m_bias(p: Plan) -> bool:
    x = p.pick(p.values())
    p.op(p.pick(["add", "multiply"]), x, _fresh_bias(p, x))
    return True


def m_binary(p: Plan) -> bool:
    x = p.pick(p.values())
    same = [v for v in p.values() if p.shapes[v] == p.shapes[x] and v != x]
    if not same:
        return False
    p.op(p.pick(["add", "multiply"]), x, p.pick(same))
    return True


def m_concat_relus(p: Plan) -> bool:
    x = p.pick(p.values())
    shape = p.shapes[x]
    axis = int(p.rng.integers(len(shape)))
    same = [v for v in p.values() if v != x and len(p.shapes[v]) == len(shape)
            and all(p.shapes[v][d] == shape[d] for d in range(len(shape)) if d != axis)]
    y = p.pick(same) if same else p.op("tanh", x)
    if p.chance(0.7):
        p.op("concat", p.op("relu", x), p.op("relu", y), axis=axis)
    else:  # concat of adds with a bias
        p.op("concat", p.op("add", x, p.const(*shape, scale=0.1)), p.op("add", y, p.const(*p.shapes[y], scale=0.1)), axis=axis)
    return True


def m_split(p: Plan) -> bool:
    xs = p.values(pred=lambda s: max(s) >= 2)
    if not xs:
        return False
    x = p.pick(xs)
    shape = p.shapes[x]
    axis = p.pick([d for d in range(len(shape)) if shape[d] >= 2])
    i = int(p.rng.integers(1, shape[axis]))
    a, b = p.op("split", x, indices=(i,), axis=p.pick([axis, axis - len(shape)]))
    what = p.pick(["relu", "bias", "concat", "split", "mixed"])
    if what == "relu":
        p.op("relu", a), p.op("relu", b)
    elif what == "bias":
        for part in (a, b):
            bshape = list(p.shapes[part])
            bshape[0] = 1
            p.op("add", part, p.const(*bshape, scale=0.1))
    elif what == "concat":
        p.op("concat", a, b, axis=axis)
    elif what == "split" and p.shapes[b][axis] >= 2:
        p.op("split", b, indices=(int(p.rng.integers(1, p.shapes[b][axis])),), axis=axis)
    else:
        p.op(p.pick(["sigmoid", "tanh"]), a)
        p.op("relu", b)
    return True


def m_transposes(p: Plan) -> bool:
    x = p.pick(p.values(rank=(2, 3, 4)))
    r = len(p.shapes[x])
    perm = tuple(int(a) for a in p.rng.permutation(r))
    y = p.op("permute_dims", x, axes=perm)
    if p.chance(0.4):  # back to the identity
        q = tuple(int(a) for a in np.argsort(perm))
    else:
        q = tuple(int(a) for a in p.rng.permutation(r))
    p.op("permute_dims", y, axes=q)
    return True


def m_reshape(p: Plan) -> bool:
    x = p.pick(p.values())
    shape = p.shapes[x]
    if len(shape) == 4:  # NCHW -> (C, H*W) or (N*C, H, W)
        new = (shape[0] * shape[1], shape[2] * shape[3]) if p.chance(0.7) else (shape[0] * shape[1], shape[2], shape[3])
    elif len(shape) == 3:
        new = (shape[0] * shape[1], shape[2])
    else:
        new = (1,) + shape
    p.op("reshape", x, shape=new)
    return True


def m_softmax(p: Plan) -> bool:
    x = p.pick(p.values())
    p.op("softmax", x, axis=p.pick([-1, len(p.shapes[x]) - 1]))
    return True


def m_grouped_convs(p: Plan) -> bool:
    """Grouped convs (2 groups, or depthwise): one (with bias, relu) that merge_groups can widen,
    or two of one shape on two inputs that become one conv with twice the groups."""
    xs = p.values(rank=4, pred=lambda s: min(s[2:]) >= 3 and s[1] % 2 == 0)
    if not xs:
        return False
    x = p.pick(xs)
    c = p.shapes[x][1]
    g = p.pick([2, c])
    ks = p.pick([1, 3])
    attrs = dict(padding=(ks // 2,) * 4, groups=g, strides=(2, 2) if p.chance(0.2) else (1, 1))
    o = g * p.pick([1, 2])
    inputs = [x] if p.chance(0.5) else [x, p.op("relu", x) if p.chance(0.5) else p.op("add", x, x)]
    bias, act = p.chance(0.4), p.chance(0.4)
    for v in inputs:
        y = p.op("conv2d", v, p.const(o, c // g, ks, ks), **attrs)
        if bias:
            y = p.op("add", y, _fresh_bias(p, y))
        if act:
            y = p.op("relu", y)
    return True


MAT_MOTIFS = [
    (m_parallel_matmuls, 4),
    (m_matmul_chain, 2),
    (m_matmul_sum, 2),
    (m_concat_matmuls, 2),
    (m_row_concat_matmuls, 1),
    (m_scaled_matmul, 1),
]
CONV_MOTIFS = [
    (m_parallel_convs, 4),
    (m_conv_bn, 3),
    (m_conv_scale, 1),
    (m_conv_sum, 1),
    (m_pool, 1),
    (m_grouped_convs, 2),
]
ANY_MOTIFS = [
    (m_unary, 1),
    (m_bias, 1),
    (m_binary, 1),
    (m_concat_relus, 2),
    (m_split, 3),
    (m_transposes, 2),
    (m_reshape, 1),
    (m_softmax, 1),
]


def plan_program(seed: int) -> Plan:
    p = Plan(seed)
    kind = p.pick(["mat", "mat", "conv", "conv", "mixed"])
    if kind in ("mat", "mixed"):
        shape = (p.pick([2, 3, 5]), p.pick([4, 6, 8]))
        if p.chance(0.4):
            shape = (2,) + shape
        x = p.param(*shape)
        if kind == "mat" and p.chance(0.5):
            if p.chance(0.5):
                p.weight_param = p.param(shape[-1], p.pick([4, 6]))  # a weight given as input
            else:
                p.param(*shape)
    if kind in ("conv", "mixed"):
        c, h = p.pick([2, 3, 4]), p.pick([5, 6, 8])
        p.param(1, c, h, h)
        if kind == "conv" and p.chance(0.3):
            p.param(1, c, h, h)
    motifs = (MAT_MOTIFS if kind != "conv" else []) + (CONV_MOTIFS if kind != "mat" else []) + ANY_MOTIFS
    fns = [m for m, _ in motifs]
    weights = np.array([w for _, w in motifs], dtype=float)
    target = int(p.rng.integers(3, 11))
    tries = 0
    while p.n_ops < target and tries < 50:
        tries += 1
        fn = fns[p.rng.choice(len(fns), p=weights / weights.sum())]
        saved = (dict(p.shapes), list(p.steps), collections.Counter(p.uses), p.n_ops, p._next)
        try:
            ok = fn(p)
        except OpError:
            ok = False
        if ok and p.n_ops > 10:
            ok = False
        if not ok:  # undo a motif that does not apply or makes the program too big
            p.shapes, p.steps, p.uses, p.n_ops, p._next = saved
    assert p.n_ops >= 1
    return p


def _relax_call(name, args, attrs):
    o = relax.op
    if name == "matmul":
        return o.matmul(*args)
    if name in ("add", "multiply"):
        return getattr(o, name)(*args)
    if name == "relu":
        return o.nn.relu(*args)
    if name in ("sigmoid", "tanh"):
        return getattr(o, name)(*args)
    if name == "softmax":
        return o.nn.softmax(args[0], axis=attrs["axis"])
    if name == "concat":
        return o.concat(list(args), axis=attrs["axis"])
    if name == "split":
        return o.split(args[0], list(attrs["indices"]), axis=attrs["axis"])
    if name == "permute_dims":
        return o.permute_dims(args[0], list(attrs["axes"]))
    if name == "reshape":
        return o.reshape(args[0], attrs["shape"])
    if name == "conv2d":
        return o.nn.conv2d(args[0], args[1], strides=attrs.get("strides", 1), padding=attrs.get("padding", 0),
                           groups=attrs.get("groups", 1))
    if name == "batch_norm":
        return o.nn.batch_norm(*args, **attrs)
    if name in ("avg_pool2d", "max_pool2d"):
        return getattr(o.nn, name)(args[0], **attrs)
    raise AssertionError(name)


def build_module(p: Plan):
    params = {vid: relax.Var(f"p{i}", relax.TensorType(p.shapes[vid], DTYPE)) for i, vid in enumerate(p.params)}
    sinks = set(p.sinks())
    bb = relax.BlockBuilder()
    env: dict = dict(params)
    outputs = []
    with bb.function("main", list(params.values())):
        with bb.dataflow():
            for vid, name, args, attrs in p.steps:
                if name == "get":
                    expr = relax.TupleGetItem(env[args[0]], args[1])
                else:
                    rargs = [relax.const(a[1]) if isinstance(a, tuple) else env[a] for a in args]
                    expr = _relax_call(name, rargs, attrs)
                if vid in sinks:
                    env[vid] = bb.emit_output(expr)
                    outputs.append(env[vid])
                else:
                    env[vid] = bb.emit(expr)
        bb.emit_func_output(relax.Tuple(outputs) if len(outputs) > 1 else outputs[0])
    return bb.get()


def random_module(seed: int):
    return build_module(plan_program(seed))


# -- the numpy reference ------------------------------------------------------------------------


def evaluate_graph(g: Graph, feeds: dict) -> dict:
    """``Graph.evaluate``, plus opaque nodes that only rename a value (``out = x``, which the
    writer emits when an output is a parameter or another output)."""
    if not any(n.op == "opaque" for n in g.nodes.values()):
        return g.evaluate(feeds)
    values = {}
    for nid in g.topo_order():
        n = g.nodes[nid]
        if n.op == "opaque":
            assert isinstance(n.payload, relax.Var) and len(n.inputs) == 1, f"opaque binding {n.payload}"
            values[(nid, 0)] = values[n.inputs[0]]
        elif n.op == "input":
            values[(nid, 0)] = np.asarray(feeds[nid])
        elif n.op == "const":
            values[(nid, 0)] = n.payload[0]
        else:
            outs = ops.evaluate(n.op, [values[r] for r in n.inputs], n.attr)
            for i, (arr, ty) in enumerate(zip(outs, n.types)):
                values[(nid, i)] = np.asarray(arr).astype(ty.dtype, copy=False)
    return values


def reference_outputs(mod, inputs: list[np.ndarray]) -> list[np.ndarray]:
    """The outputs of ``mod["main"]`` by the numpy semantics of its single dataflow block."""
    func = mod["main"]
    blocks = func.body.blocks
    assert len(blocks) == 1 and isinstance(blocks[0], relax.DataflowBlock)
    skipped = collections.Counter()
    bg = BlockGraph(blocks[0], skipped)
    assert not skipped, skipped
    feeds = {}
    for nid, node in bg.graph.nodes.items():
        if node.op == "input":
            (k,) = [i for i, prm in enumerate(func.params) if prm.same_as(node.payload)]
            feeds[nid] = inputs[k]
    values = evaluate_graph(bg.graph, feeds)
    ret = func.body.body
    ret_vars = list(ret.fields) if isinstance(ret, relax.Tuple) else [ret]
    return [values[bg.env[v]] for v in ret_vars]


def rel_err(a: list, b: list) -> float:
    assert len(a) == len(b)
    for x, y in zip(a, b):
        assert x.shape == y.shape, (x.shape, y.shape)
    return relative_error(a, b)


# -- the tests ----------------------------------------------------------------------------------


@pytest.fixture(scope="module")
def fuzz_results():
    """Optimize all seeds once; the tests below check different things about the results."""
    results = []
    for seed in range(N_SEEDS):
        mod = random_module(seed)
        with warnings.catch_warnings():
            warnings.simplefilter("ignore", tvm_taso.TasoSkippedWarning)  # report["skipped"] is checked
            new, report = tvm_taso.optimize(mod, target="cuda")
        results.append((seed, mod, new, report))
    return results


def test_generator_is_deterministic_and_varied():
    import tvm_ffi

    assert tvm_ffi.structural_equal(random_module(7), random_module(7))
    plans = [plan_program(s) for s in range(N_SEEDS)]
    sizes = [p.n_ops for p in plans]
    assert min(sizes) >= 3 and max(sizes) <= 10
    assert len(set(sizes)) == 8
    used = collections.Counter(name for p in plans for _, name, _, _ in p.steps)
    wanted = {
        "matmul", "add", "multiply", "relu", "sigmoid", "tanh", "concat", "split", "permute_dims",
        "reshape", "conv2d", "batch_norm", "get", "avg_pool2d", "max_pool2d", "softmax",
    }  # fmt: skip
    assert wanted <= set(used), wanted - set(used)
    kernels = {a[1][1].shape[2] for p in plans for _, name, a, _ in p.steps if name == "conv2d"}
    assert kernels == {1, 3, 5}
    assert sum(len(p.params) == 2 for p in plans) >= N_SEEDS // 5
    assert sum(p.weight_param is not None for p in plans) >= 10


@pytest.mark.heavy
def test_optimized_modules_compute_the_same_values(fuzz_results):
    failures = []
    for seed, mod, new, report in fuzz_results:
        if not relax.analysis.check_well_formed(new):
            failures.append((seed, "not well formed"))
            continue
        if report["skipped"]:
            failures.append((seed, report["skipped"]))
            continue
        if report["cost_after"] > report["cost_before"] * (1 + 1e-9):
            failures.append((seed, "cost went up", report["cost_before"], report["cost_after"]))
        inputs = inputs_for(mod, seed=seed)
        try:
            before = reference_outputs(mod, inputs)
            after = reference_outputs(new, inputs)
            err = rel_err(before, after)
        except Exception as exc:  # noqa: BLE001 - collected with the seed, reported below
            failures.append((seed, f"{type(exc).__name__}: {exc}", report["applied"]))
            continue
        if not err <= TOL:
            failures.append((seed, f"relative error {err:.3g}", report["applied"]))
    assert not failures, f"{len(failures)} of {N_SEEDS} seeds failed: {failures}"


@pytest.mark.heavy
@pytest.mark.parametrize("seed", range(0, N_SEEDS, TVM_EVERY))
def test_optimized_modules_compile_and_agree_in_tvm(fuzz_results, seed):
    _, mod, new, report = fuzz_results[seed]
    inputs = inputs_for(mod, seed=seed)
    reference = reference_outputs(mod, inputs)
    before = run(mod, inputs, target="llvm")
    assert rel_err(reference, before) <= TOL  # the numpy reference reads the module right
    after = run(new, inputs, target="llvm") if report["applied"] else before
    assert rel_err(before, after) <= TOL, report["applied"]


@pytest.mark.heavy
def test_rewrites_actually_happen(fuzz_results):
    total = collections.Counter()
    changed = 0
    for _, mod, new, report in fuzz_results:
        total.update(report["applied"])
        changed += bool(report["applied"])
    assert sum(total.values()) >= MIN_APPLIED, total
    assert len(total) >= MIN_DISTINCT_RULES, total
    assert changed >= N_SEEDS // 2, changed
    # grouped convs are rewritten too: widened to fewer groups, or parallel ones merged
    assert total["merge-conv-groups"] + sum(n for r, n in total.items() if "parallel-convs" in r) > 0, total


def test_outputs_that_reduce_to_parameters():
    """concat(split(x)) and a transpose and its inverse are x itself: the optimized block
    binds its outputs to the parameter (``gv = x``), which must still compute x."""
    p = Plan(0)
    x = p.param(4, 6)
    a, b = p.op("split", x, indices=(2,), axis=1)
    p.op("concat", a, b, axis=1)
    p.op("permute_dims", p.op("permute_dims", x, axes=(1, 0)), axes=(1, 0))
    mod = build_module(p)
    new, report = tvm_taso.optimize(mod, target="cuda")
    applied = set(report["applied"])
    assert "concat-of-split" in applied and any("transpose" in r for r in applied), applied
    inputs = inputs_for(mod, seed=3)
    after = reference_outputs(new, inputs)
    assert all(np.array_equal(out, inputs[0]) for out in after)
    assert rel_err(run(mod, inputs), run(new, inputs)) <= TOL
