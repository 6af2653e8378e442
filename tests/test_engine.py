"""End-to-end: optimized modules compute what the originals computed, the pass works inside
TVM's pipelines, and bad input is reported or passed through untouched."""

import json
import warnings

import numpy as np
import pytest
import tvm
import tvm_ffi
from tvm import relax

import tvm_taso
from tvm_taso import examples
from tvm_taso.numerics import relative_error
from tvm_taso.passes import TasoOptimize
from tvm_taso.runtime import check_sizes, inputs_for, run


def check_same_outputs(mod, new, target="llvm", pipeline="default"):
    """The same outputs on the same inputs (at two sizes of a module with symbolic sizes)."""
    inputs = [inputs_for(mod, seed=1, sizes=sizes) for sizes in check_sizes(mod)]
    for before, after in zip(run(mod, inputs), run(new, inputs, target=target, relax_pipeline=pipeline)):
        assert len(before) == len(after)
        for a, b in zip(before, after):
            assert a.shape == b.shape and a.dtype == b.dtype
        assert relative_error(before, after) <= 1e-4


EXPECTED = {
    "qkv": {"merge-matmul-bias-shared-lhs"},
    "inception": {"merge-conv-bias-relu-enlarge"},
    "conv-bn-relu": {"fold-batch-norm-into-conv"},
    "bottleneck": {"fold-batch-norm-into-conv"},
    "llama": {"merge-matmul-shared-lhs"},
}
# what the engine leaves as it is in each example: Relax's fused attention (no rule reads it)
SKIPPED = {"llama": [{"what": "@main: unknown op relax.nn.attention", "count": 2}]}


@pytest.mark.parametrize("name", sorted(examples.EXAMPLES))
@pytest.mark.parametrize("target", ["cuda", {"kind": "llvm", "num-cores": 2}])
def test_examples_keep_outputs_and_lower_cost(name, target):
    mod = examples.EXAMPLES[name]()
    new, report = tvm_taso.optimize(mod, target=target)
    json.dumps(report)  # the report is data
    assert relax.analysis.check_well_formed(new)
    check_same_outputs(mod, new)
    if target == "cuda":
        assert report["cost_after"] < report["cost_before"]
        assert EXPECTED[name] <= set(report["applied"]), report["applied"]
    else:
        assert report["cost_after"] <= report["cost_before"]
    for key in ("cost_before", "cost_after", "search_seconds", "expanded", "applied", "skipped"):
        assert key in report
    assert report["skipped"] == SKIPPED.get(name, [])


def test_inception_merges_three_branches_into_one_conv():
    mod = examples.inception_block()
    new, _ = tvm_taso.optimize(mod, target="cuda")
    block = new["main"].body.blocks[0]
    convs = [b for b in block.bindings if isinstance(b.value, relax.Call) and b.value.op.name == "relax.nn.conv2d"]
    assert len(convs) == 2  # the 1x1/3x3/5x5 branches in one 5x5 conv, plus the pooled branch
    assert {tuple(int(d) for d in c.var.ty.shape)[1] for c in convs} == {96, 32}


def test_batch_norm_is_folded_into_constant_weights():
    mod = examples.conv_bn_relu()
    new, report = tvm_taso.optimize(mod, target="cuda")
    ops = [b.value.op.name for b in new["main"].body.blocks[0].bindings if isinstance(b.value, relax.Call)]
    assert "relax.nn.batch_norm" not in ops
    assert ops.count("relax.nn.conv2d") == 2
    assert report["constants_folded"] > 0


def test_batch_norms_are_folded_before_the_branches_merge():
    """Inception's branches as torchvision writes them (conv, batch norm, relu; no exporter has
    folded the batch norms): backtracking folds them first (steepest descent seeds its queue),
    then merges the convs of the shared input, as it does when the batch norms come folded."""

    def body(b, x):
        return b.emit(relax.op.concat([b.conv_bn_relu(x, 16, 16, k) for k in (1, 3, 3)], axis=1))

    mod = examples._module({"x": (1, 16, 8, 8)}, body)
    new, report = tvm_taso.optimize(mod, target="cuda", cost_model="analytic", budget=8)
    ops = [b.value.op.name for b in new["main"].body.blocks[0].bindings if isinstance(b.value, relax.Call)]
    assert "relax.nn.batch_norm" not in ops
    assert ops.count("relax.nn.conv2d") == 1
    inputs = inputs_for(mod)
    assert relative_error(run(new, inputs), run(mod, inputs)) < 1e-4


