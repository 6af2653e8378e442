"""Exceptions shared across layers, so that a lower layer can raise them without importing the
one that usually does: :class:`OpError` by the op table and the size arithmetic under it,
:class:`InputError` by ONNX and PyTorch import, by :mod:`tvm_taso.runtime` and by the command
line, which turns it into exit code 2, and :class:`TargetError` by :mod:`tvm_taso.target` and
:mod:`tvm_taso.ort` (which the target module reads: the error lives below both)."""


class OpError(ValueError):
    """An op application that is not valid (bad shapes or attributes), or a question about
    symbolic sizes that cannot be decided: the op is left opaque, the rewrite not applied."""


class InputError(ValueError):
    """A model or argument tvm-taso cannot use; the message says what and how to fix it."""


class TargetError(ValueError):
    """A target tvm-taso cannot use; the message lists what is accepted."""


def first_line(err: BaseException) -> str:
    """The first line of an exception's message (its type when it has none): what a one-line
    error quotes of an error raised by a library."""
    return (str(err).strip().splitlines() or [type(err).__name__])[0]
