"""The generator's pipeline: enumerate, pair, confirm, emit, prune and name, with a process pool,
progress bars and a time limit (see the package docstring for the steps)."""

from __future__ import annotations

import multiprocessing as mp
import sys
import time
from collections import Counter, defaultdict
from dataclasses import dataclass

from tqdm import tqdm

from tvm_taso.generate.checks import float_confirm
from tvm_taso.generate.enumerate_graphs import EnumConfig, Enumerator, Pair, leaf_graphs
from tvm_taso.generate.output import Emitted, make_rules
from tvm_taso.generate.prune import (
    is_implied,
    normalized_rule_text,
    pair_canon,
    self_renaming,
    structural_pairs,
)
from tvm_taso.generate.search_space import ALL_GROUPS, domains
from tvm_taso.rewrite.rule import parse_rule, parse_rules


@dataclass
class GenConfig:
    max_ops: int = 3
    groups: tuple = ALL_GROUPS
    seed: int = 0
    time_limit: float = 600.0
    workers: int = 2
    progress: bool = True
    implied: bool = True  # prune rules that applications of smaller rules reproduce
    domains: tuple = ("mat", "conv")
    both_directions: bool = True  # False: one rule per pair, smaller graph -> larger (TASO)
    implied_by: tuple = ()  # texts of rule files whose rules also count for the implication test


@dataclass
class GenResult:
    rules: list  # Emitted, in file order
    stats: dict  # step -> count, in pipeline order
    families: dict  # family -> number of rules
    seconds: float
    truncated: bool  # stopped at the time limit


@dataclass
class _Candidate:
    """A rule checked by the engine, before pruning and naming."""

    pair: Pair
    family: str
    forward: bool
    text: str  # named ``r``
    sizes: dict  # the sizes of the instance it was checked on


# =============================================================================================
# Work in worker processes (state set up once per process by the initializers)
# =============================================================================================

_W: dict = {}


def _init_worker(cfg: GenConfig):
    _W.clear()
    _W["cfg"] = cfg
    _W["domains"] = {d.name: d for d in domains("const" in cfg.groups)}
    _W["enum"] = {
        name: Enumerator(d, EnumConfig(cfg.max_ops, cfg.groups, cfg.seed)) for name, d in _W["domains"].items()
    }


def _enum_task(task):
    idx, dom, first, deadline = task
    e = _W["enum"][dom]
    recs = e.run(first, deadline)
    return idx, dom, recs, e.nodes, e.stopped


def _confirm_task(task):
    idx, pair = task
    return idx, float_confirm(_W["domains"][pair.domain], pair.a, pair.b, _W["cfg"].seed + idx)


def _emit_task(task):
    idx, pair = task
    return idx, make_rules(_W["domains"][pair.domain], pair, idx, _W["cfg"].seed)


def _init_implied(cfg: GenConfig, texts: list, rule_domains: list):
    _init_worker(cfg)
    _W["rules"] = [parse_rule(t) for t in texts]
    _W["rule_domain"] = rule_domains
    _W["external"] = [r for t in cfg.implied_by for r in parse_rules(t)]


def _implied_task(task):
    idx, pair, forward, env = task
    earlier = _W["external"] + [q for q, d in zip(_W["rules"][:idx], _W["rule_domain"]) if d == pair.domain]
    return idx, is_implied(_W["domains"][pair.domain], _W["rules"][idx], pair, forward, env, earlier)


