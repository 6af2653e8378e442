"""``ApplyRules``: apply substitution rules wherever they match, with no search and no cost model."""

from __future__ import annotations

import warnings
from collections import Counter

import tvm
import tvm_ffi
from tvm import relax

from tvm_taso.ir.ops import OpError
from tvm_taso.ir.relax_bridge import foreign_function
from tvm_taso.verify.admit import admit
from tvm_taso.rewrite import dpl
from tvm_taso.rewrite.rule import Rule, default_rules

@tvm.transform.module_pass(opt_level=0, name="ApplyRules")
class ApplyRules:
    """Rewrite every Relax function with the given TASO rules wherever they match.

    A deterministic, search-free rewrite, as TVM's ``CombineParallelMatmul`` is for one rule:
    the first rule of the list that has a site is applied at its first site (binding order),
    and again, until no rule has a site left; then the weight-only expressions the rewrites
    made (the ``concat`` of two constant weights) are folded to constants. Sites are found
    with ``tvm.relax.dpl`` (:mod:`tvm_taso.rewrite.dpl`), the rules' conditions included, and
    each rewrite keeps the types of the values it replaces. For example
    ``ApplyRules(["merge-matmul-shared-lhs"])`` turns the Q, K and V matmuls of one input into
    one matmul on concatenated weights and splits of its result.

    Functions with a ``Primitive``, ``Composite`` or ``Codegen`` attribute are left alone. A
    site whose rewrite would change a type, or that ``rewrite_bindings`` cannot single out,
    is passed over. Rules that undo each other never run out of sites: ``max_rewrites`` bounds
    the rewrites per function, with a ``RuntimeWarning`` when it is reached.

    Parameters
    ----------
    rules : names of rules of the shipped library, or :class:`~tvm_taso.rewrite.rule.Rule`
        objects, in order of priority.
    max_rewrites : rewrites per function at most (default 1000).

    ``last_applied`` counts the rewrites of the last run by rule name.
    """

    def __init__(self, rules, max_rewrites: int = 1000):
        if isinstance(max_rewrites, bool) or not isinstance(max_rewrites, int) or max_rewrites < 1:
            raise ValueError(f"max_rewrites must be an integer >= 1, got {max_rewrites!r}")
        self.patterns = [dpl.RulePatterns(rule) for rule in _resolve(rules)]
        self.max_rewrites = max_rewrites
        self.last_applied: Counter = Counter()

    def transform_module(self, mod: tvm.IRModule, ctx: tvm.transform.PassContext) -> tvm.IRModule:
        self.last_applied = Counter()
        updates = {}
        for gv, func in mod.functions.items():
            if not isinstance(func, relax.Function) or foreign_function(func):
                continue
            new = self._rewrite(func, gv.name_hint)
            if new is not func:
                updates[gv] = relax.transform.FoldConstant()(tvm.IRModule({gv: new}))[gv]
        if not updates:
            return mod
        mod = mod.clone()  # the caller's module stays as it was
        for gv, func in updates.items():
            mod.update_func(gv, func)
        return mod

    def _rewrite(self, func: relax.Function, name: str) -> relax.Function:
        for _ in range(self.max_rewrites):
            step = self._first_rewrite(func)
            if step is None:
                return func
            func, rule = step
            self.last_applied[rule.name] += 1
        if self._first_rewrite(func) is not None:
            warnings.warn(f"ApplyRules stopped after {self.max_rewrites} rewrites of {name}: its rules "
                          "keep matching (do two of them undo each other?)", RuntimeWarning, stacklevel=2)
        return func

    def _first_rewrite(self, func: relax.Function):
        """``(new function, rule)`` for the first site of the first rule that rewrites, or None."""
        sites = dpl.Sites(func)
        for patterns in self.patterns:
            for site in sites.of(patterns):
                try:
                    new = sites.rewrite(site)
                except (ValueError, LookupError, OpError):  # a type would change; a site DPL cannot rewrite
                    continue
                if not tvm_ffi.structural_equal(new, func):
                    return new, patterns.rule
        return None


def _resolve(rules) -> list[Rule]:
    """Rules from names of the shipped library or Rule objects (one, or a list of them); Rule
    objects from outside the library are proved or checked first, and refused with a warning
    when they fail (:func:`tvm_taso.verify.admit.admit`)."""
    if isinstance(rules, (str, Rule)):
        rules = [rules]
    if not isinstance(rules, (list, tuple)) or not all(isinstance(r, (str, Rule)) for r in rules):
        raise TypeError(f"ApplyRules takes a rule name, a Rule, or a list of them, got {rules!r}")
    library = None
    resolved = []
    for rule in rules:
        if isinstance(rule, Rule):
            resolved.extend(admit([rule]))
            continue
        if library is None:
            library = {r.name: r for r in default_rules()}
        if rule not in library:
            raise ValueError(f"no rule named {rule!r} in the shipped library (rules/*.rules)")
        resolved.append(library[rule])
    return resolved
