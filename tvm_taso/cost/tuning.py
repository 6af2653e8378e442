"""MetaSchedule tuning of a module's kernels, with a budget that reaches every task that matters.

TVM 0.27's CPU pipeline legalizes and fuses but schedules nothing; a build here gives a kernel
no database tuned MetaSchedule's design-space default (:mod:`.schedules`), drawn, not timed.
MetaSchedule tunes the fused kernels (its *tasks*: the TIR functions of
:func:`~tvm_taso.cost.kernel_build.fused_module`), but spends its trials in batches of 64 per
task, so a budget smaller than 64 × the task count tunes a few tasks and leaves the rest as
loops. :func:`tune` instead

* splits the trials over the tasks by their share of the module's work (FLOPs × how often the
  kernel runs), the largest first, each task at least ``min_trials`` while the budget lasts
  (:func:`plan`); a task with no arithmetic (a transpose, a copy) gets none;
* counts the trials the database already holds for a task towards its share and gives it only
  the rest, when that is at least ``min_trials`` (a database tuned on earlier models is reused:
  one work dir for many models; a second run with the same budget tunes nothing, one with a
  larger budget tops every task up to its larger share);
* tunes each task in turn (under a time limit in two rounds: ``min_trials`` for each task not
  tuned before, then the rest of the trials), into one MetaSchedule JSON database (a work dir, as
  ``relax.transform.MetaScheduleApplyDatabase`` reads it), sharing one XGBoost cost model, so
  what was learned on one task guides the next; a record is written as soon as it is measured,
  and an interrupt (Ctrl-C) stops the tuning and keeps what was tuned.

:func:`~tvm_taso.cost.kernel_build.build_pipeline` applies the database when building;
:func:`best_seconds` reads a task's tuned time back (the ``tuned`` cost model prices with it).
"""

from __future__ import annotations

import contextlib
import inspect
import logging
import sys
import time
from dataclasses import asdict, dataclass
from pathlib import Path

from tvm_taso import target as targets

log = logging.getLogger("tvm_taso.tuning")

MIN_TRIALS = 16  # the fewest trials a task is given while the budget lasts (a quarter of one batch)
BATCH = 64  # MetaSchedule's trials per round for one task
POPULATION = 2048  # MetaSchedule's default evolutionary population, the most used here
BUILD_TIMEOUT = 60.0  # seconds per candidate build; the default 30 is hit on 2 cores


@dataclass
class TaskBudget:
    """One task of a module and the trials it is given."""

    name: str
    weight: int  # how many times the module runs the kernel
    flops: float  # of one run
    share: float  # of the module's work (weight × flops)
    trials: int  # given now
    recorded: int = 0  # trials the database held for it before: counted towards its share

    @property
    def in_database(self) -> bool:
        """Tuned before."""
        return self.recorded > 0


def tasks_of(mod, target) -> list:
    """MetaSchedule's tasks for ``mod`` built for ``target``: its fused TIR kernels, each once
    with its weight (how often it runs)."""
    from tvm_taso.cost.kernel_build import fused_module

    target = targets.with_cores(target)
    return fused_tasks(fused_module(mod, target), target)


def fused_tasks(fused, target) -> list:
    """:func:`tasks_of` a module already through the passes up to ``FuseTIR`` for ``target``
    (with its cores)."""
    from tvm.s_tir import meta_schedule as ms

    return list(ms.relax_integration.extract_tasks(fused, target))


def _flops(task) -> float:
    from tvm.s_tir.analysis import estimate_tir_flops

    try:
        return float(estimate_tir_flops(task.dispatched[0]))
    except Exception:  # noqa: BLE001 - a kernel the estimator cannot read counts as no work
        return 0.0


def plan(tasks: list, trials: int, database=None, min_trials: int = MIN_TRIALS) -> list[TaskBudget]:
    """How ``trials`` are split over ``tasks`` (:class:`TaskBudget`, largest share first): by
    share of the work, at least ``min_trials`` each while the budget lasts, none to a task with
    no arithmetic. The trials ``database`` holds for a task count towards its share; it is given
    the rest, or none when the rest is less than ``min_trials`` (a top-up that small is not a
    round's worth)."""
    flops = [_flops(t) for t in tasks]
    total = sum(t.weight * f for t, f in zip(tasks, flops)) or 1.0
    budgets = [TaskBudget(t.task_name, int(t.weight), f, t.weight * f / total, 0,
                          recorded_trials(database, t.dispatched[0]) if database is not None else 0)
               for t, f in zip(tasks, flops)]
    order = sorted(range(len(budgets)), key=lambda k: -budgets[k].share)
    left = trials
    for k in order:
        b = budgets[k]
        if b.flops <= 0 or left <= 0:
            continue
        share = min(left, max(min_trials, round(trials * b.share)))
        left -= share
        if not b.recorded or share - b.recorded >= min_trials:
            b.trials = share - b.recorded
    return [budgets[k] for k in order]


