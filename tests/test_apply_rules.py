"""``ApplyRules``: the named rules applied wherever they match, with no search and no cost
model, keeping what the module computes."""

from collections import Counter

import pytest
import tvm
import tvm_ffi
from tvm import relax

import tvm_taso
from tvm_taso import examples, runtime
from tvm_taso.numerics import relative_error
from tvm_taso.passes import ApplyRules


def call_ops(func) -> Counter:
    return Counter(b.value.op.name for blk in func.body.blocks for b in blk.bindings if isinstance(b.value, relax.Call))


def same_outputs(mod, new) -> float:
    inputs = runtime.inputs_for(mod, seed=1)
    return relative_error(runtime.run(mod, inputs), runtime.run(new, inputs))


def test_merges_the_qkv_matmuls_into_one():
    mod = examples.parallel_matmuls()
    original = mod["main"]
    apply = ApplyRules(["merge-matmul-shared-lhs"])
    new = apply(mod)
    relax.analysis.well_formed(new)
    assert apply.last_applied == {"merge-matmul-shared-lhs": 2}  # (q, k), then (qk, v)
    projections = [b for blk in new["main"].body.blocks for b in blk.bindings
                   if isinstance(b.value, relax.Call) and b.value.op.name == "relax.matmul"
                   and b.value.args[0].same_as(new["main"].params[0])]
    assert len(projections) == 1 and [int(d) for d in projections[0].var.ty.shape] == [1, 16, 192]
    assert isinstance(projections[0].value.args[1], tvm.ir.expr.GenericConst)  # the weights' concat is folded
    assert call_ops(new["main"])["relax.matmul"] == 3 and call_ops(new["main"])["relax.concat"] == 0
    assert mod["main"].same_as(original)  # the input module is not changed
    assert same_outputs(mod, new) <= 1e-5


def test_multi_rule_priority_and_determinism():
    """The first rule of the list wins where both apply: the bias merge takes the Q/K/V adds
    with their matmuls, so the plain merge finds nothing left; the same input gives the same
    output."""
    mod = examples.parallel_matmuls()
    apply = ApplyRules(["merge-matmul-bias-shared-lhs", "merge-matmul-shared-lhs"])
    new = apply(mod)
    assert apply.last_applied == {"merge-matmul-bias-shared-lhs": 2}
    assert tvm_ffi.structural_equal(new, apply(mod))
    assert same_outputs(mod, new) <= 1e-5


def test_single_root_rule_everywhere_and_conditions_honoured():
    mod = examples.resnet_bottleneck()
    apply = ApplyRules(["fold-batch-norm-into-conv"])
    new = apply(mod)
    assert apply.last_applied == {"fold-batch-norm-into-conv": 4}
    assert call_ops(new["main"])["relax.nn.batch_norm"] == 0
    assert same_outputs(mod, new) <= 1e-4
    # The same merge with a condition that never holds: nothing is rewritten.
    never = tvm_taso.parse_rules("never [hand, unverified]: (matmul ?x ?a), (matmul ?x ?b)\n"
                                 "    => (split (matmul ?x (concat ?a ?b :axis 1)) :indices [(dim ?a 1)] :axis 2)\n"
                                 "    if (= (rank ?a) 3)")
    qkv = examples.parallel_matmuls()
    skip = ApplyRules(never)
    assert skip(qkv).same_as(qkv) and skip.last_applied == {}


def test_leaves_primitive_functions_alone_and_bounds_rules_that_loop():
    mod = examples.parallel_matmuls()
    primitive = mod["main"].with_attr("Primitive", True)
    kept = tvm.IRModule({"main": primitive})
    assert ApplyRules(["merge-matmul-shared-lhs"])(kept).same_as(kept)
    swap = tvm_taso.parse_rules("swap [hand, unverified]: (add ?x ?y) => (add ?y ?x)")
    loop = ApplyRules(swap, max_rewrites=3)
    with pytest.warns(RuntimeWarning, match="stopped after 3 rewrites of main"):
        new = loop(mod)
    assert loop.last_applied == {"swap": 3}
    assert same_outputs(mod, new) <= 1e-5


def test_unknown_rule_names_are_refused():
    with pytest.raises(ValueError, match="no rule named 'merge-everything'"):
        ApplyRules(["merge-everything"])


def test_a_single_rule_name_is_one_rule_and_anything_else_one_clear_error():
    from tvm_taso.passes import ApplyRules

    single = ApplyRules("merge-matmul-shared-lhs")
    assert [p.rule.name for p in single.patterns] == ["merge-matmul-shared-lhs"]
    for bad in (None, 3, ["merge-matmul-shared-lhs", None]):
        with pytest.raises(TypeError, match="rule name, a Rule, or a list"):
            ApplyRules(bad)


def test_rules_apply_through_symbolic_shapes_where_their_conditions_are_decided():
    """A function with a symbolic ``n`` used to be passed over with a warning. The merge now
    applies there (its conditions hold for every ``n``) and keeps the outputs at several sizes,
    while a rule whose condition asks ``n`` for a value it may or may not have is not applied."""
    import numpy as np

    from tvm_taso.rewrite.rule import parse_rules

    n = tvm.tirx.Var("n", "int64")
    bb = relax.BlockBuilder()
    x = relax.Var("x", relax.TensorType((n, 8), "float32"))
    rng = np.random.default_rng(0)
    with bb.function("main", [x]):
        with bb.dataflow():
            a, b = (bb.emit(relax.op.matmul(x, relax.const(rng.standard_normal((8, 8)).astype("float32"))))
                    for _ in range(2))
            out = bb.emit_output(relax.op.add(a, b))
        bb.emit_func_output(out)
    mod = bb.get()
    apply = ApplyRules(["merge-matmul-shared-lhs"])
    new = apply(mod)
    assert apply.last_applied == {"merge-matmul-shared-lhs": 1}
    cases = [runtime.inputs_for(mod, seed=k, sizes={"n": k}) for k in (1, 6)]
    for before, after in zip(runtime.run(mod, cases), runtime.run(new, cases)):
        assert relative_error(before, after) <= 1e-5
    (sized,) = parse_rules("merge-four-rows [hand, unverified]: (matmul ?x ?a), (matmul ?x ?b) "
                           "=> (split (matmul ?x (concat ?a ?b :axis 1)) :indices [(dim ?a 1)] :axis 1) "
                           "if (= (dim ?x 0) 4)")
    undecided = ApplyRules(sized)
    assert tvm_ffi.structural_equal(undecided(mod), mod) and not undecided.last_applied
