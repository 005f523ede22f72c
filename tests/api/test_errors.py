"""Errors: the right exception class, a message naming the culprit, never a panic or hang."""

from __future__ import annotations

import base64
import os
import shutil
import struct
from pathlib import Path

import pyarrow as pa
import pyarrow.parquet as pq
import pytest
from harness import (
    del_path,
    flat_ids,
    full_stream,
    keys_of,
    make_ds,
    resume_rest,
    set_path,
    take,
    torch_roundtrip,
    walk,
)
from shardstream import (
    ParquetStream,
    SchemaError,
    ShardError,
    ShardstreamError,
    StateError,
    datagen,
)
from torch.utils.data import DataLoader, IterableDataset

pytestmark = pytest.mark.timeout(120)


def expect(exc_type, fn, *must_contain):
    """Run fn; it must raise exc_type (an Exception, never a BaseException-only panic) whose
    message contains every string in must_contain."""
    try:
        fn()
    except BaseException as e:  # noqa: BLE001 - we want to see PanicException too
        assert type(e).__name__ != "PanicException", f"Rust panic escaped: {e!r}"
        assert isinstance(e, Exception), f"non-Exception escaped: {type(e).__mro__}: {e!r}"
        assert isinstance(e, exc_type), f"expected {exc_type}, got {type(e).__name__}: {e}"
        msg = str(e)
        for s in must_contain:
            assert s in msg, f"{s!r} not in error message: {msg!r}"
        return e
    pytest.fail(f"no {exc_type} raised")


def build_and_iterate(source, **kw):
    """Errors may surface at construction or during iteration; both are fine."""
    kw = {"output": "python", **kw}
    return lambda: list(ParquetStream(source, **kw))


def test_exception_hierarchy():
    assert issubclass(ShardError, ShardstreamError)
    assert issubclass(SchemaError, ShardstreamError) and issubclass(SchemaError, ValueError)
    assert issubclass(StateError, ShardstreamError) and issubclass(StateError, ValueError)
    assert issubclass(ShardstreamError, Exception)


# ---------------------------------------------------------------- not found


def test_missing_path(tmp_path):
    p = str(tmp_path / "nope.parquet")
    expect(FileNotFoundError, build_and_iterate(p), "nope.parquet")


def test_missing_path_in_list(small, tmp_path):
    p = str(tmp_path / "gone-away.parquet")
    expect(FileNotFoundError, build_and_iterate([small.paths[0], p]), "gone-away.parquet")


def test_empty_glob(tmp_path):
    g = str(tmp_path / "zzz-*.parquet")
    expect(FileNotFoundError, build_and_iterate(g), "zzz-*.parquet")


def test_dir_without_parquet(tmp_path):
    d = tmp_path / "emptyish"
    d.mkdir()
    (d / "notes.txt").write_text("hello")
    expect(FileNotFoundError, build_and_iterate(str(d)), "emptyish")


FIFO_CASES = r"""
import json, sys
from shardstream import ParquetRows, ParquetStream
out = {}
for name, src in json.loads(sys.argv[1]).items():
    for cls in (ParquetStream, ParquetRows):
        try:
            ds = cls(src, columns=["id"])
            n = len(list(ds) if cls is ParquetStream else ds)
            out[f"{name}/{cls.__name__}"] = f"read {n}"
        except OSError as e:
            out[f"{name}/{cls.__name__}"] = f"{type(e).__name__}: {e}"
print(json.dumps(out))
"""


