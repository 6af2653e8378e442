"""The rule verifier: prove each rule from the operator properties of :mod:`tvm_taso.verify.axioms`.

A rule is translated into terms of the algebra (:mod:`tvm_taso.verify.translate`) and proved
output by output: ``src_i != dst_i`` must be unsatisfiable together with the axioms and what is
known whenever the rule fires.

Statuses: ``proved`` (unsat for every output); ``failed`` (the solver ran out of axioms to
instantiate without a proof, or Z3 found a model where the sides differ: the axioms do not imply
the rule — then :func:`~tvm_taso.verify.refute.refute` looks for a concrete counterexample on
random small tensors, and the reason says ``counterexample: ...`` when it finds one, which means
the rule is wrong); ``unknown`` (resource budget spent); ``unsupported`` (an op or attribute outside the
algebra, e.g. ``batch_norm``, ``reshape``; such rules keep their proof status). The axioms'
numeric check (:mod:`tvm_taso.verify.soundness`) runs first; the verifier refuses to prove
anything from an axiom that fails it.

Z3 runs E-matching only (no model-based instantiation: on an unprovable rule it can run for
minutes past its timeout), in a fresh context and non-incremental solver per output and
attempt, with a fixed seed sequence and budgets in Z3's deterministic resource units: a rule's
verdict does not depend on what else the file holds, in which order, or on the machine's load.
"""

from __future__ import annotations

import logging
import time
from dataclasses import dataclass, field

from tvm_taso.progress import progress_bar
from tvm_taso.rewrite.rule import Rule
from tvm_taso.verify import soundness
from tvm_taso.verify.algebra import VerifierUnavailable, Z3Algebra
from tvm_taso.verify.axioms import AXIOMS
from tvm_taso.verify.refute import refute
from tvm_taso.verify.statements import Axiom
from tvm_taso.verify.translate import Unsupported, translate

log = logging.getLogger(__name__)

INSTALL_HINT = "install the verifier with pip install 'tvm-taso[verify]'"
STATUSES = ("proved", "failed", "unknown", "unsupported")


@dataclass
class VerifyResult:
    name: str
    status: str  # proved | failed | unknown | unsupported
    seconds: float
    reason: str = ""
    where: str = ""
    provenance: str = ""
    proof: str = ""  # the proof status the rule file gave
    dropped: list = field(default_factory=list)  # conditions the algebra could not express


def z3_available() -> bool:
    try:
        import z3  # noqa: F401
    except ImportError:
        return False
    return True


def formulas(alg: Z3Algebra, axioms: list[Axiom] | None = None) -> list:
    """The background theory and every axiom as Z3 formulas."""
    return alg.background() + [a.formula(alg) for a in (AXIOMS if axioms is None else axioms)]


