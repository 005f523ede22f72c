"""Type stubs for the Rust extension (rust/python/src/)."""

from typing import Any, final

import pyarrow as pa

__all__ = [
    "DEFAULTS",
    "STATE_FORMAT",
    "STATE_VERSION",
    "RawCatalog",
    "RawResume",
    "RawSettings",
    "RawStream",
    "__version__",
    "parse_states",
    "skip_state",
]
__version__: str
DEFAULTS: dict[str, Any]
STATE_FORMAT: str
STATE_VERSION: int

_Layout = tuple[int, int, int, int]  # (rank, world_size, worker, num_workers)

@final
class RawCatalog:
    def __new__(
        cls,
        sources: list[str],
        columns: list[str] | None = None,
        storage_options: dict[str, str] | None = None,
    ) -> RawCatalog: ...
    @property
    def remote(self) -> bool: ...
    def stats(self) -> dict[str, int]: ...
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
    def write_index(self) -> str: ...

@final
class RawSettings:
    def __new__(
        cls,
        *,
        seed: Any,
        shuffle_buffer: Any,
        batch_size: Any,
        drop_last: Any,
        epochs: Any,
        even: Any,
        read_batch_rows: Any,
        readahead_threads: Any,
        readahead_depth: Any,
    ) -> RawSettings: ...
    @property
    def batch_size(self) -> int | None: ...
    @property
    def drop_last(self) -> bool: ...

@final
class RawResume:
    @staticmethod
    def start(first_epoch: int) -> RawResume: ...
    @staticmethod
    def load(
        catalog: RawCatalog,
        settings: RawSettings,
        states: list[Any],
        allow_changed_shards: bool = False,
        replay: RawResume | None = None,
    ) -> RawResume: ...
    @property
    def first_epoch(self) -> int: ...
    @property
    def at_start(self) -> bool: ...
    @property
    def epochs(self) -> list[int]: ...
    def restart(self, first_epoch: int) -> RawResume: ...
    def state_dict(
        self, catalog: RawCatalog, settings: RawSettings, layout: _Layout
    ) -> dict[str, Any]: ...
    def skip(
        self, catalog: RawCatalog, settings: RawSettings, layout: _Layout, n: int
    ) -> RawResume: ...
    def with_replay(
        self, records: Any | None = None, states: list[Any] | None = None
    ) -> RawResume: ...
    def states(self, catalog: RawCatalog, settings: RawSettings) -> list[dict[str, Any]]: ...
    def replay(self) -> Any: ...

@final
class RawStream:
    def __new__(
        cls, catalog: RawCatalog, settings: RawSettings, resume: RawResume, layout: _Layout
    ) -> RawStream: ...
    def next_item(self) -> pa.RecordBatch | None: ...
    def state_dict(self, within: int | None = None) -> dict[str, Any]: ...
    def skip(self, n: int, within: int | None = None) -> None: ...
    def add_replay(self, records: Any | None = None, states: list[Any] | None = None) -> None: ...
    def resume_point(self, within: int | None = None) -> RawResume: ...

def skip_state(
    catalog: RawCatalog, settings: RawSettings, state: Any, n: int
) -> dict[str, Any]: ...
def parse_states(states: list[Any]) -> list[dict[str, Any]]: ...
