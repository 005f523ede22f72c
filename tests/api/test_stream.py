"""Content correctness of the stream (no interruption involved)."""

from __future__ import annotations

import itertools
import os
import pathlib
import shutil
from collections import Counter

import numpy as np
import pyarrow as pa
import pyarrow.parquet as pq
import pytest
import torch
from harness import (
    all_ids,
    check_epochs,
    flat_ids,
    full_stream,
    keys_of,
    make_ds,
    row_group_layout,
    run_child,
    take,
)
from shardstream import ParquetStream, datagen

ALL_COLS = list(datagen.COLUMNS)


# ----------------------------------------------------------------- helpers


def to_py(v):
    """Normalize one value from any output mode to python."""
    if isinstance(v, torch.Tensor):
        return v.tolist()
    if isinstance(v, np.ndarray):
        return v.tolist()
    if isinstance(v, np.generic):
        return v.item()
    if isinstance(v, pa.Scalar):
        return v.as_py()
    return v


def rows_of(item, batched: bool) -> list[dict]:
    """python rows from an item of any output mode."""
    if isinstance(item, pa.RecordBatch):
        return item.to_pylist()
    assert isinstance(item, dict)
    if not batched:
        return [{k: to_py(v) for k, v in item.items()}]
    cols = {}
    for k, v in item.items():
        if isinstance(v, (torch.Tensor, np.ndarray)):
            cols[k] = v.tolist()
        else:
            assert isinstance(v, list), f"batch column {k} is {type(v).__name__}"
            cols[k] = [to_py(x) for x in v]
    n = {len(c) for c in cols.values()}
    assert len(n) == 1, f"batch columns differ in length: { {k: len(c) for k, c in cols.items()} }"
    return [dict(zip(cols, vals, strict=True)) for vals in zip(*cols.values(), strict=True)]


def expected(shardset, i, columns=None):
    row = datagen.expected_row(i, shardset.tokens_len, shardset.nulls)
    return {c: row[c] for c in (columns or ALL_COLS)}


# ---------------------------------------------------- coverage / order


@pytest.mark.parametrize(
    "settings",
    [
        dict(output="python"),
        dict(output="python", epochs=3, shuffle_buffer=7, seed=1),
        dict(output="numpy", epochs=2, shuffle_buffer=10**6, seed=2),
        dict(output="torch", batch_size=64, epochs=2, shuffle_buffer=100, seed=3),
        dict(output="arrow", batch_size=5, drop_last=True, epochs=2, shuffle_buffer=1, seed=4),
        dict(output="python", batch_size=64, epochs=2),
    ],
    ids=str,
)
@pytest.mark.parametrize("which", ["small", "small_nopi", "special", "tiny"])
def test_every_row_exactly_once_per_epoch(request, which, settings):
    ss = request.getfixturevalue(which)
    ds = make_ds(ss.root, settings)
    full = keys_of(ds, settings.get("batch_size") is not None)
    check_epochs(full, list(ds.shards), settings)


@pytest.mark.parametrize("which", ["small", "small_nopi", "special", "tiny", "big"])
def test_no_shuffle_order_is_shard_path_order(request, which):
    ss = request.getfixturevalue(which)
    ds = ParquetStream(ss.root, output="python", epochs=2)
    assert ds.shards == sorted(ss.paths)
    ids = [r["id"] for r in ds]
    one = all_ids(sorted(ss.paths))
    assert one == list(range(len(one)))  # datagen: consecutive ids in file order
    assert ids == one + one


def test_page_index_does_not_change_unshuffled_stream(small, small_nopi):
    a = full_stream(small.root, dict(output="python", batch_size=7, epochs=2))
    b = full_stream(small_nopi.root, dict(output="python", batch_size=7, epochs=2))
    assert a == b