class Prover:
    """Holds the algebra and the axioms' formulas; proves one rule at a time."""

    # Looking for a counterexample to a rule that is not proved: a fixed number of draws (so the
    # verdict is reproducible), with a time bound as a backstop.
    refute_tries = 20000
    refute_seconds = 20.0
    wall_factor = 3.0  # the wall-clock backstop, in rule timeouts (workers are killed later)

    def __init__(self, axioms: list | None = None, check: bool = True):
        if check and axioms is None:
            soundness.ensure_checked()
        elif check:
            bad = [r for r in soundness.check_axioms(axioms, trials=soundness.DEFAULT_TRIALS) if not r.ok]
            if bad:
                raise soundness.AxiomError.of(bad)
        self.alg = Z3Algebra()
        self.formulas = formulas(self.alg, axioms)

    # Each output is checked in a fresh Z3 context holding only the background theory, the axioms
    # and this rule's facts, copied in one go from the prover's context: Z3's choices follow the
    # ids of its terms, so in a shared context the terms of rules proved before (another file,
    # another order, another worker) changed the search, and a rule that proves in 0.04 s alone
    # timed out among others. Budgets are Z3 resource units (``rlimit``), not seconds, so the
    # verdict does not depend on the machine's load either: an attempt that runs out restarts
    # with the next seed and twice the units, until the rule's units are spent. The wall-clock
    # timeout stays as a backstop only.
    first_attempt_rlimit = 1_500_000  # 1-3 s on this project's machines (0.5-1.5 M units/s)
    rlimit_per_second = 1_000_000  # turns a rule's timeout into its resource budget

    def solver(self, ctx, rlimit: int, seconds: float, seed: int = 0):
        """A solver in ``ctx`` (E-matching only) with a resource and a wall-clock budget."""
        z3 = self.alg.z3
        s = z3.Solver(ctx=ctx)
        s.set("rlimit", int(rlimit))
        s.set("timeout", max(1, int(seconds * 1000)))
        s.set("random_seed", seed)
        # E-matching only: with auto_config Z3 turns model-based quantifier instantiation back
        # on, which on an unprovable rule can run for minutes past the timeout.
        s.set("auto_config", False)
        s.set("mbqi", False)
        return s

    def prove(self, rule: Rule, timeout: float = 10.0) -> VerifyResult:
        t0 = time.perf_counter()
        base = dict(where=rule.where, provenance=rule.provenance, proof=rule.proof)

        def result(status, reason="", dropped=()):
            return VerifyResult(rule.name, status, time.perf_counter() - t0, reason, dropped=list(dropped), **base)

        try:
            tr = translate(rule, self.alg)
        except Unsupported as err:
            return result("unsupported", str(err))
        if len(tr.src) != len(tr.dst):
            return result("failed", f"{len(tr.src)} source outputs but {len(tr.dst)} target outputs")
        z3 = self.alg.z3
        units = self.rlimit_per_second * timeout  # the rule's budget, over all its outputs
        deadline = t0 + self.wall_factor * timeout
        for i, (a, b) in enumerate(zip(tr.src, tr.dst)):
            if a.eq(b):
                continue
            r, why, used = self._check(tr, a, b, units, deadline)
            units -= used
            if r == z3.unsat:
                continue
            saturated = r == z3.sat or "incomplete quantifiers" in why
            cex = refute(rule, self.refute_seconds, tries=self.refute_tries)
            if cex:
                return result("failed", f"counterexample: {cex}", tr.dropped)
            if saturated:
                return result("failed", f"output {i}: not implied by the axioms (E-matching saturated; "
                              "a missing axiom or a wrong rule; no counterexample found)", tr.dropped)
            return result("unknown", f"output {i}: {why}", tr.dropped)
        reason = ""
        if tr.dropped:
            reason = f"without {len(tr.dropped)} condition(s) the algebra cannot express"
        return result("proved", reason, tr.dropped)

    def _check(self, tr, a, b, units: float, deadline: float):
        """Checks ``a != b`` against the axioms with at most ``units`` of Z3's resources;
        returns (z3 result, reason when unknown, units used)."""
        z3 = self.alg.z3
        problem = z3.AstVector(ctx=self.alg.ctx)
        for f in self.formulas + tr.facts(self.alg) + [a != b]:
            problem.push(f)
        spent, budget, seed = 0, self.first_attempt_rlimit, 0
        while True:
            budget = min(budget, units - spent)
            if budget <= 0:
                return z3.unknown, "resource budget spent", spent
            # A fresh context and a fresh, non-incremental solver per attempt: push/pop or
            # assumption literals switch Z3 to incremental mode, which skips the preprocessing
            # that makes these proofs fast (and a push saturates E-matching with no timeout).
            ctx = z3.Context()
            s = self.solver(ctx, budget, deadline - time.perf_counter(), seed)
            s.add(problem.translate(ctx))
            r = s.check()
            if r != z3.unknown:
                return r, "", spent + budget
            why = s.reason_unknown()
            spent += budget
            if not _out_of_resources(why, deadline):
                if "timeout" in why or "canceled" in why:
                    return r, "wall-clock backstop reached (the machine is too slow for the resource budget)", spent
                return r, why, spent
            budget, seed = 2 * budget, seed + 1


def _out_of_resources(why: str, deadline: float) -> bool:
    """Whether an ``unknown`` says the attempt spent its resource units (retry with the next seed
    and twice the units), as opposed to the wall-clock backstop or anything else. Z3 5.4 often
    reports a spent ``rlimit`` as ``canceled``, the word it also uses for its timeout: a
    cancellation before the deadline is the budget's."""
    if "resource" in why or "rlimit" in why:
        return True
    return ("canceled" in why or "timeout" in why) and time.perf_counter() < deadline - BACKSTOP_SLACK


# how close to the deadline an attempt may stop and still be taken as stopped by its budget
BACKSTOP_SLACK = 0.05


