"""``tvm-taso cost show|train|measure``: the measurement database, the learned cost model, and
measuring a model's kernels into the database (here, or on RPC devices)."""

from __future__ import annotations

import json
import sys
from collections import Counter

from tvm_taso import target as targets
from tvm_taso.cost.database import MeasurementDB, measured_target
from tvm_taso.files import cache_dir, check_output_path


def add_cost_command(subparsers) -> None:
    """Add ``cost show [--db PATH] [--json]`` and ``cost train [--db PATH] [--target T] [-o MODEL]``."""
    cost = subparsers.add_parser("cost", help="the measurement database and cost models")
    sub = cost.add_subparsers(dest="cost_command", required=True)

    show = sub.add_parser("show", help="summarize the measurement database")
    show.add_argument("--db", default=None, help="database file or folder (default $TVM_TASO_CACHE or ~/.cache/tvm-taso)")
    show.add_argument("--json", action="store_true", help="print the summary as JSON")
    show.set_defaults(func=cmd_cost_show)

    tr = sub.add_parser(
        "train",
        help="train the learned cost model from the measurement database",
        description="Fit an XGBoost model of kernel latency (log µs) on the target's measured kernels, "
        "print held-out Spearman rank correlation and median relative error, and save it where "
        "cost_model='auto' finds it.",
    )
    tr.add_argument("--db", default=None, help="database file or folder (default $TVM_TASO_CACHE or ~/.cache/tvm-taso)")
    tr.add_argument("--target", default=None,
                    help="train for this target (llvm, cuda or a JSON target; default: the only / most measured one)")
    tr.add_argument("-o", "--output", default=None, help="model file (default <cache>/learned-<target>.json)")
    tr.add_argument("--test-fraction", type=float, default=0.25, help="held-out share (default 0.25)")
    tr.add_argument("--seed", type=int, default=0)
    tr.add_argument("--json", action="store_true", help="print the metrics as JSON")
    tr.set_defaults(func=cmd_cost_train)

    me = sub.add_parser(
        "measure",
        help="measure an ONNX model's kernels into the database, here or on RPC devices",
        description="Build and time every distinct fused kernel of IN.onnx's graph for --target, on this "
        "machine or, with --rpc, on remote devices through TVM's RPC (one kernel per device at a time, all "
        "devices at once); kernels the database already holds are not measured again.",
    )
    me.add_argument("input", help="the ONNX model")
    me.add_argument("--target", default="llvm", help="llvm, cuda or a JSON target (default llvm)")
    me.add_argument("--rpc", metavar="HOST:PORT/KEY",
                    help="a tracker and the key its devices registered under, or HOST:PORT,HOST:PORT for servers")
    me.add_argument("--shape", action="append", metavar="NAME=1x3x224x224", help="sizes for dynamic dimensions")
    me.add_argument("--repeats", type=int, default=10, help="timed runs per kernel (default 10)")
    me.add_argument("--timeout", type=float, default=60.0, help="seconds per kernel (default 60)")
    me.add_argument("--builders", type=int, default=1, metavar="N",
                    help="build kernels in N processes at once, then time them one at a time (default 1)")
    me.add_argument("--db", default=None, help="database file or folder (default $TVM_TASO_CACHE or ~/.cache/tvm-taso)")
    me.add_argument("--json", action="store_true", help="print the summary as JSON")
    me.set_defaults(func=cmd_cost_measure)


def cmd_cost_show(args) -> int:
    s = MeasurementDB(args.db).summary()
    if args.json:
        print(json.dumps(s, indent=2))
        return 0
    print(f"{s['path']}: {s['records']} kernels, {s['file_bytes']} bytes")
    for t, info in s["targets"].items():
        mm = info["median_of_medians_us"]
        statuses = ", ".join(f"{k} {v}" for k, v in info["status"].items())
        print(f"  {info['kind']:<6} {info['records']:>6} kernels ({statuses}); median kernel "
              f"{'-' if mm is None else f'{mm:.1f} us'}")
        print(f"         {t}")
    return 0


