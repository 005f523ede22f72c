"""Arrow IPC shards (files and streams, HF `datasets` directories): the same rows as pyarrow
reads, exact resume through the shared harness, workers, fingerprints, bad input."""

from __future__ import annotations

import gc
import os
import pickle
import time
from pathlib import Path

import numpy as np
import pyarrow as pa
import pyarrow.parquet as pq
import pytest
from harness import check_resume, full_stream, keys_of, torch_roundtrip
from shardstream import ParquetStream, SchemaError, ShardError, ShardsChangedError
from torchdata.stateful_dataloader import StatefulDataLoader

# record batch sizes per shard: an empty batch, uneven ones, a one-row one
LAYOUT = [[7, 0, 13, 5], [20], [3, 9, 1, 11]]
KINDS = ["file", "stream"]
COMPRESSIONS = [None, "lz4", "zstd"]
DICT = pa.array(["L0", "L1", "L2"])


def _table(first: int, n: int) -> pa.Table:
    ids = np.arange(first, first + n, dtype=np.int64)
    tokens = pa.array([[int(i) + k for k in range(i % 5)] for i in ids], pa.list_(pa.int32()))
    text = pa.array([f"row-{i}" for i in ids], pa.large_string())
    label = pa.DictionaryArray.from_arrays(pa.array(ids % 3, pa.int32()), DICT)
    return pa.table({"id": ids, "tokens": tokens, "text": text, "label": label})


def write_ipc(path, batches: list[pa.RecordBatch], kind: str, compression=None) -> str:
    schema = batches[0].schema
    opts = pa.ipc.IpcWriteOptions(compression=compression)
    sink = pa.OSFile(str(path), "wb")
    w = (pa.ipc.new_file if kind == "file" else pa.ipc.new_stream)(sink, schema, options=opts)
    for b in batches:
        w.write_batch(b)
    w.close()
    sink.close()
    return str(path)


def write_set(root, kind: str, compression=None, layout=LAYOUT, ext=None) -> list[str]:
    os.makedirs(root, exist_ok=True)
    ext = ext or ("arrow" if kind == "file" else "arrows")
    first, paths = 0, []
    for s, sizes in enumerate(layout):
        batches = []
        for n in sizes:
            batches += _table(first, n).to_batches(max_chunksize=n) if n else [_empty()]
            first += n
        paths.append(write_ipc(os.path.join(root, f"s{s:03d}.{ext}"), batches, kind, compression))
    return paths


def _empty() -> pa.RecordBatch:
    t = _table(0, 1)
    return pa.RecordBatch.from_arrays([c.chunk(0)[:0] for c in t.columns], schema=t.schema)


@pytest.fixture(scope="module", params=[(k, c) for k in KINDS for c in COMPRESSIONS])
def ipc_set(request, tmp_path_factory):
    kind, comp = request.param
    root = tmp_path_factory.mktemp(f"ipc-{kind}-{comp}")
    return root, write_set(root, kind, comp)


def pyarrow_rows(paths) -> list[dict]:
    rows = []
    for p in paths:
        with open(p, "rb") as f:
            magic = f.read(6)
        if magic == b"ARROW1":
            r = pa.ipc.open_file(p)
            batches = [r.get_batch(i) for i in range(r.num_record_batches)]
        else:
            batches = list(pa.ipc.open_stream(p))
        for b in batches:
            rows.extend(b.to_pylist())
    return rows


def test_rows_and_values_are_pyarrows(ipc_set):
    root, paths = ipc_set
    ds = ParquetStream(str(root), output="python")
    assert list(ds.shards) == paths
    got = list(ds)
    assert got == pyarrow_rows(paths)
    assert [r["id"] for r in got] == list(range(sum(map(sum, LAYOUT))))


def test_batch_layout_is_the_units(ipc_set):
    """Every record batch is one unit: without a shuffle, an arrow batch never spans two."""
    root, _ = ipc_set
    ds = ParquetStream(str(root), output="arrow", batch_size=100, shuffle_buffer=0)
    ids = [i for b in ds for i in b.column("id").to_pylist()]
    assert ids == list(range(sum(map(sum, LAYOUT))))


