"""The rule language: parse rule files into :class:`Rule` objects, and write patterns back
(:func:`show`, for messages).

One rule per line (indented lines continue it)::

    NAME [PROVENANCE, PROOF]: SRC, SRC ... => DST, DST ... if COND, COND ...

Patterns are S-expressions over the op names of :mod:`tvm_taso.ir.ops`: ``(matmul ?x ?w)``,
``(conv2d ?x ?w :strides ?s :padding [?p ?p ?p ?p])``, ``(get (batch_norm ...) 0)``.
``?name`` is a tensor in operand position and an attribute value in attribute position.
Attribute expressions: literals, ``[a b ...]``, ``(dim ?t k)``, ``(rank ?t)``, ``(+ a b)`` and
the functions in :data:`FUNCTIONS`. The grammar and every function are documented in
``rules/README.md``.
"""

from __future__ import annotations

import copy
import functools
import importlib.resources
import logging
import math
import re
from dataclasses import dataclass, field
from pathlib import Path

from tvm_taso.files import InputFileError, read_regular_file
from tvm_taso.ir import dims, ops

log = logging.getLogger("tvm_taso")

PROVENANCES = ("hand", "generated")
MAX_DEPTH = 64  # nesting of parentheses and brackets a rule may have
PROOFS = ("proved", "checked", "unverified")


# A rule file of the shipped library is about 100 kB; 16 MiB holds hundreds of thousands of rules.
MAX_RULE_FILE_BYTES = 16 * 2**20


class RuleSyntaxError(ValueError):
    """A rule file that does not parse; the message names file, line and what was expected."""


# -- AST ------------------------------------------------------------------------------------


@dataclass(frozen=True)
class Var:
    name: str


@dataclass(frozen=True)
class Op:
    op: str
    args: tuple
    attrs: tuple  # (name, attribute expression) pairs


@dataclass(frozen=True)
class Get:
    expr: Op
    index: int


@dataclass(frozen=True)
class Scalar:
    """A rank-0 constant with the dtype of ``like``: ``(scalar VALUE ?like)``."""

    value: object
    like: Var


@dataclass(frozen=True)
class Call:
    """An attribute-level function application, e.g. ``(dim ?a 1)``."""

    fn: str
    args: tuple


@dataclass(frozen=True)
class Tup:
    items: tuple


# Rule.established values set outside admission: the shipped library, and rules trusted on request
SHIPPED = "shipped"
TRUSTED = "trusted"


@dataclass
class Rule:
    name: str
    provenance: str
    proof: str
    src: tuple  # root patterns
    dst: tuple  # target expressions, one per source output (multi-output ops count as many)
    conds: tuple = ()
    where: str = ""  # file:line
    text: str = field(default="", repr=False)
    # how the rule came to be trusted: "shipped" (the library), "proved" / "checked" (admitted by
    # tvm_taso.verify.admit), "trusted" (as written, on request); "" not yet: the search admits it
    established: str = field(default="", compare=False, repr=False)

    @property
    def root_ops(self) -> tuple[str, ...]:
        return tuple(_root_op(p).op for p in self.src)


def _root_op(p) -> Op:
    return p.expr if isinstance(p, Get) else p


def show(x) -> str:
    """A pattern, target or attribute expression written in the rule language."""
    if isinstance(x, Var):
        return "?" + x.name
    if isinstance(x, Tup):
        return "[" + " ".join(show(i) for i in x.items) + "]"
    if isinstance(x, Call):
        return "(" + " ".join([x.fn, *(show(a) for a in x.args)]) + ")"
    if isinstance(x, Get):
        return f"(get {show(x.expr)} {x.index})"
    if isinstance(x, Scalar):
        return f"(scalar {show(x.value)} {show(x.like)})"
    if isinstance(x, Op):
        parts = [x.op, *(show(a) for a in x.args), *(f":{n} {show(v)}" for n, v in x.attrs)]
        return "(" + " ".join(parts) + ")"
    return show_value(x)


def show_value(value) -> str:
    """An attribute value as the rule language writes it."""
    if isinstance(value, bool):
        return "true" if value else "false"
    if value is None:
        return "none"
    if isinstance(value, str):
        return f'"{value}"'
    if isinstance(value, (tuple, list)):
        return "[" + " ".join(show_value(v) for v in value) + "]"
    return str(value)


# -- attribute functions --------------------------------------------------------------------


def _compose(p, q):
    """Axes of permute_dims(permute_dims(x, p), q) as one permute_dims."""
    return tuple(p[i] for i in q)


