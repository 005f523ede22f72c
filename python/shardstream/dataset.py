"""``ParquetStream``: the torch ``IterableDataset`` over the Rust core.

Design decisions (the why; the what is in docs/ARCHITECTURE.md):

* The dataset holds its arguments (one frozen ``RawSettings``, checked by the core), the catalog
  and *where the next iterator starts* (a ``RawResume``: the start of a pass, or loaded states
  the core has validated once). Each ``iter()`` makes a ``StreamIterator`` (``_iterator.py``)
  that owns the position while it runs; the state methods delegate to it, or to the resume
  point before iterating. The core owns everything a checkpoint means.
* The work unit is a *slot*: ``slot = rank * num_workers + worker_id`` of
  ``world_size * num_workers``. The core cuts each epoch's row order into one contiguous range
  per slot, so a DataLoader worker (or rank) needs no coordination, and its state is its own slot's.
* The slot is resolved in ``__iter__`` (inside the DataLoader worker), never in ``__init__``:
  the dataset object is built in the main process and copied into workers.
* No threads or runtimes are created before iteration, so forking DataLoader workers is safe;
  the Rust objects hold only memory and re-open files per read. For spawn-started workers the
  catalog pickles as its snapshot (the sidecar's JSON form: a worker lists nothing and reads a
  footer only when it first reads that shard, checking it against the recorded digest) and the
  position as plain states.
"""

from __future__ import annotations

import copy
import os
import warnings
from collections.abc import Iterator, Mapping, Sequence
from typing import TYPE_CHECKING, Any

import pyarrow as pa

from . import _core, _slots, _torch
from . import state as _state
from ._core import RawCatalog, RawResume, RawSettings, RawStream
from ._iterator import StreamIterator, make_iterator, replaces_unstarted_after_load
from ._signals import MainSignals
from .convert import Converter, check_output
from .errors import StateError
from .integrations import accelerate as _accelerate
from .pack import Pack, PackConverter

# Never imported here: numpy/python/arrow output runs without torch, and the class is registered
# as a torch IterableDataset once torch is there (_torch.py).
if TYPE_CHECKING:
    from torch.utils.data import IterableDataset as _Base
else:
    _Base = object

__all__ = ["ParquetStream"]

_DEFAULTS = _core.DEFAULTS


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


def _check_count(value: Any, name: str) -> None:
    if isinstance(value, bool) or not isinstance(value, int) or value < 0:
        raise ValueError(f"{name} must be an int >= 0, got {value!r}")


