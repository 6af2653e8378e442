"""Extraction: the cheapest acyclic graph an e-graph represents, under the real cost model.

A graph's cost is fusion-aware (:func:`tvm_taso.cost.model.kernels`), not a sum over e-nodes,
so extraction runs in two steps, and an optional third:

1. candidates from a per-e-node approximation: each e-node priced as a one-op kernel by the
   same :class:`CostModel` (free: leaves, tuple outputs, views and weight-only e-nodes, which are
   folded before codegen; an elementwise e-node at a small share of its kernel, since it
   usually fuses into its producer). Candidates: the input graph's own choices, a greedy
   bottom-up choice (tree cost), and TENSAT's ILP (``scipy.optimize.milp``: pick e-nodes so
   every root and every picked e-node's operand classes are covered, shared classes paid once,
   acyclic through order variables);
2. the candidates priced with the real model, then local improvement of the cheapest: force
   one e-class to another of its e-nodes (what it needs chosen greedily), choose every other
   class greedily with the classes built so far free (so that outputs share what the switch
   built, as a merged multi-output op needs), and keep the switch when the real cost drops;
   repeated until no switch helps, the deadline, or ``tries`` graphs priced in vain. Switches are
   tried cheapest first under the approximation (a part of a merged op sharing the op's price
   with the graph's other values it can give), so the few that pay come early: each try is a
   graph built and priced, and trying them all was most of the search's time on 1,000-e-node
   e-graphs.

3. optionally (``search_tries``), TASO's backtracking search run over the e-graph instead of on
   graphs: from the input graph, a move applies one rule application saturation recorded (its
   target's e-nodes chosen together, what the graph lacks chosen greedily), graphs within alpha
   of the best are expanded cheapest first, each pricing every move that applies. It reaches
   graphs the local improvement cannot, where a step pays only after the next (on NasNet-A,
   whose chained concats fuse into one kernel the per-e-node prices cannot see), without
   matching the rules again.

The ILP is off by default (:class:`tvm_taso.search.options.EqsatLimits`): HiGHS is slow beyond
a few hundred e-nodes, and its per-e-node prices misjudge fusion, so its graph rarely wins. So
is the search over rule applications, which costs more time than it finds gains
(``benchmarks/extraction_search.py`` measures both).
"""

from __future__ import annotations

import heapq
import logging
import math
import time
from dataclasses import dataclass

import numpy as np

from tvm_taso.cost.model import CostModel, Kernel
from tvm_taso.ir import ops
from tvm_taso.ir.graph import LEAVES, Graph
from tvm_taso.search.eqsat.egraph import EGraph, EGraphView

log = logging.getLogger(__name__)

# An elementwise e-node's share of its one-op kernel cost: it usually fuses into its producer.
FUSED_SHARE = 0.1
# Added per chosen e-node so that, of two equally priced choices, the smaller graph wins (and
# the greedy choice is acyclic).
EPSILON = 1e-4
# HiGHS needs seconds for a few hundred e-nodes with the order constraints: larger e-graphs
# get the greedy and local candidates only.
ILP_MAX_ENODES = 300


@dataclass
class Extraction:
    graph: Graph
    cost: float
    rules: tuple  # rules that created the e-nodes the graph uses
    method: str  # which candidate won: "input", "greedy", "ilp"; "+local" when improved; "search"
    seconds: float
    others: tuple = ()  # (graph, cost, rules) of what the other method found, when it differs


