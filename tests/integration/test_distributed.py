"""Real multi-process tests: torchrun (gloo), plain RANK/WORLD_SIZE processes, StatefulDataLoader
worker changes, elastic resume across layouts, DCP checkpoints.

Every rank runs ``tests/integration/dist_scripts/shard_job.py`` and writes the ids of every item
it yielded;
the checks here compare full id streams / multisets against references computed in this process
with explicit ``rank``/``world_size`` (one epoch at a time via ``set_epoch``).

Elastic check (``check_elastic``): old layout ``W1`` ranks ran ``A[r]`` (a prefix of its
uninterrupted stream) and stopped inside epoch ``e*``; the new layout ``W2`` ran ``B[r]`` to the
end. Then ``B[r]`` must be ``head[r] + (new layout's normal epochs e*+1..)`` and the rows of
epoch ``e*`` yielded by A plus all heads must be every row exactly once (``even=None``).
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
from collections import Counter

import pytest
from harness import child_env
from shardstream import ParquetStream

TESTS_DIR = os.path.dirname(os.path.abspath(__file__))
JOB = os.path.join(TESTS_DIR, "dist_scripts", "shard_job.py")

pytestmark = pytest.mark.timeout(600)

# 963 rows: odd (2 ranks differ by one row), 963 % 4 == 3 (2 ranks x 2 workers drop/pad 3 rows)
LAYOUT = dict(num_shards=3, rows_per_shard=[300, 250, 413], seed=21)
N_ROWS = 963
ALL_IDS = Counter(range(N_ROWS))
ELASTIC = dict(
    columns=["id"], batch_size=8, output="python", shuffle_buffer=50, seed=1, epochs=2, even=None
)


@pytest.fixture(scope="module")
def data(shard_factory):
    s = shard_factory(**LAYOUT)
    assert s.num_rows == N_ROWS and sorted(s.ids) == list(range(N_ROWS))
    return s.root


# ------------------------------------------------------------------------------ running jobs


def _spec(tmp, tag: str, source: str, settings: dict, **kw) -> tuple[str, str]:
    out = os.path.join(tmp, f"{tag}-out-{{rank}}.json")
    spec = dict(
        source=source,
        settings=settings,
        out=out,
        num_workers=None,
        load=None,
        stop=None,
        save_torch=None,
        save_dcp=None,
        save_dcp_entries=None,
    )
    spec.update(kw)
    path = os.path.join(tmp, f"{tag}-spec.json")
    with open(path, "w") as f:
        json.dump(spec, f)
    return path, out


def _read_outputs(out: str, world: int) -> list[list[tuple[int, ...]]]:
    streams = []
    for r in range(world):
        with open(out.format(rank=r, world=world)) as f:
            res = json.load(f)
        assert (res["rank"], res["world"]) == (r, world)
        streams.append([tuple(x) for x in res["items"]])
    return streams


def torchrun(tmp, tag: str, nproc: int, source: str, settings: dict, **kw) -> list:
    """Run the job under torchrun (gloo, ``--standalone`` picks a free port); per-rank items."""
    spec, out = _spec(tmp, tag, source, settings, init="dist", **kw)
    cmd = [
        sys.executable,
        "-m",
        "torch.distributed.run",
        "--standalone",
        f"--nproc_per_node={nproc}",
        JOB,
        spec,
    ]
    proc = subprocess.run(cmd, capture_output=True, text=True, timeout=300, env=child_env())
    assert proc.returncode == 0, (
        f"torchrun {tag} failed ({proc.returncode}):\n{proc.stdout[-3000:]}\n{proc.stderr[-6000:]}"
    )
    return _read_outputs(out, nproc)


def envrun(tmp, tag: str, world: int, source: str, settings: dict, **kw) -> list:
    """Run ``world`` plain processes (RANK/WORLD_SIZE env, no torch.distributed) concurrently."""
    spec, out = _spec(tmp, tag, source, settings, init="env", **kw)
    run_ranks(JOB, spec, world)
    return _read_outputs(out, world)


def run_ranks(script: str, spec: str, world: int, timeout: int = 300) -> None:
    """Run ``script spec`` as ``world`` processes (RANK/WORLD_SIZE in the environment)
    concurrently; fail with every failed rank's output."""
    procs = []
    for r in range(world):
        env = child_env()
        env.update(RANK=str(r), WORLD_SIZE=str(world))
        procs.append(
            subprocess.Popen(
                [sys.executable, script, spec],
                env=env,
                text=True,
                stdout=subprocess.PIPE,
                stderr=subprocess.PIPE,
            )
        )
    errors = []
    for r, p in enumerate(procs):
        so, se = p.communicate(timeout=timeout)
        if p.returncode != 0:
            errors.append(f"rank {r} failed ({p.returncode}):\n{so[-2000:]}\n{se[-4000:]}")
    assert not errors, "\n".join(errors)


