"""The rule generator (tvm_taso/generate/) and the library it wrote (rules/generated.rules):
fingerprints pair known equivalent graphs, generation is deterministic, and every generated
rule rewrites an instance of its source into a graph that computes the same values."""

from __future__ import annotations

import importlib.resources

import numpy as np
import pytest

import tvm_taso
from tvm_taso.cli.main import main as cli_main
from tvm_taso.generate.checks import engine_check
from tvm_taso.generate.driver import GenConfig, generate
from tvm_taso.generate.enumerate_graphs import EnumConfig, Enumerator, SmallGraph
from tvm_taso.generate.output import render
from tvm_taso.generate.prune import graph_canon
from tvm_taso.generate.search_space import domains
from tvm_taso.generate.shapes import LinExpr, Span
from tvm_taso.ir.graph import Graph
from tvm_taso.ir.ops import TensorType
from tvm_taso.rewrite.rule import Call, Get, Op, Tup, Var, parse_rules


def _mat():
    return {d.name: d for d in domains(False)}["mat"]


def _fingerprints(groups, max_ops=3):
    """graph_canon -> fingerprint key, for every graph the enumeration records."""
    e = Enumerator(_mat(), EnumConfig(max_ops=max_ops, groups=groups))
    out = {}
    for key, ops_, outs, hs, _ in e.run():
        out[graph_canon(SmallGraph("mat", ops_, outs, hs))] = key
    return out


def test_fingerprint_pairs_matmul_over_concat():
    fp = _fingerprints(("matmul", "concat"))
    one = fp[("matmul(x1,concat1(w1,w2))",)]
    assert fp[("concat1(matmul(x1,w1),matmul(x1,w2))",)] == one
    # the same ops in the wrong order compute something else
    assert fp[("concat1(matmul(x1,w2),matmul(x1,w1))",)] != one
    assert fp[("matmul(x1,concat1(w2,w1))",)] != one


def test_fingerprint_pairs_relu_with_concat_and_not_relu_with_add():
    fp = _fingerprints(("relu", "concat", "add"))
    assert fp[("relu(concat0(x1,x2))",)] == fp[("concat0(relu(x1),relu(x2))",)]
    # relu does not distribute over add: the polynomial stand-in must keep them apart
    assert fp[("relu(add(x1,x2))",)] != fp[("add(relu(x1),relu(x2))",)]


def test_fingerprint_pairs_two_output_merge():
    fp = _fingerprints(("matmul", "concat", "split"))
    split = {f"split1(matmul(x1,concat1(w1,w2)))#{j}" for j in (0, 1)}
    merged = [k for c, k in fp.items() if set(c) == split]
    parallel = [k for c, k in fp.items() if set(c) == {"matmul(x1,w1)", "matmul(x1,w2)"}]
    assert len(merged) == 1 and parallel == merged


def _tiny(**kw):
    cfg = dict(max_ops=3, groups=("matmul", "concat", "split"), domains=("mat",), workers=1, progress=False)
    cfg.update(kw)
    return GenConfig(**cfg)


def test_tiny_generation_finds_merges_and_is_deterministic():
    first = generate(_tiny())
    text = render(first)
    assert text == render(generate(_tiny()))
    assert text == render(generate(_tiny(workers=2)))  # the same with a process pool
    assert {"merge-matmul", "matmul-concat", "concat-split"} <= set(first.families)
    rules = parse_rules(text)
    assert rules and all(r.provenance == "generated" and r.proof == "checked" for r in rules)
    for key in ("candidate pairs (equal fingerprints)", "after common-subgraph pruning", "rules written"):
        assert key in first.stats


def test_cli_writes_a_rule_file(tmp_path, capsys):
    out = tmp_path / "g.rules"
    assert cli_main(["rules", "generate", "--max-ops", "2", "--ops", "matmul,transpose,scalar", "--workers", "1",
                     "-o", str(out)]) == 0
    rules = tvm_taso.load_rules(out)
    assert rules and all(r.name.startswith("gen-") for r in rules)
    assert "rules written" in capsys.readouterr().err


