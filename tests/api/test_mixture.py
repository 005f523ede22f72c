"""Mixture: exact resume (any point, twice, every output mode), workers and ranks, elastic
layouts, changed weights / sources on resume, strictness, exhaustion, columns, errors, CLI.

Every exactness check compares full streams of ``(source tag, id)`` keys against the
uninterrupted run (the Rust core's property tests cover the mixing rule and random layouts:
``rust/core/src/mix/``)."""

from __future__ import annotations

import itertools
import json
import pickle
import re
import warnings
from collections import Counter

import numpy as np
import pyarrow as pa
import pytest
import torch
from harness import as_version_2, pickle_roundtrip, scalar_int, torch_roundtrip
from shardstream import Mixture, ParquetStream, SchemaError, StateError, _core
from torch.utils.data import DataLoader
from torchdata.stateful_dataloader import StatefulDataLoader

pytestmark = pytest.mark.timeout(300)

ROWS = {"code": 65, "math": 17, "web": 135}


@pytest.fixture(scope="module")
def data(shard_factory):
    return {
        "web": shard_factory(num_shards=3, rows_per_shard=[60, 45, 30], seed=21),
        "code": shard_factory(num_shards=2, rows_per_shard=[40, 25], seed=22, start_id=1000),
        "math": shard_factory(num_shards=1, rows_per_shard=17, seed=23, start_id=2000),
    }


def sources(data, columns=("id", "tokens"), shuffle=(0, 5, 3), **kw):
    return {
        n: ParquetStream(data[n].root, columns=list(columns), shuffle_buffer=b, seed=i, **kw)
        for i, (n, b) in enumerate(zip(("code", "math", "web"), shuffle, strict=True))
    }


def mix(data, **kw):
    args = dict(weights={"web": 0.6, "code": 0.3, "math": 0.1}, samples=400, output="python")
    args.update(kw)
    src = args.pop("sources", None) or sources(data)
    return Mixture(src, **args)


def key(item, batched, tag="source"):
    """``((tag, id), ...)`` of a batch, ``(tag, id)`` of a row, in any output mode."""
    if isinstance(item, pa.RecordBatch):
        pairs = tuple(zip(item.column(tag).to_pylist(), item.column("id").to_pylist(), strict=True))
        return pairs if batched else pairs[0]
    if not batched:
        return (scalar_int(item[tag]), scalar_int(item["id"]))
    ids, tags = item["id"], item[tag]
    to_list = lambda v: v.tolist() if hasattr(v, "tolist") else list(v)  # noqa: E731
    return tuple(zip(map(int, to_list(tags)), map(int, to_list(ids)), strict=True))


def keys(ds, batched=True):
    return [key(x, batched) for x in ds]


def flat(ks):
    return [p for k in ks for p in (k if isinstance(k[0], tuple) else [k])]


# ------------------------------------------------------------------ exact resume


