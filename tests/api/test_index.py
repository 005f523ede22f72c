"""The metadata sidecar (``shardstream index``): same catalog, stream and fingerprint as reading
every footer; stale entries fall back to the footer; files changed behind a matching entry are
errors naming them; states move freely between runs with and without the sidecar."""

from __future__ import annotations

import json
import os
import subprocess
import sys

import pytest
from harness import keys_of, take
from shardstream import ParquetStream, ShardError, datagen, index

SETTINGS = dict(columns=["id", "tokens"], batch_size=7, output="numpy", shuffle_buffer=40, seed=6)


@pytest.fixture()
def data(tmp_path):
    root = tmp_path / "d"
    datagen.write_shards(root / "a", num_shards=3, rows_per_shard=[50, 0, 33], seed=2)
    datagen.write_shards(root / "b", num_shards=2, rows_per_shard=41, seed=3, start_id=83)
    return root


def _ids(root, **kw):
    return keys_of(ParquetStream(str(root), **{**SETTINGS, **kw}), True)


def test_sidecar_gives_the_same_stream_and_fingerprint(data):
    plain = ParquetStream(str(data), **SETTINGS)
    expect, fp = _ids(data), plain.catalog.fingerprint()
    path = index.write_index(str(data))
    assert path == index.sidecar_path(str(data)) and os.path.exists(path)
    with open(path) as f:
        side = json.load(f)
    assert [e["path"] for e in side["shards"]] == [os.path.relpath(p, data) for p in plain.shards]
    ds = ParquetStream(str(data), **SETTINGS)
    assert ds.catalog.fingerprint() == fp
    assert keys_of(ds, True) == expect
    assert ds.num_rows == plain.num_rows == 50 + 33 + 82


def test_states_cross_between_runs_with_and_without_sidecar(data):
    ds = ParquetStream(str(data), **SETTINGS)
    it = iter(ds)
    head = keys_of(take(it, 5), True)
    state = ds.state_dict()
    rest = keys_of(it, True)
    assert head + rest == _ids(data)
    index.write_index(str(data))
    resumed = ParquetStream(str(data), **SETTINGS)
    resumed.load_state_dict(state)
    assert keys_of(resumed, True) == rest


def test_stale_entries_fall_back_to_footers(data):
    index.write_index(str(data))
    # Add a shard and replace another (new mtime and size): both are read from their footers.
    datagen.write_shards(data / "c", num_shards=1, rows_per_shard=9, start_id=500)
    datagen.write_shards(data / "a", num_shards=1, rows_per_shard=[51], seed=2)
    os.remove(data / "b" / "shard-00001.parquet")
    got = _ids(data)
    os.remove(index.sidecar_path(str(data)))
    assert got == _ids(data)


def test_file_changed_behind_a_matching_entry_is_named(data):
    index.write_index(str(data))
    victim = data / "b" / "shard-00001.parquet"
    st = os.stat(victim)
    raw = bytearray(victim.read_bytes())
    raw[-20] ^= 0x5A  # footer bytes; size and mtime restored below
    victim.write_bytes(bytes(raw))
    os.utime(victim, ns=(st.st_atime_ns, st.st_mtime_ns))
    ds = ParquetStream(str(data), **{**SETTINGS, "shuffle_buffer": 0})
    with pytest.raises(ShardError, match=r"shard-00001\.parquet.*shardstream index"):
        keys_of(ds, True)


def test_malformed_sidecar_is_a_clear_error(data):
    with open(index.sidecar_path(str(data)), "w") as f:
        f.write('{"format": "shardstream.index", "version": 99, "shards": []}')
    with pytest.raises(ValueError, match="_shardstream_index.json"):
        ParquetStream(str(data))


def test_cli_index(data):
    out = subprocess.run(
        [sys.executable, "-m", "shardstream", "index", str(data), "--json"],
        capture_output=True,
        text=True,
        check=True,
    )
    info = json.loads(out.stdout)
    assert info["shards"] == 5 and info["rows"] == 165
    assert info["index"] == index.sidecar_path(str(data))
    bad = subprocess.run(
        [sys.executable, "-m", "shardstream", "index", str(data / "nope")],
        capture_output=True,
        text=True,
    )
    assert bad.returncode == 2 and "nope" in bad.stderr and "Traceback" not in bad.stderr


# ------------------------------------------------------------------ the catalog's pickled form


def test_catalog_pickles_as_its_snapshot(data):
    """A pickled catalog is the sidecar's JSON form: the same shards, schema, rows and
    fingerprint, and the same stream, without opening the shard set again."""
    import pickle

    from shardstream._core import RawCatalog

    for columns in (None, ["tokens", "id"]):
        cat = RawCatalog([str(data)], columns)
        blob = pickle.dumps(cat)
        assert b"shardstream.catalog" in blob
        copy = pickle.loads(blob)
        assert copy.shard_paths == cat.shard_paths
        assert copy.schema == cat.schema
        assert copy.num_rows == cat.num_rows
        assert copy.fingerprint() == cat.fingerprint()
        assert copy.shards_info() == cat.shards_info()


def test_pickled_dataset_keeps_its_shard_set_and_opens_nothing(data):
    """A spawn-started worker gets its parent's catalog: a shard added after pickling is not
    seen (nothing is listed again), the stream is the parent's; a shard removed after pickling
    is an error naming it only when the worker reads it (nothing is opened before)."""
    import pickle

    ds = ParquetStream(str(data), **SETTINGS)
    expect = keys_of(ParquetStream(str(data), **SETTINGS), True)
    blob = pickle.dumps(ds)
    datagen.write_shards(data / "c", num_shards=1, rows_per_shard=9, seed=4, start_id=500)
    copy = pickle.loads(blob)
    assert copy.shards == ds.shards and copy.num_rows == ds.num_rows
    assert keys_of(copy, True) == expect
    gone = ds.shards[-1]
    os.remove(gone)
    copy = pickle.loads(blob)
    assert copy.num_rows == ds.num_rows
    with pytest.raises((OSError, ShardError), match=os.path.basename(gone)):
        keys_of(copy, True)
