"""The state is small, plain builtins, versioned, and independent of the row payload."""

from __future__ import annotations

import io
import pickle

import pytest
import torch
from harness import make_ds, take, walk

PLAIN = (dict, list, str, int, bool, bytes, type(None))


def state_at(source, settings, k):
    ds = make_ds(source, settings)
    take(iter(ds), k)
    return ds.state_dict()


def size(state) -> int:
    return len(pickle.dumps(state, protocol=4))


def size_without_seek(state):
    """Pickled size without the informational ``seek``: its ``byte_offset`` is a file offset
    whose integer encoding grows with the file, so it is checked to be a small fixed record
    and then set aside."""
    seek = state["position"].pop("seek")
    assert set(seek) == {"shard", "row_group", "row", "byte_offset"}, seek
    assert isinstance(seek["shard"], str) and len(seek["shard"]) < 64, seek
    return size(state)


@pytest.mark.parametrize(
    "settings,k",
    [
        (dict(), 0),
        (dict(output="python"), 100),
        (dict(output="python", shuffle_buffer=7, seed=1, batch_size=5, epochs=2), 60),
        (dict(output="arrow", shuffle_buffer=10**6, seed=1), 300),
        (dict(output="numpy", batch_size=64, drop_last=True, epochs=3), 9),
    ],
    ids=str,
)
def test_state_is_plain_builtins(small, settings, k):
    state = state_at(small.root, settings, k)
    assert isinstance(state, dict)
    for path, v in walk(state):
        assert type(v) in PLAIN, f"{path}: {type(v).__name__} is not a plain builtin"
        if isinstance(v, dict):
            for key in v:
                assert type(key) in (str, int), f"{path}: dict key {key!r} ({type(key).__name__})"
    versions = [k for k in state if isinstance(k, str) and "version" in k.lower()]
    assert versions, f"no version key at top level: {sorted(state)}"
    assert all(type(state[v]) in (int, str) for v in versions)
    buf = io.BytesIO()
    torch.save(state, buf)
    buf.seek(0)
    assert torch.load(buf, weights_only=True) == state


def test_state_loads_from_file_weights_only(small, tmp_path):
    s = dict(output="python", shuffle_buffer=7, seed=1, batch_size=5)
    state = state_at(small.root, s, 20)
    f = tmp_path / "st.pt"
    torch.save({"loader": state, "step": 20}, f)
    back = torch.load(f, weights_only=True)
    assert back["loader"] == state


@pytest.fixture(scope="module")
def narrow_wide(shard_factory):
    # identical row layout, very different row width; no compression and >= 64 KiB files so
    # that the pickled integer sizes of the files take the same number of bytes
    common = dict(
        num_shards=2,
        rows_per_shard=3000,
        row_group_size=[[700, 900, 1400], [1000, 1000, 1000]],
        compression=None,
        seed=1,
    )
    narrow = shard_factory(**common, tokens_len=(0, 2))
    wide = shard_factory(**common, tokens_len=(100, 200))
    import os

    for p in narrow.paths + wide.paths:
        assert 2**16 <= os.path.getsize(p) < 2**31
    return narrow, wide


@pytest.mark.parametrize(
    "settings,k",
    [
        (dict(output="python"), 1234),
        (dict(output="python", shuffle_buffer=256, seed=2), 1234),
        (dict(output="arrow", batch_size=32, shuffle_buffer=64, seed=2), 50),
    ],
    ids=["noshuf", "buf256", "buf64-batch"],
)
def test_state_size_independent_of_row_width(narrow_wide, settings, k):
    """Byte for byte the same size — except the informational ``seek``, whose ``byte_offset``
    is a file offset (its integer encoding grows with the file), so it is checked apart."""
    narrow, wide = narrow_wide
    a = size_without_seek(state_at(narrow.root, settings, k))
    b = size_without_seek(state_at(wide.root, settings, k))
    assert a == b, f"state size depends on row width: narrow {a} B, wide {b} B"


def test_state_is_small_and_constant_along_the_stream(narrow_wide):
    narrow, _ = narrow_wide
    sizes = [size(state_at(narrow.root, dict(output="python"), k)) for k in (1, 1000, 5999)]
    assert max(sizes) < 4096, sizes
    assert max(sizes) - min(sizes) <= 32, f"state grows along the stream: {sizes}"


def test_state_grows_with_buffer_not_with_data(narrow_wide):
    narrow, wide = narrow_wide
    st = dict(output="python", seed=3)
    sizes = {}
    for b in (0, 64, 256, 1024):
        sizes[b] = size(state_at(narrow.root, dict(st, shuffle_buffer=b), 2000))
    per_entry = (sizes[1024] - sizes[64]) / 960
    # a buffered row must be a small reference (shard/row-group/row index), never the row;
    # wide rows here are > 400 bytes of tokens alone
    assert per_entry <= 40, f"{per_entry:.1f} bytes per buffered row: {sizes}"
    assert sizes[1024] <= sizes[0] + 40 * 1024 + 256, sizes
    w = size_without_seek(state_at(wide.root, dict(st, shuffle_buffer=1024), 2000))
    n = size_without_seek(state_at(narrow.root, dict(st, shuffle_buffer=1024), 2000))
    assert w == n, (w, n)
