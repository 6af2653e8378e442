"""TASO's cost-based backtracking search, run region by region."""

from .backtrack import SearchStats, search

__all__ = ["SearchStats", "search"]
