"""Issue 13's argument and state mistakes: each was an abort, a bare error, or a wrong stream.

Sizes and counts a user passes are checked against the core's limits before anything is
allocated for them; a huge ``batch_size`` is legal and only ever holds the rows that exist.
"""

from __future__ import annotations

import copy
import os
import pickle

import pyarrow as pa
import pyarrow.parquet as pq
import pytest
from shardstream import ParquetStream
from shardstream.checkpoint import checkpoint_path, load_latest_checkpoint, save_checkpoint
from shardstream.errors import StateError

ROWS = 60


@pytest.fixture()
def shards(tmp_path):
    for i in range(3):
        ids = list(range(i * 20, (i + 1) * 20))
        pq.write_table(pa.table({"id": ids}), tmp_path / f"s{i}.parquet", row_group_size=7)
    return str(tmp_path)


def ids_of(ds):
    out = []
    for item in ds:
        out.extend(item["id"] if isinstance(item["id"], list) else [item["id"]])
    return out


@pytest.mark.parametrize(
    ("kw", "named"),
    [
        (dict(readahead_depth=10**9), "readahead_depth"),
        (dict(readahead_threads=10**6), "readahead_threads"),
        (dict(read_batch_rows=2**40), "read_batch_rows"),
        (dict(seed=2**64), "seed"),
        (dict(shuffle_buffer=2**40), "shuffle_buffer"),
        (dict(rank=0, world_size=2**40), "world_size"),
        (dict(batch_size=2**64), "batch_size"),
        (dict(epochs=2**64), "epochs"),
    ],
)
def test_out_of_range_arguments_are_value_errors_naming_them(shards, kw, named):
    with pytest.raises(ValueError, match=named):
        ParquetStream(shards, output="python", **kw)


@pytest.mark.parametrize("batch_size", [10**11, 2**62])
def test_huge_batch_size_with_a_shuffle_buffer_holds_only_the_rows_there_are(shards, batch_size):
    # Was a SIGABRT (Vec::with_capacity(batch_size)) or a capacity overflow.
    ds = ParquetStream(shards, output="python", batch_size=batch_size, shuffle_buffer=10, seed=3)
    batches = list(ds)
    assert len(batches) == 1
    assert sorted(batches[0]["id"]) == list(range(ROWS))


def test_set_epoch_beyond_the_epoch_range_is_refused(shards):
    ds = ParquetStream(shards, output="python")
    with pytest.raises(ValueError, match="epoch"):
        ds.set_epoch(2**64 - 1)  # wrapped to another epoch's stream before


def test_a_deeply_nested_state_is_a_state_error(shards):
    ds = ParquetStream(shards, output="python")
    state = ds.state_dict()
    deep: list = []
    cur = deep
    for _ in range(5000):  # a RecursionError before
        nxt: list = []
        cur.append(nxt)
        cur = nxt
    bad = copy.deepcopy(state)
    bad["position"] = deep
    with pytest.raises(StateError, match="position"):
        ParquetStream(shards, output="python").load_state_dict(bad)


def test_skipping_across_many_endless_epochs_keeps_the_state_small(shards):
    # Was one skip record per epoch crossed: skip(10**7) over 60 rows gave 28,572 records.
    n = 500 * ROWS + 7  # crosses 500 epochs: ~14 KB of records before
    ds = ParquetStream(shards, output="python", epochs=None, shuffle_buffer=8, seed=1)
    it = iter(ds)
    next(it)
    ds.skip(n)
    state = ds.state_dict()
    assert len(pickle.dumps(state)) < 4096
    # ... and the skip still lands where skipping item by item would.
    ref = ParquetStream(shards, output="python", epochs=None, shuffle_buffer=8, seed=1)
    ref_it = iter(ref)
    for _ in range(1 + n):
        next(ref_it)
    resumed = ParquetStream(shards, output="python", epochs=None, shuffle_buffer=8, seed=1)
    resumed.load_state_dict(state)
    got = [next(iter_) for iter_ in [iter(resumed)] for _ in range(2 * ROWS)]
    want = [next(ref_it) for _ in range(2 * ROWS)]
    assert got == want


def test_a_rank_that_never_iterated_is_resumed_in_an_elastic_layout(shards):
    # Rank 1 saved its state before its first item (it has no slot position yet); resuming
    # both ranks' states on one rank continues rank 0 and starts rank 1's rows from the top.
    r0 = ParquetStream(shards, output="python", rank=0, world_size=2, even=None)
    r1 = ParquetStream(shards, output="python", rank=1, world_size=2, even=None)
    it0 = iter(r0)
    seen = [next(it0)["id"] for _ in range(7)]
    states = [r0.state_dict(), r1.state_dict()]
    merged = ParquetStream(shards, output="python", even=None)
    merged.load_state_dict(states)
    rest = ids_of(merged)
    assert len(set(rest)) == len(rest)
    assert sorted(seen + rest) == list(range(ROWS))


class _Boom:
    def __reduce__(self):
        return (os.system, ("echo pwned > /dev/null",))


def test_a_checkpoint_naming_a_callable_is_refused_not_run(tmp_path, monkeypatch):
    save_checkpoint({"ok": 1}, str(tmp_path), 1)
    # A newer checkpoint file written by someone else, naming os.system.
    evil = pickle.dumps({"loader": _Boom()})
    ran: list[str] = []
    monkeypatch.setattr(os, "system", lambda cmd: ran.append(cmd) or 0)
    with open(checkpoint_path(str(tmp_path), 2), "wb") as f:
        f.write(evil)
    with pytest.raises(Exception, match="(?i)refus|weights_only|unsupported|not allowed"):
        load_latest_checkpoint(str(tmp_path))
    assert ran == []
