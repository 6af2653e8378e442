"""The search's options, checked once where a user gives them (``optimize``, ``TasoOptimize``):
a value out of range is one ValueError line naming the option, what it got and what it takes."""

from __future__ import annotations

import math
import numbers


def _real(name: str, value) -> float:
    if isinstance(value, bool) or not isinstance(value, numbers.Real) or math.isnan(value):
        raise ValueError(f"{name} must be a number, got {value!r}")
    return float(value)


def _int(name: str, value, least: int) -> None:
    if isinstance(value, bool) or not isinstance(value, numbers.Integral) or value < least:
        raise ValueError(f"{name} must be an integer >= {least}, got {value!r}")


def validate(alpha=1.05, budget=200, time_limit=60.0, region_size=32, min_gain=1e-6, guard_repeats=7) -> None:
    """Raise ValueError for the first option out of range:

    - ``alpha``: a finite number >= 1.0 (TASO's relaxation; 1.0 keeps only improvements);
    - ``budget``: an integer >= 1 (graphs expanded per region);
    - ``time_limit``: seconds >= 0; ``float("inf")`` means no limit (0 searches nothing);
    - ``region_size``: an integer >= 2 (ops per region);
    - ``min_gain``: a fraction in [0, 1) (the least relative gain a rewrite must bring);
    - ``guard_repeats``: an integer >= 1.
    """
    a = _real("alpha", alpha)
    if not (math.isfinite(a) and a >= 1.0):
        raise ValueError(f"alpha must be a finite number >= 1.0, got {alpha!r}")
    _int("budget", budget, 1)
    if _real("time_limit", time_limit) < 0:
        raise ValueError(f"time_limit must be >= 0 seconds (inf for no limit), got {time_limit!r}")
    _int("region_size", region_size, 2)
    g = _real("min_gain", min_gain)
    if not 0.0 <= g < 1.0:
        raise ValueError(f"min_gain must be a fraction in [0, 1), got {min_gain!r}")
    _int("guard_repeats", guard_repeats, 1)
