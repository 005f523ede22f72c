"""Deterministic synthetic Parquet shards for tests, the demo and the benches.

Only needs pyarrow and numpy; everything is vectorised so a few million rows are
written in seconds.

Every row is a pure function of its ``id``, so tests can check content without
keeping the data around::

    >>> import tempfile
    >>> from shardstream import datagen
    >>> d = tempfile.mkdtemp()
    >>> paths = datagen.write_shards(d, num_shards=2, rows_per_shard=[3, 2], row_group_size=2)
    >>> [p.rsplit("/", 1)[-1] for p in paths]
    ['shard-00000.parquet', 'shard-00001.parquet']
    >>> import pyarrow.parquet as pq
    >>> pq.read_table(paths[1]).column("id").to_pylist()
    [3, 4]
    >>> datagen.expected_text(4), datagen.expected_tokens(4, tokens_len=(2, 3))
    ('row-4', [4, 5])

Columns (in this file order):

* ``id``     int64, ``start_id ..`` consecutive across shards in file order.
* ``tokens`` list<int32>, ``expected_tokens(id, tokens_len)``:
  length ``lo + h(id) % (hi - lo)`` (half-open ``[lo, hi)`` like ``range``; ``lo == hi``
  means every row has exactly ``lo`` tokens), values ``[id % 1000 + k for k in range(len)]``.
* ``text``   string, ``expected_text(id) == f"row-{id}"``.
* ``label``  int32 nullable, ``expected_label(id, nulls)``: ``id % 100``, None when
  ``nulls`` and ``id % 7 == 0``.
* ``cat``    string with few distinct values (``expected_cat(id)``); an Arrow
  ``dictionary<int32, string>`` column when ``dictionary=True``, a plain string column
  (and no dictionary encoding for any column) otherwise.
"""

from __future__ import annotations

import os
from collections.abc import Callable, Sequence

import numpy as np
import pyarrow as pa
import pyarrow.compute as pc
import pyarrow.parquet as pq

__all__ = [
    "CATS",
    "COLUMNS",
    "expected_cat",
    "expected_label",
    "expected_row",
    "expected_text",
    "expected_tokens",
    "make_table",
    "schema",
    "shard_name",
    "write_shards",
]

CATS = ("alpha", "beta", "gamma", "delta", "epsilon")
COLUMNS = ("id", "tokens", "text", "label", "cat")
_MIX = np.uint64(0x9E3779B97F4A7C15)


def _tokens_len(tokens_len: Sequence[int]) -> tuple[int, int]:
    lo, hi = int(tokens_len[0]), int(tokens_len[1])
    if lo < 0 or hi < lo:
        raise ValueError(f"tokens_len must be (lo, hi) with 0 <= lo <= hi, got {tokens_len!r}")
    return lo, hi


def _lengths(ids: np.ndarray, tokens_len: Sequence[int]) -> np.ndarray:
    lo, hi = _tokens_len(tokens_len)
    if hi == lo:
        return np.full(len(ids), lo, dtype=np.int64)
    h = (ids.astype(np.uint64) * _MIX) >> np.uint64(33)
    return (lo + (h % np.uint64(hi - lo))).astype(np.int64)


def expected_tokens(id: int, tokens_len: Sequence[int] = (0, 16)) -> list[int]:
    """The ``tokens`` value of row ``id`` (as written with the same ``tokens_len``)."""
    n = int(_lengths(np.array([id], dtype=np.int64), tokens_len)[0])
    return [id % 1000 + k for k in range(n)]


def expected_text(id: int) -> str:
    """The ``text`` value of row ``id``."""
    return f"row-{id}"


def expected_label(id: int, nulls: bool = True) -> int | None:
    """The ``label`` value of row ``id`` (None every 7th id when ``nulls``)."""
    if nulls and id % 7 == 0:
        return None
    return id % 100


def expected_cat(id: int) -> str:
    """The ``cat`` value of row ``id``."""
    return CATS[id % len(CATS)]


def expected_row(id: int, tokens_len: Sequence[int] = (0, 16), nulls: bool = True) -> dict:
    """The whole row ``id`` as python values (what ``output="python"`` should yield)."""
    return {
        "id": id,
        "tokens": expected_tokens(id, tokens_len),
        "text": expected_text(id),
        "label": expected_label(id, nulls),
        "cat": expected_cat(id),
    }


def schema(dictionary: bool = True) -> pa.Schema:
    return pa.schema(
        [
            pa.field("id", pa.int64(), nullable=False),
            pa.field("tokens", pa.list_(pa.int32())),
            pa.field("text", pa.string()),
            pa.field("label", pa.int32(), nullable=True),
            pa.field("cat", pa.dictionary(pa.int32(), pa.string()) if dictionary else pa.string()),
        ]
    )


