"""torch DataLoader and torchdata StatefulDataLoader integration."""

from __future__ import annotations

import pickle
from collections import Counter

import pytest
import torch
from harness import check_epochs, flat_ids, item_key, keys_of, make_ds, torch_roundtrip
from shardstream import ParquetStream
from torch.utils.data import DataLoader, IterableDataset, get_worker_info
from torchdata.stateful_dataloader import StatefulDataLoader

pytestmark = pytest.mark.timeout(300)


class Probe(IterableDataset):
    """Yields {"wid", "ids"} per item of the wrapped dataset (from inside a worker)."""

    def __init__(self, ds, batched):
        self.ds = ds
        self.batched = batched

    def __iter__(self):
        info = get_worker_info()
        wid = info.id if info is not None else -1
        for item in self.ds:
            k = item_key(item, self.batched)
            yield {"wid": wid, "ids": list(k) if self.batched else [k]}


def loader_keys(loader, batched=True):
    return [item_key(x, batched) for x in loader]


# --------------------------------------------------------------- DataLoader


@pytest.mark.parametrize("num_workers", [0, 2])
@pytest.mark.parametrize(
    "settings",
    [
        dict(output="torch", batch_size=16, shuffle_buffer=7, seed=1, epochs=1),
        dict(output="python", batch_size=5, epochs=2),
        dict(output="numpy", batch_size=64, shuffle_buffer=100, seed=2, epochs=3),
    ],
    ids=["torch-b16", "python-b5-e2", "numpy-b64-e3"],
)
def test_dataloader_union_is_every_row_once_per_epoch(small, num_workers, settings):
    ds = make_ds(small.root, settings)
    loader = DataLoader(Probe(ds, True), batch_size=None, num_workers=num_workers)
    per_worker: dict[int, list] = {}
    for x in loader:
        per_worker.setdefault(int(x["wid"]), []).append(tuple(int(i) for i in x["ids"]))
    if num_workers:
        assert sorted(per_worker) == list(range(num_workers))
    epochs = settings["epochs"]
    ids = small.ids
    # per worker: every batch full except the last of each epoch; per epoch, worker slots are
    # disjoint and their union is every row exactly once
    splits = {}
    for w, batches in per_worker.items():
        flat = flat_ids(batches)
        assert len(flat) % epochs == 0
        per = len(flat) // epochs
        splits[w] = [flat[e * per : (e + 1) * per] for e in range(epochs)]
        assert all(len(b) <= settings["batch_size"] for b in batches)
    for e in range(epochs):
        union = Counter()
        for w in splits:
            union.update(splits[w][e])
        assert union == Counter(ids), f"epoch {e}: union over workers is not every row once"
    if num_workers:
        sets = [set(splits[w][0]) for w in splits]
        assert not (sets[0] & sets[1]), "workers overlap"
        sizes = [len(splits[w][0]) for w in splits]
        assert max(sizes) - min(sizes) <= 1, f"slots not balanced within one row: {sizes}"


def test_dataloader_slots_are_contiguous_unshuffled(small):
    ds = make_ds(small.root, dict(output="python", batch_size=10))
    loader = DataLoader(Probe(ds, True), batch_size=None, num_workers=3)
    per_worker: dict[int, list] = {}
    for x in loader:
        per_worker.setdefault(int(x["wid"]), []).extend(int(i) for i in x["ids"])
    got = [i for w in sorted(per_worker) for i in per_worker[w]]
    assert got == list(range(small.num_rows)), "slot w must be the w-th contiguous range"
    sizes = [len(per_worker[w]) for w in sorted(per_worker)]
    assert max(sizes) - min(sizes) <= 1, sizes


def test_dataloader_rank_and_workers_slots(small):
    """slot = rank * num_workers + worker_id over world_size * num_workers slots."""
    n = small.num_rows
    got = []
    for rank in range(2):
        ds = make_ds(
            small.root, dict(output="python", batch_size=10, rank=rank, world_size=2, even=None)
        )
        loader = DataLoader(Probe(ds, True), batch_size=None, num_workers=2)
        per_worker: dict[int, list] = {}
        for x in loader:
            per_worker.setdefault(int(x["wid"]), []).extend(int(i) for i in x["ids"])
        got.extend(per_worker[w] for w in sorted(per_worker))
    assert [i for part in got for i in part] == list(range(n))
    sizes = [len(p) for p in got]
    assert len(sizes) == 4 and max(sizes) - min(sizes) <= 1, sizes


