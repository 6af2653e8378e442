"""The commands that take a model: ``example`` (a built-in model), ``optimize`` (ONNX in, ONNX
out), ``compile`` (ONNX to a shared library) and ``bench`` (latency with and without
TasoOptimize)."""

from __future__ import annotations

import json
import os
import sys
import time
import warnings
from pathlib import Path

from tvm_taso.errors import InputError, first_line
from tvm_taso.files import (
    OutputPathError,
    check_output_paths,
    read_regular_file,
    write_all,
    write_atomically,
    write_text_atomically,
)


def add_model_commands(sub) -> None:
    """Register ``example``, ``optimize``, ``compile`` and ``bench`` on the subparsers ``sub``."""
    from tvm_taso.examples import EXAMPLES

    ex = sub.add_parser("example", help="optimize a built-in example model and check its outputs on llvm")
    ex.add_argument("model", nargs="?", default="inception", choices=sorted(EXAMPLES))
    ex.add_argument("--target", default="cuda", help="target the cost model prices for (default cuda)")
    ex.add_argument("--rules", help="a rule file to use instead of the shipped library")
    _search_args(ex, "alpha", "budget", "time_limit")
    ex.add_argument("--json", help="write the report as JSON to this file")
    ex.add_argument("--show", action="store_true", help="print the optimized Relax module")
    ex.set_defaults(func=cmd_example)

    def sizes_arg(sp):
        sp.add_argument("--sizes", action="append", metavar="SYMBOL=1,128,2048",
                        help="sizes to price a symbolic dimension of a .pt2 at (repeatable; the names the report's "
                        "priced_sizes gives); default its bounds, else 1 and 128. A rewrite is kept only when it "
                        "pays at every size")

    def database_arg(sp, text):
        sp.add_argument("--database", metavar="DIR", help=text)

    def model_args(sp):
        sp.add_argument("input", help="the ONNX model, or a saved torch.export program (.pt2)")
        sp.add_argument("--target", default="llvm", help="llvm, cuda, a JSON target, or ort[:provider][,key=value...] "
                        "to optimize an ONNX model for onnxruntime (default llvm)")
        sp.add_argument("--shape", action="append", metavar="NAME=1x3x224x224",
                        help="sizes for an input with dynamic dimensions (repeatable); optimize prices at them "
                        "(default 1 for the first axis, 128 elsewhere) and keeps the model dynamic")
        sp.add_argument("--trust-pickle", action="store_true",
                        help="load a .pt2 whose entries need unpickling (tensor subclasses, custom objects): "
                        "unpickling runs code from the file, so only for files from an author you trust")

    opt = sub.add_parser("optimize", help="optimize an ONNX model (or a torch.export program) and write it",
                         description="Rewrite IN.onnx's graph with TASO substitutions chosen by cost for --target "
                         "and write it back as ONNX: the same interface, nodes the search did not rewrite kept as "
                         "they were, symbolic dimensions kept symbolic. A saved torch.export program (IN.pt2) goes "
                         "through TVM's PyTorch frontend and is written as the optimized Relax module "
                         "(tvm.ir.save_json; load it with tvm.ir.load_json); --check compares it with eager PyTorch.")
    model_args(opt)
    sizes_arg(opt)
    opt.add_argument("-o", "--output", required=True, help="where to write the optimized ONNX model")
    opt.add_argument("--rpc", metavar="HOST:PORT/KEY",
                     help="measure kernels on remote devices through TVM's RPC (--cost rpc): a tracker and the key "
                     "its devices registered under, or HOST:PORT,HOST:PORT for servers")
    opt.add_argument("--cost", default="auto", choices=["auto", "analytic", "measure", "learned", "ort", "rpc", "tuned"],
                     help="cost model: analytic (roofline), measure (build and time kernels on the target), "
                     "learned (XGBoost trained with `tvm-taso cost train`), ort (time kernels in onnxruntime; "
                     "--target ort), tuned (each kernel's tuned time in --database), auto (default: ort for "
                     "--target ort, else measure on a local GPU, else learned if trained, else analytic; rpc "
                     "with --rpc)")
    database_arg(opt, "with --cost tuned: the MetaSchedule database (`tvm-taso tune -o DIR`) whose tuned kernel "
                 "times price the search")
    opt.add_argument("--rules", help="a rule file to use instead of the shipped library")
    _search_args(opt, "alpha", "budget", "time_limit", "max_weight_growth")
    opt.add_argument("--check", action="store_true",
                     help="run original and optimized models in onnxruntime on the same random inputs (by name, "
                     "dynamic dimensions at two sizes) and compare every output by name; fail on any mismatch")
    opt.add_argument("--guard", action="store_true",
                     help="time each rewritten region against the original region, then the rewritten model "
                     "against the original, through TVM on --target (this machine's device); keep only what "
                     "measures faster")
    opt.add_argument("--simplify", action="store_true",
                     help="build the output on onnx-simplifier's simplification of the model (shape code folded "
                     "into constants, same inputs and outputs) instead of on the model's own nodes")
    opt.add_argument("--report", metavar="REPORT.json", help="write the search report as JSON")
    opt.add_argument("--html", metavar="REPORT.html", help="write a report to open in a browser")
    opt.set_defaults(func=cmd_optimize)

    comp = sub.add_parser("compile", help="compile an ONNX model with TVM (TasoOptimize in the pipeline)")
    model_args(comp)
    sizes_arg(comp)
    comp.add_argument("-o", "--output", required=True, help="the shared library to write (OUT.so)")
    comp.add_argument("--no-taso", action="store_true", help="compile without TasoOptimize")
    database_arg(comp, "apply the tuned kernels of this MetaSchedule database (`tvm-taso tune -o DIR`)")
    comp.set_defaults(func=cmd_compile)

    tune = sub.add_parser("tune", help="tune a model's kernels with MetaSchedule into a database",
                          description="Tune the kernels of IN (optimized with TasoOptimize, and the original's for a "
                          "fair baseline) with MetaSchedule on --target, into the database DIR that `compile`, "
                          "`bench` and `--cost tuned` read. The trials are split over the kernels by their share "
                          "of the model's work, the largest first; the trials the database holds for a kernel count "
                          "towards its share (one database serves many models; a second run with a larger --trials "
                          "tops each kernel up). Ctrl-C stops and keeps what was tuned.")
    model_args(tune)
    sizes_arg(tune)
    tune.add_argument("-o", "--output", required=True, metavar="DIR", help="the database (a MetaSchedule work dir; "
                      "made if missing, added to if not)")
    tune.add_argument("--trials", type=int, default=1000, help="trials per module (default 1000)")
    tune.add_argument("--min-trials", type=int, default=16, help="the fewest trials a kernel is given while the "
                      "budget lasts (default 16)")
    tune.add_argument("--tune-time-limit", type=float, metavar="S", help="stop starting new kernels after S seconds (kernels are then "
                      "tuned in two rounds, --min-trials first for each one not tuned before, so the limit "
                      "leaves none untouched)")
    tune.add_argument("--no-taso", action="store_true", help="tune the original model's kernels only")
    tune.add_argument("--no-original", action="store_true", help="tune the optimized model's kernels only")
    tune.add_argument("--json", help="write the tuning report as JSON")
    tune.set_defaults(func=cmd_tune)

    bench = sub.add_parser("bench", help="latency with and without TasoOptimize, side by side",
                           description="Compile IN.onnx with the target's build pipeline (default schedules on a CPU) and "
                           "with TasoOptimize before it, and time "
                           "both side by side on --target; with --runtime, optimize it for onnxruntime instead and "
                           "time the original and the optimized model side by side in onnxruntime.")
    model_args(bench)
    bench.add_argument("--runtime", metavar="ort[:provider]",
                       help="optimize for onnxruntime with this provider (and its options, ort:cuda,device_id=1) "
                       "and time both models there; --target is not used")
    bench.add_argument("--repeat", type=int, default=10, help="timed repeats (default 10)")
    _search_args(bench, "time_limit", engine=False)
    bench.add_argument("--input-file", action="append", metavar="NAME=FILE.npy",
                       help="use this array for an input instead of random data (repeatable)")
    bench.add_argument("--json", help="write the measurements as JSON")
    database_arg(bench, "build both sides with the tuned kernels of this MetaSchedule database (`tvm-taso tune`)")
    bench.set_defaults(func=cmd_bench)


