"""Kernel builds in one process against two: ``python -m benchmarks.builders``.

Every distinct fused kernel of each quick benchmark model is built for ``llvm`` and timed by
:class:`tvm_taso.cost.measure.LocalMeasurer`'s builder / runner split, with 1 and 2 build
processes, alternating, ``--repeats`` times, each into a fresh measurement database. Recorded:
the build phase's wall time (``build_seconds``: all kernels built, before any is timed), its
medians and the speedup, and whether both settings give the same records (kernel, status).

    python -m benchmarks.builders [--only NAMES] [--repeats 3] [--json OUT]
"""

from __future__ import annotations

import argparse
import logging
import statistics
import tempfile
from pathlib import Path

from tvm_taso.cost.database import MeasurementDB
from tvm_taso.cost.measure import LocalMeasurer
from tvm_taso.cost.model import kernels

from .cli import block_graphs, chosen_models, write_result

RESULTS = Path(__file__).parent / "results" / "builders.json"
BUILDERS = (1, 2)


def build_phase(todo: list, builders: int) -> tuple[float, list]:
    """Seconds of the build phase of measuring ``todo`` with ``builders`` processes, and the
    records' (kernel, status)."""
    measurer = LocalMeasurer(builders=builders)
    measurer.measure = measurer._build_then_time  # one builder too: the same split, timed alike
    with tempfile.TemporaryDirectory(prefix="tvm-taso-builders-") as tmp:
        try:
            records = measurer.measure(todo, "llvm", db=MeasurementDB(Path(tmp) / "db"), repeats=2, min_repeat_ms=1)
        finally:
            measurer.close()
    return measurer.build_seconds, sorted((r.key, r.status) for r in records if r is not None)


def compare(name: str, repeats: int) -> dict:
    todo = list(dict.fromkeys(k for _, g in block_graphs(name, quick=True) for k in kernels(g)))
    seconds: dict[int, list[float]] = {b: [] for b in BUILDERS}
    found: dict[int, set] = {b: set() for b in BUILDERS}
    for _ in range(repeats):
        for b in BUILDERS:  # alternating, so that a slow spell of the machine hits both
            took, records = build_phase(todo, b)
            seconds[b].append(took)
            found[b].add(repr(records))
    medians = {b: statistics.median(s) for b, s in seconds.items()}
    return {"model": name, "kernels": len(todo), "seconds": {str(b): s for b, s in seconds.items()},
            "median_seconds": {str(b): round(m, 3) for b, m in medians.items()},
            "speedup": round(medians[1] / medians[2], 3),
            "same_records": len(found[1] | found[2]) == 1}


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(prog="python -m benchmarks.builders", description=__doc__.split("\n\n")[0])
    ap.add_argument("--only", nargs="+", metavar="NAME")
    ap.add_argument("--repeats", type=int, default=3)
    ap.add_argument("--json", default=str(RESULTS))
    args = ap.parse_args(argv)
    logging.basicConfig(level=logging.INFO, format="%(name)s: %(message)s")
    rows = []
    for name in chosen_models(ap, args.only or ["squeezenet1.1", "resnet50"]):
        row = compare(name, args.repeats)
        logging.getLogger("benchmarks.builders").info("%s", row)
        rows.append(row)
    summary = {r["model"]: f"{r['kernels']} kernels, build phase {r['median_seconds']['1']} s -> "
               f"{r['median_seconds']['2']} s ({r['speedup']}x), same records: {r['same_records']}" for r in rows}
    write_result(args.json, {"rows": rows, "summary": summary})
    return 0 if all(r["same_records"] for r in rows) else 1


if __name__ == "__main__":
    raise SystemExit(main())
