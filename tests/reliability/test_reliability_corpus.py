"""Reliability 1: an edge-case Parquet corpus read back exactly, and resumed exactly.

The corpus (tests/reliability/scripts/corpus.py) covers every encoding pyarrow writes (PLAIN,
RLE_DICTIONARY with dictionary->plain fallback, DELTA_BINARY_PACKED, DELTA_LENGTH_BYTE_ARRAY,
DELTA_BYTE_ARRAY, BYTE_STREAM_SPLIT, RLE booleans), every compression (none, snappy, gzip,
brotli, lz4, zstd), data pages v1 and v2, flat / nested / nullable / required types (list,
large_list, fixed_size_list, list<list>, list<struct>, struct<list, struct>, map, dictionary
columns, large_string/large_binary, string_view/binary_view, decimal 32..256, dates, times,
timestamps with and without zone, INT96, duration, fixed_size_binary, uuid/json extension
types, float16, the null type), tiny pages and row groups, zero-row row groups, empty files,
files without statistics, page index, or stored Arrow schema, and page checksums.

For every file: the full content read through ``ParquetStream`` equals
``pyarrow.parquet.read_table`` of the same file (``output="arrow"`` batches and
``output="python"`` rows), and a resume from many row positions (state after k rows ->
fresh ``ParquetStream.load_state_dict`` -> the rest) gives exactly the expected tail, in shard
order and through a shuffle buffer. ``output="numpy"``/``"torch"`` must read every file too.
"""

from __future__ import annotations

import copy
from typing import Any

import pyarrow as pa
import pyarrow.parquet as pq
import pytest
from harness import pickle_roundtrip, torch_roundtrip
from reliability.scripts import corpus
from reliability.scripts.corpus import _plain, allowed_type_difference, canon, reference
from shardstream import ParquetStream

pytestmark = pytest.mark.timeout(300)

CASES = corpus.cases()
NAMES = [c.name for c in CASES]


@pytest.fixture(scope="module")
def corpus_files(tmp_path_factory) -> dict[str, str]:
    return corpus.build_corpus(str(tmp_path_factory.mktemp("corpus")))


def rows_of(table_or_batches: Any) -> list[dict[str, Any]]:
    return [canon(r) for r in table_or_batches.to_pylist()]


def _first_diff(a: list, b: list) -> str:
    for i, (x, y) in enumerate(zip(a, b, strict=False)):
        if x != y:
            return f"first difference at row {i}: got {str(x)[:300]} expected {str(y)[:300]}"
    return f"lengths differ: got {len(a)} rows, expected {len(b)}"


# ----------------------------------------------------------------------------- the corpus


def test_corpus_is_what_it_claims(corpus_files):
    """Every case was written, and the encodings / compressions really are in the files."""
    assert len(corpus_files) == len(CASES) >= 60
    for enc, cols in corpus.ENC_COLUMNS.items():
        if cols is None:
            continue
        for v in ("1", "2"):
            md = pq.ParquetFile(corpus_files[f"enc-{enc.lower()}-v{v}"]).metadata
            rg = md.row_group(0)
            names = {
                rg.column(i).path_in_schema: rg.column(i).encodings for i in range(rg.num_columns)
            }
            for c in cols:
                assert enc in names[c], f"{enc}: column {c} has encodings {names[c]}"
    for comp in corpus.COMPRESSIONS:
        md = pq.ParquetFile(corpus_files[f"comp-{comp}-v1"]).metadata
        want = {"none": {"UNCOMPRESSED"}, "lz4": {"LZ4", "LZ4_RAW"}}.get(comp, {comp.upper()})
        assert md.row_group(0).column(0).compression in want
    zero = pq.ParquetFile(corpus_files["zero-row-groups"]).metadata
    sizes = [zero.row_group(i).num_rows for i in range(zero.num_row_groups)]
    assert 0 in sizes and sum(sizes) == corpus.N, sizes
    assert pq.ParquetFile(corpus_files["empty-schema-only"]).metadata.num_row_groups == 0
    assert (
        not pq.ParquetFile(corpus_files["no-stats-no-page-index"])
        .metadata.row_group(0)
        .column(0)
        .is_stats_set
    )


@pytest.mark.parametrize("name", NAMES)
def test_full_read_arrow(corpus_files, name):
    path = corpus_files[name]
    ds = ParquetStream(path, batch_size=13, output="arrow")
    batches = list(ds)
    assert all(b.num_rows == 13 for b in batches[:-1])
    got = pa.Table.from_batches(batches, schema=ds.schema)
    ref = pq.read_table(path)
    assert ds.schema.names == ref.schema.names
    assert ds.num_rows == got.num_rows == ref.num_rows
    for f in ds.schema:
        assert allowed_type_difference(f.type, ref.schema.field(f.name).type), (
            f"{name}: column {f.name!r}: shardstream {f.type} vs pyarrow "
            f"{ref.schema.field(f.name).type}"
        )
    want = reference(path, ds.schema)
    for f in ds.schema:
        a = _plain(got.column(f.name))
        b = want.column(f.name).combine_chunks()
        if a.type != b.type:
            a = a.cast(b.type)
        ga, gb = [canon(x) for x in a.to_pylist()], [canon(x) for x in b.to_pylist()]
        assert ga == gb, f"{name}: column {f.name!r}: " + _first_diff(ga, gb)