# the search settings as the command line spells them: flag, type, help (the default is added
# from SearchOptions, the one place it is spelled)
_SEARCH_FLAGS = {
    "alpha": ("--alpha", float, "search relaxation"),
    "budget": ("--budget", int, "graphs expanded per region"),
    "time_limit": ("--time-limit", float, "seconds for the search"),
    "max_weight_growth": ("--max-weight-growth", float, "leave the model as it was if the rewrites would make its "
                          "weights more than this many times larger (inf for no limit)"),
    "workers": ("--jobs", int, "processes searching regions (default: the cores this process may use); the result "
                "is the same as with -j 1"),
}


def _search_args(parser, *names: str, engine: bool = True) -> None:
    """The search settings ``names`` as flags (default None: :class:`SearchOptions`' default
    applies), and with ``engine`` the search's kind and its workers."""
    from tvm_taso.search.options import SEARCHES, SearchOptions

    for name in names:
        flag, kind, text = _SEARCH_FLAGS[name]
        parser.add_argument(flag, dest=name, type=kind, default=None, metavar="X" if kind is float else "N",
                            help=f"{text} (default {SearchOptions.default(name):g})")
    if not engine:
        return
    parser.add_argument("--search", default=None, choices=list(SEARCHES),
                        help=f"backtrack (TASO's search), eqsat (equality saturation with egglog, TENSAT's search; "
                        f"pip install 'tvm-taso[eqsat]'), auto (eqsat, plus backtracking on small regions); "
                        f"default {SearchOptions.default('search')}")
    flag, kind, text = _SEARCH_FLAGS["workers"]
    parser.add_argument("-j", flag, dest="workers", type=kind, default=None, metavar="N", help=text)