# -- the shipped generated library ------------------------------------------------------------


def _shipped():
    f = importlib.resources.files("tvm_taso.rules") / "generated.rules"
    if not f.is_file():
        pytest.skip("rules/generated.rules has not been generated")
    return parse_rules(f.read_text(), "rules/generated.rules")


def test_generated_library_parses_and_has_taso_families():
    rules = _shipped()
    assert 50 <= len(rules) <= 3000
    assert all(r.provenance == "generated" and r.proof in ("checked", "proved") for r in rules)
    families = {r.name.rsplit("-", 2 if r.name.endswith("-rev") else 1)[0][len("gen-"):] for r in rules}
    for fam in ("merge-matmul", "merge-conv", "enlarge", "matmul-concat", "conv-concat", "matmul-add",
                "conv-add", "concat-split", "relu-concat", "transpose", "matmul-assoc"):
        assert fam in families, fam


def test_every_generated_rule_rewrites_an_instance_correctly():
    rules = _shipped()
    bad = []
    for i, rule in enumerate(rules):
        G, feeds = _rule_instance(rule, seed=i)
        ok, why = engine_check(rule, G, feeds)
        if not ok:
            bad.append(f"{rule.name}: {why}")
    assert not bad, bad


# -- an instance of a rule from its text alone ------------------------------------------------


def _rule_instance(rule, seed: int = 0, tries: int = 60):
    """A graph holding one site of ``rule``'s source at random sizes that satisfy its
    conditions, with random float64 inputs: ``(graph, feeds)``. Handles the forms the generator
    writes (rank and linear dim conditions, split cut variables); raises ValueError otherwise."""
    ranks: dict = {}
    eqs: list = []
    cuts: dict = {}

    def le(x) -> LinExpr:
        if isinstance(x, bool):
            raise ValueError("boolean in a size expression")
        if isinstance(x, int):
            return LinExpr.lit(x)
        if isinstance(x, Var):
            if x.name in cuts:
                return cuts[x.name]
            raise ValueError(f"unbound ?{x.name}")
        if isinstance(x, Call):
            if x.fn == "dim":
                return LinExpr.atom((x.args[0].name, x.args[1]))
            a = [le(y) for y in x.args]
            if x.fn == "+":
                return a[0] + a[1]
            if x.fn == "-":
                return a[0] - a[1]
            if x.fn == "*":
                k, e = (a[0], a[1]) if not a[0].t else (a[1], a[0])
                if k.t:
                    raise ValueError("non-linear size expression")
                return LinExpr(((v, c * k.c) for v, c in e.t), e.c * k.c)
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
            return [tuple(LinExpr.atom((p.name, i)) for i in range(ranks[p.name]))]
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
            per_group = w[1]
            for _ in range(at.get("groups", 1) - 1):  # input channels: groups x the kernel's
                per_group = per_group + w[1]
            eqs.append(x[1] - per_group)
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


@pytest.mark.heavy
def test_parallel_activations_on_rank_4_tensors_are_stated():
    """``relu(a), relu(b) => split(relu(concat(a, b)))`` for NCHW tensors, on both axes merges
    concatenate along: the parallel pair of relus used to be paired with its twin through TASO's
    identity convolution, a partner no rule can spell, and lost its only rule (issue 30)."""
    result = generate(GenConfig(max_ops=3, groups=("conv2d", "relu", "concat", "split", "const"), domains=("conv",),
                                workers=1, progress=False, implied=False))
    parallel = [parse_rules(e.text)[0] for e in result.rules if e.text.split(":", 1)[1].split("=>")[0].strip()
                == "(relu ?x1), (relu ?x2)"]
    axes = sorted(dict(r.dst[0].attrs)["axis"] for r in parallel)
    assert axes == [0, 1] and all("(= (rank ?x1) 4)" in r.text for r in parallel)
