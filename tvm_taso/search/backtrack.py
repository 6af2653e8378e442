"""Cost-based backtracking search (TASO's Algorithm 2) on one region.

A best-first search: pop the cheapest graph, apply every rule at every site, keep a new graph
if its cost is below ``alpha`` times the best so far. Graphs are deduplicated by structural
hash; a candidate with more than twice the original ops is dropped. The number of expanded
graphs (``budget``), the expansions without a better graph (``patience``) and the deadline bound
the work. :func:`tvm_taso.search.regions.search_regions` runs it region by region.

The queue starts with the region and, ahead of it, with where steepest descent by single-output
rules takes it (:func:`descend`): cheap local rewrites that enable others (a batch norm folded
into its conv before the conv is merged with its neighbours) are otherwise explored after the
bigger gains found first, which use up the budget (Inception-v3 from PyTorch's frontend, whose
batch norms no exporter has folded).

A merge costlier than ``alpha`` allows is looked one step past (:func:`_follow_ups`): merged
branches may pay only once the elementwise ops on their parts run once on the merged value,
which a search that drops the merge never reaches.
"""

from __future__ import annotations

import heapq
import time

from tvm_taso.cost.model import CostModel
from tvm_taso.ir import ops
from tvm_taso.ir.graph import LEAVES, Graph, weight_only
from tvm_taso.rewrite import match
from tvm_taso.rewrite.rule import Rule
from tvm_taso.search.options import SearchOptions
from tvm_taso.search.regions import Found
from tvm_taso.search.stats import SearchStats, Stop


class Backtrack:
    """TASO's backtracking as the :class:`~tvm_taso.search.regions.RegionSearch` of every region."""

    def __init__(self, rules: list[Rule], cost: CostModel, options: SearchOptions):
        self.rules, self.cost, self.options = rules, cost, options

    def __call__(self, sub: Graph, deadline: float, stats: SearchStats) -> Found:
        o = self.options
        return search_region(sub, self.rules, self.cost, deadline, stats, alpha=o.alpha, budget=o.budget,
                             patience=o.patience)


def search_region(g: Graph, rules: list[Rule], cost: CostModel, deadline: float, stats: SearchStats, *,
                  alpha: float, budget: int, patience: int) -> Found:
    """Best-first search on one graph; returns (best graph, its cost, rules applied). Stops after
    ``budget`` expansions, at ``deadline``, or after ``patience`` expansions without a better
    graph (the queue then holds only graphs of equal cost going round in circles), or when the
    queue is empty; ``stats.stopped`` counts which."""
    start_cost = cost.cost(g)
    best, best_cost, best_path = g, start_cost, ()
    max_ops = 2 * runtime_ops(g)
    seen = {g.structural_hash()}
    queue = [(start_cost, 0, g, ())]
    tie = 1
    low, low_cost, low_path = descend(g, rules, cost, deadline, max_ops, stats)
    if low_path and low.structural_hash() not in seen:
        seen.add(low.structural_hash())
        if low_cost < best_cost:
            stats.curve.append((time.perf_counter(), low_cost - best_cost))
            best, best_cost, best_path = low, low_cost, low_path
        # expanded first: what it enables is what the budget is for
        heapq.heappush(queue, (min(low_cost, start_cost), -1, low, low_path))
    epilogues = [rule for rule in rules if all(_elementwise(op) for op in rule.root_ops)]
    expanded = last_better = 0
    stop = Stop.QUEUE_EMPTY
    while queue:
        if expanded >= budget:
            stop = Stop.BUDGET
            break
        if expanded - last_better >= patience:
            stop = Stop.PATIENCE
            break
        if time.perf_counter() > deadline:
            stats.regions_cut_short += 1
            stop = Stop.DEADLINE
            break
        c, _, cur, path = heapq.heappop(queue)
        expanded += 1
        found, merges = [], []
        for rule, new in neighbours(cur, rules, max_ops):
            if _first_sight(new, seen, stats):
                found.append((new, cost.cost(new), path + (rule.name,)))
                if len(rule.src) > 1:
                    merges.append(len(found) - 1)
        lowest = min([best_cost] + [c for _, c, _ in found])
        for k in merges:
            merged, merged_cost, merged_path = found[k]
            if merged_cost >= alpha * lowest:
                # a merge may pay only once the elementwise ops on its parts run once on the
                # whole; looked for after every one-step graph is seen, so that a graph one rule
                # reaches keeps that one rule as its path
                found += _follow_ups(cur, merged, epilogues, cost, max_ops=max_ops, seen=seen, stats=stats,
                                     path=merged_path)
        for graph, graph_cost, graph_path in found:
            if graph_cost < best_cost:
                stats.curve.append((time.perf_counter(), graph_cost - best_cost))
                best, best_cost, best_path = graph, graph_cost, graph_path
                last_better = expanded
            if graph_cost < alpha * best_cost:
                heapq.heappush(queue, (graph_cost, tie, graph, graph_path))
                tie += 1
    stats.expanded += expanded
    stats.stop(stop)
    return Found(best, best_cost, best_path)


