"""
TasoOptimize in a TVM compile pipeline
======================================

``import tvm_taso`` registers a Relax pipeline named ``"taso"``: TasoOptimize, then the
target's default build pipeline. This tutorial compiles a model with and without it and times
both, side by side, in one run.
"""

import sys

import numpy as np
import tvm
from tvm import relax

import tvm_taso  # noqa: F401 - registers relax.get_pipeline("taso")
from tvm_taso import examples
from tvm_taso.numerics import array_relative_error
from tvm_taso.passes import TasoOptimize
from tvm_taso.runtime import inputs_for

SMALL = "--small" in sys.argv

######################################################################
# A model
# -------
# An Inception-style block: 1x1, 3x3 and 5x5 convolutions of the same input, each with a bias
# and a relu, concatenated. TASO merges the three convolutions into one.

mod = examples.inception_block(size=8 if SMALL else 28, channels=8 if SMALL else 64)
target = tvm.target.Target({"kind": "llvm", "num-cores": 2})

######################################################################
# The pass on its own
# -------------------
# ``TasoOptimize`` is an ordinary module pass: it goes in a ``Sequential`` like any other, and
# keeps the report of its last run.

taso = TasoOptimize(target=target, time_limit=10)
optimized = tvm.transform.Sequential([taso, relax.transform.CanonicalizeBindings()])(mod)
print("applied:", taso.last_report["applied"])
print(f"estimated cost {taso.last_report['cost_before']:.1f} -> {taso.last_report['cost_after']:.1f} us")

######################################################################
# Compile both ways and time them
# -------------------------------
# ``relax_pipeline=relax.get_pipeline("taso")`` is all a TVM user adds. The timings alternate
# between the two builds so that machine noise hits both alike; the ratio of medians is the
# number to quote.

dev = tvm.cpu()
inputs = [tvm.runtime.tensor(a) for a in inputs_for(mod)]
vms = {}
for name, pipeline in [("default", "default"), ("taso", relax.get_pipeline("taso"))]:
    ex = tvm.compile(mod, target=target, relax_pipeline=pipeline)
    vms[name] = relax.VirtualMachine(ex, dev)

outs = {name: vm["main"](*inputs).numpy() for name, vm in vms.items()}
err = array_relative_error(outs["default"], outs["taso"])
print(f"same outputs: max relative error {err:.2e}")
assert err <= 1e-4

samples = {name: [] for name in vms}
for _ in range(3 if SMALL else 10):
    for name, vm in vms.items():
        samples[name].append(vm.time_evaluator("main", dev, number=3, repeat=1)(*inputs).median * 1e3)
median = {name: float(np.median(v)) for name, v in samples.items()}
for name, ms in median.items():
    print(f"{name:8s} {ms:8.3f} ms (median)")
print(f"speedup default/taso: {median['default'] / median['taso']:.2f}x")

######################################################################
# Untuned LLVM kernels are slow and their relative speed says little about a tuned build; the
# analytic cost model prices for the target you name (``cuda`` for a GPU). See benchmarks/README.md for
# measured numbers.
