"""Admitting rules from outside the shipped library before the search may use them.

The shipped library (``rules/*.rules``) is proved or checked when it is built and tested. A
rule from anywhere else (a user's file, :func:`~tvm_taso.rewrite.rule.parse_rules`) is trusted
for nothing its header says: it is proved with Z3 when the verifier is installed
(:mod:`tvm_taso.verify.prover`), else — or when Z3 neither proves nor refutes it — checked
numerically on random instances (:func:`tvm_taso.verify.refute.sample`, the op table's numpy
semantics). Its proof status becomes what was established: ``proved`` or ``checked``. A rule
with a counterexample, or one that could not be exercised at all (an op outside the
verifier's algebra, conditions that never held, a target whose type never fits what it
replaces), is refused: one warning naming it, its location and the reason (the
counterexample), and the other rules go on. ``trust=True`` skips all this; the log says so.

Results are cached per rule text, so a rule is judged once per process.
"""

from __future__ import annotations

import dataclasses
import signal
import threading
import time
import logging
from pathlib import Path

from tvm_taso.progress import progress_bar
from tvm_taso.rewrite.rule import TRUSTED, Rule, read_rules

_SIGNALS = (signal.SIGINT, signal.SIGTERM)

log = logging.getLogger("tvm_taso")

SAMPLE_SECONDS = 1.0  # random instances per rule, at most
ENOUGH = 30  # instances that fired: the check stops there
MIN_FIRED = 2  # instances that must fire (and agree) for a rule to count as checked
PROVE_SECONDS = 2.0

_cache: dict[str, tuple[str, str]] = {}  # rule text -> (status or "refused", reason)
_prover = []  # the one Prover of this process (building it checks the axioms once)


@dataclasses.dataclass
class Refusal:
    name: str
    where: str
    reason: str

    def to_json(self) -> dict:
        return dataclasses.asdict(self)


def admit(rules, trust: bool = False, refused: list | None = None, deadline: float | None = None,
          progress: bool = False) -> list[Rule]:
    """The rules the search may use: each one not yet admitted (``rule.established`` empty) is
    proved or checked (see the module docstring), or trusted as written with ``trust``; refused
    rules are left out, with a warning, and appended to ``refused`` as :class:`Refusal`. Checking
    stops at ``deadline`` (``time.perf_counter()``): the rules left are not used, each appended
    to ``refused``, and one warning says how many. ``progress`` shows a bar."""
    out, trusted, late = [], [], []
    pending = [r for r in rules if not r.established and not trust]
    bar = progress_bar("tvm-taso checking rules", "rule", len(pending)) if progress and pending else None
    try:
        with _SignalsBetweenRules() as signals:
            for rule in rules:
                if rule.established:
                    out.append(rule)
                    continue
                if trust:
                    trusted.append(rule.name)
                    out.append(dataclasses.replace(rule, proof="unverified", established=TRUSTED))
                    continue
                if deadline is not None and time.perf_counter() > deadline:
                    late.append(rule)
                    continue
                status, reason = judge(rule)
                signals.act()
                if bar is not None:
                    bar.update()
                _admit_one(rule, status, reason, out, refused)
    finally:
        if bar is not None:
            bar.close()
    if late:
        log.warning("%d of %d rule(s) not checked within the time limit: not used (raise --time-limit)",
                    len(late), len(pending))
        if refused is not None:
            refused.extend(Refusal(r.name, r.where, "not checked within the time limit") for r in late)
    if trusted:
        log.warning("%d rule(s) used unchecked, trusted as written: %s", len(trusted), ", ".join(trusted))
    return out


class _SignalsBetweenRules:
    """SIGINT and SIGTERM held while rules are proved or checked, and acted on between two rules
    (:meth:`act`) and at the end: raised inside Z3 (in one of its finalizers, which the garbage
    collector runs at any moment) an interrupt was swallowed and the process went on checking.
    Acting restores the previous handlers and calls the one for the signal."""

    def __enter__(self):
        self.caught: list[int] = []
        self.previous = {}
        if threading.current_thread() is threading.main_thread():
            self.previous = {sig: signal.signal(sig, lambda signum, frame: self.caught.append(signum))
                             for sig in _SIGNALS}
        return self

    def act(self) -> None:
        if not self.caught:
            return
        self._restore()
        sig = self.caught[0]
        handler = self.previous[sig]
        if callable(handler):
            handler(sig, None)
        elif sig == signal.SIGINT:
            raise KeyboardInterrupt
        else:
            signal.raise_signal(sig)

    def _restore(self) -> None:
        for sig, handler in self.previous.items():
            signal.signal(sig, handler)

    def __exit__(self, *exc) -> None:
        self._restore()
        if exc[0] is None:
            self.act()


