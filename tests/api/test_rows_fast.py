"""Python output (row mode and batches) is exactly ``to_pylist()``: shardstream/_rows.py.

``_rows`` turns numbers and ``list<number>`` columns into Python values through numpy instead of
pyarrow (and lazily, row by row); every other type goes through ``to_pylist()``. "Exactly" here
is stricter than ``==``: ``1``, ``1.0`` and ``True`` differ, NaN equals only NaN, ``None`` is
``None``; see :func:`same` (and its own test). Checked on every column of the reliability corpus
(whole, sliced, and end to end through ``ParquetStream``) and on random arrays (hypothesis) with
nulls at list and element level, empty lists, ``large_list``, sliced arrays and sliced children.
"""

from __future__ import annotations

import math
import os
import subprocess
import sys
from typing import Any

import numpy as np
import pyarrow as pa
import pyarrow.parquet as pq
import pytest
from hypothesis import given
from hypothesis import strategies as st
from reliability.scripts import corpus
from shardstream import ParquetStream, _rows, datagen

CASES = corpus.cases()
NAMES = [c.name for c in CASES]


def same(a: Any, b: Any) -> bool:
    """Equal values of identical Python types, recursively (NaN equals NaN)."""
    if type(a) is not type(b):
        return False
    if isinstance(a, float) and math.isnan(a):
        return math.isnan(b)
    if isinstance(a, (list, tuple)):
        return len(a) == len(b) and all(same(x, y) for x, y in zip(a, b, strict=True))
    if isinstance(a, dict):
        return list(a) == list(b) and all(same(a[k], b[k]) for k in a)
    return bool(a == b)


def assert_same(got: list, want: list, what: str = "") -> None:
    assert len(got) == len(want), f"{what}: {len(got)} values, expected {len(want)}"
    for i, (x, y) in enumerate(zip(got, want, strict=True)):
        assert same(x, y), f"{what}: row {i}: got {str(x)[:300]!r}, expected {str(y)[:300]!r}"


def fast(arr: pa.Array) -> list:
    return list(_rows.column_values(arr))


def test_same_is_strict():
    assert same([1, None, [2.5, float("nan")]], [1, None, [2.5, float("nan")]])
    assert same({"a": [True]}, {"a": [True]})
    for a, b in [
        (1, 1.0),
        (1, True),
        (0, None),
        ([1], (1,)),
        ([1, 2], [1, 2, 3]),
        ([[1]], [[1.0]]),
        ({"a": 1, "b": 2}, {"b": 2, "a": 1}),
        (float("nan"), 0.0),
        (b"x", "x"),
    ]:
        assert not same(a, b), (a, b)


# ----------------------------------------------------------------------------- the corpus


@pytest.fixture(scope="module")
def corpus_files(tmp_path_factory) -> dict[str, str]:
    return corpus.build_corpus(str(tmp_path_factory.mktemp("corpus")))