def _target(text: str, runtime_ok: bool = False):
    """``--target`` resolved (:func:`tvm_taso.target.resolve`), once for the whole command: the
    :class:`~tvm_taso.target.Target` goes down to every function that needs it. An unknown
    target is a :class:`~tvm_taso.errors.TargetError` before any work starts; an onnxruntime
    target is taken only where ``runtime_ok`` (the commands that build with TVM refuse it).
    """
    from tvm_taso import target

    resolved = target.resolve(text.strip())
    if resolved.runtime is not None and not runtime_ok:
        raise InputError(f"--target {text}: onnxruntime is a target for `tvm-taso optimize` and `bench --runtime` "
                         "of ONNX models; this command builds with TVM (give llvm, cuda, ...)")
    if resolved.runtime is not None:
        resolved.runtime.check()  # no onnxruntime, no such provider or no device for it: one line
    return resolved


def _check_options(args):
    """The search settings given on the command line as :class:`SearchOptions`, in range,
    before any work: an :class:`InputError` (exit 2) naming the option as the user typed it."""
    from tvm_taso.search.options import OptionError, SearchOptions

    given = {name: getattr(args, name) for name in (*_SEARCH_FLAGS, "search") if hasattr(args, name)}
    try:
        return SearchOptions.from_keywords(None, **given)
    except OptionError as err:
        flag = _SEARCH_FLAGS[err.option][0] if err.option in _SEARCH_FLAGS else err.option
        raise InputError(f"{flag} {str(err).removeprefix(err.option + ' ')}") from None


# what ``optimize`` writes for each kind of input, and output names that would say otherwise
_WRITTEN = {"pt2": ("the optimized Relax module (TVM's JSON)", ".json", (".onnx", ".pt2", ".so")),
            "onnx": ("an ONNX model", ".onnx", (".json", ".pt2", ".so"))}


def _check_output_suffix(args) -> None:
    """An ``-o`` whose suffix names another format than the one written (a ``.pt2`` optimized
    into ``x.onnx`` would hold Relax JSON) is one line, before any work."""
    from tvm_taso.io.torch_import import is_program_path

    what, suffix, wrong = _WRITTEN["pt2" if is_program_path(args.input) else "onnx"]
    if Path(args.output).suffix.lower() in wrong:
        raise InputError(f"-o {args.output}: {args.input} is written as {what}; name the output {suffix}")


def _check_outputs(args, **outputs) -> None:
    """Check every output path (``{option: path}``) before any work, so that a missing or
    read-only directory costs no search time; only ``-o`` may name the input (it is replaced
    atomically, and the user is told)."""
    check_output_paths(outputs)
    source = getattr(args, "input", None)
    if source is None or not os.path.exists(source):
        return
    for option, path in outputs.items():
        if path is not None and os.path.exists(path) and os.path.samefile(source, path):
            if option != "-o":
                raise OutputPathError(f"{option} {path}: is the input model; choose another file")
            _step(f"-o {path} is the input model: it is replaced (atomically) only once the result is ready")