def neighbours(g: Graph, rules: list[Rule], max_ops: int):
    """(rule, graph) for every application of ``rules`` at every site of ``g`` that leaves at
    most ``max_ops`` runtime ops."""
    by_op = match.index_by_op(g)
    for rule in rules:
        if any(op not in by_op for op in rule.root_ops):
            continue
        for site in match.find_matches(g, rule, by_op):
            new = match.apply(g, site)
            if new is not None and runtime_ops(new) <= max_ops:
                yield rule, new


def _follow_ups(before: Graph, merged: Graph, epilogues: list[Rule], cost: CostModel, *, max_ops: int, seen: set,
                stats: SearchStats, path: tuple) -> list[tuple[Graph, float, tuple]]:
    """(graph, cost, path) for each graph one rule away from ``merged`` (a merge too costly to
    keep, made from ``before``) that moves elementwise ops reading what the merge made onto its
    merged value: a rule of ``epilogues`` (those whose roots are all elementwise ops) at roots
    that read a node the merge made, leaving fewer runtime ops (a relu on each half of the
    merge's split run once before it). Graphs seen before are skipped, the others priced and
    added to ``seen``."""
    made = set(merged.nodes) - set(before.nodes)
    near: dict[str, list[int]] = {}
    for nid in sorted(merged.nodes):
        node = merged.nodes[nid]
        if _elementwise(node.op) and any(src in made for src, _ in node.inputs):
            near.setdefault(node.op, []).append(nid)
    if not near:
        return []
    # every op of the graph is a key (a rule's inner patterns may name it); roots come from near
    by_op = dict.fromkeys({node.op for node in merged.nodes.values()}, ()) | near
    fewer = min(runtime_ops(merged) - 1, max_ops)
    out = []
    for rule in epilogues:
        if any(op not in near for op in rule.root_ops):
            continue
        for site in match.find_matches(merged, rule, by_op):
            new = match.apply(merged, site)
            if new is not None and runtime_ops(new) <= fewer and _first_sight(new, seen, stats):
                out.append((new, cost.cost(new), path + (rule.name,)))
    return out


def _elementwise(op: str) -> bool:
    return op in ops.OPS and ops.OPS[op].kind == ops.ELEMWISE


def _first_sight(g: Graph, seen: set, stats: SearchStats) -> bool:
    """Whether ``g`` is a graph not ``seen`` before (it is now, and counts as a candidate)."""
    h = g.structural_hash()
    if h in seen:
        return False
    seen.add(h)
    stats.candidates += 1
    return True


def descend(g: Graph, rules: list[Rule], cost: CostModel, deadline: float, max_ops: int,
            stats: SearchStats) -> tuple[Graph, float, tuple]:
    """(graph, cost, rules applied) where steepest descent from ``g`` by single-output rules
    ends. A step lowers the cost, or removes an op that is not elementwise (:func:`heavy_ops`)
    at a cost within :data:`TIE` of ``g``'s: a batch norm folded into its conv costs about the
    same when a concat follows, yet the merges that pay need it folded. No graph is visited
    twice; ``deadline`` bounds it; every graph priced counts in ``stats.candidates``."""
    start_cost = cost.cost(g)
    cur, cur_cost, cur_heavy, path = g, start_cost, heavy_ops(g), ()
    visited = {g.structural_hash()}
    single = [rule for rule in rules if len(rule.src) == 1]
    while time.perf_counter() < deadline:
        step = None
        for rule, new in neighbours(cur, single, max_ops):
            if new.structural_hash() in visited:
                continue
            stats.candidates += 1
            key = (cost.cost(new), heavy_ops(new))
            lower = key[0] < cur_cost or (key[0] <= start_cost * (1 + TIE) and key[1] < cur_heavy)
            if lower and (step is None or key < step[0]):
                step = (key, new, rule.name)
        if step is None:
            break
        (cur_cost, cur_heavy), cur, path = step[0], step[1], path + (step[2],)
        visited.add(cur.structural_hash())
    return cur, cur_cost, path


TIE = 1e-3  # how much costlier than the start descent's removal of a heavy op may leave the graph


def heavy_ops(g: Graph) -> int:
    """Runtime ops that are not elementwise (elementwise ones fuse into a neighbour's kernel)."""
    folded = weight_only(g)
    return sum(1 for nid, n in g.nodes.items()
               if nid not in folded and n.op not in LEAVES and n.op != "opaque" and ops.OPS[n.op].kind != ops.ELEMWISE)


def runtime_ops(g: Graph) -> int:
    """Ops left after weight folding (what "twice the ops" is measured in)."""
    return sum(1 for nid in set(g.nodes) - weight_only(g) if g.nodes[nid].op not in LEAVES)
