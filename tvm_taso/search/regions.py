"""The region driver: a graph searched region by region, whichever search runs in each.

:func:`search_regions` splits the graph into regions of about ``region_size`` ops (consecutive
in topological order, convex, cut alike in repeated layers; then a second pass on windows
straddling each boundary, so that rewrites across one are found), searches each with a
:class:`RegionSearch` (TASO's backtracking, :class:`tvm_taso.search.backtrack.Backtrack`, or
equality saturation, :class:`tvm_taso.search.eqsat.EqsatRegion`), and splices each cheaper
result back when the whole graph gets cheaper too (a rewrite can win in its region and lose a
fusion across its boundary). The two passes are one sweep; the graph is swept again, up to
``options.sweeps`` times, while a sweep lowers its cost: the rewritten graph is smaller, so its
regions each cover more of the model and reach merges that two regions split (NasRNN's matmuls
sharing an input, across cells). A region shaped like one already searched (a repeated layer:
same ops, attributes and types, other weights) takes that search's result instead of being
searched again. With a :class:`~tvm_taso.search.pool.RegionPool`, each pass's regions are
searched ahead in worker processes and settled in order, with the serial run's result; a region
no worker has started when its turn comes is searched here.
"""

from __future__ import annotations

import dataclasses
import gc
import logging
import time
from contextlib import contextmanager
from dataclasses import dataclass
from typing import Callable, NamedTuple, Protocol

from tvm_taso.cost.model import CostModel, no_size_costlier
from tvm_taso.ir.graph import LEAVES, CycleError, Graph, Ref, fold_constants, weight_only
from tvm_taso.ir.ops import OpError
from tvm_taso.search.options import SearchOptions
from tvm_taso.search.stats import SearchStats, Stop

log = logging.getLogger(__name__)


class Found(NamedTuple):
    """A region search's answer: the best graph, its cost and the rules that made it (none: the
    region as it was)."""

    graph: Graph
    cost: float
    rules: tuple[str, ...]


class RegionSearch(Protocol):
    """A search of one region: ``sub`` (its ops, with leaves for what it reads) searched until
    ``deadline`` (a ``time.perf_counter()`` value), its work counted in ``stats``."""

    def __call__(self, sub: Graph, deadline: float, stats: SearchStats) -> Found: ...


# judge(original, rewritten) -> {"kept": bool, ...}: the last word on a region's rewrite
Judge = Callable[[Graph, Graph], dict]


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
    """The region of ``ids`` (in topological order) cut out of ``g``. A weight expression it
    reads from outside comes with it, as the ops on constants it is (PyTorch's frontend writes a
    transpose of every ``Linear``'s weight, which topological order may put in an earlier
    region): the region sees a weight, free and foldable, not a runtime input."""
    members = set(ids)
    sub = Graph(g.sizes)
    local: dict[Ref, Ref] = {}
    leaf_of: dict[int, Ref] = {}
    origin: dict[int, int] = {}
    folded = weight_only(g)

    def copy(nid: int, inputs: list[Ref]) -> None:
        node = g.nodes[nid]
        new = sub.add(node.op, inputs, node.attr, origin=node.payload)
        origin.setdefault(new, nid)
        for i in range(len(node.types)):
            local[(nid, i)] = (new, i)
        local[(nid, -1)] = (new, -1)

    def bring(ref: Ref) -> Ref:
        """``ref`` (outside the region) as the region reads it."""
        if ref in local:
            return local[ref]
        outer = g.nodes[ref[0]]
        if outer.op == "const":
            lid = sub.add_leaf("const", outer.types[0], outer.payload, key=ref)
        elif ref[0] in folded:
            copy(ref[0], [bring(r) for r in outer.inputs])
            return local[ref]
        else:
            lid = sub.add_leaf("input", g.type_of(ref), None, key=ref)
        local[ref] = (lid, 0)
        leaf_of[lid] = ref
        return local[ref]

    for nid in ids:
        copy(nid, [local[ref] if ref[0] in members else bring(ref) for ref in g.nodes[nid].inputs])
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
            cid = new.add_leaf("const", node.types[0], node.payload, key=("spliced", new.next_id))
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
                    accept=None) -> tuple[Graph, int] | None:
    """:func:`splice` with the weights folded (the graph, and how many weight expressions were
    folded), or None with one warning naming the region and its
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
    return new, folded


def _transplant(best: Graph, sub: Graph, leaves: list[int]) -> Graph:
    """``best`` (found for a region shaped like ``sub``) reading ``sub``'s leaves instead."""
    new = best.copy()
    for nid in leaves:
        if nid in new.nodes:
            new.put_leaf(nid, sub.nodes[nid])
    return new


