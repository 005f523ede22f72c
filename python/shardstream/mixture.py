"""``Mixture``: a weighted mixture of named ``ParquetStream`` sources, exactly resumable.

Design decisions (the why; the what is in docs/guide.md "Mixtures" and docs/state-format.md):

* The Rust core owns the mixture (``rust/core/src/mix/``): the mixing rule, each source's stream,
  the state and its checks. This class holds the arguments (one frozen ``RawMixture``), the
  sources (``ParquetStream`` objects: their shard sets and shuffle settings) and where the next
  iterator starts (a ``RawMixResume``), exactly as ``ParquetStream`` does for one source; the
  iterator is ``ParquetStream``'s own (``_iterator.StreamIterator``) over a ``RawMixStream``.
* Each source runs in the mixture's layout (slot = rank * num_workers + worker_id), so worker,
  rank and elastic handling per source are a single stream's, and a source's state inside the
  mixture's state is that source's ``ParquetStream`` state, unchanged.
* Sources may have different columns. A mixed batch holds the columns every source has plus a
  source tag column (``source_column``, int32: index into :attr:`Mixture.source_names`); with
  ``combine="by_source"`` a batch is a dict of each source's own rows (its own columns); a row
  (``batch_size=None``) is its source's row (its own columns) plus the tag.
"""

from __future__ import annotations

import warnings
from collections.abc import Iterator, Mapping, Sequence
from typing import TYPE_CHECKING, Any, cast

import pyarrow as pa

from . import _core, _slots, _torch
from . import state as _state
from ._core import RawMixResume, RawMixStream, RawMixture
from ._iterator import StreamIterator, make_iterator, replaces_unstarted_after_load
from ._signals import MainSignals
from .convert import Converter, check_output
from .dataset import ParquetStream
from .errors import StateError
from .pack import Pack, PackConverter

# Never imported here (as in dataset.py): registered as a torch IterableDataset once torch is
# there (_torch.py).
if TYPE_CHECKING:
    from torch.utils.data import IterableDataset as _Base
else:
    _Base = object

__all__ = ["Mixture"]

_MIXINGS = ("deterministic", "stratified", "random")
_POLICIES = ("cycle", "stop", "drop")
_COMBINES = ("mixed", "by_source")
# ParquetStream arguments a mixture decides for its sources: they must be left at their defaults.
_OWNED = {
    "batch_size": (None, "pass batch_size to Mixture"),
    "drop_last": (False, "pass drop_last to Mixture"),
    "epochs": (
        1,
        "a source cycles through its epochs inside a mixture: use Mixture(..., "
        "max_epochs={name: n}) to cap them",
    ),
    "even": (_core.DEFAULTS["even"], "pass even to Mixture"),
}


def _int_or_none(v: Any, name: str, lo: int = 0) -> int | None:
    if v is None:
        return None
    return _int(v, name, lo, " or None")


def _int(v: Any, name: str, lo: int = 0, alt: str = "") -> int:
    if isinstance(v, bool) or not isinstance(v, int) or not lo <= v < 2**63:
        raise ValueError(f"{name} must be an int in [{lo}, 2**63){alt}, got {v!r}")
    return v


def _per_source(v: Any, names: Sequence[str], name: str, default: Any) -> dict[str, Any]:
    """A value for every source: one for all, or a dict by source name (others: ``default``)."""
    if isinstance(v, Mapping):
        unknown = [k for k in v if k not in names]
        if unknown:
            raise ValueError(f"{name} names {unknown}, which are not sources ({list(names)})")
        return {n: v.get(n, default) for n in names}
    return dict.fromkeys(names, v)