# ------------------------------------------------------------------------------ references


def ref_epoch(source: str, settings: dict, world: int, rank: int, epoch: int) -> list:
    """Items of one epoch of rank ``rank`` of ``world`` (in-process, explicit rank)."""
    ds = ParquetStream(source, **{**settings, "epochs": 1}, rank=rank, world_size=world)
    ds.set_epoch(epoch)
    return [tuple(b["id"]) for b in ds]


def ref_epochs(source: str, settings: dict, world: int) -> list[list[list]]:
    """``[rank][epoch] -> items``."""
    return [
        [ref_epoch(source, settings, world, r, e) for e in range(settings["epochs"])]
        for r in range(world)
    ]


def flat(items) -> list[int]:
    return [i for item in items for i in item]


def check_every_row_once_per_epoch(per_rank_epochs: list[list[list]], what: str) -> None:
    epochs = len(per_rank_epochs[0])
    for e in range(epochs):
        union = Counter()
        for eps in per_rank_epochs:
            union.update(flat(eps[e]))
        missing = ALL_IDS - union
        extra = union - ALL_IDS
        assert not missing and not extra, (
            f"{what}, epoch {e}: not every row exactly once "
            f"(missing {sorted(missing)[:20]}, duplicated/extra {sorted(extra)[:20]})"
        )


def check_elastic(source: str, settings: dict, a: list, b: list, what: str) -> int:
    """See the module docstring. Returns the interrupted epoch."""
    w1, w2 = len(a), len(b)
    old, new = ref_epochs(source, settings, w1), ref_epochs(source, settings, w2)
    epochs = settings["epochs"]
    interrupted = set()
    seen = Counter()  # rows of the interrupted epoch yielded by the old layout
    for r in range(w1):
        full = [x for eps in old[r] for x in eps]
        assert a[r] == full[: len(a[r])], f"{what}: old rank {r} is not a prefix of its stream"
        done, e = 0, 0
        while e < epochs and len(a[r]) >= done + len(old[r][e]):
            done += len(old[r][e])
            e += 1
        assert e < epochs and len(a[r]) > done, f"{what}: pick k inside an epoch (rank {r})"
        interrupted.add(e)
        seen.update(flat(a[r][done:]))
    assert len(interrupted) == 1, f"{what}: ranks interrupted in different epochs {interrupted}"
    (e_star,) = interrupted
    heads = Counter()
    for r in range(w2):
        tail = [x for e in range(e_star + 1, epochs) for x in new[r][e]]
        head = b[r][: len(b[r]) - len(tail)]
        assert b[r][len(head) :] == tail, (
            f"{what}: new rank {r} does not continue with the normal epochs "
            f"{list(range(e_star + 1, epochs))} of a {w2}-rank layout"
        )
        assert all(0 < len(x) <= settings["batch_size"] for x in head)
        heads.update(flat(head))
    both = seen & heads
    assert not both, f"{what}: rows yielded before AND after the resume: {sorted(both)[:20]}"
    total = seen + heads
    assert total == ALL_IDS, (
        f"{what}: epoch {e_star} over both layouts is not every row exactly once "
        f"(missing {sorted(ALL_IDS - total)[:20]}, extra {sorted(total - ALL_IDS)[:20]})"
    )
    return e_star