def make_table(
    start: int,
    n: int,
    *,
    tokens_len: Sequence[int] = (0, 16),
    nulls: bool = True,
    dictionary: bool = True,
) -> pa.Table:
    """Rows ``start .. start+n-1`` as a pyarrow Table (vectorised)."""
    ids = np.arange(start, start + n, dtype=np.int64)
    lengths = _lengths(ids, tokens_len)
    offsets = np.zeros(n + 1, dtype=np.int64)
    np.cumsum(lengths, out=offsets[1:])
    total = int(offsets[-1])
    if total >= 2**31:
        raise ValueError("too many tokens for one list<int32> chunk; write smaller shards")
    base = np.repeat(ids % 1000, lengths)
    within = np.arange(total, dtype=np.int64) - np.repeat(offsets[:-1], lengths)
    values = (base + within).astype(np.int32)
    tokens = pa.ListArray.from_arrays(pa.array(offsets.astype(np.int32)), pa.array(values))

    id_arr = pa.array(ids, type=pa.int64())
    text = pc.binary_join_element_wise(pa.scalar("row-"), pc.cast(id_arr, pa.string()), "")
    mask = (ids % 7 == 0) if nulls else np.zeros(n, dtype=bool)
    label = pa.array((ids % 100).astype(np.int32), type=pa.int32(), mask=mask)
    cat_idx = (ids % len(CATS)).astype(np.int32)
    cat_dict = pa.DictionaryArray.from_arrays(pa.array(cat_idx), pa.array(list(CATS)))
    cat = cat_dict if dictionary else cat_dict.dictionary_decode()
    return pa.Table.from_arrays(
        [id_arr, tokens, text.cast(pa.string()), label, cat], schema=schema(dictionary)
    )


def shard_name(prefix: str, i: int) -> str:
    return f"{prefix}-{i:05d}.parquet"


def _uneven_sizes(rows: int, rng: np.random.Generator) -> list[int]:
    if rows == 0:
        return []
    avg = max(1, min(rows // 4, 65536))
    sizes: list[int] = []
    left = rows
    while left > 0:
        s = int(rng.integers(1, 2 * avg + 1))
        s = min(s, left)
        sizes.append(s)
        left -= s
    return sizes


def write_shards(
    out_dir: str | os.PathLike,
    *,
    num_shards: int = 4,
    rows_per_shard: int | Sequence[int] = 1000,
    row_group_size: int | Sequence[Sequence[int]] | None = None,
    page_index: bool = True,
    compression: str | None = "zstd",
    tokens_len: Sequence[int] = (0, 16),
    nulls: bool = True,
    dictionary: bool = True,
    seed: int = 0,
    start_id: int = 0,
    prefix: str = "shard",
    progress: Callable[[int], None] | None = None,
) -> list[str]:
    """Write ``{prefix}-{i:05d}.parquet`` shards into ``out_dir``; return their paths.

    * ``rows_per_shard``: int, or one int per shard (then ``num_shards`` is ``len`` of it);
      0 gives a valid Parquet file with the schema and no row groups.
    * ``row_group_size``: None -> uneven row groups drawn (deterministically from ``seed``)
      between 1 and 2*avg rows; int -> fixed size; list[list[int]] -> the exact row-group
      sizes of each shard (then ``num_shards`` and ``rows_per_shard`` come from it; a 0 in
      the list writes a zero-row row group).
    * ``page_index``: write the Parquet page index (column/offset index) or not.
    * ``progress``: called with the number of rows after each row group is written
      (e.g. ``shardstream.cli._progress.Progress.update``).
    """
    os.makedirs(out_dir, exist_ok=True)
    if row_group_size is not None and not isinstance(row_group_size, int):
        layout = [[int(s) for s in shard] for shard in row_group_size]
        if any(s < 0 for shard in layout for s in shard):
            raise ValueError("row-group sizes must be >= 0")
        rows = [sum(shard) for shard in layout]
    else:
        if isinstance(rows_per_shard, int):
            rows = [int(rows_per_shard)] * int(num_shards)
        else:
            rows = [int(r) for r in rows_per_shard]
        if any(r < 0 for r in rows):
            raise ValueError("rows_per_shard must be >= 0")
        if row_group_size is None:
            rng = np.random.default_rng(seed)
            layout = [_uneven_sizes(r, rng) for r in rows]
        else:
            if row_group_size <= 0:
                raise ValueError("row_group_size must be > 0")
            layout = [
                [row_group_size] * (r // row_group_size)
                + ([r % row_group_size] if r % row_group_size else [])
                for r in rows
            ]

    sch = schema(dictionary)
    paths = []
    next_id = start_id
    for i, sizes in enumerate(layout):
        path = os.path.join(os.fspath(out_dir), shard_name(prefix, i))
        with pq.ParquetWriter(
            path,
            sch,
            compression=compression if compression is not None else "none",
            use_dictionary=dictionary,
            write_page_index=page_index,
        ) as w:
            for s in sizes:
                t = make_table(
                    next_id, s, tokens_len=tokens_len, nulls=nulls, dictionary=dictionary
                )
                w.write_table(t, row_group_size=max(s, 1))
                next_id += s
                if progress is not None:
                    progress(s)
        paths.append(os.path.abspath(path))
    return paths
