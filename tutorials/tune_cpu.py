"""
Tune a model on CPU, end to end
===============================

TVM 0.27 builds a CPU kernel as plain loops; tvm-taso's builds give each kernel MetaSchedule's
design-space default (parallel, vectorized, not timed). Tuning times candidate schedules on this
CPU and keeps the best in a database that every later build, benchmark and search reads. This
tutorial optimizes a model with TasoOptimize, tunes the kernels of both the original and the
optimized module into one database, builds and times them side by side, prices a search with
the ``tuned`` cost model, and shows that a second tuning run reuses the database.

The same from the command line::

    tvm-taso tune    model.onnx -o tuned.db --trials 2000
    tvm-taso bench   model.onnx --database tuned.db
    tvm-taso compile model.onnx -o model.so --database tuned.db
    tvm-taso optimize model.onnx -o m.taso.onnx --cost tuned --database tuned.db

and in PyTorch: ``torch.compile(model, backend="tvm_taso", options={"database": "tuned.db"})``.
"""

import sys
import tempfile
from pathlib import Path

import numpy as np

import tvm_taso
from tvm_taso import examples
from tvm_taso import target as targets
from tvm_taso.cost import tuning
from tvm_taso.cost.factory import make_cost_model
from tvm_taso.cost.latency import CompiledModule, side_by_side, speedup
from tvm_taso.numerics import array_relative_error
from tvm_taso.runtime import inputs_for

SMALL = "--small" in sys.argv

######################################################################
# A model, and what TasoOptimize makes of it
# ------------------------------------------
# An Inception-style block: three convolutions of one input, concatenated. The target names the
# cores this process may use: a database is tuned for, and applied to, one such target.

mod = examples.inception_block(size=8 if SMALL else 28, channels=8 if SMALL else 64)
target = targets.with_cores("llvm")
optimized, report = tvm_taso.optimize(mod, target=target)
print("applied:", report["applied"])

######################################################################
# Tune both modules into one database
# -----------------------------------
# ``tune`` splits the trials over a module's kernels by their share of its work, largest first.
# The trials the database holds for a kernel count towards its share: the optimized module's
# kernels that the original shares are topped up only where their share here is larger. Tuning the original too makes the comparison fair: both sides tuned alike. A real
# budget is thousands of trials (``--trials 2000``); this one only shows the steps. A target for
# this machine hands matmuls and convolutions of 1 MFLOP or more to the BLAS numpy links
# (``tvm_taso.blas``; ``"libs": ["tvm"]`` in the target keeps them TVM's): they are not tasks,
# and the trials go to what TVM runs (the im2col copies, bias adds, activations, pools).

trials = 8 if SMALL else 256
database = Path(tempfile.mkdtemp(prefix="tvm-taso-tuned-"))
for name, module in (("original", mod), ("optimized", optimized)):
    result = tuning.tune(module, target, database, trials=trials, min_trials=8)
    print(f"{name}: {result['trials_run']} trials, {result['tasks_tuned']} of {len(result['tasks'])} kernels tuned, "
          f"{result['seconds']:.0f} s")

######################################################################
# Build with the database and time, side by side
# ----------------------------------------------
# A build with the database (``CompiledModule(..., database=...)``; for ``tvm.compile``,
# ``relax_pipeline=build_pipeline(target, database)``) applies the tuned schedules and gives the
# kernels the database lacks the default one. The samples alternate between the builds so that noise hits
# them alike; the ratio of medians, with its quartiles, is the number to quote.

inputs = inputs_for(mod, seed=0)
builds = {
    "untuned": CompiledModule(mod, target, inputs),
    "tuned": CompiledModule(mod, target, inputs, database=str(database)),
    "tuned + taso": CompiledModule(optimized, target, inputs, database=str(database)),
}
outputs = {name: build.run() for name, build in builds.items()}
for name in ("tuned", "tuned + taso"):
    err = max(array_relative_error(a, b) for a, b in zip(outputs["untuned"], outputs[name]))
    print(f"{name}: max relative error {err:.1e} against the untuned build")
    assert err <= 1e-4
samples = side_by_side({name: (lambda b=build: b.time_ms(20 if SMALL else 200)) for name, build in builds.items()},
                       repeats=3 if SMALL else 10)
for name, ms in samples.items():
    print(f"{name:14s} {np.median(ms):8.3f} ms (median)")
for name in ("tuned", "tuned + taso"):
    gain = speedup(samples["untuned"], samples[name])
    print(f"{name} over untuned: {gain['ratio']:.2f}x (quartiles {gain['ratio_low']:.2f}-{gain['ratio_high']:.2f})")

######################################################################
# Price the search with tuned times
# ---------------------------------
# The ``tuned`` cost model prices each candidate kernel with its tuned time from the database; a
# kernel it lacks is predicted from the tuned ones (or scaled from the analytic price when the
# database holds few). ``describe()`` counts which.

tuned_cost = make_cost_model("tuned", target, database=str(database))
searched, _ = tvm_taso.optimize(mod, target=target, cost_model=tuned_cost)
priced = tuned_cost.describe()
print("kernels priced:", {k: priced[k] for k in ("from_database", "predicted", "fallback")})

######################################################################
# A second run reuses the database
# --------------------------------
# A kernel the database holds trials of gets only what its share lacks: a second run with the same
# budget tunes nothing, one with a larger budget tops each kernel up, and a run on another model
# that shares kernels tunes the ones still untuned.

again = tuning.tune(mod, target, database, trials=trials, min_trials=8)
reused = [task for task in again["tasks"] if task["in_database"]]
print(f"second run: {len(reused)} kernels reused from the database, {again['trials_run']} trials on the others")
assert reused and all(task["trials"] == 0 for task in reused)
