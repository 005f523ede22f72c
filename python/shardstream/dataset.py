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
from collections.abc import Iterator, Sequence
from typing import Any

import pyarrow as pa

from . import state as _state
from ._core import RawCatalog, RawStream
from .convert import OUTPUTS, Converter
from .errors import StateError

try:  # torch is optional at import: numpy/python/arrow output work without it.
    import torch
    from torch.utils.data import IterableDataset as _Base
except ImportError:  # pragma: no cover - exercised only without torch
    torch = None  # type: ignore[assignment]
    _Base = object  # type: ignore[assignment,misc]

__all__ = ["ParquetStream"]

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
        readahead_depth: decoded batches each readahead thread may hold ready.

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
        read_batch_rows: int = 8192,
        readahead_threads: int | None = None,
        readahead_depth: int = 2,
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
        self._catalog: RawCatalog | None = RawCatalog(self._sources, self._columns)
        self._fingerprint: dict[str, Any] = self._catalog.fingerprint()
        self._first_epoch = 0
        self._reset_position()

    def _reset_position(self) -> None:
        self._stream: RawStream | None = None  # the stream the latest iterator reads
        self._slot: _state.Slot | None = None
        self._rows_into_chunk: int | None = None  # row mode: rows yielded of the last chunk
        # Loaded states not yet applied: (slot, position) of one or more slots; applied by
        # __iter__, where this iterator's own slot is known.
        self._pending: list[tuple[_state.Slot, dict[str, Any]]] | None = None
        self._finished = False
        self._generation = 0

    # -- properties ---------------------------------------------------------------------------
    @property
    def catalog(self) -> RawCatalog:
        if self._catalog is None:  # re-opened after unpickling in a spawned worker
            cat = RawCatalog(self._sources, self._columns)
            if cat.fingerprint() != self._fingerprint:
                raise StateError(
                    "the shard set changed between creating the dataset and iterating it "
                    f"(was {self._fingerprint}, now {cat.fingerprint()})"
                )
            self._catalog = cat
        return self._catalog

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
        if self._rank is not None and self._world_size is not None:
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
        if isinstance(epoch, bool) or not isinstance(epoch, int) or epoch < 0:
            raise ValueError(f"epoch must be an int >= 0, got {epoch!r}")
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
        return _state.make(self._fingerprint, self._settings(), self._first_epoch, slot, position)

    def load_state_dict(self, state_dict: Any) -> None:
        """Continue after a saved position on the next ``iter(self)``.

        ``state_dict`` is one state from :meth:`state_dict` (same ranks and workers: the stream
        continues identically), or anything holding the states of *every* slot of a checkpoint
        — a list of all ranks' states, a torchdata ``StatefulDataLoader.state_dict()``, a list
        of those — to continue with a different number of ranks or workers (elastic resume:
        every row of the epoch not yet yielded is read exactly once by the new layout).

        Raises:
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
        parsed = [_state.check(s, self._fingerprint, self._settings()) for s in found]
        first_epochs = sorted({p[0] for p in parsed})
        if len(first_epochs) > 1:
            raise StateError(f"the states come from different passes (first epochs {first_epochs})")
        # Slots that had not started carry no position: nothing to continue there.
        pending = [(slot, pos) for _, slot, pos in parsed if slot is not None and pos is not None]
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

    # -- iteration ----------------------------------------------------------------------------
    def __iter__(self) -> Iterator[Any]:
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
        self._generation += 1
        return self._generate(stream, self._generation)

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
        if bs is not None:
            while True:
                self._stale(generation)
                rb = stream.next_batch(bs)
                if rb is None:
                    break
                if self._drop_last and rb.num_rows < bs:
                    continue
                yield conv.batch(rb)
        else:
            while True:
                self._stale(generation)
                rb = stream.next_batch(ROW_MODE_CHUNK)
                if rb is None:
                    break
                rows = conv.rows(rb)
                last = len(rows)
                for i, row in enumerate(rows, 1):
                    self._stale(generation)
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
