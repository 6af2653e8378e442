"""The engine's safeguards: no silent wrong result from constant folding, user rules,
BYOC functions, rounding "gains", non-finite costs, options, rule files, measurements or a
search cut short. One test (or a few) per case, each reproducing it."""

from __future__ import annotations

import json
import logging
import math
import random

import numpy as np
import pytest
import tvm
import tvm_ffi
from tvm import relax

import tvm_taso
from tvm_taso import examples
from tvm_taso.cost.analytic import AnalyticCost
from tvm_taso.cost.database import MeasurementDB, Record
from tvm_taso.ir.graph import Graph, fold_constants
from tvm_taso.ir.ops import TensorType
from tvm_taso.passes import ApplyRules, TasoOptimize
from tvm_taso.rewrite import dpl
from tvm_taso.rewrite.match import find_matches
from tvm_taso.errors import TargetError
from tvm_taso.verify import admit as admission


def _relu_module(shape=(4, 8), double=False):
    bb = relax.BlockBuilder()
    x = relax.Var("x", relax.TensorType(shape, "float32"))
    with bb.function("main", [x]):
        with bb.dataflow():
            y = bb.emit(relax.op.nn.relu(x))
            if double:
                y = bb.emit(relax.op.nn.relu(y))
            o = bb.emit_output(relax.op.add(y, x))
        bb.emit_func_output(o)
    return bb.get()


def _run(mod, x):
    ex = tvm.compile(mod, "llvm")
    vm = relax.VirtualMachine(ex, tvm.cpu())
    return vm["main"](tvm.runtime.tensor(x)).numpy()


# -- 1. integer constant folding ----------------------------------------------------------------


def _int_chain(dtype="int32"):
    g = Graph()
    one = g.add_leaf("const", TensorType((1, 1), dtype), (np.ones((1, 1), dtype), None), key="a")
    big = g.add_leaf("const", TensorType((1, 1), dtype), (np.full((1, 1), 2**20, dtype), None), key="b")
    factor = g.add_leaf("const", TensorType((1, 1), dtype), (np.full((1, 1), 2**12, dtype), None), key="c")
    mm = g.add("matmul", [(one, 0), (big, 0)], {})
    mul = g.add("multiply", [(mm, 0), (factor, 0)], {})
    g.outputs = [(mul, 0)]
    return g


def test_integer_constants_fold_in_their_dtype_with_wraparound():
    g = _int_chain()
    assert fold_constants(g) == 2
    (value,) = [n.payload[0] for n in g.nodes.values() if n.op == "const"]
    # 2^20 * 2^12 = 2^32 wraps to 0 in int32, as the compiled kernel computes; float64 then a
    # cast gave INT_MIN
    assert value.dtype == np.int32 and value.tolist() == [[0]]
    bb = relax.BlockBuilder()
    with bb.function("main", []):
        one = relax.const(np.ones((1, 1), "int32"))
        big = relax.const(np.full((1, 1), 2**20, "int32"))
        factor = relax.const(np.full((1, 1), 2**12, "int32"))
        with bb.dataflow():
            o = bb.emit_output(relax.op.multiply(bb.emit(relax.op.matmul(one, big)), factor))
        bb.emit_func_output(o)
    vm = relax.VirtualMachine(tvm.compile(bb.get(), "llvm"), tvm.cpu())
    assert vm["main"]().numpy().tolist() == value.tolist()


def test_integer_ops_without_wraparound_semantics_stay_unfolded_and_floats_fold_as_before():
    g = Graph()
    a = g.add_leaf("const", TensorType((2,), "int32"), (np.array([7, -7], "int32"), None), key="a")
    b = g.add_leaf("const", TensorType((2,), "int32"), (np.array([2, 2], "int32"), None), key="b")
    g.outputs = [(g.add("divide", [(a, 0), (b, 0)], {}), 0)]
    assert fold_constants(g) == 0  # integer division: left to the runtime
    f = Graph()
    x = f.add_leaf("const", TensorType((2,), "float32"), (np.array([1.5, 2.5], "float32"), None), key="x")
    f.outputs = [(f.add("multiply", [(x, 0), (x, 0)], {}), 0)]
    assert fold_constants(f) == 1
    (value,) = [n.payload[0] for n in f.nodes.values() if n.op == "const"]
    assert value.dtype == np.float32 and value.tolist() == [2.25, 6.25]


# -- 2. user rules are proved or checked before the search uses them ----------------------------

DROP_RELU = "drop-relu [hand, proved]: (relu ?x) => ?x\n"
DOUBLE_RELU = "double-relu [hand, unverified]: (relu (relu ?x)) => (relu ?x)\n"