def test_dataloader_row_mode_collation(shard_factory):
    ss = shard_factory(num_shards=3, rows_per_shard=[50, 33, 41], tokens_len=(4, 4), nulls=False)
    for nw in (0, 2):
        ds = ParquetStream(
            ss.root,
            output="torch",
            columns=["id", "tokens", "text", "label"],
            shuffle_buffer=7,
            seed=1,
        )
        loader = DataLoader(ds, batch_size=8, num_workers=nw)
        seen = []
        for b in loader:
            assert isinstance(b["id"], torch.Tensor) and b["id"].dim() == 1
            assert b["tokens"].shape == (len(b["id"]), 4)
            assert isinstance(b["text"], list)
            for i, tok, txt, lab in zip(
                b["id"].tolist(), b["tokens"].tolist(), b["text"], b["label"].tolist(), strict=True
            ):
                assert tok == [i % 1000 + k for k in range(4)]
                assert txt == f"row-{i}" and lab == i % 100
                seen.append(i)
        assert sorted(seen) == sorted(ss.ids), f"num_workers={nw}"


def test_dataset_pickles(small):
    ds = make_ds(small.root, dict(output="python", batch_size=5, shuffle_buffer=7, seed=3))
    want = keys_of(ds, True)
    ds2 = pickle.loads(pickle.dumps(ds))
    assert keys_of(ds2, True) == want
    # mid-iteration pickling of the dataset object (not the iterator) must also work
    ds3 = make_ds(small.root, dict(output="python", batch_size=5, shuffle_buffer=7, seed=3))
    it = iter(ds3)
    next(it)
    ds4 = pickle.loads(pickle.dumps(ds3))
    assert keys_of(ds4, True) in (want, want[1:])


@pytest.mark.timeout(600)
def test_dataloader_spawn(small):
    ds = make_ds(small.root, dict(output="torch", batch_size=16, shuffle_buffer=7, seed=1))
    loader = DataLoader(ds, batch_size=None, num_workers=2, multiprocessing_context="spawn")
    got = flat_ids(item_key(b, True) for b in loader)
    assert sorted(got) == sorted(small.ids)


@pytest.mark.timeout(600)
def test_two_phase_load_in_spawned_workers(small):
    """A two-phase elastic load (summaries + only the states this rank's 2 workers need) is
    handed to spawned workers: the stream is exactly the one of every state, forked."""
    from shardstream.checkpoint import state_summaries

    s = dict(output="python", batch_size=5, shuffle_buffer=60, seed=3, epochs=2, even=None)
    states = []
    for r in range(6):  # old layout: 6 slots
        ds = make_ds(small.root, dict(s, rank=r, world_size=6))
        it = iter(ds)
        for _ in range(2 + r):
            next(it)
        states.append(torch_roundtrip(ds.state_dict()))
    summaries = state_summaries(states)
    new = dict(s, rank=1, world_size=2)  # new layout: 2 ranks x 2 workers
    ds = make_ds(small.root, new)
    need = ds.needed_slots(summaries, num_workers=2)
    assert 0 < len(need) < 6
    ds.load_state_dict([states[i] for i in need], summaries=summaries)
    got = loader_keys(
        DataLoader(ds, batch_size=None, num_workers=2, multiprocessing_context="spawn")
    )
    ref = make_ds(small.root, new)
    ref.load_state_dict(states)
    want = loader_keys(DataLoader(ref, batch_size=None, num_workers=2))
    assert want and got == want


# ------------------------------------------------------- StatefulDataLoader

SDL_SETTINGS = dict(output="torch", batch_size=16, shuffle_buffer=7, seed=1, epochs=2)


def _sdl(source, settings, nw, ctx=None, **kw):
    return StatefulDataLoader(
        make_ds(source, settings),
        batch_size=None,
        num_workers=nw,
        multiprocessing_context=ctx,
        **kw,
    )


def _first_diff(a, b):
    return next((i for i, (x, y) in enumerate(zip(a, b, strict=False)) if x != y), None)


