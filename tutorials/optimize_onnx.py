"""
Optimize an ONNX model and export it back
=========================================

TASO's own workflow: ``load_onnx`` -> ``optimize`` -> ``export_onnx``, ONNX in and ONNX out.
The model stays the user's: the same inputs and outputs (names, types, symbolic dimensions),
the nodes the search did not rewrite as they were. The optimized file runs anywhere ONNX runs;
here we compare it with the original in onnxruntime at two batch sizes. The command line does
the same in one line::

    tvm-taso optimize model.onnx -o model.taso.onnx --target cuda --check --html report.html
"""

import os
import sys
import tempfile

import numpy as np
import onnx
from onnx import TensorProto, helper, numpy_helper

import tvm_taso
from tvm_taso.numerics import array_relative_error

SMALL = "--small" in sys.argv

######################################################################
# A model
# -------
# A SqueezeNet "fire" module: a 1x1 squeeze conv, then 1x1 and 3x3 expand convs of the same
# tensor, concatenated. (Any ONNX file works; this one is built in place so the tutorial needs
# no download.)

c, s = (8, 8) if SMALL else (64, 28)
rng = np.random.default_rng(0)


def conv(name, x, cin, cout, k):
    w = numpy_helper.from_array((rng.standard_normal((cout, cin, k, k)) * 0.2).astype("float32"), name + "_w")
    b = numpy_helper.from_array((rng.standard_normal(cout) * 0.1).astype("float32"), name + "_b")
    nodes = [
        helper.make_node("Conv", [x, w.name, b.name], [name], pads=[k // 2] * 4),
        helper.make_node("Relu", [name], [name + "_relu"]),
    ]
    return nodes, [w, b], name + "_relu"


n1, i1, squeeze = conv("squeeze", "x", 2 * c, c // 2, 1)
n2, i2, e1 = conv("expand1", squeeze, c // 2, c, 1)
n3, i3, e3 = conv("expand3", squeeze, c // 2, c, 3)
graph = helper.make_graph(
    n1 + n2 + n3 + [helper.make_node("Concat", [e1, e3], ["y"], axis=1)],
    "fire",
    [helper.make_tensor_value_info("x", TensorProto.FLOAT, ["N", 2 * c, s, s])],  # a dynamic batch
    [helper.make_tensor_value_info("y", TensorProto.FLOAT, ["N", 2 * c, s, s])],
    i1 + i2 + i3,
)
model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)])
workdir = tempfile.mkdtemp()
path = os.path.join(workdir, "fire.onnx")
onnx.save(model, path)

######################################################################
# Import, optimize, export
# ------------------------
# ``load_onnx`` keeps the model as ONNX; ``shapes`` says at which sizes to price the symbolic
# dimensions (the result stays dynamic). ``optimize`` searches with the shipped rules and the
# cost model of the target; the report is plain data. (For TVM's own compile path,
# ``tvm_taso.io.onnx_import.import_relax`` imports the model into Relax instead.)

model_in = tvm_taso.load_onnx(path, shapes={"x": (1, 2 * c, s, s)})
new, report = tvm_taso.optimize(model_in, target="cuda")
print("applied:", report["applied"])
print(f"estimated cost {report['cost_before']:.1f} -> {report['cost_after']:.1f} us "
      f"in {report['search_seconds']:.2f} s of search")
out_path = os.path.join(workdir, "fire.taso.onnx")
tvm_taso.export_onnx(new, out_path)
onnx.checker.check_model(onnx.load(out_path), full_check=True)
print("ops before:", [n.op_type for n in model.graph.node])
print("ops after: ", [n.op_type for n in onnx.load(out_path).graph.node])
assert onnx.load(out_path).graph.input == model.graph.input  # the interface is the original's

######################################################################
# Same outputs?
# -------------
# Run both files on the same random input, at two batch sizes.

try:
    import onnxruntime as ort
except ImportError:
    print("onnxruntime is not installed; skipping the comparison")
else:
    for batch in (1, 3):
        x = rng.standard_normal((batch, 2 * c, s, s)).astype("float32")
        a = ort.InferenceSession(path).run(None, {"x": x})[0]
        b = ort.InferenceSession(out_path).run(None, {"x": x})[0]
        err = array_relative_error(a, b)
        print(f"batch {batch}: max relative error {err:.2e}")
        assert err <= 1e-4