def _check_not_input_data(outputs: dict, data_files: list[Path]) -> None:
    """No output may be one of the input model's external data files (writing it would destroy
    the input), nor the data file an output model's own tensors would go to."""
    for option, path in outputs.items():
        if path is None:
            continue
        for candidate in (Path(path), Path(path).parent / (Path(path).name + ".data")):
            clash = next((f for f in data_files if f.exists() and candidate.exists() and f.samefile(candidate)), None)
            if clash is not None:
                raise OutputPathError(f"{option} {path}: {'is' if candidate == Path(path) else 'would write'} the "
                                      f"input model's external data file {clash}; choose another file")


def _quiet_skips() -> None:
    """The summary lists what the search left as is: no separate warning for it."""
    from tvm_taso.driver import TasoSkippedWarning

    warnings.simplefilter("ignore", TasoSkippedWarning)


def _step(msg: str) -> None:
    print(f"tvm-taso: {msg}", file=sys.stderr, flush=True)


def _shapes(args) -> dict:
    from tvm_taso.io.onnx_import import parse_shape

    return dict(parse_shape(s) for s in args.shape or [])


def _sizes(args) -> dict:
    """``--sizes SYMBOL=S1,S2,...`` as ``{symbol: (sizes)}``; one line for a bad one, or for
    sizes given for an ONNX model (it is priced at its ``--shape``)."""
    from tvm_taso.io.torch_import import is_program_path
    from tvm_taso.ir import dims

    given = {}
    for text in getattr(args, "sizes", None) or []:
        name, sep, values = text.partition("=")
        try:
            given[name] = [int(v) for v in values.split(",")] if sep and name else None
            if given[name] is None:
                raise ValueError
            dims.checked_sizes({name: given[name]})
        except ValueError:
            raise InputError(f"--sizes {text}: give SYMBOL=SIZE,SIZE,... with positive sizes") from None
    if given and not is_program_path(args.input):
        raise InputError("--sizes: an ONNX model is priced at the sizes --shape gives its inputs")
    return given


def _rules(args):
    import tvm_taso
    from tvm_taso.rewrite.rule import RuleSyntaxError

    if args.rules is None:
        return tvm_taso.default_rules()
    try:
        return tvm_taso.load_rules(args.rules)
    except RuleSyntaxError as err:  # bad input: exit 2, one line
        raise InputError(f"--rules: {err}") from None


def _cost_model(name: str, target, rpc=None, database=None):
    """The cost model ``--cost`` names, from the one factory; a model that cannot be had (no
    trained model for the target, an RPC fleet that cannot be reached) is an :class:`InputError`."""
    from tvm_taso.cost.factory import make_cost_model
    from tvm_taso.cost.rpc.measurer import RPCUnavailable

    try:
        return make_cost_model(name, target, rpc=rpc, database=database)
    except RPCUnavailable as err:
        raise InputError(f"--rpc {rpc}: {err}") from None
    except ValueError as err:
        raise InputError(f"--cost {name}: {err}") from None


def cmd_example(args) -> int:
    import tvm_taso
    from tvm_taso import examples
    from tvm_taso.ir import dims
    from tvm_taso.numerics import TOLERANCE
    from tvm_taso.numerics import relative_error
    from tvm_taso.runtime import check_sizes, inputs_for, run

    options = _check_options(args)
    target = _target(args.target)
    _check_outputs(args, **{"--json": args.json})
    _quiet_skips()
    mod = examples.EXAMPLES[args.model]()
    new, report = tvm_taso.optimize(mod, target=target, rules=_rules(args), progress=True, options=options)
    print(f"model            {args.model} ({len(mod['main'].body.blocks[0].bindings)} bindings), "
          f"priced for {target}")
    _print_summary(report)
    sizes = check_sizes(mod)  # a model with symbolic sizes runs at two of them, on one build
    inputs = [inputs_for(mod, sizes=at) for at in sizes]
    t0 = time.perf_counter()
    err = max(relative_error(a, b) for a, b in zip(run(mod, inputs), run(new, inputs)))
    report["check"] = {"max_relative_error": err, "seconds": time.perf_counter() - t0, "sizes": sizes}
    ok = err <= TOLERANCE
    at = "" if sizes == [{}] else " at " + " and ".join(dims.point_text(sorted(s.items())) for s in sizes)
    print(f"outputs on llvm  max relative error {err:.2e}{at} ({'ok' if ok else 'MISMATCH'})")
    if args.show:
        print(new.script(show_meta=False))
    if args.json:
        write_text_atomically(args.json, json.dumps(report, indent=2, allow_nan=False))
        print(f"report           {args.json}")
    return 0 if ok else 1