def test_pass_in_sequential_and_report():
    mod = examples.parallel_matmuls()
    p = TasoOptimize(target="cuda", time_limit=10)
    seq = tvm.transform.Sequential([relax.transform.Normalize(), p, relax.transform.CanonicalizeBindings()])
    new = seq(mod)
    assert p.last_report["applied"]
    check_same_outputs(mod, new)


def test_taso_pipeline_in_tvm_compile():
    mod = examples.inception_block()
    inputs = inputs_for(mod)
    expected = run(mod, inputs)
    got = run(mod, inputs, relax_pipeline=relax.get_pipeline("taso"))
    assert relative_error(expected, got) <= 1e-4


def test_search_is_deterministic():
    mod = examples.resnet_bottleneck()
    a, ra = tvm_taso.optimize(mod, target="cuda")
    b, rb = tvm_taso.optimize(mod, target="cuda")
    assert tvm_ffi.structural_equal(a, b)
    assert ra["applied"] == rb["applied"] and ra["expanded"] == rb["expanded"]


def test_budget_and_time_limit_bound_the_search():
    mod = examples.parallel_matmuls()
    _, report = tvm_taso.optimize(mod, target="cuda", budget=1)
    assert report["expanded"] <= report["regions"]
    assert set(report["regions_stopped"]) <= {"budget", "queue empty", "reused an identical region"}
    assert sum(report["regions_stopped"].values()) == report["regions"]
    _, report = tvm_taso.optimize(mod, target="cuda", time_limit=0.0)
    assert report["expanded"] == 0 and report["cost_after"] == report["cost_before"]
    assert set(report["regions_stopped"]) <= {"deadline", "deadline (not searched)"}
    assert report["regions_stopped"]


def test_each_region_says_why_its_search_stopped():
    _, report = tvm_taso.optimize(examples.resnet_bottleneck(), target="cuda", budget=1000)
    stopped = report["regions_stopped"]
    assert sum(stopped.values()) == report["regions"]
    assert set(stopped) <= {"patience", "queue empty", "reused an identical region"}


def _unknown_op_module():
    def body(b, x):
        y = b.conv_bn_relu(x, 8, 8, 3)
        c = b.emit(relax.op.cumsum(y, axis=1))  # not an op tvm-taso knows
        return b.conv_bn_relu(c, 8, 8, 3)

    return examples._module({"x": (1, 8, 8, 8)}, body)


def test_unknown_op_is_kept_with_one_warning():
    mod = _unknown_op_module()
    with pytest.warns(tvm_taso.TasoSkippedWarning, match="relax.cumsum") as record:
        new, report = tvm_taso.optimize(mod, target="cuda")
    assert len([w for w in record if issubclass(w.category, tvm_taso.TasoSkippedWarning)]) == 1
    assert any("relax.cumsum" in s["what"] for s in report["skipped"])
    ops = [b.value.op.name for b in new["main"].body.blocks[0].bindings if isinstance(b.value, relax.Call)]
    assert "relax.cumsum" in ops
    assert report["applied"]  # the known ops around it were still optimized
    check_same_outputs(mod, new)


def _symbolic_projections():
    """Three matmuls of ``x: (n, 8)`` with constant weights, combined elementwise: merged for
    every ``n``."""
    n = tvm.tirx.Var("n", "int64")
    bb = relax.BlockBuilder()
    x = relax.Var("x", relax.TensorType((n, 8), "float32"))
    rng = np.random.default_rng(0)
    with bb.function("main", [x]):
        with bb.dataflow():
            a, b, c = (bb.emit(relax.op.matmul(x, relax.const(rng.standard_normal((8, 8)).astype("float32"))))
                       for _ in range(3))
            o = bb.emit_output(relax.op.add(relax.op.multiply(relax.op.nn.relu(a), relax.op.sigmoid(b)), c))
        bb.emit_func_output(o)
    return bb.get()