# ------------------------------------------------------------------------------ 1. torchrun


def job_results(tmp, tag: str, world: int) -> list[dict]:
    out = []
    for r in range(world):
        with open(os.path.join(tmp, f"{tag}-out-{r}.json")) as f:
            out.append(json.load(f))
    return out


@pytest.mark.slow
@pytest.mark.timeout(900)
def test_torchrun_resume_same_and_elastic_layouts(data, tmp_path):
    """torchrun 2 ranks: uninterrupted; interrupted and saved with torch.save AND DCP; resumed
    2->2 (own state: identical to uninterrupted), 2->1 (all ranks' states: elastic) and, from a
    1-rank job interrupted in epoch 1, 1->2. Every resume also checks that the DCP copy of the
    checkpoint loads back to exactly the torch.save states."""
    tmp, s = str(tmp_path), ELASTIC
    ref2 = ref_epochs(data, s, 2)
    check_every_row_once_per_epoch(ref2, "uninterrupted 2 ranks (in-process)")

    full = torchrun(tmp, "full", 2, data, s)
    for r in range(2):
        assert full[r] == ref2[r][0] + ref2[r][1], (
            f"torchrun rank {r} differs from rank={r}, world_size=2 in-process "
            "(did the dataset take its rank from torch.distributed?)"
        )

    # interrupted inside epoch 0, ranks at different points (states are per slot anyway)
    a = torchrun(
        tmp,
        "a",
        2,
        data,
        s,
        stop=[5, 9],
        save_torch=f"{tmp}/a-{{rank}}.pt",
        save_dcp=f"{tmp}/a-dcp",
        save_dcp_entries=f"{tmp}/a-dcp2",
    )
    for r in range(2):
        assert len(a[r]) == [5, 9][r] and a[r] == full[r][: len(a[r])]

    # 2 -> 2: each rank its own state; exactly the uninterrupted per-rank streams
    b = torchrun(
        tmp,
        "b-own",
        2,
        data,
        s,
        load=dict(
            via="torch",
            target="dataset",
            files=[f"{tmp}/a-{{rank}}.pt"],
            keys="own",
            same_as_dcp=f"{tmp}/a-dcp",
        ),
    )
    for r in range(2):
        assert a[r] + b[r] == full[r], f"2->2 rank {r}: resumed stream differs from uninterrupted"
    assert [x["dcp_equal"] for x in job_results(tmp, "b-own", 2)] == [True, True]

    # 2 -> 1: elastic, from DCP (every rank's entry), compared with the torch.save files
    files = [f"{tmp}/a-{r}.pt" for r in range(2)]
    b1 = torchrun(
        tmp,
        "b1",
        1,
        data,
        s,
        load=dict(via="dcp", target="dataset", dir=f"{tmp}/a-dcp", keys="all"),
    )
    assert check_elastic(data, s, a, b1, "torchrun 2->1") == 0
    b1_env = envrun(
        tmp, "b1-env", 1, data, s, load=dict(via="torch", target="dataset", files=files)
    )
    assert b1_env == b1, "2->1 from the torch.save files differs from 2->1 from DCP"
    # 2 -> 1 in two phases (load_dcp_states: summaries, then the states needed), inside gloo
    b1_2p = torchrun(
        tmp,
        "b1-2p",
        1,
        data,
        s,
        load=dict(via="dcp_two_phase", target="dataset", dir=f"{tmp}/a-dcp2"),
    )
    assert b1_2p == b1, "2->1 in two phases from DCP differs from loading every state"
    assert job_results(tmp, "b1-2p", 1)[0]["dcp_ranks_read"] == [0, 1]

    # 1 -> 2: a 1-rank job interrupted inside epoch 1
    a1 = torchrun(
        tmp,
        "a1",
        1,
        data,
        s,
        stop=[170],
        save_torch=f"{tmp}/a1-{{rank}}.pt",
        save_dcp=f"{tmp}/a1-dcp",
    )
    b2 = torchrun(
        tmp,
        "b2",
        2,
        data,
        s,
        load=dict(
            via="torch",
            target="dataset",
            files=[f"{tmp}/a1-0.pt"],
            keys="all",
            same_as_dcp=f"{tmp}/a1-dcp",
        ),
    )
    assert check_elastic(data, s, a1, b2, "torchrun 1->2") == 1
    assert [x["dcp_equal"] for x in job_results(tmp, "b2", 2)] == [True, True]


