"""Rules as ``tvm.relax.dpl`` patterns: they compile, find the sites our matcher finds (found
independently: on the examples and on the eight benchmark models), and rewrite one chosen site
into a well-formed function that computes the same values. The matcher says why a rule does
not match."""

import sys
from collections import Counter
from pathlib import Path

import numpy as np
import pytest
import tvm
import tvm_ffi
from tvm import relax
from tvm.relax.dpl import DFPattern, PatternContext, rewrite_call

import tvm_taso
from tvm_taso import examples, runtime
from tvm_taso.io.onnx_import import import_relax
from tvm_taso.ir.relax_bridge import BlockGraph
from tvm_taso.numerics import relative_error
from tvm_taso.rewrite import dpl
from tvm_taso.rewrite.match import find_matches, why_not

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))  # benchmarks/ is not installed
from benchmarks.models import MODELS, build  # noqa: E402

RULES = {r.name: r for r in tvm_taso.default_rules() if r.provenance == "hand"}  # generated rules: test_generate.py
SINGLE = [r for r in RULES.values() if len(r.src) == 1]
MULTI = [r for r in RULES.values() if len(r.src) > 1]


def module(body, **shapes) -> tvm.IRModule:
    """``main(**shapes)``: each tensor ``body`` returns is an output of the dataflow block."""
    bb = relax.BlockBuilder()
    params = [relax.Var(name, relax.TensorType(shape, "float32")) for name, shape in shapes.items()]
    with bb.function("main", params):
        with bb.dataflow():
            outs = [bb.emit_output(v) for v in body(bb, *params)]
        bb.emit_func_output(relax.Tuple(outs))
    return bb.get()


def const(*shape, seed=0):
    return relax.const(np.random.default_rng(seed).standard_normal(shape).astype("float32"))