def _windows(n: int) -> list[tuple[int, int]]:
    """(offset, length) slices: whole, from 1, inside, empty, the last row."""
    return [(0, n), (1, max(0, n - 1)), (n // 3, n // 3 + 1), (n // 2, 0), (max(0, n - 1), 1)]


@pytest.mark.parametrize("name", NAMES)
def test_corpus_columns_equal_to_pylist(corpus_files, name):
    """Every column pyarrow reads from every corpus file, whole and sliced, and its rows."""
    table = pq.read_table(corpus_files[name])
    empty = pa.RecordBatch.from_pylist([], schema=table.schema)
    for batch in table.to_batches(max_chunksize=97) or [empty]:
        for off, length in _windows(batch.num_rows):
            b = batch.slice(off, length)
            for f, col in zip(b.schema, b.columns, strict=True):
                assert_same(fast(col), col.to_pylist(), f"{name}.{f.name}[{off}:+{length}]")
            rows = list(_rows.rows(b.schema.names, b.columns))
            assert_same(rows, b.to_pylist(), f"{name} rows [{off}:+{length}]")


@pytest.mark.parametrize("name", NAMES)
def test_corpus_through_parquetstream(corpus_files, name):
    """End to end over arrow-rs arrays: row mode and python batches equal the arrow batches'
    ``to_pylist()`` (types included; the corpus test compares values only)."""
    path = corpus_files[name]
    batches = list(ParquetStream(path, batch_size=13, output="arrow", read_batch_rows=7))
    want = [r for b in batches for r in b.to_pylist()]
    rows = list(ParquetStream(path, batch_size=None, output="python", read_batch_rows=7))
    assert_same(rows, want, f"{name} row mode")
    py = list(ParquetStream(path, batch_size=13, output="python", read_batch_rows=7))
    assert len(py) == len(batches)
    for i, (got, b) in enumerate(zip(py, batches, strict=True)):
        assert list(got) == b.schema.names
        for n in b.schema.names:
            assert_same(got[n], b.column(n).to_pylist(), f"{name} batch {i} column {n}")


# ----------------------------------------------------------------------------- random arrays

INT_TYPES = [pa.int8(), pa.int16(), pa.int32(), pa.int64()]
INT_TYPES += [pa.uint8(), pa.uint16(), pa.uint32(), pa.uint64()]
FAST_TYPES = [*INT_TYPES, pa.float32(), pa.float64(), pa.bool_()]


def _values(t: pa.DataType) -> st.SearchStrategy:
    if pa.types.is_boolean(t):
        return st.booleans()
    if pa.types.is_floating(t):
        return st.floats(width=32 if t == pa.float32() else 64, allow_nan=True)
    info = np.iinfo(t.to_pandas_dtype())
    return st.integers(int(info.min), int(info.max))


@st.composite
def flat_arrays(draw: st.DrawFn) -> pa.Array:
    t = draw(st.sampled_from([*FAST_TYPES, pa.float16(), pa.string()]))
    if t == pa.float16():
        vals = st.floats(width=16)
    elif t == pa.string():
        vals = st.text(max_size=5)
    else:
        vals = _values(t)
    items = draw(st.lists(st.none() | vals if draw(st.booleans()) else vals, max_size=40))
    arr = pa.array(items, t)
    return _maybe_slice(draw, arr)


def _maybe_slice(draw: st.DrawFn, arr: pa.Array) -> pa.Array:
    off = draw(st.integers(0, len(arr)))
    length = draw(st.integers(0, len(arr) - off))
    return arr.slice(off, length) if draw(st.booleans()) else arr


@st.composite
def list_arrays(draw: st.DrawFn) -> pa.Array:
    """list / large_list of a number type: null rows, null elements, empty lists, sliced array,
    sliced child, and null rows backed by non-empty segments (allowed by the Arrow format)."""
    vt = draw(st.sampled_from(FAST_TYPES))
    large = draw(st.booleans())
    vals = _values(vt)
    if draw(st.booleans()):
        vals = st.none() | vals
    rows = draw(st.lists(st.lists(vals, max_size=6), max_size=25))
    lens = [len(r) for r in rows]
    head = draw(st.integers(0, 3))  # the child starts with values no row uses
    flat = [draw(_values(vt)) for _ in range(head)] + [x for r in rows for x in r]
    child = pa.array(flat, vt).slice(head)
    offsets = np.concatenate([[0], np.cumsum(lens, dtype=np.int64)]).astype(
        np.int64 if large else np.int32
    )
    null_rows = draw(st.lists(st.booleans(), min_size=len(rows), max_size=len(rows)))
    mask = pa.array(null_rows, pa.bool_()) if any(null_rows) else None
    cls = pa.LargeListArray if large else pa.ListArray
    arr = cls.from_arrays(pa.array(offsets), child, mask=mask)
    assert arr.type == (pa.large_list(vt) if large else pa.list_(vt))
    return _maybe_slice(draw, arr)


@given(flat_arrays())
def test_flat_columns_equal_to_pylist(arr):
    assert_same(fast(arr), arr.to_pylist(), str(arr.type))


@given(list_arrays())
def test_list_columns_equal_to_pylist(arr):
    assert_same(fast(arr), arr.to_pylist(), str(arr.type))


@given(list_arrays(), flat_arrays(), st.data())
def test_rows_equal_table_to_pylist(lists, flat, data):
    n = min(len(lists), len(flat))
    off = data.draw(st.integers(0, n))
    cols = [lists.slice(0, n), flat.slice(0, n), pa.array(range(n), pa.int64())]
    batch = pa.RecordBatch.from_arrays(cols, names=["tokens", "x", "id"]).slice(off)
    want = pa.Table.from_batches([batch]).to_pylist()
    assert_same(list(_rows.rows(batch.schema.names, batch.columns)), want, "rows")


def test_edge_lists_by_hand():
    """The cases hypothesis should find, pinned: all-null rows over non-empty segments, empty
    arrays, empty child, element nulls only, extreme values, -0.0 and NaN."""
    child = pa.array([7, 8, 9, 10], pa.int64())
    arr = pa.ListArray.from_arrays(
        pa.array([0, 2, 4, 4], pa.int32()), child, mask=pa.array([False, True, False])
    )
    assert_same(fast(arr), [[7, 8], None, []])
    assert_same(fast(arr.slice(1)), [None, []])
    assert_same(fast(arr.slice(3)), [])
    assert_same(fast(pa.array([], pa.large_list(pa.int8()))), [])
    assert_same(fast(pa.array([[], [], None], pa.list_(pa.float32()))), [[], [], None])
    assert_same(fast(pa.array([[1, None], [None]], pa.list_(pa.int16()))), [[1, None], [None]])
    big = [[2**64 - 1, 0], [2**63]]
    assert_same(fast(pa.array(big, pa.large_list(pa.uint64()))), big)
    f = fast(pa.array([[-0.0, float("nan"), 1e-45]], pa.list_(pa.float32())))
    assert math.copysign(1, f[0][0]) == -1 and math.isnan(f[0][1]) and f[0][2] > 0
    assert_same(
        fast(pa.array([[True, False, True]] * 3, pa.list_(pa.bool_())).slice(1)),
        [[True, False, True]] * 2,
    )
    bools = pa.array([True, False] * 9, pa.bool_()).slice(3, 11)
    assert_same(fast(bools), bools.to_pylist())


def test_shared_small_ints(monkeypatch):
    """Non-negative ids below the limit come from the shared int table (grown on demand), all
    others are made by numpy; both equal ``to_pylist()``, and the table is really used."""
    monkeypatch.setattr(_rows, "_shared_ints", np.zeros(0, dtype=object))
    limit = _rows._SHARED_INTS_MAX
    cases = [
        ([[0], [5, 300]], pa.int32(), 512),
        ([[70_000, 1], []], pa.int64(), 1 << 17),  # grows the table
        ([[3]], pa.uint8(), 1 << 17),  # smaller ids: the table is kept
        ([[limit - 1, 0]], pa.uint32(), limit),
        ([[limit, 0]], pa.int64(), limit),  # over the limit: not shared, table unchanged
        ([[-1, 3]], pa.int16(), limit),
        ([[2**63 - 1]], pa.int64(), limit),
    ]
    for rows, t, table_len in cases:
        for typ in (pa.list_(t), pa.large_list(t)):
            arr = pa.array(rows, typ)
            assert_same(fast(arr), arr.to_pylist(), str(typ))
        assert len(_rows._shared_ints) == table_len, (rows, t)
    got = fast(pa.array([[1000, 1000], [1000]], pa.list_(pa.int32())))
    assert got[0][0] is got[1][0] is _rows._shared_ints[1000]  # shared, not made per row


def test_rows_duplicate_and_many_names():
    """Row dicts are built by generated code per column count: duplicate names keep the last
    value like ``to_pylist()``; 300 columns work."""
    dup = pa.RecordBatch.from_arrays([pa.array([1, 2]), pa.array(["a", "b"])], names=["x", "x"])
    assert_same(list(_rows.rows(dup.schema.names, dup.columns)), dup.to_pylist())
    names = [f"c{i}" for i in range(300)][::-1]
    wide = pa.RecordBatch.from_arrays([pa.array([i, -i]) for i in range(300)], names=names)
    got = list(_rows.rows(wide.schema.names, wide.columns))
    assert_same(got, wide.to_pylist())
    assert list(got[0]) == names


def test_row_mode_does_not_import_pandas(tmp_path):
    """numpy comes from the Arrow buffers: ``Array.to_numpy()`` would import pandas (when
    installed), ~0.3 s before the first row."""
    datagen.write_shards(tmp_path, num_shards=1, rows_per_shard=50, tokens_len=(0, 5), seed=1)
    code = (
        "import sys; from shardstream import ParquetStream; "
        f"rows = list(ParquetStream({str(tmp_path)!r}, batch_size=None, output='python')); "
        "assert len(rows) == 50 and isinstance(rows[0]['tokens'], list); "
        "print('pandas' in sys.modules)"
    )
    env = {**os.environ, "PYTHONPATH": os.pathsep.join(sys.path)}
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, env=env)
    assert out.returncode == 0, out.stderr
    assert out.stdout.strip() == "False"