def _split_epochs(items: list, epochs: int) -> list[list]:
    rows = sum(len(x) for x in items)
    assert rows % epochs == 0, f"{rows} rows is not {epochs} equal epochs"
    per, out, cur, n = rows // epochs, [], [], 0
    for x in items:
        cur.append(x)
        n += len(x)
        if n == per:
            out.append(cur)
            cur, n = [], 0
        assert n < per, "an item spans an epoch boundary"
    assert len(out) == epochs and not cur
    return out


@pytest.mark.slow
@pytest.mark.timeout(600)
@pytest.mark.parametrize("even", ["drop", "pad"])
def test_torchrun_even_equal_counts(data, tmp_path, even):
    """963 rows on 2 ranks: every rank yields the same number of items AND rows per epoch; drop
    skips at most 1 row per epoch (no duplicates), pad repeats at most 1 (no row missing).
    Also 2 ranks x 2 StatefulDataLoader workers (4 slots, 963 % 4 == 3), one epoch."""
    s = dict(ELASTIC, even=even, shuffle_buffer=20, seed=4)
    if even == "drop":  # the torchrun job uses the default, which must be "drop"
        del s["even"]
    streams = torchrun(str(tmp_path), f"even-{even}", 2, data, s)
    per_epoch = [_split_epochs(x, 2) for x in streams]
    check_even(per_epoch, even, slots=2, what=f"torchrun even={even}")
    for r in range(2):  # torchrun rank == explicit in-process rank and explicit policy
        assert per_epoch[r] == [ref_epoch(data, {**s, "even": even}, 2, r, e) for e in range(2)]

    s1 = dict(s, epochs=1)
    loader = torchrun(str(tmp_path), f"even-{even}-w2", 2, data, s1, num_workers=2)
    check_even([[x] for x in loader], even, slots=4, what=f"torchrun x 2 workers even={even}")


def check_even(per_rank_epochs: list[list[list]], even: str, slots: int, what: str) -> None:
    for e in range(len(per_rank_epochs[0])):
        items = [len(eps[e]) for eps in per_rank_epochs]
        rows = [len(flat(eps[e])) for eps in per_rank_epochs]
        assert len(set(items)) == 1, f"{what} epoch {e}: items per rank differ: {items}"
        assert len(set(rows)) == 1, f"{what} epoch {e}: rows per rank differ: {rows}"
        union = Counter()
        for eps in per_rank_epochs:
            union.update(flat(eps[e]))
        assert set(union) <= set(ALL_IDS), f"{what}: ids that are not rows"
        missing, extra = ALL_IDS - union, union - ALL_IDS
        if even == "drop":
            assert not extra, f"{what} epoch {e}: duplicated rows {sorted(extra)}"
            assert len(missing) <= slots - 1 and sum(union.values()) == N_ROWS - len(missing)
            assert sum(rows) == N_ROWS - N_ROWS % slots, f"{what}: rows {rows}"
        else:
            assert not missing, f"{what} epoch {e}: missing rows {sorted(missing)}"
            assert sum(extra.values()) <= slots - 1
            assert sum(rows) == N_ROWS + (-N_ROWS) % slots, f"{what}: rows {rows}"


# ------------------------------------------------------------- 2. plain processes (env ranks)


