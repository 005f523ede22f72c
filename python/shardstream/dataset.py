"""``ParquetStream``: the torch ``IterableDataset`` over the Rust core.

Design decisions (the why; the what is in docs/ARCHITECTURE.md):

* The work unit is a *slot*: ``slot = rank * num_workers + worker_id`` of
  ``world_size * num_workers``. The core cuts each epoch's row order into one contiguous range
  per slot, so a DataLoader worker (or rank) needs no coordination, and its state is its own slot's.
* The slot is resolved in ``__iter__`` (inside the DataLoader worker), never in ``__init__``:
  the dataset object is built in the main process and copied into workers.
* No threads or runtimes are created before iteration, so forking DataLoader workers is safe;
  the Rust objects hold only memory and re-open files per read. For spawn-started workers the
  dataset pickles without its Rust objects and re-opens the catalog, checking the fingerprint.
* Row mode reads chunks of rows from the core and yields them one by one; ``state_dict()``
  mid-chunk asks the core for "the state after k rows of the last chunk", which it computes on
  row ids alone. So the state is always exactly the position after the last yielded item.
"""

from __future__ import annotations

import os
from collections.abc import Iterator, Mapping, Sequence
from typing import Any

import pyarrow as pa

from . import state as _state
from ._core import RawCatalog, RawStream
from .convert import OUTPUTS, Converter
from .errors import StateError
from .integrations import accelerate as _accelerate

try:  # torch is optional at import: numpy/python/arrow output work without it.
    import torch
    from torch.utils.data import IterableDataset as _Base
except ImportError:  # pragma: no cover - exercised only without torch
    torch = None  # type: ignore[assignment]
    _Base = object  # type: ignore[assignment,misc]

__all__ = ["ParquetStream"]

# Readahead threads per iterator for object-store sources when not set: each holds one piece's
# request in flight, so this many round trips overlap with decoding.
REMOTE_READAHEAD_THREADS = 8

# Rows per chunk the core hands over in row mode. Larger amortizes the FFI call; smaller bounds
# the work a mid-chunk state_dict() replays on row ids (at most this many buffer steps).
ROW_MODE_CHUNK = 1024


def _sources(source: Any) -> list[str]:
    items = list(source) if isinstance(source, (list, tuple)) else [source]
    if not items:
        raise ValueError("source is empty: pass a file, directory, glob or a list of them")
    out = []
    for s in items:
        if not isinstance(s, (str, os.PathLike)):
            raise TypeError(f"source must be a path, glob or list of them, got {type(s).__name__}")
        out.append(os.fspath(s))
    return out


def _storage_options(options: Mapping[str, str] | None) -> dict[str, str] | None:
    if options is None:
        return None
    if not isinstance(options, Mapping):
        raise TypeError(
            f"storage_options must be a dict of str to str, got {type(options).__name__}"
        )
    out = {}
    for k, v in options.items():
        if not isinstance(k, str):
            raise TypeError(f"storage_options keys must be str, got {k!r}")
        out[k] = v if isinstance(v, str) else str(v).lower() if isinstance(v, bool) else str(v)
    return out


def _dist_rank_world() -> tuple[int, int]:
    if (
        torch is not None
        and torch.distributed.is_available()
        and torch.distributed.is_initialized()
    ):
        return torch.distributed.get_rank(), torch.distributed.get_world_size()
    return int(os.environ.get("RANK", "0")), int(os.environ.get("WORLD_SIZE", "1"))


def _one_even(pending: list[tuple[_state.Slot, dict[str, Any]]]) -> str:
    evens = {slot[2] for slot, _ in pending}
    if len(evens) > 1:
        raise StateError(
            f"the states mix even policies {sorted(evens)}: pass one checkpoint's states"
        )
    return evens.pop()


def _check_count(value: Any, name: str) -> None:
    if isinstance(value, bool) or not isinstance(value, int) or value < 0:
        raise ValueError(f"{name} must be an int >= 0, got {value!r}")


