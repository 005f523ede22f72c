"""Map-style access: ``ParquetRows`` (rows by index) and ``ResumableSampler`` (a global shuffle
with an O(1), elastic state).

Rows are checked against pyarrow's rows at the same indices (over the fixtures and the whole
reliability corpus, through the sampler's shuffled orders, across shards, with and without the
page cache). The sampler is checked by full index streams: every index exactly once per epoch
over ranks and DataLoader workers, identical continuation after a resume at many points,
elastic resumes on another number of ranks, and hostile states refused with ``StateError``.
"""

from __future__ import annotations

import copy
import itertools
import json
import os
import pickle
import shutil
import warnings
from collections import Counter
from typing import Any

import numpy as np
import pyarrow as pa
import pyarrow.parquet as pq
import pytest
import torch
from harness import del_path, pickle_roundtrip, set_path, torch_roundtrip, walk
from hypothesis import given
from hypothesis import strategies as st
from reliability.scripts import corpus
from reliability.scripts.corpus import _plain, canon, reference
from shardstream import ParquetRows, ParquetStream, ResumableSampler, StateError, collate
from shardstream.mapstyle import Rows

pytestmark = pytest.mark.timeout(600)


def table_of(paths: Any) -> pa.Table:
    return pa.concat_tables([pq.read_table(p) for p in paths])


class Ref:
    """pyarrow's rows of a table (``corpus.reference``: presentation-only type differences
    converted) as canonical Python values per column, taken by index in Python (pyarrow's
    ``take`` has no kernel for some types, e.g. ``string_view``)."""

    def __init__(self, table: pa.Table, schema: pa.Schema) -> None:
        ref = reference(table, schema)
        self.num_rows = ref.num_rows
        self.types = {f.name: f.type for f in ref.schema}
        self.values = {
            f.name: [canon(x) for x in ref.column(f.name).to_pylist()] for f in ref.schema
        }

    def check(self, got: pa.RecordBatch, idx: list[int], what: str) -> None:
        """``got`` holds exactly pyarrow's rows ``idx`` (NaN equal to NaN), column by column."""
        assert got.num_rows == len(idx), f"{what}: {got.num_rows} rows, want {len(idx)}"
        assert got.schema.names == list(self.values), f"{what}: columns {got.schema.names}"
        for f in got.schema:
            a = _plain(got.column(f.name))
            if a.type != self.types[f.name]:
                a = a.cast(self.types[f.name])
            ga = [canon(x) for x in a.to_pylist()]
            gb = [self.values[f.name][i] for i in idx]
            if ga != gb:
                i = next(i for i, (x, y) in enumerate(zip(ga, gb, strict=True)) if x != y)
                raise AssertionError(
                    f"{what}: column {f.name!r} item {i} (row {idx[i]}): got {str(ga[i])[:200]}, "
                    f"want {str(gb[i])[:200]}"
                )


def ids_of(batch: Any) -> list[int]:
    v = batch["id"]
    return v.tolist() if hasattr(v, "tolist") else list(v)


# ------------------------------------------------------------------------------ ParquetRows


CACHES = [0, 4096, 256 << 20]


@pytest.mark.parametrize("cache", CACHES, ids=["nocache", "tinycache", "cache"])
def test_rows_equal_pyarrow_at_shuffled_indices(small_any, cache):
    ds = ParquetRows(small_any.root, output="arrow", page_cache_bytes=cache)
    ref = Ref(table_of(small_any.paths), ds.schema)
    n = len(ds)
    assert n == ref.num_rows == small_any.num_rows
    order = list(ResumableSampler(n, seed=4))
    assert sorted(order) == list(range(n))
    # Batches of the shuffled order, then repeats, negatives and a block order (cache hits).
    for lo in range(0, n, 97):
        idx = order[lo : lo + 97]
        ref.check(ds.arrow(idx), idx, f"indices {lo}..")
    idx = [5, 5, n - 1, 0, 5]
    ref.check(ds.arrow([5, -5, -1, 0, 5]), [5, n - 5, n - 1, 0, 5], "negatives")
    block = list(ResumableSampler(n, seed=2, block_size=16, window=4))
    for lo in range(0, n, 64):
        ref.check(ds.arrow(block[lo : lo + 64]), block[lo : lo + 64], "blocks")
    ref.check(ds.arrow(idx), idx, "repeats")
    stats = ds.cache_stats()
    if cache == 0:
        assert stats == dict.fromkeys(stats, 0)
    else:
        assert 0 < stats["bytes"] <= cache or stats["uncached"] > 0
        assert stats["misses"] > 0