def _row_mode(path: str, **kw) -> ParquetStream:
    return ParquetStream(path, output="python", **kw)


def _plain_rows(ds: ParquetStream) -> list[dict[str, Any]]:
    """Row-mode Python values, with dictionary values decoded (Python output already is)."""
    return [canon(r) for r in ds]


@pytest.mark.parametrize("name", NAMES)
def test_full_read_python_rows(corpus_files, name):
    path = corpus_files[name]
    ds = _row_mode(path, read_batch_rows=5, readahead_threads=2)
    got = _plain_rows(ds)
    want = rows_of(reference(path, ds.schema))
    assert got == want, f"{name}: " + _first_diff(got, want)


def resume_points(n: int, full: bool) -> list[int]:
    """Row positions to resume from: start, inside the first pages, around the first
    row-group boundaries (97 rows in TINY), the middle, the end (and a sample if not full)."""
    rg = corpus.TINY["row_group_size"]
    if full:
        pts = {0, 1, 2, 3, 7, 8, 13, n // 3, rg - 1, rg, rg + 1, 2 * rg, n // 2, n - 2, n - 1, n}
    else:
        pts = {0, 5, rg, n // 2 + 1, n - 1, n}
    return sorted(p for p in pts if 0 <= p <= n)


def _states_after(ds: ParquetStream, points: list[int]) -> tuple[list, dict[int, Any]]:
    want = set(points)
    states: dict[int, Any] = {}
    rows: list = []
    if 0 in want:
        states[0] = copy.deepcopy(ds.state_dict())
    for r in ds:
        rows.append(canon(r))
        if len(rows) in want:
            states[len(rows)] = copy.deepcopy(ds.state_dict())
    return rows, states


RESUME_SETTINGS = {
    "sequential": dict(read_batch_rows=5),
    "sequential-noreadahead": dict(read_batch_rows=64, readahead_threads=0),
    "shuffled-2-epochs": dict(shuffle_buffer=16, seed=7, epochs=2, read_batch_rows=3),
}
FULL_POINTS = {"sequential": True, "sequential-noreadahead": False, "shuffled-2-epochs": False}


@pytest.mark.parametrize("mode", list(RESUME_SETTINGS))
@pytest.mark.parametrize("name", NAMES)
def test_resume_from_row_positions(corpus_files, name, mode):
    path = corpus_files[name]
    kw = RESUME_SETTINGS[mode]
    ds = _row_mode(path, **kw)
    n_rows = ds.num_rows
    epochs = kw.get("epochs", 1)
    points = resume_points(n_rows * epochs, FULL_POINTS[mode])
    full, states = _states_after(ds, points)
    assert len(full) == n_rows * epochs
    want = rows_of(reference(path, ds.schema))
    if kw.get("shuffle_buffer"):
        key = repr
        for e in range(epochs):
            epoch = full[e * n_rows : (e + 1) * n_rows]
            assert sorted(map(key, epoch)) == sorted(map(key, want)), (
                f"{name}: epoch {e} is not a permutation of the file's rows"
            )
    else:
        assert full == want, f"{name}: " + _first_diff(full, want)
    for i, k in enumerate(points):
        state = (states[k], torch_roundtrip(states[k]), pickle_roundtrip(states[k]))[i % 3]
        ds2 = _row_mode(path, **kw)
        ds2.load_state_dict(state)
        rest = _plain_rows(ds2)
        assert rest == full[k:], f"{name} ({mode}): resume after {k} rows: " + _first_diff(
            rest, full[k:]
        )


@pytest.mark.parametrize("name", NAMES)
def test_numpy_and_torch_outputs_read_everything(corpus_files, name):
    """The numpy/torch conversions must cope with every type (falling back to Python values)."""
    path = corpus_files[name]
    n = pq.ParquetFile(path).metadata.num_rows
    for output in ("numpy", "torch"):
        rows = sum(1 for _ in ParquetStream(path, output=output))
        assert rows == n
        for fmt in ("split", "padded"):
            total = 0
            for b in ParquetStream(path, output=output, batch_size=17, list_format=fmt):
                total += len(next(iter(b.values()))) if isinstance(b, dict) else b.num_rows
            assert total == n, f"{output}/{fmt}: {total} rows"