@contextmanager
def collector_paused():
    """CPython's cyclic garbage collector off while one region is searched. The searches
    allocate millions of small tuples, dicts and lists, freed by reference counting, while
    e-graphs, kernel memos and candidate graphs stay live, and each collection pass walks
    those for nothing. Cycles made in a region are collected once the collector is back on."""
    enabled = gc.isenabled()
    gc.disable()
    try:
        yield
    finally:
        if enabled:
            gc.enable()


def search_regions(g: Graph, region_search: RegionSearch, cost: CostModel, options: SearchOptions, *,
                   deadline: float, stats: SearchStats, progress=None, judge: Judge | None = None,
                   accept=None, pool=None) -> Graph:
    """``g`` optimized region by region (see the module docstring) with ``region_search``, until
    ``deadline``. A region's rewrite is kept when it is cheaper by more than ``options.min_gain``,
    the ``judge`` (:class:`tvm_taso.guard.RegionGuard` times both) keeps it (its verdicts go to
    ``stats.decisions``), it splices back (:func:`_splice_checked`; ``accept(graph)``, when
    given, raises for a graph that cannot be written back) and the graph's cost drops (else
    ``stats.costlier_in_graph`` counts it), so the graph returned never costs more than ``g``.
    ``progress()`` is called after each region. ``pool`` (a
    :class:`~tvm_taso.search.pool.RegionPool`) searches each pass's regions ahead in its workers."""
    started = time.perf_counter()
    splicer = _Splicer(g, cost, options.min_gain, stats, judge, accept)
    solved: dict[str, tuple[Found, list[int]]] = {}
    for _ in range(options.sweeps):
        at_start = splicer.current
        for straddle in (False, True):
            _search_pass(splicer, region_search, straddle, size=options.region_size, solved=solved,
                         deadline=deadline, stats=stats, progress=progress, pool=pool)
        stats.sweeps += 1
        # a sweep's rewrites shrink the graph, so the next cuts regions that each cover more of
        # the model: merges and fusions that straddled two regions can land in one
        if splicer.current >= at_start * (1.0 - options.min_gain) or time.perf_counter() > deadline:
            break
    stats.seconds += time.perf_counter() - started
    return splicer.graph


def _search_pass(splicer: _Splicer, region_search: RegionSearch, straddle: bool, *, size: int, solved: dict,
                 deadline: float, stats: SearchStats, progress, pool) -> None:
    """One pass over ``splicer``'s graph: its regions (``straddle``: the windows across their
    boundaries) searched in order, each result settled before the next region is cut."""
    cost = splicer.cost
    windows = regions(splicer.graph, size, straddle)
    ahead = _Ahead(pool, region_search, splicer.graph, windows, solved, deadline, 1 if straddle else 2) \
        if pool is not None and len(windows) > 1 else None
    for k, ids in enumerate(windows):
        if ahead is not None:
            ahead.hand_over(k)
        now = time.perf_counter()
        if now > deadline:
            stats.regions_cut_short += len(windows) - k
            stats.stopped[Stop.NOT_SEARCHED.value] += len(windows) - k
            return
        passes_left = 1 if straddle else 2
        region_deadline = now + (deadline - now) / (len(windows) - k) / passes_left
        live = [nid for nid in ids if nid in splicer.graph.nodes]
        if not live:
            continue
        region = extract(splicer.graph, live)
        sub = region.sub
        stats.regions += 1
        start_cost = cost.cost(sub)
        key = sub.shape_hash()
        leaves = _leaves(sub)
        if key in solved and solved[key][1] == leaves:
            earlier = solved[key][0]
            found = Found(_transplant(earlier.graph, sub, leaves), earlier.cost, earlier.rules)
            stats.reused += 1
            stats.stop(Stop.REUSED)
            stats.curve.append((time.perf_counter(), found.cost - start_cost))
        else:
            found = ahead.take(k, sub, leaves, stats) if ahead is not None else None
            if found is None:
                with collector_paused():
                    found = Found(*region_search(sub, region_deadline, stats))
            solved[key] = (found, leaves)
        splicer.settle(region, found, start_cost)
        if progress is not None:
            progress()


