"""Comparing computed tensors: the one definition of "relative error" the package uses."""

from __future__ import annotations

import math

import numpy as np

TOLERANCE = 1e-4  # largest relative error at which an optimized float32 model still "computes the same"

# Largest relative error by element type: float16 and bfloat16 keep 11 and 8 bits of mantissa;
# integers and booleans must match exactly.
TOLERANCES = {"float64": 1e-4, "float32": TOLERANCE, "float16": 1e-2, "bfloat16": 2e-2}

# The scale below which a reference counts as all-zero: the error is then absolute, so a
# reference of zeros does not turn a 1e-9 difference into an infinite relative error.
SCALE_FLOOR = 1e-6


def tolerance(dtype) -> float:
    """The largest relative error allowed for outputs of ``dtype`` (0 for integers and bool)."""
    return TOLERANCES.get(str(np.dtype(dtype)) if not isinstance(dtype, str) else dtype, 0.0)


def same_nonfinite(a: np.ndarray, b: np.ndarray) -> bool:
    """True when ``a`` and ``b`` have NaN, +inf and -inf at the same positions."""
    return bool(
        np.array_equal(np.isnan(a), np.isnan(b))
        and np.array_equal(np.isposinf(a), np.isposinf(b))
        and np.array_equal(np.isneginf(a), np.isneginf(b))
    )


def array_relative_error(expected, got) -> float:
    """``max|a-b| / max(max|a|, SCALE_FLOOR)`` over the finite entries of one pair of arrays.

    inf on a shape mismatch or when the non-finite entries differ (NaN where the reference has
    none, +inf against -inf, ...); 0 when empty. Never NaN, so ``max`` over errors is safe.
    """
    a, b = np.asarray(expected), np.asarray(got)
    if a.shape != b.shape:
        return math.inf
    if not a.size:
        return 0.0
    a, b = a.astype(np.float64), b.astype(np.float64)
    if not same_nonfinite(a, b):
        return math.inf
    finite = np.isfinite(a)
    if not finite.any():
        return 0.0
    a, b = a[finite], b[finite]
    return float(np.abs(a - b).max() / max(float(np.abs(a).max()), SCALE_FLOOR))


def relative_error(expected, got) -> float:
    """The largest :func:`array_relative_error` over lists of outputs (inf on a count mismatch)."""
    if len(expected) != len(got):
        return math.inf
    return max((array_relative_error(a, b) for a, b in zip(expected, got)), default=0.0)
