"""Shards modified, replaced, added or removed after a state was saved: resuming fails with a
``ShardsChangedError`` naming them, unless ``allow_changed_shards=True`` (documented meaning:
same epoch, same number of rows already yielded, the rest read from the new data)."""

from __future__ import annotations

import os
import shutil

import pyarrow as pa
import pyarrow.parquet as pq
import pytest
from harness import keys_of, take, torch_roundtrip
from shardstream import ParquetStream, ShardsChangedError, StateError, datagen

SETTINGS = dict(columns=["id"], batch_size=None, output="python", shuffle_buffer=16, seed=2)


@pytest.fixture()
def data(tmp_path):
    root = tmp_path / "data"
    paths = datagen.write_shards(root, num_shards=6, rows_per_shard=40, seed=1)
    return root, [os.path.basename(p) for p in paths]


def _saved(root, k=25, **kw):
    ds = ParquetStream(str(root), **{**SETTINGS, **kw})
    it = iter(ds)
    take(it, k)
    return torch_roundtrip(ds.state_dict())


def _load(root, state, **kw):
    ds = ParquetStream(str(root), **SETTINGS)
    ds.load_state_dict(state, **kw)
    return ds


def _rewrite_ids(path, delta):
    """Same rows, same row groups, different values: size may stay, the footer does not."""
    t = pq.read_table(path)
    i = t.schema.get_field_index("id")
    t = t.set_column(i, "id", pa.array([v + delta for v in t.column("id").to_pylist()], pa.int64()))
    meta = pq.ParquetFile(path).metadata
    with pq.ParquetWriter(path, t.schema, compression="zstd", write_page_index=True) as w:
        start = 0
        for g in range(meta.num_row_groups):
            n = meta.row_group(g).num_rows
            w.write_table(t.slice(start, n))
            start += n


def test_modified_shard_is_named(data):
    root, names = data
    state = _saved(root)
    _rewrite_ids(root / names[3], 10_000)
    with pytest.raises(ShardsChangedError) as e:
        _load(root, state)
    assert names[3] in str(e.value) and "modified or replaced" in str(e.value)
    assert names[3] in e.value.changed and not e.value.added
    assert "allow_changed_shards=True" in str(e.value)


def test_added_and_removed_shards_are_reported(data):
    root, names = data
    state = _saved(root)
    datagen.write_shards(root, num_shards=1, rows_per_shard=10, prefix="zz-new", start_id=500)
    with pytest.raises(ShardsChangedError) as e:
        _load(root, state)
    assert "zz-new-00000.parquet" in str(e.value)
    assert any("zz-new" in p for p in e.value.added + e.value.changed)
    os.remove(root / "zz-new-00000.parquet")
    os.remove(root / names[1])
    with pytest.raises(ShardsChangedError, match=r"removed or renamed: 1 shard") as e:
        _load(root, state)
    assert e.value.removed >= 1 or e.value.changed


def test_touch_and_copy_keep_the_state_valid(data, tmp_path):
    """mtime is not part of the fingerprint: a copy (or touch) of the same bytes resumes."""
    root, names = data
    state = _saved(root)
    os.utime(root / names[0], (1, 1))
    copy = tmp_path / "copy"
    shutil.copytree(root, copy)
    expect = keys_of(_load(root, state), False)
    assert keys_of(_load(copy, state), False) == expect


def test_other_dataset_is_not_a_change(data, tmp_path):
    root, _ = data
    other = tmp_path / "other"
    datagen.write_shards(other, num_shards=6, rows_per_shard=40, seed=1, prefix="part")
    state = _saved(root)
    for allow in (False, True):
        with pytest.raises(StateError, match="different shard set") as e:
            _load(other, state, allow_changed_shards=allow)
        assert not isinstance(e.value, ShardsChangedError)


def test_settings_mismatch_is_never_allowed(data):
    root, names = data
    state = _saved(root)
    _rewrite_ids(root / names[0], 1)
    ds = ParquetStream(str(root), **{**SETTINGS, "seed": 3})
    with pytest.raises(StateError, match="different settings"):
        ds.load_state_dict(state, allow_changed_shards=True)


@pytest.mark.parametrize("shuffle", [0, 16])
def test_allow_changed_shards_keeps_epoch_and_count(data, shuffle):
    """Documented meaning: the epoch and the rows yielded in it are kept; the rest of that
    epoch comes from the new data's stream after that many rows; later epochs are exact."""
    root, names = data
    kw = dict(shuffle_buffer=shuffle, epochs=2)
    k = 70
    state = _saved(root, k=k, **kw)
    datagen.write_shards(root, num_shards=1, rows_per_shard=30, prefix="zz-new", start_id=240)
    os.remove(root / names[2])
    new = ParquetStream(str(root), **{**SETTINGS, **kw})
    fresh = keys_of(new, False)  # the new data's own stream, 2 epochs
    per_epoch = new.num_rows
    ds = ParquetStream(str(root), **{**SETTINGS, **kw})
    ds.load_state_dict(state, allow_changed_shards=True)
    rest = keys_of(ds, False)
    assert rest == fresh[k:]
    assert len(rest) == 2 * per_epoch - k
    assert sorted(rest[per_epoch - k :]) == sorted(fresh[:per_epoch])


def test_changed_error_pickles(data):
    import pickle

    root, names = data
    state = _saved(root)
    _rewrite_ids(root / names[5], 3)
    with pytest.raises(ShardsChangedError) as e:
        _load(root, state)
    again = pickle.loads(pickle.dumps(e.value))
    assert str(again) == str(e.value) and again.changed == e.value.changed