@pytest.mark.timeout(600)
@pytest.mark.parametrize(
    "w1,w2,stop",
    [
        (2, 2, [7, 3]),
        (2, 1, [40, 33]),  # epoch 0
        (1, 2, [200]),  # epoch 1
        (3, 2, [1, 12, 25]),  # epoch 0
    ],
)
def test_env_ranks_elastic(data, tmp_path, w1, w2, stop):
    tmp, s = str(tmp_path), ELASTIC
    a = envrun(tmp, "a", w1, data, s, stop=stop, save_torch=f"{tmp}/a-{{rank}}.pt")
    files = [f"{tmp}/a-{r}.pt" for r in range(w1)]
    b = envrun(tmp, "b", w2, data, s, load=dict(via="torch", target="dataset", files=files))
    check_elastic(data, s, a, b, f"env {w1}->{w2}")
    if w1 == w2:  # own state per rank: identical continuation
        b_own = envrun(
            tmp,
            "b-own",
            w2,
            data,
            s,
            load=dict(via="torch", target="dataset", files=[f"{tmp}/a-{{rank}}.pt"]),
        )
        ref = ref_epochs(data, s, w1)
        for r in range(w1):
            assert a[r] + b_own[r] == ref[r][0] + ref[r][1], f"own-state resume rank {r}"
        # all ranks' states, same layout: also continues identically
        assert b == b_own, "loading all ranks' states with the same layout changed the stream"


@pytest.mark.timeout(600)
# Workers 2->0 and 0->2 under 2 ranks (each rank runs the 1-rank path on its own slots, with
# the other rank's states beside it), and the same workers (2->2) under 2 ranks.
@pytest.mark.parametrize("world,nw1,nw2", [(2, 2, 0), (2, 0, 2), (2, 2, 2)])
def test_env_loader_worker_change(data, tmp_path, world, nw1, nw2):
    """StatefulDataLoader per rank: num_workers nw1 -> nw2 in the same ranks. Same workers:
    loader.load_state_dict (identical continuation); other workers: ds.load_state_dict of the
    loader states (of every rank when world > 1). Over the epoch every row exactly once."""
    tmp = str(tmp_path)
    s = dict(ELASTIC, epochs=1, shuffle_buffer=30, seed=9)
    a = envrun(
        tmp, "a", world, data, s, num_workers=nw1, stop=[13, 20], save_torch=f"{tmp}/a-{{rank}}.pt"
    )
    if nw1 == nw2:
        load = dict(via="torch", target="loader", files=[f"{tmp}/a-{{rank}}.pt"])
        full = envrun(tmp, "full", world, data, s, num_workers=nw1)
        b = envrun(tmp, "b", world, data, s, num_workers=nw2, load=load)
        for r in range(world):
            assert a[r] + b[r] == full[r], f"same-workers loader resume differs (rank {r})"
    else:
        files = [f"{tmp}/a-{r}.pt" for r in range(world)]
        b = envrun(
            tmp,
            "b",
            world,
            data,
            s,
            num_workers=nw2,
            load=dict(via="torch", target="dataset", files=files),
        )
    before, after = Counter(), Counter()
    for r in range(world):
        assert len(a[r]) == [13, 20][r]
        before.update(flat(a[r]))
        after.update(flat(b[r]))
    assert not (before & after), f"rows before AND after the resume: {sorted(before & after)[:20]}"
    assert before + after == ALL_IDS, (
        f"{world} rank(s), workers {nw1}->{nw2}: not every row once "
        f"(missing {sorted(ALL_IDS - before - after)[:20]}, extra "
        f"{sorted((before + after) - ALL_IDS)[:20]})"
    )


@pytest.mark.timeout(300)
def test_worker_change_with_only_own_rank_state_is_refused(data, tmp_path):
    """2 ranks x 2 workers -> 2 ranks x 0 workers with only this rank's loader state (2 of the
    4 slots): that can not be an exactly-once resume, so it must fail, not silently skip rows."""
    from shardstream import StateError
    from torchdata.stateful_dataloader import StatefulDataLoader

    s = dict(ELASTIC, epochs=1)
    ds = ParquetStream(data, **s, rank=0, world_size=2)
    loader = StatefulDataLoader(ds, batch_size=None, num_workers=2)
    it = iter(loader)
    for _ in range(6):
        next(it)
    sd = loader.state_dict()
    del it, loader
    ds2 = ParquetStream(data, **s, rank=0, world_size=2)
    with pytest.raises(StateError):
        ds2.load_state_dict(sd)
        list(ds2)


