"""The search's options, one :class:`SearchOptions` checked once where a user gives them
(``optimize``, ``TasoOptimize``, the command line): a value out of range is one
:class:`OptionError` line naming the option, what it got and what it takes."""

from __future__ import annotations

import math
import numbers
from dataclasses import MISSING, dataclass, field, fields

SEARCHES = ("backtrack", "eqsat", "auto")


class OptionError(ValueError):
    """An option out of range; ``option`` is its keyword name (a command line maps it to its flag)."""

    def __init__(self, option: str, message: str):
        super().__init__(f"{option} {message}")
        self.option = option


def _real(name: str, value) -> float:
    if isinstance(value, bool) or not isinstance(value, numbers.Real) or math.isnan(value):
        raise OptionError(name, f"must be a number, got {value!r}")
    return float(value)


def _int(name: str, value, least: int) -> None:
    if isinstance(value, bool) or not isinstance(value, numbers.Integral) or value < least:
        raise OptionError(name, f"must be an integer >= {least}, got {value!r}")


def check_kind(kind) -> None:
    """OptionError unless ``kind`` names a search (:data:`SEARCHES`)."""
    if kind not in SEARCHES:
        raise OptionError("search", f"must be one of {', '.join(SEARCHES)}, got {kind!r}")


@dataclass(frozen=True)
class EqsatLimits:
    """What bounds equality saturation in one region (:mod:`tvm_taso.search.eqsat`)."""

    node_limit: int = 1000  # e-nodes per region
    rounds: int = 6  # matching rounds per region
    multi_rounds: int = 6  # rounds in which multi-output rules run (a k-way merge takes k - 1)
    match_limit: int = 24  # sites applied per rule and round
    multi_share: float = 0.5  # of the e-nodes the node limit leaves, what multi-output rules may add per round
    extraction_share: float = 0.3  # of the region's time left for extraction
    ilp: bool = False  # TENSAT's ILP candidate (slow in HiGHS beyond a few hundred e-nodes)
    improve_tries: int = 96  # graphs extraction's local improvement builds and prices in vain before it stops
    refine_budget: int = 4  # graphs backtracking expands from the extracted one (0: no refinement)
    # graphs extraction's search over rule applications prices in vain before it stops (0: not run;
    # see benchmarks/extraction_search.py for what it finds and costs)
    search_tries: int = 0


@dataclass(frozen=True)
class SearchOptions:
    """Everything that steers one search, validated when made:

    - ``alpha``: a finite number >= 1.0 (TASO's relaxation: graphs up to ``alpha`` times the
      best cost are explored; 1.0 keeps only improvements);
    - ``budget``: an integer >= 1 (graphs expanded per region);
    - ``time_limit``: seconds >= 0 for the whole search; ``float("inf")`` means no limit (0
      searches nothing);
    - ``region_size``: an integer >= 2 (ops per region);
    - ``patience``: an integer >= 1 (expansions without a better graph before a region stops);
    - ``sweeps``: an integer >= 1, the most times both passes of regions run over the graph; a
      sweep runs again only while the one before lowered the graph's cost by more than
      ``min_gain`` (:func:`tvm_taso.search.regions.search_regions`);
    - ``min_gain``: a fraction in [0, 1) (the least relative gain a rewrite must bring; float
      rounding is not a gain);
    - ``kind``: one of :data:`SEARCHES`;
    - ``eqsat``: the :class:`EqsatLimits` of ``kind="eqsat"``/``"auto"``;
    - ``workers``: an integer >= 1, processes searching regions (:mod:`.pool`); None (default):
      the cores this process may use;
    - ``max_weight_growth``: a number >= 1.0 (or ``inf``): a graph whose rewrites would make its
      weights more than this many times larger is left as it was (an enlarged kernel or a merge
      of weights that stay in use elsewhere grows the written model).
    """

    alpha: float = 1.05
    budget: int = 200
    time_limit: float = 60.0
    region_size: int = 32
    patience: int = 64
    sweeps: int = 2
    min_gain: float = 1e-6
    kind: str = "backtrack"
    eqsat: EqsatLimits = field(default_factory=EqsatLimits)
    workers: int | None = None
    max_weight_growth: float = 2.0

    def __post_init__(self):
        a = _real("alpha", self.alpha)
        if not (math.isfinite(a) and a >= 1.0):
            raise OptionError("alpha", f"must be a finite number >= 1.0, got {self.alpha!r}")
        _int("budget", self.budget, 1)
        if _real("time_limit", self.time_limit) < 0:
            raise OptionError("time_limit", f"must be >= 0 seconds (inf for no limit), got {self.time_limit!r}")
        _int("region_size", self.region_size, 2)
        _int("patience", self.patience, 1)
        _int("sweeps", self.sweeps, 1)
        g = _real("min_gain", self.min_gain)
        if not 0.0 <= g < 1.0:
            raise OptionError("min_gain", f"must be a fraction in [0, 1), got {self.min_gain!r}")
        check_kind(self.kind)
        if not isinstance(self.eqsat, EqsatLimits):
            raise OptionError("eqsat", f"must be an EqsatLimits, got {self.eqsat!r}")
        if self.workers is not None:
            _int("workers", self.workers, 1)
        if not _real("max_weight_growth", self.max_weight_growth) >= 1.0:
            raise OptionError("max_weight_growth", f"must be a number >= 1.0 (inf for no limit), got "
                                                   f"{self.max_weight_growth!r}")

    # optimize's keyword for each option it takes under another name
    KEYWORD_NAMES = {"kind": "search"}

    @classmethod
    def keywords(cls) -> set[str]:
        """The names ``optimize`` takes these options under (``search`` for ``kind``)."""
        return {cls.KEYWORD_NAMES.get(f.name, f.name) for f in fields(cls)}

    @classmethod
    def from_keywords(cls, options: SearchOptions | None = None, **given) -> SearchOptions:
        """The options from ``optimize``'s keywords (:meth:`keywords`; ``None`` is a keyword not
        given: the default here applies), validated; or ``options`` when no keyword is given.
        A setting given both ways is refused: which one was meant cannot be told."""
        names = {v: k for k, v in cls.KEYWORD_NAMES.items()}
        given = {k: v for k, v in given.items() if v is not None}
        if options is None:
            return cls(**{names.get(k, k): v for k, v in given.items()})
        if given:
            both = sorted(given)
            raise ValueError(f"{', '.join(both)} given both as keyword{'s' * (len(both) > 1)} and in options; "
                             "give search settings one way")
        return options

    @classmethod
    def default(cls, name: str):
        """The default of the option ``optimize`` takes as ``name``: what help texts quote."""
        names = {v: k for k, v in cls.KEYWORD_NAMES.items()}
        return next(f.default if f.default_factory is MISSING else f.default_factory()
                    for f in fields(cls) if f.name == names.get(name, name))

    def settings(self) -> dict:
        """The options as the report lists them (JSON)."""
        return {"alpha": self.alpha, "budget": self.budget, "time_limit": self.time_limit,
                "region_size": self.region_size, "sweeps": self.sweeps, "min_gain": self.min_gain, "search": self.kind,
                "max_weight_growth": self.max_weight_growth}


def check_repeats(name: str, value) -> None:
    """OptionError unless ``value`` is a count of timing rounds (an integer >= 1)."""
    _int(name, value, 1)
