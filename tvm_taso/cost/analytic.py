"""The analytic cost model: a roofline per kernel, no compiler or device needed."""

from __future__ import annotations

import os
from dataclasses import dataclass

from tvm_taso import target as targets
from tvm_taso.cost.model import CostModel, Kernel
from tvm_taso.ir import ops


@dataclass(frozen=True)
class Roofline:
    peak_flops: float  # FLOP/s
    bandwidth: float  # bytes/s
    launch: float  # seconds per kernel
    parallel_slots: int  # output elements needed to fill the machine
    group_knee: int = 0  # channels per group from which a grouped conv runs at peak (0: always)


# Rooflines by device family. The cuda and llvm figures are the ones every result so far was
# priced with; the others are rough class figures, so that a small GPU is not priced as an H100.
# An H100/H200-class GPU running dlight's schedules: fp32 SIMT peak, HBM bandwidth.
CUDA_GPU = Roofline(peak_flops=50e12, bandwidth=4.0e12, launch=4e-6, parallel_slots=132 * 1024, group_knee=64)
# An MI210-class GPU: fp32 vector peak, HBM2e bandwidth.
ROCM_GPU = Roofline(peak_flops=22e12, bandwidth=1.6e12, launch=5e-6, parallel_slots=104 * 1024, group_knee=64)
# Vulkan, Metal, OpenCL, WebGPU: a laptop or integrated GPU sharing LPDDR/GDDR bandwidth.
OTHER_GPU = Roofline(peak_flops=5e12, bandwidth=2.0e11, launch=10e-6, parallel_slots=32 * 1024, group_knee=64)


# How fast a grouped convolution runs on a GPU, as a fraction of the dense roofline, by its
# input channels per group c (an ESTIMATE, shaped by public measurements, not measured here):
#     efficiency(c) = min(1, (c / knee) ** 1.5),  knee = 64 channels per group
# i.e. 1.6% at c = 4, 4.4% at 8, 12.5% at 16, 35% at 32, peak from 64. Where the shape comes
# from: ShuffleNet V2 (Ma et al., ECCV 2018, Table 2: 1x1 convs of equal FLOPs on a GTX 1080Ti)
# loses about 5.8x throughput going from 1 to 8 groups (about 128 to 45 channels per group),
# an efficiency falling faster than linearly in c (exponent near 1.7); TASO (Jia et al., SOSP
# 2019) measured with cuDNN that ResNeXt-50's 32-group convs (4-32 channels per group) run
# faster with half the groups despite twice the FLOPs, which needs efficiency(2c) > 2
# efficiency(c) below the knee: an exponent above 1. The exponent 1.5 and the knee 64 are our
# choices within those bounds (a GPU's warp tiles fill at 32-64 channels). Depthwise convs
# (c = 1) keep the dense roofline: cuDNN and TVM have dedicated kernels for them, which run
# near memory speed. CPUs keep the dense roofline too (group_knee 0). A measured cost model
# decides for real.
GROUP_EFFICIENCY_EXPONENT = 1.5


def group_efficiency(channels_per_group: int, knee: int) -> float:
    """The fraction of the dense roofline a grouped conv with ``channels_per_group`` input
    channels per group reaches (see above); 1 for ``knee`` 0 and for depthwise convs."""
    if knee <= 0 or channels_per_group <= 1:
        return 1.0
    return min(1.0, (channels_per_group / knee) ** GROUP_EFFICIENCY_EXPONENT)


def cpu_roofline(cores: int) -> Roofline:
    """A x86 core with AVX2 FMA (2 x 8-wide) near 2.5 GHz per core; DRAM bandwidth of a small server."""
    return Roofline(peak_flops=cores * 40e9, bandwidth=20e9, launch=1e-6, parallel_slots=cores * 16)


def roofline_for(target) -> tuple[str, Roofline]:
    """The target's kind and roofline (any target form; None is the current target, else this CPU)."""
    name = targets.kind(target)
    if name == "cuda":
        return name, CUDA_GPU
    if name == "rocm":
        return name, ROCM_GPU
    if name in targets.GPU_KINDS:
        return name, OTHER_GPU
    return name, cpu_roofline(targets.num_cores(target) or os.cpu_count() or 1)


class AnalyticCost(CostModel):
    """Roofline cost: launch + max(FLOPs / (peak x utilisation), bytes / bandwidth) per kernel.
    Utilisation grows with the kernel's output size until it fills the machine, so one large
    kernel beats several small ones, as on real hardware. Each op fused into a kernel adds a
    little (``FUSED_OP`` µs of index arithmetic), so of two kernels that move the same bytes the
    one with fewer ops wins (e.g. no split feeding a concat)."""

    FUSED_OP = 0.02

    name = "analytic"

    def __init__(self, target=None):
        super().__init__()
        self.target_kind, self.roof = roofline_for(target)

    def kernel_cost(self, kernel: Kernel) -> float:
        r = self.roof
        flops, read = 0.0, 0
        out_elems = 0
        produced: list[list] = []
        for op, attrs, operands in kernel.ops:
            spec = ops.OPS[op]
            types = [o[1] if o[0] == "in" else produced[o[1]][o[2]] for o in operands]
            read += sum(o[1].nbytes for o in operands if o[0] == "in" and o[1] is not None)
            outs = spec.infer(types, dict(attrs))
            produced.append(outs)
            out_elems = max(out_elems, max(t.size for t in outs))
            if spec.flops is not None:
                flops += spec.flops(types, outs, dict(attrs)) / self._efficiency(op, dict(attrs), types)
        written = sum(t.nbytes for t in kernel.outputs)
        utilisation = min(1.0, out_elems / r.parallel_slots)
        compute = flops / (r.peak_flops * max(utilisation, 1e-3))
        memory = (read + written) / r.bandwidth
        return 1e6 * (r.launch + max(compute, memory)) + self.FUSED_OP * (len(kernel.ops) - 1)

    def _efficiency(self, op: str, attrs: dict, types: list) -> float:
        """How far below the roofline the op's arithmetic runs (grouped convs on GPUs)."""
        if op != "conv2d" or attrs["groups"] == 1:
            return 1.0
        return group_efficiency(types[1].shape[1], self.roof.group_knee)

    def describe(self) -> dict:
        return {"name": self.name, "target_kind": self.target_kind, "roofline": self.roof.__dict__}