RESUME = [
    dict(output="python", epochs=2),
    dict(output="python", shuffle_buffer=7, seed=1, epochs=2),
    dict(output="torch", batch_size=5, shuffle_buffer=30, seed=2, epochs=2),
    dict(output="arrow", batch_size=8, drop_last=True, epochs=2),
]


@pytest.mark.parametrize("settings", RESUME, ids=lambda s: str(sorted(s.items())))
def test_resume(ipc_set, settings):
    root, _ = ipc_set
    check_resume(str(root), settings, max_boundary_points=8, n_random=2)


@pytest.fixture(scope="module")
def plain_file_set(tmp_path_factory):
    root = tmp_path_factory.mktemp("ipc-plain")
    return root, write_set(root, "file")


@pytest.mark.parametrize("num_workers", [0, 2])
def test_stateful_dataloader_workers_resume(plain_file_set, num_workers):
    root, _ = plain_file_set

    def loader():
        ds = ParquetStream(str(root), batch_size=4, shuffle_buffer=9, seed=3, output="torch")
        return StatefulDataLoader(ds, batch_size=None, num_workers=num_workers)

    def key(b):
        return tuple(b["id"].tolist())

    full = [key(b) for b in loader()]
    assert sorted(i for b in full for i in b) == list(range(sum(map(sum, LAYOUT))))
    for k in (1, len(full) // 2, len(full) - 1):
        ld = loader()
        it = iter(ld)
        head = [key(next(it)) for _ in range(k)]
        state = torch_roundtrip(ld.state_dict())
        ld2 = loader()
        ld2.load_state_dict(state)
        assert head + [key(b) for b in ld2] == full, f"k={k}"


def test_pickled_dataset_continues(plain_file_set):
    root, _ = plain_file_set
    settings = dict(output="python", shuffle_buffer=5, seed=4)
    full = full_stream(str(root), settings)
    ds = ParquetStream(str(root), **settings)
    it = iter(ds)
    head = [next(it)["id"] for _ in range(17)]
    ds2 = pickle.loads(pickle.dumps(ds))
    assert head + keys_of(ds2, False) == full


def test_ranks_split_every_row_once(plain_file_set):
    root, _ = plain_file_set
    got = []
    for r in range(3):
        got += [x["id"] for x in ParquetStream(str(root), rank=r, world_size=3, output="python")]
    assert sorted(got) == list(range(sum(map(sum, LAYOUT))))


def test_map_style_rows_by_index(ipc_set):
    """ParquetRows (random access) over IPC shards: any rows, any order, pyarrow's values."""
    from shardstream import ParquetRows

    root, paths = ipc_set
    want = pyarrow_rows(paths)
    ds = ParquetRows(str(root), output="arrow")
    idx = [len(want) - 1, 0, 17, 3, 40, 17]
    assert ds.arrow(idx).to_pylist() == [want[i] for i in idx]


@pytest.mark.parametrize("block_size", [None, 4])
def test_map_style_global_shuffle_over_ranks_is_pyarrow_rows(ipc_set, block_size):
    """A ResumableSampler epoch over 2 ranks (global shuffle, and block order), fetched in
    batches of 7 through __getitems__ + collate: every row once, each pyarrow's row at its
    index (across shards, empty and one-row batches, dictionaries, large_string)."""
    from shardstream import ParquetRows, ResumableSampler

    root, paths = ipc_set
    want = pyarrow_rows(paths)
    ds = ParquetRows(str(root), output="arrow")
    assert len(ds) == len(want)
    seen = []
    for rank in range(2):
        order = list(
            ResumableSampler(ds, seed=5, block_size=block_size, rank=rank, world_size=2, even=None)
        )
        for i in range(0, len(order), 7):
            idx = order[i : i + 7]
            assert ParquetRows.collate(ds.__getitems__(idx)).to_pylist() == [want[j] for j in idx]
        seen += order
    assert sorted(seen) == list(range(len(want)))


def test_format_is_found_by_magic_not_extension(tmp_path):
    a = write_set(tmp_path / "a", "stream", ext="bin")
    b = write_set(tmp_path / "b", "file", ext="data")
    want = list(range(sum(map(sum, LAYOUT))))
    assert [r["id"] for r in ParquetStream(a, output="python")] == want
    assert [r["id"] for r in ParquetStream(b, output="python")] == want


def test_walk_picks_up_ipc_extensions(tmp_path):
    for i, ext in enumerate(["arrow", "feather", "arrows", "ipc"]):
        first = i * 10
        write_ipc(tmp_path / f"p{i}.{ext}", _table(first, 10).to_batches(), "file")
    (tmp_path / "_skip.arrow").write_bytes(b"junk")
    ds = ParquetStream(str(tmp_path), output="python")
    assert [r["id"] for r in ds] == list(range(40))


def test_parquet_and_ipc_of_the_same_rows_give_the_same_stream(tmp_path):
    """One batch per row group: the plan, shuffle and state are the same, only the reader
    differs, so the streams (shuffled) are identical."""
    t = _table(0, 60)
    pq.write_table(t, tmp_path / "p.parquet", row_group_size=12)
    write_ipc(tmp_path / "i.arrow", t.to_batches(max_chunksize=12), "file")
    settings = dict(output="python", shuffle_buffer=11, seed=9, epochs=2)
    a = full_stream(str(tmp_path / "p.parquet"), settings)
    b = full_stream(str(tmp_path / "i.arrow"), settings)
    assert a == b


def test_fingerprint_names_a_changed_ipc_shard(tmp_path):
    paths = write_set(tmp_path, "stream")
    ds = ParquetStream(str(tmp_path), output="python", shuffle_buffer=3)
    it = iter(ds)
    next(it)
    state = ds.state_dict()
    # rewrite shard 1 with other batch sizes (same rows)
    b = _table(13 + 12, 20)
    write_ipc(paths[1], b.to_batches(max_chunksize=6), "stream")
    ds2 = ParquetStream(str(tmp_path), output="python", shuffle_buffer=3)
    with pytest.raises(ShardsChangedError, match="s001.arrows"):
        ds2.load_state_dict(state)


@pytest.mark.parametrize("how", ["replaced", "appended"])
def test_ipc_file_changed_mid_iteration_is_shard_error(tmp_path, how):
    """A local IPC file stays mapped between its batches: one replaced by another file (renamed
    over it) or grown in place after the first batch was read is still named at the next
    batch, as when every batch mapped the file afresh."""
    path = write_ipc(tmp_path / "a.arrow", _table(0, 30).to_batches(max_chunksize=5), "file")
    ds = ParquetStream(path, output="arrow", batch_size=5, shuffle_buffer=0, readahead_threads=0)
    it = iter(ds)
    assert next(it).column("id").to_pylist() == list(range(5))
    if how == "replaced":
        other = write_ipc(tmp_path / "b.tmp", _table(100, 30).to_batches(max_chunksize=5), "file")
        os.replace(other, path)
    else:
        with open(path, "ab") as f:
            f.write(b"\0" * 8)
    with pytest.raises(ShardError, match=r"a\.arrow.*the file changed while the dataset was open"):
        list(it)


def test_ipc_file_rewritten_between_passes_is_shard_error(tmp_path):
    """Batches validated in one pass are not validated again in the next while the file is
    unchanged; a file rewritten in place between passes (same size, its bytes scrambled) is
    named at the next pass's first batch, never read as already validated."""
    path = write_ipc(tmp_path / "a.arrow", _table(0, 30).to_batches(max_chunksize=5), "file")
    ds = ParquetStream(path, output="arrow", batch_size=5, shuffle_buffer=0, readahead_threads=0)
    ids = [b.column("id").to_pylist() for b in ds]
    assert ids == [list(range(i, i + 5)) for i in range(0, 30, 5)]
    assert [b.column("id").to_pylist() for b in ds] == ids  # the second pass, validated before
    with open(path, "rb") as f:
        data = bytearray(f.read())
    for i in range(8, len(data) - 10):
        data[i] ^= 0x5A
    with open(path, "r+b") as f:
        f.write(data)
    st = os.stat(path)  # (a coarse clock could leave the modification time as it was)
    os.utime(path, ns=(st.st_atime_ns, st.st_mtime_ns + 1_000_000_000))
    with pytest.raises(ShardError, match=r"a\.arrow.*the file changed while the dataset was open"):
        list(ds)


def _ok_file(tmp_path, kind="file", comp=None):
    return write_ipc(tmp_path / f"x.{kind}", _table(0, 30).to_batches(max_chunksize=10), kind, comp)


@pytest.mark.parametrize("kind", KINDS)
def test_truncated_files_are_shard_errors_naming_them(tmp_path, kind):
    path = _ok_file(tmp_path, kind)
    data = Path(path).read_bytes()
    for cut in (len(data) - 3, len(data) // 2, 9, 5):
        bad = tmp_path / f"cut{cut}.bin"
        bad.write_bytes(data[:cut])
        with pytest.raises(ShardError, match=f"cut{cut}.bin"):
            list(ParquetStream(str(bad), output="python"))


@pytest.mark.parametrize("kind", KINDS)
def test_byte_flips_never_crash(tmp_path, kind):
    """Every byte of the metadata and a sample of the body flipped: a ShardError or the
    rows (a flip in column data may decode), never a crash or hang."""
    path = _ok_file(tmp_path, kind, "lz4")
    data = bytearray(Path(path).read_bytes())
    rng = np.random.default_rng(0)
    spots = sorted(set(range(0, min(len(data), 400), 3)) | set(range(len(data) - 200, len(data))))
    spots += list(rng.integers(0, len(data), 40))
    for n, i in enumerate(spots):
        d = bytearray(data)
        d[i] ^= 0xA5
        # a new file per case: a mapped file truncated in place (write_bytes) while an
        # earlier, failed reader's readahead thread still reads it would be SIGBUS
        bad = tmp_path / f"flip{n}.bin"
        bad.write_bytes(bytes(d))
        try:
            list(ParquetStream(str(bad), output="python"))
        except (ShardError, SchemaError) as e:  # noqa: PERF203
            assert f"flip{n}.bin" in str(e), (i, str(e))


@pytest.mark.parametrize("deltas", [False, True])
def test_replacement_and_delta_dictionaries_mid_stream(tmp_path, deltas):
    """Each batch has its own dictionary: replacement (or delta) dictionary messages between
    batches; every batch decodes with the dictionary in force at it, also after a resume."""
    batches = []
    for b in range(6):
        words = (
            [f"w{b}-{k}" for k in range(b + 1)] if not deltas else [f"w{k}" for k in range(b + 2)]
        )
        idx = pa.array([k % len(words) for k in range(5)], pa.int32())
        lab = pa.DictionaryArray.from_arrays(idx, pa.array(words))
        ids = pa.array(np.arange(b * 5, b * 5 + 5, dtype=np.int64))
        batches.append(pa.RecordBatch.from_arrays([ids, lab], names=["id", "label"]))
    path = tmp_path / "d.arrows"
    opts = pa.ipc.IpcWriteOptions(emit_dictionary_deltas=deltas)
    with pa.ipc.new_stream(str(path), batches[0].schema, options=opts) as w:
        for b in batches:
            w.write_batch(b)
    want = [r for b in batches for r in b.to_pylist()]
    assert list(ParquetStream(str(path), output="python")) == want
    # the pickled catalog (what spawned workers get) carries the dictionary index too
    ds = ParquetStream(str(path), output="python")
    assert list(pickle.loads(pickle.dumps(ds))) == want
    check_resume(str(path), dict(output="python", shuffle_buffer=4, seed=1), n_random=2)


def test_mismatched_schemas_are_schema_errors(tmp_path):
    write_ipc(tmp_path / "a.arrow", _table(0, 5).to_batches(), "file")
    t = pa.table({"id": pa.array(["x"] * 5)})
    write_ipc(tmp_path / "b.arrow", t.to_batches(), "file")
    with pytest.raises(SchemaError, match="b.arrow"):
        ParquetStream(str(tmp_path))


def test_sidecar_indexes_streams_and_gives_the_same_stream(tmp_path):
    from shardstream.cli import main

    write_set(tmp_path, "stream", "zstd")
    settings = dict(output="python", shuffle_buffer=5, seed=2)
    want = full_stream(str(tmp_path), settings)
    fp = ParquetStream(str(tmp_path)).state_dict()
    assert main(["index", str(tmp_path)]) == 0
    assert (tmp_path / "_shardstream_index.json").exists()
    assert full_stream(str(tmp_path), settings) == want
    assert ParquetStream(str(tmp_path)).state_dict()["fingerprint"] == fp["fingerprint"]


# ------------------------------------------------------------ HF datasets directories


def _hf_dataset(n: int):
    import datasets

    return datasets.Dataset.from_dict(
        {
            "id": list(range(n)),
            "text": [f"text {i}" for i in range(n)],
            "tokens": [list(range(i % 7)) for i in range(n)],
            "score": [i / 3 for i in range(n)],
            "meta": [{"a": i, "b": str(i)} for i in range(n)],
        }
    )


@pytest.fixture(scope="module")
def hf_dir(tmp_path_factory):
    root = tmp_path_factory.mktemp("hf")
    _hf_dataset(2600).shuffle(seed=0).save_to_disk(str(root), num_shards=4)
    return root


def _load_from_disk(path):
    import datasets

    datasets.disable_progress_bars()
    return datasets.load_from_disk(str(path))


def test_save_to_disk_dir_gives_load_from_disks_rows(hf_dir):
    want = list(_load_from_disk(hf_dir))
    got = list(ParquetStream(str(hf_dir), output="python"))
    assert got == want
    assert [os.path.basename(p) for p in ParquetStream(str(hf_dir)).shards] == [
        f"data-{i:05d}-of-00004.arrow" for i in range(4)
    ]


def test_save_to_disk_dir_follows_state_json_order(tmp_path):
    import json

    _hf_dataset(300).save_to_disk(str(tmp_path), num_shards=3)
    state = json.loads((tmp_path / "state.json").read_text())
    state["_data_files"] = state["_data_files"][::-1]  # not the sorted order
    (tmp_path / "state.json").write_text(json.dumps(state))
    want = [r["id"] for r in _load_from_disk(tmp_path)]
    assert want != sorted(want)
    assert [r["id"] for r in ParquetStream(str(tmp_path), output="python")] == want


@pytest.mark.parametrize(
    "settings",
    [dict(output="python", shuffle_buffer=50, seed=1), dict(output="numpy", batch_size=64)],
    ids=["rows-shuffled", "batches"],
)
def test_save_to_disk_dir_resumes_exactly(hf_dir, settings):
    check_resume(str(hf_dir), dict(settings, columns=["id", "tokens"]), max_boundary_points=6)


def test_load_dataset_cache_dir_of_one_split(tmp_path):
    """A `load_dataset` cache: `<name>-train-0000x-of-0000n.arrow` files and dataset_info.json."""
    import datasets

    datasets.disable_progress_bars()
    src = tmp_path / "src"
    src.mkdir()
    for i in range(3):
        pq.write_table(_hf_dataset(100 * (i + 1)).data.table.slice(0), src / f"p{i}.parquet")
    ds = datasets.load_dataset(
        "parquet", data_files=sorted(str(p) for p in src.iterdir()), cache_dir=str(tmp_path / "c")
    )["train"]
    files = [f["filename"] for f in ds.cache_files]
    cache = os.path.dirname(files[0])
    arrows = [p for p in os.listdir(cache) if p.endswith(".arrow")]
    assert arrows and all("train" in p for p in arrows)
    got = [r["id"] for r in ParquetStream(cache, output="python")]
    assert got == [r["id"] for r in ds]


def _json_load_dataset(tmp_path, splits: dict[str, int]):
    """`load_dataset("json", ...)` of one JSON Lines file per split, cached under tmp_path/c;
    returns the DatasetDict and its cache directory."""
    import json

    import datasets

    datasets.disable_progress_bars()
    files = {}
    for split, n in splits.items():
        p = tmp_path / f"{split}.jsonl"
        rows = (json.dumps({"id": i, "text": f"{split} {i}"}) + "\n" for i in range(n))
        p.write_text("".join(rows))
        files[split] = str(p)
    dd = datasets.load_dataset("json", data_files=files, cache_dir=str(tmp_path / "c"))
    return dd, os.path.dirname(next(iter(dd.values())).cache_files[0]["filename"])


def test_load_dataset_cache_dir_skips_map_and_filter_caches(tmp_path):
    """`.map()` / `.filter()` write `cache-<fingerprint>.arrow` files (`cache-…_0000k_of_0000n`
    with num_proc) beside the split's files: they are not the split's rows."""
    dd, cache = _json_load_dataset(tmp_path, {"train": 300})
    train = dd["train"]
    want = [r["id"] for r in train]

    def check(n_caches):
        caches = [n for n in os.listdir(cache) if n.startswith("cache-") and n.endswith(".arrow")]
        assert len(caches) == n_caches, caches
        for src in (cache, Path(cache).as_uri() + "/"):
            ds = ParquetStream(src, output="python")
            assert [os.path.basename(s) for s in ds.shards] == ["json-train.arrow"], src
            assert [r["id"] for r in ds] == want, src

    train.map(lambda r: {"id": r["id"] + 10_000, "text": "mapped"})  # same schema, other rows
    check(1)
    train.filter(lambda r: r["id"] % 3 == 0)  # an indices mapping
    train.map(lambda r: {"id": -r["id"]}, num_proc=2)
    check(4)


def test_load_dataset_cache_dir_of_several_splits_asks_for_one(tmp_path):
    """Reading train and test of one cache directory as one stream would mix them: the
    directory is refused, naming its splits and a glob that names one."""
    dd, cache = _json_load_dataset(tmp_path, {"train": 40, "test": 15})
    dd["train"].map(lambda r: {"id": r["id"] + 10_000})
    for src in (cache, Path(cache).as_uri()):
        with pytest.raises(ValueError, match=r"splits test, train.*its file, .*/json-train\.arrow"):
            ParquetStream(src)
        for split in ("train", "test"):
            ds = ParquetStream(f"{src}/json-{split}*.arrow", output="python")
            assert [r["id"] for r in ds] == [r["id"] for r in dd[split]], (src, split)
    # the same directory walked from a parent directory is refused the same way
    with pytest.raises(ValueError, match=r"splits test, train"):
        ParquetStream(str(tmp_path / "c"))


def test_save_to_disk_directory_below_a_walked_one_skips_map_caches(tmp_path):
    """A save_to_disk directory whose loaded dataset had .map() run holds a cache-*.arrow
    beside its data: named itself it reads state.json's files; reached by walking a parent
    directory (or a parent prefix) the cache was read as data too (twice the rows)."""
    import datasets

    split = tmp_path / "sd" / "train"
    datasets.Dataset.from_dict({"id": list(range(40))}).save_to_disk(str(split))
    datasets.load_from_disk(str(split)).map(lambda r: {"id": r["id"] + 10_000})
    assert any(n.startswith("cache-") for n in os.listdir(split))
    for src in (str(split), str(tmp_path / "sd"), (tmp_path / "sd").as_uri() + "/"):
        assert [r["id"] for r in ParquetStream(src, output="python")] == list(range(40)), src


def test_dataset_dict_directory_asks_for_one_split(tmp_path):
    """A DatasetDict.save_to_disk directory holds one directory per split: read whole, train
    and test were one mixed stream (every split's rows, silently). It is refused naming its
    splits and one split's directory, locally, over file:// and walked from a parent; a split's
    directory reads exactly that split, in state.json's order."""
    from datasets import Dataset, DatasetDict

    root = tmp_path / "p" / "dd"
    dd = DatasetDict(
        {
            "train": Dataset.from_dict({"id": list(range(30))}),
            "test": Dataset.from_dict({"id": list(range(100, 112))}),
        }
    )
    dd.save_to_disk(str(root))
    for src in (str(root), root.as_uri()):
        with pytest.raises(ValueError, match=rf"DatasetDict.*splits test, train.*{src}/train$"):
            ParquetStream(src)
        for split in ("train", "test"):
            ds = ParquetStream(f"{src}/{split}", output="python")
            assert [r["id"] for r in ds] == dd[split]["id"], (src, split)
    with pytest.raises(ValueError, match=r"DatasetDict.*splits test, train"):
        ParquetStream(str(tmp_path / "p"))


def test_inspect_describes_ipc_shards(plain_file_set, capsys):
    import json

    from shardstream.cli import main

    root, paths = plain_file_set
    assert main(["inspect", str(root), "--json"]) == 0
    info = json.loads(capsys.readouterr().out)
    assert [s["format"] for s in info["shards"]] == ["ipc-file"] * len(paths)
    assert [[rg["rows"] for rg in s["row_groups"]] for s in info["shards"]] == LAYOUT
    r = info["resume"]
    assert r["verdict"] == "fast" and r["shards_without_page_index"] == []
    assert any("Arrow IPC" in a and "20 rows" in a for a in r["advice"]), r["advice"]


def test_bad_state_json_is_a_clear_error(tmp_path):
    import json

    _hf_dataset(50).save_to_disk(str(tmp_path), num_shards=2)
    good = json.loads((tmp_path / "state.json").read_text())
    (tmp_path / "state.json").write_text(
        json.dumps({**good, "_indices_data_files": [{"filename": "indices.arrow"}]})
    )
    with pytest.raises(ValueError, match=r"state\.json.*flatten_indices"):
        ParquetStream(str(tmp_path))
    missing = {**good, "_data_files": [*good["_data_files"], {"filename": "data-9.arrow"}]}
    (tmp_path / "state.json").write_text(json.dumps(missing))
    with pytest.raises(FileNotFoundError, match=r"data-9\.arrow"):
        ParquetStream(str(tmp_path))


def _read_threads() -> int:
    """Readahead threads alive in this process (named ``shardstream-read-N``)."""
    n = 0
    for t in os.listdir("/proc/self/task"):
        try:
            with open(f"/proc/self/task/{t}/comm") as f:
                n += f.read().startswith("shardstream-rea")  # (comm: 15 characters)
        except FileNotFoundError:
            pass  # (a thread that just ended)
    return n


def _settled_read_threads() -> int:
    """``_read_threads()`` once threads of dropped iterators have exited (up to 10 s)."""
    gc.collect()
    deadline = time.monotonic() + 10
    n = _read_threads()
    while time.monotonic() < deadline:
        time.sleep(0.05)
        m = _read_threads()
        if m == n == 0 or (m == n and time.monotonic() > deadline - 9):
            return m
        n = m
    return n


@pytest.mark.skipif(not os.path.isdir("/proc/self/task"), reason="needs /proc")
@pytest.mark.parametrize("kind", KINDS)
@pytest.mark.parametrize("comp", COMPRESSIONS)
def test_uncompressed_local_shards_decode_in_the_caller(tmp_path, kind, comp):
    """readahead_threads=None: local uncompressed IPC shards are decoded in the caller (a batch
    is arrays over the mapped file: a thread's hand-off would cost more than the decode);
    compressed ones get readahead threads, and a count given is kept. Same rows every way."""
    # more batches than a readahead channel holds: a thread started is still there after one
    paths = write_set(tmp_path, kind, comp, layout=[[4] * 20, [3] * 10])
    want = [r["id"] for r in pyarrow_rows(paths)]
    for threads, started in ((None, comp is not None), (1, True)):
        before = _settled_read_threads()
        ds = ParquetStream(paths, batch_size=4, output="arrow", shuffle_buffer=0,
                           readahead_threads=threads)  # fmt: skip
        it = iter(ds)
        got = next(it).column("id").to_pylist()
        assert (_read_threads() > before) == started, (threads, comp)
        got += [i for b in it for i in b.column("id").to_pylist()]
        assert got == want
        del ds, it


@pytest.mark.parametrize("ext", ["arrow", "feather", "arrows", "ipc"])
def test_empty_or_non_ipc_file_named_as_ipc_is_reported_as_ipc(tmp_path, ext):
    """A 0-byte `.arrow` (a writer that died before its first write) is named as an Arrow IPC
    file that is empty, not as an unreadable Parquet file; so is one that is not IPC at all."""
    empty = tmp_path / f"empty.{ext}"
    empty.write_bytes(b"")
    for src in (str(empty), empty.as_uri()):
        with pytest.raises(
            ShardError, match=rf"empty\.{ext}: an empty file \(0 bytes\).*Arrow IPC"
        ):
            ParquetStream(src)
    junk = tmp_path / f"junk.{ext}"
    junk.write_bytes(b"not arrow at all, " * 10)
    for src in (str(junk), junk.as_uri()):
        with pytest.raises(ShardError, match=rf"junk\.{ext}: not an Arrow IPC file"):
            ParquetStream(src)
    # the magic decides, not the name: Parquet named .arrow is read as Parquet
    pq.write_table(_table(0, 5), tmp_path / f"pq.{ext}")
    got = ParquetStream(str(tmp_path / f"pq.{ext}"), output="python")
    assert [r["id"] for r in got] == list(range(5))
