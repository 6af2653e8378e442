"""Comparing computed tensors: the one definition of "relative error" the package uses."""

from __future__ import annotations

import math

import numpy as np

TOLERANCE = 1e-4  # largest relative error at which an optimized model still "computes the same"


def array_relative_error(expected, got) -> float:
    """``max|a-b| / max|a|`` over one pair of arrays (inf on a shape mismatch, 0 when empty)."""
    a, b = np.asarray(expected, np.float64), np.asarray(got, np.float64)
    if a.shape != b.shape:
        return math.inf
    if not a.size:
        return 0.0
    return float(np.abs(a - b).max() / (np.abs(a).max() + 1e-30))


def relative_error(expected, got) -> float:
    """The largest :func:`array_relative_error` over lists of outputs (inf on a count mismatch)."""
    if len(expected) != len(got):
        return math.inf
    return max((array_relative_error(a, b) for a, b in zip(expected, got)), default=0.0)