class _Ahead:
    """The regions of one pass, as the graph stood at its start, searched ahead of their turn:
    handed to ``pool``'s workers whenever one is idle (:meth:`hand_over`), and searched here while
    the region whose turn it is still runs in a worker. :meth:`take` is a region's result when its
    turn comes. A region shaped like one already solved or taken up is not searched ahead (it
    takes that one's result)."""

    def __init__(self, pool, region_search: RegionSearch, g: Graph, windows: list[list[int]], solved: dict,
                 deadline: float, passes_left: int):
        self.pool, self.region_search, self.deadline = pool, region_search, deadline
        self.todo: dict[int, Region] = {}  # the regions keep their constants alive: ids stay unique
        seen = {(key, tuple(leaves)) for key, (_, leaves) in solved.items()}
        for k, ids in enumerate(windows):
            region = extract(g, ids)
            shape = (region.sub.shape_hash(), tuple(_leaves(region.sub)))
            if shape not in seen:
                seen.add(shape)
                self.todo[k] = region
        if len(self.todo) < MIN_AHEAD:
            self.todo = {}
        else:
            pool.start()  # once per run; this process searches while the workers start
        # a serial pass's share of the time left for each region, times the processes searching
        self.seconds = max(0.0, deadline - time.perf_counter()) / len(windows) / passes_left * (pool.workers + 1)
        self.handed: dict[int, tuple] = {}  # window -> (content, future, region)
        self.done_here: dict[int, tuple] = {}  # window -> (content, Found, SearchStats)

    def hand_over(self, after: int) -> None:
        """Hand the next regions after window ``after`` to the pool's idle workers (without their
        weights' values, which no search reads)."""
        for k in [k for k in self.todo if k > after][:self.pool.free()]:
            region = self.todo.pop(k)
            future = self.pool.submit(_without_weights(region.sub), self.seconds, self.deadline)
            if future is None:
                return
            self.handed[k] = (_content(region.sub), future, region)

    def take(self, k: int, sub: Graph, leaves: list[int], stats: SearchStats) -> Found | None:
        """The result searched ahead for window ``k`` (``sub``: the region as it is now), or None
        when it was not searched ahead, an earlier splice changed it or the time it was handed
        cut it short (it is then searched in order, with the share of time a serial run gives
        it) or its worker died. While its worker runs, the next region nobody has taken up
        is searched here."""
        self.todo.pop(k, None)
        in_worker = k in self.handed
        if in_worker:
            content, future, _ = self.handed.pop(k)
            while not future.done() and self._search_one_here(k):
                self.hand_over(k)
            done = self.pool.result(future)
        elif k in self.done_here:
            content, *done = self.done_here.pop(k)
        else:
            return None
        if done is None:
            return None
        found, worker_stats = done
        if _content(sub) != content or worker_stats.stopped[Stop.DEADLINE.value]:
            # changed by an earlier splice, or cut short by the share of time it was handed
            # ahead of its turn (in order it may have more): searched again, as a serial run would
            stats.expanded += worker_stats.expanded
            stats.candidates += worker_stats.candidates
            return None
        stats.absorb(worker_stats, kept=True)
        stats.worker_regions += in_worker
        return Found(_transplant(found.graph, sub, leaves), found.cost, found.rules)

    def _search_one_here(self, after: int) -> bool:
        """Search the first region after window ``after`` that nobody has taken up, here; False
        when there is none."""
        k = next((k for k in self.todo if k > after), None)
        if k is None or time.perf_counter() > self.deadline:
            return False
        region = self.todo.pop(k)
        content, here = _content(region.sub), SearchStats()
        with collector_paused():
            found = Found(*self.region_search(region.sub, min(self.deadline, time.perf_counter() + self.seconds),
                                              here))
        self.done_here[k] = (content, found, here)
        return True