def test_named_pipes_and_devices_are_refused_not_read(tmp_path):
    """A named pipe among the shards (or as the sidecar, or an HF state.json) was opened and
    read, waiting for a writer forever; a device is not data either. Each is an OSError naming
    the file and what it is, before anything waits (run in a child under a timeout, so a
    regression fails instead of hanging the suite)."""
    import json
    import subprocess
    import sys

    from shardstream.datagen import write_shards

    cases = {}
    for name in ("in_dir", "named", "url", "sidecar", "hf_state"):
        d = tmp_path / name
        write_shards(str(d), num_shards=1, rows_per_shard=5)
        cases[name] = str(d)
    os.mkfifo(tmp_path / "in_dir" / "z.parquet")
    os.mkfifo(tmp_path / "named" / "p.arrow")
    cases["named"] = str(tmp_path / "named" / "p.arrow")
    cases["url"] = (tmp_path / "named" / "p.arrow").as_uri()
    os.mkfifo(tmp_path / "sidecar" / "_shardstream_index.json")
    os.mkfifo(tmp_path / "hf_state" / "state.json")
    cases["device"] = "/dev/null"
    proc = subprocess.run(
        [sys.executable, "-c", FIFO_CASES, json.dumps(cases)],
        capture_output=True,
        text=True,
        timeout=120,
        env={**os.environ, "PYTHONPATH": os.pathsep.join(sys.path)},
    )
    assert proc.returncode == 0, proc.stderr
    got = json.loads(proc.stdout)
    pipes = {
        "in_dir": tmp_path / "in_dir" / "z.parquet",
        "named": tmp_path / "named" / "p.arrow",
        "url": cases["url"],
        "sidecar": tmp_path / "sidecar" / "_shardstream_index.json",
        "hf_state": tmp_path / "hf_state" / "state.json",
    }
    for name, path in pipes.items():
        for cls in ("ParquetStream", "ParquetRows"):
            assert got[f"{name}/{cls}"] == (
                f"OSError: {path}: a named pipe, not a regular file: a dataset's files are read "
                "as regular files"
            ), (name, cls)
    assert got["device/ParquetStream"].startswith("OSError: /dev/null: a character device")


def test_empty_list_source():
    expect((FileNotFoundError, ValueError), build_and_iterate([]))


# ------------------------------------------------------------ corrupt files


def _good_and(tmp_path, small, name, data: bytes):
    d = tmp_path / "set"
    d.mkdir(exist_ok=True)
    shutil.copy(small.paths[0], d / "a-good.parquet")
    (d / name).write_bytes(data)
    return str(d)


def _footer_start(data: bytes) -> int:
    flen = struct.unpack("<I", data[-8:-4])[0]
    return len(data) - 8 - flen


def _assert_pyarrow_rejects(path):
    with pytest.raises(Exception):  # noqa: B017 - precondition: the file really is broken
        pq.read_table(path)