def recorded_trials(database, prim_func) -> int:
    """How many measured trials of the kernel ``prim_func`` ``database`` holds (0 when none)."""
    return len(_records(database, prim_func, 1 << 30))


def tune(mod, target, work_dir, trials: int, *, min_trials: int = MIN_TRIALS, time_limit: float | None = None,
         seed: int = 0) -> dict:
    """Tune ``mod``'s kernels for ``target`` with ``trials`` MetaSchedule trials in all (split by
    :func:`plan`) into the database in ``work_dir`` (made if missing, reused if not). Returns a
    report (plain data): each task's budget and best time, the trials run (and those the database
    held before, ``trials_held``), the seconds, and
    ``stopped`` (``"interrupted"`` on Ctrl-C, ``"time limit"`` when ``time_limit`` seconds
    passed before every task had its turns) — what was tuned before a stop stays in the
    database. Under a time limit, several tasks are tuned in two rounds, each largest first:
    ``min_trials`` for each task the database holds no trial of, then the rest of the trials,
    so that the limit leaves every task that had its first round tuned.
    """
    from tvm.s_tir import meta_schedule as ms

    from tvm_taso.progress import progress_bar

    target = targets.with_cores(target)
    work_dir = Path(work_dir)
    work_dir.mkdir(parents=True, exist_ok=True)
    tensor_intrinsics()
    database = open_database(work_dir)
    tasks = tasks_of(mod, target)
    budgets = plan(tasks, trials, database, min_trials)
    by_name = {t.task_name: t for t in tasks}
    todo = [b for b in budgets if b.trials > 0]
    t0, stopped, ran = time.perf_counter(), None, 0
    log.info("tuning %d of %d tasks with %d trials (%d tasks had %d trials in %s already)", len(todo), len(tasks),
             sum(b.trials for b in todo), sum(b.in_database for b in budgets), sum(b.recorded for b in budgets),
             work_dir)
    if todo:
        # MetaSchedule prints each task's table and its XGBoost rounds on stdout at the level its
        # logger has when the tasks' contexts are made (DEBUG when none was set); its log files in
        # work_dir keep them all. Unless the user set a level, the console gets warnings only.
        ms_log = logging.getLogger("tvm.s_tir.meta_schedule")
        quiet = ms_log.level == logging.NOTSET
        if quiet:
            ms_log.setLevel(logging.WARNING)
        # the candidates MetaSchedule draws, evolves and ranks with its cost model each round:
        # sized to the trials a task gets here (four times the most any task gets, a batch at
        # least, MetaSchedule's default 2048 at most), not 2048 for a task given 16 trials
        strategy = ms.search_strategy.EvolutionarySearch(
            population_size=min(POPULATION, max(BATCH, 4 * max(b.trials for b in todo))))
        # MetaSchedule's logging config names its logger's handlers, and one without a name (the
        # application's, a test runner's) makes it fail: such handlers sit out while it is made
        unnamed = [h for h in ms_log.handlers if h.get_name() is None]
        for h in unnamed:
            ms_log.removeHandler(h)
        try:
            contexts, weights = ms.relax_integration.extracted_tasks_to_tune_contexts(
                [by_name[b.name] for b in todo], str(work_dir), strategy=strategy, seed=seed)
        finally:
            for h in unnamed:
                ms_log.addHandler(h)
        builder = ms.builder.LocalBuilder(timeout_sec=BUILD_TIMEOUT, initializer=tensor_intrinsics)
        runner = ms.runner.LocalRunner()
        cost_model = ms.CostModel.create("xgb", num_tuning_cores=max(1, targets.num_cores(target) or 1))
        bar = progress_bar("tuning", "trial", total=sum(b.trials for b in todo))
        # under a time limit, two rounds, each largest first: min_trials for every task the
        # database holds no trial of, then the rest of each task's trials (MetaSchedule starts
        # again from what the database holds), so that the limit leaves no kernel on the untuned
        # default, which can cost many times its share of the model's time; otherwise (no
        # limit, one task, or a task tuned before) a step per task: each costs MetaSchedule
        # seconds to start
        split = time_limit is not None and len(todo) > 1
        first = [min(b.trials, min_trials) if split and not b.recorded else 0 for b in todo]
        steps = [(b, c, w, n, "") for b, c, w, n in zip(todo, contexts, weights, first) if n]
        steps += [(b, c, w, b.trials - n, ", second round" if n else "")
                  for b, c, w, n in zip(todo, contexts, weights, first) if b.trials > n]
        try:
            for b, context, weight, n, which in steps:
                if time_limit is not None and time.perf_counter() - t0 > time_limit:
                    stopped = "time limit"
                    break
                log.info("task %s: %d of its %d trials (%.0f%% of the work)%s", b.name, n, b.trials, 100 * b.share,
                         which)
                ms.tune_tasks(tasks=[context], task_weights=[weight], work_dir=str(work_dir),
                              max_trials_global=n, max_trials_per_task=n,
                              num_trials_per_iter=min(BATCH, n), builder=builder, runner=runner,
                              database=database, cost_model=cost_model)
                ran += n
                if bar is not None:
                    bar.update(n)
        except KeyboardInterrupt:
            stopped = "interrupted"
            log.warning("tuning interrupted: what was measured is kept in %s", work_dir)
        finally:
            if bar is not None:
                bar.close()
            if quiet:
                ms_log.setLevel(logging.NOTSET)
    rows = []
    for b in budgets:
        best = best_seconds(database, by_name[b.name].dispatched[0], target)
        rows.append(dict(asdict(b), in_database=b.in_database, best_us=None if best is None else best * 1e6))
    return {"database": str(work_dir), "target": str(target), "trials": trials, "trials_run": ran,
            "trials_held": sum(b.recorded for b in budgets),
            "tasks": rows, "tasks_tuned": sum(r["best_us"] is not None for r in rows),
            "seconds": time.perf_counter() - t0, "stopped": stopped}