def test_cache_serves_repeated_pages(small):
    ds = ParquetRows(small.root, columns=["id", "tokens"], output="arrow")
    idx = list(range(40, 90))
    ds.arrow(idx)
    first = ds.cache_stats()
    assert first["misses"] > 0 and first["hits"] == 0
    ds.arrow(idx[::-1])
    second = ds.cache_stats()
    assert second["misses"] == first["misses"], "the same rows again must not decode a page"
    assert second["hits"] == first["misses"]


def test_special_layouts_and_many_shards(special, tiny):
    """Empty files, zero-row row groups, 40 tiny shards: indices cross every shard boundary."""
    for s in (special, tiny):
        for cache in (0, 1 << 20):
            ds = ParquetRows(s.root, output="arrow", page_cache_bytes=cache)
            ref = Ref(table_of(s.paths), ds.schema)
            idx = list(ResumableSampler(len(ds), seed=9))
            ref.check(ds.arrow(idx), idx, f"{s.root} cache={cache}")


OUTPUT_FORMATS = [(o, f) for o in ("torch", "numpy") for f in ("split", "offsets", "padded")] + [
    ("python", "split"),  # list_format applies to numpy/torch output only
    ("arrow", "split"),
]


@pytest.mark.parametrize("output,list_format", OUTPUT_FORMATS)
def test_outputs_are_the_streams(small, output, list_format):
    """``take`` gives what ParquetStream's batch mode gives for the same rows; ``ds[i]`` what
    its row mode gives."""
    kw = dict(
        columns=["id", "tokens", "text", "label", "cat"], output=output, list_format=list_format
    )
    ds = ParquetRows(small.root, **kw)
    stream = ParquetStream(small.root, batch_size=50, **kw)
    want = next(iter(stream))
    got = ds.take(range(50))
    assert_same(got, want)
    assert_same(ds[10:60], ds.take(list(range(10, 60))))
    rows = list(
        itertools.islice(iter(ParquetStream(small.root, **{**kw, "list_format": "split"})), 60)
    )
    dsr = ParquetRows(small.root, **{**kw, "list_format": "split"})
    for i in (0, 7, 59):
        assert_same(dsr[i], rows[i])


def assert_same(a: Any, b: Any) -> None:
    if isinstance(a, pa.RecordBatch):
        # Values and types; a dictionary column's dictionary may differ (the stream's row is
        # a slice of a batch that holds every page's dictionary).
        assert isinstance(b, pa.RecordBatch) and a.schema == b.schema
        assert a.to_pylist() == b.to_pylist()
    elif isinstance(a, dict):
        assert a.keys() == b.keys()
        for k in a:
            assert_same(a[k], b[k])
    elif isinstance(a, (list, tuple)):
        assert type(a) is type(b) and len(a) == len(b)
        for x, y in zip(a, b, strict=True):
            assert_same(x, y)
    elif isinstance(a, torch.Tensor):
        assert isinstance(b, torch.Tensor) and a.dtype == b.dtype and torch.equal(a, b)
    elif isinstance(a, np.ndarray):
        assert isinstance(b, np.ndarray) and a.dtype == b.dtype and np.array_equal(a, b)
    else:
        assert type(a) is type(b) and a == b, (a, b)


