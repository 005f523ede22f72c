"""Exact resume over a matrix of settings (the harness in harness.py does the work)."""

from __future__ import annotations

import base64
import collections
import itertools
import json

import pytest
from harness import (
    check_resume,
    full_stream,
    is_batched,
    item_key,
    keys_of,
    make_ds,
    resume_rest,
    run_child,
    take,
    torch_roundtrip,
)
from shardstream import ParquetStream, StateError
from shardstream.checkpoint import state_summaries

BIG_BUF = 10**6  # bigger than any shard set here

# (id, settings): a meaningful subset of shuffle_buffer x batch_size x drop_last x epochs x output
MATRIX = [
    ("row-torch-noshuf", dict()),
    ("row-python-noshuf-e3", dict(output="python", epochs=3)),
    ("row-numpy-buf1", dict(output="numpy", shuffle_buffer=1, seed=1)),
    ("row-arrow-buf7", dict(output="arrow", shuffle_buffer=7, seed=2)),
    ("row-python-buf100-e3", dict(output="python", shuffle_buffer=100, seed=42, epochs=3)),
    ("row-torch-bigbuf-e3", dict(output="torch", shuffle_buffer=BIG_BUF, seed=5, epochs=3)),
    ("b1-arrow-bigbuf", dict(output="arrow", batch_size=1, shuffle_buffer=BIG_BUF, seed=9)),
    ("b5-python-buf7", dict(output="python", batch_size=5, shuffle_buffer=7, seed=3)),
    ("b5-torch-noshuf-droplast-e3", dict(batch_size=5, drop_last=True, epochs=3)),
    (
        "b64-torch-buf100-droplast-e3",
        dict(output="torch", batch_size=64, drop_last=True, shuffle_buffer=100, seed=7, epochs=3),
    ),
    ("b64-numpy-buf7-e3", dict(output="numpy", batch_size=64, shuffle_buffer=7, seed=8, epochs=3)),
    ("b64-arrow-noshuf-droplast-e3", dict(output="arrow", batch_size=64, drop_last=True, epochs=3)),
    ("b1-python-buf1-e3", dict(output="python", batch_size=1, shuffle_buffer=1, seed=4, epochs=3)),
    (
        "b5-numpy-bigbuf-droplast",
        dict(output="numpy", batch_size=5, drop_last=True, shuffle_buffer=BIG_BUF, seed=6),
    ),
    ("b64-python-buf1", dict(output="python", batch_size=64, shuffle_buffer=1, seed=10)),
]


@pytest.mark.parametrize("settings", [s for _, s in MATRIX], ids=[i for i, _ in MATRIX])
def test_resume_matrix_pageindex(small, settings):
    check_resume(small.root, settings)


# page index off: a subset of the matrix is enough (the reader path differs, the logic not)
NOPI = [
    "row-python-noshuf-e3",
    "row-arrow-buf7",
    "b5-python-buf7",
    "b64-torch-buf100-droplast-e3",
    "row-torch-bigbuf-e3",
]


@pytest.mark.parametrize("settings", [s for i, s in MATRIX if i in NOPI], ids=NOPI)
def test_resume_matrix_no_pageindex(small_nopi, settings):
    check_resume(small_nopi.root, settings)


SPECIAL = [
    dict(output="python", epochs=2),
    dict(output="python", shuffle_buffer=7, seed=1, epochs=2),
    dict(output="numpy", batch_size=5, shuffle_buffer=100, seed=2, epochs=2),
    dict(output="arrow", batch_size=8, drop_last=True, epochs=2),
]


@pytest.mark.parametrize("settings", SPECIAL, ids=lambda s: str(sorted(s.items())))
def test_resume_special_layout(special, settings):
    """Empty files, zero-row row groups between normal ones."""
    check_resume(special.root, settings)


TINY = [
    dict(output="python", epochs=2),
    dict(output="python", shuffle_buffer=3, seed=1, epochs=2),
    dict(output="torch", batch_size=5, shuffle_buffer=50, seed=2, epochs=2),
]


@pytest.mark.parametrize("settings", TINY, ids=lambda s: str(sorted(s.items())))
def test_resume_many_tiny_shards(tiny, settings):
    check_resume(tiny.root, settings, max_boundary_points=12)


