"""Exception hierarchy. The Rust core raises these (mapped in rust/python/src/error.rs).

Plain Python classes so that they can also be built-in errors (``StateError`` is a
``ValueError``) and pickle across DataLoader worker processes.
"""

from __future__ import annotations

__all__ = ["SchemaError", "ShardError", "ShardsChangedError", "ShardstreamError", "StateError"]


class ShardstreamError(Exception):
    """Base class of every error shardstream raises itself."""


class ShardError(ShardstreamError):
    """A shard is not readable Parquet (not Parquet, truncated, corrupt); names the file."""


class SchemaError(ShardstreamError, ValueError):
    """Shards disagree on a column's type or presence, or a requested column is unknown."""


class StateError(ShardstreamError, ValueError):
    """A saved state is malformed, of another version, or belongs to other data or settings."""


class ShardsChangedError(StateError):
    """The state was saved over the same dataset, but shards were modified, replaced, added or
    removed since (sizes, row counts or footers differ). ``added``/``changed`` name the shards
    (relative paths), ``removed`` counts shards gone whose paths the state does not store.
    ``load_state_dict(..., allow_changed_shards=True)`` continues anyway (see its docs)."""

    def __init__(
        self,
        message: str,
        added: list[str] | None = None,
        changed: list[str] | None = None,
        removed: int = 0,
    ) -> None:
        super().__init__(message)
        self.added = list(added or [])
        self.changed = list(changed or [])
        self.removed = removed

    def __reduce__(self):  # type: ignore[no-untyped-def]
        return (type(self), (str(self), self.added, self.changed, self.removed))