def _inverse(p):
    inv = [0] * len(p)
    for i, a in enumerate(p):
        inv[a] = i
    return tuple(inv)


FUNCTIONS = {
    "+": lambda a, b: a + b,
    "-": lambda a, b: a - b,
    "*": lambda a, b: a * b,
    "//": lambda a, b: a // b,
    "=": dims.equal,  # with symbolic sizes: decided for every size, else Undecidable (false)
    "!=": dims.differ,
    "<": lambda a, b: a < b,
    "<=": lambda a, b: a <= b,
    ">": lambda a, b: a > b,
    ">=": lambda a, b: a >= b,
    "and": lambda *a: all(a),
    "or": lambda *a: any(a),
    "not": lambda a: not a,
    "compose": _compose,
    "inverse": _inverse,
    "identity?": lambda p: tuple(p) == tuple(range(len(p))),
    "last-two-swapped": lambda n: tuple(range(n - 2)) + (n - 1, n - 2),
    "prod": lambda t: math.prod(t),
    "nth": lambda t, i: t[i],
    "append": lambda t, *v: tuple(t) + tuple(v),
    "init": lambda t: tuple(t)[:-1],
}
# Functions that look at a bound tensor rather than at values.
TENSOR_FUNCTIONS = ("dim", "rank", "shape", "const?")


# -- tokenizer and reader -------------------------------------------------------------------

_TOKEN = re.compile(
    r"""\s*(?:
      (?P<comment>\#.*)
    | (?P<punct>=>|[()\[\],:])
    | (?P<atom>[^\s()\[\],]+)
    )""",
    re.VERBOSE,
)


@dataclass
class _Tok:
    text: str
    line: int
    col: int


class _Atom(str):
    """An atom of a raw S-expression, with where it starts."""

    line = col = 0


class _List(list):
    """A parenthesised raw S-expression, with where it starts."""

    line = col = 0


class _Brackets(tuple):
    """``[ ... ]`` as ``("[", items)``, with where it starts."""

    line = col = 0


def _at(obj, tok: _Tok):
    obj.line, obj.col = tok.line, tok.col
    return obj


class _Reader:
    def __init__(self, text: str, where: str, line0: int):
        self.toks: list[_Tok] = []
        self.where = where
        for offset, line in enumerate(text.split("\n")):
            pos = 0
            while pos < len(line):
                m = _TOKEN.match(line, pos)
                if not m or m.end() == pos:
                    break
                if m.group("comment") is None and m.lastgroup:
                    t = m.group(m.lastgroup)
                    self.toks.append(_Tok(t, line0 + offset, m.start(m.lastgroup) + 1))
                pos = m.end()
        self.i = 0
        self.last = _Tok("end of rule", line0 + text.count("\n"), 1)

    def peek(self) -> str | None:
        return self.toks[self.i].text if self.i < len(self.toks) else None

    def error(self, expected: str):
        tok = self.toks[self.i] if self.i < len(self.toks) else self.last
        got = "end of rule" if self.i >= len(self.toks) else repr(tok.text)
        raise RuleSyntaxError(f"{self.where}:{tok.line}:{tok.col}: expected {expected}, got {got}")

    def take(self, expected: str | None = None, what: str | None = None) -> str:
        if self.i >= len(self.toks) or (expected is not None and self.toks[self.i].text != expected):
            self.error(what or repr(expected))
        self.i += 1
        return _at(_Atom(self.toks[self.i - 1].text), self.toks[self.i - 1])

    def here(self) -> _Tok:
        return self.toks[self.i] if self.i < len(self.toks) else self.last

    def sexpr(self, depth: int = 0):
        """A raw S-expression: nested lists of atoms ([ ... ] becomes ('[', items))."""
        t = self.peek()
        if t in ("(", "[") and depth >= MAX_DEPTH:
            self.error(f"at most {MAX_DEPTH} levels of nesting")
        if t == "(":
            start = self.here()
            self.take("(")
            items = _at(_List(), start)
            while self.peek() != ")":
                if self.peek() is None:
                    self.error("')'")
                items.append(self.sexpr(depth + 1))
            self.take(")")
            return items
        if t == "[":
            start = self.here()
            self.take("[")
            items = []
            while self.peek() != "]":
                if self.peek() is None:
                    self.error("']'")
                items.append(self.sexpr(depth + 1))
            self.take("]")
            return _at(_Brackets(("[", items)), start)
        if t == ":":
            start = self.here()
            self.take(":")
            return _at(_Atom(":" + self.take(what="an attribute name after ':'")), start)
        if t is None or t in (")", "]", ",", "=>"):
            self.error("a pattern or value")
        return self.take()