def verify_rules(rules: list[Rule], timeout: float = 10.0, progress: bool = False, time_limit: float | None = None,
                 jobs: int = 1, isolate: bool = False) -> list[VerifyResult]:
    """Prove every rule; one :class:`VerifyResult` per rule, in order.

    ``timeout`` sets each rule's budget in Z3 resource units (:attr:`Prover.rlimit_per_second`
    per second, so the verdict is the same on a busy machine), with a wall-clock backstop.
    Z3 does not always stop on time, so with ``isolate`` (or ``jobs`` > 1) rules run in worker
    processes and a worker still busy at ``(wall_factor + 1) * timeout + 10`` seconds is killed
    and its rule reported ``unknown``. Each rule is proved in contexts of its own, so its verdict
    does not depend on the other rules, their order or the worker. ``time_limit``
    bounds the whole run: rules not reached by then are ``unknown``."""
    if not z3_available():
        raise VerifierUnavailable(f"the verifier needs z3: {INSTALL_HINT}")
    soundness.ensure_checked()
    bar = progress_bar("verifying", "rule", len(rules)) if progress else None
    try:
        if (jobs > 1 or isolate) and rules:
            out = _run_workers(rules, timeout, max(1, jobs), time_limit, bar)
        else:
            out = [None] * len(rules)
            t0 = time.perf_counter()
            prover = Prover(check=False)
            for i, r in enumerate(rules):
                if time_limit is not None and time.perf_counter() - t0 > time_limit:
                    break
                out[i] = prover.prove(r, timeout)
                _tick(bar, out[i])
    finally:
        if bar is not None:
            bar.close()
    for i, r in enumerate(rules):
        if out[i] is None:
            out[i] = VerifyResult(r.name, "unknown", 0.0, "not reached within the time limit", r.where, r.provenance, r.proof)
    return out


def _worker_main(conn, timeout: float) -> None:
    prover = Prover(check=False)
    while True:
        try:
            task = conn.recv()
        except EOFError:
            return
        if task is None:
            return
        i, rule = task
        conn.send((i, prover.prove(rule, timeout)))


def _run_workers(rules, timeout, jobs, time_limit, bar) -> list:
    """Prove in ``jobs`` worker processes (started here, and killed here when overdue)."""
    import multiprocessing as mp
    from multiprocessing.connection import wait

    ctx = mp.get_context("fork" if "fork" in mp.get_all_start_methods() else "spawn")
    hard = (Prover.wall_factor + 1) * timeout + 10
    out: list = [None] * len(rules)
    todo = list(range(len(rules)))

    def start():
        parent, child = ctx.Pipe()
        proc = ctx.Process(target=_worker_main, args=(child, timeout), daemon=True)
        proc.start()
        child.close()
        return {"proc": proc, "conn": parent, "task": None, "since": 0.0}

    def stop(w):
        if w["proc"].is_alive():
            w["proc"].kill()
        w["proc"].join()
        w["conn"].close()

    def lost(i, since, why):
        r = rules[i]
        return VerifyResult(r.name, "unknown", time.perf_counter() - since, why, r.where, r.provenance, r.proof)

    workers = [start() for _ in range(min(jobs, len(rules)))]
    t0 = time.perf_counter()
    try:
        while todo or any(w["task"] is not None for w in workers):
            now = time.perf_counter()
            if time_limit is not None and now - t0 > time_limit:
                break
            for w in workers:
                if w["task"] is None and todo:
                    i = todo.pop(0)
                    w["conn"].send((i, rules[i]))
                    w["task"], w["since"] = i, now
            busy = [w["conn"] for w in workers if w["task"] is not None]
            ready = set(wait(busy, timeout=0.2)) if busy else set()
            for k, w in enumerate(workers):
                if w["task"] is None:
                    continue
                i, res = w["task"], None
                if w["conn"] in ready:
                    try:
                        _, res = w["conn"].recv()
                    except (EOFError, OSError):
                        res = lost(i, w["since"], "the prover process died")
                        stop(w)
                        workers[k] = w = start()
                elif time.perf_counter() - w["since"] > hard:
                    res = lost(i, w["since"], f"Z3 ignored its {timeout:g} s timeout; stopped after {hard:g} s")
                    stop(w)
                    workers[k] = w = start()
                if res is not None:
                    out[i] = res
                    w["task"] = None
                    _tick(bar, res)
    finally:
        for w in workers:
            if w["task"] is None and w["proc"].is_alive():
                try:
                    w["conn"].send(None)
                    w["proc"].join(2)
                except OSError:
                    pass
            stop(w)
    return out


def _tick(bar, res: VerifyResult) -> None:
    log.info("%s: %s (%.2f s) %s", res.name, res.status, res.seconds, res.reason)
    if bar is not None:
        bar.update(1)
