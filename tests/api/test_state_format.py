"""The state is small, plain builtins, versioned, and independent of the row payload."""

from __future__ import annotations

import io
import json
import pickle
import struct

import pytest
import torch
from harness import as_version_2, keys_of, make_ds, take, walk
from shardstream import StateError

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


def buffer_ids(state) -> list[int]:
    """The row ids of a state's shuffle buffer: Latin-1 text, a character per byte."""
    raw = state["position"]["buffer"].encode("latin-1")
    return list(struct.unpack(f"<{len(raw) // 8}Q", raw))


def test_buffer_is_latin1_text_of_the_buffered_row_ids(small):
    s = dict(output="arrow", shuffle_buffer=50, seed=3, batch_size=4)
    ds = make_ds(small.root, s)
    seen = [i for b in take(iter(ds), 9) for i in b.column("id").to_pylist()]
    state = ds.state_dict()
    assert state["version"] == 3
    ids = buffer_ids(state)
    pos = state["position"]
    assert len(ids) == pos["cursor"] - pos["emitted"] == 50
    # The buffered rows are rows read and not yet yielded: none of them was yielded, and the
    # rest of the epoch yields every one of them.
    assert not set(ids) & set(seen) and len(set(ids)) == len(ids)
    rest = [i for b in ds for i in b.column("id").to_pylist()]
    assert set(ids) <= set(rest)


@pytest.mark.parametrize("k", [0, 7, 40])
def test_version_2_state_loads_and_continues_identically(small, k):
    """States saved before the buffer became Latin-1 text (version 2, base64) still resume, and
    to the same stream as the version-3 state saved at that point."""
    s = dict(output="arrow", shuffle_buffer=50, seed=3, batch_size=4, epochs=2)
    full = keys_of(make_ds(small.root, s), True)
    ds = make_ds(small.root, s)
    take(iter(ds), k)
    state = ds.state_dict()
    old = json.loads(json.dumps(as_version_2(state)))
    if k:
        assert old["position"]["buffer"].isascii() and len(buffer_ids(state)) == 50
    ds2 = make_ds(small.root, s)
    ds2.load_state_dict(old)
    assert full[:k] + keys_of(ds2, True) == full
    if k:
        broken = dict(old, position=dict(old["position"], buffer=old["position"]["buffer"][:-2]))
        with pytest.raises(StateError, match=r"state\['position'\]\['buffer'\]"):
            make_ds(small.root, s).load_state_dict(broken)


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


# -- state_dict() built directly (rust/python/src/state_dict.rs) --------------------------------


def same_state(fast, slow, where):
    """The same state, byte for byte: pickled (types, key order, and no object repeated inside
    one state, which pickle would write as a reference) and as JSON."""
    assert pickle.dumps(fast, protocol=5) == pickle.dumps(slow, protocol=5), (where, fast, slow)
    assert json.dumps(fast) == json.dumps(slow), where


def check_along(ds, n, label, row_mode=False, it=None):
    """``ds.state_dict()`` against the serde-built state after each of the next ``n`` items
    (``None``: to the end) of ``it`` (default: a new iterator). Returns how many items were
    compared."""
    it = iter(ds) if it is None else it
    seen = 0
    while n is None or seen < n:
        if next(it, None) is None:
            break
        seen += 1
        raw = ds._iter._raw
        within = ds._iter._within() if row_mode else None
        same_state(ds.state_dict(), raw._state_dict_serde(within=within), (label, seen))
    return seen


@pytest.mark.parametrize(
    "settings",
    [
        dict(output="arrow", batch_size=16, shuffle_buffer=40, seed=4, epochs=3),
        dict(output="arrow", batch_size=7, epochs=2),
        dict(output="python", shuffle_buffer=9, seed=2, epochs=2),  # row mode: within
        dict(output="arrow", batch_size=5, shuffle_buffer=11, rank=1, world_size=2, even="pad"),
        dict(output="arrow", batch_size=5, rank=0, world_size=3, even=None, epochs=None),
    ],
    ids=["buffer-3-epochs", "nobuffer", "rows", "pad-rank1", "endless-3-ranks"],
)
def test_state_dict_is_the_serde_state_at_every_step(small, settings):
    """The direct build (fixed fields converted once per stream) equals the serde tree after
    every item across epoch ends, after skips, after load_state_dict and after set_epoch."""
    rows = settings["output"] == "python"
    ds = make_ds(small.root, settings)
    endless = "epochs" in settings and settings["epochs"] is None
    n = check_along(ds, 130 if rows or endless else None, "pass", rows)
    assert n > 40
    # skips: records in the state, one stream throughout
    ds = make_ds(small.root, settings)
    it = iter(ds)
    check_along(ds, 5, "before skip", rows, it)
    ds.skip(3)
    check_along(ds, 4, "after skip", rows, it)
    ds.skip(2)
    check_along(ds, 2, "after second skip", rows, it)
    assert len(ds.state_dict()["skips"]) == 2
    saved = pickle.loads(pickle.dumps(ds.state_dict()))
    # load_state_dict: a new stream from the loaded position, its head made again
    ds2 = make_ds(small.root, settings)
    ds2.load_state_dict(saved)
    check_along(ds2, 30, "after load", rows)
    # set_epoch: another pass, another first_epoch in the head
    ds3 = make_ds(small.root, settings)
    ds3.set_epoch(5)
    check_along(ds3, 8, "after set_epoch", rows)
    assert ds3.state_dict()["first_epoch"] == 5
    # two streams with different settings alive at once keep their own heads
    other = make_ds(small.root, dict(settings, seed=77))
    check_along(other, 3, "other", rows)
    check_along(ds3, 3, "set_epoch again", rows)
    assert other.state_dict()["settings"]["seed"] == 77 and other.state_dict()["first_epoch"] == 0


def test_state_dict_is_the_serde_state_after_an_elastic_resume(small):
    """Specs (ranges, injected rows) are built field by field too."""
    base = dict(output="arrow", shuffle_buffer=20, seed=5, batch_size=5, epochs=2, even=None)
    states = []
    for r in range(3):
        ds = make_ds(small.root, dict(base, rank=r, world_size=3))
        take(iter(ds), 2 + r)
        states.append(ds.state_dict())
    ds = make_ds(small.root, dict(base, rank=0, world_size=2))
    ds.load_state_dict(states)
    it = iter(ds)
    next(it)
    assert ds.state_dict()["position"]["specs"], "no spec: not an elastic resume"
    check_along(ds, None, "elastic")


def test_state_dict_is_the_serde_state_with_packing(small):
    from shardstream import Pack

    s = dict(columns=["id", "tokens"], output="numpy", batch_size=2, shuffle_buffer=6, seed=1)
    ds = make_ds(small.root, dict(s, pack=Pack(column="tokens", seq_len=16, algorithm="best_fit")))
    check_along(ds, 20, "pack")
    st = ds.state_dict()
    assert "pack" in st["settings"] and "pack" in st["position"]


def test_state_dicts_share_no_mutable_part(small):
    """The fixed fields are copied into every state: editing one state changes no other."""
    ds = make_ds(small.root, dict(output="arrow", batch_size=8, shuffle_buffer=5, seed=1))
    it = iter(ds)
    next(it)
    a = ds.state_dict()
    want = pickle.dumps(ds.state_dict())
    for part in ("fingerprint", "settings", "slot", "position"):
        a[part]["poked"] = 1
        a[part].pop(next(iter(a[part])))
    a["skips"].append("x")
    a.clear()
    assert pickle.dumps(ds.state_dict()) == want
