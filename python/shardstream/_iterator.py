"""One pass over a ``ParquetStream``: the object that owns the position while it is iterated.

The core's ``RawStream`` holds the position; it is made at the first ``next()``, not by
``iter()``: torchdata's ``StatefulDataLoader.state_dict()`` creates the iterator early, and a
trainer (accelerate) then calls ``set_epoch()`` before using it, so an iterator that has not
started follows ``set_epoch``/``load_state_dict`` (one that has started goes stale). This object
only converts what the stream returns and, in
row mode, hands the rows of a chunk out one at a time, remembering how many it handed out so a
``state_dict()`` between two rows is the position after exactly those rows (the core computes
it on row ids). Only the dataset's newest iterator owns the position: an older one refuses to
go on rather than yield rows the dataset's state would not account for.

Batch mode's ``__next__`` is ``_core.RawIter``'s (Rust): a batch costs no Python frame (with
``output="arrow"`` nothing runs in Python per batch). It does what ``RowIterator.__next__``
does per chunk: refuse once stale, make the stream on first use, convert.
"""

from __future__ import annotations

from collections.abc import Iterator
from typing import TYPE_CHECKING, Any

from ._core import RawIter, RawResume
from .convert import Converter

if TYPE_CHECKING:
    from .dataset import ParquetStream

_END = object()


class StreamIterator(RawIter):
    """Iterator returned by ``iter(ParquetStream(...))`` in batch mode (``RawIter`` holds the
    owner, the stream once made as ``_raw``, ``started`` and ``ended``)."""

    def __init__(self, owner: ParquetStream, conv: Converter, batched: bool):
        # (RawIter.__new__ took the same arguments)
        self._owner = owner
        self._conv = conv
        self._rows: Iterator[Any] | None = None  # row mode: the last chunk's rows not handed out
        self.made = 0  # the owner's load_state_dict() calls before it was made
        self._chunk_rows = 0
        self._handed = 0

    def _within(self) -> int | None:
        """Row mode, mid-chunk: rows of the last chunk handed out (``None``: all or none)."""
        if self._rows is None or self._handed >= self._chunk_rows:
            return None
        return self._handed

    def state_dict(self) -> dict[str, Any]:
        return self._raw.state_dict(within=self._within())

    def skip(self, n: int) -> None:
        # Mid-chunk, the core goes back to the last row handed out; the rest of it is dropped.
        self._raw.skip(n, within=self._within())
        self._rows = None

    def resume_point(self) -> RawResume:
        """Where a new iterator continues: here, or the start of the pass once this one ended
        (only called on an iterator that has started)."""
        return self._raw.resume_point(within=self._within())

    def replay(self, records: Any = None, states: Any = None) -> None:
        self._raw.add_replay(records=records, states=states)


class RowIterator(StreamIterator):
    """Iterator returned by ``iter(ParquetStream(...))`` in row mode."""

    def __next__(self) -> Any:
        if self.ended:
            raise StopIteration
        if self._owner._iter is not self:
            self.ended = True  # like a generator that raised: finished from now on
            raise RuntimeError(
                f"this iterator is stale: the same {type(self._owner).__name__} has been "
                "iterated again or given another position (iter(), load_state_dict(), "
                "set_epoch(), skip()) since it was made, and only the newest iterator owns the "
                "dataset's position"
            )
        while True:
            if self._rows is not None:
                row = next(self._rows, _END)
                if row is not _END:
                    self._handed += 1
                    return row
                self._rows = None
            rb = self._raw.next_item()
            if rb is None:
                self.ended = True
                raise StopIteration
            self._rows = iter(self._conv.rows(rb))
            self._chunk_rows, self._handed = rb.num_rows, 0


def replaces_unstarted_after_load(dataset: Any) -> bool:
    """True when ``iter(dataset)`` replaces an iterator that was made after the last
    ``load_state_dict()`` and never started, with that loaded position still the start point.

    That is what torchdata's ``StatefulDataLoader`` does with a state saved after its loop
    ended (``_iterator_finished``): ``iter(loader)`` makes an iterator, loads the state into
    the dataset, then drops that iterator for a fresh one and expects a new pass from it. With
    workers the new pass comes from copies of the dataset that never loaded the state; with 0
    workers it is this object, loaded at the end of its pass, which would yield nothing (under
    Lightning, whose checkpoint at an epoch's last step is such a state, an epoch lost). The
    dataset then starts a new pass when its loaded position has ended, as with workers.
    """
    it = dataset._iter
    return it is not None and not it.started and dataset._loaded and it.made == dataset._loads


def make_iterator(owner: Any, conv: Any, batched: bool) -> StreamIterator:
    """The iterator of one pass: batch mode's ``__next__`` in Rust, row mode's here."""
    return StreamIterator(owner, conv, batched) if batched else RowIterator(owner, conv, batched)