def zoo_body(bb, x, y, img):
    """Sites for most single-root rules, and near misses (a literal attribute, a default,
    a shared variable or a condition that does not hold)."""
    op, nn, e = relax.op, relax.op.nn, bb.emit
    a, b, c = const(8, 8, seed=1), const(8, 8, seed=2), const(8, 4, seed=3)
    xa, xb, yb = e(op.matmul(x, a)), e(op.matmul(x, b)), e(op.matmul(y, b))
    outs = [
        e(op.matmul(xa, c)),  # matmul-assoc-right
        e(op.matmul(x, e(op.matmul(a, c)))),  # matmul-assoc-left
        e(op.add(xa, xb)),  # matmul-sum-same-lhs, matmul-sum-to-concat
        e(op.add(xa, yb)),  # matmul-sum-to-concat only: ?x is not ?y
        e(op.multiply(xb, relax.const(np.float32(0.5)))),  # fold-scalar-mul-into-matmul
        e(op.concat([xa, xb], axis=2)),  # matmul-over-concat
        e(op.concat([xa, xb], axis=0)),  # near miss: axis is not rank-1
        e(op.matmul(x, e(op.concat([a, c], axis=1)))),  # matmul-of-concat
        e(op.matmul(x, e(op.concat([c, c], axis=1)))),  # matmul-of-concat again
        e(op.matmul(x, e(op.concat([const(4, 8), const(4, 8)], axis=0)))),  # near miss: literal :axis 1
        e(op.concat([e(op.matmul(const(3, 8), a)), e(op.matmul(const(5, 8), a))], axis=0)),  # matmul-over-row-concat
    ]
    ca, cb = e(op.concat([x, y], axis=1)), e(op.concat([y, x], axis=1))
    outs += [e(op.add(ca, cb)), e(op.multiply(ca, cb)), e(nn.relu(ca))]  # add/mul-of-concats, relu-of-concat
    outs += [e(op.concat([e(op.add(x, y)), e(op.add(y, x))], axis=1))]  # concat-of-adds
    outs += [e(op.concat([e(op.multiply(x, y)), e(op.multiply(y, y))], axis=1))]  # concat-of-muls
    outs += [e(op.concat([e(nn.relu(x)), e(nn.relu(y))], axis=2))]  # concat-of-relus
    s = e(op.split(x, [3], axis=1))
    outs += [e(op.concat([e(relax.TupleGetItem(s, 0)), e(relax.TupleGetItem(s, 1))], axis=1))]  # concat-of-split
    outs += [e(op.concat([e(relax.TupleGetItem(s, 0)), e(relax.TupleGetItem(s, 1))], axis=2))]  # near miss: axis
    sc = e(op.split(ca, [6], axis=1))  # split-of-concat: a multi-output root
    outs += [e(relax.TupleGetItem(sc, 0)), e(relax.TupleGetItem(sc, 1))]
    outs += [e(op.permute_dims(e(op.permute_dims(x, [0, 2, 1])), [1, 0, 2]))]  # transpose-of-transpose
    outs += [e(op.permute_dims(y, [0, 1, 2]))]  # identity-transpose
    w, k = const(6, 4, 3, 3, seed=4), const(1, 6, 1, 1, seed=5)
    conv = e(nn.conv2d(img, w, strides=2, padding=1))
    outs += [e(op.multiply(conv, k))]  # fold-channel-mul-into-conv
    grouped = e(nn.conv2d(img, const(6, 2, 1, 1, seed=6), groups=2))
    outs += [e(op.multiply(grouped, relax.const(np.float32(2.0))))]  # fold-scalar-mul-into-conv
    outs += [e(op.add(conv, e(nn.conv2d(img, const(6, 4, 3, 3, seed=7), strides=2, padding=1))))]  # conv-sum
    outs += [e(op.add(conv, e(nn.conv2d(e(nn.relu(img)), w, strides=2, padding=1))))]  # near miss: ?x differs
    gamma, beta, mean = (const(6, seed=i) for i in (8, 9, 10))
    var = relax.const(np.linspace(0.5, 1.5, 6, dtype="float32"))
    bn = nn.batch_norm(conv, gamma, beta, mean, var, axis=1, training=False)  # fold-batch-norm-into-conv
    outs += [e(relax.TupleGetItem(e(bn), 0))]
    bn = nn.batch_norm(grouped, gamma, beta, mean, var, axis=1, center=False, training=False)  # near miss: a default
    outs += [e(relax.TupleGetItem(e(bn), 0))]
    relu_img = e(nn.relu(img))
    halves = [e(nn.conv2d(v, const(4, 2, 3, 3, seed=11 + i), padding=1, groups=2)) for i, v in enumerate((img, relu_img))]
    outs += [e(op.concat(halves, axis=1))]  # concat-of-convs-to-group-conv
    wide = e(op.concat([const(4, 2, 1, 1, seed=13), const(4, 2, 1, 1, seed=14)], axis=0))
    outs += [e(nn.conv2d(e(op.concat([img, relu_img], axis=1)), wide, groups=4))]  # group-conv-of-concats
    biased = e(op.add(conv, const(1, 6, 1, 1, seed=15)))
    bn = nn.batch_norm(biased, gamma, beta, mean, var, axis=1, training=False)  # fold-batch-norm-into-conv-bias
    outs += [e(relax.TupleGetItem(e(bn), 0))]
    rows = e(op.matmul(e(op.reshape(x, (12, 8))), a))  # PyTorch's Linear: rows flattened, reshaped back
    outs += [e(op.reshape(rows, (2, 6, 8)))]  # matmul-of-flattened-rows
    outs += [e(op.reshape(e(op.add(rows, const(8, seed=16))), (2, 6, 8)))]  # matmul-bias-of-flattened-rows
    outs += [e(op.reshape(rows, (6, 2, 8)))]  # near miss: not the rows' own batch shape
    heads = e(op.reshape(ca, (2, 2, 12, 4)))
    keys = e(op.reshape(e(op.permute_dims(heads, [0, 1, 3, 2])), (4, 4, 12)))
    flat = e(op.matmul(e(op.reshape(heads, (4, 12, 4))), keys))
    outs += [e(op.reshape(flat, (2, 2, 12, 12)))]  # batch-matmul-of-flattened
    return outs