def cmd_optimize(args) -> int:
    import tvm_taso
    from tvm_taso.output_check import CheckFailed, check_line, failure_line

    options = _check_options(args)
    target = _target(args.target, runtime_ok=True)
    paths = {"-o": args.output, "--report": args.report, "--html": args.html}
    _check_outputs(args, **paths)
    _check_output_suffix(args)
    shapes, sizes, rules = _shapes(args), _sizes(args), _rules(args)  # bad input before any work
    cost_model = _cost_model(args.cost, target, args.rpc, args.database)
    _quiet_skips()
    source = _read_source(args, shapes, paths)
    _step(f"searching ({len(rules)} rules, time limit {options.time_limit:g} s)")
    new, report = tvm_taso.optimize(
        source.model,
        target=target,
        rules=rules,
        cost_model=cost_model,
        progress=True,
        guard=args.guard or None,  # None: the target's default (on for onnxruntime)
        shapes=sizes,
        options=options,
    )
    if args.check:
        _step(f"checking outputs on random inputs ({source.check_how})")
        result = source.check(new)
        report["check"] = result
        if not result["ok"]:
            raise CheckFailed(failure_line(result))
    outputs = source.writers(new, args.output)  # all or none: the model (and its data file) and the reports
    if args.report:
        text = json.dumps(report, indent=2, allow_nan=False)
        outputs[args.report] = lambda tmp: Path(tmp).write_text(text)
    if args.html:
        from tvm_taso.cli.html_report import render

        page = render(report)
        outputs[args.html] = lambda tmp: Path(tmp).write_text(page)
    write_all(outputs)
    _print_summary(report)
    if args.check:
        print(f"check            {check_line(report['check'])}")
    print(f"written          {args.output}")
    if args.report:
        print(f"report           {args.report}")
    if args.html:
        print(f"html report      {args.html}")
    return 0


class _OnnxSource:
    """An ONNX model read for ``optimize``: written back as ONNX, checked in onnxruntime."""

    check_how = "onnxruntime, inputs and outputs by name"

    def __init__(self, args, shapes: dict, paths: dict):
        import tvm_taso

        data_files: list[Path] = []
        self.model = tvm_taso.load_onnx(args.input, shapes=shapes, simplify=args.simplify, data_files=data_files)
        self.name, self.path = self.model.name, args.input
        _check_not_input_data(paths, data_files)
        _step(f"reading {self.name}")
        self.shapes, self.simplified, self.data_files = shapes, args.simplify, data_files

    def check(self, new) -> dict:
        import tvm_taso
        from tvm_taso.output_check import check_onnx

        original = tvm_taso.load_onnx(self.path, shapes=self.shapes) if self.simplified else self.model
        return check_onnx(original, new)

    def writers(self, new, output: str) -> dict:
        """The optimized model; when nothing was applied, the input's own bytes (a model
        serialized again may order its protobuf fields otherwise), unless its weights live in
        external data files that would have to travel with it."""
        if new is self.model and not self.data_files and not self.simplified:
            import shutil

            return {output: lambda tmp: shutil.copyfile(self.path, tmp)}
        return new.writers(output)


