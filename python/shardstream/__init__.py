"""shardstream: exact, millisecond resume for PyTorch training streams over Parquet shards.

The public API is :class:`ParquetStream` and the exception hierarchy; the Rust extension
``shardstream._core`` is an implementation detail.
"""

from __future__ import annotations

from ._core import __version__
from .dataset import ParquetStream
from .errors import SchemaError, ShardError, ShardsChangedError, ShardstreamError, StateError

__all__ = [
    "ParquetStream",
    "SchemaError",
    "ShardError",
    "ShardsChangedError",
    "ShardstreamError",
    "StateError",
    "__version__",
]