def zoo() -> tvm.IRModule:
    return module(zoo_body, x=(2, 6, 8), y=(2, 6, 8), img=(1, 4, 8, 8))


def split_chain_body(bb, x, c, e):
    """A split of a split's tail, and adds on both parts of a split (multi-root rules with
    tuple-valued and ``(get ...)`` roots)."""
    s = bb.emit(relax.op.split(x, [2], axis=1))
    s0, s1 = bb.emit(relax.TupleGetItem(s, 0)), bb.emit(relax.TupleGetItem(s, 1))
    t = bb.emit(relax.op.split(s1, [3], axis=1))
    tail = [bb.emit(relax.TupleGetItem(t, i)) for i in (0, 1)]
    return [s0, *tail, bb.emit(relax.op.add(s0, c)), bb.emit(relax.op.add(s1, e))]


def split_chain() -> tvm.IRModule:
    return module(split_chain_body, x=(2, 8), c=(2, 2), e=(2, 6))


MODULES = {"zoo": zoo, "split-chain": split_chain, **examples.EXAMPLES}


def our_sites(func, rule):
    bg = BlockGraph(func.body.blocks[0], Counter())
    return list(find_matches(bg.graph, rule))


def check_same_outputs(mod, variants: dict):
    """Each function of ``variants`` computes what ``mod["main"]`` computes (on llvm, one
    compile for all of them)."""
    funcs = {name: f.with_attr("global_symbol", name) for name, f in variants.items()}
    ex = tvm.compile(tvm.IRModule({"main": mod["main"], **funcs}), target="llvm")
    vm = relax.VirtualMachine(ex, tvm.cpu())
    args = [tvm.runtime.tensor(a) for a in runtime.inputs_for(mod, seed=1)]
    expected = runtime.flatten(vm["main"](*args))
    for name in funcs:
        got = runtime.flatten(vm[name](*args))
        assert [a.shape for a in got] == [a.shape for a in expected], name
        assert relative_error(expected, got) <= 1e-4, name


def call_ops(func) -> Counter:
    return Counter(b.value.op.name for blk in func.body.blocks for b in blk.bindings if isinstance(b.value, relax.Call))


def rewrite_every_site(func, rules) -> dict:
    """``apply_at`` at every site of every rule: well formed, same signature."""
    variants = {}
    for rule in rules:
        for i in range(len(dpl.sites(func, rule))):
            new = dpl.apply_at(func, rule, i)
            relax.analysis.well_formed(new)
            assert [p.name for p in new.params] == [p.name for p in func.params]
            assert tvm_ffi.structural_equal(new.ret_ty, func.ret_ty)
            variants[f"{rule.name.replace('-', '_')}_{i}"] = new
    return variants


# -- compiling -------------------------------------------------------------------------------


@pytest.mark.parametrize("rule", SINGLE, ids=lambda r: r.name)
def test_single_root_rule_compiles(rule):
    pattern, variables = dpl.to_pattern(rule)
    assert isinstance(pattern, DFPattern)
    assert variables and all(isinstance(p, DFPattern) for p in variables.values())
    assert set(variables) <= {t[1:] for t in rule.text.replace("(", " ").replace(")", " ").split()}


@pytest.mark.parametrize("rule", MULTI, ids=lambda r: r.name)
def test_multi_root_rule_compiles_in_a_pattern_context(rule):
    with PatternContext():
        roots, _ = dpl.to_pattern(rule)
    assert len(roots) == len(rule.src) and all(isinstance(p, DFPattern) for p in roots)


