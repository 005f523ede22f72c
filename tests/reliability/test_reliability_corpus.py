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
import os
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
    # Footers as other writers leave them (corpus.rewrite_footer).
    md = pq.ParquetFile(corpus_files["footer-num-rows-zero"]).metadata
    assert md.num_rows == 0 and md.row_group(0).num_rows > 0
    md = pq.ParquetFile(corpus_files["footer-undeclared-field-type"]).metadata
    assert md.created_by.startswith("parquet-mr version 1.12")
    assert any(
        md.row_group(0).column(i).dictionary_page_offset in (0, None)
        for i in range(md.row_group(0).num_columns)
    )
    with open(corpus_files["footer-undeclared-field-type"], "rb") as f:
        data = f.read()
    fmd, _ = corpus._t_read(data, len(data) - 8 - int.from_bytes(data[-8:-4], "little"), 12)
    field15 = [f for md_ in corpus._column_metadatas(fmd) for f in md_ if f[0] == 15]
    assert field15 and all(f[1] == corpus.T_LIST for f in field15)
    md = pq.ParquetFile(corpus_files["short-dictionary-chunks"]).metadata
    assert md.created_by == "parquet-mr" and md.row_group(0).column(1).has_dictionary_page
    md = pq.ParquetFile(corpus_files["narrow-dictionary-keys"]).metadata
    schema = pq.read_schema(corpus_files["narrow-dictionary-keys"])
    dicts = [f.type for f in schema if pa.types.is_dictionary(f.type)]
    assert {t.index_type for t in dicts} >= {
        pa.int8(),
        pa.int16(),
        pa.uint8(),
        pa.uint16(),
        pa.uint32(),
    }


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
    md = pq.ParquetFile(path).metadata
    n = sum(md.row_group(i).num_rows for i in range(md.num_row_groups))  # not md.num_rows: 0 once
    for output in ("numpy", "torch"):
        rows = sum(1 for _ in ParquetStream(path, output=output))
        assert rows == n
        for fmt in ("split", "padded"):
            total = 0
            for b in ParquetStream(path, output=output, batch_size=17, list_format=fmt):
                total += len(next(iter(b.values()))) if isinstance(b, dict) else b.num_rows
            assert total == n, f"{output}/{fmt}: {total} rows"


# ------------------------------------------------------------------- multi-shard sets

SETS = corpus.set_cases()
READ_SETS = [c.name for c in SETS if c.error is None]
REFUSED_SETS = [c.name for c in SETS if c.error is not None]
BY_NAME = {c.name: c for c in SETS}


@pytest.fixture(scope="module")
def set_dirs(tmp_path_factory) -> dict[str, tuple[str, list[str]]]:
    root = str(tmp_path_factory.mktemp("sets"))
    return {c.name: corpus.build_set(c, root) for c in SETS}


def test_sets_are_what_they_claim(set_dirs):
    """The shapes are really there: narrow keys with more values overall than the keys
    number, a null-typed column beside a typed one, both list child names, differing zones,
    skipped files on disk."""
    assert len(READ_SETS) >= 8 and len(REFUSED_SETS) >= 6
    d, files = set_dirs["pandas-category-shards"]
    types = {pq.read_schema(f).field("cat").type for f in files}
    assert types == {pa.dictionary(pa.int8(), pa.string())}, types
    assert sum(len(pq.read_table(f).column("cat").chunk(0).dictionary) for f in files) > 127
    d, files = set_dirs["null-typed-columns"]
    assert {str(pq.read_schema(f).field("s").type) for f in files} == {"null", "string"}
    assert pq.read_metadata(files[1]).num_rows == 0
    d, files = set_dirs["list-item-vs-element"]
    assert {pq.read_schema(f).field("list_int32").type.value_field.name for f in files} == {
        "item",
        "element",
    }
    d, files = set_dirs["timestamp-zone-vs-no-stored-schema"]
    assert {pq.read_schema(f).field("ts").type.tz for f in files} == {"UTC", "Europe/Berlin"}
    d, files = set_dirs["spark-output-directory"]
    on_disk = [os.path.join(r, f) for r, _, fs in os.walk(d) for f in fs]
    assert len(on_disk) > len(files) + 5, on_disk


def _set_rows(name: str, set_dirs, **kw) -> tuple[ParquetStream, list]:
    d, _ = set_dirs[name]
    ds = ParquetStream(d, output="python", **kw)
    return ds, [canon(r) for r in ds]


@pytest.mark.parametrize("name", READ_SETS)
def test_set_reads_what_pyarrow_reads_file_by_file(set_dirs, name):
    """Arrow batches (concatenated across shards) and Python rows equal pyarrow's reads of
    the data files, in path order; hidden and temporary files are not read."""
    d, files = set_dirs[name]
    ds = ParquetStream(d, batch_size=64, output="arrow", readahead_threads=2, read_batch_rows=7)
    got = pa.Table.from_batches(list(ds), schema=ds.schema)
    want = corpus.set_reference(files, ds.schema)
    assert ds.num_rows == got.num_rows == want.num_rows
    for f in ds.schema:
        a, b = _plain(got.column(f.name)), want.column(f.name).combine_chunks()
        ga, gb = [canon(x) for x in a.to_pylist()], [canon(x) for x in b.to_pylist()]
        assert ga == gb, f"{name}: column {f.name!r}: " + _first_diff(ga, gb)
    _, rows = _set_rows(name, set_dirs, read_batch_rows=5)
    assert rows == rows_of(want), f"{name}: " + _first_diff(rows, rows_of(want))


