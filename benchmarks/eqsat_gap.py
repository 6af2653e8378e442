"""Where equality saturation loses to backtracking, and why: region by region.

For each region of each model's dataflow blocks (the first pass's regions,
:func:`tvm_taso.search.regions.regions`), under one cost model (analytic, priced for cuda):
backtracking's graph and cost, eqsat's cost straight out of extraction and after its refinement
(the region search ``search="eqsat"`` runs), and whether backtracking's graph is in the saturated
e-graph. A region eqsat loses is then either *not saturated far enough* (some of backtracking's
e-nodes are missing: a limit, a filter or the schedule kept them out) or *not extracted* (all are
there, and extraction, working on per-e-node prices of a fusion-aware cost, did not choose them).
That split says whether a fix belongs to saturation or to extraction.

    python -m benchmarks.eqsat_gap --quick                  # results/eqsat_gap_quick.json
    python -m benchmarks.eqsat_gap --only nasnet-a           # full sizes: results/eqsat_gap_full.json
"""

from __future__ import annotations

import argparse
import logging
import time
from collections import Counter
from pathlib import Path

from tvm_taso.cost.factory import make_cost_model
from tvm_taso.ir.graph import LEAVES, Graph
from tvm_taso.rewrite.rule import default_rules
from tvm_taso.search import EqsatLimits, SearchOptions, SearchStats, backtrack, eqsat, regions
from tvm_taso.search.eqsat.egraph import EGraph, EGraphView
from tvm_taso.search.eqsat.extract import Extractor

from .cli import block_graphs, chosen_models, write_result

RESULTS = Path(__file__).parent / "results"
REGION_SIZE = SearchOptions().region_size
SECONDS_PER_SEARCH = 60.0


def missing_enodes(eg: EGraph, view: EGraphView, g: Graph) -> list[str]:
    """The ops of ``g`` (a graph over the e-graph's leaves) that no e-node of ``view`` computes
    from the classes of their operands: empty when ``g`` is one of the graphs the e-graph holds."""
    leaf_class = {}
    for cid, enodes in view.classes.items():
        for e in enodes:
            if e[0] == "leaf":
                leaf_class[eg.leaves[e[1]][3]] = cid
    value: dict = {}  # (node, output) -> its class, or None when not in the e-graph
    missing = []
    for nid in g.topo_order():
        node = g.nodes[nid]
        if node.op in LEAVES:
            value[(nid, 0)] = leaf_class.get(node.attr["key"])
            continue
        operands = tuple(value.get(ref) for ref in node.inputs)
        cid = None
        if None not in operands:
            cid = view.class_of.get(("node", eg.op_key(node.op, node.attrs), operands))
        if cid is None:
            missing.append(node.op)
        for i in range(len(node.types)):
            if len(node.types) == 1:
                value[(nid, 0)] = cid
            else:
                value[(nid, i)] = None if cid is None else view.class_of.get(("get", i, (cid,)))
    return missing


def region_row(sub: Graph, region: eqsat.EqsatRegion) -> dict:
    """Both region searches on ``sub``; ``region`` is the eqsat region search (its rules, cost
    model and limits), made once per run as optimize() makes it once per search."""
    rules, cost, limits = region.rules, region.cost, region.limits
    start = cost.cost(sub)
    t0 = time.perf_counter()
    options = SearchOptions()
    bt_graph, bt_cost, bt_path = backtrack.search_region(sub, rules, cost, time.perf_counter() + SECONDS_PER_SEARCH,
                                                         SearchStats(), alpha=options.alpha, budget=options.budget,
                                                         patience=options.patience)
    bt_seconds = time.perf_counter() - t0
    # the region search as search="eqsat" runs it (extraction, then refinement)
    t0 = time.perf_counter()
    _, eq_cost, eq_path = region(sub, time.perf_counter() + SECONDS_PER_SEARCH, SearchStats())
    eq_seconds = time.perf_counter() - t0
    # its steps again, to look inside: the saturated e-graph and extraction's own result
    eg = EGraph(region.rule_set.matching())
    roots, original = eqsat.load(eg, sub)
    creator: dict = {}
    sites: list = []
    run = eqsat.Runner(eg, region.rule_set, limits).run(time.perf_counter() + SECONDS_PER_SEARCH, creator, original,
                                                        sites)
    view = eg.view
    found = Extractor(eg, view, sub, roots, cost, creator=creator, original=original,
                      kernel_memo=region.kernel_memo, sites=sites).run(
        time.perf_counter() + SECONDS_PER_SEARCH, limits.ilp, limits.improve_tries, limits.search_tries)
    missing = missing_enodes(eg, view, bt_graph)
    row = {
        "ops": backtrack.runtime_ops(sub), "cost_before": start,
        "backtrack": {"cost": bt_cost, "seconds": bt_seconds, "rules": list(bt_path)},
        "eqsat": {"cost": eq_cost, "extracted_cost": found.cost, "seconds": eq_seconds, "rules": list(eq_path),
                  "egraph_nodes": view.size, "stopped": run.stop.value, "rounds": run.rounds},
        "backtrack_ops": sum(n.op not in LEAVES for n in bt_graph.nodes.values()),
        "backtrack_ops_missing_from_egraph": missing,
    }
    if eq_cost > bt_cost * (1 + 1e-9):
        row["eqsat_loses"] = "not saturated far enough" if missing else "not extracted"
    return row