def test_a_wrong_user_rule_labelled_proved_is_refused_with_its_counterexample(caplog):
    mod = _relu_module()
    rules = tvm_taso.parse_rules(DROP_RELU, "mine.rules")
    with caplog.at_level(logging.WARNING, logger="tvm_taso"):
        new, report = tvm_taso.optimize(mod, rules=rules, target="cuda")
    assert report["applied"] == {} and new.same_as(mod)
    (refusal,) = report["rules_refused"]
    assert refusal["name"] == "drop-relu" and refusal["where"] == "mine.rules:1"
    assert "differs by" in refusal["reason"] and "t.x" in refusal["reason"]
    assert any("refused rule drop-relu (mine.rules:1)" in r.getMessage() and "differs by" in r.getMessage()
               for r in caplog.records)


def test_load_rules_checks_each_rule_and_says_what_was_established(tmp_path, caplog):
    path = tmp_path / "mine.rules"
    path.write_text(DROP_RELU + DOUBLE_RELU)
    as_written = tvm_taso.load_rules(path)
    assert [(r.name, r.proof, r.established) for r in as_written] == [
        ("drop-relu", "proved", ""), ("double-relu", "unverified", "")]
    with caplog.at_level(logging.WARNING, logger="tvm_taso"):
        checked = tvm_taso.load_rules(path, check=True)
    assert [r.name for r in checked] == ["double-relu"]  # drop-relu refused, the rest used
    assert checked[0].proof in ("checked", "proved") and checked[0].established == checked[0].proof
    assert any("drop-relu" in r.getMessage() for r in caplog.records if r.levelno == logging.WARNING)
    # the search uses what passed
    new, report = tvm_taso.optimize(_relu_module(double=True), rules=checked, target="cuda")
    assert report["applied"] == {"double-relu": 1} and report["rules_refused"] == []


def test_trusted_rules_are_used_unchecked_and_the_log_says_so(tmp_path, caplog):
    path = tmp_path / "mine.rules"
    path.write_text(DROP_RELU)
    with caplog.at_level(logging.WARNING, logger="tvm_taso"):
        rules = tvm_taso.load_rules(path, trust=True)
    assert [(r.proof, r.established) for r in rules] == [("unverified", "trusted")]
    assert any("unchecked" in r.getMessage() and "drop-relu" in r.getMessage() for r in caplog.records)
    mod = _relu_module()
    new, report = tvm_taso.optimize(mod, rules=rules, target="cuda")
    assert report["applied"] == {"drop-relu": 1}  # the user asked for it


def test_apply_rules_refuses_a_wrong_rule_object():
    wrong = tvm_taso.parse_rules(DROP_RELU)
    apply = ApplyRules(wrong)
    mod = _relu_module()
    assert apply(mod).same_as(mod) and apply.last_applied == {}


def test_rule_checks_are_fast_and_cached():
    import time

    rules = tvm_taso.parse_rules(
        "t-prod [hand, checked]: (matmul (permute_dims ?a :axes [1 0]) (permute_dims ?b :axes [1 0]))\n"
        "    => (permute_dims (matmul ?b ?a) :axes [1 0]) if (= (rank ?a) 2), (= (rank ?b) 2)\n"
        "relu-concat-x [hand, checked]: (relu (concat ?a ?b :axis ?k)) => (concat (relu ?a) (relu ?b) :axis ?k)\n"
    )
    t0 = time.perf_counter()
    first = admission.admit(rules)
    assert time.perf_counter() - t0 < 2 * admission.SAMPLE_SECONDS + 1
    assert [r.proof in ("checked", "proved") for r in first] == [True, True]
    t0 = time.perf_counter()
    admission.admit(tvm_taso.parse_rules(rules[0].text))
    assert time.perf_counter() - t0 < 0.05  # judged once per rule text


# -- 3. BYOC and lowered functions are not ours ------------------------------------------------


@pytest.mark.parametrize("attr, value", [("Primitive", True), ("Composite", "dnnl.matmul"), ("Codegen", "dnnl")])
def test_optimize_leaves_byoc_functions_alone(attr, value):
    mod = examples.parallel_matmuls()
    base, report = tvm_taso.optimize(mod, target="cuda")
    assert report["applied"]  # the plain function is rewritten...
    marked = tvm.IRModule({"main": mod["main"].with_attr(attr, value)})
    new, report = tvm_taso.optimize(marked, target="cuda")
    assert new.same_as(marked) and report["applied"] == {}  # ...the marked one is not


# -- 4. a change must pay ------------------------------------------------------------------------