BIG = [
    dict(output="python", batch_size=64, shuffle_buffer=256, seed=1, epochs=2),
    dict(output="numpy", shuffle_buffer=0),
]


@pytest.mark.parametrize("settings", BIG, ids=lambda s: str(sorted(s.items())))
def test_resume_big_shards(big, settings):
    check_resume(big.root, settings, max_boundary_points=8, n_random=2)


@pytest.mark.parametrize("columns", [["id"], ["text", "id"], ["id", "tokens", "label"]])
def test_resume_with_column_projection(small, columns):
    check_resume(
        small.root,
        dict(output="python", columns=columns, shuffle_buffer=7, seed=3, batch_size=5),
        n_random=2,
        max_boundary_points=6,
    )


@pytest.mark.parametrize("rank", [0, 1, 2])
def test_resume_one_rank_of_three(small, rank):
    settings = dict(
        output="python", rank=rank, world_size=3, shuffle_buffer=7, seed=1, batch_size=5, epochs=2
    )
    # coverage of a single rank is checked in test_stream; here only resume exactness
    check_resume(small.root, settings, check_coverage=False, max_boundary_points=6)


def test_columns_and_output_may_differ_between_save_and_load(small):
    save = dict(output="torch", shuffle_buffer=7, seed=3, batch_size=5, epochs=2)
    full = full_stream(small.root, save)
    k = 37
    ds = make_ds(small.root, save)
    take(iter(ds), k)
    state = torch_roundtrip(ds.state_dict())
    load = dict(save, output="python", columns=["text", "id"])
    rest = resume_rest(small.root, load, state)
    assert full[:k] + rest == full


def test_state_dict_right_after_load_is_the_loaded_position(small):
    settings = dict(output="python", shuffle_buffer=7, seed=3, batch_size=5, epochs=2)
    full = full_stream(small.root, settings)
    ds = make_ds(small.root, settings)
    k = 45
    take(iter(ds), k)
    state = ds.state_dict()
    ds2 = make_ds(small.root, settings)
    ds2.load_state_dict(state)
    again = ds2.state_dict()  # nothing yielded yet by ds2: must still be the loaded position
    assert full[:k] + resume_rest(small.root, settings, again) == full


def test_state_after_set_epoch_resumes_in_that_epoch(small):
    settings = dict(output="python", shuffle_buffer=7, seed=3, epochs=1)
    ds = make_ds(small.root, settings)
    ds.set_epoch(4)
    full = keys_of(ds, False)
    ds = make_ds(small.root, settings)
    ds.set_epoch(4)
    it = iter(ds)
    head = keys_of(take(it, 100), False)
    state = torch_roundtrip(ds.state_dict())
    rest = resume_rest(small.root, settings, state)  # fresh ds, no set_epoch
    assert head + rest == full


