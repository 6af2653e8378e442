"""Where tvm-taso keeps files, and how it writes them without ever leaving a partial one.

Every file tvm-taso writes goes through :func:`write_all` (or :func:`write_atomically` for one
file): each output is written to a fresh temporary file beside it, then all are renamed into
place, so a reader sees the old files or the new ones, never a partial one, and an error or a
signal leaves no temporary file behind. Outputs get the mode a plain ``open(path, "w")`` would
give them (the umask's), or keep the mode of the file they replace.
"""

from __future__ import annotations

import contextlib
import os
import signal
import stat
import tempfile
from pathlib import Path

from tvm_taso.errors import InputError

TEMP_PREFIX = ".tvm-taso-"
_SIGNALS = {signal.SIGINT, signal.SIGTERM}


class OutputPathError(ValueError):
    """An output path that cannot be written; the message names it (not a temporary file)."""


class InputFileError(InputError):
    """An input path that is not a regular file tvm-taso can read; the message names it."""


def read_regular_file(path: Path, limit: int, what: str, too_large: str = "") -> bytes:
    """The bytes of ``path``, refusing (:class:`InputFileError`, one line) anything but a regular
    file of at most ``limit`` bytes: ``/dev/zero`` would be read until memory runs out and a
    FIFO would block forever. ``what`` names the file's kind in messages ("an ONNX file");
    ``too_large`` is said after the size when the file is over it (what to do instead)."""
    with open_regular_file(path, limit, what, too_large) as f:
        data = f.read(limit + 1)
    if len(data) > limit:
        raise InputFileError(f"{path}: grew past the {_size(limit)} {what} may hold while being read")
    return data


def open_regular_file(path: Path, limit: int, what: str, too_large: str = ""):
    """``path`` opened for binary reading after the checks of :func:`read_regular_file`."""
    if not path.exists():
        raise InputFileError(f"{path}: no such file")
    if path.is_dir():
        raise InputFileError(f"{path}: is a directory, not {what}")
    try:
        fd = os.open(path, os.O_RDONLY | os.O_NONBLOCK)  # a FIFO must not block the open
    except OSError as err:
        raise InputFileError(f"{path}: cannot open: {err.strerror or err}") from None
    f = os.fdopen(fd, "rb")
    st = os.fstat(fd)
    if not stat.S_ISREG(st.st_mode):
        f.close()
        raise InputFileError(f"{path}: not a regular file (a device, FIFO or socket); give {what}")
    if st.st_size > limit:
        f.close()
        raise InputFileError(f"{path}: {st.st_size} bytes, over the {_size(limit)} {what} may hold{too_large}")
    return f


def contained_data_file(base_dir: Path, location: str, what: str) -> Path:
    """The file ``location`` (a path relative to the folder ``base_dir``, as an ONNX tensor's
    external data names it) after refusing (:class:`InputFileError`, one line starting with
    ``what``) anything that would read bytes from outside that folder: an absolute path or one
    through ``..``, a symbolic link anywhere on the way (the file's or a folder's), a real path
    that leaves the folder, or a file with several hard links, as onnx refuses them. It must
    be a regular file (a FIFO would block the read)."""
    relative = Path(location)
    if not location or relative.is_absolute() or ".." in relative.parts:
        raise InputFileError(f"{what}: external data {location!r} is outside the model's folder")
    path = Path(base_dir)
    for part in relative.parts:
        path = path / part
        try:
            st = os.lstat(path)
        except FileNotFoundError:
            raise InputFileError(f"{what}: its external data file {path} is missing") from None
        except OSError as err:
            raise InputFileError(f"{what}: cannot read its external data file {path}: {err.strerror or err}") from None
        if stat.S_ISLNK(st.st_mode):
            raise InputFileError(f"{what}: external data {location!r} goes through a symbolic link ({path}); "
                                 "copy the data into the model's folder")
    root = os.path.realpath(base_dir)
    if os.path.commonpath([root, os.path.realpath(path)]) != root:
        raise InputFileError(f"{what}: external data {location!r} is outside the model's folder")
    if not stat.S_ISREG(st.st_mode):
        raise InputFileError(f"{what}: its external data {path} is not a regular file")
    if st.st_nlink > 1:
        raise InputFileError(f"{what}: its external data file {path} has {st.st_nlink} hard links (a file "
                             "linked from elsewhere); copy it into the model's folder")
    return path


def _size(n: int) -> str:
    """``n`` bytes as people write it: 2 GiB, 16 MiB, else bytes."""
    for unit, scale in (("GiB", 2**30), ("MiB", 2**20)):
        if n >= scale and n % scale == 0:
            return f"{n // scale} {unit}"
    return f"{n} bytes"