# --------------------------------------------------------------------------- 3. determinism


@pytest.mark.timeout(600)
def test_elastic_resume_is_deterministic(data, tmp_path):
    """The same elastic resumes (ranks 2->3 inside epoch 1; loader workers 0->2) in fresh
    processes give the streams of the same resume in this process (another process, another
    hash seed and thread timing: the same rows in the same order)."""
    tmp = str(tmp_path)
    s = dict(ELASTIC, shuffle_buffer=64, seed=12345)
    a = envrun(tmp, "a", 2, data, s, stop=[70, 64], save_torch=f"{tmp}/a-{{rank}}.pt")
    files = [f"{tmp}/a-{r}.pt" for r in range(2)]
    load = dict(via="torch", target="dataset", files=files)
    b1 = envrun(tmp, "b1", 3, data, s, load=load)
    check_elastic(data, s, a, b1, "env 2->3")

    import torch

    states = [torch.load(f, weights_only=True) for f in files]
    for r in range(3):  # in-process, explicit rank
        ds = ParquetStream(data, **s, rank=r, world_size=3)
        ds.load_state_dict(states)
        assert [tuple(x["id"]) for x in ds] == b1[r], f"in-process elastic rank {r} differs"

    s1 = dict(s, epochs=1)
    for nw1, nw2 in [(0, 2)]:  # 2 worker processes feeding one loader
        tag = f"w{nw1}{nw2}"
        envrun(
            tmp,
            f"{tag}-a",
            1,
            data,
            s1,
            num_workers=nw1,
            stop=[17],
            save_torch=f"{tmp}/{tag}-{{rank}}.pt",
        )
        load = dict(via="torch", target="dataset", files=[f"{tmp}/{tag}-0.pt"])
        r1 = envrun(tmp, f"{tag}-b1", 1, data, s1, num_workers=nw2, load=load)
        from torchdata.stateful_dataloader import StatefulDataLoader

        ds = ParquetStream(data, **s1)
        ds.load_state_dict(torch.load(f"{tmp}/{tag}-0.pt", weights_only=True))
        loader = StatefulDataLoader(ds, batch_size=None, num_workers=nw2)
        here = [tuple(int(i) for i in torch.as_tensor(b["id"]).tolist()) for b in loader]
        assert r1[0] == here, f"workers {nw1}->{nw2}: a fresh process resumed differently"


# ------------------------------------------------------------- 4. DCP, two phases (one process)


def _old_slots(data, s, slots, stops):
    """States of ``slots`` old slots (each its own stream), stopped after ``stops[i]`` items."""
    states = []
    for i in range(slots):
        ds = ParquetStream(data, **s, rank=i, world_size=slots)
        it = iter(ds)
        for _ in range(stops[i]):
            next(it)
        states.append(ds.state_dict())
    return states


def _save_dcp(entries: dict, path: str, **kw) -> None:
    import warnings

    import torch.distributed.checkpoint as dcp

    with warnings.catch_warnings():
        warnings.simplefilter("ignore")  # "no process group: single process"
        dcp.save(entries, checkpoint_id=path, **kw)