def _weights(weights: Any, names: Sequence[str]) -> list[tuple[int, list[tuple[str, float]]]]:
    """``{name: w}`` (constant) or ``[(item, {name: w}), ...]`` (a schedule) as core points."""
    if isinstance(weights, Mapping):
        points = [(0, weights)]
    elif isinstance(weights, Sequence) and not isinstance(weights, str):
        points = list(weights)
    else:
        raise TypeError(
            "weights must be a dict {source: weight} or a list of (item, {source: weight}) "
            f"points, got {type(weights).__name__}"
        )
    out = []
    for i, p in enumerate(points):
        if not (isinstance(p, (tuple, list)) and len(p) == 2 and isinstance(p[1], Mapping)):
            raise TypeError(f"weights[{i}] must be an (item, {{source: weight}}) pair, got {p!r}")
        at = _int(p[0], f"weights[{i}]'s item")
        ws = []
        for k, w in p[1].items():
            if isinstance(w, bool) or not isinstance(w, (int, float)):
                raise TypeError(f"weight of {k!r} must be a number, got {w!r}")
            ws.append((str(k), float(w)))
        out.append((at, ws))
    return out


class _MixConverter:
    """Turns what a ``RawMixStream`` returns into the output: a mixed ``RecordBatch`` through the
    mixed schema's converter; a ``RawMixChunk`` into per-source batches or tagged rows."""

    def __init__(self, mix: Mixture, raw: RawMixture) -> None:
        out, fmt = mix._output, mix._list_format
        self.names = list(raw.names)
        self.mixed = Converter(out, raw.schema, fmt)
        self.parts = [Converter(out, s, fmt) for s in raw.source_schemas()]
        self.tag = mix._source_column
        self.output = out
        if self.tag is not None:
            self.tag_conv = Converter(out, pa.schema([pa.field(self.tag, pa.int32())]), fmt)

    def batch(self, item: Any) -> Any:
        if isinstance(item, pa.RecordBatch):
            return self.mixed.batch(item)
        return {
            self.names[i]: self.parts[i].batch(p) for i, p in enumerate(item.parts) if p is not None
        }

    def rows(self, chunk: Any) -> Iterator[Any]:
        tags = chunk.tags
        rows = [
            iter(self.parts[i].rows(p)) if p is not None else None
            for i, p in enumerate(chunk.parts)
        ]
        if self.tag is None:
            return (next(rows[t]) for t in tags)  # type: ignore[index]
        tag_rows = self.tag_conv.rows(pa.record_batch([pa.array(tags, pa.int32())], [self.tag]))
        if self.output == "arrow":
            return (
                next(rows[t]).append_column(tr.schema.field(0), tr.column(0))  # type: ignore[index]
                for t, tr in zip(tags, tag_rows, strict=True)
            )
        return ({**next(rows[t]), **tr} for t, tr in zip(tags, tag_rows, strict=True))  # type: ignore[index]


