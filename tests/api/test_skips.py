"""``skip()``, ``skip_state()`` and ``replay_skips()``: skipping costs no reading, leaves the
stream exactly where reading and discarding would, and is recorded in the state so that resumed
runs and re-runs from earlier checkpoints are reproducible. Every check compares full id streams.
"""

from __future__ import annotations

import itertools

import pytest
from harness import is_batched, item_key, keys_of, make_ds, take, torch_roundtrip
from shardstream import ParquetStream, StateError

SETTINGS = [
    dict(batch_size=None, shuffle_buffer=0, epochs=2),
    dict(batch_size=None, shuffle_buffer=37, seed=4, epochs=2),
    dict(batch_size=16, shuffle_buffer=0, epochs=3),
    dict(batch_size=16, shuffle_buffer=100, seed=1, epochs=3, drop_last=True),
    dict(batch_size=7, shuffle_buffer=5, seed=2, epochs=2, readahead_threads=2),
]
IDS = [
    "rows",
    "rows-shuffled",
    "batches",
    "batches-shuffled-droplast",
    "batches-small-buffer-readahead",
]


def _settings(s: dict) -> dict:
    return dict(columns=["id"], output="python", **s)


def _reference(source, settings) -> list:
    return keys_of(make_ds(source, settings), is_batched(settings))


