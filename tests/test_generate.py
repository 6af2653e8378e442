"""The rule generator (tvm_taso/generate.py) and the library it wrote (rules/generated.rules):
fingerprints pair known equivalent graphs, generation is deterministic, and every generated
rule rewrites an instance of its source into a graph that computes the same values."""

from __future__ import annotations

import importlib.resources

import pytest

import tvm_taso
from tvm_taso import generate as gen
from tvm_taso.rule import parse_rules


def _mat():
    return {d.name: d for d in gen._domains(False)}["mat"]


def _fingerprints(groups, max_ops=3):
    """graph_canon -> fingerprint key, for every graph the enumeration records."""
    e = gen.Enumerator(_mat(), gen.EnumConfig(max_ops=max_ops, groups=groups))
    out = {}
    for key, ops_, outs, hs, _ in e.run():
        out[gen.graph_canon(gen.Gr("mat", ops_, outs, hs))] = key
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
    return gen.GenConfig(**cfg)


def test_tiny_generation_finds_merges_and_is_deterministic():
    first = gen.generate(_tiny())
    text = gen.render(first)
    assert text == gen.render(gen.generate(_tiny()))
    assert text == gen.render(gen.generate(_tiny(workers=2)))  # the same with a process pool
    assert {"merge-matmul", "matmul-concat", "concat-split"} <= set(first.families)
    rules = parse_rules(text)
    assert rules and all(r.provenance == "generated" and r.proof == "checked" for r in rules)
    for key in ("candidate pairs (equal fingerprints)", "after common-subgraph pruning", "rules written"):
        assert key in first.stats


def test_cli_writes_a_rule_file(tmp_path, capsys):
    out = tmp_path / "g.rules"
    assert gen.main(["generate", "--max-ops", "2", "--ops", "matmul,transpose,scalar", "--workers", "1",
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


GENERATED = _shipped() if (importlib.resources.files("tvm_taso.rules") / "generated.rules").is_file() else []


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
        G, feeds = gen.rule_instance(rule, seed=i)
        ok, why = gen.engine_check(rule, G, feeds)
        if not ok:
            bad.append(f"{rule.name}: {why}")
    assert not bad, bad
