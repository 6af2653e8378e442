"""Fingerprints: what a graph of the enumeration computes, in exact integer arithmetic modulo
the prime ``P``, evaluated with the op table of :mod:`tvm_taso.ir.ops`.

Each template runs as its Relax ops (:func:`~tvm_taso.generate.search_space.relax_steps`), each
op by the op table's evaluator with the result reduced mod ``P``, except where that would not be
exact or not be fast enough: ReLU is TASO's polynomial stand-in ``x(x+1)+1`` (a real ReLU has no
meaning on residues), average pooling is the window sum times the modular inverse of the window
count, max pooling pads with -1 (below every residue; the op table pads with -inf, a float), and
conv2d skips the op table's einsum path search, which costs several times the product itself on
these tiny tensors (the enumeration evaluates about 10**6 graphs).
"""

from __future__ import annotations

import numpy as np

from tvm_taso.generate.search_space import OpTemplate, relax_steps
from tvm_taso.ir import ops as _ops
from tvm_taso.ir.ops import pad_hw, windows

P = 33554393  # the largest prime below 2**25: products of two residues fit in 2**50


def evaluate_mod_p(t: OpTemplate, arrays: list, split_at: int | None = None) -> list[np.ndarray]:
    """The outputs of template ``t`` on int64 residues ``arrays`` (mod ``P``)."""
    for k, (name, attrs) in enumerate(relax_steps(t, arrays[0].shape, split_at)):
        arrays = _op_mod_p(name, arrays if k == 0 else arrays[:1], attrs)
    return arrays


def _op_mod_p(name: str, arrays: list, attrs: dict) -> list[np.ndarray]:
    if name == "relu":
        x = arrays[0]
        return [(x * (x + 1) + 1) % P]
    if name == "conv2d":
        return [_conv2d_mod_p(arrays[0], arrays[1], attrs)]
    if name in ("avg_pool2d", "max_pool2d"):
        kh, kw = attrs["pool_size"]
        fill = 0 if name == "avg_pool2d" else -1
        win = windows(pad_hw(arrays[0], attrs["padding"], fill), kh, kw, attrs["strides"], attrs["dilation"])
        if name == "max_pool2d":
            return [win.max(axis=(4, 5))]
        return [(win.sum(axis=(4, 5)) % P * _inverse_counts(arrays[0].shape[2:], attrs)) % P]
    return [y % P for y in _ops.evaluate(name, arrays, attrs)]


def _conv2d_mod_p(x, w, attrs) -> np.ndarray:
    groups = attrs["groups"]
    o, i, kh, kw = w.shape
    win = windows(pad_hw(x, attrs["padding"]), kh, kw, attrs["strides"], attrs["dilation"])
    og = o // groups
    outs = [np.einsum("nchwij,ocij->nohw", win[:, g * i:(g + 1) * i], w[g * og:(g + 1) * og]) % P
            for g in range(groups)]
    return np.concatenate(outs, axis=1) if groups > 1 else outs[0]


_INVERSE_COUNTS: dict = {}


def _inverse_counts(hw: tuple, attrs: dict) -> np.ndarray:
    """Modular inverses of the number of input elements in each average-pooling window."""
    kh, kw = attrs["pool_size"]
    key = (tuple(hw), attrs["pool_size"], attrs["padding"], attrs["strides"], attrs["dilation"],
           attrs["count_include_pad"])
    if key not in _INVERSE_COUNTS:
        ones = pad_hw(np.ones((1, 1) + tuple(hw), dtype=np.int64), attrs["padding"])
        count = windows(ones, kh, kw, attrs["strides"], attrs["dilation"]).sum(axis=(4, 5))
        if attrs["count_include_pad"]:
            count = np.full_like(count, kh * kw)
        _INVERSE_COUNTS[key] = np.vectorize(lambda c: pow(int(c), P - 2, P))(count).astype(np.int64)
    return _INVERSE_COUNTS[key]


_HASH_KEYS = np.random.default_rng(20190527).integers(1, 2**63, size=4096, dtype=np.int64).astype(np.uint64) | 1


def fingerprint(arr: np.ndarray, dims: tuple) -> int:
    """64-bit fingerprint of a tensor's residues and symbolic shape (a random linear hash,
    wrapping mod 2**64; the keys are fixed, so it is the same in every process)."""
    flat = arr.reshape(-1).astype(np.uint64)
    with np.errstate(over="ignore"):
        h = int((flat * _HASH_KEYS[: flat.size]).sum())
    return (h ^ (hash(dims) & 0xFFFFFFFFFFFFFFFF) * 0x9E3779B97F4A7C15 ^ flat.size) & 0xFFFFFFFFFFFFFFFF