def test_dcp_two_phase_reads_only_the_needed_states(data, tmp_path):
    """4 old ranks x 2 workers saved with ``dcp_entries`` by DCP's default (flattening) planner
    beside a tensor; each new rank (3, then 6 ranks) loads every summary, then the states of
    only the old ranks it needs -- read keys recorded at the storage reader -- and yields
    exactly the stream loading every state gives."""
    import torch
    import torch.distributed.checkpoint as dcp
    from shardstream import StateError
    from shardstream.checkpoint import dcp_entries, load_dcp_states

    s = dict(ELASTIC, shuffle_buffer=40, epochs=1)
    states = _old_slots(data, s, 8, [3, 5, 2, 7, 4, 6, 1, 8])
    ckpt = str(tmp_path / "dcp")
    entries: dict = {"model.weight": torch.arange(4.0)}
    for r in range(4):  # old rank r's loader held slots 2r, 2r+1 (slot = rank * workers + w)
        entries.update(dcp_entries([states[2 * r], states[2 * r + 1]], r))
    _save_dcp(entries, ckpt)

    reads: list[list[str]] = []

    class Recording(dcp.FileSystemReader):
        def read_data(self, plan, planner):
            reads.append(sorted({item.storage_index.fqn for item in plan.items}))
            return super().read_data(plan, planner)

    summary_keys = [f"shardstream/summaries/rank{r}" for r in range(4)]
    subsets = 0
    for world in (3, 6):
        for r in range(world):
            reads.clear()
            ds = ParquetStream(data, **s, rank=r, world_size=world)
            ranks = load_dcp_states(ds, ckpt, storage_reader=Recording(ckpt))
            assert (
                reads == [summary_keys, [f"shardstream/rank{o}" for o in ranks]][: 1 + bool(ranks)]
            )
            subsets += len(ranks) < 4
            ref = ParquetStream(data, **s, rank=r, world_size=world)
            ref.load_state_dict(states)
            want = [tuple(x["id"]) for x in ref]
            assert want and [tuple(x["id"]) for x in ds] == want, f"{world} ranks: rank {r}"
    assert subsets >= 6, "every new rank read (nearly) every old state"
    # the same layout (4 ranks x 2 workers): each rank reads its own state only
    for r in range(4):
        reads.clear()
        ds = ParquetStream(data, **s, rank=r, world_size=4)
        assert load_dcp_states(ds, ckpt, num_workers=2, storage_reader=Recording(ckpt)) == [r]
        assert reads[1] == [f"shardstream/rank{r}"]

    # Not what dcp_entries saves: refused, naming what is missing or wrong.
    bare = str(tmp_path / "bare")
    _save_dcp({f"shardstream/rank{r}": states[r] for r in range(2)}, bare)
    with pytest.raises(StateError, match="no shardstream/summaries/rank<N> entries"):
        load_dcp_states(ParquetStream(data, **s), bare)
    from torch.distributed.checkpoint import DefaultSavePlanner

    plain = str(tmp_path / "plain")
    _save_dcp(
        {"shardstream/summaries/rank0": [{"slot": None}]},
        plain,
        planner=DefaultSavePlanner(flatten_state_dict=False),
    )
    with pytest.raises(StateError, match="'shardstream/summaries/rank0' is a list, expected"):
        load_dcp_states(ParquetStream(data, **s), plain)


# ------------------------------------------------------------------------------ EvenBatches

EVEN_JOB = os.path.join(TESTS_DIR, "dist_scripts", "even_job.py")
EVEN_M = 10_000  # token j of document d is d * EVEN_M + j