def _admit_one(rule: Rule, status: str, reason: str, out: list, refused: list | None) -> None:
    """``rule`` (judged ``status`` for ``reason``) added to ``out``, or to ``refused``."""
    if status == "refused":
        log.warning("refused rule %s (%s): %s", rule.name, rule.where, reason)
        if refused is not None:
            refused.append(Refusal(rule.name, rule.where, reason))
        return
    log.info("rule %s %s (%s)", rule.name, status, reason)
    out.append(dataclasses.replace(rule, proof=status, established=status))


def judge(rule: Rule) -> tuple[str, str]:
    """``("proved" | "checked" | "refused", reason)`` for one rule (cached by its text)."""
    key = rule.text or repr((rule.src, rule.dst, rule.conds))
    if key not in _cache:
        _cache[key] = _judge(rule)
    return _cache[key]


def _judge(rule: Rule) -> tuple[str, str]:
    proof = _prove(rule)
    if proof is not None:
        return proof
    from tvm_taso.verify.refute import sample

    s = sample(rule, SAMPLE_SECONDS, enough=ENOUGH, equal_dims=True)
    if s.counterexample:
        return "refused", f"wrong on a random instance: {s.counterexample}"
    if s.unsupported:
        return "refused", f"cannot be checked ({s.unsupported}); load it with trust=True to use it unchecked"
    if s.fired >= MIN_FIRED:
        return "checked", f"source and target agree on {s.fired} random instances"
    if s.fired == 0 and s.types_differ and not s.conditions_false:
        why = (f"its target never has the type of what it replaces ({s.types_differ} random instances where "
               "the source matched), so it never applies")
    elif s.fired == 0 and s.conditions_false and not s.types_differ:
        why = f"its conditions never held on {s.conditions_false} random instances where the source matched"
    else:
        why = (f"it applied on {s.fired} of {s.drawn} random instances (conditions false on {s.conditions_false}, "
               f"target of another type on {s.types_differ}, source or target undefined on {s.undefined})")
    return "refused", f"could not be checked: {why}; load it with trust=True to use it unchecked"


def _prove(rule: Rule) -> tuple[str, str] | None:
    """Z3's verdict when it is installed and decisive, else None."""
    from tvm_taso.verify import prover

    if not prover.z3_available():
        return None
    try:
        if not _prover:
            # the axioms' numeric check (20 s) is the shipped library's test suite's business
            _prover.append(prover.Prover(check=False))
        p = _prover[0]
        res = p.prove(rule, PROVE_SECONDS)
        if res.status == "proved" and _never_fires(p, rule):
            return "refused", ("its conditions can never hold together with what its source requires "
                               "(Z3), so it never applies")
    except Exception as err:  # noqa: BLE001 - the numeric check still runs
        log.debug("proving %s failed: %s", rule.name, err)
        return None
    if res.status == "proved":
        return "proved", "proved with Z3" + (f" ({res.reason})" if res.reason else "")
    if res.status == "failed" and res.reason.startswith("counterexample:"):
        return "refused", f"Z3 and a concrete instance refute it: {res.reason}"
    return None


def _never_fires(p, rule: Rule) -> bool:
    """Whether Z3 shows that what holds whenever the rule fires contradicts the axioms (a proof
    of such a rule is vacuous: it never applies). Raises when the prover's internals do not
    allow the check; the caller then falls back to the numeric check."""
    from tvm_taso.verify.translate import translate

    z3 = p.alg.z3
    tr = translate(rule, p.alg)
    problem = z3.AstVector(ctx=p.alg.ctx)
    for f in p.formulas + tr.facts(p.alg):
        problem.push(f)
    ctx = z3.Context()
    s = p.solver(ctx, p.first_attempt_rlimit, 1.0)
    s.add(problem.translate(ctx))
    return s.check() == z3.unsat


def load_rules(path: str | Path, trust: bool = False, check: bool = False) -> list[Rule]:
    """The rules of a rule file (UTF-8 text), with the proof status each one's header gives.

    Rules from outside the shipped library are not used on their word: before the search (or
    ``ApplyRules``) uses them, :func:`admit` proves or checks each one and refuses, with a
    warning naming it and the counterexample, those that fail. ``check=True`` does that now, so
    the returned rules carry the status actually established (``proved`` or ``checked``) and
    refused ones are left out. ``trust=True`` skips the checks: the rules are used as written
    (status ``unverified``), and the log says so.
    """
    rules = read_rules(path)
    return admit(rules, trust=trust) if trust or check else rules
