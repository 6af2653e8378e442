"""Writes the reduced torchvision exports the tests read (``python tests/data/make_reduced_exports.py``,
with torch and torchvision 0.28 installed): two GoogLeNet Inception blocks with the ceil-mode
max-pool between them, and two ShuffleNet V2 units with their channel split and shuffle, at a
few channels, exported as ``torch.onnx.export`` (opset 17) writes the full models. Each reproduced
the full model's CycleError before regions were made convex."""

from pathlib import Path

import torch

HERE = Path(__file__).parent


def torchvision_models():
    """``torchvision.models``, importable beside the CPU build of torch: the wheel registers fake
    kernels for ops that build lacks, and fails on the first one; registering none is harmless
    for models without those ops."""
    register_fake = torch.library.register_fake
    torch.library.register_fake = lambda *args, **kwargs: (lambda fn: fn)
    try:
        import torchvision.models
    finally:
        torch.library.register_fake = register_fake
    return torchvision.models


def main() -> None:
    models = torchvision_models()
    from torchvision.models.googlenet import Inception
    from torchvision.models.shufflenetv2 import InvertedResidual

    # blocks whose output has as many channels as their input, and a pool projection as wide as
    # the 1x1 branch (as in GoogLeNet's 4b-4d): the pool branch's conv of one block can be
    # merged with a conv of the block before it, across the opaque ceil-mode max-pool
    googlenet = torch.nn.Sequential(*(Inception(64, 16, 16, 16, 16, 16, 16) for _ in range(3)))
    shufflenet = torch.nn.Sequential(*(InvertedResidual(64, 64, 1) for _ in range(3)))
    assert models is not None
    torch.manual_seed(0)
    for name, module in (("googlenet_reduced", googlenet), ("shufflenet_v2_reduced", shufflenet)):
        module.eval()
        with torch.no_grad():
            torch.onnx.export(module, (torch.randn(1, 64, 28, 28),), str(HERE / f"{name}.onnx"),
                              input_names=["input"], output_names=["output"], opset_version=17, dynamo=False)


if __name__ == "__main__":
    main()