def test_literal_attributes_and_defaults_are_dpl_constraints():
    """The has_attr part alone (before the post-check) rejects a literal attribute and an
    unmentioned attribute off its default."""
    func = zoo()["main"]

    def raw(rule):
        hits = []
        rewrite_call(dpl.to_pattern(rule)[0], lambda e, m: hits.append(e) or e, func)
        return len([h for h in hits if not isinstance(h, relax.Var)])

    assert dpl.literal_attrs(RULES["matmul-of-concat"].src[0].args[1]) == {"axis": 1}
    assert raw(RULES["matmul-of-concat"]) == 2  # the axis=0 concat is not matched
    assert dpl.literal_attrs(RULES["fold-batch-norm-into-conv"].src[0].expr)["center"] is True
    assert raw(RULES["fold-batch-norm-into-conv"]) == 1  # the center=False batch_norm is not


# -- sites -----------------------------------------------------------------------------------


# the modules with single-root sites (qkv, inception and split-chain have multi-root ones only)
@pytest.mark.parametrize("name", ["bottleneck", "conv-bn-relu", "zoo"])
def test_dpl_sites_are_our_matchers_sites(name):
    func = MODULES[name]()["main"]
    counts = {}
    for rule in SINGLE:
        found = dpl.sites(func, rule)
        ours = our_sites(func, rule)
        assert [s.match.roots for s in found] == [m.roots for m in ours], rule.name
        counts[rule.name] = len(found)
    assert sum(counts.values()), f"{name}: no site on either side, nothing compared"
    if name == "zoo":
        assert all(counts.values()), counts
        assert counts["matmul-sum-same-lhs"] == 1 and counts["matmul-of-concat"] == 2
        assert counts["concat-of-split"] == 1 and counts["fold-batch-norm-into-conv"] == 1


def test_multi_root_sites_are_our_matchers_sites():
    for make in (examples.parallel_matmuls, examples.inception_block, split_chain):
        func = make()["main"]
        compared = 0
        for rule in MULTI:
            theirs = [s.match for s in dpl.sites(func, rule)]
            assert theirs == our_sites(func, rule), rule.name
            compared += len(theirs)
        assert compared, f"{make.__name__}: no site on either side, nothing compared"


@pytest.mark.heavy
def test_dpl_finds_our_matchers_sites_on_the_benchmark_models():
    """Every rule of the shipped library, on the eight benchmark models (quick sizes): DPL's
    sites (single-root patterns, roots joined on shared variables) are the matcher's, with the
    same bindings, in the same order. Neither side calls the other."""
    rules = tvm_taso.default_rules()
    families = Counter()  # sites per number of roots, over all models
    for name in MODELS:
        func = import_relax(build(name, quick=True))["main"]
        finder = dpl.Sites(func)
        graphs = [BlockGraph(block, Counter()).graph for block in func.body.blocks]
        found = 0
        for rule in rules:
            ours = [m for g in graphs for m in find_matches(g, rule)]
            theirs = finder.of(rule)
            assert [s.match for s in theirs] == ours, (name, rule.name, [[v.name for v in s.vars] for s in theirs][:5])
            families[len(rule.src)] += len(ours)
            found += len(ours)
        assert found, name
    assert families[1] > 100 and families[2] > 100, families


def test_independent_of_the_matcher(monkeypatch):
    """The DPL side finds its sites without calling the matcher."""
    from tvm_taso.rewrite import match

    def refuse(*args, **kwargs):
        raise AssertionError("dpl called the matcher")

    monkeypatch.setattr(match, "find_matches", refuse)
    monkeypatch.setattr(match, "_match_root", refuse)
    func = examples.parallel_matmuls()["main"]
    assert len(dpl.sites(func, RULES["merge-matmul-bias-shared-lhs"])) == 6
    assert len(dpl.sites(zoo()["main"], RULES["matmul-of-concat"])) == 2


# -- rewriting -------------------------------------------------------------------------------