@pytest.mark.parametrize("batch_size", [None, 7])
def test_resume_endless_epochs(small, batch_size):
    settings = dict(output="python", shuffle_buffer=11, seed=2, epochs=None, batch_size=batch_size)
    per = small.num_rows if batch_size is None else -(-small.num_rows // batch_size)
    horizon = 3 * per + 17
    full = keys_of(itertools.islice(make_ds(small.root, settings), horizon), is_batched(settings))
    for k in [0, per - 1, per, 2 * per + 3, 3 * per]:
        ds = make_ds(small.root, settings)
        take(iter(ds), k)
        state = torch_roundtrip(ds.state_dict())
        ds2 = make_ds(small.root, settings)
        ds2.load_state_dict(state)
        rest = keys_of(itertools.islice(ds2, horizon - k), is_batched(settings))
        assert full[:k] + rest == full, f"endless resume at k={k}"


SUBPROC = [
    dict(output="python", shuffle_buffer=100, seed=42, epochs=3),
    dict(output="torch", batch_size=64, drop_last=True, shuffle_buffer=7, seed=7, epochs=2),
    dict(output="arrow", batch_size=5, shuffle_buffer=BIG_BUF, seed=1),
]


@pytest.mark.timeout(600)
@pytest.mark.parametrize("settings", SUBPROC, ids=["row-python", "b64-torch", "b5-arrow"])
def test_resume_in_fresh_subprocess(small, tmp_path, settings):
    """State through torch.save to a file; a fresh interpreter loads it and continues."""
    full = full_stream(small.root, settings)
    n = len(full)
    for i, k in enumerate([1, n // 3, n - 1]):
        ds = make_ds(small.root, settings)
        take(iter(ds), k)
        rest = run_child(str(tmp_path), small.root, settings, ds.state_dict(), tag=f"k{i}")
        assert full[:k] + rest == full, f"subprocess resume at k={k} differs"


def test_after_resumed_pass_next_pass_starts_from_first_epoch(small):
    settings = dict(output="python", shuffle_buffer=7, seed=3, batch_size=5, epochs=2)
    full = full_stream(small.root, settings)
    ds = make_ds(small.root, settings)
    take(iter(ds), 70)
    state = torch_roundtrip(ds.state_dict())
    ds2 = make_ds(small.root, settings)
    ds2.load_state_dict(state)
    assert full[:70] + keys_of(ds2, True) == full
    assert keys_of(ds2, True) == full, "a finished (resumed) pass must be followed by a full pass"


def test_state_after_exhausted_pass(small):
    """Contract: state_dict() is the position after the last yielded item, and a finished pass
    restarts on the next iter(). Loading the state of an exhausted pass must therefore give
    either nothing (end of pass) or a full new pass -- never a partial stream or an error."""
    settings = dict(output="python", shuffle_buffer=7, seed=3, epochs=2)
    ds = make_ds(small.root, settings)
    full = keys_of(ds, False)
    rest = resume_rest(small.root, settings, torch_roundtrip(ds.state_dict()))
    assert rest in ([], full), f"{len(rest)} items after loading an end-of-pass state"


def test_set_epoch_after_load_resets_position(small):
    settings = dict(output="python", shuffle_buffer=7, seed=3, epochs=2)
    full = full_stream(small.root, settings)
    ds = make_ds(small.root, settings)
    take(iter(ds), 600)
    state = torch_roundtrip(ds.state_dict())
    ds2 = make_ds(small.root, settings)
    ds2.load_state_dict(state)
    # The state is in epoch 1 of a pass that started at 0: set_epoch(0) starts over, loudly.
    with pytest.warns(UserWarning, match=r"set_epoch\(0\) discards the position loaded"):
        ds2.set_epoch(0)
    assert keys_of(ds2, False) == full


@pytest.mark.parametrize("batch_size", [None, 8])
def test_set_epoch_loop_resumes_inside_the_loaded_epoch(small, batch_size):
    """The recommended loop, ``for e in range(start, n): ds.set_epoch(e); for x in ds: ...``,
    resumed mid-epoch: setting the epoch the loaded state is in keeps the loaded position, so the
    resumed run yields exactly the rest of the uninterrupted run (full id streams compared)."""
    settings = dict(output="python", shuffle_buffer=16, seed=5, batch_size=batch_size)
    batched = batch_size is not None

    def run(ds, start, stop_after=None):
        got, state = [], None
        for epoch in range(start, 3):
            ds.set_epoch(epoch)
            for item in ds:
                got.append((epoch, item_key(item, batched)))
                if stop_after is not None and len(got) == stop_after:
                    return got, epoch, torch_roundtrip(ds.state_dict())
        return got, None, state

    full, _, _ = run(make_ds(small.root, settings), 0)
    per_epoch = len(full) // 3
    for cut in (1, per_epoch - 1, per_epoch, per_epoch + 7, 2 * per_epoch + 3):
        head, epoch, state = run(make_ds(small.root, settings), 0, stop_after=cut)
        ds = make_ds(small.root, settings)
        ds.load_state_dict(state)
        rest, _, _ = run(ds, epoch)
        assert head + rest == full, f"cut after {cut} items (epoch {epoch})"


def test_set_epoch_after_load_of_another_epoch_warns_and_starts_over(small):
    settings = dict(output="python", epochs=1)
    ds = make_ds(small.root, settings)
    ds.set_epoch(3)
    take(iter(ds), 10)
    state = ds.state_dict()
    ds2 = make_ds(small.root, settings)
    ds2.load_state_dict(state)
    with pytest.warns(UserWarning, match=r"set_epoch\(4\) discards"):
        ds2.set_epoch(4)
    ref = make_ds(small.root, settings)
    ref.set_epoch(4)
    assert keys_of(ds2, False) == keys_of(ref, False)
    with pytest.raises(ValueError, match="below 2\\*\\*63"):
        ds2.set_epoch(2**64 - 1)


def test_two_phase_elastic_load_gives_the_stream_of_every_state(small):
    """4 ranks -> 3: summaries (states without their buffer) say which old states each new
    rank needs; loading only those gives exactly the stream loading all of them gives."""
    base = dict(output="python", shuffle_buffer=7, seed=1, batch_size=5, epochs=2, even=None)
    states = []
    for r in range(4):
        ds = make_ds(small.root, dict(base, rank=r, world_size=4))
        take(iter(ds), 3 + 2 * r)
        states.append(torch_roundtrip(ds.state_dict()))
    summaries = state_summaries(states)
    assert [s["slot"]["index"] for s in summaries] == [0, 1, 2, 3]
    assert all("buffer" not in s["position"] for s in summaries)
    sizes = []
    for r in range(3):
        want = resume_rest(small.root, dict(base, rank=r, world_size=3), states)
        ds = make_ds(small.root, dict(base, rank=r, world_size=3))
        need = ds.needed_slots(summaries)
        sizes.append(len(need))
        ds.load_state_dict([states[i] for i in need], summaries=summaries)
        got = keys_of(ds, True)
        assert want and got == want
        # Extra states (e.g. a needed slot's whole rank file) change nothing.
        ds = make_ds(small.root, dict(base, rank=r, world_size=3))
        ds.load_state_dict([states[i] for i in sorted({*need, 3 - r})], summaries=summaries)
        assert keys_of(ds, True) == want
        if need:  # without one of them the load refuses, naming it
            ds = make_ds(small.root, dict(base, rank=r, world_size=3))
            ds.load_state_dict([states[i] for i in need[1:]], summaries=summaries)
            with pytest.raises(Exception, match=f"full state of old slot {need[0]} of 4"):
                next(iter(ds))
    assert min(sizes) < 4


def test_two_phase_summaries_after_an_earlier_elastic_resume(small):
    """4 ranks -> 3 (every state) -> 2 (two phases): the 3-rank states carry the injected rows
    of the first resume; their summaries keep only how many (``injected_rows``), give the
    same needed slots as the states without buffer, and resume exactly like every state."""
    base = dict(output="python", shuffle_buffer=40, seed=5, batch_size=5, epochs=2, even=None)
    states4 = []
    for r in range(4):
        ds = make_ds(small.root, dict(base, rank=r, world_size=4))
        take(iter(ds), 2 + r)
        states4.append(torch_roundtrip(ds.state_dict()))
    states3 = []
    for r in range(3):
        ds = make_ds(small.root, dict(base, rank=r, world_size=3))
        ds.load_state_dict(states4)
        take(iter(ds), 2)
        states3.append(torch_roundtrip(ds.state_dict()))
    specs = [sp for st in states3 for sp in st["position"]["specs"]]
    injected = [len(base64.b64decode(sp["injected"])) // 8 for sp in specs]
    assert sum(injected) > 0
    summaries = state_summaries(states3)
    got_specs = [sp for su in summaries for sp in su["position"]["specs"]]
    assert [sp["injected_rows"] for sp in got_specs] == injected
    assert all("injected" not in sp for sp in got_specs)
    plain = [{k: v for k, v in st.items() if k != "buffer"} for st in states3]
    for st in plain:
        st["position"] = {k: v for k, v in st["position"].items() if k != "buffer"}
    assert len(json.dumps(summaries)) < len(json.dumps(plain))
    for r in range(2):
        new = dict(base, rank=r, world_size=2)
        want = resume_rest(small.root, new, states3)
        ds = make_ds(small.root, new)
        need = ds.needed_slots(summaries)
        assert need == ds.needed_slots(plain)
        ds.load_state_dict([states3[i] for i in need], summaries=summaries)
        assert want and keys_of(ds, True) == want
    bad = json.loads(json.dumps(summaries))
    spec = next(sp for su in bad for sp in su["position"]["specs"] if sp["injected_rows"] > 1)
    spec["injected"] = "AAAAAAAAAAA="  # one row id, against injected_rows
    with pytest.raises(StateError, match="'injected_rows' is .* but 'injected' holds 1 rows"):
        make_ds(small.root, dict(base, rank=0, world_size=2)).needed_slots(bad)


@pytest.mark.parametrize("hops", [(2, 1, 2), (2, 3, 2), (4, 1, 3)])
@pytest.mark.parametrize("two_phase", [False, True], ids=["states", "summaries"])
def test_two_elastic_resumes_read_every_row_once(shard_factory, hops, two_phase):
    """Resize, then resize again, from positions where some ranks are an epoch ahead of
    others: the first resume's states hold specs of a later epoch than any of them is in, and
    the second must carry them on (it read that epoch again in full: rows twice). Every id
    exactly once per epoch, over every combination of the first layout's positions."""
    data = shard_factory(num_shards=2, rows_per_shard=3, row_group_size=1, seed=31)
    epochs = 3
    base = dict(columns=["id"], output="python", epochs=epochs, even=None)

    def run(rank, world, n=None, states=None, summaries=None):
        ds = ParquetStream(data.root, rank=rank, world_size=world, **base)
        if states is not None:
            if summaries is not None:
                need = ds.needed_slots(summaries)
                ds.load_state_dict([states[i] for i in need], summaries=summaries)
            else:
                ds.load_state_dict(states)
        ids = [int(x["id"]) for x in itertools.islice(ds, n)] if n != 0 else []
        return ids, ds.state_dict()

    first = hops[0]
    per_rank = [len(run(r, first)[0]) for r in range(first)]
    crossed = 0
    for ks in itertools.product(*[range(0, k + 1, 2) for k in per_rank]):
        got, states = [], []
        for r, k in enumerate(ks):
            ids, st = run(r, first, k)
            got += ids
            states.append(st)
        crossed += len({st["position"]["epoch"] for st in states if st.get("slot")}) > 1
        for h, world in enumerate(hops[1:], start=1):
            last = h == len(hops) - 1
            summaries = state_summaries(states) if two_phase else None
            new = []
            for r in range(world):
                ids, st = run(r, world, None if last else 1, states, summaries)
                got += ids
                new.append(st)
            states = new
        want = collections.Counter({i: epochs for i in range(6)})
        assert collections.Counter(got) == want, (ks, sorted(got))
    assert crossed > 0  # some first-layout position had ranks in different epochs


@pytest.fixture(scope="module")
def split_rows(tmp_path_factory) -> str:
    """pyarrow's defaults (no page index, data page v1) with small pages: parquet-cpp then cuts
    pages by level count, so list rows span pages; the decoder reads these without an offset
    index, skipping rows before a resume point by decoding their levels."""
    import numpy as np
    import pyarrow as pa
    import pyarrow.parquet as pq

    root = tmp_path_factory.mktemp("split_rows")
    rng = np.random.default_rng(3)
    for s, (n, dictionary) in enumerate([(700, True), (500, False)]):
        lens = rng.integers(0, 60, n)
        tokens = [
            None if i % 23 == 5 else [int(v) for v in rng.integers(0, 40, k)]
            for i, k in enumerate(lens)
        ]
        t = pa.table(
            {
                "id": pa.array(range(s * 1000, s * 1000 + n), pa.int64()),
                "tokens": pa.array(tokens, pa.list_(pa.int32())),
                "score": pa.array([None if i % 7 == 0 else i / 3 for i in range(n)]),
            }
        )
        pq.write_table(
            t,
            root / f"s{s}.parquet",
            row_group_size=300,
            data_page_size=512,
            write_batch_size=40,
            use_dictionary=dictionary,
        )
        assert (
            not pq.ParquetFile(root / f"s{s}.parquet")
            .metadata.row_group(0)
            .column(1)
            .has_offset_index
        )
    return str(root)


def test_split_rows_contents_equal_pyarrow(split_rows):
    import glob

    import pyarrow.parquet as pq

    want = []
    for p in sorted(glob.glob(f"{split_rows}/*.parquet")):
        want.extend(pq.read_table(p).to_pylist())
    got = list(ParquetStream(split_rows, output="python"))
    assert got == want


@pytest.mark.parametrize(
    "settings",
    [dict(output="python"), dict(output="arrow", batch_size=64, shuffle_buffer=50, seed=1)],
    ids=["rows", "b64-buf50"],
)
def test_resume_split_rows(split_rows, settings):
    check_resume(split_rows, settings, n_random=6)