def model_rows(name: str, quick: bool, region: eqsat.EqsatRegion) -> list[dict]:
    rows = []
    for k, g in block_graphs(name, quick):
        for r, ids in enumerate(regions.regions(g, REGION_SIZE)):
            sub = regions.extract(g, ids).sub
            if backtrack.runtime_ops(sub) == 0:
                continue
            rows.append({"block": k, "region": r, **region_row(sub, region)})
    return rows


def summary(models: dict) -> dict:
    rows = [row for rs in models.values() for row in rs]
    losses = Counter(row["eqsat_loses"] for row in rows if "eqsat_loses" in row)
    return {
        "regions": len(rows),
        "eqsat_cheaper": sum(r["eqsat"]["cost"] < r["backtrack"]["cost"] * (1 - 1e-9) for r in rows),
        "eqsat_costlier": sum(losses.values()),
        "why_costlier": dict(losses),
        "extraction_alone_costlier": sum(r["eqsat"]["extracted_cost"] > r["backtrack"]["cost"] * (1 + 1e-9)
                                         for r in rows),
        "backtrack_graph_in_egraph": sum(not r["backtrack_ops_missing_from_egraph"] for r in rows),
        "costlier_by_model": {m: sum("eqsat_loses" in r for r in rs) for m, rs in models.items()},
        # what the first pass alone would leave (optimize() then also searches straddling windows)
        "region_cost_sums": {m: {k: sum(r[k]["cost"] for r in rs) for k in ("backtrack", "eqsat")}
                             for m, rs in models.items()},
    }


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--quick", action="store_true", help="tiny model sizes (default: full sizes)")
    parser.add_argument("--only", nargs="*", help="model names (default all eight)")
    parser.add_argument("--target", default="cuda")
    parser.add_argument("--search-tries", type=int, default=0,
                        help="extraction's search over rule applications (EqsatLimits.search_tries; default off)")
    parser.add_argument("-o", "--output", help="default: results/eqsat_gap_{quick,full}[_search].json")
    args = parser.parse_args(argv)
    logging.basicConfig(level=logging.WARNING)
    eqsat.require_egglog()
    from tqdm import tqdm

    sizes = "quick" if args.quick else "full"
    output = args.output or str(RESULTS / f"eqsat_gap_{sizes}{'_search' if args.search_tries else ''}.json")
    names = chosen_models(parser, args.only)
    region = eqsat.EqsatRegion(default_rules(), make_cost_model("analytic", args.target),
                               SearchOptions(kind="eqsat", eqsat=EqsatLimits(search_tries=args.search_tries)))
    models = {}
    for name in tqdm(names, desc="eqsat_gap", unit="model"):
        models[name] = model_rows(name, args.quick, region)
        lost = [r for r in models[name] if "eqsat_loses" in r]
        tqdm.write(f"{name:14s} {len(models[name])} regions, eqsat costlier on {len(lost)}: "
                   + ", ".join(f"{r['region']} ({r['eqsat']['cost'] / r['backtrack']['cost']:.3f}, {r['eqsat_loses']})"
                               for r in lost))
    result = {"sizes": sizes, "target": args.target, "cost_model": "analytic", "region_size": REGION_SIZE,
              "search_tries": args.search_tries,
              "note": "first-pass regions searched on their own (optimize() also searches windows straddling "
                      "their boundaries and reuses repeated regions' results)",
              "models": models, "summary": summary(models)}
    write_result(output, result)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