def _epochs(full, per):
    return [full[i * per : (i + 1) * per] for i in range(len(full) // per)]


@pytest.mark.parametrize("buf", [7, 100, 10**6])
def test_shuffle_shuffles_and_differs_across_epochs_and_seeds(small, buf):
    n = small.num_rows
    s0 = full_stream(small.root, dict(output="python", shuffle_buffer=buf, seed=0, epochs=3))
    s1 = full_stream(small.root, dict(output="python", shuffle_buffer=buf, seed=1, epochs=3))
    e0 = _epochs(s0, n)
    assert len(e0) == 3
    ordered = sorted(small.ids)
    for e in e0:
        assert e != ordered, "shuffled epoch is the identity order"
        assert sorted(e) == ordered
    assert e0[0] != e0[1] and e0[1] != e0[2] and e0[0] != e0[2], "epochs not reshuffled"
    assert s0 != s1, "different seeds give the same stream"
    for a, b in zip(e0, _epochs(s1, n), strict=True):
        assert a != b


def test_shuffle_permutes_row_group_order(small):
    """With a 1-row buffer rows can barely move, so the first rows of an epoch coming from
    elsewhere than the start of shard 0 shows the row-group order itself is permuted."""
    firsts = []
    for seed in range(6):
        s = full_stream(small.root, dict(output="python", shuffle_buffer=1, seed=seed))
        firsts.append(s[0])
    assert any(f > 1 for f in firsts), f"epoch always starts at the first shard: {firsts}"


def test_small_buffer_keeps_locality_big_buffer_does_not(small):
    """shuffle_buffer bounds how far a row can move earlier: with B=7 the first item of the
    epoch is among the first 8 rows of some row group, and most consecutive items are close
    in id; with a whole-data buffer they are not."""

    def near_fraction(s):
        d = np.abs(np.diff(np.array(s)))
        return float(np.mean(d <= 16))

    small_b = full_stream(small.root, dict(output="python", shuffle_buffer=7, seed=3))
    big_b = full_stream(small.root, dict(output="python", shuffle_buffer=10**6, seed=3))
    starts = set()
    row = 0
    for shard in row_group_layout(sorted(small.paths)):
        for size in shard:
            starts |= set(range(row, row + min(size, 8)))
            row += size
    assert small_b[0] in starts
    assert near_fraction(small_b) > 0.25, near_fraction(small_b)
    assert near_fraction(big_b) < 0.15, near_fraction(big_b)


def test_same_seed_same_stream(small):
    st = dict(output="python", shuffle_buffer=100, seed=123, batch_size=5, epochs=2)
    assert full_stream(small.root, st) == full_stream(small.root, st)


@pytest.mark.timeout(300)
def test_same_seed_same_stream_across_processes(small, tmp_path):
    st = dict(output="python", shuffle_buffer=100, seed=123, batch_size=5, epochs=2)
    here = full_stream(small.root, st)
    # another process: another hash seed, other addresses and thread timing
    assert run_child(str(tmp_path), small.root, st, tag="a") == here


def test_big_seed_values(small):
    for seed in [2**31, 2**63 - 1]:
        s = full_stream(small.root, dict(output="python", shuffle_buffer=7, seed=seed))
        assert sorted(s) == sorted(small.ids)


# ---------------------------------------------------------------- sources


def test_source_forms(small, tmp_path):
    paths = sorted(small.paths)
    want = all_ids(paths)

    def ids(src):
        return [r["id"] for r in ParquetStream(src, output="python", columns=["id"])]

    assert ids(small.root) == want
    assert ids(pathlib.Path(small.root)) == want
    assert ids(os.path.join(small.root, "*.parquet")) == want
    assert ids([paths[2], paths[0]]) == all_ids([paths[0], paths[2]])  # sorted path order
    assert ids([paths[1], paths[1], small.root]) == want  # de-duplicated
    assert ids(pathlib.Path(paths[3])) == all_ids([paths[3]])
    ds = ParquetStream([paths[3], pathlib.Path(paths[0])])
    assert ds.shards == [paths[0], paths[3]]


def test_directory_is_recursive_and_only_parquet(small, tmp_path):
    root = tmp_path / "data"
    (root / "a" / "deep").mkdir(parents=True)
    (root / "b").mkdir()
    p = sorted(small.paths)
    shutil.copy(p[0], root / "a" / "deep" / "x.parquet")
    shutil.copy(p[1], root / "a" / "y.parquet")
    shutil.copy(p[2], root / "b" / "z.parquet")
    (root / "README.txt").write_text("not parquet")
    (root / "b" / "_SUCCESS").write_text("")
    ds = ParquetStream(str(root), output="python", columns=["id"])
    want_paths = sorted(
        str(x)
        for x in [
            root / "a" / "deep" / "x.parquet",
            root / "a" / "y.parquet",
            root / "b" / "z.parquet",
        ]
    )
    assert ds.shards == want_paths
    assert all(os.path.isabs(s) for s in ds.shards)
    assert [r["id"] for r in ds] == all_ids(want_paths)


def test_relative_source_paths_give_absolute_shards(small, monkeypatch):
    monkeypatch.chdir(small.root)
    ds = ParquetStream("shard-00001.parquet")
    assert ds.shards == [os.path.join(small.root, "shard-00001.parquet")]


# --------------------------------------------------------------- metadata


def test_num_rows_shards_schema(small, special, tiny):
    for ss in (small, special, tiny):
        ds = ParquetStream(ss.root)
        assert ds.num_rows == ss.num_rows == len(ss.ids)
        assert ds.shards == sorted(ss.paths)
        assert isinstance(ds.schema, pa.Schema)
        assert ds.schema.names == ALL_COLS
        assert ds.schema.field("id").type == pa.int64()
        assert ds.schema.field("tokens").type == pa.list_(pa.int32())
        assert ds.schema.field("label").type == pa.int32()
    ds = ParquetStream(small.root, columns=["text", "id"])
    assert ds.schema.names == ["text", "id"]
    assert ds.num_rows == small.num_rows


# ------------------------------------------------------------ values/types


@pytest.mark.parametrize(
    "columns", [None, ["id"], ["text", "id"], ["cat", "label", "tokens", "id"]]
)
@pytest.mark.parametrize("output", ["python", "numpy", "torch", "arrow"])
@pytest.mark.parametrize("batch_size", [None, 5])
def test_values_and_column_order(small, columns, output, batch_size):
    ds = ParquetStream(
        small.root, columns=columns, output=output, batch_size=batch_size, shuffle_buffer=7, seed=1
    )
    names = columns or ALL_COLS
    seen = []
    for item in ds:
        if isinstance(item, pa.RecordBatch):
            assert item.schema.names == names
        else:
            assert list(item.keys()) == names, f"column order {list(item.keys())} != {names}"
        for row in rows_of(item, batch_size is not None):
            assert row == expected(small, row["id"], names), row
            seen.append(row["id"])
    assert sorted(seen) == sorted(small.ids)


def _row_with(ds_rows, pred):
    for r in ds_rows:
        if pred(r):
            return r
    raise AssertionError("no such row")


def test_python_row_types_and_nulls(small):
    rows = list(ParquetStream(small.root, output="python"))
    assert all(type(r["id"]) is int for r in rows)
    nulls = [r for r in rows if r["id"] % 7 == 0]
    assert nulls and all(r["label"] is None for r in nulls)
    assert all(type(r["label"]) is int for r in rows if r["id"] % 7)
    assert all(type(r["tokens"]) is list and all(type(t) is int for t in r["tokens"]) for r in rows)
    assert all(type(r["text"]) is str and type(r["cat"]) is str for r in rows)
    assert any(r["tokens"] == [] for r in rows)  # tokens_len (0, 16) includes empty lists


def test_numpy_row_types(small):
    rows = list(ParquetStream(small.root, output="numpy"))
    r = _row_with(rows, lambda r: int(r["id"]) % 7 != 0 and len(r["tokens"]) > 2)
    assert isinstance(r["id"], np.integer) and r["id"].dtype == np.int64
    assert isinstance(r["label"], np.integer) and r["label"].dtype == np.int32
    assert isinstance(r["tokens"], np.ndarray) and r["tokens"].ndim == 1
    assert r["tokens"].dtype == np.int32
    assert type(r["text"]) is str and type(r["cat"]) is str
    r0 = _row_with(rows, lambda r: int(r["id"]) % 7 == 0)
    assert r0["label"] is None


def test_torch_row_types(small):
    rows = list(ParquetStream(small.root, output="torch"))
    r = _row_with(rows, lambda r: int(r["id"]) % 7 != 0 and len(r["tokens"]) > 2)
    assert isinstance(r["id"], torch.Tensor) and r["id"].dim() == 0 and r["id"].dtype == torch.int64
    assert isinstance(r["label"], torch.Tensor) and r["label"].dim() == 0
    assert r["label"].dtype == torch.int32
    assert isinstance(r["tokens"], torch.Tensor) and r["tokens"].dim() == 1
    assert r["tokens"].dtype == torch.int32
    assert r["tokens"].tolist() == datagen.expected_tokens(int(r["id"]))
    assert type(r["text"]) is str and type(r["cat"]) is str
    assert _row_with(rows, lambda r: int(r["id"]) % 7 == 0)["label"] is None


def test_arrow_row_and_batch_types(small):
    rows = list(ParquetStream(small.root, output="arrow"))
    assert all(isinstance(r, pa.RecordBatch) and r.num_rows == 1 for r in rows)
    batches = list(ParquetStream(small.root, output="arrow", batch_size=64))
    assert all(isinstance(b, pa.RecordBatch) for b in batches)
    assert [b.num_rows for b in batches] == [64] * (small.num_rows // 64) + [small.num_rows % 64]
    assert batches[0].schema.field("id").type == pa.int64()


def test_python_batch_types(small):
    b = next(iter(ParquetStream(small.root, output="python", batch_size=14)))
    assert all(type(v) is list and len(v) == 14 for v in b.values())
    assert b["label"][0] is None  # id 0
    assert b["id"] == list(range(14))


def test_numpy_batch_types(small):
    batches = list(ParquetStream(small.root, output="numpy", batch_size=14))
    b = batches[0]
    assert isinstance(b["id"], np.ndarray) and b["id"].dtype == np.int64 and b["id"].shape == (14,)
    assert isinstance(b["label"], list) and b["label"][0] is None  # numeric with nulls -> list
    assert isinstance(b["text"], list) and type(b["text"][0]) is str
    assert isinstance(b["tokens"], list) and len(b["tokens"]) == 14
    for i, t in zip(b["id"].tolist(), b["tokens"], strict=True):
        assert list(map(int, t)) == datagen.expected_tokens(i)


def test_torch_batch_types(small):
    batches = list(ParquetStream(small.root, output="torch", batch_size=14))
    b = batches[0]
    assert isinstance(b["id"], torch.Tensor) and b["id"].dtype == torch.int64
    assert b["id"].shape == (14,)
    assert isinstance(b["label"], list) and b["label"][0] is None
    assert all(x is None or type(x) is int for x in b["label"])
    assert isinstance(b["tokens"], list)
    assert all(isinstance(t, torch.Tensor) and t.dim() == 1 for t in b["tokens"])
    assert [t.tolist() for t in b["tokens"]] == [datagen.expected_tokens(i) for i in range(14)]
    assert b["text"] == [f"row-{i}" for i in range(14)]


@pytest.mark.parametrize("output", ["numpy", "torch"])
def test_string_columns_are_lists_of_str_with_none_for_null(tmp_path, output):
    col = ["a", None, "é", "", None, "xyz"]
    pq.write_table(
        pa.table({"s": pa.array(col), "l": pa.array(col, pa.large_string())}),
        tmp_path / "x.parquet",
    )
    b = next(iter(ParquetStream(str(tmp_path / "x.parquet"), output=output, batch_size=6)))
    assert b["s"] == col and b["l"] == col and type(b["s"]) is list
    rows = list(ParquetStream(str(tmp_path / "x.parquet"), output=output, shuffle_buffer=0))
    assert [r["s"] for r in rows] == col


def test_no_nulls_numeric_batch_is_array(shard_factory):
    ss = shard_factory(num_shards=2, rows_per_shard=50, nulls=False)
    for out, typ in (("numpy", np.ndarray), ("torch", torch.Tensor)):
        for b in ParquetStream(ss.root, output=out, batch_size=8, columns=["label", "id"]):
            assert isinstance(b["label"], typ), f"{out}: label without nulls is {type(b['label'])}"
            assert isinstance(b["id"], typ)


# ------------------------------------------------------------------ batches


@pytest.mark.parametrize("drop_last", [False, True])
@pytest.mark.parametrize("bs", [1, 7, 64, 509, 510, 511, 5000])
def test_batch_sizes_and_epoch_boundaries(small, bs, drop_last):
    n = small.num_rows
    assert n == 510
    full = full_stream(
        small.root,
        dict(
            output="python", batch_size=bs, drop_last=drop_last, epochs=2, shuffle_buffer=7, seed=1
        ),
    )
    one = [bs] * (n // bs) + ([] if drop_last or n % bs == 0 else [n % bs])
    assert [len(b) for b in full] == one + one
    per = len(one)
    for e in range(2):
        ids = flat_ids(full[e * per : (e + 1) * per])
        assert len(set(ids)) == len(ids)
        if not drop_last:
            assert sorted(ids) == sorted(small.ids), f"batch crosses epoch boundary in epoch {e}"


def test_batches_unshuffled_are_consecutive(small):
    full = full_stream(small.root, dict(output="python", batch_size=64))
    assert flat_ids(full) == list(range(small.num_rows))
    assert full[1] == tuple(range(64, 128))


# ------------------------------------------------------------------- epochs


def test_endless_epochs(small):
    n = small.num_rows
    ds = ParquetStream(
        small.root, output="python", epochs=None, shuffle_buffer=7, seed=2, columns=["id"]
    )
    got = [r["id"] for r in itertools.islice(ds, 4 * n + 13)]
    eps = _epochs(got, n)
    assert len(eps) == 4
    for e in eps:
        assert sorted(e) == sorted(small.ids)
    assert len({tuple(e) for e in eps}) == 4
    fixed = full_stream(small.root, dict(output="python", epochs=4, shuffle_buffer=7, seed=2))
    assert got[: 4 * n] == fixed


def test_endless_batches(small):
    ds = ParquetStream(small.root, output="python", epochs=None, batch_size=100, columns=["id"])
    got = [tuple(b["id"]) for b in itertools.islice(ds, 20)]
    # 510 rows: 5 full batches + 1 of 10 per epoch; no batch crosses an epoch
    assert [len(b) for b in got] == ([100] * 5 + [10]) * 3 + [100] * 2


def test_set_epoch_selects_the_epoch(small):
    st = dict(output="python", shuffle_buffer=7, seed=5)
    n = small.num_rows
    three = full_stream(small.root, dict(st, epochs=3))
    for e in range(3):
        ds = make_ds(small.root, dict(st, epochs=1))
        ds.set_epoch(e)
        assert keys_of(ds, False) == three[e * n : (e + 1) * n], f"set_epoch({e})"
    ds = make_ds(small.root, dict(st, epochs=2))
    ds.set_epoch(1)
    assert keys_of(ds, False) == three[n:]


def test_set_epoch_resets_position(small):
    st = dict(output="python", shuffle_buffer=7, seed=5)
    ds = make_ds(small.root, st)
    e1 = make_ds(small.root, st)
    e1.set_epoch(1)
    want = keys_of(e1, False)
    it = iter(ds)
    take(it, 50)
    ds.set_epoch(1)
    assert keys_of(ds, False) == want


def test_reiterating_finished_pass_starts_again(small):
    for st in (
        dict(output="python", epochs=2),
        dict(output="python", shuffle_buffer=7, seed=1, batch_size=5, epochs=2),
    ):
        ds = make_ds(small.root, st)
        a = keys_of(ds, "batch_size" in st)
        b = keys_of(ds, "batch_size" in st)
        assert a == b
        assert len(a) > 0


def test_reiterating_after_set_epoch_pass_starts_at_that_epoch(small):
    st = dict(output="python", shuffle_buffer=7, seed=1)
    ds = make_ds(small.root, st)
    ds.set_epoch(2)
    a = keys_of(ds, False)
    b = keys_of(ds, False)  # "starts a new pass from its first epoch" = epoch 2
    assert a == b


# --------------------------------------------------------------- work split


@pytest.mark.parametrize("world", [2, 3, 7])
@pytest.mark.parametrize("buf", [0, 7])
def test_ranks_partition_every_epoch(small, world, buf):
    n = small.num_rows
    parts = []
    for r in range(world):
        s = full_stream(
            small.root,
            dict(
                output="python",
                rank=r,
                world_size=world,
                shuffle_buffer=buf,
                seed=9,
                epochs=2,
                even=None,
            ),
        )
        assert len(s) % 2 == 0
        parts.append(s)
    sizes = [len(p) // 2 for p in parts]
    assert max(sizes) - min(sizes) <= 1, f"slots not balanced: {sizes}"
    assert sum(sizes) == n
    for e in range(2):
        union = Counter()
        for p, sz in zip(parts, sizes, strict=True):
            union.update(p[e * sz : (e + 1) * sz])
        assert union == Counter(small.ids), f"epoch {e}: ranks don't partition the rows"
    if buf == 0:
        assert [x for p, sz in zip(parts, sizes, strict=True) for x in p[:sz]] == list(range(n)), (
            "unshuffled slots must be contiguous ranges in slot order"
        )


@pytest.mark.parametrize("even", ["drop", "pad"])
@pytest.mark.parametrize("world", [2, 3, 7])
def test_even_policies_equalize_ranks(small, world, even):
    """even="drop": every rank yields n // world rows per epoch, none twice, < world missing.
    even="pad": every rank yields ceil(n / world), all rows present, < world repeated."""
    n = small.num_rows
    per_rank = []
    for r in range(world):
        ids = flat_ids(
            keys_of(
                make_ds(
                    small.root,
                    dict(
                        output="python",
                        rank=r,
                        world_size=world,
                        shuffle_buffer=11,
                        seed=4,
                        batch_size=4,
                        even=even,
                    ),
                ),
                True,
            )
        )
        per_rank.append(ids)
    want = n // world if even == "drop" else -(-n // world)
    assert [len(p) for p in per_rank] == [want] * world
    union = Counter(i for p in per_rank for i in p)
    if even == "drop":
        assert max(union.values()) == 1 and set(union) <= set(small.ids)
        assert n - len(union) < world
    else:
        assert set(union) == set(small.ids)
        assert sum(union.values()) - n < world


def test_rank_defaults_from_env(small, monkeypatch):
    monkeypatch.setenv("RANK", "1")
    monkeypatch.setenv("WORLD_SIZE", "2")
    env = full_stream(small.root, dict(output="python"))
    monkeypatch.delenv("RANK")
    monkeypatch.delenv("WORLD_SIZE")
    explicit = full_stream(small.root, dict(output="python", rank=1, world_size=2))
    assert env == explicit
    assert env != full_stream(small.root, dict(output="python"))


def test_torch_iterable_dataset_subclass(small):
    assert isinstance(ParquetStream(small.root), torch.utils.data.IterableDataset)


def test_rank_defaults_from_torch_distributed_over_env(small, tmp_path, monkeypatch):
    import torch.distributed as dist

    monkeypatch.setenv("RANK", "1")
    monkeypatch.setenv("WORLD_SIZE", "2")
    dist.init_process_group("gloo", init_method=f"file://{tmp_path}/pg", rank=0, world_size=1)
    try:
        got = full_stream(small.root, dict(output="python"))
    finally:
        dist.destroy_process_group()
    assert got == list(range(small.num_rows)), "torch.distributed (rank 0 of 1) must win over env"


def test_source_dedup_of_equivalent_spellings(small):
    p = sorted(small.paths)[0]
    root = os.path.dirname(p)
    odd = os.path.join(root, "..", os.path.basename(root), os.path.basename(p))
    ds = ParquetStream([p, odd], output="python", columns=["id"])
    assert ds.shards == [p]
    assert [r["id"] for r in ds] == all_ids([p])


@pytest.mark.timeout(120)
def test_abandoned_iterators_do_not_leak_or_disturb(small):
    st = dict(output="python", batch_size=5, shuffle_buffer=7, seed=1)
    ds = make_ds(small.root, st)
    full = keys_of(ds, True)
    for i in range(40):
        it = iter(ds)
        for _ in range(i % 4):
            next(it)
        del it
    assert keys_of(make_ds(small.root, st), True) == full


@pytest.mark.parametrize("batch_size", [5, None])
def test_iterator_and_dataset_are_collected_together(small, batch_size):
    """The iterator holds its dataset and the dataset its newest iterator (in batch mode a Rust
    object, which reports what it holds to the garbage collector): dropped, both go."""
    import gc
    import weakref

    ds = make_ds(small.root, dict(output="arrow", batch_size=batch_size, readahead_threads=1))
    it = iter(ds)
    next(it)
    refs = [weakref.ref(ds), weakref.ref(it)]
    del ds, it
    gc.collect()
    assert [r() for r in refs] == [None, None]


@pytest.mark.parametrize("batch_size", [4, None])
@pytest.mark.parametrize("output", ["arrow", "python"])
def test_stale_iterator_in_either_mode(small, batch_size, output):
    """Batch mode iterates in Rust, row mode in Python: both refuse once a newer iterator exists,
    stay finished, and the newer one continues after the older one's last item."""
    st = dict(output=output, batch_size=batch_size, columns=["id"])
    batched = batch_size is not None
    full = keys_of(make_ds(small.root, st), batched)
    ds = make_ds(small.root, st)
    it1 = iter(ds)
    head = keys_of(take(it1, 3), batched)
    it2 = iter(ds)
    assert it1.started and not it2.started and not it1.ended
    stale = r"stale: the same ParquetStream has been iterated again or given another position"
    with pytest.raises(RuntimeError, match=stale):
        next(it1)
    assert it1.ended
    with pytest.raises(StopIteration):
        next(it1)
    assert head + keys_of(it2, batched) == full
    assert it2.ended
    with pytest.raises(StopIteration):
        next(it2)


def test_state_dict_before_iterating_an_elastic_load(small):
    """After loading every rank's state into another layout, state_dict() before the first
    next() is this rank's share: resuming from it gives exactly what iterating would, and
    old + new ranks yield every row exactly once."""
    s = dict(output="python", batch_size=6, shuffle_buffer=9, seed=2, even=None)
    seen = Counter()
    states = []
    for r in range(2):
        ds = make_ds(small.root, dict(s, rank=r, world_size=2))
        seen.update(flat_ids(keys_of(take(iter(ds), 7 + 4 * r), True)))
        states.append(ds.state_dict())
    for r in range(3):
        a = make_ds(small.root, dict(s, rank=r, world_size=3))
        a.load_state_dict(states)
        b = make_ds(small.root, dict(s, rank=r, world_size=3))
        b.load_state_dict(a.state_dict())
        rest = keys_of(a, True)
        assert keys_of(b, True) == rest
        seen.update(flat_ids(rest))
    assert seen == Counter(small.ids)
