"""Reading checkpoint files without running code from them.

A pickle names functions to call while it loads (``os.system`` as well as a class), so a
checkpoint directory writable by someone else would mean code execution. shardstream reads
``torch.save`` files with ``torch.load(weights_only=True)`` (tensors and plain data only) and
other pickles with :class:`PlainUnpickler` (plain built-ins only: a state holds nothing else),
whether or not torch is installed. ``shardstream.checkpoint`` and ``shardstream state`` load
through :func:`load`.

    >>> import io, pickle
    >>> PlainUnpickler(io.BytesIO(pickle.dumps({"a": [1, 2.5, None, b"x"]}))).load()
    {'a': [1, 2.5, None, b'x']}
    >>> PlainUnpickler(io.BytesIO(pickle.dumps(io.BytesIO()))).load()
    Traceback (most recent call last):
    ...
    shardstream._pickle.RefusedPickleError: refusing to load _io.BytesIO: ...
"""

from __future__ import annotations

import os
import pickle
import re
from typing import Any

__all__ = ["PlainUnpickler", "RefusedPickleError", "is_torch_zip", "load"]

ZIP_MAGIC = b"PK\x03\x04"  # torch.save's (zip) format
TORCH_LEGACY_MAGIC = 0x1950A86A20F9469CFC6C  # first pickle of a legacy (non-zip) torch.save

# What torch.load(weights_only=True) says when it refuses a global
# (torch/_weights_only_unpickler.py); its other UnpicklingErrors are damaged data.
_TORCH_REFUSED = re.compile(
    r"GLOBAL (\S+) was not an allowed global|unsupported GLOBAL (\S+) whose module"
    r"|call reduce for unrecognized function|Can only create new object"
)


class RefusedPickleError(pickle.UnpicklingError):
    """A file asks to import a class or function while loading; nothing of it was run."""


class PlainUnpickler(pickle.Unpickler):
    """Unpickles built-in containers and scalars only; any class or function is refused."""

    def find_class(self, module: str, name: str) -> Any:
        raise RefusedPickleError(
            f"refusing to load {module}.{name}: only plain built-in types are read from pickle "
            "files (a shardstream state holds nothing else)"
        )


def is_torch_zip(head: bytes) -> bool:
    """Whether a file starting with ``head`` is in ``torch.save``'s (zip) format."""
    return head.startswith(ZIP_MAGIC)


def load(
    path: str | os.PathLike[str], *, map_location: Any = None, mmap: bool = False
) -> tuple[Any, str]:
    """Load a ``torch.save`` file (zip or legacy format) with ``torch.load(weights_only=True)``,
    anything else as a pickle of plain built-ins. Returns ``(object, kind)``, kind
    ``"torch.save"``, ``"torch.save (legacy format)"`` or ``"pickle"``. ``mmap`` maps the
    tensors of a zip file instead of reading them.

    Raises:
        RefusedPickleError: the file names a class or function that is not allowed.
        ModuleNotFoundError: a ``torch.save`` file and no torch installed.
        OSError, EOFError, pickle.UnpicklingError, RuntimeError, ...: the file is unreadable
            (truncated, not a pickle).
    """
    path = os.fspath(path)
    with open(path, "rb") as f:
        zipped = is_torch_zip(f.read(len(ZIP_MAGIC)))
        if not zipped:
            f.seek(0)
            try:
                obj = PlainUnpickler(f).load()
            except RefusedPickleError as e:
                raise RefusedPickleError(f"{path}: {e}") from None
            if not (type(obj) is int and obj == TORCH_LEGACY_MAGIC):
                return obj, "pickle"
    try:
        import torch
    except ImportError:
        raise ModuleNotFoundError(
            f"{path}: a torch.save file; reading it needs torch installed", name="torch"
        ) from None
    try:
        obj = torch.load(path, weights_only=True, map_location=map_location, mmap=mmap and zipped)
    except pickle.UnpicklingError as e:
        m = _TORCH_REFUSED.search(str(e))
        if m is None:
            raise
        what = m.group(1) or m.group(2) or m.group(0)
        raise RefusedPickleError(
            f"{path}: refusing to load {what}: torch.load(weights_only=True) reads tensors and "
            "plain data only"
        ) from None
    return obj, "torch.save" if zipped else "torch.save (legacy format)"