def _without_weights(sub: Graph) -> Graph:
    """``sub`` with its constants' values left out: a search reads their types and identities,
    so a worker is sent the region's shapes, not the model's weights."""
    light = sub.copy()
    for nid, node in sub.nodes.items():
        if node.op == "const":
            light.put_leaf(nid, dataclasses.replace(node, payload=None))
    return light


def _leaves(sub: Graph) -> list[int]:
    """A region's leaves in id order (what reusing a region's result depends on)."""
    return sorted(nid for nid, n in sub.nodes.items() if n.op in LEAVES)


def _content(sub: Graph) -> tuple:
    """What a region's search depends on: its ops, attributes and types, which leaves it reads in
    which order, and which constants (the same objects)."""
    leaves = _leaves(sub)
    return (sub.shape_hash(), tuple(leaves),
            tuple(id(sub.nodes[nid].payload) for nid in leaves if sub.nodes[nid].op == "const"))


# a graph's cost computed twice after different splices can differ in the last bits
FLOAT_NOISE = 1e-12

MIN_AHEAD = 8  # distinct regions a pass must have for the pool to search them: fewer do not pay for its start


class _Splicer:
    """The graph being optimized, and the decision on each region's rewrite (see
    :func:`search_regions`): kept or not, spliced, counted."""

    def __init__(self, g: Graph, cost: CostModel, min_gain: float, stats: SearchStats, judge: Judge | None, accept):
        self.graph, self.cost, self.min_gain, self.stats = g, cost, min_gain, stats
        self.judge, self.accept = judge, accept
        self.current, self.current_at = cost.cost(g), cost.costs_at(g)
        # rewrites the judge dropped or that could not be spliced, by region content and rewrite:
        # a later sweep meeting the region unchanged does not judge or warn again
        self.left_out: set = set()

    def settle(self, region: Region, found: Found, start_cost: float) -> None:
        best, best_cost, path = found
        stats = self.stats
        rewritten = bool(path) and best_cost < start_cost * (1.0 - self.min_gain)  # float rounding is no gain
        if not rewritten:
            return
        seen = (_content(region.sub), best.structural_hash())
        if seen in self.left_out:
            stats.curve.append((time.perf_counter(), start_cost - best_cost))
            return
        if self.judge is not None:
            verdict = self.judge(region.sub, best)
            stats.decisions.append({"region": stats.regions, "rules": list(path), "cost_before": start_cost,
                                    "cost_after": best_cost, **verdict})
            if not verdict["kept"]:  # the region's gain is on the curve already: take it back
                self.left_out.add(seen)
                stats.curve.append((time.perf_counter(), start_cost - best_cost))
                return
        spliced = _splice_checked(self.graph, region, best, stats, path, self.accept)
        if spliced is None:
            self.left_out.add(seen)
            return
        graph, folded = spliced
        new_cost, new_at = self.cost.cost(graph), self.cost.costs_at(graph)
        if new_cost >= self.current * (1.0 - FLOAT_NOISE) or not no_size_costlier(new_at, self.current_at):
            # cheaper in its region, not in the graph: it breaks a fusion across the boundary
            # (a kernel the region ended in that the next op joined), so it is no gain; or,
            # with symbolic sizes, it is costlier at one of the sizes priced
            stats.costlier_in_graph += 1
            stats.curve.append((time.perf_counter(), start_cost - best_cost))
            log.debug("region %d: rewrite by %s left out: %.4f in its region, %.4f -> %.4f in the graph",
                      stats.regions, ", ".join(dict.fromkeys(path)), best_cost - start_cost, self.current, new_cost)
            return
        stats.rewrites.append({"region": stats.regions, "rules": list(path), "cost_before": start_cost,
                               "cost_after": best_cost, "before": region.sub.describe(), "after": best.describe()})
        self.graph = graph
        stats.folded += folded
        stats.applied.update(path)
        # the region's own gain is on the curve already; add what fusion across its boundary
        # changed, so the curve ends at the graph's cost
        stats.curve.append((time.perf_counter(), (new_cost - self.current) - (best_cost - start_cost)))
        self.current, self.current_at = new_cost, new_at