class _RoundingCost(AnalyticCost):
    """The original graph costs 8.10084, any other 8.100839999999998: a "gain" of rounding."""

    def __init__(self, original):
        super().__init__("cuda")
        self.original = original

    def cost(self, g):
        return 8.10084 if g.structural_hash() in self.original else 8.100839999999998


def _selu_like():
    bb = relax.BlockBuilder()
    x = relax.Var("x", relax.TensorType((2, 3), "float32"))
    with bb.function("main", [x]):
        with bb.dataflow():
            a = bb.emit(relax.op.multiply(x, relax.const(1.0507, "float32")))
            e = bb.emit(relax.op.exp(x))
            b = bb.emit(relax.op.multiply(relax.const(1.7581, "float32"), e))
            c = bb.emit(relax.op.add(b, a))
            o = bb.emit_output(relax.op.add(relax.const(-1.7581, "float32"), c))
        bb.emit_func_output(o)
    return bb.get()


def test_rounding_is_not_a_gain_and_the_module_stays_untouched():
    from tvm_taso.ir.relax_bridge import block_graphs
    from tvm_taso.search.regions import extract, regions

    mod = _selu_like()
    (g,) = block_graphs(mod)
    original = {g.structural_hash()} | {extract(g, ids).sub.structural_hash() for ids in regions(g, 32)}
    swap = tvm_taso.parse_rules("swap-add [hand, checked]: (add ?x ?y) => (add ?y ?x)\n"
                                "swap-mul [hand, checked]: (multiply ?x ?y) => (multiply ?y ?x)")
    new, report = tvm_taso.optimize(mod, rules=swap, cost_model=_RoundingCost(original), target="cuda")
    assert new.same_as(mod)
    assert report["applied"] == {} and report["rewrites"] == []
    assert report["cost_after"] == report["cost_before"]
    with pytest.raises(ValueError, match="min_gain"):
        tvm_taso.optimize(mod, min_gain=1.5)


def test_selu_on_cuda_is_returned_unchanged_with_nothing_applied():
    """SELU's arithmetic has nothing that pays on cuda: the module itself comes back, and the
    report says nothing was applied at an unchanged cost."""
    mod = _selu_like()
    new, report = tvm_taso.optimize(mod, target="cuda")
    assert report["applied"] == {} and report["rewrites"] == []
    assert report["cost_after"] == report["cost_before"]
    assert new.same_as(mod)


# -- 5. strict JSON ------------------------------------------------------------------------------


class _BrokenCost(AnalyticCost):
    def kernel_cost(self, kernel):
        return math.inf  # every kernel "failed to build"


def test_report_is_strict_json_when_costs_are_infinite():
    mod = examples.parallel_matmuls()
    new, report = tvm_taso.optimize(mod, cost_model=_BrokenCost("cuda"), target="cuda")
    text = json.dumps(report, allow_nan=False)
    assert report["cost_before"] is None and report["cost_after"] is None
    assert any(n.startswith("cost_before was inf") for n in report["notes"])
    assert json.loads(text)["cost_before"] is None


# -- 6. options and targets ----------------------------------------------------------------------


@pytest.mark.parametrize("option, value", [
    ("alpha", 0.5), ("alpha", math.inf), ("alpha", math.nan), ("alpha", "1.05"),
    ("budget", 0), ("budget", 2.5), ("budget", True),
    ("time_limit", -1), ("time_limit", math.nan),
    ("region_size", 0), ("region_size", 1), ("region_size", 4.0),
    ("min_gain", -0.1),
])
def test_options_out_of_range_are_one_clear_value_error(option, value):
    mod = examples.parallel_matmuls()
    with pytest.raises(ValueError, match=f"^{option} must be") as err:
        tvm_taso.optimize(mod, **{option: value})
    assert "\n" not in str(err.value)
    with pytest.raises(ValueError, match=f"^{option} must be"):
        TasoOptimize(**{option: value})  # at construction, not inside a pipeline


@pytest.mark.parametrize("target", ["cdua", {"kind": "nonsense"}, 42])
def test_unknown_targets_are_refused_with_what_is_accepted(target):
    mod = examples.parallel_matmuls()
    with pytest.raises(TargetError, match="expected a target kind") as err:
        tvm_taso.optimize(mod, target=target)
    assert "\n" not in str(err.value) and "llvm" in str(err.value)
    with pytest.raises(TargetError):
        TasoOptimize(target=target)