def cmd_cost_train(args) -> int:
    from tvm_taso.cost.training import train

    if args.output:
        check_output_path(args.output, "-o")
    if args.target:
        targets.parse(args.target)  # an unknown target: one line listing what is accepted
    db = MeasurementDB(args.db)
    records = db.records()
    target = None
    if args.target:
        target = measured_target(args.target)
        if not any(r.target == target for r in records):
            # "llvm" names every llvm record when there is just one llvm target in the database
            same = sorted({r.target for r in records if targets.kind(r.target) == targets.kind(target)})
            if len(same) == 1 and not args.target.lstrip().startswith("{"):
                target = same[0]
    else:
        measured = Counter(r.target for r in records if r.ok)
        if len(measured) > 1:
            print(f"tvm-taso: {db.path} holds measurements for {len(measured)} targets; choose one with --target:",
                  file=sys.stderr)
            for t, n in measured.most_common():
                print(f"  {n:>6}  {t}", file=sys.stderr)
            return 2
    try:
        model, metrics = train(records, target, test_fraction=args.test_fraction, seed=args.seed)
    except ValueError as err:
        print(f"tvm-taso: cannot train: {err} ({db.path})", file=sys.stderr)
        return 2
    try:
        path = model.save(args.output)
    except OSError as err:
        if args.output:
            raise
        print(f"tvm-taso: error: cannot save the model in the cache directory {cache_dir()} "
              f"(set TVM_TASO_CACHE to a writable directory, or give -o): {err}", file=sys.stderr)
        return 3
    metrics = dict(metrics, model=str(path))
    if args.json:
        print(json.dumps(metrics, indent=2))
        return 0

    def fmt(v, pct=False):
        return "-" if v is None else (f"{100 * v:.1f} %" if pct else f"{v:.3f}")

    print(f"trained on {metrics['train']} kernels, held out {metrics['test']} "
          f"({metrics['records_failed_skipped']} failed measurements skipped) in {metrics['train_seconds']:.2f} s")
    print(f"  target                   {metrics['target']}")
    print(f"  held-out Spearman        {fmt(metrics['spearman'])}"
          f"   (analytic roofline {fmt(metrics.get('analytic_spearman'))})")
    print(f"  median relative error    {fmt(metrics['median_rel_error'], True)}"
          f"   (scaled roofline {fmt(metrics.get('analytic_median_rel_error'), True)})")
    print(f"  saved                    {path}")
    return 0


def cmd_cost_measure(args) -> int:
    import tvm_taso
    from tvm_taso.cost.measure import LocalMeasurer
    from tvm_taso.cost.model import kernels
    from tvm_taso.cost.rpc.fleet import open_fleet
    from tvm_taso.cost.rpc.measurer import RPCUnavailable
    from tvm_taso.errors import InputError
    from tvm_taso.io.onnx_bridge import OnnxGraph
    from tvm_taso.io.onnx_import import parse_shape
    from tvm_taso.progress import progress_bar

    targets.parse(args.target)  # an unknown target: one line listing what is accepted
    if args.builders < 1:
        raise InputError(f"--builders {args.builders}: give at least 1")
    try:
        measurer = open_fleet(args.rpc) if args.rpc else LocalMeasurer(builders=args.builders)
    except (RPCUnavailable, ValueError) as err:
        raise InputError(f"--rpc {args.rpc}: {err}") from None
    model = tvm_taso.load_onnx(args.input, shapes=dict(parse_shape(s) for s in args.shape or []))
    todo = list(dict.fromkeys(kernels(OnnxGraph(model).graph)))
    db = MeasurementDB(args.db)
    tstr = targets.canonical(args.target)
    record_target = measurer.record_target(measured_target(tstr))
    known = [k for k in todo if db.get(k.key(), record_target) is not None]
    new = [k for k in todo if db.get(k.key(), record_target) is None]
    bar = progress_bar("tvm-taso cost measure", "kernel", total=len(new))
    step = bar.update if bar is not None else None
    records = []
    try:
        if args.rpc or args.builders > 1:
            records = measurer.measure(new, tstr, db=db, repeats=args.repeats, timeout=args.timeout, progress=step)
        else:
            for k in new:
                rec = measurer(k, tstr, args.repeats, args.timeout)
                if not rec.error.startswith("MeasureError"):
                    db.add(rec)
                    records.append(rec)
                if step is not None:
                    step()
    finally:
        if bar is not None:
            bar.close()
        close = getattr(measurer, "close", None)
        if close is not None:
            close()
    done = [r for r in records if r is not None]
    summary = {"model": model.name, "target": record_target, "kernels": len(todo), "known": len(known),
               "measured": len(done), "failed": sum(not r.ok for r in done),
               "unmeasured": len(new) - len(done), "measured_on": dict(Counter(r.measured_on or "here" for r in done)),
               "db": str(db.path), **(measurer.describe() if not args.rpc else {})}
    if args.json:
        print(json.dumps(summary, indent=2))
        return 0
    print(f"{summary['kernels']} kernels: {summary['known']} already in the database, {summary['measured']} measured "
          f"({summary['failed']} failed), {summary['unmeasured']} not measured")
    for where, n in sorted(summary["measured_on"].items()):
        print(f"  {n:>5}  on {where}")
    print(f"database         {summary['db']}")
    return 0
