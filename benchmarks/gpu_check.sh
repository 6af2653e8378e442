#!/usr/bin/env bash
# One bounded run on a GPU machine that has no TVM: fill the measurement database with CUDA
# kernel times and print end-to-end latency without TasoOptimize, with the analytic cost model
# and with measured costs (benchmarks/gpu_check.py does the work; see its docstring).
#
# Then the ONNX models optimized for onnxruntime's CUDA and TensorRT providers (ort:cuda,
# ort:tensorrt) and timed there, where this machine's onnxruntime has them.
#
# On a GPU machine with TVM installed (pip install -e .) or with access to PyPI it needs nothing
# else: `bash benchmarks/gpu_check.sh`. For a machine that reaches no package index, prepare
# once, here (no GPU needed; ~3 minutes), with the shared packing tool:
#   bash ../shared/tools/pack_tvm_for_device.sh .devicepkgs
#   echo /.devicepkgs/ >> "$(git rev-parse --git-path info/exclude)"
# The pack (62.7 MiB) and this repository's 3 MiB are over a lent machine's 64 MiB carry. A slim
# pack, 60.6 MiB: tvm and tvm_ffi in one tarball, without what a CUDA build never loads (about
# 4 minutes):
#   d=$(mktemp -d) && tar -xJf .devicepkgs/tvm.tar.xz -C "$d" && unzip -q .devicepkgs/whl/*.whl -d "$d" &&
#   rm -rf "$d"/tvm/web "$d"/tvm/relax/frontend/tflite "$d"/tvm/backend/trn "$d"/tvm_ffi/3rdparty \
#     "$d"/tvm_ffi/src "$d"/tvm_ffi/cython "$d"/tvm_ffi/lib/libtvm_ffi_testing.so &&
#   (cd "$d" && tar -cf - . | xz -T0 -9e) > .devicepkgs/tvm.tar.xz && rm .devicepkgs/whl/*.whl
# and, for the onnxruntime stage on a machine without onnxruntime-gpu:
#   pip download onnxruntime-gpu --no-deps --only-binary :all: -d .devicepkgs/whl
# (about 200 MB: more than a lent device machine's 64 MiB carry; there those rows say so).
# Dry runs here: `bash benchmarks/gpu_check.sh --target llvm --quick` (CPU), and the CUDA
# compile path with a stub libcuda (../shared/tools/libcuda_stub.c):
#   LD_LIBRARY_PATH=DIR bash benchmarks/gpu_check.sh --quick --compile-only \
#       --target '{"kind":"cuda","arch":"sm_90a"}'
# On the GPU machine (carry: [".devicepkgs"], timeout_s 540):
#   bash benchmarks/gpu_check.sh
# Results: $OUT/gpu_check.json, $OUT/measurements.jsonl (the CUDA kernel times: copy them into
# ~/.cache/tvm-taso/ or train the learned model on them), $OUT/gpu_check.log.
# Extra arguments go to gpu_check.py (e.g. --models bert resnet50 --deadline 300).
set -uo pipefail
repo=$(cd "$(dirname "$0")/.." && pwd)
out=${OUT:-/tmp/gpu_check_out}
mkdir -p "$out"
site=/tmp/gpu_check_site
start=$(date +%s)

# 1. TVM: use the one installed; else unpack the packed wheel (pack_tvm_for_device.sh, for a
#    machine that reaches no package index); else install the repository's own pins from PyPI.
if ! python3 -c "import tvm" >/dev/null 2>&1; then
  pkgs=${TVM_TASO_DEVICEPKGS:-$repo/.devicepkgs}
  mkdir -p "$site/tvm"
  if [ -f "$pkgs/tvm.tar.xz" ]; then
    tar -xJf "$pkgs/tvm.tar.xz" -C "$site/tvm" || exit 2
    if compgen -G "$pkgs/whl/*.whl" >/dev/null; then  # a slim pack holds tvm_ffi in the tarball
      python3 -m pip install -q --no-index --no-deps --no-compile --target "$site/tvm" "$pkgs"/whl/*.whl || exit 2
    fi
  else
    python3 - "$repo/pyproject.toml" > "$site/requirements.txt" <<'PY'
import re, sys
text = open(sys.argv[1]).read()
deps = re.search(r"^dependencies = \[(.*?)^\]", text, re.S | re.M).group(1)
print("\n".join(re.findall(r'"([^"]+)"', deps) + ["onnxruntime"]))
PY
    echo "no TVM here and no $pkgs/tvm.tar.xz: installing the repository's pins into $site/tvm"
    python3 -m pip install -q --target "$site/tvm" -r "$site/requirements.txt" || {
      echo "cannot install TVM: install the repository (pip install -e .) or pack it with pack_tvm_for_device.sh" >&2
      exit 2
    }
  fi
  export PYTHONPATH="$site/tvm${PYTHONPATH:+:$PYTHONPATH}"
fi
echo "tvm ready after $(( $(date +%s) - start )) s"

# 2. tvm-taso without installing it: its installed layout (passes/ and rules/ inside tvm_taso/).
src="$site/src"
rm -rf "$src" && mkdir -p "$src"
cp -r "$repo/tvm_taso" "$src/tvm_taso"
cp -r "$repo/passes" "$src/tvm_taso/passes"
cp -r "$repo/rules" "$src/tvm_taso/rules"
cp -r "$repo/benchmarks" "$src/benchmarks"
export PYTHONPATH="$src${PYTHONPATH:+:$PYTHONPATH}"

# 3. CUDA compiles with nvcc (no NVRTC needed); kernel times land in $OUT.
export TVM_CUDA_COMPILE_MODE=${TVM_CUDA_COMPILE_MODE:-nvcc}
export PATH="$PATH:/usr/local/cuda/bin"
export TVM_TASO_CACHE="$out"
export PYTHONUNBUFFERED=1
cd "$src" || exit 2  # so that `import tvm_taso` is the copy above, not the source tree
timeout -k 10 "${GPU_CHECK_TIMEOUT:-420}" python3 -m benchmarks.gpu_check --out "$out" "$@" 2>&1 | tee "$out/gpu_check.log"
rc=${PIPESTATUS[0]}
echo "gpu_check: exit $rc after $(( $(date +%s) - start )) s"
exit "$rc"