def test_a_cpu_target_that_names_no_cpu_is_for_this_machines_cpu():
    """TVM's bare llvm builds for a generic x86-64; tvm-taso's llvm is this machine's CPU, as a
    user's deployment on this machine would want. What names a CPU, another triple, or comes as a
    tvm.target.Target is taken as given."""
    from tvm.target import codegen

    from tvm_taso import target as targets

    cpu = codegen.llvm_get_system_cpu()
    if cpu == "generic":
        pytest.skip("LLVM does not know this machine's CPU")
    for spelling in ("llvm", {"kind": "llvm", "num-cores": 2}, '{"kind": "llvm"}', None):
        assert targets.parse(spelling).attrs["mcpu"] == cpu, spelling
    assert targets.parse({"kind": "llvm", "mcpu": "x86-64"}).attrs["mcpu"] == "x86-64"
    assert "mcpu" not in targets.parse({"kind": "llvm", "mtriple": "aarch64-linux-gnu"}).attrs
    assert "mcpu" not in targets.parse(tvm.target.Target("llvm")).attrs
    assert targets.with_cores("llvm").attrs["mcpu"] == cpu
    assert f'"mcpu":"{cpu}"' in targets.canonical("llvm")  # measurements are keyed by what was built


@pytest.mark.parametrize("search", ["backtrack", "eqsat"])
def test_optimize_leaves_the_module_it_is_given_as_it_was(search):
    """The report's kernel count builds the result up to fusion; its first pass (reshapes of
    constants folded) assigned into the module it was given, so a user's module changed under
    them, and a second optimize of it searched another graph."""
    mod = examples.EXAMPLES["llama"]()
    given = tvm_ffi.structural_hash(mod)
    first = tvm_taso.optimize(mod, target="cuda", search=search)[1]["cost_after"]
    assert tvm_ffi.structural_hash(mod) == given
    assert tvm_taso.optimize(mod, target="cuda", search=search)[1]["cost_after"] == first


def test_infinite_time_limit_means_no_limit():
    new, report = tvm_taso.optimize(examples.parallel_matmuls(), target="cuda", time_limit=math.inf)
    assert report["applied"] and report["regions_cut_short"] == 0
    json.dumps(report, allow_nan=False)


# -- 7. rule files ---------------------------------------------------------------------------------

LOCATED = r"bad\.rules:\d+:\d+: "


@pytest.mark.parametrize("content", [
    bytes(range(256)) * 4,  # binary
    b"r [hand, checked]: (relu ?x) => ?x\x00\x01\x02\n",
    ("r [hand, checked]: " + "(relu " * 5000 + "?x" + ")" * 5000 + " => ?x\n").encode(),  # deep nesting
    "r [hand, checked]: (get (split ?x :indices_or_sections 2 :axis 0) \u00b2) => ?x\n".encode(),  # a superscript two
    "r [hand, checked]: (permute_dims ?x :axes [\u0661 \u0660]) => ?x\n".encode(),  # Arabic-Indic digits
    "r\u00e9gle [hand, checked]: (relu ?x) => ?x\n".encode(),
    "r [hand, checked]: (relu ?x) => ?y\n".encode(),
])
def test_every_rule_file_error_is_a_rule_syntax_error_with_file_line_col(tmp_path, content):
    path = tmp_path / "bad.rules"
    path.write_bytes(content)
    with pytest.raises(tvm_taso.RuleSyntaxError, match=LOCATED):
        tvm_taso.load_rules(path)


def test_mangled_rules_raise_only_located_rule_syntax_errors():
    text = ("merge [hand, checked]: (matmul ?x ?a), (matmul ?x ?b)\n"
            "    => (split (matmul ?x (concat ?a ?b :axis 1)) :indices [(dim ?a 1)] :axis -1) if (= (rank ?a) 2)\n")
    rng = random.Random(0)
    alphabet = list("()[]:,?=>#-0123456789 \n\t\u00b2\u0661\u00e9x") + ["=>", "if", "(get", "(dim"]
    raised = 0
    for _ in range(400):
        chars = list(text)
        for _ in range(rng.randint(1, 4)):
            k = rng.randrange(len(chars))
            if rng.random() < 0.5:
                chars[k] = rng.choice(alphabet)
            else:
                del chars[k]
        try:
            tvm_taso.parse_rules("".join(chars), "bad.rules")
        except tvm_taso.RuleSyntaxError as err:
            assert __import__("re").match(LOCATED, str(err)), str(err)
            raised += 1
    assert raised >= 200  # most manglings break the rule, each with a located error


