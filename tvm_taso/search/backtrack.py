"""Cost-based backtracking search (TASO's Algorithm 2), run region by region.

``search(graph, rules, cost)`` splits the graph into regions of about ``region_size`` ops
(consecutive in topological order, cut alike in repeated layers; then a second pass on windows
straddling each boundary, so that rewrites across one are found), and in each region runs a
best-first search: pop the cheapest graph, apply every rule at every site, keep a new graph if
its cost is below ``alpha`` times the best so far. Graphs are deduplicated by structural hash; a
candidate with a cycle or more than twice the original ops is dropped. Both the number of
expanded graphs per region (``budget``) and the wall clock (``time_limit``) bound the work.
"""

from __future__ import annotations

import gc
import heapq
import logging
import time
from collections import Counter
from contextlib import contextmanager
from dataclasses import dataclass, field

from tvm_taso.rewrite import match
from tvm_taso.cost.model import CostModel
from tvm_taso.ir.graph import LEAVES, CycleError, Graph, Ref, fold_constants, weight_only
from tvm_taso.ir.ops import OpError
from tvm_taso.rewrite.rule import Rule

log = logging.getLogger(__name__)


@dataclass
class SearchStats:
    expanded: int = 0
    candidates: int = 0
    regions: int = 0
    regions_cut_short: int = 0
    reused: int = 0  # regions that took the result of an identical region
    folded: int = 0  # weight expressions folded to constants between regions
    stopped: Counter = field(default_factory=Counter)  # why each region's search ended
    engines: Counter = field(default_factory=Counter)  # regions searched by each search (eqsat, auto)
    egraph_nodes: int = 0  # largest e-graph of a region (e-nodes, e-classes)
    egraph_classes: int = 0
    extraction_seconds: float = 0.0
    refined: int = 0  # eqsat regions whose extracted graph a few backtracking steps improved
    seconds: float = 0.0  # in the search proper: regions searched and spliced, weights folded between them
    extraction_methods: Counter = field(default_factory=Counter)  # which extraction candidate won
    decisions: list = field(default_factory=list)  # a judge's verdict on each rewritten region
    dropped: list = field(default_factory=list)  # rewritten regions that could not be spliced back

    def absorb(self, other: "SearchStats", kept: bool) -> None:
        """Add ``other``'s work; its results (rules, curve, rewrites) only if they were ``kept``."""
        self.expanded += other.expanded
        self.candidates += other.candidates
        self.regions += other.regions
        self.regions_cut_short += other.regions_cut_short
        self.reused += other.reused
        self.stopped.update(other.stopped)
        self.engines.update(other.engines)
        self.egraph_nodes = max(self.egraph_nodes, other.egraph_nodes)
        self.egraph_classes = max(self.egraph_classes, other.egraph_classes)
        self.extraction_seconds += other.extraction_seconds
        self.seconds += other.seconds
        self.refined += other.refined
        self.extraction_methods.update(other.extraction_methods)
        self.decisions.extend(other.decisions)
        self.dropped.extend(other.dropped)
        if kept:
            self.folded += other.folded
            self.applied.update(other.applied)
            self.curve.extend(other.curve)
            self.rewrites.extend(other.rewrites)
    applied: Counter = field(default_factory=Counter)
    curve: list = field(default_factory=list)  # (perf_counter time, change of the best cost)
    rewrites: list = field(default_factory=list)  # one entry per region that changed


def search_region(
    g: Graph,
    rules: list[Rule],
    cost: CostModel,
    alpha: float,
    budget: int,
    deadline: float,
    stats: SearchStats,
    patience: int = 64,
) -> tuple[Graph, float, tuple[str, ...]]:
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
    expanded = last_better = 0
    stop = "queue empty"
    while queue:
        if expanded >= budget:
            stop = "budget"
            break
        if expanded - last_better >= patience:
            stop = "patience"
            break
        if time.perf_counter() > deadline:
            stats.regions_cut_short += 1
            stop = "deadline"
            break
        c, _, cur, path = heapq.heappop(queue)
        expanded += 1
        by_op = match.index_by_op(cur)
        for rule in rules:
            if any(op not in by_op for op in rule.root_ops):
                continue
            for site in match.find_matches(cur, rule, by_op):
                new = match.apply(cur, site)
                if new is None or runtime_ops(new) > max_ops:
                    continue
                h = new.structural_hash()
                if h in seen:
                    continue
                seen.add(h)
                stats.candidates += 1
                new_cost = cost.cost(new)
                new_path = path + (rule.name,)
                if new_cost < best_cost:
                    stats.curve.append((time.perf_counter(), new_cost - best_cost))
                    best, best_cost, best_path = new, new_cost, new_path
                    last_better = expanded
                if new_cost < alpha * best_cost:
                    heapq.heappush(queue, (new_cost, tie, new, new_path))
                    tie += 1
    stats.expanded += expanded
    stats.stopped[stop] += 1
    return best, best_cost, best_path