# A wide buffer mixes rows of every shard into each batch.
SET_SETTINGS = {**RESUME_SETTINGS, "shuffled-wide": dict(shuffle_buffer=300, seed=5)}


@pytest.mark.parametrize("mode", list(SET_SETTINGS))
@pytest.mark.parametrize("name", READ_SETS)
def test_set_resume_and_shuffle(set_dirs, name, mode):
    """Through the shuffle buffer (rows of different shards gathered into one batch) and
    resumed at every batch boundary (the buffer re-read from the saved row ids)."""
    kw = SET_SETTINGS[mode]
    d, files = set_dirs[name]
    # Batches large enough to hold more distinct dictionary values than int8 keys number.
    bs = 200
    ds = ParquetStream(d, output="arrow", batch_size=bs, **kw)
    n = ds.num_rows
    epochs = kw.get("epochs", 1)
    states, full = {0: copy.deepcopy(ds.state_dict())}, []
    for b in ds:
        full.extend(rows_of(b))
        states[len(full)] = copy.deepcopy(ds.state_dict())  # every batch boundary
    want = rows_of(corpus.set_reference(files, ds.schema))
    for e in range(epochs):
        epoch = full[e * n : (e + 1) * n]
        if kw.get("shuffle_buffer"):
            assert sorted(map(repr, epoch)) == sorted(map(repr, want)), name
        else:
            assert epoch == want, f"{name}: " + _first_diff(epoch, want)
    assert len(full) == n * epochs
    for k, state in states.items():
        ds2 = ParquetStream(d, output="arrow", batch_size=bs, **kw)
        ds2.load_state_dict(state)
        rest = [r for b in ds2 for r in rows_of(b)]
        assert rest == full[k:], f"{name} ({mode}) after {k}: " + _first_diff(rest, full[k:])


@pytest.mark.parametrize("name", REFUSED_SETS)
def test_set_is_refused_clearly(set_dirs, name):
    """Real conflicts are refused at open with the named exception, naming what is wrong
    (types spelled as pyarrow spells them), never a panic or an internal error."""
    case = BY_NAME[name]
    d, _ = set_dirs[name]
    cls, parts = case.error
    try:
        list(ParquetStream(d, output="python", columns=case.columns))
    except Exception as e:  # noqa: BLE001
        assert type(e).__name__ == cls or cls in [c.__name__ for c in type(e).__mro__], repr(e)
        assert "internal error" not in str(e) and "PanicException" not in repr(type(e))
        for p in parts:
            assert p in str(e), f"{p!r} not in {e}"
        assert len(str(e)) < 600, str(e)
    else:
        pytest.fail(f"{name}: read without error")


# ------------------------------------------------------------------- Arrow IPC shards

IPC_CASES = corpus.ipc_cases()


@pytest.fixture(scope="module")
def ipc_files(tmp_path_factory) -> dict[str, str]:
    d = str(tmp_path_factory.mktemp("ipc-corpus"))
    return {c.name: corpus.write_ipc_case(c, d) for c in IPC_CASES}


def test_ipc_corpus_is_what_it_claims(ipc_files):
    for c in IPC_CASES:
        with open(ipc_files[c.name], "rb") as f:
            head = f.read(6)
        assert (head[:4] == b"\xff\xff\xff\xff") == c.stream and (head == b"ARROW1") != c.stream
    assert {c.compression for c in IPC_CASES} == {None, "lz4", "zstd"}


@pytest.mark.parametrize("name", [c.name for c in IPC_CASES])
def test_ipc_reads_what_pyarrow_reads(ipc_files, name):
    """Every value as pyarrow's IPC reader gives it, in batches and rows, and a resume from
    row positions (batch boundaries of 97, inside batches) gives the rest."""
    path = ipc_files[name]
    ref = corpus.read_ipc(path)
    ds = ParquetStream(path, batch_size=13, output="arrow")
    got = pa.Table.from_batches(list(ds), schema=ds.schema)
    assert got.num_rows == ref.num_rows
    for f in ds.schema:
        a, b = _plain(got.column(f.name)), _plain(ref.column(f.name))
        if a.type != b.type:
            a = a.cast(b.type)
        ga, gb = [canon(x) for x in a.to_pylist()], [canon(x) for x in b.to_pylist()]
        assert ga == gb, f"{name}: column {f.name!r}: " + _first_diff(ga, gb)
    rows = [canon(r) for r in ParquetStream(path, output="python", shuffle_buffer=0)]
    n = len(rows)
    for k in sorted({1, 96, 97, 98, n // 2, n - 1}):
        if not 0 < k < n:
            continue
        ds = ParquetStream(path, output="python")
        it = iter(ds)
        for _ in range(k):
            next(it)
        state = torch_roundtrip(ds.state_dict())
        ds2 = ParquetStream(path, output="python")
        ds2.load_state_dict(state)
        assert [canon(r) for r in ds2] == rows[k:], f"{name}: resume at {k}"