class _ProgramSource:
    """A saved ``torch.export`` program read for ``optimize``: imported through TVM's PyTorch
    frontend, written as the optimized Relax module (TVM's JSON), checked against eager PyTorch."""

    check_how = "eager PyTorch against the optimized module run by TVM"

    def __init__(self, args, shapes: dict):
        from tvm_taso.io.torch_import import import_program, load_program

        if shapes:
            raise InputError("--shape: a torch.export program has the sizes it was exported with")
        if getattr(args, "simplify", False):
            raise InputError("--simplify: for ONNX models only")
        self.program = load_program(args.input, trust_pickle=args.trust_pickle)
        _step(f"reading {args.input}")
        self.model = import_program(self.program, Path(args.input).name)

    def check(self, new) -> dict:
        from tvm_taso.output_check import check_exported

        return check_exported(self.program, new)

    def writers(self, new, output: str) -> dict:
        import tvm

        text = tvm.ir.save_json(new)
        return {output: lambda tmp: Path(tmp).write_text(text)}


def _read_source(args, shapes: dict, paths: dict):
    from tvm_taso.io.torch_import import is_program_path

    return _ProgramSource(args, shapes) if is_program_path(args.input) else _OnnxSource(args, shapes, paths)


def _print_summary(report: dict) -> None:
    from tvm_taso.ir import dims

    print(f"estimated cost   {report['cost_before']:.2f} us -> {report['cost_after']:.2f} us "
          f"({report['speedup_estimate']:.2f}x, {report['cost_model']['name']})"
          + (" summed over the sizes below" if report.get("cost_at_sizes") else ""))
    for row in report.get("cost_at_sizes", []):
        at = dims.point_text(sorted(row["sizes"].items()))
        print(f"  at {at:<13} {row['before']:.2f} us -> {row['after']:.2f} us")
    for name, priced in sorted(report.get("priced_sizes", {}).items()):
        print(f"symbolic size    {name} priced at {', '.join(map(str, priced['sizes']))} (from {priced['from']})")
    refused = report.get("rules_refused", [])
    late = sum(r["reason"] == "not checked within the time limit" for r in refused)
    if refused or report.get("rules_check_seconds", 0) >= 0.1:
        print(f"rules checked    {report['rules_check_seconds']:.3f} s; {len(refused) - late} refused"
              + (f", {late} not checked within the time limit (not used)" if late else ""))
    print(f"search           {report['search_seconds']:.3f} s, {report['expanded']} graphs expanded, "
          f"{report['candidates']} candidates, {report['regions']} regions")
    if report.get("regions_cut_short"):
        print(f"cut short        the time limit stopped the search in {report['regions_cut_short']} region(s): "
              "results may differ from run to run (raise --time-limit)")
    print("rules applied    " + (", ".join(f"{k} x{v}" for k, v in report["applied"].items()) or "none"))
    if report["merged_weights_reused"]:
        print(f"weights shared   {report['merged_weights_reused']} site(s) given a merged weight another site made")
    for s in report["skipped"]:
        print(f"left as is       {s['what']} (x{s['count']})")
    regions = report.get("region_guard")
    if regions and regions["regions"]:
        print(f"regions timed    {regions['regions']}: {regions['kept']} kept, {regions['dropped']} dropped "
              f"({regions['from_database']} from the database, {regions['seconds']:.1f} s measuring)")
    guard = report.get("guard")
    if guard and guard.get("measured"):
        print(f"guard            {guard['ratio']:.3f}x measured {'in ' + guard['runtime'] if 'runtime' in guard else 'through TVM'} "
              f"({'kept' if guard['kept'] else 'not faster: original kept'})")
    elif guard:
        print(f"guard            not measured ({guard['reason']})")


def _relax_module(args):
    """The model as a Relax module through TVM's importers (the commands that build with TVM)."""
    from tvm_taso.io.onnx_import import import_relax
    from tvm_taso.io.torch_import import is_program_path

    try:
        return _ProgramSource(args, _shapes(args)).model if is_program_path(args.input) \
            else import_relax(args.input, shapes=_shapes(args))
    except InputError as err:
        if "TVM's ONNX frontend" not in str(err):
            raise
        raise InputError(f"{err}. `tvm-taso {args.command}` needs TVM's importer; `tvm-taso optimize` still "
                         "optimizes the model as ONNX (run it in onnxruntime), or re-export it with static "
                         "shapes") from None


def _database(args, target):
    """``--database DIR`` checked (a MetaSchedule work dir), or None; without one on a CPU
    target, one line says the kernels are untuned and what to run."""
    from tvm_taso import target as targets
    from tvm_taso.cost.tuning import check_database, untuned_notice

    if args.database is None:
        if not targets.is_gpu(target):
            untuned_notice(f"`tvm-taso tune {args.input} -o DB`, then --database DB")
        return None
    try:
        return check_database(args.database)
    except ValueError as err:
        raise InputError(f"--database {err}") from None