@pytest.mark.timeout(300)
def test_even_batches_packed_ranks_yield_equal_counts(tmp_path):
    """A finite packed stream whose 2 ranks make very different numbers of packed rows, under
    EvenBatches on 2 gloo processes: "pad" gives both ranks the same number of batches, each
    rank's real batches are its own stream's (full comparison) followed by padding only, and
    the real tokens over both ranks are every document's exactly once; "drop" stops both at
    the shorter rank's count, yields prefixes and reports what it dropped; a resume in the
    padding phase (2 workers, torch.save) yields the same remaining batches on every rank; a
    rank with no batch to shape padding on makes every rank raise (not hang)."""
    import pyarrow as pa
    import pyarrow.parquet as pq
    from shardstream import Pack

    # Rank 0 reads documents 0..29 (long), rank 1 documents 30..59 (short).
    lengths = [40 + d % 7 for d in range(30)] + [1 + d % 3 for d in range(30)]
    root = tmp_path / "docs"
    root.mkdir()
    toks = [[d * EVEN_M + j for j in range(n)] for d, n in enumerate(lengths)]
    pq.write_table(
        pa.table({"input_ids": pa.array(toks, pa.list_(pa.int64()))}),
        root / "s0.parquet",
        row_group_size=10,
    )
    settings = dict(batch_size=2, output="torch", epochs=1, even=None)
    pack = dict(seq_len=16, algorithm="best_fit", buffer_docs=8)

    def ref(rank: int) -> list:
        ds = ParquetStream(
            str(root),
            columns=["input_ids"],
            pack=Pack(**pack),
            **{**settings, "output": "numpy"},
            rank=rank,
            world_size=2,
        )
        return [
            [b["input_ids"].reshape(-1).tolist(), b["segment_ids"].reshape(-1).tolist()] for b in ds
        ]

    refs = [ref(0), ref(1)]
    n = [len(x) for x in refs]
    assert n[0] >= 4 * n[1] >= 4, f"the ranks are not unbalanced enough: {n}"

    spec = tmp_path / "even-spec.json"
    out = str(tmp_path / "even-out-{rank}.json")
    spec.write_text(
        json.dumps(
            dict(
                source=str(root),
                settings=settings,
                pack=pack,
                out=out,
                store=str(tmp_path / "even-store"),
            )
        )
    )
    # Two plain processes meeting in a file store: torchrun's own process would cost another
    # torch import (seconds) for nothing this test needs.
    run_ranks(EVEN_JOB, str(spec), 2, timeout=240)
    res = []
    for r in range(2):
        with open(out.format(rank=r)) as f:
            res.append(json.load(f))
        assert res[r]["rank"] == r

    def is_padding(b: list) -> bool:
        ids, seg = b
        return all(s == 0 for s in seg) and all(t == 0 for t in ids)

    real_tokens: list[int] = []
    w2_tokens: list[int] = []
    for r in range(2):
        pad = res[r]["pad"]
        assert len(pad) == max(n), f"pad: rank {r} yielded {len(pad)}, want {max(n)}"
        assert pad[: n[r]] == refs[r], f"pad: rank {r}'s real batches differ from its stream"
        assert all(is_padding(b) for b in pad[n[r] :]) and res[r]["pad_padded"] == max(n) - n[r]
        assert [len(b[0]) for b in pad[n[r] :]] == [len(pad[n[r] - 1][0])] * (max(n) - n[r])
        real_tokens += [t for b in pad for t, s in zip(*b, strict=True) if s > 0]
        drop = res[r]["drop"]
        assert drop == refs[r][: min(n)], f"drop: rank {r} did not yield its first {min(n)}"
        assert res[r]["drop_dropped"] == n[r] - min(n)
        assert res[r]["drop_finished"] and res[r]["pad_finished"], "the loader's pass is not over"
        assert "a rank ran out before yielding any batch" in res[r]["no_batch"], res[r]["no_batch"]
        # 2 workers per rank: equal counts, and the resume is inside the short rank's padding
        w2, k = res[r]["pad_w2"], res[r]["k"]
        assert len(w2) == len(res[1 - r]["pad_w2"])
        w2_real = [sum(not is_padding(b) for b in x["pad_w2"]) for x in res]
        assert k == min(w2_real) + 1 < len(w2) and w2_real[0] != w2_real[1]
        w2_tokens += [t for b in w2 for t, s in zip(*b, strict=True) if s > 0]
        assert res[r]["resume_head"] == w2[:k] and res[r]["resume_tail"] == w2[k:], (
            f"resume inside the padding phase: rank {r} differs from the uninterrupted run"
        )
    want = [d * EVEN_M + j for d, ln in enumerate(lengths) for j in range(ln)]
    assert Counter(real_tokens) == Counter(want), "pad: real tokens are not every one once"
    assert Counter(w2_tokens) == Counter(want), "pad, 2 workers: not every token once"