def test_indexing_forms_and_errors(small):
    ds = ParquetRows(small.root, columns=["id"], output="python")
    n = len(ds)
    ids = small.ids
    assert ds[0] == {"id": ids[0]} and ds[-1] == {"id": ids[-1]} and ds[n - 1] == ds[-1]
    assert ds[np.int64(3)] == {"id": ids[3]}
    assert ds[torch.tensor(4)] == {"id": ids[4]}
    assert ds[[3, 1, 3]] == {"id": [ids[3], ids[1], ids[3]]}
    assert ds[np.array([2, 0])] == {"id": [ids[2], ids[0]]}
    assert ds[torch.tensor([5, 6])] == {"id": [ids[5], ids[6]]}
    assert ds[n - 3 :] == {"id": ids[n - 3 :]}
    assert ds.take([]) == {"id": []}
    assert list(itertools.islice(iter(ds), 3)) == [{"id": i} for i in ids[:3]]
    for bad in (n, -n - 1, 10**30):
        with pytest.raises(IndexError, match="out of range"):
            ds[bad]
        with pytest.raises(IndexError, match="out of range"):
            ds.take([0, bad])
    for bad in (True, 1.0, "1", None):
        with pytest.raises(TypeError, match="index must be an int"):
            ds[bad]
    with pytest.raises(TypeError):
        ds.take([0, 1.5])
    assert sum(1 for _ in ds) == n  # the sequence protocol stops at IndexError


def test_getitems_rows_and_collate(small):
    ds = ParquetRows(small.root, columns=["id", "text"], output="torch")
    ids = small.ids
    rows = ds.__getitems__([4, 2, 9])
    assert isinstance(rows, Rows) and len(rows) == 3
    assert [int(r["id"]) for r in rows] == [ids[4], ids[2], ids[9]]
    assert int(rows[-1]["id"]) == ids[9]
    b = collate(rows)
    assert b["id"].tolist() == [ids[4], ids[2], ids[9]]
    assert ParquetRows.collate(rows)["id"].tolist() == b["id"].tolist()
    d = torch.utils.data.default_collate(ds.__getitems__([4, 2, 9]))
    assert d["id"].tolist() == b["id"].tolist()
    assert d["text"] == b["text"] == [f"row-{ids[i]}" for i in (4, 2, 9)]
    back = pickle.loads(pickle.dumps(rows))
    assert type(back) is list and [int(r["id"]) for r in back] == [ids[4], ids[2], ids[9]]
    assert collate([{"x": 1}, {"x": 2}])["x"].tolist() == [1, 2]  # anything else: default


def test_arguments_are_checked(small):
    with pytest.raises(ValueError, match="page_cache_bytes"):
        ParquetRows(small.root, page_cache_bytes=-1)
    with pytest.raises(ValueError, match="page_cache_bytes"):
        ParquetRows(small.root, page_cache_bytes=1 << 60)
    with pytest.raises(TypeError, match="page_cache_bytes"):
        ParquetRows(small.root, page_cache_bytes=True)
    with pytest.raises(ValueError, match="threads"):
        ParquetRows(small.root, threads=0)
    with pytest.raises(ValueError, match="output"):
        ParquetRows(small.root, output="jax")
    with pytest.raises(FileNotFoundError):
        ParquetRows(os.path.join(small.root, "nope"))


def test_pickles_without_its_reader(small, tmp_path):
    ds = ParquetRows(small.root, columns=["id"], output="python")
    assert ds[3]["id"] == small.ids[3]  # makes the reader in this process
    back = pickle.loads(pickle.dumps(ds))
    assert back._reader is None and back._catalog is None
    assert back[3] == ds[3] and len(back) == len(ds)
    # A shard set that changed between pickling and reading is refused.
    moved = tmp_path / "copy"
    shutil.copytree(small.root, moved)
    ds2 = ParquetRows(str(moved), columns=["id"], output="python")
    blob = pickle.dumps(ds2)
    os.remove(os.path.join(moved, sorted(os.listdir(moved))[0]))
    with pytest.raises((StateError, FileNotFoundError)):
        pickle.loads(blob)[0]