@pytest.mark.parametrize(
    "kw",
    [
        dict(batch_size=7),
        dict(batch_size=None),
        dict(batch_size=8, mixing="stratified", output="torch"),
        dict(batch_size=5, mixing="random", output="numpy", drop_last=True),
        dict(batch_size=None, mixing="stratified", block=6, output="torch"),
        dict(batch_size=4, output="arrow", on_exhausted={"math": "stop"}, samples=None),
    ],
    ids=["det-b7", "det-rows", "strat-torch", "random-numpy", "strat-rows", "stop-arrow"],
)
def test_resume_anywhere_twice(data, kw):
    batched = kw.get("batch_size") is not None
    full = keys(mix(data, **kw), batched)
    n = len(full)
    assert n > 10
    for k in sorted({0, 1, n // 3, n // 2, n - 1, n}):
        ds = mix(data, **kw)
        it = iter(ds)
        head = [key(next(it), batched) for _ in range(k)]
        state = torch_roundtrip(ds.state_dict())
        assert head == full[:k]
        ds2 = mix(data, **kw)
        ds2.load_state_dict(pickle_roundtrip(state))
        it2 = iter(ds2)
        m = (n - k) // 2
        mid = [key(next(it2), batched) for _ in range(m)]
        state2 = json.loads(json.dumps(ds2.state_dict()))
        rest = [key(x, batched) for x in it2]
        assert head + mid + rest == full, f"k={k}"
        ds3 = mix(data, **kw)
        ds3.load_state_dict(state2)
        assert head + mid + keys(ds3, batched) == full, f"k={k}, twice"


def test_set_epoch_does_not_move_a_mixture(data):
    """Trainers call set_epoch as every pass starts (accelerate's loaders, with the loop's or
    their own count): a mixture has no epochs, so neither a fresh nor a loaded one moves."""
    full = keys(mix(data, batch_size=7))
    m = mix(data, batch_size=7)
    it = iter(m)
    head = [key(next(it), True) for _ in range(9)]
    resumed = mix(data, batch_size=7)
    resumed.load_state_dict(m.state_dict())
    resumed.set_epoch(3)
    assert head + keys(resumed) == full
    fresh = mix(data, batch_size=7)
    fresh.set_epoch(1)
    assert keys(fresh) == full
    with pytest.raises(ValueError, match="epoch must be an int"):
        fresh.set_epoch(-1)


@pytest.mark.parametrize("num_workers", [0, 2])
@pytest.mark.parametrize(
    "kw",
    [
        dict(batch_size=7),
        dict(batch_size=7, drop_last=True, mixing="stratified"),
        dict(batch_size=4, on_exhausted={"math": "stop"}, samples=None),
        dict(batch_size=None),
    ],
    ids=["samples", "drop_last", "stop", "rows"],
)
def test_the_set_epoch_loop_resumes_exactly_at_the_mixture_end(data, num_workers, kw):
    """The guide's loop (``set_epoch(e)``, then the loader) over a mixture that ends (its
    ``samples``, a ``"stop"`` source), through a StatefulDataLoader, resumed from a state saved
    at a pass's end: after its last batch (resumed at that epoch: nothing more, then full
    passes; or, batched by the mixture, at the next epoch: a full pass), and after the loop
    ended (resumed at the next epoch). torchdata loads the state inside ``iter(loader)``, after
    ``set_epoch``: the resumed loop had an empty pass (two in row mode with 0 workers) where the
    uninterrupted loop starts the mixture over."""
    rows = kw.get("batch_size") is None

    def make():  # fresh sources for each mixture, of the ids only (rows collate)
        return mix(data, **{**kw, "sources": sources(data, columns=("id",))})

    def run(state, first, last=3):
        m = make()
        loader = StatefulDataLoader(m, batch_size=8 if rows else None, num_workers=num_workers)
        if state is not None:
            loader.load_state_dict(state)
        out = []
        for e in range(first, last):
            loader.dataset.set_epoch(e)
            out.append([key(b, True) for b in loader])
        return out

    ref = run(None, 0)
    assert ref[0] and ref[1] == ref[0] == ref[2]  # an ended mixture starts over
    loader = StatefulDataLoader(make(), batch_size=8 if rows else None, num_workers=num_workers)
    loader.dataset.set_epoch(0)
    it = iter(loader)
    assert [key(next(it), True) for _ in range(len(ref[0]))] == ref[0]
    at_last = torch_roundtrip(loader.state_dict())
    assert list(it) == []
    ended = torch_roundtrip(loader.state_dict())
    assert run(at_last, 0) == [[], ref[1], ref[2]]
    assert run(ended, 1) == [ref[1], ref[2]]
    # resumed at its own epoch (not the rule): the mixture again, 0 workers or more
    assert run(ended, 0, 2) == [ref[0], ref[1]]
    if not rows or num_workers:
        # (in row mode with 0 workers torchdata restores that its fetcher ended: the rule of
        # docs/guide.md "Epochs and passes", resume there at the state's own epoch)
        assert run(at_last, 1) == [ref[1], ref[2]]


def test_a_mixture_state_records_the_set_epoch_of_its_pass(data):
    """``epoch`` in the state: absent until set_epoch, then the pass's; a state without it
    (saved before set_epoch, or by an earlier release) loads as before, and states that
    disagree load as if none had one."""
    m = mix(data, batch_size=7)
    assert "epoch" not in m.state_dict()
    it = iter(m)
    next(it)
    assert "epoch" not in m.state_dict()
    m = mix(data, batch_size=7)
    m.set_epoch(5)
    it = iter(m)
    next(it)
    st = m.state_dict()
    assert st["epoch"] == 5
    rest = [key(x, True) for x in it]
    ended = m.state_dict()
    assert ended["epoch"] == 5
    for bad in (-1, "5", 1.5, True):
        with pytest.raises(StateError, match="epoch"):
            mix(data, batch_size=7).load_state_dict({**st, "epoch": bad})
    # a state of the pass's end, loaded for a later epoch, starts over; without its epoch (or
    # loaded for its own epoch) that pass has nothing left
    full = keys(mix(data, batch_size=7))
    for state, epoch, want in (
        (ended, 6, full),
        (ended, 5, []),
        ({k: v for k, v in ended.items() if k != "epoch"}, 6, []),
    ):
        r = mix(data, batch_size=7)
        r.load_state_dict(state)
        r.set_epoch(epoch)
        assert keys(r) == want, (epoch, "epoch" in state)
    r = mix(data, batch_size=7)
    r.load_state_dict(st)
    r.set_epoch(6)  # mid-pass: the loaded position continues, whatever the epoch
    assert keys(r) == rest


def test_persistent_workers_record_the_epoch_of_their_pass(data):
    """With ``persistent_workers=True`` the workers' copies live across passes: the epoch each
    pass's states record is the one ``set_epoch`` gave it in the main process."""
    from shardstream.state import gather

    loader = StatefulDataLoader(
        mix(data, batch_size=7), batch_size=None, num_workers=2, persistent_workers=True
    )
    for e in (3, 4):
        loader.dataset.set_epoch(e)
        it = iter(loader)
        for _ in range(5):
            next(it)
        states = gather(loader.state_dict())
        assert [s["epoch"] for s in states] == [e, e]
        del it


def test_persistent_workers_read_each_pass_as_fresh_workers(data):
    """The set_epoch loop leaving each pass early (a fixed number of steps an epoch) over an
    endless mixture: fresh workers read every pass from the start point they were made with;
    persistent workers went on from where they had stopped, past the batches the loader had
    prefetched (each epoch started 10 batches further on), silently."""

    def loop(persistent: bool) -> list:
        m = mix(data, batch_size=7, samples=None)
        loader = StatefulDataLoader(
            m, batch_size=None, num_workers=2, persistent_workers=persistent
        )
        out = []
        for e in range(3):
            loader.dataset.set_epoch(e)
            out.append([key(b, True) for b in itertools.islice(loader, 6)])
        return out

    fresh = loop(False)
    assert fresh[0] == fresh[1] == fresh[2] and len(fresh[0]) == 6
    assert loop(True) == fresh


def test_stop_ends_right_after_the_stop_source_and_drop_takes_every_row(data):
    # math stops the mixture: its 17 rows, then nothing.
    got = flat(keys(mix(data, on_exhausted={"math": "stop"}, samples=None, batch_size=4)))
    names = ["code", "math", "web"]
    c = Counter(names[t] for t, _ in got)
    assert c["math"] == 17 and got[-1][0] == names.index("math")
    # every source drops after 2 epochs: each row exactly twice.
    got = flat(keys(mix(data, on_exhausted="drop", max_epochs=2, samples=None, batch_size=9)))
    for t, n in enumerate(names):
        ids = Counter(i for s, i in got if s == t)
        assert set(ids.values()) == {2} and len(ids) == ROWS[n], n


def test_single_source_equals_the_plain_stream(data):
    plain = ParquetStream(
        data["web"].root,
        columns=["id"],
        shuffle_buffer=9,
        seed=4,
        epochs=3,
        batch_size=6,
        output="python",
    )
    want = [tuple(b["id"]) for b in plain]
    src = {"web": ParquetStream(data["web"].root, columns=["id"], shuffle_buffer=9, seed=4)}
    m = Mixture(src, weights={"web": 1}, max_epochs=3, batch_size=6, output="python")
    got = [tuple(b["id"]) for b in m]
    # Row for row the plain stream's 3 epochs; a mixture's batches run across a source's epoch
    # end (a mixed batch would anyway), so only the last one is short.
    assert [i for b in got for i in b] == [i for b in want for i in b]
    assert [len(b) for b in got] == [6] * (len(got) - 1) + [3 * 135 % 6 or 6]
    assert all(
        set(b["source"]) == {0}
        for b in Mixture(src, weights={"web": 1}, max_epochs=1, batch_size=6, output="python")
    )


# ------------------------------------------------------------------ workers and ranks


def _loader(data, nw, **kw):
    return StatefulDataLoader(mix(data, **kw), batch_size=None, num_workers=nw)


def test_version_2_source_states_load_and_continue_identically(data):
    """A mixture state whose sources were saved as stream state version 2 (base64 buffers)."""
    full = keys(mix(data, batch_size=7))
    k = len(full) // 3
    ds = mix(data, batch_size=7)
    it = iter(ds)
    head = [key(next(it), True) for _ in range(k)]
    state = ds.state_dict()
    assert any(s["position"]["buffer"] for s in state["sources"].values())
    state["sources"] = {n: as_version_2(s) for n, s in state["sources"].items()}
    ds2 = mix(data, batch_size=7)
    ds2.load_state_dict(json.loads(json.dumps(state)))
    assert head + keys(ds2) == full


@pytest.mark.parametrize("num_workers", [0, 2])
def test_stateful_dataloader_resume(data, num_workers):
    kw = dict(batch_size=8, output="torch")
    full = keys(_loader(data, num_workers, **kw))
    n = len(full)
    for k in (1, n // 2, n - 1):
        loader = _loader(data, num_workers, **kw)
        it = iter(loader)
        head = [key(next(it), True) for _ in range(k)]
        state = torch_roundtrip(loader.state_dict())
        loader2 = _loader(data, num_workers, **kw)
        loader2.load_state_dict(state)
        assert head + keys(loader2) == full, f"k={k}"


def test_dataloader_workers_pickle_with_spawn(data):
    kw = dict(batch_size=8, output="numpy")
    ds = mix(data, **kw)
    it = iter(ds)
    head = [key(next(it), True) for _ in range(3)]
    full = keys(mix(data, **kw))
    # The iterated dataset pickles its position; a spawned single worker continues from it.
    ds2 = pickle.loads(pickle.dumps(ds))
    assert head + keys(ds2) == full
    loader = DataLoader(
        mix(data, **kw), batch_size=None, num_workers=2, multiprocessing_context="spawn"
    )
    assert sorted(flat(keys(loader))) == sorted(flat(keys(_loader(data, 2, **kw))))


@pytest.mark.parametrize("even", ["drop", "pad"])
def test_ranks_yield_equal_batches_and_stop_together(data, even):
    kw = dict(batch_size=4, even=even, on_exhausted={"math": "stop"}, samples=None)
    per_rank = [keys(mix(data, rank=r, world_size=3, **kw)) for r in range(3)]
    assert len({len(p) for p in per_rank}) == 1
    # Each rank's math rows are its own share: none repeated across ranks (even="drop").
    names = ["code", "math", "web"]
    maths = [i for p in per_rank for t, i in flat(p) if names[t] == "math"]
    if even == "drop":
        assert len(maths) == len(set(maths)) == 3 * (17 // 3)


@pytest.mark.parametrize("old,new", [(2, 3), (3, 1), (2, 2)])
def test_elastic_ranks_every_row_once_per_source_epoch(data, old, new):
    kw = dict(
        batch_size=5,
        even=None,
        on_exhausted="drop",
        max_epochs=1,
        samples=None,
        sources=sources(data, shuffle=(4, 2, 7)),
    )
    seen, states = [], []
    for r in range(old):
        ds = mix(data, rank=r, world_size=old, **kw)
        it = iter(ds)
        for _ in range(3 + r):
            seen.extend(flat([key(next(it), True)]))
        states.append(torch_roundtrip(ds.state_dict()))
    for r in range(new):
        ds = mix(
            data, rank=r, world_size=new, **{**kw, "sources": sources(data, shuffle=(4, 2, 7))}
        )
        ds.load_state_dict(states)
        seen.extend(flat(keys(ds)))
    names = ["code", "math", "web"]
    for t, n in enumerate(names):
        ids = [i for s, i in seen if s == t]
        assert sorted(ids) == sorted(data[n].ids), n


def test_elastic_workers_every_row_once_per_source_epoch(data):
    """2 DataLoader workers -> 3: every row of every source once in its one epoch."""
    kw = dict(batch_size=4, even=None, on_exhausted="drop", max_epochs=1, samples=None)
    loader = _loader(data, 2, **kw)
    it = iter(loader)
    seen = flat([key(next(it), True) for _ in range(7)])
    state = torch_roundtrip(loader.state_dict())
    del it
    ds = mix(data, **kw)
    ds.load_state_dict(state)  # the loader state holds both workers' (guide: Elastic resume)
    seen += flat(keys(StatefulDataLoader(ds, batch_size=None, num_workers=3)))
    for t, n in enumerate(["code", "math", "web"]):
        assert sorted(i for s, i in seen if s == t) == sorted(data[n].ids), n


def test_resize_with_new_weights_holds_them_from_the_resize(data):
    """2 ranks -> 3 with other weights: each new rank's every prefix holds each source within
    one item of the new target (the targets restart at the resize), and each source's rows
    over all ranks are its own stream's, none repeated before the epoch rolls over."""
    kw = dict(batch_size=3, even=None, samples=None, on_exhausted="cycle")
    states = []
    for r in range(2):
        ds = mix(data, rank=r, world_size=2, **kw)
        it = iter(ds)
        for _ in range(4 + r):
            next(it)
        states.append(ds.state_dict())
    w = {"code": 0.5, "math": 0.25, "web": 0.25}
    for r in range(3):
        ds = mix(data, rank=r, world_size=3, weights=w, **kw)
        ds.load_state_dict(states)
        it = iter(ds)
        got = [s for _ in range(20) for s, _ in key(next(it), True)]
        for t in range(1, len(got) + 1):
            for j, n in enumerate(["code", "math", "web"]):
                assert abs(got[:t].count(j) - t * w[n]) < 1, (r, t, n)


@pytest.mark.parametrize(
    "policy", [dict(on_exhausted={"math": "drop"}), dict(max_epochs={"math": 1})]
)
def test_a_stretch_whose_weighted_source_left_follows_the_next_point(data, policy):
    """Step schedule: only math (17 rows) has weight until item 100, then web and code. When
    math leaves at item 17, items 17..99 follow the next point's weights (the mixture ended
    there, 383 items short of `samples`): every prefix from there within one item of 50/50,
    and a resume anywhere in that stretch continues exactly."""
    sched = [(0, {"web": 0, "code": 0, "math": 1}), (100, {"web": 0.5, "code": 0.5, "math": 0})]
    kw = dict(weights=sched, samples=400, batch_size=None, **policy)
    got = [s for s, _ in keys(mix(data, **kw), batched=False)]
    names = mix(data, **kw).source_names
    assert len(got) == 400
    assert got[:17] == [names.index("math")] * 17 and names.index("math") not in got[17:]
    rest = got[17:]
    for t in range(1, len(rest) + 1):
        for n in ("web", "code"):
            assert abs(rest[:t].count(names.index(n)) - t / 2) < 1, (t, n)
    full = keys(mix(data, **kw), batched=False)
    for cut in (17, 18, 60, 99, 100, 101):
        ds = mix(data, **kw)
        it = iter(ds)
        head = [key(next(it), False) for _ in range(cut)]
        resumed = mix(data, **kw)
        resumed.load_state_dict(torch_roundtrip(ds.state_dict()))
        assert head + keys(resumed, batched=False) == full, cut


# ------------------------------------------------------------------ changes on resume


def test_weights_change_on_resume_continues_every_source(data):
    kw = dict(batch_size=6, on_exhausted="cycle", samples=300)
    ds = mix(data, **kw)
    it = iter(ds)
    head = flat([key(next(it), True) for _ in range(10)])
    state = ds.state_dict()
    new_w = {"web": 0.2, "code": 0.2, "math": 0.6}
    strict = mix(data, **kw, weights=new_w)
    with pytest.raises(StateError, match="weights changed"):
        strict.load_state_dict(state, strict=True)
    ds2 = mix(data, **kw, weights=new_w)
    ds2.load_state_dict(state)
    rest = flat(keys(ds2))
    assert len(head) + len(rest) == 300
    names = ["code", "math", "web"]
    # Each source continues its own stream exactly (the uninterrupted single-source order).
    for t, n in enumerate(names):
        mine = [i for s, i in head + rest if s == t]
        alone = Mixture(
            {n: sources(data)[n]},
            weights={n: 1},
            samples=len(mine),
            output="python",
            batch_size=len(mine) or 1,
        )
        assert mine == [i for _, i in flat(keys(alone))], n
    # From the resume point, math's count stays within one item of 60%.
    c = 0
    for j, (s, _) in enumerate(rest, 1):
        c += s == names.index("math")
        assert abs(c - 0.6 * j) < 1 + 1e-6


def test_sources_added_and_removed_on_resume(data):
    full_src = sources(data)
    two = {n: full_src[n] for n in ("web", "code")}
    a = Mixture(two, weights={"web": 1, "code": 1}, batch_size=5, output="python")
    it = iter(a)
    seen = flat([key(next(it), True) for _ in range(4)])
    names_a = a.source_names
    state = a.state_dict()
    # Remove code, add math.
    b_src = {n: sources(data)[n] for n in ("web", "math")}
    b = Mixture(b_src, weights={"web": 1, "math": 1}, batch_size=5, output="python")
    with pytest.raises(StateError, match='source "math" added.*source "code" removed'):
        b.load_state_dict(state, strict=True)
    policy = Mixture(two, weights={"web": 1, "code": 1}, batch_size=5, max_epochs={"code": 2})
    with pytest.raises(
        StateError,
        match=re.escape(
            'source "code": on_exhausted="cycle", max_epochs=2 (was on_exhausted="cycle", '
            "max_epochs=None)"
        ),
    ):
        policy.load_state_dict(state, strict=True)
    b.load_state_dict(state)
    it = iter(b)
    seen_b = flat([key(next(it), True) for _ in range(4)])
    state = b.state_dict()
    assert "code" in state["removed"]
    # code comes back where it was.
    c = Mixture(
        sources(data), weights={"web": 1, "code": 1, "math": 1}, batch_size=5, output="python"
    )
    c.load_state_dict(state)
    it = iter(c)
    seen_c = flat([key(next(it), True) for _ in range(6)])
    code = [i for s, i in seen if names_a[s] == "code"]
    code += [i for s, i in seen_c if c.source_names[s] == "code"]
    assert (
        code
        == [x["id"] for x in ParquetStream(data["code"].root, columns=["id"], output="python")][
            : len(code)
        ]
    )
    web = [i for s, i in seen if names_a[s] == "web"]
    web += [i for s, i in seen_b if b.source_names[s] == "web"]
    web += [i for s, i in seen_c if c.source_names[s] == "web"]
    assert (
        web
        == [
            x["id"]
            for x in ParquetStream(
                data["web"].root,
                columns=["id"],
                shuffle_buffer=3,
                seed=2,
                epochs=4,
                output="python",
            )
        ][: len(web)]
    )


@pytest.mark.parametrize("old,mid", [(2, 3), (3, 2), (2, 4)])
def test_a_source_removed_at_a_resize_comes_back_with_every_slots_states(
    data, old, mid, tmp_path, capsys
):
    """old ranks with {web, code, math} -> mid ranks without math (a resize: math's states are
    spread over the new slots, some get none) -> mid ranks with math back. Each rank given only
    its own state is refused naming math (a rank holding none of math's states restarted it:
    rows twice); given every rank's states, math's rows come exactly once in its epoch."""
    kw = dict(batch_size=3, even=None, on_exhausted="drop", max_epochs=1, samples=None)
    w3 = {"web": 0.6, "code": 0.3, "math": 0.1}
    w2 = {"web": 0.6, "code": 0.4}

    def m(weights, rank, world, names=("code", "math", "web")):
        src = sources(data, shuffle=(4, 2, 7))
        return mix(
            data,
            weights=weights,
            rank=rank,
            world_size=world,
            sources={n: src[n] for n in names},
            **kw,
        )

    seen, states = [], []
    for r in range(old):
        ds = m(w3, r, old)
        it = iter(ds)
        for _ in range(4 + r):
            seen.extend((ds.source_names[s], i) for s, i in flat([key(next(it), True)]))
        states.append(torch_roundtrip(ds.state_dict()))
    mids = []
    for r in range(mid):
        ds = m(w2, r, mid, names=("code", "web"))
        ds.load_state_dict(states)
        it = iter(ds)
        for _ in range(2):
            seen.extend((ds.source_names[s], i) for s, i in flat([key(next(it), True)]))
        mids.append(torch_roundtrip(ds.state_dict()))
    assert all("math" in st["removed"] for st in mids)
    from shardstream import cli

    (tmp_path / "mid.json").write_text(json.dumps(mids))
    assert cli.main(["state", str(tmp_path / "mid.json"), "--json"]) == 0
    shown = json.loads(capsys.readouterr().out)["states"]
    assert [st["removed_spread"] for st in shown] == [["math"]] * mid
    assert cli.main(["state", str(tmp_path / "mid.json")]) == 0
    assert capsys.readouterr().out.count("spread over every slot's state") == mid
    for r in range(mid):
        with pytest.raises(StateError, match='source "math" comes back.*every slot'):
            m(w3, r, mid).load_state_dict(mids[r])
    for r in range(mid):
        ds = m(w3, r, mid)
        ds.load_state_dict(mids)
        seen.extend((ds.source_names[s], i) for s, i in flat(keys(ds)))
    for n in ("code", "math", "web"):
        assert sorted(i for s, i in seen if s == n) == sorted(data[n].ids), n


def test_dcp_roundtrip_two_ranks_resume_on_three(data, tmp_path):
    """Each rank's state saved under its own key with torch.distributed.checkpoint (no process
    group: one process) and loaded back whole: the mixture resumes on another number of ranks
    with every row once per source-epoch."""
    import warnings

    import torch.distributed.checkpoint as dcp
    from torch.distributed.checkpoint import DefaultSavePlanner

    kw = dict(batch_size=5, even=None, on_exhausted="drop", max_epochs=1, samples=None)
    seen, saved = [], {}
    for r in range(2):
        ds = mix(data, rank=r, world_size=2, **kw)
        it = iter(ds)
        for _ in range(3):
            seen.extend(flat([key(next(it), True)]))
        saved[f"shardstream/rank{r}"] = ds.state_dict()
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")  # "no process group: single process"
        dcp.save(
            saved,
            checkpoint_id=str(tmp_path / "dcp"),
            planner=DefaultSavePlanner(flatten_state_dict=False),
        )
        template = dict.fromkeys(saved)
        dcp.load(template, checkpoint_id=str(tmp_path / "dcp"))
    for r in range(3):
        ds = mix(data, rank=r, world_size=3, **kw)
        ds.load_state_dict(list(template.values()))
        seen.extend(flat(keys(ds)))
    for t, n in enumerate(["code", "math", "web"]):
        assert sorted(i for s, i in seen if s == t) == sorted(data[n].ids), n


def test_dcp_entries_and_load_dcp_states_of_a_mixture(data, tmp_path, capsys):
    """``dcp_entries`` / ``state_summaries`` take a Mixture's state (they raised KeyError), and
    ``load_dcp_states`` loads every old rank's state into a mixture (one phase): 2 ranks -> 3,
    every row once per source-epoch; same layout, the continuation is the uninterrupted one."""
    import warnings

    import torch.distributed.checkpoint as dcp
    from shardstream.checkpoint import dcp_entries, load_dcp_states, state_summaries

    kw = dict(batch_size=5, even=None, on_exhausted="drop", max_epochs=1, samples=None)
    seen, saved, rest = [], {}, []
    for r in range(2):
        ds = mix(data, rank=r, world_size=2, **kw)
        it = iter(ds)
        for _ in range(3):
            seen.extend(flat([key(next(it), True)]))
        st = ds.state_dict()
        assert state_summaries(st) == [{"mixture": True, "slot": st["slot"]}]
        saved.update(dcp_entries(st, r))
        rest.append(flat(keys(ds)))
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")  # "no process group: single process"
        dcp.save(saved, checkpoint_id=str(tmp_path / "dcp"))
        for r in range(2):
            ds = mix(data, rank=r, world_size=2, **kw)
            assert load_dcp_states(ds, tmp_path / "dcp") == [0, 1]
            assert flat(keys(ds)) == rest[r]
        for r in range(3):
            ds = mix(data, rank=r, world_size=3, **kw)
            load_dcp_states(ds, tmp_path / "dcp")
            seen.extend(flat(keys(ds)))
    # the CLI finds the two states, not the summaries beside them
    from shardstream import cli

    assert cli.main(["state", str(tmp_path / "dcp"), "--json"]) == 0
    shown = json.loads(capsys.readouterr().out)["states"]
    assert [st["format"] for st in shown] == ["shardstream.Mixture"] * 2
    for t, n in enumerate(["code", "math", "web"]):
        assert sorted(i for s, i in seen if s == t) == sorted(data[n].ids), n


def test_states_of_another_mixture_are_refused(data):
    ds = mix(data, batch_size=7)
    next(iter(ds))
    state = ds.state_dict()
    with pytest.raises(StateError, match="batch_size: state has 7, mixture has 8"):
        mix(data, batch_size=8).load_state_dict(state)
    with pytest.raises(StateError, match="samples: state has 400, mixture has 10"):
        mix(data, batch_size=7, samples=10).load_state_dict(state)
    bad = json.loads(json.dumps(state))
    bad["sources"]["web"]["position"]["cursor"] += 1
    with pytest.raises(StateError, match='source "web": invalid state'):
        mix(data, batch_size=7).load_state_dict(bad)
    other_shuffle = mix(data, batch_size=7, sources=sources(data, shuffle=(0, 5, 4)))
    with pytest.raises(
        StateError, match='source "web".*shuffle_buffer: state has 3, dataset has 4'
    ):
        other_shuffle.load_state_dict(state)
    with pytest.raises(StateError, match="holds a shardstream.ParquetStream state, not a"):
        mix(data, batch_size=7).load_state_dict(state["sources"]["web"])
    with pytest.raises(StateError, match="Mixture state"):
        ParquetStream(data["web"].root).load_state_dict(state)


# ------------------------------------------------------------------ columns and output


def test_columns_mixed_by_source_and_rows(data):
    src = {
        "web": ParquetStream(data["web"].root, columns=["id", "text", "tokens"]),
        "code": ParquetStream(data["code"].root, columns=["tokens", "id", "label"]),
    }
    m = Mixture(src, weights={"web": 1, "code": 1}, batch_size=4, output="torch", samples=20)
    assert m.schema.names == [
        "tokens",
        "id",
        "source",
    ]  # shared columns in the first source's order
    b = next(iter(m))
    assert set(b) == {"tokens", "id", "source"} and b["source"].dtype == torch.int32
    m = Mixture(
        src,
        weights={"web": 1, "code": 1},
        batch_size=4,
        output="numpy",
        combine="by_source",
        samples=20,
    )
    b = next(iter(m))
    assert set(b) == {"web", "code"}
    assert set(b["web"]) == {"id", "text", "tokens"} and set(b["code"]) == {"tokens", "id", "label"}
    assert len(b["web"]["id"]) + len(b["code"]["id"]) == 4
    # Arrow parts: each batch carries its own source's schema (the bindings import each schema
    # into pyarrow once and hand batches over against it; two sources alternate here).
    m = Mixture(
        src, weights={"web": 1, "code": 1}, batch_size=4, output="arrow", combine="by_source"
    )
    seen = set()
    for b in itertools.islice(m, 10):
        for name, rb in b.items():
            assert rb.schema.equals(src[name].schema, check_metadata=True), (name, rb.schema)
            seen.add(name)
            rb.validate(full=True)
    assert seen == {"web", "code"}
    m = Mixture(src, weights={"web": 1, "code": 1}, output="python", samples=20)
    rows = list(m)
    assert len(rows) == 20
    for r in rows:
        own = (
            {"id", "text", "tokens"}
            if m.source_names[r["source"]] == "web"
            else {"tokens", "id", "label"}
        )
        assert set(r) == own | {"source"}
    with pytest.raises(SchemaError, match='column named "id"'):
        Mixture(src, weights={"web": 1, "code": 1}, source_column="id")
    clash = {
        "web": ParquetStream(data["web"].root, columns=["id", "label"]),
        "code": ParquetStream(data["code"].root, columns=["id", "tokens"]),
    }
    m = Mixture(
        clash,
        weights={"web": 1, "code": 1},
        batch_size=3,
        source_column=None,
        output="numpy",
        samples=6,
    )
    assert m.schema.names == ["id"]
    assert all(set(b) == {"id"} and isinstance(b["id"], np.ndarray) for b in m)


def test_source_stats_and_state_shape(data):
    ds = mix(data, batch_size=10, samples=None)
    it = iter(ds)
    for _ in range(20):
        next(it)
    st = ds.source_stats()
    assert sum(s["items"] for s in st.values()) == 200
    assert st["math"]["epoch"] >= 1  # 17 rows, ~20 taken: into its second epoch
    assert abs(st["web"]["items"] - 120) <= 1 and st["web"]["weight"] == pytest.approx(0.6)
    state = ds.state_dict()
    assert state["format"] == "shardstream.Mixture" and state["version"] == 1
    assert set(state["sources"]) == {"web", "code", "math"}
    assert all(s["format"] == "shardstream.ParquetStream" for s in state["sources"].values())
    assert state["mixer"]["taken"] == {n: s["items"] for n, s in st.items()}


@pytest.mark.parametrize("batch_size", [None, 7], ids=["rows", "batches"])
def test_source_stats_follow_the_items_handed_out(data, batch_size):
    """After every item (in row mode, every row: the core reads a chunk ahead), each source's
    ``items`` is what was handed out from it, the state's count, and its ``epoch``/``rows``
    place it that many rows in (one slot, no resize: epoch x its rows + rows)."""
    ds = mix(data, batch_size=batch_size, samples=300)
    seen = dict.fromkeys(ROWS, 0)
    names = ds.source_names
    for x in ds:
        for t in [x["source"]] if batch_size is None else x["source"]:
            seen[names[t]] += 1
        stats, taken = ds.source_stats(), ds.state_dict()["mixer"]["taken"]
        for n, s in stats.items():
            assert s["items"] == seen[n] == taken[n], (n, s, seen)
            assert s["epoch"] * ROWS[n] + s["rows"] == seen[n], (n, s, seen)
    assert sum(seen.values()) == 300 and seen["math"] > ROWS["math"] and seen["web"] > ROWS["web"]


def test_source_stats_of_a_dropped_source_stay_at_its_last_epoch(data):
    """A "drop" source runs one epoch: once it is used up, its stats report that epoch's end
    (not the start of an epoch it will not run) and that it left the mix."""
    ds = mix(data, batch_size=10, samples=None, on_exhausted={"math": "drop"})
    it = iter(ds)
    while ds.source_stats()["math"]["items"] < ROWS["math"]:
        next(it)
    next(it)  # the mixer has seen math run out
    math = ds.source_stats()["math"]
    assert (math["items"], math["epoch"], math["rows"], math["active"]) == (
        ROWS["math"],
        0,
        ROWS["math"],
        False,
    )
    assert ds.source_stats()["web"]["active"]


def test_state_size_does_not_grow_with_items(data):
    """Only numbers change with the position: the state's shape (every field, every string)
    is the same after 10 items as after 2000; its size differs by digits only."""

    def shape(n):
        ds = mix(data, batch_size=1, samples=None, sources=sources(data, shuffle=(4, 4, 4)))
        it = iter(ds)
        for _ in range(n):
            next(it)
        st = ds.state_dict()
        for s in st["sources"].values():
            s["position"]["buffer"] = len(s["position"]["buffer"])  # 4 row ids, base64
            s["position"]["seek"] = "?"  # None once a source's epoch input is all taken in
        return re.sub(r"-?\d+", "0", json.dumps(st))

    assert shape(10) == shape(2000)


# ------------------------------------------------------------------ argument errors


def test_argument_errors_name_the_argument(data):
    src = sources(data)
    with pytest.raises(ValueError, match="no weight for"):
        Mixture(src, weights={"web": 1})
    with pytest.raises(ValueError, match='"books" is not a source'):
        Mixture(src, weights={"web": 1, "code": 1, "math": 1, "books": 1})
    with pytest.raises(ValueError, match="source 'web' has batch_size=4"):
        Mixture(
            {**src, "web": ParquetStream(data["web"].root, batch_size=4)},
            weights={"web": 1, "code": 1, "math": 1},
        )
    with pytest.raises(ValueError, match="max_epochs"):
        Mixture(
            {**src, "web": ParquetStream(data["web"].root, epochs=3)},
            weights={"web": 1, "code": 1, "math": 1},
        )
    with pytest.raises(ValueError, match="needs mixing 'deterministic' or 'stratified'"):
        Mixture(
            src,
            weights={"web": 1, "code": 1, "math": 1},
            mixing="random",
            on_exhausted={"math": "stop"},
        )
    with pytest.raises(ValueError, match="needs block"):
        Mixture(src, weights={"web": 1, "code": 1, "math": 1}, mixing="stratified")
    with pytest.raises(ValueError, match="sum to 0"):
        Mixture(src, weights={"web": 0, "code": 0, "math": 0})
    with pytest.raises(ValueError, match="first point must be at item 0"):
        Mixture(src, weights=[(5, {"web": 1, "code": 1, "math": 1})])
    with pytest.raises(ValueError, match="on_exhausted of 'web'"):
        Mixture(src, weights={"web": 1, "code": 1, "math": 1}, on_exhausted={"web": "loop"})
    w3 = {"web": 1, "code": 1, "math": 1}
    with pytest.raises(ValueError, match='weights: the weight of "web" is -1; weights must be'):
        Mixture(src, weights={**w3, "web": -1})
    with pytest.raises(ValueError, match='the weight of "code" is NaN'):
        Mixture(src, weights={**w3, "code": float("nan")})
    with pytest.raises(ValueError, match='weights at item 100: the weight of "math" is -0.5'):
        Mixture(src, weights=[(0, w3), (100, {**w3, "math": -0.5})])
    with pytest.raises(TypeError, match="weight of 'web' must be a number"):
        Mixture(src, weights={**w3, "web": "1"})
    with pytest.raises(TypeError, match="weights must be a dict"):
        Mixture(src, weights="web")
    with pytest.raises(ValueError, match=r"max_epochs names \['books'\], which are not sources"):
        Mixture(src, weights=w3, max_epochs={"books": 2})
    with pytest.raises(ValueError, match="max_epochs of 'web' must be an int in \\[1, "):
        Mixture(src, weights=w3, max_epochs={"web": 0})
    with pytest.raises(TypeError, match="source 'web' must be a ParquetStream"):
        Mixture({**src, "web": data["web"].root}, weights=w3)
    with pytest.raises(TypeError, match="sources must be a non-empty dict"):
        Mixture({}, weights={})
    with pytest.raises(ValueError, match="pass rank and world_size together"):
        Mixture(src, weights=w3, rank=0)
    with pytest.raises(ValueError, match="samples must be an int"):
        Mixture(src, weights=w3, samples=-1)
    # seed and a schedule point's item take no None (the message offers none)
    with pytest.raises(ValueError, match=r"^seed must be an int in \[0, 2\*\*63\), got None$"):
        Mixture(src, weights=w3, seed=None)
    with pytest.raises(
        ValueError, match=r"^weights\[1\]'s item must be an int in \[0, 2\*\*63\), got"
    ):
        Mixture(src, weights=[(0, w3), (None, w3)])


def test_a_source_with_a_position_is_refused(data):
    """A mixture starts every source at its beginning: a source given a position first would
    have it silently ignored (rows re-read), so it is refused, naming the source."""
    w3 = {"web": 1, "code": 1, "math": 1}
    moved = ParquetStream(data["web"].root, columns=["id", "tokens"])
    it = iter(moved)
    next(it)
    for how, prep in [
        ("iterated", lambda s: next(iter(s))),
        ("loaded", lambda s: s.load_state_dict(moved.state_dict())),
        ("skipped", lambda s: s.skip(3)),
        ("set_epoch", lambda s: s.set_epoch(1)),
    ]:
        web = ParquetStream(data["web"].root, columns=["id", "tokens"])
        prep(web)
        with pytest.raises(ValueError, match="source 'web' is not at its start"):
            Mixture({**sources(data), "web": web}, weights=w3)
            pytest.fail(f"a source {how} was accepted")
    # at its start (also after set_epoch(0), or a state saved before iterating): accepted
    for prep in [lambda s: s.set_epoch(0), lambda s: s.load_state_dict(s.state_dict())]:
        web = ParquetStream(data["web"].root, columns=["id", "tokens"])
        prep(web)
        Mixture({**sources(data), "web": web}, weights=w3)


def test_a_source_without_rows_in_a_slot_is_warned_of(data, shard_factory):
    """A source with fewer rows than slots has none in some: it leaves those slots' mix (the
    others share its weight), with a UserWarning naming it, once per process; a slot that
    has its rows gets no warning."""
    tiny = shard_factory(num_shards=1, rows_per_shard=1, seed=24, start_id=9000)

    def run(rank, world):
        src = {
            "web": ParquetStream(data["web"].root, columns=["id"]),
            "tiny": ParquetStream(tiny.root, columns=["id"]),
        }
        ds = Mixture(
            src, weights={"web": 1, "tiny": 1}, batch_size=4, samples=24, output="python",
            rank=rank, world_size=world,
        )  # fmt: skip
        with warnings.catch_warnings(record=True) as w:
            warnings.simplefilter("always")
            items = list(ds) + list(ds)  # a second pass does not warn again
        return [str(x.message) for x in w if issubclass(x.category, UserWarning)], items

    msgs, items = run(0, 1)
    assert msgs == [] and {t for b in items for t in b["source"]} == {0, 1}
    for rank in (0, 1):
        msgs, items = run(rank, 2)
        assert len(msgs) == 1, msgs
        assert msgs[0].startswith(
            "Mixture source 'tiny' has no rows in this slot: its 1 row split over 2 slots "
            f"(rank {rank} of 2, worker 0 of 1; even='drop') leave none here"
        )
        tags = [t for b in items for t in b["source"]]
        assert len(tags) == 24 and set(tags) == {1}  # all "web" (sources sorted by name)
    # weighted only from a later schedule point: warned of all the same
    sched = [(0, {"web": 1, "tiny": 0}), (8, {"web": 1, "tiny": 1})]
    later = Mixture(
        {"web": ParquetStream(data["web"].root, columns=["id"]),
         "tiny": ParquetStream(tiny.root, columns=["id"])},
        weights=sched, batch_size=4, samples=24, output="python", rank=1, world_size=2,
    )  # fmt: skip
    with pytest.warns(UserWarning, match="^Mixture source 'tiny' has no rows in this slot"):
        assert [t for b in later for t in b["source"]] == [1] * 12
    # a source without rows at all, in one slot; and no warning on resume
    empty = shard_factory(num_shards=1, rows_per_shard=0, seed=25)

    def with_empty():
        src = {
            "web": ParquetStream(data["web"].root, columns=["id"]),
            "empty": ParquetStream(empty.root, columns=["id"]),
        }
        return Mixture(
            src, weights={"web": 1, "empty": 1}, batch_size=4, samples=40, output="python"
        )

    ds = with_empty()
    with pytest.warns(UserWarning, match="^Mixture source 'empty' has no rows in this slot: it "
                      "has 0 rows, so it takes no part in this slot's mix"):  # fmt: skip
        it = iter(ds)
        first = next(it)
    assert first["source"] == [1, 1, 1, 1]
    again = with_empty()
    again.load_state_dict(ds.state_dict())
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        assert [t for b in again for t in b["source"]] == [1] * 36


def test_a_slot_given_twice_is_named_as_the_mixtures(data):
    ds = mix(data, batch_size=5)
    it = iter(ds)
    next(it)
    st = ds.state_dict()
    with pytest.raises(StateError, match=r"^two Mixture states for slot 0 of 1: pass each"):
        mix(data, batch_size=5).load_state_dict([st, st])
    # a stream's state beside it: refused, saying where it is
    stream = ParquetStream(data["web"].root).state_dict()
    want = (
        r"^the state given holds a shardstream\.ParquetStream state at \['ckpt'\]\['b'\], not "
        r"a shardstream\.Mixture one"
    )
    with pytest.raises(StateError, match=want):
        mix(data, batch_size=5).load_state_dict({"ckpt": {"a": st, "b": stream}})
    # a state without its format is still a StateError (the core says what is wrong)
    broken = {k: v for k, v in st.items() if k != "format"}
    with pytest.raises(StateError):
        mix(data, batch_size=5).load_state_dict(broken)


def test_a_stratified_block_is_bounded(data):
    """A block's counts and served order are laid out when it starts: block=10**7 took 0.7 s
    and 18 MiB before the first item, so 10**12 would take most of a day and terabytes (it
    hung). Above the largest block it is refused, also when it defaults to batch_size; the
    largest block runs."""
    src = sources(data)
    w3 = {"web": 1, "code": 1, "math": 2}
    most = _core.DEFAULTS["max_stratified_block"]
    assert most == 2**20
    refused = rf"block must be an int in \[1, {most}\] \(items per stratified block\), got "
    with pytest.raises(ValueError, match=refused + rf"{10**12}$"):
        Mixture(src, weights=w3, mixing="stratified", block=10**12, batch_size=4)
    with pytest.raises(ValueError, match=rf"batch_size {most + 1} is above the largest block"):
        Mixture(src, weights=w3, mixing="stratified", batch_size=most + 1)
    ds = Mixture(src, weights=w3, mixing="stratified", block=most, batch_size=4096, output="arrow")
    first = next(iter(ds))
    counts = Counter(first.column("source").to_pylist())
    # the block's first 4,096 items, in a random order of its counts 1:2:1 (code, math, web)
    assert sum(counts.values()) == 4096 and set(counts) == {0, 1, 2}
    assert 1700 < counts[1] < 2400 and counts[0] < 1400 and counts[2] < 1400, counts


# ------------------------------------------------------------------ command line


def test_cli_state_shows_each_source(data, tmp_path, capsys):
    from shardstream import cli
    from shardstream.state import gather

    loader = _loader(data, 2, batch_size=6, output="torch")
    loader.dataset.set_epoch(4)
    it = iter(loader)
    for _ in range(9):
        next(it)
    saved = loader.state_dict()
    del it
    ckpt = tmp_path / "ckpt.pt"
    torch.save({"loader": saved, "step": 9}, ckpt)
    assert cli.main(["state", str(ckpt), "--json"]) == 0
    out = json.loads(capsys.readouterr().out)
    states = gather(saved)
    assert len(out["states"]) == len(states) == 2
    for got, st in zip(out["states"], states, strict=True):
        assert got["format"] == "shardstream.Mixture" and got["started"] is True
        assert got["items"] == st["mixer"]["items"] > 0
        assert got["left"] == st["mixer"]["left"]
        assert got["set_epoch"] == st["epoch"] == 4
        assert got["weights"]["points"][0]["weights"] == pytest.approx(
            {"web": 0.6, "code": 0.3, "math": 0.1}, abs=1e-9
        )
        for n, s in got["sources"].items():
            pos = st["sources"][n]["position"]
            assert s["items"] == st["mixer"]["taken"][n]
            assert (s["epoch"], s["emitted"], s["cursor"]) == (
                pos["epoch"],
                pos["emitted"],
                pos["cursor"],
            )
            assert s["active"] is True and s["policy"]["on_exhausted"] == "cycle"
    assert cli.main(["state", str(ckpt)]) == 0
    text = capsys.readouterr().out
    assert text.count("source web") == 2 and "items taken; epoch" in text
    assert len(re.findall(r"\n  set_epoch +4 \(the epoch set_epoch gave the pass", text)) == 2
    # --source checks ParquetStream states: a mixture's is bad input (2, not a mismatch's 1),
    # saying how to check it instead.
    assert cli.main(["state", str(ckpt), "--source", data["web"].root]) == 2
    err = capsys.readouterr().err
    assert "state 1 of 2 is a Mixture state" in err and "load a Mixture state into its" in err
    # a state saved before any item has no slot: samples counts over all slots
    fresh = tmp_path / "fresh.json"
    fresh.write_text(json.dumps(mix(data).state_dict()))
    assert cli.main(["state", str(fresh)]) == 0
    text = capsys.readouterr().out
    assert re.search(r"\n  slot +none \(nothing read yet\)\n", text)
    assert re.search(r"\n  items +0 yielded \(samples=400 over all slots\)\n", text)
    assert "set_epoch" not in text


def test_only_the_newest_iterator_owns_the_position(data):
    ds = mix(data, batch_size=5)
    old = iter(ds)
    first = next(old)
    new = iter(ds)  # continues after `first`
    stale = "stale: the same Mixture has been iterated again or given another position"
    with pytest.raises(RuntimeError, match=stale):
        next(old)
    assert [key(first, True)] + keys(new) == keys(mix(data, batch_size=5))
    # load_state_dict makes the running iterator stale too, in either mode
    for batch_size in (5, None):
        ds = mix(data, batch_size=batch_size)
        it = iter(ds)
        next(it)
        ds.load_state_dict(ds.state_dict())
        with pytest.raises(RuntimeError, match=stale):
            next(it)