class Extractor:
    def __init__(self, eg: EGraph, view: EGraphView, sub: Graph, roots: list[int], cost: CostModel, *,
                 creator: dict, original: dict, kernel_memo: dict, sites: list = ()):
        self.eg, self.view, self.sub = eg, view, sub
        self.roots = [view.find(r) for r in roots]  # the output classes now (after the unions)
        self.cost, self.creator = cost, creator
        # the input graph's e-nodes, named by the classes they are in now (after the unions)
        self.original = {}
        for cid, e in original.items():
            self.original.setdefault(view.find(cid), (e[0], e[1], tuple(view.find(c) for c in e[2])))
        # the input graph's node of each class, where an extracted graph rebuilds it (see build)
        self.node_id = {}
        for cid, nid in eg.node_ids.items():
            self.node_id.setdefault(view.find(cid), nid)
        self.kernel_memo = kernel_memo
        self.weights = self._weight_classes()
        self.node_cost = {(cid, e): self._approx(cid, e) for cid, es in view.classes.items() for e in es}
        # (class, e-node, its price + EPSILON, its operands) of every e-node, class by class: what
        # the greedy choices relax (greedy_given runs once per switch tried); and by operand
        self._enodes = [(cid, e, self.node_cost[(cid, e)] + EPSILON, e[2])
                        for cid, es in view.classes.items() for e in es]
        self._parents: dict = {}
        for entry in self._enodes:
            for ch in set(entry[3]):
                self._parents.setdefault(ch, []).append(entry)
        self._greedy, self._greedy_cost = self.greedy()
        self.rewrites = self._rewrites(sites)

    def _rewrites(self, sites) -> list[dict]:
        """Each recorded rule application's target (:class:`tvm_taso.search.eqsat.ematch.Applier`) as
        choices, class -> e-node, in the final classes; each distinct one once."""
        found: dict[frozenset, dict] = {}
        find, class_of = self.view.find, self.view.class_of
        for enodes in sites:
            choices = {}
            for kind, key, children in enodes:
                e = (kind, key, tuple(find(c) for c in children))
                cid = class_of.get(e)
                if cid is not None and cid not in e[2]:
                    choices[cid] = e
            if choices:
                found.setdefault(frozenset(choices.items()), choices)
        return list(found.values())

    # -- the per-e-node approximation ----------------------------------------------------------
    def _weight_classes(self) -> set[int]:
        """Classes computable from constants alone (folded before codegen)."""
        weights = set()
        changed = True
        while changed:
            changed = False
            for cid, enodes in self.view.classes.items():
                if cid in weights:
                    continue
                for e in enodes:
                    if (e[0] == "leaf" and self.eg.leaves[e[1]][0] == "const") or (
                        e[0] != "leaf" and all(c in weights for c in e[2])
                    ):
                        weights.add(cid)
                        changed = True
                        break
        return weights

    def _approx(self, cid: int, e) -> float:
        if e[0] != "node" or all(c in self.weights for c in e[2]):
            return 0.0
        op, attrs = self.eg.op_keys[e[1]]
        kind = ops.OPS[op].kind
        if kind == ops.VIEW:
            return 0.0
        types = self.view.types
        kernel = Kernel(((op, attrs, tuple(("in", types[c][0]) for c in e[2])),),
                        tuple(t for t in types[cid] if t is not None))
        c = self.kernel_memo.get(kernel)
        if c is None:
            c = self.kernel_memo[kernel] = self.cost.price(kernel, self.sub.sizes)
        return c * FUSED_SHARE if kind == ops.ELEMWISE else c

    # -- candidates ------------------------------------------------------------------------------
    def greedy(self) -> tuple[dict, dict]:
        """Per class, the e-node of least tree cost (bottom-up to a fixed point): (choice, cost)."""
        best = {cid: math.inf for cid in self.view.classes}
        choice: dict = {}
        cost_of = best.__getitem__
        changed = True
        while changed:
            changed = False
            for cid, e, base, children in self._enodes:
                c = base + sum(map(cost_of, children))
                if c < best[cid] - 1e-12:
                    best[cid], choice[cid] = c, e
                    changed = True
        return choice, best

    def greedy_given(self, free: dict) -> tuple[dict, dict]:
        """:meth:`greedy` with the classes of ``free`` (class -> e-node, already built) free
        (choice, cost):
        only their ancestors can get cheaper, so the costs are lowered from there, cheapest
        first (a class is then settled once). Leaf classes are not propagated from: they cost
        the same everywhere, and every class reads some."""
        best = dict(self._greedy_cost)
        choice = dict(self._greedy)
        heap = []
        for cid, e in free.items():
            if self._greedy.get(cid, e)[0] != "leaf":
                heap.append((0.0, cid))
            best[cid], choice[cid] = 0.0, e
        heapq.heapify(heap)
        cost_of = best.__getitem__
        while heap:
            c0, ch = heapq.heappop(heap)
            if c0 > best[ch]:
                continue
            for cid, e, base, children in self._parents.get(ch, ()):
                if cid in free:
                    continue
                c = base + sum(map(cost_of, children))
                if c < best[cid] - 1e-12:
                    best[cid], choice[cid] = c, e
                    heapq.heappush(heap, (c, cid))
        return choice, best

    def ilp(self, deadline: float) -> dict | None:
        """TENSAT's extraction ILP on the approximation, acyclic through an order variable per
        class (a chosen e-node's class comes after its operands'); None if scipy finds no
        solution in time."""
        from scipy.optimize import Bounds, LinearConstraint, milp
        from scipy.sparse import coo_array

        reach, stack = set(), list(self.roots)
        while stack:
            cid = stack.pop()
            if cid not in reach:
                reach.add(cid)
                stack.extend(c for e in self.view.classes[cid] for c in e[2])
        classes = sorted(reach)
        var = [(cid, e) for cid in classes for e in self.view.classes[cid]]
        if len(var) > ILP_MAX_ENODES:
            return None
        order = {cid: len(var) + k for k, cid in enumerate(classes)}  # order variables after the e-nodes
        index = {v: i for i, v in enumerate(var)}
        members = {cid: [index[(cid, e)] for e in self.view.classes[cid]] for cid in classes}
        step = 1.0 / (len(classes) + 1)
        rows, cols, vals, lower = [], [], [], []

        def row(entries, lo):
            r = len(lower)
            for col, val in entries:
                rows.append(r)
                cols.append(col)
                vals.append(val)
            lower.append(lo)

        for cid in dict.fromkeys(self.roots):
            row([(i, 1.0) for i in members[cid]], 1.0)
        for i, (cid, e) in enumerate(var):
            for ch in dict.fromkeys(e[2]):
                row([(j, 1.0) for j in members[ch]] + [(i, -1.0)], 0.0)
                if ch == cid:
                    row([(i, -1.0)], 0.0)  # an e-node reading its own class is never chosen
                else:  # chosen: order[cid] >= order[ch] + step
                    row([(order[cid], 1.0), (order[ch], -1.0), (i, -(1.0 + step))], -1.0)
        n = len(var) + len(classes)
        objective = np.concatenate([[self.node_cost[v] + EPSILON for v in var], np.zeros(len(classes))])
        a = coo_array((vals, (rows, cols)), shape=(len(lower), n)).tocsr()
        left = deadline - time.perf_counter()
        if left <= 0:
            return None
        integrality = np.concatenate([np.ones(len(var)), np.zeros(len(classes))])
        res = milp(objective, constraints=LinearConstraint(a, np.array(lower), np.inf), integrality=integrality,
                   bounds=Bounds(0, 1), options={"time_limit": max(left, 0.01)})
        if res.x is None:
            log.debug("extraction ILP: %s", res.message)
            return None
        choice: dict = {}
        for i in sorted(np.flatnonzero(res.x[: len(var)] > 0.5), key=lambda i: self.node_cost[var[i]]):
            choice.setdefault(var[i][0], var[i][1])
        return choice if self._cycle(choice) is None else None

    def _cycle(self, choice: dict):
        """The (class, e-node) pairs of a cycle the choice closes from the roots, or None."""
        state: dict[int, int] = {}
        path: list[int] = []

        def visit(cid):
            state[cid] = 1
            path.append(cid)
            for ch in choice[cid][2]:
                s = state.get(ch, 0)
                if s == 1:
                    return path[path.index(ch):]
                if s == 0:
                    found = visit(ch)
                    if found:
                        return found
            path.pop()
            state[cid] = 2
            return None

        for r in self.roots:
            if state.get(r, 0) == 0:
                found = visit(r)
                if found:
                    return [(c, choice[c]) for c in found]
        return None

    # -- graphs ------------------------------------------------------------------------------------
    def chosen(self, choice: dict, fallback: dict, roots) -> dict | None:
        """The choices the graph of classes ``roots`` uses (classes ``choice`` lacks take
        ``fallback``'s e-node), operands before their users; None if they close a cycle."""
        used: dict = {}
        on_path: set = set()

        def visit(cid):
            if cid in used:
                return
            if cid in on_path:
                raise _Cycle
            e = choice.get(cid) or fallback.get(cid)
            if e is None:
                raise _Cycle
            on_path.add(cid)
            for c in e[2]:
                visit(c)
            on_path.discard(cid)
            used[cid] = e

        try:
            for root in roots:
                visit(root)
        except (_Cycle, RecursionError):
            return None
        return used

    def build(self, choice: dict, fallback: dict) -> tuple[Graph, dict] | None:
        """The graph of ``choice`` (:meth:`chosen`), with the choices it used; None if they close
        a cycle."""
        used = self.chosen(choice, fallback, self.roots)
        if used is None:
            return None
        g = Graph(self.sub.sizes)
        for nid, node in self.sub.nodes.items():
            if node.op in LEAVES:
                g.put_leaf(nid, node)
        g.continue_numbering(self.sub)
        ref: dict = {}
        eg = self.eg
        for cid, e in used.items():
            inputs = [ref[c] for c in e[2]]
            if e[0] == "leaf":
                op, ty, payload, key, node_id = eg.leaves[e[1]]
                nid = node_id if node_id is not None else g.add_leaf(op, ty, payload, key=key)
                ref[cid] = (nid, 0)
            elif e[0] == "get":
                ref[cid] = (inputs[0][0], e[1])
            else:
                op, attrs = eg.op_keys[e[1]]
                types = self.view.types[cid]  # typed when it was added
                nid = self.node_id.get(cid)
                was = self.sub.nodes.get(nid)
                if was is not None and (was.op, was.attrs) == (op, attrs) and nid not in g.nodes:
                    # the input graph's node of this class (its operands maybe replaced by equal
                    # values) keeps its id, so that splicing keeps it as the node it was
                    nid = g.place(nid, op, tuple(inputs), attrs, types)
                else:
                    nid = g.add_typed(op, tuple(inputs), attrs, types)
                ref[cid] = (nid, -1) if self.view.is_tuple(cid) else (nid, 0)
        g.outputs = [ref[r] for r in self.roots]
        g.prune()
        return g, used

    def run(self, deadline: float, use_ilp: bool = False, tries: int = 96, search_tries: int = 0,
            alpha: float = 1.05) -> Extraction:
        """The cheapest graph found by the deadline (see the module docstring)."""
        t0 = time.perf_counter()
        greedy = self._greedy
        candidates = [("input", self.original), ("greedy", greedy)]
        if use_ilp:
            try:
                found = self.ilp(deadline)
            except (ValueError, MemoryError) as err:  # scipy rejecting a degenerate problem
                log.debug("extraction ILP failed: %s", err)
                found = None
            if found is not None:
                candidates.append(("ilp", found))
        best = start = None
        for method, choice in candidates:
            built = self.build(choice, greedy)
            if built is None:
                continue
            c = self.cost.cost(built[0])
            if method == "input":
                start = (c, *built)  # where the search over rule applications starts
            if best is None or c < best[0] - 1e-9:
                best = (c, method, built[0], built[1])
        if best is None:  # no candidate built (cycles, or ops refusing operands): keep the input
            log.debug("extraction built no candidate; the region stays as it was")
            return Extraction(self.sub, self.cost.cost(self.sub), (), "none", time.perf_counter() - t0)
        c, method, g, used = best
        c2, g2, used2 = self._improve(c, g, used, greedy, deadline, tries)
        if c2 < c - 1e-9:
            c, g, used, method = c2, g2, used2, method + "+local"
        others = ()
        if search_tries and self.rewrites and start is not None:
            c3, g3, used3 = self._search(*start, deadline, search_tries, alpha)
            if c3 < c - 1e-9:
                others = ((g, c, self._rules(used)),)
                c, g, used, method = c3, g3, used3, "search"
            elif used3 != used:
                others = ((g3, c3, self._rules(used3)),)
        return Extraction(g, c, self._rules(used), method, time.perf_counter() - t0, others)

    def _rules(self, used: dict) -> tuple:
        """The rules that made the e-nodes a graph's choices use."""
        return tuple(sorted({self.creator[e] for e in used.values() if e in self.creator}))

    def _improve(self, cost: float, g: Graph, used: dict, greedy: dict, deadline: float, tries: int):
        """Local improvement under the real cost: force one class to another of its e-nodes,
        build what that e-node needs greedily, then choose everything else greedily with the
        classes built so far for free (so outputs can share what the switch built, as merged
        multi-output ops need); keep the first switch that lowers the cost, and repeat. Switches
        are tried in order of what they add under the per-e-node prices (with the graph's
        classes free; a part of a multi-output op shares the op's price with the graph's other
        values it can give), at most ``tries`` since the last switch that paid: each is a graph
        built and priced."""
        tried = set()
        seen = {frozenset(used.items())}  # the graphs built so far, by their choices: each priced once
        improved = True
        left = tries
        while improved and left > 0:
            improved = False
            _, priced = self.greedy_given(used)
            # a part of a multi-output op costs the op once for all the graph's values it can give
            sharers: dict[int, int] = {}
            for cid in used:
                for tup in {e[2][0] for e in self.view.classes[cid] if e[0] == "get"}:
                    sharers[tup] = sharers.get(tup, 0) + 1
            switches = []
            for cid, now in used.items():
                for e in self.view.classes[cid]:
                    if e != now and e[0] != "leaf" and (cid, e) not in tried:
                        added = self.node_cost[(cid, e)] + sum(priced[ch] for ch in e[2])
                        if e[0] == "get":
                            added /= sharers[e[2][0]]
                        switches.append((added - self.node_cost[(cid, now)], cid, e))
            for _, cid, e in sorted(switches, key=lambda s: s[0]):
                if left <= 0 or time.perf_counter() > deadline:
                    return cost, g, used
                left -= 1
                tried.add((cid, e))
                forced = self.chosen({cid: e}, greedy, (cid,))
                if forced is None:
                    continue
                built = self.build(forced, self.greedy_given(forced)[0])
                if built is None:
                    continue
                choices = frozenset(built[1].items())
                if choices in seen:
                    continue
                seen.add(choices)
                c = self.cost.cost(built[0])
                if c < cost - 1e-9:
                    cost, (g, used) = c, built
                    improved, left = True, tries
                    break
        return cost, g, used

    def _search(self, cost: float, g: Graph, used: dict, deadline: float, tries: int, alpha: float):
        """Backtracking over the e-graph (the module docstring's third step) from graph ``used``;
        (cost, graph, choices) of the best found. Stops after ``tries`` graphs priced without a
        cheaper one (each distinct graph is priced once), at the deadline, or when no graph
        within ``alpha`` of the best is left to expand."""
        best = (cost, g, used)
        seen = {frozenset(used.items())}
        queue = [(cost, 0, used)]
        left = tries
        while queue and left > 0:
            _, _, now = heapq.heappop(queue)
            around, moves = self._rewrite_moves(now)
            for move in moves:
                if left <= 0 or time.perf_counter() > deadline:
                    return best
                better = False
                for built in self._moves(move, now, around):
                    choices = frozenset(built[1].items())
                    if choices in seen:
                        continue
                    seen.add(choices)
                    c = self.cost.cost(built[0])
                    left -= 1
                    if c < best[0] - 1e-9:
                        best, left, better = (c, built[0], built[1]), tries, True
                    if c < best[0] * alpha:
                        heapq.heappush(queue, (c, len(seen), built[1]))
                if better:
                    break  # expand the new best next
        return best

    def _rewrite_moves(self, used: dict) -> tuple[dict, list[dict]]:
        """The greedy choice around graph ``used`` (its classes free) and the recorded rule
        applications whose target changes it, the cheapest under the per-e-node prices first."""
        around, priced = self.greedy_given(used)
        moves = []
        for move in self.rewrites:
            if not any(c in used and used[c] != e for c, e in move.items()):
                continue
            added = sum(self.node_cost[(c, e)] + sum(priced[ch] for ch in e[2] if ch not in move)
                        - (self.node_cost[(c, used[c])] if c in used else 0.0) for c, e in move.items())
            moves.append((added, len(moves), move))
        moves.sort(key=lambda m: m[:2])
        return around, [m[2] for m in moves]

    def _moves(self, move: dict, used: dict, around: dict):
        """The graphs a move (class -> e-node) leads to from graph ``used``: the graph with those
        classes switched (what they need and the graph lacks chosen greedily, reading the
        graph's classes where it can); then, if the move built a tuple, with every class of the
        graph that the tuple can give taking it (the other outputs of a merged op)."""
        local = self.build({**used, **move}, around)
        if local is None:
            return
        yield local
        tuples = {c for c in local[1] if self.view.is_tuple(c)} - set(used)
        shared = {c: x for c in local[1] for x in self.view.classes[c]
                  if x[0] == "get" and x[2][0] in tuples and local[1][c] != x}
        if shared:
            merged = self.build({**local[1], **shared}, around)
            if merged is not None:
                yield merged


class _Cycle(Exception):
    pass