def _transplant(best: Graph, sub: Graph, leaves: list[int]) -> Graph:
    """``best`` (found for a region shaped like ``sub``) reading ``sub``'s leaves instead."""
    new = best.copy()
    for nid in leaves:
        if nid in new.nodes:
            new.nodes[nid] = sub.nodes[nid]
    new._derived = {}
    return new


def runtime_ops(g: Graph) -> int:
    """Ops left after weight folding (what "twice the ops" is measured in)."""
    return sum(1 for nid in set(g.nodes) - weight_only(g) if g.nodes[nid].op not in LEAVES)


def regions(g: Graph, size: int, straddle: bool = False) -> list[list[int]]:
    """Known-op node ids split into regions of at most ``size`` ops, consecutive in topological
    order, so that repeated layers give identically shaped regions (searched once,
    :func:`search`): regions end at narrow points (:func:`_stretches`), and a region that would
    overflow ends where a copy of an earlier region begins (else before the last stretch shaped
    like one that began a region), not wherever it is full, so that the copies of a layer longer
    than a region are cut alike instead of each at another op. With ``straddle``, the windows
    of a second pass instead: the back half of each region with the front half of the next,
    across every boundary."""
    ids = [nid for nid in g.topo_order() if g.nodes[nid].op not in LEAVES and g.nodes[nid].op != "opaque"]
    position = {nid: k for k, nid in enumerate(ids)}
    stretches = _stretches(g, ids, position, size)
    shapes = [_stretch_shape(g, part, position) for part in stretches]
    out: list[list[int]] = []
    begun: dict = {}  # shape of a region's first stretch -> the stretch shapes of the regions it began
    start = 0
    while start < len(stretches):
        ops, end = 0, start
        while end < len(stretches) and (end == start or ops + len(stretches[end]) <= size):
            ops += len(stretches[end])
            end += 1
        if end < len(stretches):
            latest_first = range(end, start, -1)
            copy = next((k for k in latest_first for seen in begun.get(shapes[k], ())
                         if tuple(shapes[k : k + len(seen)]) == seen), None)
            end = copy or next((k for k in latest_first if shapes[k] in begun), end)
        begun.setdefault(shapes[start], set()).add(tuple(shapes[start:end]))
        out.append([nid for part in stretches[start:end] for nid in part])
        start = end
    if straddle:
        out = [a[len(a) // 2 :] + b[: len(b) // 2] for a, b in zip(out, out[1:])]
    rank = {nid: k for k, nid in enumerate(g.topo_order())}
    return [piece for window in out for piece in _convex_pieces(g, window, rank)]


def _convex_pieces(g: Graph, window: list[int], rank: dict[int, int]) -> list[list[int]]:
    """``window`` (known ops in topological order) as convex pieces: an op that reads, through
    nodes outside the piece (opaque ones, or ops left for a later piece), a value the piece
    made is left for the next piece, and so on. A region must be convex: a rewrite may merge any
    of its ops, and a merged op that feeds an outside node that feeds the region again closes a
    cycle (an opaque max-pool between two branches of an Inception block, a shape computation
    between a conv and the Slice after it). Ops are deferred, not cut at: the Q, K and V
    projections stay in one piece when an opaque reshape follows each.
    ``rank``: each node's index in the graph's topological order."""
    in_window = set(window)
    users = g.users()
    pieces: list[list[int]] = []
    rest = window
    while rest:
        last = rank[rest[-1]]
        piece, deferred = [], []
        downstream: set[int] = set()  # nodes outside the piece that depend on it

        def reach(nid: int) -> None:
            stack = [u for u in users[nid] if u not in in_window]
            while stack:
                u = stack.pop()
                if u in downstream or rank[u] > last:
                    continue  # nothing after the window's last op can feed it
                downstream.add(u)
                stack.extend(v for v in users[u] if v not in in_window)

        for nid in rest:
            if any(src in downstream for src, _ in g.nodes[nid].inputs):
                deferred.append(nid)
                downstream.add(nid)
            else:
                piece.append(nid)
            reach(nid)
        pieces.append(piece)
        rest = deferred
    return pieces


def _stretch_shape(g: Graph, part: list[int], position: dict[int, int]) -> tuple:
    """What a run of ops computes, up to which tensors it reads: ops, attributes, types, and
    for each operand how many ops back (in topological order) it was made, or for an operand
    from outside the ops, its kind and type (the Q, K and V matmuls of one input differ in
    how far back it is)."""
    shape = []
    for nid in part:
        node = g.nodes[nid]
        reads = tuple((position[nid] - position[src], i) if src in position
                      else (g.nodes[src].op, g.nodes[src].types[i] if i >= 0 else None) for src, i in node.inputs)
        shape.append((node.op, node.attrs, node.types, reads))
    return tuple(shape)


def _stretches(g: Graph, ids: list[int], position: dict[int, int], size: int) -> list[list[int]]:
    """``ids`` cut at narrow points: after every position where one non-constant value is live
    (between layers); a stretch longer than ``size`` is cut again where the fewest values are
    live within it (between the cells of an RNN, whose state is two values), and so on, so that
    each copy of a repeated layer is cut at the same ops. ``position``: each id's index in ``ids``."""
    folded = weight_only(g)
    last_use: dict[Ref, int] = {}
    for nid in ids:
        for ref in g.nodes[nid].inputs:
            if ref[0] in position and ref[0] not in folded:
                last_use[ref] = max(last_use.get(ref, -1), position[nid])
    end = len(ids)
    for ref in g.outputs:
        if ref[0] in position:
            last_use[ref] = end
    for nid, n in g.nodes.items():  # values read by opaque nodes stay live to the end
        if n.op == "opaque":
            for ref in n.inputs:
                if ref[0] in position:
                    last_use[ref] = end
    opened = [0] * (end + 1)
    for ref, last in last_use.items():
        opened[position[ref[0]]] += 1
        opened[last] -= 1
    live, count = [], 0  # values live after each position
    for k in range(end):
        count += opened[k]
        live.append(count)

    def split(lo: int, hi: int, narrow: int | None = None) -> list[list[int]]:
        """``ids[lo:hi]`` cut after each position where ``narrow`` values are live (by default
        the fewest live within, when longer than ``size``), pieces longer than ``size`` cut again."""
        if narrow is None:
            if hi - lo <= size:
                return [ids[lo:hi]]
            narrow = min(live[lo : hi - 1])
        cuts = [k + 1 for k in range(lo, hi - 1) if live[k] == narrow]
        if not cuts:
            return split(lo, hi) if hi - lo > size else [ids[lo:hi]]
        bounds = [lo, *cuts, hi]
        return [part for a, b in zip(bounds, bounds[1:]) for part in split(a, b)]

    return split(0, end, narrow=1) if end else []


@dataclass
class Region:
    """A region cut out of a graph: ``sub``, its ops with leaves for what it reads; the outer ref
    each leaf stands for (``leaf_of``), the outer refs its outputs stand for (``outs``), and the
    outer node each of its ops was (``origin``)."""

    sub: Graph
    leaf_of: dict[int, Ref]
    outs: list[Ref]
    origin: dict[int, int]


def extract(g: Graph, ids: list[int]) -> Region:
    """The region of ``ids`` (in topological order) cut out of ``g``."""
    members = set(ids)
    sub = Graph()
    local: dict[Ref, Ref] = {}
    leaf_of: dict[int, Ref] = {}
    origin: dict[int, int] = {}
    for nid in ids:
        node = g.nodes[nid]
        inputs = []
        for ref in node.inputs:
            if ref[0] not in members and ref not in local:
                outer = g.nodes[ref[0]]
                if outer.op == "const":
                    lid = sub.add_leaf("const", outer.types[0], outer.payload, key=ref)
                else:
                    lid = sub.add_leaf("input", g.type_of(ref), None, key=ref)
                local[ref] = (lid, 0)
                leaf_of[lid] = ref
            inputs.append(local[ref])
        new = sub.add(node.op, inputs, node.attr, origin=node.payload)
        origin.setdefault(new, nid)
        for i in range(len(node.types)):
            local[(nid, i)] = (new, i)
        local[(nid, -1)] = (new, -1)
    users = g.users()
    outs: list[Ref] = []
    wanted = set(g.outputs)
    for nid in ids:
        for u in users[nid]:
            if u not in members:
                outs.extend(r for r in g.nodes[u].inputs if r[0] == nid)
        outs.extend(r for r in wanted if r[0] == nid)
    outs = list(dict.fromkeys(outs))
    sub.outputs = [local[r] for r in outs]
    return Region(sub, leaf_of, outs, origin)


def splice(g: Graph, region: Region, best: Graph) -> Graph:
    """``g`` with ``region`` replaced by ``best`` (a rewrite of its ``sub``). An op of ``best``
    that is an op of the region (the same id, op and attributes; its operands may have been
    replaced by equal values) stays the outer node it was, rewired: the nodes no rewrite
    replaced keep their identity, so a writer can give them back verbatim."""
    new = g.copy()
    outer: dict[Ref, Ref] = {}
    placed: set[int] = set()
    for nid in best.topo_order():
        node = best.nodes[nid]
        if node.op in LEAVES and nid in region.leaf_of:
            outer[(nid, 0)] = region.leaf_of[nid]
            continue
        if node.op == "const":
            cid = new.add_leaf("const", node.types[0], node.payload, key=("spliced", new._next))
            outer[(nid, 0)] = (cid, 0)
            continue
        inputs = [outer[r] for r in node.inputs]
        was = region.origin.get(nid)
        if was is not None and was not in placed and was in new.nodes and \
                (new.nodes[was].op, new.nodes[was].attrs) == (node.op, node.attrs):
            new.rewire(was, tuple(inputs))
            nn = was
        else:
            nn = new.add(node.op, inputs, node.attr, origin=node.payload)
        placed.add(nn)
        for i in range(len(node.types)):
            outer[(nid, i)] = (nn, i)
        outer[(nid, -1)] = (nn, -1)
    mapping = {o: outer[s] for o, s in zip(region.outs, best.outputs) if o != outer[s]}
    new.replace_uses(mapping)
    new.prune()
    return new


def _splice_checked(g: Graph, region: Region, best: Graph, stats: SearchStats, path: tuple[str, ...],
                    accept=None) -> Graph | None:
    """:func:`splice` with the weights folded, or None with one warning naming the region and its
    rules when the result is not a DAG, does not type-check (each output the region stood for
    keeps its type), folds a weight that does not fit its dtype, or is refused by
    ``accept(graph)`` (a writer that raises when it cannot write the graph back): the region is
    left as it was and the rest of the graph is still optimized."""
    try:
        new = splice(g, region, best)
        new.topo_order()
        changed = [(o, g.nodes[o[0]].types[o[1]], best.type_of(s))
                   for o, s in zip(region.outs, best.outputs) if o[1] >= 0]
        wrong = [o for o, want, got in changed if want != got]
        if wrong:
            raise OpError(f"the value {wrong[0]} would change type")
        # weights the rewrite combined become constants now, so later regions see them as
        # weights (free, foldable) rather than as runtime inputs; one that does not fit its
        # dtype (an fp16 weight scaled past 65504) makes the rewrite wrong
        folded = fold_constants(new, {nid for nid, node in new.nodes.items() if g.nodes.get(nid) is not node})
        if accept is not None:
            try:
                accept(new)
            except Exception as err:  # noqa: BLE001 - whatever stops the writer stops the region
                raise OpError(f"cannot be written back ({type(err).__name__}: {err})") from None
    except (CycleError, OpError) as err:
        rules = list(dict.fromkeys(path))
        log.warning("region %d: rewrite by %s dropped (%s); the region is left as it was",
                    stats.regions, ", ".join(rules), err)
        stats.dropped.append({"region": stats.regions, "rules": rules, "reason": str(err)})
        return None
    stats.folded += folded
    return new


@contextmanager
def _collector_paused():
    """CPython's cyclic garbage collector off while one region is searched. The searches
    allocate millions of small tuples, dicts and lists, freed by reference counting, while
    e-graphs, kernel memos and candidate graphs stay live, and each collection pass walks
    those (measured, medians of 3 alternating runs: full VGG-19's eqsat 0.53 -> 0.41 s, the
    other benchmark models within noise). Cycles made in a region are collected once the
    collector is back on."""
    enabled = gc.isenabled()
    gc.disable()
    try:
        yield
    finally:
        if enabled:
            gc.enable()


def search(
    g: Graph,
    rules: list[Rule],
    cost: CostModel,
    alpha: float = 1.05,
    budget: int = 200,
    time_limit: float = 60.0,
    region_size: int = 32,
    stats: SearchStats | None = None,
    progress=None,
    patience: int = 64,
    region_search=None,
    min_gain: float = 1e-6,
    judge=None,
    accept=None,
) -> Graph:
    """Optimize ``g`` region by region; see the module docstring. A region shaped like one
    already searched (a repeated layer: same ops, attributes and types, other weights) reuses
    that search's result instead of searching again. ``region_search(sub, deadline, stats)``
    searches one region instead of :func:`search_region` (equality saturation,
    :mod:`tvm_taso.search.eqsat`). ``judge(original, rewritten) -> dict`` has the last word on
    each region's rewrite (``"kept"``; :class:`tvm_taso.guard.RegionGuard` times both): its
    verdicts go to ``stats.decisions``. ``accept(graph)``, when given, is called on the graph
    after each region's rewrite and raises if it cannot be written back: that region is dropped."""
    stats = stats if stats is not None else SearchStats()
    started = time.perf_counter()
    solved: dict[str, tuple[Graph, float, tuple[str, ...], list[int]]] = {}
    deadline = time.perf_counter() + time_limit
    current = cost.cost(g)
    for straddle in (False, True):
        windows = regions(g, region_size, straddle)
        for k, ids in enumerate(windows):
            now = time.perf_counter()
            if now > deadline:
                stats.regions_cut_short += len(windows) - k
                stats.stopped["deadline (not searched)"] += len(windows) - k
                break
            passes_left = 1 if straddle else 2
            region_deadline = now + (deadline - now) / (len(windows) - k) / passes_left
            live = [nid for nid in ids if nid in g.nodes]
            if not live:
                continue
            region = extract(g, live)
            sub = region.sub
            stats.regions += 1
            start_cost = cost.cost(sub)
            key = sub.shape_hash()
            leaves = sorted(nid for nid, n in sub.nodes.items() if n.op in LEAVES)
            if key in solved and solved[key][3] == leaves:
                best, best_cost, path = _transplant(solved[key][0], sub, leaves), solved[key][1], solved[key][2]
                stats.reused += 1
                stats.stopped["reused an identical region"] += 1
                stats.curve.append((time.perf_counter(), best_cost - start_cost))
            else:
                with _collector_paused():
                    if region_search is not None:
                        best, best_cost, path = region_search(sub, region_deadline, stats)
                    else:
                        best, best_cost, path = search_region(
                            sub, rules, cost, alpha, budget, region_deadline, stats, patience
                        )
                solved[key] = (best, best_cost, path, leaves)
            rewritten = bool(path) and best_cost < start_cost * (1.0 - min_gain)  # float rounding is no gain
            if rewritten and judge is not None:
                verdict = judge(sub, best)
                stats.decisions.append({"region": stats.regions, "rules": list(path), "cost_before": start_cost,
                                        "cost_after": best_cost, **verdict})
                rewritten = verdict["kept"]
                if not rewritten:  # the region's gain is on the curve already: take it back
                    stats.curve.append((time.perf_counter(), start_cost - best_cost))
            if rewritten:
                spliced = _splice_checked(g, region, best, stats, path, accept)
                rewritten = spliced is not None
            if rewritten:
                stats.rewrites.append(
                    {
                        "region": stats.regions,
                        "rules": list(path),
                        "cost_before": start_cost,
                        "cost_after": best_cost,
                        "before": sub.describe(),
                        "after": best.describe(),
                    }
                )
                g = spliced
                stats.applied.update(path)
                new_cost = cost.cost(g)
                # the region's own gain is on the curve already; add what fusion across its
                # boundary changed, so the curve ends at the graph's cost
                stats.curve.append((time.perf_counter(), (new_cost - current) - (best_cost - start_cost)))
                current = new_cost
            if progress is not None:
                progress()
    stats.seconds += time.perf_counter() - started
    return g
