"""shardstream: exact, millisecond resume for PyTorch training streams over Parquet shards.

The public API is :class:`ParquetStream` (an iterable dataset), :class:`Mixture` (weighted
mixtures of named streams), :class:`ParquetRows` (the map-style dataset over the same shards)
with :class:`ResumableSampler` (its global shuffle) and :func:`collate`,
:class:`EvenBatches` (equal batch counts across ranks at run time), the exception
hierarchy, the crash-safe checkpoint
helpers (:mod:`shardstream.checkpoint`) and the metadata sidecar (:mod:`shardstream.index`); the
Rust extension ``shardstream._core`` is an implementation detail.
"""

from __future__ import annotations

from . import checkpoint, index
from ._core import __version__
from .checkpoint import load_latest_checkpoint, save_checkpoint
from .dataset import ParquetStream
from .errors import SchemaError, ShardError, ShardsChangedError, ShardstreamError, StateError
from .even import EvenBatches
from .mapstyle import ParquetRows, collate
from .mixture import Mixture
from .pack import Pack
from .sampler import ResumableSampler

__all__ = [
    "EvenBatches",
    "Mixture",
    "Pack",
    "ParquetRows",
    "ParquetStream",
    "ResumableSampler",
    "SchemaError",
    "ShardError",
    "ShardsChangedError",
    "ShardstreamError",
    "StateError",
    "__version__",
    "checkpoint",
    "collate",
    "index",
    "load_latest_checkpoint",
    "save_checkpoint",
]
