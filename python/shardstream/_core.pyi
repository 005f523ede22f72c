"""Type stubs for the Rust extension (rust/python/src/)."""

from typing import Any, final

import pyarrow as pa
from typing_extensions import disjoint_base

__all__ = [
    "DEFAULTS",
    "MIXTURE_FORMAT",
    "MIXTURE_VERSION",
    "SAMPLER_FORMAT",
    "SAMPLER_VERSION",
    "STATE_FORMAT",
    "STATE_VERSION",
    "RawCatalog",
    "RawIter",
    "RawMixChunk",
    "RawMixResume",
    "RawMixStream",
    "RawMixture",
    "RawResume",
    "RawRows",
    "RawRun",
    "RawSampler",
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
SAMPLER_FORMAT: str
SAMPLER_VERSION: int
MIXTURE_FORMAT: str
MIXTURE_VERSION: int

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
    def snapshot(self) -> bytes: ...
    @staticmethod
    def from_snapshot(data: bytes, storage_options: dict[str, str] | None = None) -> RawCatalog: ...
    def __reduce__(self) -> tuple[Any, ...]: ...

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
        pack: Any = None,
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
        summaries: list[Any] | None = None,
    ) -> RawResume: ...
    @staticmethod
    def needed_slots(
        catalog: RawCatalog,
        settings: RawSettings,
        summaries: list[Any],
        layouts: list[_Layout],
    ) -> list[int]: ...
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
    def pass_ended(self, catalog: RawCatalog, settings: RawSettings, layout: _Layout) -> bool: ...
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
    def _state_dict_serde(self, within: int | None = None) -> dict[str, Any]:
        """The same state built through the core's serde tree, as before ``state_dict``
        built it directly (for tests, which compare the two)."""
    def skip(self, n: int, within: int | None = None) -> None: ...
    def add_replay(self, records: Any | None = None, states: list[Any] | None = None) -> None: ...
    def resume_point(self, within: int | None = None) -> RawResume: ...

@disjoint_base
class RawIter:
    """Base of ``_iterator.StreamIterator``: batch mode's ``__next__`` (no Python frame)."""

    def __new__(cls, owner: Any, conv: Any, batched: bool) -> RawIter: ...
    def __iter__(self) -> RawIter: ...
    def __next__(self) -> Any: ...
    @property
    def started(self) -> bool: ...
    @property
    def _raw(self) -> Any: ...
    @property
    def ended(self) -> bool: ...
    @ended.setter
    def ended(self, ended: bool) -> None: ...

@final
class RawMixture:
    def __new__(
        cls,
        *,
        sources: list[tuple[str, RawCatalog, RawSettings, str, int | None]],
        weights: list[tuple[int, list[tuple[str, float]]]],
        schedule: str,
        mixing: str,
        block: int | None,
        seed: int,
        batch_size: int | None,
        drop_last: bool,
        even: str | None,
        samples: int | None,
        combine: str,
        source_column: str | None,
        pack: dict[str, Any] | None = None,
    ) -> RawMixture: ...
    @property
    def names(self) -> list[str]: ...
    @property
    def schema(self) -> pa.Schema: ...
    def source_schemas(self) -> list[pa.Schema]: ...
    def policies(self) -> list[tuple[str, int | None]]: ...

@final
class RawMixResume:
    @staticmethod
    def start(mixture: RawMixture) -> RawMixResume: ...
    @staticmethod
    def load(
        mixture: RawMixture,
        states: list[Any],
        allow_changed_shards: bool = False,
        strict: bool = False,
    ) -> RawMixResume: ...
    @property
    def at_start(self) -> bool: ...
    @property
    def epoch(self) -> int | None: ...
    def with_epoch(self, epoch: int | None) -> RawMixResume: ...
    def pass_ended(self, mixture: RawMixture, layout: _Layout) -> bool: ...
    def state_dict(self, mixture: RawMixture, layout: _Layout) -> dict[str, Any]: ...
    def states(self, mixture: RawMixture) -> list[dict[str, Any]]: ...

@final
class RawMixChunk:
    @property
    def tags(self) -> list[int]: ...
    @property
    def num_rows(self) -> int: ...
    @property
    def parts(self) -> list[pa.RecordBatch | None]: ...

@final
class RawMixStream:
    def __new__(
        cls, mixture: RawMixture, resume: RawMixResume, layout: _Layout
    ) -> RawMixStream: ...
    def next_item(self) -> pa.RecordBatch | RawMixChunk | None: ...
    def state_dict(self, within: int | None = None) -> dict[str, Any]: ...
    def resume_point(self, within: int | None = None) -> RawMixResume: ...
    def barren_sources(self) -> list[int]: ...
    def source_stats(
        self, within: int | None = None
    ) -> list[tuple[int, int, int, float, bool]]: ...

def skip_state(
    catalog: RawCatalog, settings: RawSettings, state: Any, n: int
) -> dict[str, Any]: ...
def parse_states(states: list[Any]) -> list[dict[str, Any]]: ...

@final
class RawRows:
    def __new__(
        cls,
        catalog: RawCatalog,
        page_cache_bytes: Any,
        threads: Any | None = None,
        workers: int = 1,
    ) -> RawRows: ...
    @property
    def num_rows(self) -> int: ...
    def take(self, ids: list[int]) -> pa.RecordBatch: ...
    def cache_stats(self) -> dict[str, int]: ...

@final
class RawSampler:
    def __new__(
        cls,
        *,
        rows: Any,
        seed: Any,
        shuffle: Any,
        block_size: Any,
        window: Any,
        rank: Any,
        world_size: Any,
        even: Any,
    ) -> RawSampler: ...
    @property
    def rows(self) -> int: ...
    @property
    def rank(self) -> int: ...
    @property
    def world_size(self) -> int: ...
    def epoch_len(self) -> int: ...
    def start(self, epoch: int, state: Any | None = None) -> dict[str, Any]: ...
    def load(self, states: list[Any]) -> dict[str, Any]: ...
    def run(self, state: Any) -> RawRun: ...

@final
class RawRun:
    def __len__(self) -> int: ...
    @property
    def epoch(self) -> int: ...
    def indices(self, k: int, n: int) -> list[int]: ...
    def state_dict(self, k: int) -> dict[str, Any]: ...
    def skip(self, k: int, n: int) -> int: ...
