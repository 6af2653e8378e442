"""
Write and verify your own rule
==============================

tvm-taso's substitutions are data: one line of text per rule (``rules/README.md`` has the
language). This tutorial writes a rule, checks it numerically on a model where it applies, and
lets the search use it next to the shipped library.
"""

import sys

from tvm import relax

import tvm_taso
from tvm_taso import examples
from tvm_taso.numerics import relative_error
from tvm_taso.rewrite.rulecheck import check_rule
from tvm_taso.runtime import inputs_for, run

SMALL = "--small" in sys.argv

######################################################################
# The rule
# --------
# A product of two transposed matrices is the transpose of the product the other way round:
# ``A^T B^T = (B A)^T``. Two transpose kernels become one. A rule is a line: a name, its
# provenance and proof status, the source pattern, ``=>``, the target, and conditions.

RULE = """
transpose-product [hand, checked]: (matmul (permute_dims ?a :axes [1 0]) (permute_dims ?b :axes [1 0]))
    => (permute_dims (matmul ?b ?a) :axes [1 0])
    if (= (rank ?a) 2), (= (rank ?b) 2)
"""
rules = tvm_taso.parse_rules(RULE, "<tutorial>")
print(f"parsed {rules[0].name}: source roots {rules[0].root_ops}")

######################################################################
# A model where it applies
# ------------------------

m, k, n = (16, 8, 12) if SMALL else (256, 128, 192)


def body(b, x, y):
    xt = b.emit(relax.op.permute_dims(x, [1, 0]))
    yt = b.emit(relax.op.permute_dims(y, [1, 0]))
    return b.emit(relax.op.nn.relu(relax.op.matmul(xt, yt)))


mod = examples._module({"x": (k, m), "y": (n, k)}, body)

######################################################################
# Check it numerically
# --------------------
# ``check_rule`` finds every site of the rule in the model, applies it there, and compares the
# rewritten graph with the original on random inputs using tvm-taso's numpy reference semantics.

results = check_rule(rules[0], mod, trials=3)
for r in results:
    print(f"site {r['site']}: max relative error {r['max_relative_error']:.2e}")
assert results and all(r["ok"] for r in results)

######################################################################
# A wrong rule is caught the same way: dropping the outer transpose gives the wrong layout
# (here the shapes even differ, so the engine refuses to apply it at all).

wrong = tvm_taso.parse_rules(
    "wrong [hand, unverified]: (matmul (permute_dims ?a :axes [1 0]) (permute_dims ?b :axes [1 0])) => (matmul ?a ?b)"
)[0]
print("wrong rule:", check_rule(wrong, mod) or "never applies (types differ)")

######################################################################
# Use it in the search
# --------------------
# Here the search gets only this rule, so the report shows it at work; in practice pass it
# together with the shipped library: ``rules=tvm_taso.default_rules() + rules`` (the generated
# library already holds an equivalent transpose rule).

new, report = tvm_taso.optimize(mod, target="cuda", rules=rules)
print("applied:", report["applied"])
assert report["applied"].get("transpose-product") == 1
inputs = inputs_for(mod)
err = relative_error(run(mod, inputs), run(new, inputs))
print(f"optimized model on llvm: max relative error {err:.2e}")
assert err <= 1e-4