def test_a_condition_that_can_never_hold_is_named_at_load(tmp_path, caplog):
    path = tmp_path / "mine.rules"
    path.write_text("never [hand, checked]: (relu ?x) => ?x if (= 1 2)\n")
    with caplog.at_level(logging.WARNING, logger="tvm_taso"):
        tvm_taso.load_rules(path)
    assert any("never" in r.getMessage() and "always false" in r.getMessage() for r in caplog.records)
    contradictory = tvm_taso.parse_rules(
        "contra [hand, proved]: (permute_dims ?x :axes ?p) => ?x if (= (rank ?x) 2), (= (rank ?x) 3)")
    refused = []
    assert admission.admit(contradictory, refused=refused) == []
    assert "never hold" in refused[0].reason or "never held" in refused[0].reason  # Z3, else random instances


def test_a_rule_whose_target_changes_the_type_is_refused_by_name(caplog):
    retype = tvm_taso.parse_rules("retype [hand, proved]: (relu ?x) => (concat (relu ?x) (relu ?x) :axis 0)",
                                  "mine.rules")
    refused = []
    with caplog.at_level(logging.WARNING, logger="tvm_taso"):
        assert admission.admit(retype, refused=refused) == []
    assert refused[0].name == "retype" and "never has the type" in refused[0].reason
    assert any("retype" in r.getMessage() for r in caplog.records)


def test_source_attribute_reading_a_later_tensor_matches_correctly():
    (rule,) = tvm_taso.parse_rules(
        "late [hand, checked]: (add (permute_dims ?x :axes (last-two-swapped (rank ?y))) ?y)\n"
        "    => (add ?y (permute_dims ?x :axes (last-two-swapped (rank ?y))))")
    g = Graph()
    x = g.add_leaf("input", TensorType((3, 2), "float32"), None, key="x")
    y = g.add_leaf("input", TensorType((2, 3), "float32"), None, key="y")
    z = g.add_leaf("input", TensorType((1, 3, 2), "float32"), None, key="z")
    t = g.add("permute_dims", [(x, 0)], {"axes": (1, 0)})
    u = g.add("permute_dims", [(z, 0)], {"axes": (0, 2, 1)})
    a1 = g.add("add", [(t, 0), (y, 0)], {})
    a2 = g.add("add", [(u, 0), (y, 0)], {})  # axes [0 2 1]: not last-two-swapped of rank 2
    g.outputs = [(a1, 0), (a2, 0)]
    sites = list(find_matches(g, rule))  # raised KeyError
    assert [m.roots for m in sites] == [(a1,)]
    bb = relax.BlockBuilder()
    xv = relax.Var("x", relax.TensorType((3, 2), "float32"))
    yv = relax.Var("y", relax.TensorType((2, 3), "float32"))
    with bb.function("main", [xv, yv]):
        with bb.dataflow():
            o = bb.emit_output(relax.op.add(bb.emit(relax.op.permute_dims(xv, [1, 0])), yv))
        bb.emit_func_output(o)
    assert len(dpl.sites(bb.get()["main"], rule)) == 1


# -- 8. measurements -------------------------------------------------------------------------------


def _record(median, key="k1"):
    return Record(key=key, target="llvm", kernel={}, status="ok", median_us=median, samples_us=[])


def test_measurement_database_refuses_nan_negative_and_zero_medians(tmp_path, caplog):
    path = tmp_path / "measurements.jsonl"
    lines = [json.dumps(_record(m, f"k{i}").to_json()) for i, m in enumerate([float("nan"), -3.0, 0.0, 12.5])]
    path.write_text("\n".join(lines) + "\n")
    db = MeasurementDB(path)
    with caplog.at_level(logging.WARNING):
        records = db.records()
    assert [(r.key, r.median_us) for r in records] == [("k3", 12.5)]
    warned = [r.getMessage() for r in caplog.records if r.levelno == logging.WARNING]
    assert len(warned) == 3 and all("measurements.jsonl:" in w and "not a positive, finite time" in w for w in warned)
    caplog.clear()
    with caplog.at_level(logging.WARNING):
        db.add(_record(float("inf"), "k9"))
    assert db.get("k9", "llvm") is None
    assert any("k9" in r.getMessage() for r in caplog.records)


# -- 9. a search cut short says so ---------------------------------------------------------------


def test_a_search_cut_short_says_so_in_one_warning(caplog):
    with caplog.at_level(logging.WARNING, logger="tvm_taso"):
        _, report = tvm_taso.optimize(examples.inception_block(), target="cuda", time_limit=0)
    assert report["regions_cut_short"] >= 1
    (line,) = [r.getMessage() for r in caplog.records if "cut the search short" in r.getMessage()]
    assert f"in {report['regions_cut_short']} region(s)" in line and "differ from run to run" in line
