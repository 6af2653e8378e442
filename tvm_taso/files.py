"""Where tvm-taso keeps files, and how it writes them without ever leaving a partial one."""

from __future__ import annotations

import os
import tempfile
from pathlib import Path


def cache_dir() -> Path:
    """``$TVM_TASO_CACHE``, else ``~/.cache/tvm-taso``: measurements and learned models."""
    root = os.environ.get("TVM_TASO_CACHE")
    return Path(root).expanduser() if root else Path.home() / ".cache" / "tvm-taso"


def write_atomically(path: str | os.PathLike, write) -> None:
    """Call ``write(tmp_path)`` on a fresh file beside ``path``, then move it to ``path``.

    The temporary file is created exclusively (no symlink is followed) in the destination's
    directory, so the final rename is atomic: readers see the old file or the new one, never a
    partial one, and the temporary file is removed whatever happens.
    """
    path = os.fspath(path)
    directory = os.path.dirname(os.path.abspath(path))
    fd, tmp = tempfile.mkstemp(prefix=".tvm-taso-", suffix=os.path.splitext(path)[1], dir=directory)
    os.close(fd)
    try:
        write(tmp)
        os.replace(tmp, path)
    finally:
        if os.path.exists(tmp):
            os.unlink(tmp)


def write_text_atomically(path: str | os.PathLike, text: str) -> None:
    """:func:`write_atomically` for a text file."""
    write_atomically(path, lambda tmp: Path(tmp).write_text(text))
