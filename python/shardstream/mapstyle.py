"""``ParquetRows``: the map-style dataset over Parquet shards (random access by row index).

``ParquetStream`` streams an epoch; ``ParquetRows`` is the same shard set as a table of rows
numbered ``0 .. len(ds) - 1`` in read order (shard by shard, sorted paths, row groups in file
order — the stream's global row ids), for a sampler to index: a true global shuffle
(:class:`~shardstream.ResumableSampler`), or any order a sampler makes.

Design decisions (the why; docs/guide.md has the what):

* The core does the reading (``rust/core/src/access/``): the rows of one call are grouped by
  row group, each row group touched is read once, selecting just those rows (with the page
  index only their pages are fetched and decompressed), and the result comes back as one Arrow
  batch in the requested order. A per-process cache of decoded pages (``page_cache_bytes``)
  makes orders that come back to the same pages cheap (the sampler's ``block_size`` order).
* Output types are ``ParquetStream``'s (``convert.py``): ``ds[i]`` is one row as the stream's
  row mode yields it; ``ds.__getitems__(indices)`` (what a ``DataLoader`` calls for a batch) is
  a :class:`Rows` sequence, which the default collate turns into tensors row by row, and
  :func:`collate` turns into the stream's batch-mode output in one step.
* Fork and spawn: the reader (and its cache) is made on first use in each process, so
  DataLoader workers never share one; pickling drops it and the catalog, which a spawned worker
  re-opens, checking the fingerprint.
* ``import torch`` is not needed here: a DataLoader takes any object with ``__len__`` and
  ``__getitem__`` as a map-style dataset.
"""

from __future__ import annotations

import operator
import os
import sys
from collections.abc import Iterator, Mapping, Sequence
from typing import Any

import pyarrow as pa

from . import _core
from ._core import RawCatalog, RawRows
from .convert import Converter, check_output
from .dataset import _sources, _storage_options
from .errors import StateError

__all__ = ["ParquetRows", "Rows", "collate"]

_DEFAULTS = _core.DEFAULTS


class Rows(Sequence):  # type: ignore[type-arg]
    """The rows at some indices, in that order: what :meth:`ParquetRows.__getitems__` returns.

    A sequence of rows (each what ``ds[i]`` returns), built only when first accessed, so
    ``torch.utils.data.default_collate`` works on it as on any list of rows; :func:`collate`
    instead returns :attr:`batch`, the rows as one batch in the dataset's output format (what
    ``ParquetStream`` yields in batch mode), without making a row. ``arrow`` is the
    ``pyarrow.RecordBatch`` itself. Pickles as a plain ``list`` of rows.
    """

    __slots__ = ("_conv", "_rows", "arrow")

    def __init__(self, arrow: pa.RecordBatch, conv: Converter) -> None:
        self.arrow = arrow
        self._conv = conv
        self._rows: list[Any] | None = None

    def __len__(self) -> int:
        return self.arrow.num_rows

    def _all(self) -> list[Any]:
        if self._rows is None:
            self._rows = list(self._conv.rows(self.arrow))
        return self._rows

    def __getitem__(self, i: Any) -> Any:
        return self._all()[i]

    def __iter__(self) -> Iterator[Any]:
        return iter(self._all())

    @property
    def batch(self) -> Any:
        """The rows as one batch, in the dataset's ``output`` and ``list_format``."""
        return self._conv.batch(self.arrow)

    def __reduce__(self) -> Any:
        return (list, (list(self._all()),))

    def __repr__(self) -> str:
        return f"Rows({self.arrow.num_rows} rows, columns={self.arrow.schema.names})"


def collate(batch: Any) -> Any:
    """A ``DataLoader`` ``collate_fn`` for :class:`ParquetRows`: the :class:`Rows` of one
    ``__getitems__`` call become one batch in the dataset's output format, exactly what
    ``ParquetStream(batch_size=...)`` yields (e.g. ``list<int>`` columns stay one tensor per
    row, or ``list_format``'s form); anything else goes to torch's ``default_collate``."""
    if isinstance(batch, Rows):
        return batch.batch
    from torch.utils.data import default_collate

    return default_collate(batch)