@pytest.mark.parametrize("settings", SETTINGS, ids=IDS)
def test_live_skip_equals_read_and_discard(small, settings):
    """Skip n items mid-stream (incl. across epoch ends): the stream continues exactly where
    reading n items would have; the state records the skipped rows and resumes identically."""
    settings = _settings(settings)
    b = is_batched(settings)
    ref = _reference(small.root, settings)
    per_epoch = len(ref) // settings["epochs"]
    for k, n in [(0, 1), (3, 10), (per_epoch - 2, 5), (per_epoch // 2, per_epoch), (1, 10**9)]:
        ds = make_ds(small.root, settings)
        it = iter(ds)
        got = keys_of(take(it, k), b)
        ds.skip(n)
        mid = ds.state_dict()
        rest = keys_of(it, b)
        assert got + rest == ref[:k] + ref[k + n :], (k, n)
        # Resuming the state taken right after the skip continues identically.
        ds2 = make_ds(small.root, settings)
        ds2.load_state_dict(torch_roundtrip(mid))
        assert keys_of(ds2, b) == rest
        # The record: rows [start, stop) of each epoch touched; together the skipped items.
        skips = mid["skips"]
        assert all(r["slot"] == [0, 1] and r["stop"] > r["start"] for r in skips)
        skipped_rows = sum(r["stop"] - r["start"] for r in skips)
        items = ref[k : k + n]
        want = sum(len(x) for x in items) if b else len(items)
        if settings.get("drop_last"):
            assert skipped_rows >= want  # a dropped short batch is passed over too
        else:
            assert skipped_rows == want
        assert ds2.state_dict()["skips"] == skips


@pytest.mark.parametrize("settings", SETTINGS[:4], ids=IDS[:4])
def test_skip_in_row_mode_mid_chunk_and_repeated(small, settings):
    settings = _settings(settings)
    b = is_batched(settings)
    ref = _reference(small.root, settings)
    ds = make_ds(small.root, settings)
    it = iter(ds)
    got, want, pos = [], [], 0
    for take_n, skip_n in [(5, 3), (1, 1), (20, 0), (2, 40), (0, 7), (11, 2)]:
        got += keys_of(take(it, take_n), b)
        ds.skip(skip_n)
        want += ref[pos : pos + take_n]
        pos += take_n + skip_n
    got += keys_of(it, b)
    assert got == want + ref[pos:]


@pytest.mark.parametrize("settings", SETTINGS[1:4], ids=IDS[1:4])
def test_skip_before_iterating_and_after_loading(small, settings):
    settings = _settings(settings)
    b = is_batched(settings)
    ref = _reference(small.root, settings)
    ds = make_ds(small.root, settings)
    ds.skip(9)
    assert keys_of(ds, b) == ref[9:]
    # After load_state_dict, before the first next(): skips from the loaded position.
    src = make_ds(small.root, settings)
    it = iter(src)
    take(it, 4)
    saved = src.state_dict()
    ds = make_ds(small.root, settings)
    ds.load_state_dict(saved)
    ds.skip(6)
    state = ds.state_dict()  # the skipped position is the state until iterating
    assert state["skips"] and state["position"]["emitted"] > saved["position"]["emitted"]
    assert keys_of(ds, b) == ref[10:]


def test_skip_costs_no_reading(small, tmp_path):
    """Skipped rows are not read: skipping past a shard that can no longer be read works."""
    import shutil

    root = tmp_path / "d"
    shutil.copytree(small.root, root)
    # No readahead, small reads: nothing past the first batch is read before the skip.
    settings = _settings(dict(batch_size=10, readahead_threads=0, read_batch_rows=10))
    ref = _reference(str(root), settings)
    ds = make_ds(str(root), settings)
    it = iter(ds)
    first = item_key(next(it), True)
    first_shard_rows = 130  # SMALL: 130/75/210/95
    # Corrupt the second shard's data pages (keep its footer: the catalog is already open).
    second = sorted(root.iterdir())[1]
    data = bytearray(second.read_bytes())
    data[4:2000] = b"\xff" * 1996
    second.write_bytes(bytes(data))
    ds.skip((first_shard_rows + 75) // 10)  # to row 210, which is in the third shard
    rest = keys_of(it, True)
    assert [first, *rest] == [ref[0], *ref[21:]]


def test_replay_skips_reproduces_a_later_run(small):
    """Run A resumes from checkpoint C, skips twice, ends. A re-run from C that replays A's
    skips yields exactly A's stream — also across a DataLoader-style restart from a state."""
    settings = _settings(dict(batch_size=None, shuffle_buffer=23, seed=8, epochs=2))
    b = False
    base = make_ds(small.root, settings)
    it = iter(base)
    take(it, 50)
    checkpoint = torch_roundtrip(base.state_dict())

    run_a = make_ds(small.root, settings)
    run_a.load_state_dict(checkpoint)
    it = iter(run_a)
    a = keys_of(take(it, 30), b)
    run_a.skip(17)
    a += keys_of(take(it, 600), b)  # into epoch 1
    run_a.skip(5)
    a += keys_of(it, b)
    final = run_a.state_dict()
    assert len(final["skips"]) == 2

    run_b = make_ds(small.root, settings)
    run_b.load_state_dict(checkpoint)
    run_b.replay_skips(final)
    assert keys_of(run_b, b) == a
    # Without replay, the re-run differs (the skips really changed the stream).
    plain = make_ds(small.root, settings)
    plain.load_state_dict(checkpoint)
    assert keys_of(plain, b) != a


def test_skip_records_survive_resume_chains(small):
    settings = _settings(dict(batch_size=8, shuffle_buffer=30, seed=3, epochs=2))
    ds = make_ds(small.root, settings)
    it = iter(ds)
    take(it, 2)
    ds.skip(3)
    first = ds.state_dict()["skips"]
    ds2 = make_ds(small.root, settings)
    ds2.load_state_dict(ds.state_dict())
    it2 = iter(ds2)
    take(it2, 1)
    ds2.skip(4)
    skips = ds2.state_dict()["skips"]
    assert skips[: len(first)] == first and len(skips) == len(first) + 1
    # Records are plain built-ins: they survive torch's weights_only loader.
    assert torch_roundtrip(ds2.state_dict())["skips"] == skips


def test_skip_state_for_loader_workers(small):
    """skip_state rewrites every worker's state of a StatefulDataLoader checkpoint: each worker
    passes over its next n batches (nothing read) and the loader continues from there."""
    from torchdata.stateful_dataloader import StatefulDataLoader

    settings = _settings(dict(batch_size=6, shuffle_buffer=20, seed=5, epochs=1))
    n, nw = 3, 2
    # Each worker's own stream: rank w of 2 without workers is the same slot (w of 2).
    per_worker = [
        keys_of(ParquetStream(small.root, rank=w, world_size=2, even=None, **settings), True)
        for w in range(nw)
    ]

    def loader(ds):
        return StatefulDataLoader(
            ds, batch_size=None, num_workers=nw, multiprocessing_context="fork"
        )

    ds = make_ds(small.root, settings)
    dl = loader(ds)
    it = iter(dl)
    before = keys_of(take(it, 5), True)
    saved = dl.state_dict()
    list(it)
    skipped = ds.skip_state(saved, n)
    dl2 = loader(make_ds(small.root, settings))
    dl2.load_state_dict(skipped)
    after = keys_of(dl2, True)
    for w in range(nw):
        mine_before = [x for x in before if x in per_worker[w]]
        mine_after = [x for x in after if x in per_worker[w]]
        k = len(mine_before)
        assert mine_before == per_worker[w][:k]
        assert mine_after == per_worker[w][k + n :], w


def test_skip_state_leaves_the_input_unchanged(small):
    settings = _settings(dict(batch_size=5))
    ds = make_ds(small.root, settings)
    it = iter(ds)
    take(it, 2)
    saved = ds.state_dict()
    copy = torch_roundtrip(saved)
    out = ds.skip_state({"model": 1, "data": saved}, 4)
    assert saved == copy
    assert out["model"] == 1 and out["data"]["position"]["emitted"] == 30
    ref = _reference(small.root, settings)
    ds2 = make_ds(small.root, settings)
    ds2.load_state_dict(out)
    assert keys_of(ds2, True) == ref[6:]


def test_skip_errors(small):
    ds = make_ds(small.root, _settings(dict(batch_size=4)))
    for bad in (-1, 1.5, True, "3"):
        with pytest.raises(ValueError):
            ds.skip(bad)
    with pytest.raises(StateError):
        ds.skip_state({"nothing": 1}, 2)
    with pytest.raises(StateError, match="skips"):
        ds.replay_skips([{"epoch": 0, "slot": [0, 1], "start": 5, "stop": 5}])
    # Several slots' states loaded (elastic) then skip(): ambiguous, refused clearly.
    states = []
    for r in range(2):
        s = ParquetStream(small.root, rank=r, world_size=2, columns=["id"], batch_size=4)
        it = iter(s)
        next(it)
        states.append(s.state_dict())
    ds.load_state_dict(states)
    with pytest.raises(StateError, match="skip_state"):
        ds.skip(1)


def test_skip_past_the_end_ends_the_pass(small):
    settings = _settings(dict(batch_size=None, epochs=1))
    ds = make_ds(small.root, settings)
    it = iter(ds)
    take(it, 3)
    ds.skip(10**6)
    assert list(it) == []
    assert list(itertools.islice(iter(ds), 2)) == [
        {"id": 0},
        {"id": 1},
    ]  # a new pass starts after the end, as after any finished pass
