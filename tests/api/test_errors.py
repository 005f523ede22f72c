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
    """Truncated variants of a bytes blob, or of a base64 text blob (as bytes and as text)."""
    if isinstance(v, bytes):
        return [v[:-1], v[: len(v) // 2], b""]
    raw = base64.b64decode(v, validate=True)
    enc = [base64.b64encode(x).decode() for x in (raw[:-1], raw[: len(raw) // 2], b"")]
    return enc + [v[:-1], v[:-2]]


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
        and isinstance(v, (bytes, str))
        and len(v) > 1
    ]
    if not blobs:
        pytest.skip("state holds no buffer blob (bytes or base64 text)")
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