def test_fold_batch_norm_at_one_site_of_conv_bn_relu():
    mod = examples.conv_bn_relu()
    rule = RULES["fold-batch-norm-into-conv"]
    assert len(dpl.sites(mod["main"], rule)) == 2
    new = dpl.apply_at(mod["main"], rule, 1)
    relax.analysis.well_formed(new)
    before, after = call_ops(mod["main"]), call_ops(new)
    assert before["relax.nn.batch_norm"] == 2 and after["relax.nn.batch_norm"] == 1
    assert after["relax.nn.conv2d"] == 2
    (kept,) = [b for b in new.body.blocks[0].bindings if getattr(b.value, "op", None) == tvm.ir.Op.get("relax.nn.batch_norm")]
    assert int(kept.var.ty.fields[1].shape[0]) == 16  # the first layer's batch_norm is untouched
    assert len(dpl.sites(new, rule)) == 1
    inputs = runtime.inputs_for(mod, seed=1)
    before, after = runtime.run(mod, inputs), runtime.run(tvm.IRModule({"main": new}), inputs)
    assert [a.shape for a in after] == [(1, 32, 16, 16)] and after[0].dtype == np.float32
    assert relative_error(before, after) <= 1e-4


@pytest.mark.heavy
def test_every_single_root_site_of_the_zoo_rewrites_and_keeps_values():
    mod = zoo()
    variants = rewrite_every_site(mod["main"], SINGLE)
    assert len(variants) >= 20
    check_same_outputs(mod, variants)


def test_multi_root_rule_through_rewrite_bindings_with_weight_parameters():
    def body(bb, x, w0, w1, w2):
        return [bb.emit(relax.op.matmul(x, w)) for w in (w0, w1, w2)]

    mod = module(body, x=(1, 16, 32), w0=(32, 8), w1=(32, 16), w2=(32, 24))
    rule = RULES["merge-matmul-shared-lhs"]
    found = dpl.sites(mod["main"], rule)
    assert len(found) == 6  # ordered pairs of three matmuls
    assert [v.name for v in found[3].vars] == ["lv1", "lv2"]  # x w1, x w2
    new = dpl.apply_at(mod["main"], rule, 3)
    relax.analysis.well_formed(new)
    ops = call_ops(new)
    assert ops["relax.matmul"] == 2 and ops["relax.split"] == 1 and ops["relax.concat"] == 1
    assert [p.name for p in new.params] == ["x", "w0", "w1", "w2"]
    check_same_outputs(mod, {"merged": new})


@pytest.mark.parametrize("name", ["qkv", "inception", "bottleneck", "split-chain"])
def test_every_multi_root_site_rewrites_and_keeps_values(name):
    """Constant weights (the examples) are lifted to parameters for ``rewrite_bindings`` and
    bound back; tuple-valued and ``(get ...)`` roots are rewritten too."""
    mod = MODULES[name]()
    variants = rewrite_every_site(mod["main"], MULTI)
    # inception: 9 sites of the shared-input merges, and 2 each of merge-parallel-convs(-bias)(-relu):
    # the 1x1 conv branches on the input and on the pooled input, in either order
    expected = {"qkv": 12, "inception": 15, "bottleneck": 2, "split-chain": 2}[name]
    assert len(variants) == expected, sorted(variants)
    assert not any(tvm_ffi.structural_equal(new, mod["main"]) for new in variants.values())
    check_same_outputs(mod, variants)


def test_multi_root_site_that_parameters_cannot_single_out():
    """``rewrite_bindings`` reports only its first match and a dataflow variable cannot be
    pinned: the first site of relu-over-split rewrites, the second raises LookupError."""

    def body(bb, x, y):
        outs = []
        for v in (x, y):
            s = bb.emit(relax.op.split(bb.emit(relax.op.nn.relu(v)), [3], axis=1))
            outs += [bb.emit(relax.op.nn.relu(bb.emit(relax.TupleGetItem(s, i)))) for i in (0, 1)]
        return outs

    mod = module(body, x=(2, 8), y=(2, 8))
    rule = RULES["relu-over-split"]
    assert len(dpl.sites(mod["main"], rule)) == 2
    new = dpl.apply_at(mod["main"], rule, 0)
    relax.analysis.well_formed(new)
    assert call_ops(new)["relax.split"] == 2 and call_ops(new)["relax.nn.relu"] == 5
    with pytest.raises(LookupError):
        dpl.apply_at(mod["main"], rule, 1)