# ---------------------------------------------------------------- the whole reliability corpus


CASES = corpus.cases()


@pytest.fixture(scope="module")
def corpus_files(tmp_path_factory) -> dict[str, str]:
    return corpus.build_corpus(str(tmp_path_factory.mktemp("corpus")))


@pytest.mark.parametrize("name", [c.name for c in CASES])
def test_corpus_rows_at_shuffled_indices_across_shards(corpus_files, name, tmp_path):
    """Every corpus file written as two shards (the file twice): rows at the sampler's
    shuffled indices (global and block order, repeats) equal pyarrow's, with and without the
    page cache; row mode equals ``to_pylist()``."""
    path = corpus_files[name]
    for i in range(2):
        shutil.copy(path, tmp_path / f"part-{i}.parquet")
    ref_table = table_of([path, path])
    for cache in (0, 1 << 20):
        ds = ParquetRows(str(tmp_path), output="arrow", page_cache_bytes=cache)
        assert len(ds) == ref_table.num_rows
        ref = Ref(ref_table, ds.schema)
        n = len(ds)
        for order in (
            list(ResumableSampler(n, seed=1)),
            list(ResumableSampler(n, seed=2, block_size=7, window=3)),
        ):
            for lo in range(0, n, 64):
                idx = order[lo : lo + 64]
                ref.check(ds.arrow(idx), idx, f"{name} cache={cache} @{lo}")
        if n:
            idx = [n - 1, 0, n // 2, 0]
            ref.check(ds.arrow(idx), idx, f"{name} repeats")
    if ref_table.num_rows:
        py = ParquetRows(str(tmp_path), output="python")
        want = [canon(r) for r in reference(ref_table, py.schema).to_pylist()]
        for i in sorted({0, len(py) // 3, len(py) - 1}):
            assert canon(py[i]) == want[i], f"{name}: row {i}"


# ------------------------------------------------------------------------------ the sampler


AWKWARD = [0, 1, 2, 3, 5, 7, 13, 31, 32, 33, 127, 128, 129, 255, 257, 1021, 1023, 1024, 1025]


@pytest.mark.parametrize("n", AWKWARD)
def test_each_epoch_is_a_permutation(n):
    for kw in ({}, {"block_size": 5, "window": 3}, {"shuffle": False}):
        for epoch in (0, 1):
            s = ResumableSampler(n, seed=11, **kw)
            s.set_epoch(epoch)
            got = list(s)
            assert sorted(got) == list(range(n)), kw
            assert len(s) == n


def test_seeds_and_epochs_give_different_orders():
    def order(seed: int, epoch: int, **kw: Any) -> list[int]:
        s = ResumableSampler(500, seed=seed, **kw)
        s.set_epoch(epoch)
        return list(s)

    for kw in ({}, {"block_size": 10}):
        base = order(1, 0, **kw)
        assert base == order(1, 0, **kw)
        assert base != order(2, 0, **kw)
        assert base != order(1, 1, **kw)
        assert base != list(range(500))
    assert order(1, 0, shuffle=False) == list(range(500))


def rank_streams(n: int, world: int, epoch: int = 0, **kw: Any) -> list[list[int]]:
    out = []
    for r in range(world):
        s = ResumableSampler(n, rank=r, world_size=world, **kw)
        s.set_epoch(epoch)
        out.append(list(s))
    return out


@pytest.mark.parametrize("world", [1, 2, 3, 4])
@pytest.mark.parametrize("n", [0, 1, 10, 97, 128])
def test_ranks_split_every_epoch_by_the_even_policy(world, n):
    for epoch in (0, 3):
        none = rank_streams(n, world, epoch, seed=5, even=None)
        assert sorted(itertools.chain(*none)) == list(range(n))
        assert max(map(len, none)) - min(map(len, none)) <= 1
        drop = rank_streams(n, world, epoch, seed=5, even="drop")
        flat = list(itertools.chain(*drop))
        assert len(set(flat)) == len(flat) and n - len(flat) < world
        assert {len(d) for d in drop} == {n // world if world > 1 else n}
        pad = rank_streams(n, world, epoch, seed=5, even="pad")
        assert set(itertools.chain(*pad)) == set(range(n))
        assert {len(p) for p in pad} == ({-(-n // world)} if n else {0})


@pytest.mark.parametrize("kw", [{}, {"block_size": 8, "window": 2}, {"even": "pad"}])
@pytest.mark.parametrize("world", [1, 3])
def test_resume_continues_identically_at_many_points(world, kw):
    n = 211
    for r in range(world):
        full = list(ResumableSampler(n, seed=8, rank=r, world_size=world, **kw))
        s = ResumableSampler(n, seed=8, rank=r, world_size=world, **kw)
        it = iter(s)
        states = {0: s.state_dict()}
        for k in range(1, len(full) + 1):
            next(it)
            states[k] = s.state_dict()
        with pytest.raises(StopIteration):
            next(it)
        for k, state in states.items():
            use = (
                state,
                torch_roundtrip(state),
                pickle_roundtrip(state),
                json.loads(json.dumps(state)),
            )[k % 4]
            s2 = ResumableSampler(n, seed=8, rank=r, world_size=world, **kw)
            s2.load_state_dict(use)
            assert list(s2) == full[k:], f"rank {r} k={k}"
        # Resume twice, and resume a resumed run.
        k = len(full) // 3
        s3 = ResumableSampler(n, seed=8, rank=r, world_size=world, **kw)
        s3.load_state_dict(states[k])
        it3 = iter(s3)
        part = [next(it3) for _ in range(5)]
        s4 = ResumableSampler(n, seed=8, rank=r, world_size=world, **kw)
        s4.load_state_dict(s3.state_dict())
        assert full[:k] + part + list(s4) == full


@pytest.mark.parametrize("w1,w2", [(a, b) for a in (1, 2, 3, 4) for b in (1, 2, 3, 4)])
@pytest.mark.parametrize("stop", [0, 1, 13, 40])
def test_elastic_resume_reads_each_index_once(w1, w2, stop):
    """Ranks in step for ``stop`` indices each on ``w1`` ranks, then ``w2`` ranks continue
    from the states (all of them, or rank 0's alone): every index of the epoch exactly once."""
    n = 157
    for which in ("all", "rank0"):
        seen: list[int] = []
        states = []
        for r in range(w1):
            s = ResumableSampler(n, seed=3, rank=r, world_size=w1, even=None)
            s.set_epoch(2)
            seen += list(itertools.islice(iter(s), stop))
            states.append(torch_roundtrip(s.state_dict()))
        load = states if which == "all" else states[0]
        for r in range(w2):
            s = ResumableSampler(n, seed=3, rank=r, world_size=w2, even=None)
            s.load_state_dict(load)
            assert s.epoch == 2
            s.set_epoch(2)  # the loaded epoch: keeps the loaded position
            seen += list(s)
        assert sorted(seen) == list(range(n)), f"{which}: {Counter(seen).most_common(3)}"


def test_drop_and_pad_elastic_never_repeat_or_lose_more_than_a_step():
    n = 100
    for even in ("drop", "pad"):
        seen: list[int] = []
        states = []
        for r in range(3):
            s = ResumableSampler(n, seed=1, rank=r, world_size=3, even=even)
            seen += list(itertools.islice(iter(s), 10))
            states.append(s.state_dict())
        assert {st["position"] for st in states} == {30}
        rest = []
        for r in range(4):
            s = ResumableSampler(n, seed=1, rank=r, world_size=4, even=even)
            s.load_state_dict(states)
            rest.append(list(s))
        assert len({len(x) for x in rest}) == 1
        flat = seen + list(itertools.chain(*rest))
        if even == "drop":
            assert len(set(flat)) == len(flat) and n - len(flat) < 4
        else:
            assert set(flat) == set(range(n)) and len(flat) - n < 4


def test_dataloader_workers_and_ranks_read_each_row_once(small):
    """W x K = 1x0 ... 4x2: per rank a DataLoader over ParquetRows with the sampler, batches
    fetched by workers through ``__getitems__``; every row once per epoch, epochs differ."""
    ds = ParquetRows(small.root, columns=["id"], output="python")
    want = sorted(small.ids)
    for world, workers in [(1, 0), (1, 2), (2, 1), (3, 2), (4, 2)]:
        epochs = []
        for epoch in (0, 1):
            seen = []
            for r in range(world):
                s = ResumableSampler(ds, seed=6, rank=r, world_size=world, even=None)
                s.set_epoch(epoch)
                dl = torch.utils.data.DataLoader(
                    ds, batch_size=32, sampler=s, num_workers=workers, collate_fn=collate
                )
                seen += [i for b in dl for i in b["id"]]
            assert sorted(seen) == want, f"{world}x{workers} epoch {epoch}"
            epochs.append(seen)
        assert epochs[0] != epochs[1]


def test_sampler_order_is_what_the_loader_reads(small):
    ds = ParquetRows(small.root, columns=["id"], output="python")
    s = ResumableSampler(ds, seed=12, rank=1, world_size=2)
    order = list(s)
    dl = torch.utils.data.DataLoader(
        ds, batch_size=16, sampler=s, num_workers=2, collate_fn=collate
    )
    assert [i for b in dl for i in b["id"]] == [small.ids[i] for i in order]


# ---------------------------------------------------------------------- epochs, skips, errors


def test_set_epoch_keeps_or_discards_a_loaded_position():
    s = ResumableSampler(50, seed=1)
    s.set_epoch(3)
    it = iter(s)
    first = [next(it) for _ in range(7)]
    saved = s.state_dict()
    assert (saved["epoch"], saved["position"]) == (3, 7)
    s2 = ResumableSampler(50, seed=1)
    s2.load_state_dict(saved)
    s2.set_epoch(3)
    rest = list(s2)
    s3 = ResumableSampler(50, seed=1)
    s3.set_epoch(3)
    assert first + rest == list(s3)
    s4 = ResumableSampler(50, seed=1)
    s4.load_state_dict(saved)
    with pytest.warns(UserWarning, match="discards the position"):
        s4.set_epoch(4)
    assert s4.state_dict()["position"] == 0 and s4.epoch == 4
    # A loaded state at the end of its epoch: set_epoch moves on without a warning.
    end = dict(saved, position=50)
    s5 = ResumableSampler(50, seed=1)
    s5.load_state_dict(end)
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        s5.set_epoch(4)


def test_iterating_again_repeats_the_epoch_and_old_iterators_go_stale():
    s = ResumableSampler(20, seed=2)
    a = list(s)
    assert list(s) == a  # ran to the end: the same epoch again (as DistributedSampler)
    it = iter(s)
    part = [next(it) for _ in range(5)]
    it2 = iter(s)  # continues where the newest iterator stood
    assert part + list(it2) == a
    with pytest.raises(RuntimeError, match="stale"):
        next(it)
    s.set_epoch(1)
    assert list(s) != a and sorted(list(s)) == list(range(20))


def test_a_loaded_end_of_epoch_state_ends_the_pass_then_repeats_the_epoch():
    """As ParquetStream: loading the state of a finished pass gives an empty pass, then the
    same epoch again; set_epoch(loaded epoch) keeps that end (a set_epoch loop moves on), and
    an iterator made at the end counts as finished (torchdata's loader makes one after loading
    a finished pass, then a second, from which it expects a whole new pass)."""
    s = ResumableSampler(30, seed=4)
    s.set_epoch(2)
    full = list(s)
    end = s.state_dict()
    assert (end["epoch"], end["position"]) == (2, 30)
    t = ResumableSampler(30, seed=4)
    t.load_state_dict(end)
    assert list(t) == []
    assert list(t) == full
    u = ResumableSampler(30, seed=4)
    u.load_state_dict(end)
    u.set_epoch(2)
    assert list(u) == []
    u.set_epoch(3)
    assert sorted(list(u)) == list(range(30)) and list(u) != full
    v = ResumableSampler(30, seed=4)
    v.load_state_dict(end)
    iter(v)  # made at the end, never advanced
    assert list(v) == full
    # Not at the end: a second iterator continues where the first (unstarted) one stood.
    w = ResumableSampler(30, seed=4)
    w.load_state_dict(dict(end, position=10))
    iter(w)
    assert list(w) == full[10:]


def test_iterator_made_before_load_follows_it():
    """torchdata's loader makes the sampler's iterator, then loads the state: an iterator that
    has not started takes its start point at its first next()."""
    s = ResumableSampler(30, seed=4)
    full = list(s)
    t = ResumableSampler(30, seed=4)
    it = iter(t)
    state = dict(s.state_dict(), position=11)
    t.load_state_dict(state)
    assert list(it) == full[11:]


def test_skip_records_and_equals_reading_and_discarding():
    n, world = 120, 3
    for r in range(world):
        full = list(ResumableSampler(n, seed=5, rank=r, world_size=world))
        s = ResumableSampler(n, seed=5, rank=r, world_size=world)
        it = iter(s)
        head = [next(it) for _ in range(4)]
        s.skip(6)
        rest = list(it)
        assert head + rest == full[:4] + full[10:]
        st = s.state_dict()
        assert st["skips"] == [{"epoch": 0, "start": 12, "stop": 30}]
        # Before iterating: moves the start point.
        t = ResumableSampler(n, seed=5, rank=r, world_size=world)
        t.skip(3)
        assert list(t) == full[3:]
        assert t.state_dict()["skips"] == [{"epoch": 0, "start": 0, "stop": 9}]
    s = ResumableSampler(10, seed=1)
    s.skip(100)  # never past the epoch's end
    assert list(s) == [] and s.state_dict()["skips"][0]["stop"] == 10


def test_state_dict_consumed_for_prefetching_loaders():
    s = ResumableSampler(100, seed=3)
    full = list(ResumableSampler(100, seed=3))
    it = iter(s)
    for _ in range(40):
        next(it)  # a loader pulled 40 indices ahead ...
    st = s.state_dict(consumed=24)  # ... and the training loop received 24
    assert st["position"] == 24
    t = ResumableSampler(100, seed=3)
    t.load_state_dict(st)
    assert list(t) == full[24:]
    with pytest.raises(ValueError, match="consumed"):
        ResumableSampler(5).state_dict(consumed=2)


def test_state_is_small_and_constant_at_a_billion_rows():
    s = ResumableSampler(10**9, seed=1, rank=3, world_size=8)
    it = iter(s)
    first = [next(it) for _ in range(3)]
    assert all(0 <= i < 10**9 for i in first) and len(set(first)) == 3
    st = s.state_dict()
    assert len(json.dumps(st)) < 300
    assert len(pickle.dumps(st)) < 300
    far = dict(st, position=990_000_000)
    t = ResumableSampler(10**9, seed=1, rank=3, world_size=8)
    t.load_state_dict(far)
    assert next(iter(t)) < 10**9


def test_arguments_are_named():
    cases = [
        (dict(data_source=-1), ValueError, "length"),
        (dict(data_source=True), TypeError, "bool"),
        (dict(data_source=2.5), TypeError, "data_source must be a dataset with len"),
        (dict(data_source=5, seed=-1), ValueError, "seed"),
        (dict(data_source=5, seed=2**64), ValueError, "seed"),
        (dict(data_source=5, block_size=0), ValueError, "block_size"),
        (dict(data_source=5, block_size=4, window=0), ValueError, "window"),
        (dict(data_source=5, block_size=4, shuffle=False), ValueError, "block_size needs shuffle"),
        (dict(data_source=5, shuffle=1), TypeError, "shuffle"),
        (dict(data_source=5, rank=2, world_size=2), ValueError, "rank"),
        (dict(data_source=5, rank=0, world_size=0), ValueError, "world_size"),
        (dict(data_source=5, rank=0), ValueError, "together"),
        (dict(data_source=5, even="maybe"), ValueError, "even"),
        (dict(data_source=5, block_size=1.5), TypeError, "block_size"),
    ]
    for kw, exc, match in cases:
        with pytest.raises(exc, match=match):
            ResumableSampler(**kw)
    assert len(ResumableSampler(np.int64(7))) == len(ResumableSampler(range(7))) == 7
    s = ResumableSampler(5)
    with pytest.raises(ValueError, match="epoch"):
        s.set_epoch(-1)
    with pytest.raises(ValueError, match="n must be"):
        s.skip(-2)


def test_pickles_with_its_position():
    s = ResumableSampler(40, seed=2, block_size=4)
    it = iter(s)
    head = [next(it) for _ in range(9)]
    back = pickle.loads(pickle.dumps(s))
    assert head + list(back) == list(ResumableSampler(40, seed=2, block_size=4))
    assert copy.deepcopy(s).state_dict() == s.state_dict()


# ------------------------------------------------------------------------------ hostile states


def good_state() -> dict[str, Any]:
    s = ResumableSampler(100, seed=7, block_size=5, window=2)
    s.set_epoch(2)
    it = iter(s)
    for _ in range(30):
        next(it)
    s.skip(3)
    return s.state_dict()


def test_hostile_states_are_refused_naming_the_field():
    good = good_state()
    make = lambda: ResumableSampler(100, seed=7, block_size=5, window=2)  # noqa: E731
    make().load_state_dict(good)
    bad_values = [None, True, -1, 2**64, 1.5, "x", [], {}, 10**40]
    for path, _ in list(walk(good)):
        if not path:
            continue
        for v in bad_values:
            hostile = set_path(good, path, v)
            try:
                s = make()
                s.load_state_dict(hostile)
            except StateError as e:
                if path[0] not in ("format",):
                    assert str(path[0]) in str(e) or "not" in str(e), (path, v, e)
                continue
            # Accepted: it must still be a valid position of this sampler's epochs.
            rest = list(s)
            assert len(set(rest)) == len(rest) and all(0 <= i < 100 for i in rest)
        if isinstance(path[-1], str):  # a missing field (a list item removed may be valid)
            with pytest.raises(StateError):
                make().load_state_dict(del_path(good, path))
    for extra in ({"surprise": 1}, {"settings": {**good["settings"], "x": 1}}):
        with pytest.raises(StateError):
            make().load_state_dict({**good, **extra})
    with pytest.raises(StateError, match="version"):
        make().load_state_dict({**good, "version": 99})
    with pytest.raises(StateError, match="seed: state has 7, sampler has 8"):
        ResumableSampler(100, seed=8, block_size=5, window=2).load_state_dict(good)
    with pytest.raises(StateError, match="rows: state has 100, sampler has 101"):
        ResumableSampler(101, seed=7, block_size=5, window=2).load_state_dict(good)
    with pytest.raises(StateError, match="no shardstream sampler state"):
        make().load_state_dict({"loader": 1})
    with pytest.raises(StateError, match="not in step"):
        make().load_state_dict([good, {**good, "position": 44}])


@given(
    st.recursive(
        st.none() | st.booleans() | st.integers(-(2**70), 2**70) | st.text(max_size=5),
        lambda c: st.lists(c, max_size=3) | st.dictionaries(st.text(max_size=8), c, max_size=4),
        max_leaves=12,
    ),
    st.sampled_from(["position", "epoch", "skips", "settings", "version", "format", "extra"]),
)
def test_fuzzed_states_are_refused_or_valid(value, field):
    good = good_state()
    hostile = copy.deepcopy(good)
    hostile[field] = value
    s = ResumableSampler(100, seed=7, block_size=5, window=2)
    try:
        s.load_state_dict(hostile)
    except StateError:
        return
    rest = list(s)
    assert len(set(rest)) == len(rest) and all(0 <= i < 100 for i in rest)