def _atom_value(text: str):
    if not text.isascii():  # int() and float() would read non-ASCII digits
        return _Symbol(text)
    if text in ("true", "false"):
        return text == "true"
    if text == "none":
        return None
    if text.startswith('"') and text.endswith('"') and len(text) >= 2:
        return text[1:-1]
    try:
        return int(text)
    except ValueError:
        pass
    try:
        return float(text)
    except ValueError:
        return None if text == "" else _Symbol(text)


class _Symbol(str):
    pass


class _Builder:
    """Turns raw S-expressions into the AST, checking ops, arity and attribute names."""

    def __init__(self, where: str, line: int):
        self.where = where
        self.line = line
        self.col = 1
        self.fresh = 0
        self.lifted: list = []  # conditions made of source attribute expressions (see attr)

    def fail(self, msg: str, at=None):
        line, col = (at.line, at.col) if getattr(at, "line", 0) else (self.line, self.col)
        raise RuleSyntaxError(f"{self.where}:{line}:{col}: {msg}")

    def tensor(self, sx, in_dst: bool):
        if isinstance(sx, str):
            if sx.startswith("?") and len(sx) > 1:
                return Var(sx[1:])
            self.fail(f"expected a tensor pattern '(op ...)' or '?var', got {sx!r}", sx)
        if isinstance(sx, tuple) or not sx:
            self.fail("expected a tensor pattern '(op ...)' or '?var'", sx)
        head = sx[0]
        self.col, self.line = getattr(sx, "col", self.col) or self.col, getattr(sx, "line", self.line) or self.line
        if head == "get":
            if len(sx) != 3 or not isinstance(sx[2], str) or not re.fullmatch(r"[0-9]+", sx[2]):
                self.fail("expected (get (OP ...) INDEX)", sx)
            inner = self.tensor(sx[1], in_dst)
            if not isinstance(inner, Op):
                self.fail("(get ...) takes an op pattern")
            return Get(inner, int(sx[2]))
        if head == "scalar":
            if not in_dst or len(sx) != 3:
                self.fail("expected (scalar VALUE ?like) in a target")
            like = self.tensor(sx[2], in_dst)
            if not isinstance(like, Var):
                self.fail("(scalar VALUE ?like) needs a tensor variable")
            return Scalar(self.attr(sx[1]), like)
        if not isinstance(head, str) or head not in ops.OPS:
            known = ", ".join(sorted(ops.OPS))
            self.fail(f"unknown op {head!r} (known: {known})", head if isinstance(head, str) else sx)
        spec = ops.OPS[head]
        args, attrs = [], []
        rest = list(sx[1:])
        while rest:
            item = rest.pop(0)
            if isinstance(item, str) and item.startswith(":"):
                if not rest:
                    self.fail(f"attribute {item} of {head} has no value", item)
                value = self.attr(rest.pop(0))
                attrs.append((item[1:], value if in_dst else self._lift(value)))
            else:
                if attrs:
                    self.fail(f"operand after attributes in ({head} ...)")
                args.append(self.tensor(item, in_dst))
        if spec.arity is not None and len(args) != spec.arity:
            self.fail(f"{head} takes {spec.arity} operands, got {len(args)}")
        allowed = spec.attribute_names
        for name, _ in attrs:
            if name not in allowed:
                self.fail(f"{head} has no attribute {name!r} (has: {', '.join(sorted(allowed)) or 'none'})")
        if in_dst:
            missing = spec.required - {n for n, _ in attrs}
            if missing:
                self.fail(f"target ({head} ...) must give {', '.join(sorted(missing))}")
        return Op(head, tuple(args), tuple(attrs))

    def _lift(self, x):
        """A source attribute pattern with each function application replaced by a fresh
        variable and a condition ``(= ?fresh (f ...))``: the matcher binds attributes before
        the tensors the function may read, and checks conditions once everything is bound."""
        if isinstance(x, Call):
            self.fresh += 1
            var = Var(f"attr {self.fresh}")  # a name no rule can spell
            self.lifted.append(Call("=", (var, x)))
            return var
        if isinstance(x, Tup):
            return Tup(tuple(self._lift(i) for i in x.items))
        return x

    def attr(self, sx):
        if isinstance(sx, tuple):
            return Tup(tuple(self.attr(x) for x in sx[1]))
        if isinstance(sx, list):
            if not sx or not isinstance(sx[0], str):
                self.fail("expected (function args ...)", sx)
            fn = sx[0]
            if fn in TENSOR_FUNCTIONS:
                args = (self.tensor(sx[1], False),) + tuple(self.attr(x) for x in sx[2:]) if len(sx) > 1 else ()
                if not args or not isinstance(args[0], Var):
                    self.fail(f"({fn} ?tensor ...) needs a tensor variable", sx)
                return Call(fn, args)
            if fn not in FUNCTIONS:
                self.fail(f"unknown function {fn!r} (known: {', '.join(sorted(FUNCTIONS) + list(TENSOR_FUNCTIONS))})", sx[0])
            return Call(fn, tuple(self.attr(x) for x in sx[1:]))
        if sx.startswith("?"):
            return Var(sx[1:])
        value = _atom_value(sx)
        if isinstance(value, _Symbol):
            self.fail(f"expected a value, got {sx!r}", sx)
        return value


