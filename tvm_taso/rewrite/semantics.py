"""What the rule language means, whichever matcher reads it: a node's attributes matched against
an op pattern's (:func:`match_attributes`), the value of an attribute expression under a match's
bindings (:func:`evaluate_attr`), and whether a rule's conditions hold at a site
(:func:`conditions_hold`).

Three matchers find sites of the same rules: :mod:`tvm_taso.rewrite.match` in a graph,
:mod:`tvm_taso.search.eqsat.ematch` in an e-graph and :mod:`tvm_taso.rewrite.dpl` in a Relax function.
Each binds tensor variables to refs of the values it matched (attribute variables to values,
under ``"@"`` + their name) and answers what conditions ask of a bound tensor through
:class:`~tvm_taso.ir.graph.Values`, so that a rule means the same to all three.

``why`` is None in the search; a list when someone asks why a rule does not match, and then the
first failing check appends its reason (the messages are only built in that case).
"""

from __future__ import annotations

from tvm_taso.ir import ops
from tvm_taso.ir.graph import Values
from tvm_taso.ir.ops import OpError
from tvm_taso.rewrite.rule import FUNCTIONS, TENSOR_FUNCTIONS, Call, Op, Rule, Tup, Var, show, show_value

# What evaluating an attribute expression may raise on a site it does not fit (a dim past the
# rank, a target op rejecting its operands...): the site is then no site.
EVALUATION_ERRORS = (OpError, KeyError, IndexError, TypeError, ValueError, ZeroDivisionError)


def fail(why: list, reason: str) -> None:
    """Record why a check failed; None, the failed match."""
    why.append(reason)
    return None


def same_value(a, b) -> bool:
    """Whether two attribute values are equal (floats to 1e-12, sequences item by item)."""
    if isinstance(a, float) or isinstance(b, float):
        try:
            return abs(float(a) - float(b)) <= 1e-12 * max(1.0, abs(float(a)))
        except (TypeError, ValueError):
            return False
    if isinstance(a, (tuple, list)) and isinstance(b, (tuple, list)):
        return len(a) == len(b) and all(same_value(x, y) for x, y in zip(a, b))
    return a == b


def match_attributes(pat: Op, attrs: dict, env: dict, why: list | None = None) -> dict | None:
    """``env`` extended by matching a node's attributes against ``pat``'s: attribute patterns
    for the attributes it names, the op's defaults for the others; None if they do not match."""
    given = dict(pat.attrs)
    defaults = ops.OPS[pat.op].defaults
    for name, value in attrs.items():
        if name in given:
            env = _match_attr(given[name], value, env, why)
            if env is None:
                if why is not None:
                    why[-1] = f"{pat.op} attribute {name} {why[-1]}"
                return None
        elif name in defaults and not same_value(defaults[name], value):
            return None if why is None else fail(why, f"{pat.op} attribute {name} is {show_value(value)}, not the default {show_value(defaults[name])}")
    return env


def computes(x) -> bool:
    """Whether an attribute pattern evaluates a function (its value depends on the bindings)."""
    return isinstance(x, Call) or (isinstance(x, Tup) and any(computes(i) for i in x.items))


def merged(env: dict, more: dict) -> dict | None:
    """``env`` with the bindings of ``more``, or None where they disagree."""
    out = None
    for name, value in more.items():
        if name in env:
            if not same_value(env[name], value):
                return None
        else:
            if out is None:
                out = dict(env)
            out[name] = value
    return env if out is None else out


# id of an op pattern -> (the pattern, whether its attributes compute, {a node's attribute pairs:
# their bindings or None}); the pattern is held so that its id is not reused
_ATTRIBUTE_MEMO: dict[int, tuple[Op, bool, dict]] = {}
_MEMO_LIMIT = 1 << 16  # patterns remembered (a long process parsing many rule sets starts again)
_UNSEEN = object()


def attributes_matched(pat: Op, attrs: tuple, env: dict) -> dict | None:
    """:func:`match_attributes` for a node's sorted attribute pairs ``attrs``, in the search (no
    reasons): memoized per pattern and attributes when the pattern's attributes compute nothing
    (what they bind is then merged with ``env``)."""
    entry = _ATTRIBUTE_MEMO.get(id(pat))
    if entry is None or entry[0] is not pat:
        if len(_ATTRIBUTE_MEMO) >= _MEMO_LIMIT:
            _ATTRIBUTE_MEMO.clear()
        entry = _ATTRIBUTE_MEMO[id(pat)] = (pat, any(computes(v) for _, v in pat.attrs), {})
    if entry[1]:
        return match_attributes(pat, dict(attrs), env)
    try:
        bound = entry[2].get(attrs, _UNSEEN)
    except TypeError:  # an attribute value that does not hash
        return match_attributes(pat, dict(attrs), env)
    if bound is _UNSEEN:
        bound = entry[2][attrs] = match_attributes(pat, dict(attrs), {})
    return None if bound is None else merged(env, bound)