def _union_skips(records: Any) -> list[dict[str, Any]]:
    """Skip records without duplicates (several slots' states carry the same history), sorted."""
    seen = {(r["epoch"], tuple(r["slot"]), r["start"], r["stop"]): r for r in records}
    return [seen[k] for k in sorted(seen)]


def _worker() -> tuple[int, int]:
    info = torch.utils.data.get_worker_info() if torch is not None else None
    return (info.id, info.num_workers) if info is not None else (0, 1)


class ParquetStream(_Base):  # type: ignore[misc,valid-type]
    """An exactly resumable stream of rows or batches from Parquet shards.

    Args:
        source: a file, a directory (every ``*.parquet`` below it), a glob, or a list of these.
            Shards are read in sorted path order.
        columns: columns to read (in this order); ``None`` reads all.
        batch_size: ``None`` yields one row at a time as ``dict[column, value]``; an int yields
            batches of that many rows (the last of each epoch short unless ``drop_last``).
        drop_last: drop each epoch's short last batch.
        shuffle_buffer: ``0`` keeps shard order; ``n > 0`` permutes row groups per epoch and
            shuffles rows through an ``n``-row buffer.
        seed: seed of every shuffle. Same settings and seed give the same stream everywhere.
        epochs: epochs per pass (``for x in ds``), or ``None`` for endless.
        output: ``"torch"``, ``"numpy"``, ``"python"`` or ``"arrow"``.
        list_format: batch mode with numpy/torch output, ``list<number>`` columns: ``"split"``
            (one 1-D array/tensor per row, views), ``"offsets"`` (``(values, offsets)``),
            ``"padded"`` (``(padded 2-D, lengths)``, 0-padded) or ``"nested"`` (a jagged
            ``torch.nested`` tensor). Columns with null lists or values stay Python lists.
        rank, world_size: this process's place among distributed ranks; default from
            ``torch.distributed`` if initialized, else ``RANK``/``WORLD_SIZE``, else 0 of 1.
        even: with several ranks, make every rank yield the same number of items per epoch
            (so DDP never waits on a rank that ran out): ``"drop"`` skips up to
            ``world_size * num_workers - 1`` rows per epoch, ``"pad"`` repeats up to that many,
            ``None`` yields every row exactly once and lets ranks differ by up to one row per
            slot. A single rank never drops or pads.
        read_batch_rows: rows per decoded Parquet batch (tuning only; never changes the stream).
        readahead_threads: background decoding threads per iterator (``0`` decodes in the
            caller). ``None`` picks ``min(4, cores // DataLoader workers)``, at least 1. Threads
            start on the first ``next()`` (inside the worker process), never before a fork.
        readahead_depth: decoded batches each readahead thread may hold ready. The defaults
            (2048 x 8) hold as many rows in flight as 8192 x 2 did, in smaller batches that
            iterated ~14% faster in paired runs (README, "Measured figures").
        storage_options: settings for URL sources (``s3://``, ``gs://``, ``az://``/``abfs://``,
            ``https://``, ``file://``): the ``object_store`` crate's configuration keys for the
            scheme (e.g. ``{"aws_endpoint": "http://127.0.0.1:9000", "aws_region": "us-east-1",
            "aws_skip_signature": "true"}``), which override the standard environment variables
            (``AWS_*``, ``GOOGLE_*``, ``AZURE_*``), plus ``timeout`` / ``connect_timeout`` (per
            request, e.g. ``"30s"``), ``max_retries``, ``retry_timeout`` and
            ``backoff_initial``. An unknown key is an error.

    Example:
        >>> import tempfile, shardstream.datagen as dg
        >>> d = tempfile.mkdtemp()
        >>> _ = dg.write_shards(d, num_shards=2, rows_per_shard=10)
        >>> ds = ParquetStream(d, columns=["id"], batch_size=4, output="python")
        >>> it = iter(ds); next(it)["id"]
        [0, 1, 2, 3]
        >>> saved = ds.state_dict()
        >>> ds2 = ParquetStream(d, columns=["id"], batch_size=4, output="python")
        >>> ds2.load_state_dict(saved)
        >>> [b["id"] for b in ds2]
        [[4, 5, 6, 7], [8, 9, 10, 11], [12, 13, 14, 15], [16, 17, 18, 19]]
    """

    def __init__(
        self,
        source: Any,
        *,
        columns: Sequence[str] | None = None,
        batch_size: int | None = None,
        drop_last: bool = False,
        shuffle_buffer: int = 0,
        seed: int = 0,
        epochs: int | None = 1,
        output: str = "torch",
        list_format: str = "split",
        rank: int | None = None,
        world_size: int | None = None,
        even: str | None = "drop",
        read_batch_rows: int = 2048,
        readahead_threads: int | None = None,
        readahead_depth: int = 8,
        storage_options: Mapping[str, str] | None = None,
    ) -> None:
        if batch_size is not None and (
            isinstance(batch_size, bool) or not isinstance(batch_size, int) or batch_size <= 0
        ):
            raise ValueError(f"batch_size must be a positive int or None, got {batch_size!r}")
        if (
            isinstance(shuffle_buffer, bool)
            or not isinstance(shuffle_buffer, int)
            or shuffle_buffer < 0
        ):
            raise ValueError(f"shuffle_buffer must be an int >= 0, got {shuffle_buffer!r}")
        if epochs is not None and (
            isinstance(epochs, bool) or not isinstance(epochs, int) or epochs <= 0
        ):
            raise ValueError(f"epochs must be a positive int or None, got {epochs!r}")
        if isinstance(seed, bool) or not isinstance(seed, int) or not 0 <= seed < 2**64:
            raise ValueError(f"seed must be an int in [0, 2**64), got {seed!r}")
        if output not in OUTPUTS:
            raise ValueError(f"output must be one of {OUTPUTS}, got {output!r}")
        Converter(output, pa.schema([]), list_format)  # validates output/list_format early
        if even not in ("drop", "pad", None):
            raise ValueError(f"even must be 'drop', 'pad' or None, got {even!r}")
        if read_batch_rows <= 0:
            raise ValueError(f"read_batch_rows must be positive, got {read_batch_rows!r}")
        if readahead_threads is not None and readahead_threads < 0:
            raise ValueError(f"readahead_threads must be >= 0 or None, got {readahead_threads!r}")
        if readahead_depth <= 0:
            raise ValueError(f"readahead_depth must be positive, got {readahead_depth!r}")
        if (rank is None) != (world_size is None):
            raise ValueError("pass rank and world_size together (or neither)")
        if world_size is not None and rank is not None and not 0 <= rank < world_size:
            raise ValueError(
                f"rank must be in [0, world_size), got rank={rank} world_size={world_size}"
            )
        self._sources = _sources(source)
        self._storage_options = _storage_options(storage_options)
        self._columns = None if columns is None else [str(c) for c in columns]
        self._batch_size = batch_size
        self._drop_last = bool(drop_last)
        self._shuffle_buffer = shuffle_buffer
        self._seed = seed
        self._epochs = epochs
        self._output = output
        self._list_format = list_format
        self._rank = rank
        self._world_size = world_size
        self._even = even
        self._read_batch_rows = read_batch_rows
        self._readahead_threads = readahead_threads
        self._readahead_depth = readahead_depth
        self._catalog: RawCatalog | None = RawCatalog(
            self._sources, self._columns, self._storage_options
        )
        self._fingerprint: dict[str, Any] = self._catalog.fingerprint()
        self._first_epoch = 0
        # Every skip applied so far (this run and the runs it resumed from): state history.
        self._skips: list[dict[str, Any]] = []
        # Skips to apply again when the stream reaches them (replay_skips).
        self._replay: list[dict[str, Any]] = []
        self._generation = 0  # of the newest iterator; only it may move the position
        self._started = 0  # generation of the newest iterator that has started
        self._reset_position()

    def _reset_position(self) -> None:
        self._stream: RawStream | None = None  # the stream the latest iterator reads
        self._slot: _state.Slot | None = None
        self._rows_into_chunk: int | None = None  # row mode: rows yielded of the last chunk
        # Loaded states not yet applied: (slot, position) of one or more slots; applied by
        # __iter__, where this iterator's own slot is known.
        self._pending: list[tuple[_state.Slot, dict[str, Any]]] | None = None
        self._finished = False
        # Iterators that have started are stale now; one created but not started yet (a loader
        # may create it early) starts from this new position.
        if self._started == self._generation:
            self._generation += 1
        self._chunk = 0  # row mode: bumped when skip() invalidates the rows of the last chunk

    # -- properties ---------------------------------------------------------------------------
    @property
    def catalog(self) -> RawCatalog:
        if self._catalog is None:  # re-opened after unpickling in a spawned worker
            cat = RawCatalog(self._sources, self._columns, self._storage_options)
            if cat.fingerprint() != self._fingerprint:
                raise StateError(
                    "the shard set changed between creating the dataset and iterating it "
                    f"(was {self._fingerprint}, now {cat.fingerprint()})"
                )
            self._catalog = cat
        return self._catalog

    def stats(self) -> dict[str, int]:
        """Object-store counters of this dataset in this process (all zero for local files).

        ``requests``: GET/LIST/HEAD requests shardstream made (nearby byte ranges coalesced);
        ``bytes``: payload bytes received (footers, offset indexes, pages); ``retries``: HTTP
        attempts that failed (5xx, 429, timeout, dropped connection) and were retried;
        ``http_requests``: HTTP requests sent, retries included. DataLoader workers are
        separate processes with their own counters.
        """
        return dict(self.catalog.stats())

    @property
    def num_rows(self) -> int:
        """Rows in the shard set (one epoch, all slots together)."""
        return int(self.catalog.num_rows)

    @property
    def shards(self) -> list[str]:
        """Absolute shard paths in read order."""
        return list(self.catalog.shard_paths)

    @property
    def schema(self) -> pa.Schema:
        """Schema of the output columns."""
        return self.catalog.schema

    def _settings(self) -> dict[str, Any]:
        return {
            "seed": self._seed,
            "shuffle_buffer": self._shuffle_buffer,
            "batch_size": self._batch_size,
            "drop_last": self._drop_last,
            "epochs": self._epochs,
            "even": self._even,
        }

    def _resolve_slot(self) -> _state.Slot:
        wrapped = self.__dict__.get("_wrapped") or _accelerate.wrapper(self)
        if wrapped is not None:  # inside an accelerate loader: read all rows, or refuse
            rank, world = wrapped.slot(self._world_size)
        elif self._rank is not None and self._world_size is not None:
            rank, world = self._rank, self._world_size
        else:
            rank, world = _dist_rank_world()
        if not 0 <= rank < world:
            raise ValueError(f"rank {rank} is not in [0, world_size={world})")
        wid, nw = _worker()
        # Equal lengths only matter across ranks (DDP); workers of one rank need none.
        even = "off" if self._even is None or world == 1 else self._even
        return rank * nw + wid, world * nw, even

    def _threads(self) -> int:
        if self._readahead_threads is not None:
            return self._readahead_threads
        if self.catalog.remote:
            # Remote reads wait on the network, not the CPU: more pieces in flight hide latency.
            return REMOTE_READAHEAD_THREADS
        try:
            cores = len(os.sched_getaffinity(0))
        except AttributeError:  # not Linux
            cores = os.cpu_count() or 1
        return max(1, min(4, cores // _worker()[1]))

    def _new_stream(
        self, slot: _state.Slot, *, first_epoch: int | None = None, probe: bool = False
    ) -> RawStream:
        return RawStream(
            self.catalog,
            seed=self._seed,
            shuffle_buffer=self._shuffle_buffer,
            first_epoch=self._first_epoch if first_epoch is None else first_epoch,
            epochs=self._epochs,
            slot_index=slot[0],
            slot_count=slot[1],
            even=slot[2],
            read_batch_rows=self._read_batch_rows,
            readahead_threads=0 if probe else self._threads(),
            readahead_depth=self._readahead_depth,
            keep_batch_start=self._batch_size is None and not probe,
        )

    # -- epochs and state ---------------------------------------------------------------------
    def set_epoch(self, epoch: int) -> None:
        """Start the next pass at ``epoch`` (like ``DistributedSampler.set_epoch``)."""
        _check_count(epoch, "epoch")
        _accelerate.before_epoch(self, self._world_size)  # accelerate's loader calls set_epoch
        self._first_epoch = epoch
        self._reset_position()

    def _position(self) -> dict[str, Any] | None:
        if self._stream is None:
            return None
        k = self._rows_into_chunk
        return self._stream.state() if k is None else self._stream.state(within=k)

    def state_dict(self) -> dict[str, Any]:
        """The position right after the last item this dataset yielded, as plain built-ins."""
        slot, position = self._slot, self._position()
        if self._pending:
            # Loaded but not iterated yet: this iterator's slot's share of what was loaded.
            slot = self._resolve_slot()
            stream = self._restored_stream(slot, probe=True)
            position = stream.state()
        elif self._pending is not None:
            slot, position = None, None  # loaded a state of slots that had not started
        if position is None:
            slot = None
        return _state.make(
            self._fingerprint, self._settings(), self._first_epoch, slot, position, self._skips
        )

    def load_state_dict(self, state_dict: Any, *, allow_changed_shards: bool = False) -> None:
        """Continue after a saved position on the next ``iter(self)``.

        ``state_dict`` is one state from :meth:`state_dict` (same ranks and workers: the stream
        continues identically), or anything holding the states of *every* slot of a checkpoint
        — a list of all ranks' states, a torchdata ``StatefulDataLoader.state_dict()``, a list
        of those — to continue with a different number of ranks or workers (elastic resume:
        every row of the epoch not yet yielded is read exactly once by the new layout).

        ``allow_changed_shards=True`` continues even though shards were modified, replaced,
        added or removed since the state was saved (without it: :class:`ShardsChangedError`,
        naming them). Meaning: each slot keeps its epoch and the number of rows it had yielded
        in it; the new data's stream of that epoch is fast-forwarded past that many rows (on
        row coordinates, nothing read) and continues. So the current epoch may repeat or miss
        rows (its order is the new data's), the old shuffle buffer is dropped, later epochs are
        exact over the new data, and recorded skips are kept as history.

        Raises:
            ShardsChangedError: the shards changed since the state was saved (names them).
            StateError: the state is malformed, of another version, or saved over other data
                or with other settings (the message says what differs).
        """
        found = _state.gather(state_dict)
        if not found:
            raise StateError(
                f"no shardstream state found in the {type(state_dict).__name__} given "
                "(expected what ParquetStream.state_dict() returns, or a list or loader state "
                "holding it)"
            )
        parsed = [
            _state.check(
                s,
                self._fingerprint,
                self._settings(),
                changes=self.catalog.changes_since,
                allow_changed=allow_changed_shards,
            )
            for s in found
        ]
        first_epochs = sorted({p[0] for p in parsed})
        if len(first_epochs) > 1:
            raise StateError(f"the states come from different passes (first epochs {first_epochs})")
        # Slots that had not started carry no position: nothing to continue there.
        pending = [
            (p.slot, p.position) for p in parsed if p.slot is not None and p.position is not None
        ]
        if any(p.changed for p in parsed):
            pending = [
                (slot, self._carry_over(slot, pos, first_epochs[0])) for slot, pos in pending
            ]
        # Full validation now (rows, buffers, epochs), not at the first next(): fail early.
        if len(pending) == 1:
            probe = self._new_stream(pending[0][0], first_epoch=first_epochs[0], probe=True)
            probe.restore(pending[0][1])
        elif pending:
            # Checks every state against shared epoch plans (not one probe stream per state).
            probe = self._new_stream((0, 1, "off"), first_epoch=first_epochs[0], probe=True)
            probe.check_states([(s[0], s[1], p) for s, p in pending], _one_even(pending))
        self._first_epoch = first_epochs[0]
        self._reset_position()
        self._pending = pending
        self._skips = _union_skips(r for s in found for r in _state.skips(s))

    def _carry_over(
        self, slot: _state.Slot, position: dict[str, Any], first_epoch: int
    ) -> dict[str, Any]:
        """A position over changed shards: same epoch, same rows yielded (allow_changed_shards)."""
        epoch = _state._int(position.get("epoch"), "state['position']['epoch']")
        emitted = _state._int(position.get("emitted"), "state['position']['emitted']")
        stream = self._new_stream(slot, first_epoch=first_epoch, probe=True)
        start = {
            "epoch": epoch,
            "cursor": 0,
            "emitted": 0,
            "rng_word_pos": 0,
            "buffer": "",
            "specs": [],
            "seek": None,
        }
        stream.restore(start)
        stream.skip(emitted, 1)
        return stream.state()

    # -- skips --------------------------------------------------------------------------------
    def skip(self, n: int) -> None:
        """Pass over the next ``n`` items (batches in batch mode, rows in row mode) without
        reading them, and record it in the state (``state_dict()["skips"]``).

        Applies to this process's stream: the live iterator (the next item is ``n`` later), or,
        before iterating, the loaded state (or the start). Nothing skipped is read or decoded:
        the position moves on row coordinates, and with a shuffle buffer the buffer is simulated
        on row ids, so the stream after a skip is exactly the one that reading and discarding
        ``n`` items would give. Skips cross epoch ends; a short last batch dropped by
        ``drop_last`` is passed over without counting. To skip inside a DataLoader's workers,
        rewrite the checkpoint with :meth:`skip_state` instead.

        Example:
            >>> import tempfile, shardstream.datagen as dg
            >>> d = tempfile.mkdtemp()
            >>> _ = dg.write_shards(d, num_shards=1, rows_per_shard=10)
            >>> ds = ParquetStream(d, columns=["id"], batch_size=2, output="python")
            >>> it = iter(ds); next(it)["id"]
            [0, 1]
            >>> ds.skip(2)
            >>> next(it)["id"]
            [6, 7]
            >>> ds.state_dict()["skips"]
            [{'epoch': 0, 'slot': [0, 1], 'start': 2, 'stop': 6}]
        """
        _check_count(n, "n")
        if n == 0:
            return
        if self._stream is not None and self._pending is None and not self._finished:
            stream, slot = self._stream, self._slot
            assert slot is not None
            if self._rows_into_chunk is not None:
                # Row mode, mid-chunk: back to the last yielded row; the chunk's rest is dropped.
                stream.restore(stream.state(within=self._rows_into_chunk))
                self._rows_into_chunk = None
            self._chunk += 1
        else:
            if self._pending and len(self._pending) > 1:
                raise StateError(
                    "skip() before iterating needs a single loaded state; to skip in every "
                    "slot of a multi-slot checkpoint, rewrite it with skip_state()"
                )
            slot = self._resolve_slot()
            stream = self._restored_stream(slot) if self._pending else self._new_stream(slot)
        self._apply_skip(stream, slot, n, self._batch_size or 1)
        if self._stream is not stream:
            # Not iterating: the skip becomes the position the next iterator starts from.
            self._pending = [(slot, stream.state())]

    def _apply_skip(self, stream: RawStream, slot: _state.Slot, items: int, rows: int) -> None:
        ranges = stream.skip(items, rows, self._drop_last and self._batch_size is not None)
        self._skips = _union_skips(
            [
                *self._skips,
                *(
                    {"epoch": e, "slot": [slot[0], slot[1]], "start": a, "stop": b}
                    for e, a, b in ranges
                    if b > a
                ),
            ]
        )

    def skip_state(self, state_dict: Any, n: int) -> Any:
        """A copy of a saved checkpoint in which every slot's stream has skipped its next ``n``
        items (recorded in each state's ``skips``), for streams iterated inside DataLoader
        workers or ranks. ``state_dict`` is anything :meth:`load_state_dict` takes, e.g. a
        ``StatefulDataLoader.state_dict()``; with ``W`` workers (or ranks), the loader as a
        whole then passes over ``n * W`` batches. Same layout only (not across an elastic
        change); nothing is read.
        """
        _check_count(n, "n")
        import copy

        out = copy.deepcopy(state_dict)
        found = _state.gather(out)
        if not found:
            raise StateError(f"no shardstream state found in the {type(state_dict).__name__}")
        for st in found:
            first_epoch, slot, position, _ = _state.check(
                st, self._fingerprint, self._settings(), changes=self.catalog.changes_since
            )
            if slot is None or position is None:
                raise StateError(
                    "skip_state needs states of slots that have started (this one has no "
                    "position): iterate once, or use skip() before iterating"
                )
            stream = self._new_stream(slot, first_epoch=first_epoch, probe=True)
            stream.restore(position)
            saved, self._skips = self._skips, _state.skips(st)
            try:
                self._apply_skip(stream, slot, n, self._batch_size or 1)
                st[_state.KEY_POSITION] = stream.state()
                st[_state.KEY_SKIPS] = self._skips
            finally:
                self._skips = saved
        return out

    def replay_skips(self, skips: Any) -> None:
        """Apply recorded skips again when the stream reaches them, e.g. to re-run from an
        earlier checkpoint the way a later run went: ``ds.replay_skips(later_state)``.
        ``skips`` is a list of skip records or anything holding states (their ``skips`` are
        used). A record applies when this iterator's slot reaches its epoch and start; records
        of other slots (another layout) never apply.
        """
        if isinstance(skips, list) and all(
            isinstance(r, dict) and "start" in r and "stop" in r for r in skips
        ):
            records = _state.skips({_state.KEY_SKIPS: skips})
        else:
            found = _state.gather(skips)
            if not found:
                raise StateError(f"no skips or shardstream state found in {type(skips).__name__}")
            records = [r for st in found for r in _state.skips(st)]
        self._replay = _union_skips([*self._replay, *records])

    def _replay_due(self, stream: RawStream, slot: _state.Slot) -> int | None:
        """Replay: apply the recorded skip that starts at the stream's position, if any; return
        the rows until the next one in the current epoch (``None``: none ahead)."""
        me = [slot[0], slot[1]]
        while True:
            epoch, at = stream.position()
            ahead = [
                r["start"]
                for r in self._replay
                if r["epoch"] == epoch and r["slot"] == me and r["start"] >= at
            ]
            if not ahead:
                return None
            start = min(ahead)
            if start > at:
                return start - at
            rec = next(
                r
                for r in self._replay
                if r["epoch"] == epoch and r["slot"] == me and r["start"] == at
            )
            self._apply_skip(stream, slot, rec["stop"] - at, 1)
            if stream.position() == (epoch, at):
                return None  # end of the pass

    # -- iteration ----------------------------------------------------------------------------
    def __iter__(self) -> Iterator[Any]:
        # Set up at the first next(), not here: torchdata's StatefulDataLoader.state_dict()
        # creates the iterator early, and accelerate then calls set_epoch() before using it.
        self._generation += 1
        return self._iterate(self._generation)

    def _iterate(self, generation: int) -> Iterator[Any]:
        self._stale(generation)
        self._started = generation
        slot = self._resolve_slot()
        if self._pending is not None:
            stream = self._restored_stream(slot)
            self._pending = None
        else:
            stream = self._new_stream(slot)
            if self._stream is not None and not self._finished and self._slot == slot:
                position = self._position()  # continue where the previous iterator stopped
                if position is not None:
                    stream.restore(position)
        self._stream, self._slot = stream, slot
        self._rows_into_chunk = None
        self._finished = False
        yield from self._generate(stream, generation)

    def _restored_stream(self, slot: _state.Slot, probe: bool = False) -> RawStream:
        """A stream for ``slot`` positioned by the loaded states: its own state if one was
        loaded, else (another layout: ranks x workers) its share of what is left."""
        assert self._pending is not None
        stream = self._new_stream(slot, probe=probe)
        own = [p for s, p in self._pending if s == slot]
        if own:
            stream.restore(own[0])
        elif self._pending:
            try:
                merged = [(s[0], s[1], p) for s, p in self._pending]
                stream.restore_merged(merged, _one_even(self._pending))
            except StateError as e:
                raise StateError(
                    f"{e} (this iterator is slot {slot[0]} of {slot[1]}, slot = rank * "
                    "num_workers + worker_id; to resume with other ranks or workers, load "
                    "the states of every slot, e.g. a list of all ranks' states)"
                ) from None
        return stream

    def _stale(self, generation: int) -> None:
        if generation != self._generation:
            raise RuntimeError(
                "this iterator is stale: iter() was called again on the same ParquetStream, and "
                "only the newest iterator owns the dataset's position"
            )

    def _generate(self, stream: RawStream, generation: int) -> Iterator[Any]:
        conv = Converter(self._output, self.catalog.schema, self._list_format)
        bs = self._batch_size
        slot = self._slot
        assert slot is not None
        while True:
            self._stale(generation)
            # Replayed skips start where the recorded run skipped: between items.
            room = self._replay_due(stream, slot) if self._replay else None
            if bs is not None:
                rb = stream.next_batch(bs)
                if rb is None:
                    break
                if self._drop_last and rb.num_rows < bs:
                    continue
                yield conv.batch(rb)
                continue
            rb = stream.next_batch(ROW_MODE_CHUNK if room is None else min(room, ROW_MODE_CHUNK))
            if rb is None:
                break
            last, chunk = rb.num_rows, self._chunk
            for i, row in enumerate(conv.rows(rb), 1):
                self._stale(generation)
                if self._chunk != chunk:
                    break  # skip() moved the stream: the rest of this chunk is not yielded
                self._rows_into_chunk = i if i < last else None
                yield row
        self._stale(generation)
        self._finished = True

    # -- pickling (spawn-started workers) -----------------------------------------------------
    def __getstate__(self) -> dict[str, Any]:
        d = self.__dict__.copy()
        # Rust objects stay behind; the position travels as a plain state.
        position = self._position()
        if (
            self._pending is None
            and self._slot is not None
            and position is not None
            and not self._finished
        ):
            d["_pending"] = [(self._slot, position)]
        d["_catalog"] = None
        d["_stream"] = None
        # Spawned workers do not see accelerate's loader: take what it is from here.
        d["_wrapped"] = self.__dict__.get("_wrapped") or _accelerate.wrapper(self)
        d["_rows_into_chunk"] = None
        return d

    def __setstate__(self, d: dict[str, Any]) -> None:
        self.__dict__.update(d)

    def __repr__(self) -> str:
        return (
            f"ParquetStream({len(self._sources)} source(s), columns={self._columns}, "
            f"batch_size={self._batch_size}, shuffle_buffer={self._shuffle_buffer}, "
            f"seed={self._seed}, epochs={self._epochs}, output={self._output!r})"
        )