def corruptions(good: bytes) -> dict[str, bytes]:
    out = {}
    out["text"] = b"this is not a parquet file at all\n" * 20
    out["zero-bytes"] = b""
    out["truncated-half"] = good[: len(good) // 2]
    out["truncated-last-byte"] = good[:-1]
    b = bytearray(good)
    s = _footer_start(good)
    for i in range(s, s + 32):
        b[i] ^= 0xFF
    out["footer-flipped-head"] = bytes(b)
    b = bytearray(good)
    mid = s + (len(good) - 8 - s) // 2
    for i in range(mid, mid + 32):
        b[i] ^= 0xFF
    out["footer-flipped-mid"] = bytes(b)
    b = bytearray(good)
    b[-8:-4] = struct.pack("<I", len(good) * 2)
    out["footer-length-too-big"] = bytes(b)
    b = bytearray(good)
    for i in range(100, 400):
        b[i] ^= 0x5A
    out["data-pages-flipped"] = bytes(b)
    return out


CORRUPTIONS = [
    "text",
    "zero-bytes",
    "truncated-half",
    "truncated-last-byte",
    "footer-flipped-head",
    "footer-flipped-mid",
    "footer-length-too-big",
    "data-pages-flipped",
]


@pytest.mark.parametrize("kind", CORRUPTIONS)
@pytest.mark.parametrize(
    "mode", [dict(), dict(shuffle_buffer=7, batch_size=5)], ids=["seq", "shuf"]
)
def test_corrupt_file_is_shard_error(small, tmp_path, kind, mode):
    good = Path(small.paths[1]).read_bytes()
    name = f"x-{kind}.parquet"
    d = _good_and(tmp_path, small, name, corruptions(good)[kind])
    _assert_pyarrow_rejects(os.path.join(d, name))
    expect(ShardError, build_and_iterate(d, **mode), name)


def test_corrupt_file_alone(tmp_path):
    p = tmp_path / "x.parquet"
    p.write_text("definitely not parquet")
    e = expect(ShardError, build_and_iterate(str(p)), "x.parquet")
    assert isinstance(e, ShardstreamError)


# ---------------------------------------------------------------- schemas


def _write(path, table):
    pq.write_table(table, path)
    return str(path)


def test_schema_type_mismatch(tmp_path):
    d = tmp_path / "s"
    d.mkdir()
    t = datagen.make_table(0, 20)
    _write(d / "a.parquet", t)
    i = t.schema.get_field_index("label")
    t2 = datagen.make_table(20, 20)
    t2 = t2.set_column(i, pa.field("label", pa.string()), t2.column("label").cast(pa.string()))
    _write(d / "b.parquet", t2)
    expect(SchemaError, build_and_iterate(str(d)), "a.parquet", "b.parquet", "label")
    expect(ValueError, build_and_iterate(str(d)))


def test_schema_missing_column(tmp_path):
    d = tmp_path / "s"
    d.mkdir()
    _write(d / "a.parquet", datagen.make_table(0, 20))
    _write(d / "b.parquet", datagen.make_table(20, 20).drop_columns(["cat"]))
    expect(SchemaError, build_and_iterate(str(d)), "a.parquet", "b.parquet", "cat")


def test_schema_missing_column_other_order(tmp_path):
    d = tmp_path / "s"
    d.mkdir()
    _write(d / "a.parquet", datagen.make_table(0, 20).drop_columns(["text"]))
    _write(d / "b.parquet", datagen.make_table(20, 20))
    expect(SchemaError, build_and_iterate(str(d)), "a.parquet", "b.parquet", "text")


def test_schema_list_inner_type_mismatch(tmp_path):
    d = tmp_path / "s"
    d.mkdir()
    t = datagen.make_table(0, 20)
    _write(d / "a.parquet", t)
    t2 = datagen.make_table(20, 20)
    i = t2.schema.get_field_index("tokens")
    t2 = t2.set_column(
        i, pa.field("tokens", pa.list_(pa.int64())), t2.column("tokens").cast(pa.list_(pa.int64()))
    )
    _write(d / "b.parquet", t2)
    expect(SchemaError, build_and_iterate(str(d)), "a.parquet", "b.parquet", "tokens")


def test_unknown_column(small):
    expect(SchemaError, build_and_iterate(small.root, columns=["id", "no_such_col"]), "no_such_col")


# ---------------------------------------------------------------- arguments


@pytest.mark.parametrize(
    "kw",
    [
        dict(batch_size=0),
        dict(batch_size=-3),
        dict(output="xml"),
        dict(output=""),
        dict(shuffle_buffer=-1),
        dict(epochs=0),
        dict(epochs=-2),
    ],
    ids=str,
)
def test_bad_arguments(small, kw):
    expect(ValueError, build_and_iterate(small.root, **kw))


# ------------------------------------------------------------------ states

ST = dict(output="python", shuffle_buffer=7, seed=3, batch_size=5, epochs=2)


@pytest.fixture(scope="module")
def mid_state(small):
    ds = make_ds(small.root, ST)
    take(iter(ds), 37)
    return torch_roundtrip(ds.state_dict())


def _load(source, settings, state):
    def f():
        ds = make_ds(source, settings)
        ds.load_state_dict(state)
        list(ds)

    return f


def test_good_state_loads(small, mid_state):
    full = full_stream(small.root, ST)
    assert full[:37] + resume_rest(small.root, ST, mid_state) == full


@pytest.mark.parametrize("bad", [None, [], "state", 3, b"\x00", {}], ids=repr)
def test_not_a_state(small, bad):
    e = expect(StateError, _load(small.root, ST, bad))
    assert isinstance(e, ValueError) and isinstance(e, ShardstreamError)


def _version_path(state):
    cands = [
        p for p, _ in walk(state) if p and isinstance(p[-1], str) and "version" in p[-1].lower()
    ]
    assert cands, f"state has no version field: keys {list(state)}"
    return min(cands, key=len)


def test_wrong_version(small, mid_state):
    p = _version_path(mid_state)
    v = mid_state
    for x in p:
        v = v[x]
    bad = 10**6 if isinstance(v, int) else "999.0"
    e = expect(StateError, _load(small.root, ST, set_path(mid_state, p, bad)))
    assert "version" in str(e).lower(), str(e)


def test_missing_key(small, mid_state):
    assert isinstance(mid_state, dict) and mid_state
    for key in list(mid_state):
        e = expect(StateError, _load(small.root, ST, del_path(mid_state, (key,))))
        assert str(key) in str(e), f"missing {key!r}: message {e}"


def test_unknown_key(small, mid_state):
    bad = dict(mid_state)
    bad["surprise_key"] = 1
    e = expect(StateError, _load(small.root, ST, bad))
    assert "surprise_key" in str(e)


def _wrong_type(v):
    if isinstance(v, bool):
        return "yes"
    if isinstance(v, int):
        return "12"
    if isinstance(v, str):
        return 12
    if isinstance(v, bytes):
        return "bytes?"
    if isinstance(v, list):
        return {"a": 1}
    if isinstance(v, dict):
        return [1, 2]
    return None


def test_wrong_types(small, mid_state):
    paths = []
    for p, v in walk(mid_state):
        if not p or v is None:
            continue
        # dict members everywhere, list members only the first of each list
        if any(isinstance(x, int) and x > 0 for x in p):
            continue
        paths.append((p, v))
    assert paths
    for p, v in paths:
        bad = set_path(mid_state, p, _wrong_type(v))
        expect(StateError, _load(small.root, ST, bad))


def test_negative_and_huge_positions(small, mid_state):
    """Integers out of range (negative, beyond the data) are corrupt state, not a panic."""
    for p, v in walk(mid_state):
        if isinstance(v, bool) or not isinstance(v, int) or not p:
            continue
        for bad in (-1, 2**62):
            try:
                _load(small.root, ST, set_path(mid_state, p, bad))()
            except BaseException as e:  # noqa: BLE001
                assert isinstance(e, Exception) and type(e).__name__ != "PanicException", (
                    f"{p}={bad}: {type(e).__name__}: {e}"
                )
                assert isinstance(e, StateError), f"{p}={bad}: {type(e).__name__}: {e}"


def _truncations(v):
    """Broken variants of a buffer's Latin-1 text (state version 3: a character per byte):
    truncated, cut mid-id, a character beyond Latin-1, the same ids as bytes or as base64."""
    assert isinstance(v, str) and len(v) % 8 == 0 and max(map(ord, v)) < 256, v[:40]
    raw = v.encode("latin-1")
    return [
        v[:-1],
        v[: len(v) // 2 + 3],
        v[:-8] + "\u0100" * 8,
        raw,
        base64.b64encode(raw).decode(),
    ]


def test_truncated_buffer(small):
    st = dict(ST, shuffle_buffer=100)
    ds = make_ds(small.root, st)
    take(iter(ds), 40)
    state = torch_roundtrip(ds.state_dict())
    blobs = [
        (p, v)
        for p, v in walk(state)
        if p
        and isinstance(p[-1], str)
        and "buffer" in p[-1].lower()
        and isinstance(v, str)
        and len(v) > 1
    ]
    assert [p for p, _ in blobs] == [("position", "buffer")], blobs
    for p, v in blobs:
        for cut in _truncations(v):
            expect(StateError, _load(small.root, st, set_path(state, p, cut)))


@pytest.mark.parametrize(
    "field,value",
    [
        ("seed", 4),
        ("shuffle_buffer", 8),
        ("batch_size", 6),
        ("drop_last", True),
        ("epochs", 3),
    ],
)
def test_other_settings(small, mid_state, field, value):
    other = dict(ST, **{field: value})
    e = expect(StateError, _load(small.root, other, mid_state))
    assert field in str(e), f"message does not name {field!r}: {e}"


def test_other_rank_layout_resumes_elastically(small, mid_state):
    """A 1-rank state loaded by 2 ranks is an elastic resume, not an error: the rows the first
    run had not yielded are split between the ranks (even=None: each exactly once)."""
    settings = dict(ST, even=None)
    ds = make_ds(small.root, settings)
    head = flat_ids(keys_of(take(iter(ds), 37), True))
    state = torch_roundtrip(ds.state_dict())
    rest = []
    for rank in range(2):
        r = make_ds(small.root, dict(settings, rank=rank, world_size=2))
        r.load_state_dict(state)
        rest += flat_ids(keys_of(r, True))
    assert sorted(head + rest) == sorted(small.ids * 2)


def test_other_layout_needs_every_slot(small):
    """Resuming 2 slots as 1 needs both states; one alone names what is missing."""
    ds = make_ds(small.root, dict(ST, rank=1, world_size=2))
    take(iter(ds), 3)
    expect(StateError, _load(small.root, ST, ds.state_dict()), "missing slots [0]")


@pytest.fixture
def shard_copy(small, tmp_path):
    d = tmp_path / "copy"
    shutil.copytree(small.root, d)
    return d


def _state_for(root):
    ds = make_ds(str(root), ST)
    take(iter(ds), 37)
    return torch_roundtrip(ds.state_dict())


def test_shard_file_changed(shard_copy):
    state = _state_for(shard_copy)
    p = shard_copy / "shard-00002.parquet"
    pq.write_table(datagen.make_table(10**6, 77), p)  # other rows, same schema
    e = expect(StateError, _load(str(shard_copy), ST, state))
    assert "shard-00002" in str(e) or "shard" in str(e).lower(), str(e)


def test_shard_file_same_rows_other_size(shard_copy):
    state = _state_for(shard_copy)
    p = shard_copy / "shard-00001.parquet"
    t = pq.read_table(p)
    pq.write_table(t, p, compression="none")
    e = expect(StateError, _load(str(shard_copy), ST, state))
    assert "shard-00001" in str(e) or "shard" in str(e).lower(), str(e)


def test_shard_file_added(shard_copy):
    state = _state_for(shard_copy)
    pq.write_table(datagen.make_table(10**6, 20), shard_copy / "shard-00009.parquet")
    e = expect(StateError, _load(str(shard_copy), ST, state))
    assert "shard-00009" in str(e) or "shard" in str(e).lower(), str(e)


def test_shard_file_removed(shard_copy):
    state = _state_for(shard_copy)
    os.remove(shard_copy / "shard-00003.parquet")
    e = expect(StateError, _load(str(shard_copy), ST, state))
    assert "shard-00003" in str(e) or "shard" in str(e).lower(), str(e)


def test_shard_set_moved_is_fine(small, shard_copy, tmp_path):
    """Paths are compared relative to their common root: moving the data is allowed."""
    state = _state_for(small.root)
    moved = tmp_path / "elsewhere" / "data"
    shutil.move(str(shard_copy), moved)
    full = full_stream(str(moved), ST)
    assert full[:37] + resume_rest(str(moved), ST, state) == full


# ------------------------------------------------------------ worker slot


class StateProbe(IterableDataset):
    """In each worker: take k items, then yield the dataset's pickled state."""

    def __init__(self, ds, k):
        self.ds, self.k = ds, k

    def __iter__(self):
        import pickle

        it = iter(self.ds)
        for _ in range(self.k):
            next(it)
        yield {"state": pickle.dumps(self.ds.state_dict())}


@pytest.mark.timeout(300)
def test_worker_slot_state_into_single_process(small):
    import pickle

    ds = make_ds(small.root, ST)
    loader = DataLoader(StateProbe(ds, 3), batch_size=None, num_workers=2)
    states = [pickle.loads(x["state"]) for x in loader]
    assert len(states) == 2
    for st in states:
        e = expect(StateError, _load(small.root, ST, st))
        assert isinstance(e, ValueError)


def test_error_does_not_poison_dataset(small, mid_state):
    """A failed load leaves the dataset usable (full stream from its start)."""
    ds = make_ds(small.root, ST)
    with pytest.raises(StateError):
        ds.load_state_dict({"bogus": 1})
    assert keys_of(ds, True) == full_stream(small.root, ST)


@pytest.mark.timeout(180)
@pytest.mark.parametrize("num_workers", [0, 2])
def test_corrupt_pages_inside_dataloader_workers(small, tmp_path, num_workers):
    """A shard whose footer is fine but whose pages are corrupt fails while reading (inside the
    worker); the error reaches the main process as ShardError naming the file, no hang."""
    good = Path(small.paths[1]).read_bytes()
    name = "x-data-pages-flipped.parquet"
    d = _good_and(tmp_path, small, name, corruptions(good)["data-pages-flipped"])
    _assert_pyarrow_rejects(os.path.join(d, name))
    ds = ParquetStream(d, output="torch", batch_size=8, shuffle_buffer=5)
    loader = DataLoader(ds, batch_size=None, num_workers=num_workers)
    expect(ShardError, lambda: list(loader), name)


# ------------------------------------------- real-world files and mistakes (issue 13)


def _values_by_file(files, column):
    return [v for f in files for v in pq.read_table(f).column(column).to_pylist()]


def _pandas_category_set(tmp_path, shards=3, cats=100):
    pd = pytest.importorskip("pandas")
    d = tmp_path / "cats"
    d.mkdir()
    files = []
    for i in range(shards):
        names = [f"s{i}-c{k}" for k in range(cats)]
        codes = [(k * 7) % cats if k % 11 else -1 for k in range(200)]
        df = pd.DataFrame(
            {"id": range(i * 200, (i + 1) * 200), "cat": pd.Categorical.from_codes(codes, names)}
        )
        files.append(str(d / f"p{i}.parquet"))
        df.to_parquet(files[-1], row_group_size=70)
    assert pq.read_schema(files[0]).field("cat").type.index_type == pa.int8()
    return str(d), files


@pytest.mark.parametrize(
    "kw",
    [
        dict(batch_size=500),
        dict(batch_size=None),
        dict(batch_size=200, shuffle_buffer=300, seed=1),
        dict(batch_size=None, shuffle_buffer=450, seed=2, read_batch_rows=13),
    ],
    ids=["concat", "rows", "gather", "gather-rows"],
)
def test_pandas_category_shards_read_in_every_mode(tmp_path, kw):
    """pandas `category` columns are `dictionary<int8, string>`; three shards with 100
    categories each overflow int8 keys when batches from several shards are concatenated or
    gathered (was: "internal error: concat: Dictionary key bigger than the key type")."""
    d, files = _pandas_category_set(tmp_path)
    batched = kw["batch_size"] is not None
    ds = ParquetStream(d, output="arrow" if batched else "python", **kw)
    rows = []
    for item in ds:
        rows.extend(item.to_pylist() if batched else [item])
    assert ds.schema.field("cat").type.index_type == pa.int32()
    want = dict(zip(_values_by_file(files, "id"), _values_by_file(files, "cat"), strict=True))
    got = {r["id"]: r["cat"] for r in rows}
    assert len(rows) == len(got) == 600
    assert got == want


def test_pandas_category_shards_resume_through_the_shuffle_buffer(tmp_path):
    d, files = _pandas_category_set(tmp_path)
    # 200-row batches gathered from several shards: more distinct values than int8 keys number
    kw = dict(output="arrow", batch_size=200, shuffle_buffer=250, seed=4)
    ds = ParquetStream(d, **kw)
    it = iter(ds)
    first = [r for b in take(it, 1) for r in b.to_pylist()]
    state = torch_roundtrip(ds.state_dict())
    rest = [r for b in it for r in b.to_pylist()]
    ds2 = ParquetStream(d, **kw)
    ds2.load_state_dict(state)
    again = [r for b in ds2 for r in b.to_pylist()]
    assert again == rest
    want = dict(zip(_values_by_file(files, "id"), _values_by_file(files, "cat"), strict=True))
    assert {r["id"]: r["cat"] for r in first + rest} == want


def test_duplicate_column_names_are_a_schema_error(tmp_path):
    """Legal Parquet, and pyarrow writes it: refused at open naming file and column (was: a
    schema `a: int64, a: int64` for an int and a string, then a readahead thread panic)."""
    d = tmp_path / "dup"
    d.mkdir()
    t = pa.Table.from_arrays(
        [pa.array([1, 2, 3]), pa.array(["x", "y", "z"]), pa.array([7, 8, 9])], names=["a", "a", "b"]
    )
    pq.write_table(t, d / "d.parquet")
    e = expect(SchemaError, lambda: ParquetStream(str(d)), "d.parquet", '"a"', "more than once")
    assert isinstance(e, ValueError)
    expect(SchemaError, lambda: ParquetStream(str(d), columns=["a"]), "d.parquet", '"a"')
    # The other column is unambiguous and reads.
    assert [r["b"] for r in ParquetStream(str(d), columns=["b"], output="python")] == [7, 8, 9]


def _spark_dir(tmp_path):
    d = tmp_path / "spark"
    (d / "_temporary" / "0" / "task_1").mkdir(parents=True)
    t = pa.table({"id": [1, 2, 3, 4, 5]})
    pq.write_table(t, d / "part-00000.parquet")
    pq.write_table(t, d / "_temporary" / "0" / "task_1" / "part-00000.parquet")
    pq.write_table(t, d / ".hidden.parquet")
    (d / "_temporary" / "0" / "part-00001.parquet").write_bytes(b"PAR1 half written")
    (d / "_SUCCESS").write_bytes(b"")
    (d / ".part-00000.parquet.crc").write_bytes(b"crc")
    return d


def test_directory_walk_skips_hidden_and_temporary_files(tmp_path):
    """A Spark output directory: pyarrow.dataset and Spark read 5 rows (was: 15, or an error on
    the partial file under _temporary/)."""
    d = _spark_dir(tmp_path)
    assert pq.read_table(d).num_rows == 5
    ds = ParquetStream(str(d), output="python")
    assert ds.num_rows == 5 and [r["id"] for r in ds] == [1, 2, 3, 4, 5]
    # Named explicitly, a hidden file is read.
    assert ParquetStream(str(d / ".hidden.parquet")).num_rows == 5
    # A directory of hidden files only names no data.
    only = tmp_path / "only"
    only.mkdir()
    pq.write_table(pa.table({"id": [1]}), only / "_x.parquet")
    expect(FileNotFoundError, lambda: ParquetStream(str(only)), "only", "'_'")


def test_a_path_with_glob_characters_is_a_path(tmp_path):
    pq.write_table(pa.table({"id": [1, 2, 3]}), tmp_path / "part[1].parquet")
    assert ParquetStream(str(tmp_path / "part[1].parquet")).num_rows == 3


def test_columns_empty_is_a_value_error_naming_the_argument(small):
    """pyarrow returns N rows x 0 columns; a training stream of rows without data is a mistake
    (and numpy/torch batches of no columns have no length): refused, naming the argument (was:
    a ShardError blaming the first file)."""
    e = expect(ValueError, lambda: ParquetStream(small.root, columns=[]), "columns=[]")
    assert not isinstance(e, ShardError)


def test_directory_symlink_loop_is_an_error_naming_the_link(tmp_path):
    """Was: every shard read 41 times (pyarrow still does that)."""
    d = tmp_path / "loop"
    (d / "sub").mkdir(parents=True)
    pq.write_table(pa.table({"id": [1, 2, 3]}), d / "sub" / "a.parquet")
    os.symlink("..", d / "sub" / "up")
    e = expect(OSError, lambda: ParquetStream(str(d)), os.path.join("sub", "up"), "contains it")
    assert len(str(e)) < 400


def test_file_symlink_loop_is_a_short_error_naming_the_link(tmp_path):
    pq.write_table(pa.table({"id": [1, 2, 3]}), tmp_path / "a.parquet")
    os.symlink("y.parquet", tmp_path / "x.parquet")
    os.symlink("x.parquet", tmp_path / "y.parquet")
    e = expect(OSError, lambda: ParquetStream(str(tmp_path)), "x.parquet", "symbolic link loop")
    assert len(str(e)) < 400
    os.remove(tmp_path / "x.parquet")
    os.remove(tmp_path / "y.parquet")
    os.symlink("gone.parquet", tmp_path / "b.parquet")
    expect(FileNotFoundError, lambda: ParquetStream(str(tmp_path)), "b.parquet", "broken")


@pytest.mark.parametrize("how", ["replaced", "rewritten-same-size"])
def test_local_shard_changed_while_open_is_a_shard_error(small, tmp_path, how):
    """Was: the stream switched to the new file's rows mid-epoch, or failed with an unrelated
    "Invalid page header". Every open of a local shard checks size, mtime and inode."""
    d = tmp_path / "copy"
    shutil.copytree(small.root, d)
    ds = ParquetStream(str(d), output="arrow", batch_size=5, read_batch_rows=5, readahead_threads=0)
    it = iter(ds)
    take(it, 3)  # inside the first shard
    victim = d / sorted(os.listdir(d))[-1]
    data = victim.read_bytes()
    if how == "replaced":
        other = tmp_path / "other.parquet"
        shutil.copy(small.paths[0], other)
        os.replace(other, victim)
    else:
        b = bytearray(data)
        b[10] ^= 0xFF  # same size, other bytes (a page payload)
        st = os.stat(victim)
        victim.write_bytes(bytes(b))
        os.utime(victim, ns=(st.st_atime_ns, st.st_mtime_ns + 1_000_000))
    expect(ShardError, lambda: list(it), victim.name, "changed while the dataset was open")


def test_schemas_pyarrow_unifies_are_read(tmp_path):
    """null vs string, list<item> vs list<element>, nested nullability: one unified schema
    (was: "incompatible shards" with Rust Debug type names)."""
    d = tmp_path / "u"
    d.mkdir()
    pq.write_table(pa.table({"id": [1, 2], "s": pa.nulls(2)}), d / "a.parquet")
    pq.write_table(
        pa.table({"id": [3], "s": ["x"]}).append_column(
            "l", pa.array([[1, 2]], pa.list_(pa.int32()))
        ),
        d / "b.parquet",
        use_compliant_nested_type=False,
    )
    pq.write_table(
        pa.table({"id": [4], "s": [None]}).append_column(
            "l", pa.array([[None]], pa.list_(pa.int32()))
        ),
        d / "c.parquet",
    )
    ds = ParquetStream(str(d), columns=["id", "s"], output="python")
    assert ds.schema.field("s").type == pa.string()
    assert list(ds) == [
        {"id": 1, "s": None},
        {"id": 2, "s": None},
        {"id": 3, "s": "x"},
        {"id": 4, "s": None},
    ]
    os.remove(d / "a.parquet")
    ds = ParquetStream(str(d), output="python")
    assert ds.schema.field("l").type == pa.list_(pa.field("item", pa.int32()))
    assert [r["l"] for r in ds] == [[1, 2], [None]]


def test_real_type_conflicts_name_types_as_pyarrow_does(tmp_path):
    d = tmp_path / "c"
    d.mkdir()
    pq.write_table(pa.table({"l": pa.array([[1]], pa.list_(pa.int32()))}), d / "a.parquet")
    pq.write_table(pa.table({"l": pa.array([[1]], pa.list_(pa.int64()))}), d / "b.parquet")
    e = expect(
        SchemaError,
        lambda: ParquetStream(str(d)),
        "list<element: int32>",
        "list<element: int64>",
        "a.parquet",
        "b.parquet",
    )
    assert "Field {" not in str(e) and "List(" not in str(e)


def test_wrong_page_checksums_stay_a_shard_error(tmp_path):
    """shardstream verifies page checksums (pyarrow does not by default): a payload byte
    flipped in a file with checksums is a ShardError naming the file, never other values."""
    p = tmp_path / "crc.parquet"
    pq.write_table(
        pa.table({"id": list(range(1000))}), p, write_page_checksum=True, compression="none"
    )
    b = bytearray(p.read_bytes())
    b[40] ^= 0x01  # inside the first data page's values
    p.write_bytes(bytes(b))
    assert pq.read_table(p).column("id").to_pylist() != list(range(1000))
    expect(ShardError, build_and_iterate(str(p)), "crc.parquet", "CRC")
