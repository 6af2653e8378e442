"""The compiled attribute expressions (:func:`tvm_taso.rewrite.semantics.evaluate_attr`) compute
what the rule language defines: the same value, or the same kind of failure, as a direct
reading of the expression, for every condition and target attribute of the shipped library on
random bindings (ranks, sizes, attribute values, symbolic sizes)."""

from __future__ import annotations

import dataclasses

import numpy as np
import pytest

import tvm_taso
from tvm_taso.ir import dims
from tvm_taso.ir.ops import OpError, TensorType
from tvm_taso.rewrite.rule import FUNCTIONS, TENSOR_FUNCTIONS, Call, Get, Op, Scalar, Tup, Var
from tvm_taso.rewrite.semantics import EVALUATION_ERRORS, conditions_hold, evaluate_attr

RULES = tvm_taso.default_rules(include_unverified=True)


def read(x, env, values):
    """The rule language's meaning of an attribute expression, read off its syntax tree."""
    if isinstance(x, Var):
        if "@" + x.name in env:
            return env["@" + x.name]
        raise KeyError(x.name)
    if isinstance(x, Tup):
        return tuple(read(i, env, values) for i in x.items)
    if isinstance(x, Call):
        if x.fn in TENSOR_FUNCTIONS:
            ref = env[x.args[0].name]
            if x.fn == "const?":
                return values.is_constant(ref)
            shape = values.type_of(ref).shape
            if x.fn == "rank":
                return len(shape)
            if x.fn == "shape":
                return shape
            k = read(x.args[1], env, values)
            if not -len(shape) <= k < len(shape):
                raise OpError(f"dim {k} of rank {len(shape)}")
            return shape[k]
        return FUNCTIONS[x.fn](*(read(a, env, values) for a in x.args))
    return x


class Values:
    def __init__(self, types: dict, constants: set):
        self.types, self.constants = types, constants

    def type_of(self, ref):
        return self.types[ref]

    def is_constant(self, ref) -> bool:
        return ref in self.constants


def _expressions(rule):
    yield from rule.conds

    def walk(p):
        if isinstance(p, Op):
            for _, v in p.attrs:
                yield v
            for a in p.args:
                yield from walk(a)
        elif isinstance(p, Get):
            yield from walk(p.expr)
        elif isinstance(p, Scalar):
            yield p.value

    for p in rule.src + rule.dst:
        yield from walk(p)


def _names(x, tensors: set, attributes: set):
    if isinstance(x, Var):
        attributes.add(x.name)
    elif isinstance(x, Tup):
        for i in x.items:
            _names(i, tensors, attributes)
    elif isinstance(x, Call):
        args = x.args
        if x.fn in TENSOR_FUNCTIONS:
            tensors.add(args[0].name)
            args = args[1:]
        for a in args:
            _names(a, tensors, attributes)


def _outcome(fn):
    try:
        return ("value", fn())
    except EVALUATION_ERRORS as err:
        return ("error", type(err).__name__, str(err))


@pytest.mark.parametrize("seed", range(3))
def test_compiled_expressions_compute_what_the_rule_language_defines(seed):
    rng = np.random.default_rng(seed)
    n_sym = dims.symbol("n")
    compared = failed = 0
    for rule in RULES:
        for x in _expressions(rule):
            tensors, attributes = set(), set()
            _names(x, tensors, attributes)
            for _ in range(6):
                types, env = {}, {}
                for k, name in enumerate(sorted(tensors)):
                    shape = tuple(int(rng.integers(1, 4)) for _ in range(int(rng.integers(0, 5))))
                    if shape and rng.random() < 0.2:
                        shape = (n_sym,) + shape[1:]
                    types[k] = TensorType(shape, "float32")
                    env[name] = k
                for name in sorted(attributes):
                    pick = rng.integers(0, 4)
                    env["@" + name] = (int(rng.integers(-2, 5)) if pick < 2 else
                                       tuple(int(v) for v in rng.integers(0, 4, size=int(rng.integers(0, 4)))) if pick == 2
                                       else None)
                values = Values(types, {k for k in types if rng.random() < 0.5})
                expected = _outcome(lambda: read(x, env, values))
                assert _outcome(lambda: evaluate_attr(x, env, values)) == expected, (rule.name, x, env)
                compared += 1
                failed += expected[0] == "error"
    assert compared > 1000 and 0 < failed < compared  # values and failures both compared


def test_an_unbound_variable_and_a_dim_past_the_rank_fail_as_the_language_says():
    values = Values({0: TensorType((2, 3), "float32")}, set())
    with pytest.raises(KeyError, match="k"):
        evaluate_attr(Call("+", (Var("k"), 1)), {}, values)
    with pytest.raises(OpError, match="dim 2 of rank 2"):
        evaluate_attr(Call("dim", (Var("x"), 2)), {"x": 0}, values)
    # `and` evaluates every operand: a failing one fails the condition even after a false one
    rule = next(r for r in RULES if r.conds)
    cond = Call("and", (Call("=", (1, 2)), Call("dim", (Var("x"), 5))))
    assert not conditions_hold(dataclasses.replace(rule, conds=(cond,)), {"x": 0}, values)
    with pytest.raises(OpError):
        evaluate_attr(cond, {"x": 0}, values)
    assert evaluate_attr(Call("dim", (Var("x"), -1)), {"x": 0}, values) == 3