def _split_top(r: _Reader, stop: set[str]) -> list:
    """Comma-separated S-expressions until a token in ``stop`` (or the end)."""
    items = [r.sexpr()]
    while r.peek() == ",":
        r.take(",")
        items.append(r.sexpr())
    if r.peek() is not None and r.peek() not in stop:
        r.error("',' or " + " or ".join(repr(s) for s in sorted(stop)) if stop else "end of rule")
    return items


def _tensor_vars(p, out: set):
    if isinstance(p, Var):
        out.add(p.name)
    elif isinstance(p, Op):
        for a in p.args:
            _tensor_vars(a, out)
    elif isinstance(p, Get):
        _tensor_vars(p.expr, out)
    elif isinstance(p, Scalar):
        out.add(p.like.name)


def _attr_vars(x, out: set):
    if isinstance(x, Var):
        out.add(x.name)
    elif isinstance(x, Tup):
        for i in x.items:
            _attr_vars(i, out)
    elif isinstance(x, Call):
        for a in x.args:
            if not isinstance(a, (Op, Get)):
                _attr_vars(a, out)
    elif isinstance(x, Op):
        for a in x.args:
            _attr_vars_of_pattern(a, out)
        for _, v in x.attrs:
            _attr_vars(v, out)
    elif isinstance(x, Get):
        _attr_vars(x.expr, out)
    elif isinstance(x, Scalar):
        _attr_vars(x.value, out)


def _attr_vars_of_pattern(p, out: set):
    if isinstance(p, (Op, Get, Scalar)):
        _attr_vars(p, out)


def parse_rule(text: str, where: str = "<string>", line: int = 1) -> Rule:
    r = _Reader(text, where, line)
    b = _Builder(where, line)
    name = r.take(what="a rule name")
    if not re.fullmatch(r"[A-Za-z][\w.-]*", name, re.ASCII):
        b.fail(f"expected a rule name (letters, digits, '_', '.', '-'), got {name!r}", name)
    r.take("[", "'[' and the rule's provenance")
    prov = r.take(what="a provenance")
    if prov not in PROVENANCES:
        b.fail(f"expected provenance {' or '.join(PROVENANCES)}, got {prov!r}", prov)
    r.take(",", "',' and a proof status")
    proof = r.take(what="a proof status")
    if proof not in PROOFS:
        b.fail(f"expected proof status {' or '.join(PROOFS)}, got {proof!r}", proof)
    r.take("]", "']'")
    r.take(":", "':' after the rule's header")
    src = tuple(b.tensor(sx, False) for sx in _split_top(r, {"=>"}))
    r.take("=>", "'=>'")
    dst = tuple(b.tensor(sx, True) for sx in _split_top(r, {"if"}))
    conds = ()
    if r.peek() == "if":
        r.take("if")
        conds = tuple(b.attr(sx) for sx in _split_top(r, set()))
    if r.peek() is not None:
        r.error("end of rule")
    b.line, b.col = line, 1
    for p in src:
        if not isinstance(_root_op(p), Op):
            b.fail("each source pattern must be an op, not a bare variable")
    conds = tuple(b.lifted) + conds
    bound_t, bound_a, used_t, used_a = set(), set(), set(), set()
    for p in src:
        _tensor_vars(p, bound_t)
        _attr_vars(p, bound_a)
    for p in dst:
        _tensor_vars(p, used_t)
        _attr_vars(p, used_a)
    for c in conds:
        _attr_vars(c, used_a)
        _tensor_vars_in_attr(c, used_t)
    if used_t - bound_t:
        b.fail(f"tensor variable(s) {', '.join('?' + v for v in sorted(used_t - bound_t))} not bound by the source")
    if used_a - bound_a - bound_t:
        b.fail(f"attribute variable(s) {', '.join('?' + v for v in sorted(used_a - bound_a))} not bound by the source")
    rule = Rule(name, prov, proof, src, dst, conds, f"{where}:{line}", text.strip())
    _warn_if_never(rule)
    return rule