def cmd_compile(args) -> int:
    import tvm

    from tvm_taso import blas
    from tvm_taso.cost.kernel_build import build_pipeline, build_target
    from tvm_taso.passes.pipeline import taso_pipeline

    target = _target(args.target)
    _check_outputs(args, **{"-o": args.output})
    sizes = _sizes(args)
    database = _database(args, target)
    mod = _relax_module(args)
    parsed = build_target(target, database)
    if args.no_taso:
        pipeline = build_pipeline(parsed, database)
    else:
        pipeline = taso_pipeline(shapes=sizes, database=database)
    _step(f"compiling for {target}" + ("" if args.no_taso else " with TasoOptimize")
          + (f", tuned kernels from {database}" if database else ""))
    ex = tvm.compile(mod, target=parsed, relax_pipeline=pipeline)
    write_atomically(args.output, ex.export_library)
    print(f"written          {args.output}")
    if blas.used_for(parsed):
        print("                 its matmuls and convolutions call the BLAS through tvm_taso: `import tvm_taso` "
              "before loading it (a target with \"libs\": [\"tvm\"] builds them all with TVM)")
    return 0


def cmd_tune(args) -> int:
    import tvm_taso
    from tvm_taso.cost import tuning

    if args.no_taso and args.no_original:
        raise InputError("--no-taso and --no-original leave nothing to tune")
    if args.trials < 1 or args.min_trials < 1:
        raise InputError("--trials and --min-trials: at least 1")
    target = _target(args.target)
    _check_outputs(args, **{"--json": args.json})
    if os.path.exists(args.output) and not os.path.isdir(args.output):
        raise InputError(f"-o {args.output}: exists and is not a directory (the database is a folder)")
    sizes = _sizes(args)
    original = _relax_module(args)
    modules = {} if args.no_original else {"original": original}
    if not args.no_taso:
        _step(f"optimizing for {target}")
        modules["optimized"], _ = tvm_taso.optimize(original, target=target, shapes=sizes or None)
    reports = {}
    for name, mod in modules.items():
        _step(f"tuning the {name} model's kernels ({args.trials} trials) into {args.output}")
        report = reports[name] = tuning.tune(mod, target, args.output, args.trials,
                                             min_trials=args.min_trials, time_limit=args.tune_time_limit)
        print(f"{name}: {report['trials_run']} trials, {report['tasks_tuned']} of {len(report['tasks'])} kernels "
              f"tuned, {report['seconds']:.0f} s" + (f" (stopped: {report['stopped']})" if report["stopped"] else ""))
        print(f"  {'kernel':32s} {'share':>6s} {'trials':>6s} {'best us':>10s}")
        for task in report["tasks"]:
            best = f"{task['best_us']:10.2f}" if task["best_us"] is not None else f"{'-':>10s}"
            print(f"  {task['name'][:32]:32s} {100 * task['share']:5.1f}% {task['trials']:6d} {best}")
        if report["stopped"] == "interrupted":
            break
    if args.json:
        write_text_atomically(args.json, json.dumps(reports, indent=2, allow_nan=False))
    return 130 if any(r["stopped"] == "interrupted" for r in reports.values()) else 0


def cmd_bench(args) -> int:
    from tvm_taso.io.torch_import import is_program_path

    if args.runtime is not None:
        if is_program_path(args.input):
            raise InputError("--runtime times ONNX models in onnxruntime; a .pt2 is timed through TVM (--target)")
        return _bench_in_runtime(args)
    from tvm_taso.cli.bench import bench
    from tvm_taso.io.onnx_import import import_relax
    from tvm_taso.runtime import check_sizes, inputs_for

    options = _check_options(args)
    target = _target(args.target)
    _check_outputs(args, **{"--json": args.json})
    repeat, given = _repeat(args), dict(_input_file(s) for s in args.input_file or [])
    if is_program_path(args.input):  # a .pt2: timed at the least sizes of its dynamic dimensions
        mod = _ProgramSource(args, _shapes(args)).model
        inputs = inputs_for(mod, given, sizes=check_sizes(mod)[0])
    else:
        mod = import_relax(args.input, shapes=_shapes(args))
        inputs = inputs_for(mod, given)
    database = _database(args, target)
    _step(f"compiling and timing on {target} (with and without TasoOptimize"
          + (f", tuned kernels from {database})" if database else ")"))
    result = bench(mod, inputs, target, repeat=repeat, options=options, database=database)
    print(f"{'pipeline':24s} {'median ms':>10s} {'min ms':>10s}")
    for key in ("default", "taso"):
        r = result[key]
        print(f"{r['label']:24s} {r['median_ms']:10.3f} {r['min_ms']:10.3f}")
    low, high = result["speedup_quartiles"]
    print(f"speedup (default / taso) {result['speedup']:.3f}x (median of {repeat} pairwise ratios, "
          f"quartiles {low:.3f}-{high:.3f})")
    if args.json:
        write_text_atomically(args.json, json.dumps(result, indent=2, allow_nan=False))
    return 0


