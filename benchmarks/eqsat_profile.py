"""Where eqsat's time goes: the search of a model under cProfile, cumulative seconds per phase.

``tvm_taso.optimize(search="eqsat", workers=1, time_limit=600)`` at full size, analytic cost for
cuda, one run under cProfile (which slows Python about twice: compare phases, not totals with other files).
With ``--before TREE`` (a worktree of an earlier commit) the same runs in a fresh process on that
tree too, so a change's effect on each phase is read side by side.

    python -m benchmarks.eqsat_profile --only nasrnn nasnet-a --before /tmp/before -o results/eqsat_profile.json
"""

from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path

from .cli import chosen_models, write_result
from .search_ab import commit_of, run_in_tree

RESULTS = Path(__file__).parent / "results"
HERE = Path(__file__).resolve().parent.parent

# phase -> (file name ending, function name) pairs whose cumulative time it is; both layouts of
# the eqsat code (before and after it became a package) are named
PHASES = {
    "search proper": [("regions.py", "search_regions")],
    "saturation": [("eqsat.py", "saturate"), ("runner.py", "run")],
    "Python match checks (Sites.of)": [("ematch.py", "of")],
    "applying targets (Applier.apply)": [("ematch.py", "apply")],
    "egglog commands": [("~", "<method 'run_program' of 'builtins.EGraph' objects>")],
    "reading the e-graph back": [("egraph.py", "_read")],
    "extraction": [("extract.py", "run")],
    "refinement (backtracking)": [("backtrack.py", "search_region")],
    "pricing graphs": [("model.py", "cost")],
    "settling regions": [("regions.py", "settle")],
}

_CHILD = """
import cProfile, json, pstats, sys, warnings
import tvm_taso
from tvm_taso.io.onnx_import import import_relax
from benchmarks.models import build
phases = json.loads(sys.argv[2])
mod = import_relax(build(sys.argv[1], quick=False))
profile = cProfile.Profile()
with warnings.catch_warnings():
    warnings.simplefilter("ignore")
    profile.enable()
    # cProfile doubles the time: the default limit would cut NasNet-A's regions short
    _, report = tvm_taso.optimize(mod, target="cuda", cost_model="analytic", search="eqsat", workers=1,
                                  time_limit=600.0)
    profile.disable()
stats = pstats.Stats(profile).stats
seconds = {label: round(sum(ct for (path, _, func), (_, _, _, ct, _) in stats.items()
                            for end, name in keys if path.endswith(end) and func == name), 2)
           for label, keys in phases.items()}
print(json.dumps({"cost_after": report["cost_after"], "regions_cut_short": report["regions_cut_short"],
                  "seconds": seconds, "tvm_taso": tvm_taso.__file__}))
"""


def profile(tree: Path, name: str) -> dict:
    return run_in_tree(tree, _CHILD, name, json.dumps(PHASES))


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--before", type=Path, help="another source tree to profile too (a worktree)")
    parser.add_argument("--only", nargs="*", help="model names (default all eight)")
    parser.add_argument("-o", "--output", default=str(RESULTS / "eqsat_profile.json"))
    args = parser.parse_args(argv)
    trees = {"after": HERE, **({"before": args.before.resolve()} if args.before else {})}
    rows = []
    for name in chosen_models(parser, args.only):
        row = {"model": name, **{side: profile(tree, name) for side, tree in trees.items()}}
        rows.append(row)
        print(json.dumps(row), flush=True)
    top = {row["model"]: max((k for k in PHASES if k not in ("search proper", "saturation")),
                             key=lambda k: row["after"]["seconds"][k]) for row in rows}
    result = {"how": "one run per model and tree, full size, search='eqsat', workers=1, time_limit=600, analytic cost for cuda, "
                     "under cProfile (cumulative seconds; phases overlap: matching checks and applying are within "
                     "saturation, pricing within extraction and refinement); a measurement on this 2-core machine",
              "before": f"commit {commit_of(args.before)}" if args.before else None, "after": "this checkout", "models": rows,
              "summary": {"largest phase (after)": top}}
    write_result(args.output, result)
    return 0


if __name__ == "__main__":
    sys.exit(main())