def _warn_if_never(rule: Rule) -> None:
    """A warning for a condition that reads no variable and is false (``(= 1 2)``): the rule
    can never apply. (Conditions that contradict each other are found by the numeric check of
    :mod:`tvm_taso.verify.admit`.)"""
    for cond in rule.conds:
        used: set = set()
        _attr_vars(cond, used)
        _tensor_vars_in_attr(cond, used)
        if used:
            continue
        try:
            value = _constant(cond)
        except (ArithmeticError, IndexError, KeyError, TypeError, ValueError) as err:
            log.warning("rule %s (%s): condition cannot be evaluated (%s), so the rule never applies",
                        rule.name, rule.where, err)
            return
        if not value:
            log.warning("rule %s (%s): a condition is always false, so the rule never applies", rule.name, rule.where)
            return


def _constant(x):
    """The value of an attribute expression that reads no variable."""
    if isinstance(x, Tup):
        return tuple(_constant(i) for i in x.items)
    if isinstance(x, Call):
        return FUNCTIONS[x.fn](*(_constant(a) for a in x.args))
    return x


def _tensor_vars_in_attr(x, out: set):
    if isinstance(x, Call):
        if x.fn in TENSOR_FUNCTIONS:
            out.add(x.args[0].name)
        for a in x.args[1:] if x.fn in TENSOR_FUNCTIONS else x.args:
            _tensor_vars_in_attr(a, out)
    elif isinstance(x, Tup):
        for i in x.items:
            _tensor_vars_in_attr(i, out)


def parse_rules(text: str, where: str = "<string>") -> list[Rule]:
    """All rules of a rule file's text. Blank and ``#`` lines are skipped; indented lines
    continue the rule above."""
    rules, block, start = [], [], 0
    lines = text.split("\n")

    def flush():
        if block:
            rules.append(parse_rule("\n".join(block), where, start))

    for no, line in enumerate(lines, 1):
        stripped = line.strip()
        if not stripped or stripped.startswith("#"):
            continue
        if line[0].isspace():
            if not block:
                raise RuleSyntaxError(f"{where}:{no}:1: expected a rule name at the start of the line, got indentation")
            block.append(line)
            continue
        flush()
        block, start = [line], no
    flush()
    names = {}
    for rule in rules:
        if rule.name in names:
            raise RuleSyntaxError(f"{rule.where}:1: rule {rule.name!r} is already defined at {names[rule.name]}")
        names[rule.name] = rule.where
    return rules


def read_rules(path: str | Path) -> list[Rule]:
    """The rules of a rule file (UTF-8 text), with the proof status each one's header gives
    (:func:`tvm_taso.load_rules` also decides whether they may be used)."""
    path = Path(path)
    try:
        data = read_regular_file(path, MAX_RULE_FILE_BYTES, "a rule file")
    except InputFileError as err:
        raise RuleSyntaxError(f"cannot read rule file {err}") from None
    try:
        text = data.decode("utf-8")
    except UnicodeDecodeError as err:
        line = data.count(b"\n", 0, err.start) + 1
        col = err.start - (data.rfind(b"\n", 0, err.start) + 1) + 1
        raise RuleSyntaxError(f"{path}:{line}:{col}: not a rule file: byte 0x{data[err.start]:02x} is not UTF-8 text") from None
    if "\x00" in text:
        line = text.count("\n", 0, text.index("\x00")) + 1
        raise RuleSyntaxError(f"{path}:{line}:1: not a rule file: it holds binary data (NUL bytes)")
    return parse_rules(text, str(path))


def default_rules(include_unverified: bool = False) -> list[Rule]:
    """The shipped library (every ``*.rules`` file of ``tvm_taso.rules``), proved or checked
    rules only unless ``include_unverified``."""
    files = sorted(
        (f for f in importlib.resources.files("tvm_taso.rules").iterdir() if f.name.endswith(".rules")),
        key=lambda f: f.name,
    )
    rules = [copy.copy(r) for f in files for r in _parsed_library_file(f.read_text(), f"rules/{f.name}")]
    return [r for r in rules if include_unverified or r.proof != "unverified"]


@functools.lru_cache(maxsize=16)
def _parsed_library_file(text: str, where: str) -> tuple[Rule, ...]:
    """A library file's rules, parsed once per process and text (every ``optimize`` asks for
    them; :func:`default_rules` hands out copies)."""
    rules = parse_rules(text, where)
    for r in rules:
        r.established = SHIPPED
    return tuple(rules)