def test_symbolic_shapes_are_optimized_and_keep_their_symbols():
    """Symbolic sizes used to be passed through (nothing applied): the three matmuls of one
    input now merge for every ``n``, priced at the default sizes the report names, and the
    result keeps ``n`` symbolic, is well formed, and computes what the original computes at
    several sizes, in the user's pipeline too."""
    mod = _symbolic_projections()
    new, report = tvm_taso.optimize(mod, target="cuda")
    assert report["applied"].get("merge-matmul-shared-lhs") == 2
    assert sum(b.value.op.name == "relax.matmul" for b in new["main"].body.blocks[0].bindings
               if isinstance(b.value, relax.Call)) == 1
    assert report["priced_sizes"] == {"n": {"sizes": [1, 128], "from": "default"}}
    assert [row["sizes"] for row in report["cost_at_sizes"]] == [{"n": 1}, {"n": 128}]
    assert all(row["after"] < row["before"] for row in report["cost_at_sizes"])
    assert relax.analysis.check_well_formed(new)
    assert str(new["main"].params[0].ty.shape[0]) == "n"
    cases = [inputs_for(mod, seed=k, sizes={"n": k}) for k in (1, 3, 17)]
    for before, after in zip(run(mod, cases), run(new, cases)):
        assert relative_error(before, after) <= 1e-5
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        ex = tvm.compile(mod, target="llvm", relax_pipeline=relax.get_pipeline("taso"))
    vm = relax.VirtualMachine(ex, tvm.cpu())
    for k in (2, 5):
        np.testing.assert_allclose(vm["main"](tvm.runtime.tensor(cases[1][0][:1].repeat(k, 0))).numpy(),
                                   run(mod, [cases[1][0][:1].repeat(k, 0)])[0], rtol=1e-5, atol=1e-5)


def test_non_dataflow_code_is_left_alone():
    bb = relax.BlockBuilder()
    x = relax.Var("x", relax.TensorType((4, 8), "float32"))
    with bb.function("main", [x]):
        y = bb.emit(relax.op.nn.relu(x))  # outside any dataflow block
        bb.emit_func_output(y)
    mod = bb.get()
    with pytest.warns(tvm_taso.TasoSkippedWarning, match="non-dataflow"):
        new, _ = tvm_taso.optimize(mod)
    assert tvm_ffi.structural_equal(new, mod)


def test_malformed_rule_file_names_file_line_and_expectation(tmp_path):
    path = tmp_path / "bad.rules"
    path.write_text(
        "# a comment\n"
        "ok-rule [hand, checked]: (relu (relu ?x)) => (relu ?x)\n"
        "broken [hand, checked]: (matmul ?x ?a) => (matmul ?x ?a\n"
    )
    with pytest.raises(tvm_taso.RuleSyntaxError, match=r"bad\.rules:3:\d+: expected '\)'"):
        tvm_taso.load_rules(path)
    path.write_text("r [hand, checked]: (frobnicate ?x) => ?x\n")
    with pytest.raises(tvm_taso.RuleSyntaxError, match=r"bad\.rules:1:\d+: unknown op 'frobnicate'"):
        tvm_taso.load_rules(path)
    path.write_text("r [hand, maybe]: (relu ?x) => ?x\n")
    with pytest.raises(tvm_taso.RuleSyntaxError, match="expected proof status"):
        tvm_taso.load_rules(path)
    path.write_text("r [hand, checked]: (relu ?x) => ?y\n")
    with pytest.raises(tvm_taso.RuleSyntaxError, match=r"\?y not bound"):
        tvm_taso.load_rules(path)
    with pytest.raises(tvm_taso.RuleSyntaxError, match="cannot read rule file"):
        tvm_taso.load_rules(tmp_path / "missing.rules")


def test_user_rules_drive_the_search():
    rules = tvm_taso.parse_rules(
        "double-relu [hand, checked]: (relu (relu ?x)) => (relu ?x)\n", "<test>"
    )
    bb = relax.BlockBuilder()
    x = relax.Var("x", relax.TensorType((4, 8), "float32"))
    with bb.function("main", [x]):
        with bb.dataflow():
            o = bb.emit_output(relax.op.nn.relu(bb.emit(relax.op.nn.relu(x))))
        bb.emit_func_output(o)
    mod = bb.get()
    new, report = tvm_taso.optimize(mod, rules=rules, target="cuda")
    assert report["applied"] == {"double-relu": 1}
    check_same_outputs(mod, new)


def test_cli_example(capsys):
    from tvm_taso.cli.main import main

    assert main(["example", "qkv"]) == 0
    out = capsys.readouterr().out
    assert "merge-matmul-bias-shared-lhs" in out and "(ok)" in out