def _workers() -> int:
    torch = sys.modules.get("torch")
    info = torch.utils.data.get_worker_info() if torch is not None else None
    return info.num_workers if info is not None else 1


class ParquetRows:
    """Rows of Parquet shards by index: a map-style dataset (``len(ds)``, ``ds[i]``).

    Args:
        source: as for :class:`~shardstream.ParquetStream`: a file, a directory, a glob, an
            object-store URL, or a list of these. Rows are numbered in read order (sorted
            paths, row groups in file order), as the stream numbers them.
        columns: columns to read (in this order); ``None`` reads all.
        output, list_format: as for ``ParquetStream``: ``ds[i]`` is one row as its row mode
            yields it, :meth:`take` and :func:`collate` give a batch as its batch mode does.
        page_cache_bytes: budget of the per-process cache of decoded pages (each DataLoader
            worker has its own); ``0`` disables it. With the cache, a page is decoded whole
            once and later rows on it cost a copy; without it each call decodes just the rows
            it asks for (still reading whole pages). The cache pays off when reads come back to
            the same pages (``ResumableSampler(block_size=...)``, sequential reads) and costs
            extra decoding for a global shuffle over data much larger than it.
        threads: row groups one call reads at once (``None``: 8 for URL sources, else
            ``min(4, cores // DataLoader workers)``).
        storage_options: as for ``ParquetStream`` (URL sources).

    ``ds.__getitems__(indices)`` reads a whole batch in one call into the core (torch's
    DataLoader uses it when it exists); use ``collate_fn=shardstream.collate`` for batch
    output without per-row work. Indices may be negative (from the end); an index out of range
    is an ``IndexError``.

    Example:
        >>> import tempfile, shardstream.datagen as dg
        >>> d = tempfile.mkdtemp()
        >>> _ = dg.write_shards(d, num_shards=2, rows_per_shard=10)
        >>> ds = ParquetRows(d, columns=["id"], output="python")
        >>> len(ds), ds[13], ds[-1]
        (20, {'id': 13}, {'id': 19})
        >>> ds.take([3, 17, 3])
        {'id': [3, 17, 3]}
        >>> rows = ds.__getitems__([5, 0])
        >>> list(rows), collate(rows)
        ([{'id': 5}, {'id': 0}], {'id': [5, 0]})
    """

    @staticmethod
    def collate(batch: Any) -> Any:
        """The module's :func:`collate` (``collate_fn=ParquetRows.collate``)."""
        return collate(batch)

    def __init__(
        self,
        source: Any,
        *,
        columns: Sequence[str] | None = None,
        output: str = "torch",
        list_format: str = "split",
        page_cache_bytes: int = _DEFAULTS["page_cache_bytes"],
        threads: int | None = None,
        storage_options: Mapping[str, str] | None = None,
    ) -> None:
        check_output(output, list_format)  # imports nothing (torch only when iterated)
        self._sources = _sources(source)
        self._storage_options = _storage_options(storage_options)
        if isinstance(columns, str):
            columns = [columns]
        self._columns = None if columns is None else [str(c) for c in columns]
        self._output = output
        self._list_format = list_format
        self._page_cache_bytes = page_cache_bytes
        self._threads = threads
        self._catalog: RawCatalog | None = RawCatalog(
            self._sources, self._columns, self._storage_options
        )
        self._fingerprint: dict[str, Any] = self._catalog.fingerprint()
        self._len = int(self._catalog.num_rows)
        # Checks page_cache_bytes and threads now (naming them); the reader itself is made in
        # each process on first use.
        RawRows(self._catalog, page_cache_bytes, threads)
        self._reader: tuple[int, RawRows] | None = None
        self._conv: Converter | None = None

    # -- what it is ---------------------------------------------------------------------------
    @property
    def catalog(self) -> RawCatalog:
        if self._catalog is None:  # re-opened after unpickling in a spawned worker
            cat = RawCatalog(self._sources, self._columns, self._storage_options)
            if cat.fingerprint() != self._fingerprint:
                raise StateError(
                    "the shard set changed between creating the dataset and reading it "
                    f"(was {self._fingerprint}, now {cat.fingerprint()})"
                )
            self._catalog = cat
        return self._catalog

    def __len__(self) -> int:
        return self._len

    @property
    def num_rows(self) -> int:
        """Rows in the shard set (``len(ds)``)."""
        return self._len

    @property
    def shards(self) -> list[str]:
        """Absolute shard paths (or URLs) in read order."""
        return list(self.catalog.shard_paths)

    @property
    def schema(self) -> pa.Schema:
        """Schema of the output columns."""
        return self.catalog.schema

    def stats(self) -> dict[str, int]:
        """Object-store counters of this dataset in this process (see ``ParquetStream.stats``)."""
        return dict(self.catalog.stats())

    def cache_stats(self) -> dict[str, int]:
        """This process's page cache: ``hits``, ``misses`` (pages looked up), ``bytes`` and
        ``pages`` held, ``evictions``, and ``uncached`` (pages larger than the budget)."""
        return dict(self._raw().cache_stats())

    # -- reading ------------------------------------------------------------------------------
    def _raw(self) -> RawRows:
        pid = os.getpid()
        if self._reader is None or self._reader[0] != pid:
            raw = RawRows(self.catalog, self._page_cache_bytes, self._threads, _workers())
            self._reader = (pid, raw)
        return self._reader[1]

    @property
    def _converter(self) -> Converter:
        if self._conv is None:
            self._conv = Converter(self._output, self.catalog.schema, self._list_format)
        return self._conv

    def _index(self, i: Any) -> int:
        if isinstance(i, bool):
            raise TypeError(f"index must be an int, got bool {i!r}")
        try:
            k = operator.index(i)
        except TypeError:
            raise TypeError(f"index must be an int, got {type(i).__name__} {i!r}") from None
        n = self._len
        if not -n <= k < n:
            raise IndexError(f"index {k} is out of range for {n} rows")
        return k + n if k < 0 else k

    def _ids(self, indices: Any) -> list[int]:
        if hasattr(indices, "tolist") and not isinstance(indices, list):  # numpy, torch
            indices = indices.tolist()
        ids = indices if isinstance(indices, list) else list(indices)
        if not all(type(x) is int for x in ids):
            ids = [self._index(x) for x in ids]
        elif ids:
            n = self._len
            lo, hi = min(ids), max(ids)
            if lo < -n or hi >= n:
                bad = lo if lo < -n else hi
                raise IndexError(f"index {bad} is out of range for {n} rows")
            if lo < 0:
                ids = [x + n if x < 0 else x for x in ids]
        return ids

    def arrow(self, indices: Any) -> pa.RecordBatch:
        """The rows at ``indices`` (any order, repeats allowed) as one ``pyarrow.RecordBatch``."""
        return self._raw().take(self._ids(indices))

    def take(self, indices: Any) -> Any:
        """The rows at ``indices`` as one batch in the output format (``ParquetStream``'s batch
        mode): e.g. ``{"id": tensor([...]), "tokens": [tensor, ...]}`` for torch output."""
        return self._converter.batch(self.arrow(indices))

    def __getitems__(self, indices: Any) -> Rows:
        """The rows at ``indices``, read in one call: a :class:`Rows` sequence (see
        :func:`collate`)."""
        return Rows(self.arrow(indices), self._converter)

    def __getitem__(self, i: Any) -> Any:
        """``ds[i]``: one row (as ``ParquetStream`` yields rows). ``ds[indices]`` (a list,
        array or tensor of ints) and ``ds[a:b]`` return a batch, as :meth:`take` does."""
        if isinstance(i, slice):
            return self.take(list(range(*i.indices(self._len))))
        if not isinstance(i, (int, str, bytes)) and (
            isinstance(i, (list, tuple)) or getattr(i, "ndim", 0) >= 1
        ):
            return self.take(i)
        rb = self._raw().take([self._index(i)])
        return next(iter(self._converter.rows(rb)))

    # -- pickling (spawn-started workers) -----------------------------------------------------
    def __getstate__(self) -> dict[str, Any]:
        d = self.__dict__.copy()
        d["_catalog"] = d["_reader"] = d["_conv"] = None
        return d

    def __repr__(self) -> str:
        return (
            f"ParquetRows({len(self._sources)} source(s), {self._len} rows, "
            f"columns={self._columns}, output={self._output!r})"
        )