def _bench_in_runtime(args) -> int:
    """``bench --runtime``: the model optimized for onnxruntime, then the original and the result
    timed side by side there (:func:`tvm_taso.ort.bench.bench_in_runtime`)."""
    import tvm_taso
    from tvm_taso.ort.bench import bench_in_runtime

    options = _check_options(args)
    runtime = _target(args.runtime, runtime_ok=True)
    if runtime.runtime is None:
        raise InputError(f"--runtime {args.runtime!r}: expected ort[:provider][,key=value...]")
    _check_outputs(args, **{"--json": args.json})
    repeat, given = _repeat(args), dict(_input_file(s) for s in args.input_file or [])
    _quiet_skips()
    model = tvm_taso.load_onnx(args.input, shapes=_shapes(args))
    _step(f"optimizing for {runtime} (time limit {options.time_limit:g} s)")
    new, report = tvm_taso.optimize(model, target=runtime, progress=True, options=options)
    _step(f"timing the original and the optimized model in {runtime}, side by side")
    result = bench_in_runtime(model, new, runtime, given, repeat=repeat)
    result["report"] = report
    print(f"{'model':24s} {'median ms':>10s} {'quartiles ms':>20s}")
    for key in ("original", "optimized"):
        r = result[key]
        print(f"{key:24s} {r['median_ms']:10.3f} {r['low_ms']:9.3f}-{r['high_ms']:<9.3f}")
    print(f"speedup (original / optimized) {result['speedup']:.3f}x (median of {result['rounds']} pairwise "
          f"ratios, quartiles {result['speedup_quartiles'][0]:.3f}-{result['speedup_quartiles'][1]:.3f})")
    regions = report.get("region_guard") or {}
    print(f"regions timed    {regions.get('regions', 0)}: {regions.get('kept', 0)} kept, {regions.get('dropped', 0)} "
          f"dropped; rules applied: {', '.join(f'{k} x{v}' for k, v in report['applied'].items()) or 'none'}")
    if args.json:
        write_text_atomically(args.json, json.dumps(result, indent=2, allow_nan=False))
    return 0


INPUT_FILE_BYTES = 2**31  # an input array read whole


def _input_file(text: str):
    """``--input-file NAME=FILE.npy`` as (name, array): a regular file (a FIFO would block, a
    device never end) holding one ``.npy`` array, no pickled objects; one line otherwise."""
    import io

    import numpy as np

    name, sep, path = text.partition("=")
    if not sep or not name:
        raise InputError(f"--input-file {text!r}: expected NAME=FILE.npy")
    data = read_regular_file(Path(path), INPUT_FILE_BYTES, "a .npy array")
    try:
        array = np.load(io.BytesIO(data), allow_pickle=False)
    except (OSError, ValueError) as err:
        raise InputError(f"--input-file {text!r}: {path} is not a .npy array ({first_line(err)})") from None
    if not isinstance(array, np.ndarray):
        raise InputError(f"--input-file {text!r}: {path} is an .npz archive of several arrays; give one .npy "
                         "file per input")
    return name, array


def _repeat(args) -> int:
    """``--repeat``, a count of timing rounds (one line, exit 2, for 0 or a negative one)."""
    from tvm_taso.search.options import OptionError, check_repeats

    try:
        check_repeats("--repeat", args.repeat)
    except OptionError as err:
        raise InputError(str(err)) from None
    return args.repeat
