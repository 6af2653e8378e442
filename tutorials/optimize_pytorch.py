"""
Optimize a PyTorch model
========================

Three ways in from PyTorch, all through ``torch.export`` and TVM's PyTorch frontend:

1. ``tvm_taso.from_torch(module, example_args)``: a Relax ``IRModule`` (weights as constants),
   for ``tvm_taso.optimize``, the ``TasoOptimize`` pass or ``tvm.compile``;
2. ``torch.compile(module, backend="tvm_taso")``: each graph TorchDynamo captures is optimized,
   compiled with TVM and run on the inputs' device; what the backend cannot take runs in eager
   PyTorch, with a warning saying why;
3. the command line, on a saved program (``torch.export.save``)::

       tvm-taso optimize model.pt2 -o model.relax.json --target cuda --check
       tvm-taso compile model.pt2 -o model.so --target cuda

The model here is a small transformer encoder layer from ``torch.nn``: its Q, K and V
projections share an input, which TASO's merge rules turn into one wider matrix multiplication.
"""

import sys
import warnings

import torch

import tvm_taso
from tvm_taso import runtime
from tvm_taso.numerics import array_relative_error

SMALL = "--small" in sys.argv

######################################################################
# A model
# -------
# Hugging Face and torchvision models work the same way; this one needs nothing downloaded.

width, heads, seq = (32, 2, 8) if SMALL else (256, 4, 128)


class Encoder(torch.nn.Module):
    def __init__(self):
        super().__init__()
        self.q, self.k, self.v = (torch.nn.Linear(width, width) for _ in range(3))
        self.out = torch.nn.Linear(width, width)
        self.norm = torch.nn.LayerNorm(width)
        self.ff = torch.nn.Sequential(torch.nn.Linear(width, 4 * width), torch.nn.GELU(),
                                      torch.nn.Linear(4 * width, width))

    def forward(self, x):
        n, s, _ = x.shape
        q, k, v = (p(x).reshape(n, s, heads, -1).transpose(1, 2) for p in (self.q, self.k, self.v))
        attention = torch.softmax(q @ k.transpose(-1, -2) / (width // heads) ** 0.5, dim=-1) @ v
        h = self.norm(x + self.out(attention.transpose(1, 2).reshape(n, s, width)))
        return self.norm(h + self.ff(h))


torch.manual_seed(0)
model = Encoder().eval()
x = torch.randn(1, seq, width)

######################################################################
# 1. ``from_torch`` and ``optimize``
# ----------------------------------
# The cost model prices candidates for the target you deploy to (here ``cuda``; the analytic
# model needs no GPU to price for one). The report says what was applied and why regions
# stopped.

mod = tvm_taso.from_torch(model, (x,))
with warnings.catch_warnings():
    warnings.simplefilter("ignore", tvm_taso.TasoSkippedWarning)
    new_mod, report = tvm_taso.optimize(mod, target="cuda", cost_model="analytic", time_limit=30)
print(f"estimated cost {report['cost_before']:.2f} -> {report['cost_after']:.2f} us, applied {report['applied']}")

# the optimized module computes what PyTorch computes (run here on the CPU)
with torch.no_grad():
    expected = model(x).numpy()
got = runtime.run(new_mod, [x.numpy()])[0]
error = array_relative_error(expected, got)
print(f"relative error against eager PyTorch: {error:.1e}")
assert error <= 1e-4

######################################################################
# 2. ``torch.compile``
# --------------------
# ``backend="tvm_taso"`` takes ``optimize``'s keywords as options; ``TasoBackend`` does too and
# keeps each graph's report. Weights are compiled in as constants: compile again after changing
# them (``torch._dynamo.reset()``).

backend = tvm_taso.passes.TasoBackend(cost_model="analytic", time_limit=30)
compiled = torch.compile(model, backend=backend)
with torch.no_grad():
    got = compiled(x).numpy()
error = array_relative_error(expected, got)
print(f"torch.compile(backend=tvm_taso): {len(backend.reports)} graph(s), applied "
      f"{[r['applied'] for r in backend.reports]}, relative error {error:.1e}")
assert error <= 1e-4 and not backend.fallbacks