def _match_attr(pat, value, env: dict, why: list | None = None) -> dict | None:
    if isinstance(pat, Var):
        key = "@" + pat.name
        if key in env:
            if same_value(env[key], value):
                return env
            return None if why is None else fail(why, f"is {show_value(value)}, but ?{pat.name} is already {show_value(env[key])}")
        env = dict(env)
        env[key] = value
        return env
    if isinstance(pat, Tup):
        if not isinstance(value, tuple) or len(value) != len(pat.items):
            return None if why is None else fail(why, f"is {show_value(value)}, not {len(pat.items)} values {show(pat)}")
        for i, (p, v) in enumerate(zip(pat.items, value)):
            env = _match_attr(p, v, env, why)
            if env is None:
                if why is not None:
                    why[-1] = f"is {show_value(value)}: item {i} {why[-1]}"
                return None
        return env
    if isinstance(pat, Call):  # the parser lifts these into conditions; a rule built in code may not
        if same_value(evaluate_attr(pat, env, None), value):
            return env
        return None if why is None else fail(why, f"is {show_value(value)}, not {show(pat)}")
    if same_value(pat, value):
        return env
    return None if why is None else fail(why, f"is {show_value(value)}, not {show(pat)}")


def conditions_hold(rule: Rule, env: dict, values: Values, why: list | None = None) -> bool:
    """Whether every condition of ``rule`` holds under the bindings ``env`` of a site, its
    tensors read through ``values``."""
    for cond in rule.conds:
        try:
            ok = evaluate_attr(cond, env, values)
        except EVALUATION_ERRORS as err:
            if why is not None:
                why.append(f"condition {show(cond)} cannot be evaluated: {type(err).__name__} {err}")
            return False
        if not ok:
            if why is not None:
                why.append(f"condition {show(cond)} is false")
            return False
    return True


def evaluate_attr(x, env: dict, values: Values | None):
    """Value of an attribute expression under the bindings of a match, the tensors it reads
    (``dim``, ``rank``, ``shape``, ``const?``) read through ``values``. An expression is
    compiled to nested closures once (:func:`_compiled`): conditions and target attributes are
    evaluated at every site every search checks."""
    if not isinstance(x, (Var, Tup, Call)):
        return x
    entry = _COMPILED.get(id(x))
    if entry is None or entry[0] is not x:
        if len(_COMPILED) >= _MEMO_LIMIT:
            _COMPILED.clear()
        entry = _COMPILED[id(x)] = (x, _compiled(x))
    return entry[1](env, values)


# id of an expression -> (the expression, its closure); the expression is held so that its id is
# not reused
_COMPILED: dict[int, tuple[object, object]] = {}


def _compiled(x):
    """``x`` as a function of (bindings, values) computing what :func:`evaluate_attr` defines:
    the same value, or the same exception, the operands of a function all evaluated before it
    is applied (``and`` and ``or`` do not short-circuit)."""
    if isinstance(x, Var):
        key, name = "@" + x.name, x.name

        def variable(env, values):
            try:
                return env[key]
            except KeyError:
                raise KeyError(name) from None

        return variable
    if isinstance(x, Tup):
        items = tuple(_compiled(i) for i in x.items)
        return lambda env, values: tuple(f(env, values) for f in items)
    if isinstance(x, Call):
        if x.fn in TENSOR_FUNCTIONS:
            return _tensor_function(x)
        args = tuple(_compiled(a) for a in x.args)
        fn_name = x.fn
        if len(args) == 2:
            first, second = args

            def binary(env, values):
                return FUNCTIONS[fn_name](first(env, values), second(env, values))

            return binary
        return lambda env, values: FUNCTIONS[fn_name](*(f(env, values) for f in args))
    return lambda env, values: x


def _tensor_function(x: Call):
    """``(dim ?t k)``, ``(rank ?t)``, ``(shape ?t)`` or ``(const? ?t)`` compiled."""
    fn, tensor = x.fn, x.args[0].name
    if fn == "const?":
        return lambda env, values: values.is_constant(env[tensor])
    if fn == "rank":
        return lambda env, values: len(values.type_of(env[tensor]).shape)
    if fn == "shape":
        return lambda env, values: values.type_of(env[tensor]).shape
    index = _compiled(x.args[1])

    def dim(env, values):
        shape = values.type_of(env[tensor]).shape
        k = index(env, values)
        if not -len(shape) <= k < len(shape):
            raise OpError(f"dim {k} of rank {len(shape)}")
        return shape[k]

    return dim