def cache_dir() -> Path:
    """``$TVM_TASO_CACHE``, else ``~/.cache/tvm-taso``: measurements and learned models."""
    root = os.environ.get("TVM_TASO_CACHE")
    return Path(root).expanduser() if root else Path.home() / ".cache" / "tvm-taso"


def check_output_path(path: str | os.PathLike, what: str = "output") -> None:
    """Raise :class:`OutputPathError` (one line naming ``what`` and ``path``) unless ``path`` can
    be written: its directory exists and is writable, and it is not itself a directory. Cheap:
    call it for every output before doing any work."""
    path = os.fspath(path)
    directory = os.path.dirname(os.path.abspath(path))
    if os.path.isdir(path):
        raise OutputPathError(f"{what} {path}: is a directory")
    if not os.path.exists(directory):
        raise OutputPathError(f"{what} {path}: directory {directory} does not exist")
    if not os.path.isdir(directory):
        raise OutputPathError(f"{what} {path}: {directory} is not a directory")
    if not os.access(directory, os.W_OK | os.X_OK):
        raise OutputPathError(f"{what} {path}: directory {directory} is not writable")
    if os.path.exists(path) and not os.path.isfile(path):
        raise OutputPathError(f"{what} {path}: exists and is not a regular file")


def check_output_paths(outputs: dict) -> None:
    """:func:`check_output_path` for each ``{what: path}`` (None paths skipped), and no two
    outputs naming the same file."""
    seen: dict[str, str] = {}
    for what, path in outputs.items():
        if path is None:
            continue
        check_output_path(path, what)
        real = os.path.realpath(path)
        if real in seen:
            raise OutputPathError(f"{what} {path}: the same file as {seen[real]}")
        seen[real] = what


def _umask() -> int:
    """The process's umask, read without changing it where Linux allows."""
    try:
        with open("/proc/self/status") as f:
            for line in f:
                if line.startswith("Umask:"):
                    return int(line.split()[1], 8)
    except (OSError, ValueError, IndexError):
        pass
    mask = os.umask(0o022)
    os.umask(mask)
    return mask


def _mode_for(path: str, executable: bool = False) -> int:
    """The mode of the file at ``path`` if it is replaced, else what the umask gives a new file
    (``executable``: a new file the writer made executable, e.g. a linked shared library)."""
    try:
        st = os.stat(path)
        if stat.S_ISREG(st.st_mode):
            return stat.S_IMODE(st.st_mode)
    except OSError:
        pass
    return (0o777 if executable else 0o666) & ~_umask()


@contextlib.contextmanager
def _signals_held():
    """Hold SIGINT and SIGTERM while the body runs (they are delivered right after), so that a
    temporary file is never created without being recorded for removal, and renames are never
    interrupted half-way."""
    try:
        old = signal.pthread_sigmask(signal.SIG_BLOCK, _SIGNALS)
    except (AttributeError, OSError, ValueError):  # no pthread_sigmask on this platform
        yield
        return
    try:
        yield
    finally:
        signal.pthread_sigmask(signal.SIG_SETMASK, old)


def write_all(outputs: dict) -> None:
    """Write several files all or none: ``outputs`` maps each path to ``write(tmp_path)``.

    Each is written to a temporary file created exclusively (no symlink is followed) in its
    destination's directory; only when all are written are they renamed into place (atomic, one
    by one, with SIGINT and SIGTERM held). On any error or signal every temporary file is
    removed and no destination is touched.
    """
    staged: dict[str, str] = {}  # temporary file -> destination, until renamed
    try:
        for path, write in outputs.items():
            path = os.fspath(path)
            directory = os.path.dirname(os.path.abspath(path))
            try:
                with _signals_held():
                    fd, tmp = tempfile.mkstemp(prefix=TEMP_PREFIX, suffix=os.path.splitext(path)[1], dir=directory)
                    staged[tmp] = path
                os.close(fd)
                write(tmp)
                # after writing: a writer may have replaced the file (a linker does)
                os.chmod(tmp, _mode_for(path, executable=bool(os.stat(tmp).st_mode & 0o111)))
            except OSError as err:  # name the destination, not the temporary file
                raise OSError(f"cannot write {path}: {err.strerror or err}; nothing written") from err
        with _signals_held():
            for tmp, path in list(staged.items()):
                os.replace(tmp, path)
                del staged[tmp]
    finally:
        for tmp in staged:
            with contextlib.suppress(FileNotFoundError):
                os.unlink(tmp)


def write_atomically(path: str | os.PathLike, write) -> None:
    """Call ``write(tmp_path)`` on a fresh file beside ``path``, then move it to ``path``
    (:func:`write_all` for one file)."""
    write_all({path: write})


def write_text_atomically(path: str | os.PathLike, text: str) -> None:
    """:func:`write_atomically` for a text file."""
    write_atomically(path, lambda tmp: Path(tmp).write_text(text))
