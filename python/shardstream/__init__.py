"""shardstream: exact, millisecond resume for PyTorch training streams over Parquet shards.

The public API is :class:`ParquetStream`, :class:`Mixture` (weighted mixtures of named
streams), the exception hierarchy, the crash-safe checkpoint
helpers (:mod:`shardstream.checkpoint`) and the metadata sidecar (:mod:`shardstream.index`); the
Rust extension ``shardstream._core`` is an implementation detail.
"""

from __future__ import annotations

from . import checkpoint, index
from ._core import __version__
from .checkpoint import load_latest_checkpoint, save_checkpoint
from .dataset import ParquetStream
from .errors import SchemaError, ShardError, ShardsChangedError, ShardstreamError, StateError
from .mixture import Mixture

__all__ = [
    "Mixture",
    "ParquetStream",
    "SchemaError",
    "ShardError",
    "ShardsChangedError",
    "ShardstreamError",
    "StateError",
    "__version__",
    "checkpoint",
    "index",
    "load_latest_checkpoint",
    "save_checkpoint",
]
