"""Type stubs for the Rust extension (rust/python/src/lib.rs)."""

from typing import Any, final

import pyarrow as pa

__all__ = ["RawCatalog", "RawStream", "__version__"]
__version__: str

@final
class RawCatalog:
    def __new__(cls, sources: list[str], columns: list[str] | None = None) -> RawCatalog: ...
    @property
    def num_rows(self) -> int: ...
    @property
    def shard_paths(self) -> list[str]: ...
    @property
    def root(self) -> str: ...
    @property
    def schema(self) -> pa.Schema: ...
    def fingerprint(self) -> dict[str, Any]: ...
    def shards_info(self) -> list[dict[str, Any]]: ...

@final
class RawStream:
    def __new__(
        cls,
        catalog: RawCatalog,
        *,
        seed: int,
        shuffle_buffer: int,
        first_epoch: int,
        epochs: int | None,
        slot_index: int,
        slot_count: int,
        read_batch_rows: int = 8192,
        readahead_threads: int = 0,
        readahead_depth: int = 2,
        piece_rows: int = 65536,
        even: str = "off",
        keep_batch_start: bool = False,
    ) -> RawStream: ...
    def next_batch(self, max_rows: int) -> pa.RecordBatch | None: ...
    def state(self, within: int | None = None) -> dict[str, Any]: ...
    def restore(self, state: dict[str, Any]) -> None: ...
    def restore_merged(self, states: list[tuple[int, int, dict[str, Any]]], even: str) -> None: ...
    def check_states(self, states: list[tuple[int, int, dict[str, Any]]], even: str) -> None: ...