def _sdl_resume_check(source, settings, nw, ks, ctx=None, full=None):
    """ks: list of k, or a function n -> list of k."""
    if full is None:
        full = loader_keys(_sdl(source, settings, nw, ctx))
    n = len(full)
    if callable(ks):
        ks = ks(n)
    for k in ks:
        k = min(k, n)
        loader = _sdl(source, settings, nw, ctx)
        it = iter(loader)
        head = [item_key(next(it), True) for _ in range(k)]
        assert head == full[:k]
        state = torch_roundtrip(loader.state_dict())
        # drain the first loader (workers end normally; also: state_dict() must not disturb it)
        assert head + [item_key(x, True) for x in it] == full
        del it, loader
        loader2 = _sdl(source, settings, nw, ctx)
        loader2.load_state_dict(state)
        rest = loader_keys(loader2)
        assert head + rest == full, (
            f"num_workers={nw} k={k}: resumed {len(rest)} batches, expected {n - k}; "
            f"first differing: {_first_diff(full[k:], rest)}"
        )
    return full


@pytest.mark.parametrize("num_workers", [0, 1, 2, 4])
def test_stateful_dataloader_resume(small, num_workers):
    settings = SDL_SETTINGS
    full = loader_keys(_sdl(small.root, settings, num_workers))
    check_epochs_flat(full, small, epochs=2)
    n = len(full)
    # per-epoch batch count per worker is ~ (510 / nw) / 16; n//2 is past the first epoch of
    # every worker's slot (each worker runs its 2 epochs back to back)
    ks = [0, 1, 3, n // 2 - 1, n // 2 + 1, (3 * n) // 4, n - 1, n]
    _sdl_resume_check(small.root, settings, num_workers, ks, full=full)


def check_epochs_flat(full, ss, epochs):
    c = Counter(flat_ids(full))
    assert c == Counter({i: epochs for i in ss.ids})


def test_stateful_dataloader_num_workers0_matches_dataset(small):
    full = loader_keys(_sdl(small.root, SDL_SETTINGS, 0))
    ds = make_ds(small.root, SDL_SETTINGS)
    assert full == keys_of(ds, True)
    check_epochs(full, list(ds.shards), SDL_SETTINGS)


@pytest.mark.parametrize("num_workers", [0, 2])
def test_stateful_dataloader_resume_row_mode_special(special, num_workers):
    settings = dict(
        output="python", batch_size=3, drop_last=True, shuffle_buffer=5, seed=4, epochs=2
    )
    _sdl_resume_check(special.root, settings, num_workers, lambda n: [0, 2, n // 2, n - 2])


@pytest.mark.timeout(900)
def test_stateful_dataloader_resume_spawn(small):
    settings = dict(output="numpy", batch_size=32, shuffle_buffer=7, seed=1, epochs=1)
    # the uninterrupted stream comes from a fork loader: spawn must give the same stream
    full = loader_keys(_sdl(small.root, settings, 2))
    _sdl_resume_check(small.root, settings, 2, lambda n: [n // 2], ctx="spawn", full=full)


@pytest.mark.parametrize("num_workers", [0, 2])
def test_stateful_dataloader_resume_across_loader_passes(small, num_workers):
    """Two passes over the same loader; state taken inside the second pass, and at the very
    end of the first pass (StopIteration seen) -> the resumed loader continues/starts pass 2."""
    settings = dict(output="python", batch_size=32, shuffle_buffer=7, seed=2)
    loader = _sdl(small.root, settings, num_workers)
    pass1 = loader_keys(loader)
    pass2 = loader_keys(loader)
    assert sorted(flat_ids(pass1)) == sorted(small.ids)
    assert pass2 == pass1  # same epoch (no set_epoch), a finished pass restarts
    n = len(pass1)
    # (a) mid second pass
    loader = _sdl(small.root, settings, num_workers)
    loader_keys(loader)
    it = iter(loader)
    head = [item_key(next(it), True) for _ in range(n // 2)]
    state = torch_roundtrip(loader.state_dict())
    assert head + [item_key(x, True) for x in it] == pass2
    loader2 = _sdl(small.root, settings, num_workers)
    loader2.load_state_dict(state)
    assert head + loader_keys(loader2) == pass2
    # (b) end of the first pass (StopIteration seen): torchdata drops the iterator it loaded
    # the finished state into and expects a new pass from a fresh one; with 0 workers the
    # fresh one iterates the same dataset object, which yielded nothing (Lightning lost an
    # epoch so, from a checkpoint at an epoch's last step): a new pass, as with workers.
    loader = _sdl(small.root, settings, num_workers)
    loader_keys(loader)
    state = torch_roundtrip(loader.state_dict())
    loader2 = _sdl(small.root, settings, num_workers)
    loader2.load_state_dict(state)
    assert loader_keys(loader2) == pass2
    assert loader_keys(loader2) == pass2


@pytest.mark.parametrize("num_workers", [0, 2])
@pytest.mark.parametrize("drop_last,epochs", [(False, 1), (True, 1), (False, 2)])
def test_the_set_epoch_loop_resumes_exactly_at_an_epoch_end(small, num_workers, drop_last, epochs):
    """The guide's loop (``ds.set_epoch(e)``, then the loader), resumed from a state saved at
    an epoch's end: after its last batch (resumed at that epoch: nothing more of it, then the
    next epoch in full; or resumed at the next epoch: that one in full), and after the loop
    ended (resumed at the next epoch). torchdata loads the state inside ``iter(loader)``, after
    ``set_epoch``: with 0 workers the next epoch was skipped whole (both states), with 2
    workers after the last batch. With ``epochs=2`` a pass is two epochs."""
    settings = dict(
        output="python", batch_size=32, shuffle_buffer=7, seed=2, drop_last=drop_last, epochs=epochs
    )

    def run(state, first, last):
        loader = _sdl(small.root, settings, num_workers)
        if state is not None:
            loader.load_state_dict(state)
        out = []
        for e in range(first, last):
            loader.dataset.set_epoch(e)
            out.append(loader_keys(loader))
        return out

    ref = run(None, 0, 3)
    assert ref[0] != ref[1] and all(ref)
    loader = _sdl(small.root, settings, num_workers)
    loader.dataset.set_epoch(0)
    it = iter(loader)
    assert [item_key(next(it), True) for _ in range(len(ref[0]))] == ref[0]
    at_last = torch_roundtrip(loader.state_dict())
    assert list(it) == []
    ended = torch_roundtrip(loader.state_dict())
    assert run(at_last, 0, 3) == [[], ref[1], ref[2]]
    assert run(at_last, 1, 3) == [ref[1], ref[2]]
    assert run(ended, 1, 3) == [ref[1], ref[2]]
    # resumed at its own epoch (not the rule): that epoch again, 0 workers or more
    assert run(ended, 0, 2) == [ref[0], ref[1]]


@pytest.mark.parametrize("num_workers", [2, 4])
def test_more_workers_than_rows(shard_factory, num_workers):
    ss = shard_factory(num_shards=2, rows_per_shard=[2, 1], seed=1)
    settings = dict(output="python", batch_size=2, shuffle_buffer=3, seed=1, epochs=2)
    full = _sdl_resume_check(ss.root, settings, num_workers, lambda n: list(range(n + 1)))
    assert Counter(flat_ids(full)) == Counter({0: 2, 1: 2, 2: 2})


@pytest.mark.parametrize("num_workers", [0, 2])
def test_stateful_dataloader_sparse_snapshots(small, num_workers):
    """snapshot_every_n_steps > 1: torchdata restores an older worker snapshot and replays."""
    settings = dict(output="numpy", batch_size=16, shuffle_buffer=7, seed=1, epochs=2)
    full = loader_keys(_sdl(small.root, settings, num_workers))
    for k in (5, len(full) // 2 + 1):
        loader = _sdl(small.root, settings, num_workers, snapshot_every_n_steps=4)
        it = iter(loader)
        head = [item_key(next(it), True) for _ in range(k)]
        state = torch_roundtrip(loader.state_dict())
        assert head + [item_key(x, True) for x in it] == full
        loader2 = _sdl(small.root, settings, num_workers, snapshot_every_n_steps=4)
        loader2.load_state_dict(state)
        assert head + loader_keys(loader2) == full, f"k={k}"


@pytest.mark.timeout(180)
def test_fork_after_main_process_iteration(small):
    """Workers forked while the main process has a half-read stream (and whatever background
    readers it keeps) must not deadlock and must read their slots correctly."""
    settings = dict(output="torch", batch_size=16, shuffle_buffer=7, seed=1)
    busy = make_ds(small.root, settings)
    it = iter(busy)
    next(it)
    next(it)
    for ds in (make_ds(small.root, settings), make_ds(small.root, settings)):
        loader = DataLoader(ds, batch_size=None, num_workers=2)
        got = flat_ids(item_key(b, True) for b in loader)
        assert sorted(got) == sorted(small.ids)
    # the main-process stream is unaffected by the forks
    rest = [item_key(b, True) for b in it]
    full = keys_of(make_ds(small.root, settings), True)
    assert full[2:] == rest
    # a dataset that finished a pass in the main process, then handed to workers
    done = make_ds(small.root, settings)
    keys_of(done, True)
    got = flat_ids(item_key(b, True) for b in DataLoader(done, batch_size=None, num_workers=2))
    assert sorted(got) == sorted(small.ids)


@pytest.mark.parametrize("new_workers", [1, 4])
def test_stateful_dataloader_other_num_workers_is_state_error(small, new_workers):
    """Slot layout differs (2 workers at save) -> StateError from the workers, not a silently
    different stream."""
    from shardstream import StateError

    settings = dict(output="python", batch_size=16, shuffle_buffer=7, seed=1)
    loader = _sdl(small.root, settings, 2)
    it = iter(loader)
    for _ in range(5):
        next(it)
    state = torch_roundtrip(loader.state_dict())
    for _ in it:  # let the workers finish normally
        pass
    loader2 = _sdl(small.root, settings, new_workers)
    loader2.load_state_dict(state)
    with pytest.raises(StateError):
        list(loader2)


def test_set_epoch_after_stateful_loader_state_dict(small):
    """accelerate's order: ``StatefulDataLoader.state_dict()`` (creates the iterator, which calls
    ``iter(dataset)``), then ``set_epoch``, then the loader iterates that same iterator: it must
    read the epoch just set (an iterator sets itself up at its first ``next()``)."""
    settings = dict(columns=["id"], batch_size=16, shuffle_buffer=40, seed=3, output="python")
    ref = make_ds(small.root, settings)
    ref.set_epoch(1)
    expected = [tuple(b["id"]) for b in ref]
    ds = make_ds(small.root, settings)
    loader = StatefulDataLoader(ds, batch_size=None, num_workers=0)
    loader.state_dict()
    ds.set_epoch(1)
    assert [tuple(b["id"]) for b in loader] == expected
    # A created iterator also follows a state loaded before its first next().
    it = iter(ds)
    saved = make_ds(small.root, settings)
    saved.set_epoch(1)
    head = iter(saved)
    next(head), next(head)
    ds.load_state_dict(saved.state_dict())
    assert [tuple(b["id"]) for b in it] == expected[2:]


@pytest.mark.timeout(600)
@pytest.mark.parametrize("ctx", ["fork", "spawn"])
def test_persistent_workers_follow_set_epoch(small, ctx):
    """``persistent_workers=True``: the workers keep their copies across epochs, so the
    training loop's ``ds.set_epoch(e)`` must reach them (each epoch reshuffled exactly as
    fresh workers read it; before, every epoch repeated epoch 0's order). A position given in
    the main process after they started cannot reach them: a ``RuntimeError`` says so."""
    settings = dict(columns=["id"], batch_size=16, shuffle_buffer=40, seed=3, output="python")

    def epochs(persistent):
        ds = make_ds(small.root, settings)
        dl = DataLoader(
            ds, batch_size=None, num_workers=2, persistent_workers=persistent,
            multiprocessing_context=ctx,
        )  # fmt: skip
        out = []
        for e in range(3):
            ds.set_epoch(e)
            out.append(loader_keys(dl))
        return out, ds, dl

    fresh, _, _ = epochs(False)
    kept, ds, dl = epochs(True)
    assert kept == fresh
    assert fresh[0] != fresh[1] and fresh[1] != fresh[2]
    for e in fresh:
        assert sorted(flat_ids(e)) == sorted(small.ids)
    ds.load_state_dict(ds.state_dict())
    with pytest.raises(
        RuntimeError, match=r"load_state_dict\(\) or skip\(\) was called in the main"
    ):
        list(dl)


def test_copies_of_a_dataset_signal_their_own_workers(small):
    """A copy (``copy.deepcopy``, ``pickle``) is a dataset of its own: its ``set_epoch`` reaches
    its own persistent workers, and the original's calls do not reach the copy's."""
    import copy

    settings = dict(columns=["id"], batch_size=16, shuffle_buffer=40, seed=3, output="python")
    ds = make_ds(small.root, settings)
    twin = copy.deepcopy(ds)
    dl = DataLoader(twin, batch_size=None, num_workers=2, persistent_workers=True)
    twin.set_epoch(0)
    first = loader_keys(dl)
    ds.set_epoch(1)  # the original's: not the copy's workers'
    assert loader_keys(dl) == first
    twin.set_epoch(1)
    ref = make_ds(small.root, settings)
    ref.set_epoch(1)
    second = loader_keys(dl)
    assert second == loader_keys(DataLoader(ref, batch_size=None, num_workers=2))
    assert second != first
    assert sorted(flat_ids(second)) == sorted(flat_ids(first)) == sorted(small.ids)
