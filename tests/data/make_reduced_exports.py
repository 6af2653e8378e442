"""Writes the reduced torchvision exports the tests read (``python tests/data/make_reduced_exports.py``
from the repository, with the extra ``zoo`` installed): three GoogLeNet Inception blocks, whose
pool branches read their input through a ceil-mode max-pool, and three ShuffleNet V2 units with
their channel split and shuffle, at a few channels, exported as ``torch.onnx.export`` (opset 17)
writes the full models. Their regions used to straddle those opaque nodes, which made the full
models fail with CycleError."""

import sys
from pathlib import Path

import torch

HERE = Path(__file__).parent
sys.path.insert(0, str(HERE.parents[1]))  # benchmarks/ is not installed

from benchmarks.onnx_models import import_torchvision  # noqa: E402


def main() -> None:
    if import_torchvision() is None:
        raise SystemExit("needs torchvision: pip install -e '.[zoo]'")
    from torchvision.models.googlenet import Inception
    from torchvision.models.shufflenetv2 import InvertedResidual

    torch.manual_seed(0)  # the same weights, so the same files, on every run
    # blocks whose output has as many channels as their input, and a pool projection as wide as
    # the 1x1 branch (as in GoogLeNet's 4b-4d): the pool branch's conv of one block can be
    # merged with a conv of the block before it, across the opaque ceil-mode max-pool
    googlenet = torch.nn.Sequential(*(Inception(64, 16, 16, 16, 16, 16, 16) for _ in range(3)))
    shufflenet = torch.nn.Sequential(*(InvertedResidual(64, 64, 1) for _ in range(3)))
    for name, module in (("googlenet_reduced", googlenet), ("shufflenet_v2_reduced", shufflenet)):
        module.eval()
        with torch.no_grad():
            torch.onnx.export(module, (torch.randn(1, 64, 28, 28),), str(HERE / f"{name}.onnx"),
                              input_names=["input"], output_names=["output"], opset_version=17, dynamo=False)


if __name__ == "__main__":
    main()