def test_apply_at_checks_the_index_and_the_target_types():
    func = examples.conv_bn_relu()["main"]
    with pytest.raises(IndexError):
        dpl.apply_at(func, RULES["fold-batch-norm-into-conv"], 2)
    wrong = tvm_taso.parse_rules("wrong [hand, unverified]: (relu ?x) => (permute_dims ?x :axes [0 1 3 2])")[0]
    mod = module(lambda bb, x: [bb.emit(relax.op.nn.relu(x))], x=(1, 2, 3, 4))
    with pytest.raises(ValueError, match="target types"):
        dpl.apply_at(mod["main"], wrong, 0)


# -- why a rule does not match -------------------------------------------------------------


def near_misses_body(bb, x, img):
    """One near miss per output, each failing a different kind of check."""
    op, e = relax.op, bb.emit
    xa, xb = e(op.matmul(x, const(8, 8, seed=1))), e(op.matmul(x, const(8, 8, seed=2)))
    s = e(op.split(x, [3], axis=1))
    w = const(6, 4, 3, 3, seed=4)
    return [
        e(op.concat([xa, xb], axis=0)),  # matmul-over-concat: its condition on the axis
        e(op.matmul(x, e(op.concat([const(4, 8), const(4, 8)], axis=0)))),  # matmul-of-concat: :axis 1
        e(op.concat([e(relax.TupleGetItem(s, 0)), e(relax.TupleGetItem(s, 1))], axis=2)),  # concat-of-split: ?k
        e(op.add(e(relax.op.nn.conv2d(img, w)), e(relax.op.nn.conv2d(e(relax.op.nn.relu(img)), w)))),  # conv-sum: ?x
    ]


def test_why_not_names_the_first_failing_check():
    g = BlockGraph(module(near_misses_body, x=(2, 6, 8), img=(1, 4, 8, 8))["main"].body.blocks[0], Counter()).graph
    over, of, split, conv_sum = (ref[0] for ref in g.outputs)
    assert why_not(g, RULES["matmul-over-concat"], over) == f"node {over}: condition (= ?k (- (rank ?x) 1)) is false"
    assert why_not(g, RULES["matmul-of-concat"], of) == f"node {of}: concat attribute axis is 0, not 1"
    assert why_not(g, RULES["concat-of-split"], split) == f"node {split}: split attribute axis is 1, but ?k is already 2"
    reason = why_not(g, RULES["conv-sum-same-input"], conv_sum)
    assert reason.startswith(f"node {conv_sum}: ?x is input node ") and " and relu node " in reason
    assert why_not(g, RULES["matmul-of-concat"], over) == f"node {over}: node {over} is concat, not matmul"
    assert why_not(g, RULES["fold-batch-norm-into-conv"]) == "no batch_norm node"


def test_why_not_on_a_whole_graph():
    """None where the rule matches; for a multi-root rule, the root that finds no partner."""
    qkv = BlockGraph(examples.parallel_matmuls()["main"].body.blocks[0], Counter()).graph
    assert why_not(qkv, RULES["merge-matmul-shared-lhs"]) is None
    two_layers = BlockGraph(examples.conv_bn_relu()["main"].body.blocks[0], Counter()).graph
    reason = why_not(two_layers, RULES["merge-conv-shared-input"])
    assert reason.startswith("root 2 (conv2d ?x ?b :strides ?s :padding ?p :dilation ?d): node ")
    assert "?x is input node" in reason and " and relu node " in reason
