"""``optimize``'s report: typed while it is built (:class:`Report`), strict JSON once
(:meth:`Report.to_json`)."""

from __future__ import annotations

import math
from collections import Counter
from dataclasses import dataclass, field

from tvm_taso.search import SearchOptions, SearchStats


@dataclass
class Report:
    """What one ``optimize`` call did (see :func:`tvm_taso.optimize` for the JSON fields)."""

    cost_model: dict
    target: str | None
    options: SearchOptions
    guard_setting: object  # optimize's ``guard``: a bool or a callable
    stats: SearchStats
    skipped: Counter
    started: float  # perf_counter() when optimize began (the curve's zero)
    cost_before: float = 0.0
    cost_after: float = 0.0
    folded: int = 0
    seconds: float = 0.0
    rules_seconds: float = 0.0
    rules_refused: list = field(default_factory=list)
    facts: dict = field(default_factory=dict)  # the front end's own (ONNX: dims priced, opaque reasons, kernels)
    region_guard: dict | None = None
    guard: dict | None = None
    kernels_before: int | None = None
    kernels_after: int | None = None
    search_cost_after: float = 0.0  # the search's estimate, kept when a guard reverts

    @property
    def reverted(self) -> bool:
        return self.guard is not None and not self.guard["kept"]

    def judged(self, verdict: dict) -> None:
        """The whole-model guard's ``verdict`` (``"kept"``: whether the rewrite stays)."""
        self.guard = verdict
        if self.reverted:
            verdict["reverted"] = dict(sorted(self.stats.applied.items()))
            self.cost_after = self.cost_before

    def to_json(self) -> dict:
        """The report as strict JSON: a cost that is not a finite number becomes null, with a
        line in ``notes`` per field."""
        stats, options = self.stats, self.options
        report = {
            "cost_model": self.cost_model,
            "target": self.target,
            "cost_before": self.cost_before,
            "cost_after": self.cost_after,
            "speedup_estimate": 1.0 if self.reverted or not self.cost_after else self.cost_before / self.cost_after,
            "search_cost_after": self.search_cost_after,
            "search_seconds": self.seconds,
            "expanded": stats.expanded,
            "candidates": stats.candidates,
            "regions": stats.regions,
            "regions_cut_short": stats.regions_cut_short,
            "regions_reused": stats.reused,
            "regions_stopped": dict(sorted(stats.stopped.items())),
            "regions_dropped": stats.dropped,
            "regions_costlier_in_graph": stats.costlier_in_graph,
            "search": {"kind": options.kind, "seconds": stats.seconds, "sweeps": stats.sweeps,
                       "regions": dict(stats.engines),
                       "worker_regions": stats.worker_regions,
                       **({"eqsat": stats.eqsat.to_json()} if stats.engines["eqsat"] else {})},
            "applied": {} if self.reverted else dict(sorted(stats.applied.items())),
            "constants_folded": self.folded + stats.folded,
            "merged_weights_reused": 0 if self.reverted else stats.merges_reused,
            "skipped": [{"what": what, "count": n} for what, n in sorted(self.skipped.items())],
            "curve": _curve(self.started, self.cost_before, stats.curve),
            "rewrites": stats.rewrites,
            "rules_refused": [r.to_json() for r in self.rules_refused],
            "rules_check_seconds": self.rules_seconds,
            **self.facts,
            **({"region_guard": self.region_guard} if self.region_guard is not None else {}),
            "settings": {**options.settings(), "region_guard": self.region_guard is not None,
                         "guard": _named(self.guard_setting)},
            **({"guard": self.guard} if self.guard is not None else {}),
            "kernels_before": self.kernels_before,
            "kernels_after": self.kernels_after,
        }
        return _strict_json(report)


def _named(guard) -> object:
    return guard if isinstance(guard, bool) else getattr(guard, "__name__", type(guard).__name__)


def _strict_json(report: dict) -> dict:
    """``report`` with every float that is not finite (a kernel that failed to build or run
    costs infinity under ``measure``) as None, and one line in ``report["notes"]`` per field."""
    notes = []

    def clean(x, path):
        if isinstance(x, float) and not math.isfinite(x):
            notes.append(f"{path} was {x!r} (a kernel that failed to build or run, or no time measured); "
                         "written as null")
            return None
        if isinstance(x, dict):
            return {k: clean(v, f"{path}.{k}" if path else str(k)) for k, v in x.items()}
        if isinstance(x, (list, tuple)):
            return [clean(v, f"{path}[{i}]") for i, v in enumerate(x)]
        return x

    cleaned = clean(report, "")
    if notes:
        cleaned["notes"] = cleaned.get("notes", []) + notes
    return cleaned


def _curve(t0: float, start: float, changes: list) -> list:
    """Best total cost against seconds since the search started."""
    points, total = [[0.0, start]], start
    for t, delta in changes:
        total += delta
        points.append([round(t - t0, 6), total])
    return points
