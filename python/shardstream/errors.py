"""Exception hierarchy. The Rust core raises these (mapped in rust/python/src/error.rs).

Plain Python classes so that they can also be built-in errors (``StateError`` is a
``ValueError``) and pickle across DataLoader worker processes.
"""

from __future__ import annotations

__all__ = ["SchemaError", "ShardError", "ShardstreamError", "StateError"]


class ShardstreamError(Exception):
    """Base class of every error shardstream raises itself."""


class ShardError(ShardstreamError):
    """A shard is not readable Parquet (not Parquet, truncated, corrupt); names the file."""


class SchemaError(ShardstreamError, ValueError):
    """Shards disagree on a column's type or presence, or a requested column is unknown."""


class StateError(ShardstreamError, ValueError):
    """A saved state is malformed, of another version, or belongs to other data or settings."""