class _Runner:
    """Runs tasks in a process pool (or inline with one worker), results in task order."""

    def __init__(self, cfg: GenConfig, init=_init_worker, args=None):
        self.cfg = cfg
        self.pool = None
        args = (cfg,) if args is None else args
        if cfg.workers > 1:
            ctx = mp.get_context("fork") if "fork" in mp.get_all_start_methods() else mp.get_context()
            self.pool = ctx.Pool(cfg.workers, initializer=init, initargs=args)
        else:
            init(*args)

    def map(self, fn, tasks, desc: str, deadline: float | None = None, chunksize: int = 1):
        """``fn`` over ``tasks`` (each result a tuple starting with the task's index), stopping
        early at ``deadline``: the results that came back, by index."""
        results = {}
        bar = tqdm(total=len(tasks), desc=desc, disable=not self.cfg.progress, file=sys.stderr, leave=True,
                   dynamic_ncols=True)
        it = self.pool.imap_unordered(fn, tasks, chunksize) if self.pool else map(fn, tasks)
        try:
            for res in it:
                results[res[0]] = res
                bar.update(1)
                if deadline is not None and time.monotonic() > deadline:
                    break
        finally:
            bar.close()
        return [results[k] for k in sorted(results)]

    def close(self):
        if self.pool:
            self.pool.terminate()
            self.pool.join()


# =============================================================================================
# The pipeline
# =============================================================================================


def generate(cfg: GenConfig | None = None, log=None) -> GenResult:
    """Run the whole generator. ``log(message)`` gets a line per step (default: standard
    error, when ``cfg.progress``)."""
    cfg = cfg or GenConfig()
    t0 = time.monotonic()
    deadline = t0 + cfg.time_limit
    log = log or (lambda msg: print(f"tvm-taso generate: {msg}", file=sys.stderr, flush=True) if cfg.progress else None)
    doms = {d.name: d for d in domains("const" in cfg.groups) if d.name in cfg.domains}
    stats: dict = {}
    runner = _Runner(cfg)
    try:
        # -- 1. enumerate ---------------------------------------------------------------------
        buckets, truncated = _enumerate(runner, cfg, doms, t0, stats)
        log(f"enumerated {stats['graphs enumerated']} graphs "
            f"({stats['graphs fingerprinted (1-2 outputs, connected or a parallel pair)']} fingerprinted) in "
            f"{time.monotonic() - t0:.1f} s" + (" -- stopped at the time limit" if truncated else ""))

        # -- 2. candidate pairs and TASO's structural pruning --------------------------------
        pairs = structural_pairs(buckets, doms, stats)
        del buckets
        log(f"{stats['candidate pairs (equal fingerprints)']} candidate pairs -> {len(pairs)} after structural pruning")

        # -- 3. float confirmation ------------------------------------------------------------
        res = runner.map(_confirm_task, list(enumerate(pairs)), "float check", chunksize=8)
        pairs = [pairs[i] for i, ok in res if ok]
        stats["after float64 confirmation"] = len(pairs)

        # -- 4. rules, checked by the rule engine ---------------------------------------------
        cands, emit_truncated = _emit(runner, cfg, pairs, deadline, stats)
        truncated |= emit_truncated

        # -- 5. rules implied by smaller ones -------------------------------------------------
        # general rules first (a rule with a repeated input is a special case of one without),
        # mere reorderings of add/multiply operands last
        reorders = {id(c.pair): int(self_renaming(doms[c.pair.domain], c.pair, flips=True)) for c in cands}
        cands.sort(key=lambda c: (c.pair.a.size + c.pair.b.size, reorders[id(c.pair)], -len(c.pair.leaves()),
                                  c.family, c.text))
        keep = [True] * len(cands)
        if cfg.implied and time.monotonic() < deadline:
            runner.close()
            runner = _Runner(cfg, _init_implied, (cfg, [c.text for c in cands], [c.pair.domain for c in cands]))
            jobs = [(i, c.pair, c.forward, c.sizes) for i, c in enumerate(cands)]
            res = runner.map(_implied_task, jobs, "implied", deadline=deadline, chunksize=4)
            if len(res) < len(jobs):
                truncated = True
                stats["rules not tested for implication (time limit)"] = len(jobs) - len(res)
            for i, implied in res:
                keep[i] = not implied
        cands = [c for c, k in zip(cands, keep) if k]
        stats["after removing rules implied by smaller rules"] = len(cands)
    finally:
        runner.close()

    # -- 6. names ---------------------------------------------------------------------------------
    emitted = _named(cands, doms)
    stats["rules written"] = len(emitted)
    families = Counter(e.family for e in emitted)
    return GenResult(emitted, stats, dict(sorted(families.items())), time.monotonic() - t0, truncated)


