"""Exceptions shared across layers, so that a lower layer can raise them without importing the
one that usually does: :class:`InputError` is raised by ONNX and PyTorch import, by
:mod:`tvm_taso.runtime` and by the command line, and the command line turns it into exit code 2."""


class InputError(ValueError):
    """A model or argument tvm-taso cannot use; the message says what and how to fix it."""
