"""The progress bars of long jobs (the search, checking and proving rules): tqdm on stderr,
cleared when done; none when stderr is not a terminal (a CI log or a pipe gets the command
line's one line per phase, not ``\r`` updates) or tqdm is missing."""

from __future__ import annotations

import sys


def progress_bar(desc: str, unit: str, total: int | None = None):
    """A tqdm bar (disabled, drawing nothing, off a terminal), or None without tqdm (callers
    then show nothing)."""
    try:
        from tqdm import tqdm
    except ImportError:
        return None
    return tqdm(total=total, desc=desc, unit=unit, file=sys.stderr, leave=False, disable=None)