def _enumerate(runner: _Runner, cfg: GenConfig, doms: dict, t0: float, stats: dict) -> tuple[dict, bool]:
    """Every graph's record grouped by fingerprint, ``(domain name, key) -> [(ops, outs,
    hashes, redundant)]`` (graphs of leaves alone included), and whether time ran out. The
    first op of each graph is the unit of parallel work."""
    tasks = []
    for name, d in doms.items():
        e = Enumerator(d, EnumConfig(cfg.max_ops, cfg.groups, cfg.seed))
        for first in e.first_ops():
            tasks.append((len(tasks), name, first, t0 + 0.6 * cfg.time_limit))
    results = runner.map(_enum_task, tasks, "enumerate", deadline=t0 + 0.65 * cfg.time_limit)
    buckets: dict = defaultdict(list)
    truncated = len(results) < len(tasks)
    nodes = graphs = 0
    for _, dom, recs, n, stopped in results:
        nodes += n
        truncated |= stopped
        for key, ops_, outs, hs, redundant in recs:
            buckets[(dom, key)].append((ops_, outs, hs, redundant))
            graphs += 1
    del results
    for name, d in doms.items():
        for key, g in leaf_graphs(d, EnumConfig(cfg.max_ops, cfg.groups, cfg.seed)):
            buckets[(name, key)].append((g.ops, g.outs, g.hashes, False))
    stats["graphs enumerated"] = nodes
    stats["graphs fingerprinted (1-2 outputs, connected or a parallel pair)"] = graphs
    return buckets, truncated


def _emit(runner: _Runner, cfg: GenConfig, pairs: list, deadline: float, stats: dict) -> tuple[list, bool]:
    """The checked rules of ``pairs``, one per text up to variable names, and whether time ran out."""
    res = runner.map(_emit_task, list(enumerate(pairs)), "emit + check", deadline=deadline - 0.05 * cfg.time_limit,
                     chunksize=4)
    cands = []
    failed = 0
    for i, r in res:
        failed += r["why"].count("failed check")
        for forward, text, sizes in r["rules"]:
            cands.append(_Candidate(pairs[i], r["family"], forward, text, sizes))
            if not cfg.both_directions:
                break
    stats["rules checked by the engine" + (" (both directions)" if cfg.both_directions else "")] = len(cands)
    uniq, seen_text = [], set()
    for c in cands:
        norm = normalized_rule_text(c.text)
        if norm not in seen_text:
            seen_text.add(norm)
            uniq.append(c)
    stats["after removing duplicate rules (same text up to renaming)"] = len(uniq)
    stats["directions failing the engine check"] = failed
    stats["pairs whose two sides are the same Relax graph"] = sum(r["why"].count("identical") for _, r in res) // 2
    return uniq, len(res) < len(pairs)


def _named(cands: list, doms: dict) -> list[Emitted]:
    """The rules named ``gen-FAMILY-N`` (N counts pairs within a family; ``-rev`` for the
    larger graph -> smaller direction), ordered by family, size and canonical form."""
    by_pair: dict = defaultdict(list)
    for c in cands:
        by_pair[id(c.pair)].append(c)
    groups = sorted(by_pair.values(), key=lambda cs: (cs[0].family, cs[0].pair.a.size + cs[0].pair.b.size,
                                                      pair_canon(doms[cs[0].pair.domain], cs[0].pair)))
    count: Counter = Counter()
    emitted = []
    for cs in groups:
        fam = cs[0].family
        count[fam] += 1
        for c in sorted(cs, key=lambda c: not c.forward):
            name = f"gen-{fam}-{count[fam]}" + ("" if c.forward else "-rev")
            emitted.append(Emitted(name, fam, name + c.text[1:]))
    return emitted