class ParquetStream(_Base):  # type: ignore[misc,valid-type]
    """An exactly resumable stream of rows or batches from Parquet or Arrow IPC shards.

    Args:
        source: a file, a directory (every ``*.parquet``, ``*.arrow``, ``*.feather``,
            ``*.arrows`` and ``*.ipc`` below it; each file's format is told by its magic bytes),
            an HF ``datasets`` ``save_to_disk`` directory (its ``state.json`` files, in that
            order), a glob, an object-store URL (``s3://``, ``gs://``, ``az://``, ``https://``,
            ``file://``), or a list of these (all local paths or all URLs). Shards are read in
            sorted path order.
        columns: columns to read (in this order); ``None`` reads all.
        batch_size: ``None`` yields one row at a time as ``dict[column, value]``; an int yields
            batches of that many rows (the last of each epoch short unless ``drop_last``).
        drop_last: drop each epoch's short last batch.
        shuffle_buffer: ``0`` keeps shard order; ``n > 0`` permutes row groups per epoch and
            shuffles rows through an ``n``-row buffer.
        seed: seed of every shuffle. Same settings and seed give the same stream everywhere.
        epochs: epochs per pass (``for x in ds``: epochs ``first_epoch .. first_epoch + epochs -
            1``, each reshuffled with a seed from ``(seed, epoch)``), or ``None`` for endless.
        output: ``"torch"``, ``"numpy"``, ``"python"`` or ``"arrow"``.
        list_format: batch mode with numpy/torch output, ``list<number>`` columns: ``"split"``
            (a :class:`shardstream.convert.SplitList`: a ``list`` of 1-D arrays/tensors, one per
            row, views of one values buffer, that crosses DataLoader workers as that buffer plus
            offsets), ``"offsets"`` (``(values, offsets)``),
            ``"padded"`` (``(padded 2-D, lengths)``, 0-padded) or ``"nested"`` (a jagged
            ``torch.nested`` tensor). Columns with null lists or values stay Python lists.
        rank, world_size: this process's place among distributed ranks; default from
            ``torch.distributed`` if initialized, else ``RANK``/``WORLD_SIZE``, else 0 of 1.
        even: with several ranks, make every rank yield the same number of items per epoch
            (so DDP never waits on a rank that ran out): ``"drop"`` skips up to
            ``world_size * num_workers - 1`` rows per epoch, ``"pad"`` repeats up to that many,
            ``None`` yields every row exactly once and lets ranks differ by up to one row per
            slot. A single rank never drops or pads.
        read_batch_rows: rows per decoded batch (tuning only; never changes the stream).
            ``None`` sizes it from the footers: about 4 MiB of the selected columns' decoded
            bytes per row, rounded down to a power of two, within 16 .. 16,384 rows (2,048
            for ``[id, tokens]`` rows of ~1.2 KB, 16,384 for 16-byte ``[id, score]`` rows;
            2,048 for a remote dataset whose footers were not read, e.g. opened from a sidecar);
            for Arrow IPC shards at least 2,048 (a record batch is decoded whole and sliced).
        readahead_threads: background decoding threads per iterator (``0`` decodes in the
            caller). ``None`` picks ``min(4, cores // DataLoader workers)``, at least 1, 8
            for URL sources, and 0 when every shard is a local uncompressed Arrow IPC file or
            stream (such a batch decodes to arrays over the mapped file, cheaper than handing
            it over from a thread). Threads start on the first ``next()`` (inside the worker
            process), never before a fork.
        readahead_depth: decoded batches each readahead thread may hold ready.
        storage_options: settings for URL sources: the ``object_store`` crate's configuration
            keys for the scheme (e.g. ``{"aws_endpoint": "http://127.0.0.1:9000",
            "aws_region": "us-east-1", "aws_skip_signature": "true"}``), which override the
            standard environment variables (``AWS_*``, ``GOOGLE_*``, ``AZURE_*``), plus
            ``timeout`` / ``connect_timeout`` (per request, e.g. ``"30s"``), ``max_retries``,
            ``retry_timeout`` and ``backoff_initial``. An unknown key is an error.
        pack: a :class:`shardstream.Pack`: items are rows of ``seq_len`` tokens packed from the
            documents of a token column (``batch_size`` packed rows per item, or one in row
            mode), with the packer's pending documents in the state as row references.
            ``skip()`` is not available with packing.

    Raises:
        FileNotFoundError: a source names nothing.
        ShardError: a shard is not readable Parquet.
        SchemaError: shards disagree on a requested column, or it does not exist.
        ValueError, TypeError: an argument is out of range or of the wrong type (named).

    Only the newest iterator of a dataset owns its position: an older one raises
    ``RuntimeError`` when used. A pass that has ended starts again at its first epoch.

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
        even: str | None = _DEFAULTS["even"],
        read_batch_rows: int | None = _DEFAULTS["read_batch_rows"],
        readahead_threads: int | None = None,
        readahead_depth: int = _DEFAULTS["readahead_depth"],
        storage_options: Mapping[str, str] | None = None,
        pack: Pack | None = None,
    ) -> None:
        check_output(output, list_format)  # imports nothing (torch only when iterated)
        _torch.register_if_loaded(ParquetStream)  # in case the import hook could not run
        self._settings_args: dict[str, Any] = dict(
            seed=seed,
            shuffle_buffer=shuffle_buffer,
            batch_size=batch_size,
            drop_last=drop_last,
            epochs=epochs,
            even=even,
            read_batch_rows=read_batch_rows,
            readahead_threads=readahead_threads,
            readahead_depth=readahead_depth,
        )
        if pack is not None:
            if not isinstance(pack, Pack):
                raise TypeError(
                    f"pack must be a shardstream.Pack or None, got {type(pack).__name__}"
                )
            self._settings_args["pack"] = pack.record()
        self._pack = pack
        self._settings = RawSettings(**self._settings_args)  # checks every number, naming it
        _slots.check_rank(rank, world_size)
        self._sources = _sources(source)
        self._storage_options = _storage_options(storage_options)
        if isinstance(columns, str):
            columns = [columns]  # one column, not its characters
        self._columns = None if columns is None else [str(c) for c in columns]
        self._output = output
        self._list_format = list_format
        self._rank = rank
        self._world_size = world_size
        self._catalog = RawCatalog(self._sources, self._columns, self._storage_options)
        if pack is not None:
            pack.check_schema(self._catalog.schema)
        # Where the next iterator starts; None only after unpickling, until first needed.
        self._resume: RawResume | None = RawResume.start(0)
        # (states, replay records, summaries or None), as __getstate__ writes it
        self._pickled_resume: tuple[list[dict[str, Any]], Any, list[Any] | None] | None = None
        # A two-phase load: (its RawResume, the states, the summaries), to pickle it as given
        self._two_phase: tuple[RawResume, list[dict[str, Any]], list[Any]] | None = None
        self._iter: StreamIterator | None = None  # the newest iterator
        self._loaded = False  # _resume came from load_state_dict and no iterator started yet
        self._loads = 0  # load_state_dict() calls: which iterators were made after the last
        self._asked: int | None = None  # set_epoch()'s epoch until a stream next opens
        self._signals = MainSignals()  # set_epoch() etc. reaching persistent workers

    # -- properties ---------------------------------------------------------------------------
    @property
    def catalog(self) -> RawCatalog:
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
        """Absolute shard paths (or URLs) in read order."""
        return list(self.catalog.shard_paths)

    @property
    def batch_size(self) -> int | None:
        """Rows per item (``None``: rows one at a time)."""
        return self._settings.batch_size

    @property
    def drop_last(self) -> bool:
        """Whether each epoch's short last batch is dropped."""
        return self._settings.drop_last

    @property
    def schema(self) -> pa.Schema:
        """Schema of the output columns."""
        return self.catalog.schema

    # -- where this process sits --------------------------------------------------------------
    def _layout(self) -> tuple[int, int, int, int]:
        """``(rank, world_size, worker, num_workers)`` of an iterator made here and now."""
        return _slots.layout(self, self._rank, self._world_size)

    def _start_point(self) -> RawResume:
        """Where a new iterator starts: after the previous one if it has started (or, once it
        ended, the start of the pass again; it goes stale), else the loaded state or the start
        of the pass (an iterator that has not started will start there)."""
        if self._iter is not None and self._iter.started:
            self._resume, self._iter = self._iter.resume_point(), None
        if self._resume is None:  # unpickled: the position travelled as plain states
            assert self._pickled_resume is not None
            states, replay, summaries = self._pickled_resume
            self._resume = RawResume.load(
                self.catalog, self._settings, states, summaries=summaries
            ).with_replay(records=replay)
            self._pickled_resume = None
        return self._resume

    # -- epochs and state ---------------------------------------------------------------------
    def set_epoch(self, epoch: int) -> None:
        """Start the next pass at ``epoch`` (like ``DistributedSampler.set_epoch``).

        After :meth:`load_state_dict`, setting the epoch the loaded state is in keeps the loaded
        position (so ``for e in range(start, n): ds.set_epoch(e); ...`` resumes); setting
        another epoch discards it, with a ``UserWarning`` saying so. Persistent DataLoader
        workers (``persistent_workers=True``) apply it when their next pass starts.
        """
        _check_count(epoch, "epoch")
        if epoch >= 2**63:
            raise ValueError(f"epoch must be below 2**63, got {epoch}")
        _accelerate.before_epoch(self, self._world_size)  # accelerate's loader calls set_epoch
        self._signals.set_epoch(epoch)  # persistent DataLoader workers apply it at their iter()
        self._set_epoch(epoch, stacklevel=3)

    def _set_epoch(self, epoch: int, stacklevel: int) -> None:
        self._asked = epoch
        start = self._start_point()
        if self._loaded:
            if start.first_epoch == epoch and set(start.epochs) <= {epoch}:
                return  # the loaded state is in this epoch: keep its position
            if not start.at_start:
                warnings.warn(
                    f"set_epoch({epoch}) discards the position loaded by load_state_dict(), "
                    f"which is in epoch {', '.join(map(str, start.epochs))} of a pass that "
                    f"started at epoch {start.first_epoch}: the pass starts over at epoch "
                    f"{epoch}. To continue from the loaded position, don't call set_epoch() "
                    "before iterating, or call it with the loaded state's epoch",
                    UserWarning,
                    stacklevel=stacklevel,
                )
            self._loaded = False
        self._resume = start.restart(epoch)

    def state_dict(self) -> dict[str, Any]:
        """The position right after the last item this dataset yielded, as plain built-ins
        (fields: docs/state-format.md)."""
        if self._iter is not None and self._iter.started:
            return self._iter.state_dict()
        return self._start_point().state_dict(self.catalog, self._settings, self._layout())

    def load_state_dict(
        self,
        state_dict: Any,
        *,
        allow_changed_shards: bool = False,
        summaries: list[dict[str, Any]] | None = None,
    ) -> None:
        """Continue after a saved position on the next ``iter(self)``.

        ``state_dict`` is one state from :meth:`state_dict` (same ranks and workers: the stream
        continues identically), or anything holding the states of *every* slot of a checkpoint
        — a list of all ranks' states, a torchdata ``StatefulDataLoader.state_dict()``, a list
        of those — to continue with a different number of ranks or workers (elastic resume:
        every row of the epoch not yet yielded is read exactly once by the new layout). The
        states are checked completely here, once; through a ``StatefulDataLoader`` the loader
        hands them to its workers, so the checks run at the first batch.

        ``allow_changed_shards=True`` continues even though shards were modified, replaced,
        added or removed since the state was saved (without it: :class:`ShardsChangedError`,
        naming them). Meaning: each slot keeps its epoch and the number of rows it had yielded
        in it; the new data's stream of that epoch is fast-forwarded past that many rows (on
        row coordinates, nothing read) and continues. So the current epoch may repeat or miss
        rows (its order is the new data's), the old shuffle buffer is dropped, later epochs are
        exact over the new data, and recorded skips are kept as history.

        ``summaries`` (two-phase elastic resume, for many slots): every old slot's summary —
        its state's ``first_epoch``, ``slot`` and ``position`` (``position["buffer"]`` may be
        left out) — while ``state_dict`` holds the full states of only the slots
        :meth:`needed_slots` names. The stream is the one loading every full state gives.
        DataLoader workers (forked or spawned) each merge their own slot from the same states
        and summaries: give the states ``needed_slots(summaries, num_workers=N)`` names.
        :func:`shardstream.checkpoint.load_dcp_states` does both phases from a DCP checkpoint.

        Raises:
            ShardsChangedError: the shards changed since the state was saved (names them).
            StateError: the state is malformed, of another version, or saved over other data
                or with other settings (the message says what differs).
        """
        if summaries is not None:
            states, summaries = _state.gather(state_dict), list(summaries)
            self._resume = RawResume.load(
                self.catalog, self._settings, states, False, self._start_point(), summaries
            )
            self._two_phase = (self._resume, states, summaries)
            self._loaded = True
            self._loads += 1
            self._signals.moved()
            return
        found = _state.gather(state_dict)
        if not found:
            raise StateError(
                f"no shardstream state found in the {type(state_dict).__name__} given "
                "(expected what ParquetStream.state_dict() returns, or a list or loader state "
                "holding it)"
            )
        self._resume = RawResume.load(
            self.catalog, self._settings, found, allow_changed_shards, self._start_point()
        )
        self._loaded = True  # until an iterator starts from it, or set_epoch() moves on
        self._loads += 1
        self._signals.moved()

    def needed_slots(
        self, summaries: list[dict[str, Any]], num_workers: int | None = None
    ) -> list[int]:
        """Two-phase elastic resume, phase 1: which old slots' full states this rank needs.

        ``summaries`` holds every old slot's summary: its state's ``first_epoch``, ``slot``
        and ``position`` without ``position["buffer"]`` (a few hundred bytes, against the
        buffer's ~10.7 bytes per row). Returns the sorted old slot indexes whose full states
        the iterators of this rank (``num_workers`` DataLoader workers; default: this
        process's) read rows from; pass those states with the summaries to
        :meth:`load_state_dict`. Typically ``old slots / new slots + 1`` per new slot.
        """
        rank, world, worker, workers = self._layout()
        if num_workers is None:
            layouts = [(rank, world, worker, workers)]
        else:
            _check_count(num_workers, "num_workers")
            layouts = [(rank, world, w, max(num_workers, 1)) for w in range(max(num_workers, 1))]
        return RawResume.needed_slots(self.catalog, self._settings, list(summaries), layouts)

    # -- skips --------------------------------------------------------------------------------
    def skip(self, n: int) -> None:
        """Pass over the next ``n`` items (batches in batch mode, rows in row mode) without
        reading them, and record it in the state (``state_dict()["skips"]``).

        Applies to this process's stream: the live iterator (the next item is ``n`` later), or,
        before iterating, the loaded state (or the start). Nothing skipped is read or decoded:
        the position moves on row coordinates, and with a shuffle buffer the buffer is simulated
        on row ids, so the stream after a skip is exactly the one that reading and discarding
        ``n`` items would give. Skips cross epoch ends; a short last batch dropped by
        ``drop_last`` is passed over without counting. ``skip()`` before iterating needs a
        single loaded state. To skip inside a DataLoader's workers, rewrite the checkpoint with
        :meth:`skip_state` instead.

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
        self._signals.moved()
        if self._iter is not None and self._iter.started and not self._iter.ended:
            self._iter.skip(n)
            return
        start = self._start_point()
        self._resume = start.skip(self.catalog, self._settings, self._layout(), n)

    def skip_state(self, state_dict: Any, n: int) -> Any:
        """A copy of a saved checkpoint in which every slot's stream has skipped its next ``n``
        items (recorded in each state's ``skips``), for streams iterated inside DataLoader
        workers or ranks. ``state_dict`` is anything :meth:`load_state_dict` takes, e.g. a
        ``StatefulDataLoader.state_dict()``; with ``W`` workers (or ranks), the loader as a
        whole then passes over ``n * W`` batches. Same layout only (not across an elastic
        change); nothing is read.
        """
        _check_count(n, "n")
        out = copy.deepcopy(state_dict)
        found = _state.gather(out)
        if not found:
            raise StateError(f"no shardstream state found in the {type(state_dict).__name__}")
        for st in found:
            new = _core.skip_state(self.catalog, self._settings, st, n)
            st.clear()
            st.update(new)
        return out

    def replay_skips(self, skips: Any) -> None:
        """Apply recorded skips again when the stream reaches them, e.g. to re-run from an
        earlier checkpoint the way a later run went: ``ds.replay_skips(later_state)``.
        ``skips`` is a list of skip records or anything holding states (their ``skips`` are
        used). A record applies when this iterator's slot reaches its epoch and start; records
        of other slots (another layout) never apply.
        """
        records: Any = None
        states: list[dict[str, Any]] | None = None
        if isinstance(skips, list) and all(
            isinstance(r, dict) and "start" in r and "stop" in r for r in skips
        ):
            records = skips
        else:
            states = _state.gather(skips)
            if not states:
                raise StateError(f"no skips or shardstream state found in {type(skips).__name__}")
        if self._iter is not None and self._iter.started and not self._iter.ended:
            self._iter.replay(records=records, states=states)
        else:
            self._resume = self._start_point().with_replay(records=records, states=states)

    # -- iteration ----------------------------------------------------------------------------
    def __iter__(self) -> Iterator[Any]:
        epoch = self._signals.new_epoch()  # a persistent worker's next pass
        if epoch is not None:
            self._set_epoch(epoch, stacklevel=2)
        if replaces_unstarted_after_load(self):
            start = self._start_point()
            if start.pass_ended(self.catalog, self._settings, self._layout()):
                asked = self._asked
                self._resume = start.restart(start.first_epoch if asked is None else asked)
                self._loaded = False
        self._start_point()  # an earlier iterator's position becomes the start point
        conv: Any = (
            PackConverter(self._output)
            if self._pack is not None
            else Converter(self._output, self.catalog.schema, self._list_format)
        )
        batched = self._settings.batch_size is not None
        self._iter = make_iterator(self, conv, batched)
        self._iter.made = self._loads
        return self._iter

    def _open_stream(self) -> RawStream:
        """The core stream of the newest iterator, at its first ``next()`` (inside the
        DataLoader worker, with the trainer's loader already set up: see ``_layout``)."""
        self._signals.check_moved("ParquetStream")
        start, layout = self._start_point(), self._layout()
        asked, self._asked = self._asked, None
        if (
            self._loaded
            and asked is not None
            and asked > start.first_epoch
            and start.pass_ended(self.catalog, self._settings, layout)
        ):
            # torchdata's StatefulDataLoader loads its state inside iter(loader), after the
            # loop's set_epoch(): a state saved at the end of a pass that started at an earlier
            # epoch (after its last batch, or after the loop) then stands for the pass
            # set_epoch asked for.
            self._resume = start = start.restart(asked)
        raw = RawStream(self.catalog, self._settings, start, layout)
        self._loaded = False
        return raw

    # -- pickling (spawn-started workers) -----------------------------------------------------
    def __getstate__(self) -> dict[str, Any]:
        d = self.__dict__.copy()
        # Rust objects stay behind; the position travels as plain states.
        it = self._iter
        start = it.resume_point() if it is not None and it.started else self._start_point()
        if self._two_phase is not None and self._two_phase[0] is start:
            # Still the two-phase load: each worker merges its own slot from what was given.
            _, states, summaries = self._two_phase
            d["_pickled_resume"] = (states, start.replay(), summaries)
        else:
            d["_pickled_resume"] = (
                start.states(self.catalog, self._settings),
                start.replay(),
                None,
            )
        d["_two_phase"] = None
        # _catalog pickles as its snapshot: no listing or footer read in the worker
        d["_resume"] = d["_iter"] = d["_settings"] = None
        # Spawned workers do not see accelerate's loader: take what it is from here.
        d["_wrapped"] = self.__dict__.get("_wrapped") or _accelerate.wrapper(self)
        return d

    def __setstate__(self, d: dict[str, Any]) -> None:
        self.__dict__.update(d)
        self._settings = RawSettings(**self._settings_args)

    def __repr__(self) -> str:
        a = self._settings_args
        return (
            f"ParquetStream({len(self._sources)} source(s), columns={self._columns}, "
            f"batch_size={a['batch_size']}, shuffle_buffer={a['shuffle_buffer']}, "
            f"seed={a['seed']}, epochs={a['epochs']}, output={self._output!r})"
        )


_torch.register_as_iterable_dataset(ParquetStream)