class Mixture(_Base):  # type: ignore[misc,valid-type]
    """A weighted mixture of named sources with exact, elastic, re-weightable resume.

    Args:
        sources: ``{name: ParquetStream(...)}``. Each source keeps its own shard set, columns,
            shuffle (``shuffle_buffer``, ``seed``), storage options, ``read_batch_rows`` if
            set, and packing (``pack=``: every source or none, see ``pack``); the sources
            share one stream's decoded bytes and readahead (automatic ``read_batch_rows``,
            threads and ``readahead_depth`` divided among them: the guide's "Mixtures of
            named sources" has the rules); the
            mixture decides batching, epochs and layout, so a source's ``batch_size``,
            ``drop_last``, ``epochs``, ``even``, ``rank``/``world_size`` must be left at their
            defaults, and a source must be at its start (not iterated, nor given a position by
            ``load_state_dict``, ``skip`` or ``set_epoch``: the mixture's own state holds the
            sources' positions). Sources are ordered by name (:attr:`source_names`).
        weights: ``{name: weight}`` (any non-negative numbers, normalized; every source named),
            or a schedule ``[(item, {name: weight}), ...]`` starting at item 0, over the
            mixture's items counted over all ranks and workers (see ``schedule``).
        schedule: between schedule points, ``"step"`` (each point's weights hold until the
            next) or ``"linear"`` (weights move linearly, in at most 1024 equal steps).
        mixing: ``"deterministic"`` (default: every prefix of a slot's items holds each source
            within one item of its target; no random state), ``"stratified"`` (the same counts
            per ``block`` of items, in a random order inside each block) or ``"random"``
            (i.i.d. draws, counter-based).
        block: items per stratified block (default: ``batch_size``), at most 1,048,576
            (``_core.DEFAULTS["max_stratified_block"]``): a block's counts and order are laid
            out when it starts.
        on_exhausted: what a source does when its rows run out, for all sources or
            ``{name: policy}`` (default ``"cycle"``): ``"cycle"`` starts its next epoch
            (reshuffled); ``"stop"`` ends the mixture right after that source's last row
            (the same item on every rank with ``even``); ``"drop"`` leaves the mixture (its
            weight goes to the others; where a schedule weights only sources that left, the
            next point weighting one still in the mix applies). A source with no rows in a
            slot (empty, or fewer rows than slots) leaves that slot's mix whatever its policy,
            with a ``UserWarning`` naming it when the slot starts.
        max_epochs: epochs a source runs through, for all or ``{name: n}``; default endless for
            ``"cycle"`` and 1 for ``"stop"``/``"drop"``. A ``"cycle"`` source that has run its
            ``max_epochs`` is dropped.
        samples: items the mixture yields over all ranks and workers (each slot yields its
            share; ``even`` applies); ``None``: until a ``"stop"`` source runs out, or every
            source with weight (here or at a later schedule point) has been dropped, or
            endless.
        batch_size: ``None`` yields one row at a time (its source's columns plus the tag);
            an int yields batches of that many rows (the last one short unless
            ``drop_last``).
        seed: seed of the ``"stratified"`` and ``"random"`` mixing (each source shuffles with
            its own seed).
        even: ``"drop"``/``"pad"``/``None`` as in ``ParquetStream``, applied to each source's
            split between slots (and to ``samples``), so with ``"drop"``/``"pad"`` every slot
            yields the same number of items.
        rank, world_size: as in ``ParquetStream``.
        output, list_format: as in ``ParquetStream``.
        combine: batch layout: ``"mixed"`` (one batch in mixing order: the columns every source
            has, plus the tag column; each row's values are copied once into it) or
            ``"by_source"`` (``{name: that source's rows of the batch}``, each with its own
            columns, as the sources decoded them; sources without rows in it are left out).
        source_column: name of the tag column (int32 index into :attr:`source_names`), or
            ``None`` for none.
        pack: a :class:`shardstream.Pack`: pack the mixture's documents *after mixing* (the
            weights are proportions of documents; ``samples`` counts documents). Items are then
            ``batch_size`` packed rows (one in row mode) as with ``ParquetStream(pack=...)``,
            plus ``source_ids`` (int32 ``[batch, seq_len]``: each token's source as an index
            into :attr:`source_names`, ``-1`` on padding). The packer's pending documents are
            in the state as (source, row id, token range). Every source needs the token column;
            ``combine`` must be ``"mixed"``; sources must not pack themselves then.
            *Pack per source* instead: give every source its own ``pack=`` (one ``seq_len``)
            and leave this ``None``: each source packs its own documents (as it would alone),
            items are ``batch_size`` packed rows in mixing order, each row from one source
            (``source_ids``: that source on its real tokens, ``-1`` on padding), the weights,
            schedule points and ``samples`` count packed rows (tokens). A source that runs out
            is found out when its packer has nothing left as the mixer picks it; the item is
            then decided again with its policy applied, so slots run out at different items:
            ``on_exhausted="stop"`` needs ``even=None`` (a slot stops when the mixer picks
            the source again after its last packed row), and ``even`` does not equalize slots
            whose sources run out (docs/guide.md "Packing a mixture").

    Raises:
        ValueError, TypeError: an argument is out of range or of the wrong type (named).
        SchemaError: a mixed batch would need one column with two types, or a source has a
            column named ``source_column``.

    Example (``source`` indexes :attr:`source_names`; each source continues where it was after
    ``load_state_dict``, even with other weights):

    >>> from shardstream import Mixture, ParquetStream
    >>> from shardstream.datagen import write_shards
    >>> _ = write_shards("mix/a", num_shards=1, rows_per_shard=30)
    >>> _ = write_shards("mix/b", num_shards=1, rows_per_shard=10, start_id=100)
    >>> def make(weights):
    ...     src = {n: ParquetStream(f"mix/{n}", columns=["id"]) for n in ("a", "b")}
    ...     return Mixture(src, weights=weights, batch_size=4, samples=12, output="python")
    >>> ds = make({"a": 3, "b": 1})
    >>> it = iter(ds)
    >>> next(it), next(it)
    ({'id': [0, 1, 2, 100], 'source': [0, 0, 0, 1]}, {'id': [3, 4, 5, 101], 'source': [0, 0, 0, 1]})
    >>> ds2 = make({"a": 1, "b": 1})
    >>> ds2.load_state_dict(ds.state_dict())
    >>> list(ds2)
    [{'id': [6, 102, 7, 103], 'source': [0, 1, 0, 1]}]
    """

    def __init__(
        self,
        sources: Mapping[str, ParquetStream],
        *,
        weights: Any,
        schedule: str = "step",
        mixing: str = "deterministic",
        block: int | None = None,
        on_exhausted: str | Mapping[str, str] = "cycle",
        max_epochs: int | None | Mapping[str, int | None] = None,
        samples: int | None = None,
        batch_size: int | None = None,
        drop_last: bool = False,
        seed: int = 0,
        even: str | None = _core.DEFAULTS["even"],
        rank: int | None = None,
        world_size: int | None = None,
        output: str = "torch",
        list_format: str = "split",
        combine: str = "mixed",
        source_column: str | None = "source",
        pack: Pack | None = None,
    ) -> None:
        _torch.register_if_loaded(Mixture)  # in case the import hook could not run
        if not isinstance(sources, Mapping) or not sources:
            raise TypeError("sources must be a non-empty dict {name: ParquetStream}")
        for n, s in sources.items():
            if not isinstance(n, str):
                raise TypeError(f"source names must be str, got {n!r}")
            if not isinstance(s, ParquetStream):
                raise TypeError(f"source {n!r} must be a ParquetStream, got {type(s).__name__}")
            for arg, (default, hint) in _OWNED.items():
                if s._settings_args[arg] != default:
                    raise ValueError(
                        f"source {n!r} has {arg}={s._settings_args[arg]!r}; inside a mixture "
                        f"leave it at {default!r}: {hint}"
                    )
            if s._rank is not None:
                raise ValueError(f"source {n!r} has rank/world_size: pass them to Mixture")
            start = s._start_point()
            if not (start.at_start and start.first_epoch == 0):
                # Its position would be ignored (every source starts at its beginning), which
                # silently re-reads rows a user meant to resume after.
                raise ValueError(
                    f"source {n!r} is not at its start (it was iterated, or given a position "
                    "by load_state_dict, skip or set_epoch): a Mixture starts every source at "
                    "its beginning and keeps their positions in its own state; pass a fresh "
                    "ParquetStream and load the mixture's state_dict() instead"
                )
        packing = sorted(n for n, s in sources.items() if s._pack is not None)
        if packing:
            plain = sorted(n for n, s in sources.items() if s._pack is None)
            if plain:
                raise ValueError(
                    f"source {packing[0]!r} packs (pack=...) but {plain[0]!r} does not: either "
                    "every source packs (pack per source, then mix packed rows: each row from "
                    "one source) or none does (pass Mixture(..., pack=Pack(...)) to pack after "
                    "mixing)"
                )
            if pack is not None:
                raise ValueError(
                    f"source {packing[0]!r} packs (pack=...) and Mixture(pack=...) is given "
                    "too: choose one order, pack per source (the sources' pack=) or pack after "
                    "mixing (Mixture's pack=)"
                )
            lens = {sources[n]._pack.seq_len for n in packing}  # type: ignore[union-attr]
            if len(lens) > 1:
                raise ValueError(
                    f"the sources pack to different seq_len {sorted(lens)}: packed rows of a "
                    "mixture have one length"
                )
            if combine != "mixed":
                raise ValueError(
                    "combine='by_source' does not apply to packing sources: items are packed "
                    "rows, each from one source (its source_ids column says which)"
                )
        check_output(output, list_format)  # imports nothing (torch only when iterated)
        for name, v, allowed in (
            ("mixing", mixing, _MIXINGS),
            ("combine", combine, _COMBINES),
            ("schedule", schedule, ("step", "linear")),
        ):
            if v not in allowed:
                raise ValueError(f"{name} must be one of {allowed}, got {v!r}")
        if not isinstance(drop_last, bool):
            raise TypeError(f"drop_last must be a bool, got {type(drop_last).__name__}")
        _int(seed, "seed")
        batch_size = _int_or_none(batch_size, "batch_size", 1)
        samples = _int_or_none(samples, "samples")
        block = _int_or_none(block, "block", 1)
        if mixing == "stratified" and block is None:
            if batch_size is None:
                raise ValueError("mixing='stratified' with batch_size=None needs block=")
            # (an explicit block above the largest is refused by the core, naming block)
            most = _core.DEFAULTS["max_stratified_block"]
            if batch_size > most:
                raise ValueError(
                    f"mixing='stratified' takes block=batch_size by default, and batch_size "
                    f"{batch_size} is above the largest block ({most} items): pass block="
                )
            block = batch_size
        if mixing != "stratified" and block is not None:
            raise ValueError("block is for mixing='stratified'")
        if pack is not None:
            if not isinstance(pack, Pack):
                raise TypeError(
                    f"pack must be a shardstream.Pack or None, got {type(pack).__name__}"
                )
            if combine != "mixed":
                raise ValueError(
                    "combine='by_source' does not apply with pack=: a packed row mixes sources "
                    "(its source_ids column says which token came from which)"
                )
            for n, s in sorted(sources.items()):
                try:
                    pack.check_schema(s.catalog.schema)
                except ValueError as e:
                    raise ValueError(f"source {n!r}: {e}") from None
        if source_column is not None and not isinstance(source_column, str):
            raise TypeError(f"source_column must be a str or None, got {source_column!r}")
        _slots.check_rank(rank, world_size)
        names = sorted(sources)
        policies = _per_source(on_exhausted, names, "on_exhausted", "cycle")
        for n, p in policies.items():
            if p not in _POLICIES:
                raise ValueError(f"on_exhausted of {n!r} must be one of {_POLICIES}, got {p!r}")
        caps = _per_source(max_epochs, names, "max_epochs", None)
        for n, m in caps.items():
            _int_or_none(m, f"max_epochs of {n!r}", 1)
        self._sources = dict(sources)
        self._args: dict[str, Any] = dict(
            weights=_weights(weights, names),
            schedule=schedule,
            mixing=mixing,
            block=block,
            seed=seed,
            batch_size=batch_size,
            drop_last=drop_last,
            even=even,
            samples=samples,
            combine=combine,
            source_column=source_column,
            pack=None if pack is None else pack.record(),
        )
        self._pack = pack
        # Items are packed rows: after mixing (pack=) or per source (every source's pack=).
        self._packed = pack is not None or bool(packing)
        self._policies = policies
        self._caps = caps
        self._output = output
        self._list_format = list_format
        self._source_column = source_column
        self._rank = rank
        self._world_size = world_size
        self._raw: RawMixture | None = None
        self._raw = self.raw  # checks the arguments and schemas now
        self._resume: RawMixResume | None = RawMixResume.start(self._raw)
        self._pickled_resume: list[dict[str, Any]] | None = None
        self._iter: StreamIterator | None = None
        self._loaded = False
        self._loads = 0  # load_state_dict() calls: which iterators were made after the last
        self._asked: int | None = None  # set_epoch()'s epoch until a stream next opens
        self._warned: set[str] = set()  # sources warned of as barren in this process
        self._signals = MainSignals()  # set_epoch() and load_state_dict() for persistent workers
        # In a DataLoader worker: the start point it was made with, before it read or loaded.
        self._origin: RawMixResume | None = None

    # -- properties ---------------------------------------------------------------------------
    @property
    def raw(self) -> RawMixture:
        """The core's mixture (rebuilt from the sources after unpickling)."""
        if self._raw is None:
            srcs = [
                (n, s.catalog, s._settings, self._policies[n], self._caps[n])
                for n, s in sorted(self._sources.items())
            ]
            self._raw = RawMixture(sources=srcs, **self._args)
        return self._raw

    @property
    def source_names(self) -> list[str]:
        """Source names in the mixture's order (name order); the tag column indexes this."""
        return list(self.raw.names)

    @property
    def sources(self) -> dict[str, ParquetStream]:
        """The sources as given, by name (a copy of the dict; the streams themselves)."""
        return dict(self._sources)

    @property
    def batch_size(self) -> int | None:
        """Rows per batch (``None``: one row at a time)."""
        return self._args["batch_size"]

    @property
    def drop_last(self) -> bool:
        """Whether the mixture's short last batch is dropped."""
        return self._args["drop_last"]

    @property
    def schema(self) -> pa.Schema:
        """Schema of a mixed batch (the shared columns, then the tag column)."""
        return self.raw.schema

    def _layout(self) -> tuple[int, int, int, int]:
        return _slots.layout(self, self._rank, self._world_size)

    def _iter_resume(self) -> RawMixResume:
        # The shared iterator is typed for ParquetStream's RawStream; over a RawMixStream its
        # resume point is a RawMixResume.
        assert self._iter is not None
        return cast(RawMixResume, self._iter.resume_point())

    def _start_point(self) -> RawMixResume:
        """Where a new iterator starts (as ``ParquetStream._start_point``)."""
        if self._iter is not None and self._iter.started:
            self._resume, self._iter = self._iter_resume(), None
        if self._resume is None:  # unpickled: the position travelled as plain states
            assert self._pickled_resume is not None
            self._resume = RawMixResume.load(self.raw, self._pickled_resume)
            self._pickled_resume = None
        return self._resume

    # -- state --------------------------------------------------------------------------------
    def state_dict(self) -> dict[str, Any]:
        """The position right after the last item this mixture yielded: plain built-ins, a
        ``shardstream.Mixture`` node holding each source's ``ParquetStream`` state
        (docs/state-format.md)."""
        if self._iter is not None and self._iter.started:
            return self._iter.state_dict()
        return self._start_point().state_dict(self.raw, self._layout())

    def load_state_dict(
        self, state_dict: Any, *, strict: bool = False, allow_changed_shards: bool = False
    ) -> None:
        """Continue after a saved position on the next ``iter(self)``.

        ``state_dict`` is one state from :meth:`state_dict` (same ranks and workers: the stream
        continues identically), or anything holding the states of every slot (a list of all
        ranks' states, a ``StatefulDataLoader.state_dict()``) to continue with another number
        of ranks or workers: each source's unread rows are split between the new slots exactly
        as a ``ParquetStream``'s are, and every new slot's mixer starts afresh where the old
        slots stood together.

        The mixture may differ from the one that saved the state: changed ``weights`` (or
        ``on_exhausted``/``max_epochs``), sources added (they start at their beginning) or
        removed (their position stays in the state and they continue from it if they come
        back). Sources are matched by name and each continues exactly where it was; the mixing
        targets rebase where the state stands. ``strict=True`` refuses any such change,
        naming it. ``allow_changed_shards`` is ``ParquetStream``'s, per source.

        Raises:
            StateError: malformed, of another mixture's settings, a source's state does not
                match its data (the message names the source), or (``strict``) a change.
        """
        located = _state.find_states(state_dict)
        if not located:
            raise StateError(
                f"no shardstream state found in the {type(state_dict).__name__} given "
                "(expected what Mixture.state_dict() returns, or a list or loader state holding it)"
            )
        # Another kind's state, named with where it is (a broken state, e.g. without its
        # format, is left to the core, which says what is wrong with it).
        kinds = (_core.STATE_FORMAT, _core.SAMPLER_FORMAT)
        others = [(w, s.get("format")) for w, s in located if s.get("format") in kinds]
        if others:
            where, fmt = others[0]
            raise StateError(
                f"the state given holds a {fmt} state{f' at {where}' if where else ''}, not a "
                f"{_core.MIXTURE_FORMAT} one: a Mixture loads what Mixture.state_dict() saved"
                + (f" ({len(others)} such states in all)" if len(others) > 1 else "")
            )
        self._note_origin()
        self._start_point()
        found = [s for _, s in located]
        self._resume = RawMixResume.load(self.raw, found, allow_changed_shards, strict)
        self._loaded = True
        self._loads += 1
        self._signals.moved()

    def source_stats(self) -> dict[str, dict[str, Any]]:
        """Per source, this process's view: ``items`` taken from it, its ``epoch`` and the
        ``rows`` it yielded in that epoch (its stream's position; after a resize, counted from
        the resize), the ``weight`` of the next item (normalized over the sources still in the
        mix), and ``active`` (still in the mix), as of the last item handed out (in row mode,
        the last row). In a DataLoader, each worker has its own (``items`` summed over workers
        is the total)."""
        if self._iter is not None and self._iter.started:
            it = self._iter
            stats = cast(RawMixStream, it._raw).source_stats(within=it._within())
        else:
            stats = RawMixStream(self.raw, self._start_point(), self._layout()).source_stats()
        return {
            n: {"items": s[0], "epoch": s[1], "rows": s[2], "weight": s[3], "active": s[4]}
            for n, s in zip(self.source_names, stats, strict=True)
        }

    def set_epoch(self, epoch: int) -> None:
        """For trainers that call ``set_epoch`` as every pass starts (accelerate's loaders, so
        the HF ``Trainer``): a mixture has no epochs of its own (each source runs through its
        own as it is mixed, and ``load_state_dict`` places it), so this does not move it. The
        pass it starts saves the epoch in its states, so that a state saved at the end of a pass
        (after its last item, or after the loop) and loaded before a later epoch's pass starts
        the mixture over there, as the uninterrupted loop did (torchdata's ``StatefulDataLoader``
        loads its state after the loop's ``set_epoch``); a state saved after the last item and
        loaded for its own epoch has nothing left in that pass. Persistent DataLoader workers
        see it when their next pass starts.

        Under an accelerate loader it checks the loader's settings on every process (a refused
        one raises on all of them, not only on process 0, which reads) and restarts DataLoader
        workers that accelerate's stateful loader started in ``prepare()``, before the mixture
        could see the loader: they would read one process's share instead of every row
        (``integrations/accelerate.before_epoch``, as for ``ParquetStream``).
        """
        _int(epoch, "epoch")
        _slots._accelerate.before_epoch(self, self._world_size)
        self._signals.set_epoch(epoch)  # persistent DataLoader workers see it at their iter()
        self._asked = epoch

    # -- iteration ----------------------------------------------------------------------------
    def _note_origin(self) -> None:
        if self._origin is None and self._signals.in_worker():
            self._origin = self._start_point()

    def __iter__(self) -> Iterator[Any]:
        self._note_origin()
        epoch = self._signals.new_epoch()  # a persistent worker's next pass
        if epoch is not None:
            self._asked = epoch
            if not self._loaded:
                # set_epoch() in the main process: this pass is the one a fresh worker would
                # read, from the start point the workers were made with (a mixture's set_epoch
                # does not move it, so a worker that left its last pass early would go on from
                # there, past the batches the loader had prefetched).
                assert self._origin is not None
                self._resume, self._iter = self._origin, None
        if replaces_unstarted_after_load(self):
            start = self._start_point()
            if start.pass_ended(self.raw, self._layout()):
                asked = self._asked
                fresh = RawMixResume.start(self.raw)
                self._resume = fresh.with_epoch(start.epoch if asked is None else asked)
                self._loaded = False
        self._start_point()
        conv: Any = PackConverter(self._output) if self._packed else _MixConverter(self, self.raw)
        self._iter = make_iterator(self, conv, self.batch_size is not None)
        self._iter.made = self._loads
        return self._iter

    def _open_stream(self) -> RawMixStream:
        self._signals.check_moved("Mixture")
        layout, start, loaded = self._layout(), self._start_point(), self._loaded
        asked, self._asked = self._asked, None
        if asked is not None:
            if (
                loaded
                and start.epoch is not None
                and asked > start.epoch
                and start.pass_ended(self.raw, layout)
            ):
                # torchdata's StatefulDataLoader loads its state inside iter(loader), after the
                # loop's set_epoch(): a state saved at the end of an earlier epoch's pass (after
                # its last item, or after the loop) then stands for the pass set_epoch asked
                # for, which starts the mixture over as the uninterrupted loop's did.
                start = RawMixResume.start(self.raw)
            self._resume = start = start.with_epoch(asked)
        raw = RawMixStream(self.raw, start, layout)
        self._loaded = False
        if start.at_start and not loaded:  # (a loaded source may rightly have no rows left)
            self._warn_barren(raw, layout)
        return raw

    def _warn_barren(self, raw: RawMixStream, layout: tuple[int, int, int, int]) -> None:
        """A ``UserWarning`` (once per source and process) for each source with weight but no
        rows in this slot at the start: it takes no part in this slot's mix, which is easily
        missed when a small source meets many ranks x workers."""
        rank, world, worker, workers = layout
        for i in raw.barren_sources():
            name = self.source_names[i]
            if name in self._warned:
                continue
            self._warned.add(name)
            rows = self._sources[name].catalog.num_rows
            slots, even = world * workers, self._args["even"]
            why = (
                f"its {rows} row{'' if rows == 1 else 's'} split over {slots} slots (rank "
                f"{rank} of {world}, worker {worker} of {workers}; even={even!r}) leave none "
                "here"
                if slots > 1
                else f"it has {rows} rows"
            )
            hint = "" if slots == 1 else " (give it more rows, or use fewer ranks or workers"
            hint += "" if slots == 1 else (", or even=None)" if even is not None else ")")
            warnings.warn(
                f"Mixture source {name!r} has no rows in this slot: {why}, so it takes no part "
                f"in this slot's mix and the other sources share its weight{hint}",
                UserWarning,
                stacklevel=3,
            )

    # -- pickling (spawn-started workers) -----------------------------------------------------
    def __getstate__(self) -> dict[str, Any]:
        d = self.__dict__.copy()
        it = self._iter
        start = self._iter_resume() if it is not None and it.started else self._start_point()
        d["_pickled_resume"] = start.states(self.raw)
        d["_raw"] = d["_resume"] = d["_iter"] = d["_origin"] = None
        d["_warned"] = set()  # another process (a worker: another slot) warns for itself
        d["_wrapped"] = self.__dict__.get("_wrapped") or _slots._accelerate.wrapper(self)
        return d

    def __setstate__(self, d: dict[str, Any]) -> None:
        self.__dict__.update(d)

    def __repr__(self) -> str:
        a = self._args
        return (
            f"Mixture({self.source_names}, mixing={a['mixing']!r}, batch_size={a['batch_size']}, "
            f"samples={a['samples']}, output={self._output!r})"
        )


_torch.register_as_iterable_dataset(Mixture)