def untuned_notice(what_to_run: str) -> None:
    """Say once per process, in one line, that a CPU build runs untuned kernels and what to run."""
    if not getattr(untuned_notice, "said", False):
        untuned_notice.said = True
        log.warning("kernels are untuned (MetaSchedule's default schedules, not timed on this CPU): %s", what_to_run)


def check_database(path) -> str:
    """``path`` as a string if it is a MetaSchedule database (a work dir holding
    ``database_workload.json``), else ValueError saying how to make one."""
    if not (Path(path) / "database_workload.json").is_file():
        raise ValueError(f"{path}: not a MetaSchedule database (no database_workload.json); make one with "
                         "`tvm-taso tune MODEL -o DIR`")
    return str(path)


def open_database(work_dir):
    """The MetaSchedule JSON database in ``work_dir`` (its two files made when missing)."""
    from tvm.s_tir import meta_schedule as ms

    return ms.database.JSONDatabase(work_dir=str(work_dir), module_equality="structural")


def best_seconds(database, prim_func, target) -> float | None:
    """The best measured time of the kernel ``prim_func`` in ``database`` for ``target``, or None
    when it was never tuned there."""
    times = [float(r.run_secs[0]) for r in _records(database, prim_func, 1) if r.run_secs]
    return min(times) if times else None


def _records(database, prim_func, top_k: int) -> list:
    """The ``top_k`` fastest valid records of the kernel ``prim_func`` in ``database`` (none when
    it holds no such workload: looking one up would add it)."""
    import tvm

    mod = tvm.IRModule({"main": prim_func}) if not isinstance(prim_func, tvm.IRModule) else prim_func
    if not database.has_workload(mod):
        return []
    return list(database.get_top_k(database.commit_workload(mod), top_k))


def tensor_intrinsics() -> None:
    """Import TVM's tensor intrinsics, fast. MetaSchedule's tuning contexts need them, and so
    does each of its builder's worker processes, started anew for every batch of candidates
    (this is their initializer). They are hundreds of TVMScript functions, and TVMScript's
    parser calls ``inspect.stack()`` for each, which reads the source of every frame on the
    stack -- during an import, the frozen import machinery's, looked up through every loaded
    module: 36 s on this machine, 4 s with the source read only for the nearest frames that
    have a file."""
    if "tvm.s_tir.tensor_intrin" in sys.modules:
        return
    with _nearest_frames_only():
        import tvm.s_tir.tensor_intrin  # noqa: F401


@contextlib.contextmanager
def _nearest_frames_only(depth: int = 4):
    def outer_frames(frame, context=1):
        infos = []
        while frame is not None:
            code = frame.f_code
            if len(infos) < depth and not code.co_filename.startswith("<"):
                info = inspect.getframeinfo(frame, context)
                infos.append(inspect.FrameInfo(frame, *info, positions=info.positions))
            else:  # what TVMScript reads of a far frame is its locals
                infos.append(inspect.FrameInfo(frame, code.co_filename, frame.f_lineno, code.co_name, None, None,
                                               positions=None))
            frame = frame.f_back
        return infos

    saved = inspect.stack, inspect.getouterframes
    inspect.stack = lambda context=1: outer_frames(sys._getframe(1), context)
    inspect.getouterframes = outer_frames
    try:
        yield
    finally:
        inspect.stack, inspect.getouterframes = saved
