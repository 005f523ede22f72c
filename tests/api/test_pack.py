"""Token packing (``ParquetStream(..., pack=Pack(...))``): row properties, token conservation,
exact resume at many points (compared as full packed-row streams), state size, workers, ranks
and elastic resume (every token of every consumed document emitted exactly once)."""

from __future__ import annotations

import base64
import collections
import json
import os
import subprocess
import sys

import numpy as np
import pyarrow as pa
import pyarrow.parquet as pq
import pytest
from shardstream import Pack, ParquetStream, StateError
from shardstream.pack import cu_seqlens

# Token j of document d is d * M + j: any packed token says which document and offset it is.
M = 10_000
BOS, EOS = 7_000_000_001, 7_000_000_002


def write_docs(root, lengths, shards=3, row_group=37, dtype=None):
    """Documents 0..n-1 with the given lengths, over `shards` files."""
    dtype = dtype or pa.int32()
    os.makedirs(root, exist_ok=True)
    n = len(lengths)
    cuts = np.linspace(0, n, shards + 1).astype(int)
    for s in range(shards):
        ids = list(range(cuts[s], cuts[s + 1]))
        toks = [[d * M + j for j in range(lengths[d])] for d in ids]
        t = pa.table(
            {"id": pa.array(ids, pa.int64()), "input_ids": pa.array(toks, pa.list_(dtype))}
        )
        pq.write_table(t, os.path.join(root, f"s{s}.parquet"), row_group_size=row_group)
    return root


@pytest.fixture(scope="module")
def docs(tmp_path_factory):
    rng = np.random.default_rng(0)
    lengths = rng.integers(1, 90, size=400).tolist()
    lengths[5] = 300  # longer than a row: spans several
    lengths[50] = 0  # empty document
    root = write_docs(str(tmp_path_factory.mktemp("docs")), lengths)
    return root, lengths


def stream(root, pack, **kw):
    kw.setdefault("batch_size", 3)
    kw.setdefault("output", "numpy")
    return ParquetStream(root, columns=["input_ids"], pack=pack, **kw)


def doc_order(root, **kw):
    """Document ids in the order the unpacked stream yields them (same settings)."""
    ds = ParquetStream(root, columns=["id"], batch_size=50, output="numpy", **kw)
    return [int(i) for b in ds for i in b["id"]]


def rows_of(items):
    """input_ids, labels, position_ids, segment_ids as [rows, seq_len] arrays."""
    out = {
        k: np.concatenate([b[k] for b in items])
        for k in ("input_ids", "labels", "position_ids", "segment_ids")
    }
    return out


def check_rows(items, seq_len, shift=True, pad=0):
    """The properties every packed item must have; returns the rows."""
    for b in items:
        ids, seg = b["input_ids"], b["segment_ids"]
        assert ids.shape[1] == seq_len and seg.shape == ids.shape
        for r in range(ids.shape[0]):
            s = seg[r]
            real = s > 0
            k = int(s.max())
            # 1..k non-decreasing, each present, 0 only as trailing padding
            assert np.all(np.diff(s[real]) >= 0) and set(s[real].tolist()) == set(range(1, k + 1))
            assert np.all(real[: int(real.sum())]) and not np.any(real[int(real.sum()) :])
            assert np.all(ids[r][~real] == pad)
            pos, lab = b["position_ids"][r], b["labels"][r]
            for g in range(1, k + 1):
                idx = np.flatnonzero(s == g)
                assert np.array_equal(pos[idx], np.arange(len(idx)))
                toks = ids[r][idx]
                want = np.r_[toks[1:], -100] if shift else np.r_[-100, toks[1:]]
                assert np.array_equal(lab[idx], want)
            assert np.all(lab[~real] == -100) and np.all(pos[~real] == 0)
        # cu_seqlens: the runs of equal segment ids of each row, over the flattened batch
        cu = b["cu_seqlens"]
        assert cu.dtype == np.int32 and cu[0] == 0 and cu[-1] == seg.size
        flat = seg.reshape(-1)
        for a, z in zip(cu[:-1], cu[1:], strict=True):
            assert (
                z > a and len(set(flat[a:z].tolist())) == 1 and a // seq_len == (z - 1) // seq_len
            )
        assert b["max_seqlen"] == int(np.diff(cu).max())
    return rows_of(items)


def pieces(rows):
    """(doc, first offset, length) of every segment, in row order."""
    out = []
    for r in range(rows["input_ids"].shape[0]):
        s, ids = rows["segment_ids"][r], rows["input_ids"][r]
        for g in range(1, int(s.max()) + 1):
            t = ids[s == g]
            t = t[(t != BOS) & (t != EOS)]
            if len(t):
                out.append((int(t[0] // M), int(t[0] % M), len(t)))
    return out


def tokens(rows):
    ids = rows["input_ids"][rows["segment_ids"] > 0]
    return ids.tolist()


def all_tokens(lengths, docs_):
    return [d * M + j for d in docs_ for j in range(lengths[d])]


PACK64 = Pack(seq_len=64)


# -- concat ------------------------------------------------------------------------------------
def test_concat_rows_are_the_documents_concatenated_and_cut(docs):
    root, lengths = docs
    items = list(stream(root, Pack(seq_len=64)))
    rows = check_rows(items, 64)
    order = doc_order(root)
    # exactly the documents' tokens, in stream order, nothing lost or doubled
    assert tokens(rows) == all_tokens(lengths, order)
    pad = (rows["segment_ids"] == 0).sum(axis=1)
    assert np.all(pad[:-1] == 0) and pad[-1] > 0  # only the final row is padded
    assert any(p[1] > 0 for p in pieces(rows))  # some document spans rows


def test_concat_bos_eos_pad_and_unshifted_labels(docs):
    root, lengths = docs
    p = Pack(seq_len=50, bos_id=BOS, eos_id=EOS, pad_id=-1, shift_labels=False)
    items = list(stream(root, p, epochs=1))
    rows = check_rows(items, 50, shift=False, pad=-1)
    order = doc_order(root)
    want = [t for d in order for t in [BOS, *range(d * M, d * M + lengths[d]), EOS]]
    assert tokens(rows) == want


@pytest.mark.parametrize("dtype", [pa.int64(), pa.uint16(), pa.uint32(), pa.uint64()])
def test_token_types(tmp_path, dtype):
    root = write_docs(str(tmp_path / "ok"), [3, 5, 2, 7], shards=1, dtype=dtype)
    if dtype == pa.uint64():  # a token past int64 is refused, naming the column
        bad = str(tmp_path / "bad")
        os.makedirs(bad)
        t = pa.table({"input_ids": pa.array([[1, 2], [3, 2**63]], pa.list_(dtype))})
        pq.write_table(t, os.path.join(bad, "s0.parquet"))
        with pytest.raises(ValueError, match="input_ids.*out-of-range"):
            list(stream(bad, Pack(seq_len=3)))
    if dtype == pa.uint16():  # token values must fit
        t = pa.table({"input_ids": pa.array([[1, 2, 65535], [4]], pa.list_(dtype))})
        pq.write_table(t, os.path.join(root, "s0.parquet"))
        rows = rows_of(list(stream(root, Pack(seq_len=3), batch_size=2)))
        assert rows["input_ids"].tolist() == [[1, 2, 65535], [4, 0, 0]]
        return
    rows = rows_of(list(stream(root, Pack(seq_len=4), batch_size=2)))
    assert tokens(rows) == all_tokens([3, 5, 2, 7], [0, 1, 2, 3])


# -- resume ------------------------------------------------------------------------------------
ALGOS = [
    Pack(seq_len=64),
    Pack(seq_len=64, algorithm="best_fit", buffer_docs=16),
    Pack(seq_len=64, algorithm="best_fit", buffer_docs=8, long_docs="truncate", eos_id=EOS),
]


def run(root, pack, state=None, n=None, **kw):
    """Items of a fresh stream (from `state`), the first `n` only; and the state after them."""
    ds = stream(root, pack, **kw)
    if state is not None:
        ds.load_state_dict(state)
    out = []
    it = iter(ds)
    for b in it:
        out.append(b)
        if n is not None and len(out) == n:
            break
    return out, ds.state_dict()


def same(a, b):
    ra, rb = rows_of(a), rows_of(b)
    return all(np.array_equal(ra[k], rb[k]) for k in ra)


@pytest.mark.parametrize("pack", ALGOS, ids=["concat", "best_fit", "best_fit_truncate"])
@pytest.mark.parametrize(
    "kw", [dict(), dict(shuffle_buffer=20, seed=3, epochs=2)], ids=["plain", "shuffled_2_epochs"]
)
def test_resume_is_exact_at_every_point_and_twice(docs, pack, kw):
    root, _ = docs
    full, _ = run(root, pack, **kw)
    assert len(full) > 8
    spans_seen = False
    for k in range(1, len(full), max(1, len(full) // 12)):
        head, st = run(root, pack, n=k, **kw)
        spans_seen |= bool(st["position"]["pack"]["spans"])
        json.dumps(st)  # plain built-ins
        mid, st2 = run(root, pack, state=st, n=3, **kw)  # resume, stop again, resume again
        tail, _ = run(root, pack, state=st2, **kw)
        assert same(head + mid + tail, full), f"resume after {k} items"
    if pack.algorithm == "concat":
        assert spans_seen  # some resume point was mid-document


def test_resume_at_epoch_boundary(docs):
    root, _ = docs
    pack = Pack(seq_len=64)
    kw = dict(shuffle_buffer=10, seed=1, epochs=3, batch_size=1)
    full, _ = run(root, pack, **kw)
    # the item whose row holds the last document of epoch 0 and the first of epoch 1
    rows = rows_of(full)
    order = doc_order(root, shuffle_buffer=10, seed=1, epochs=3)
    n_docs = len(order) // 3
    last0 = order[n_docs - 1]
    at = next(i for i, p in enumerate(rows["input_ids"]) if np.any(p // M == last0))
    for k in (at, at + 1, at + 2):
        head, st = run(root, pack, n=k, **kw)
        tail, _ = run(root, pack, state=st, **kw)
        assert same(head + tail, full)


def pending_ids(pack_state):
    """The row ids of a state's pending documents, in queue order."""
    return np.frombuffer(base64.b64decode(pack_state["rows"]), "<u8").tolist()


@pytest.mark.parametrize("pack", ALGOS[:2], ids=["concat", "best_fit"])
def test_resume_while_the_window_holds_a_row_of_two_epochs(tmp_path, pack):
    """Six documents an epoch, fewer than the packer reads ahead: its queue holds the same row
    of two epochs, and every state (one after each item) loads and continues exactly."""
    root = write_docs(str(tmp_path), [5, 9, 3, 12, 7, 4], shards=2, row_group=2)
    kw = dict(epochs=30, batch_size=1)
    full, _ = run(root, pack, **kw)
    assert len(full) > 15
    twice = 0
    for k in range(1, len(full)):
        head, st = run(root, pack, n=k, **kw)
        ids = pending_ids(st["position"]["pack"])
        twice += len(ids) > len(set(ids))
        tail, _ = run(root, pack, state=st, **kw)
        assert same(head + tail, full), f"resume after {k} items"
    # best_fit's 16-document window holds rows of several epochs (concat: one read's rows)
    assert twice > 0 or pack.algorithm == "concat"


def test_state_size_is_independent_of_seq_len_and_position(docs):
    root, _ = docs
    sizes = {}
    for seq_len in (16, 4096):
        for k in (1, 5, 20):
            _, st = run(root, Pack(seq_len=seq_len), n=k, batch_size=1)
            sizes[seq_len, k] = len(json.dumps(st["position"]["pack"]))
    # pending references only: at most one pull of rows (64 ids) plus a span
    assert max(sizes.values()) < 64 * 11 + 60, sizes
    big = Pack(seq_len=4096, algorithm="best_fit", buffer_docs=256)
    _, st = run(root, big, n=1, batch_size=1)
    assert len(json.dumps(st["position"]["pack"])) < (256 + 64) * 11 + 60


# -- best_fit ------------------------------------------------------------------------------------
def test_best_fit_never_splits_a_document_that_fits(docs):
    root, lengths = docs
    items = list(stream(root, Pack(seq_len=64, algorithm="best_fit", buffer_docs=16)))
    rows = check_rows(items, 64)
    got = collections.Counter(tokens(rows))
    assert got == collections.Counter(all_tokens(lengths, range(len(lengths))))
    for d, off, n in pieces(rows):
        if lengths[d] <= 64:
            assert off == 0 and n == lengths[d]  # whole
    # the long document: whole rows, then its last part
    long = sorted(p for p in pieces(rows) if p[0] == 5)
    assert [p[1:] for p in long] == [(0, 64), (64, 64), (128, 64), (192, 64), (256, 44)]


def test_best_fit_long_docs_truncate_and_drop(docs):
    root, lengths = docs
    for mode in ("truncate", "drop"):
        p = Pack(seq_len=64, algorithm="best_fit", buffer_docs=16, long_docs=mode)
        rows = check_rows(list(stream(root, p)), 64)
        want = {
            d: min(n, 64) for d, n in enumerate(lengths) if n and (mode == "truncate" or n <= 64)
        }
        got = collections.Counter()
        for d, off, n in pieces(rows):
            assert off == 0
            got[d] += n
        assert dict(got) == want


def test_best_fit_padding_share_on_uniform_lengths(tmp_path):
    seq_len = 512
    lengths = np.random.default_rng(7).integers(1, seq_len + 1, size=3000).tolist()
    root = write_docs(str(tmp_path), lengths, shards=2, row_group=500)
    p = Pack(column="input_ids", seq_len=seq_len, algorithm="best_fit", buffer_docs=256)
    rows = rows_of(list(stream(root, p, batch_size=64)))
    seg = rows["segment_ids"][:-4]  # the pass's last rows empty the window: not the steady state
    share = float((seg == 0).mean())
    assert share <= 0.05, share
    concat_like = rows_of(list(stream(root, Pack(seq_len=seq_len), batch_size=64)))
    assert collections.Counter(tokens(rows)) == collections.Counter(tokens(concat_like))


# -- errors --------------------------------------------------------------------------------------
def test_bad_arguments_are_named(docs, tmp_path):
    root, _ = docs
    with pytest.raises(ValueError, match="algorithm"):
        Pack(algorithm="first")
    with pytest.raises(TypeError, match="seq_len"):
        Pack(seq_len=1.5)
    with pytest.raises(ValueError, match="seq_len"):
        Pack(seq_len=0)
    with pytest.raises(ValueError, match="not among the columns"):
        ParquetStream(root, columns=["id"], pack=Pack())
    with pytest.raises(ValueError, match="must be a list of integers"):
        ParquetStream(root, columns=["id"], pack=Pack(column="id"))
    ds = stream(root, Pack(seq_len=32))
    next(iter(ds))
    with pytest.raises(ValueError, match="skip"):
        ds.skip(1)


def test_hostile_and_mismatched_states_are_refused(docs):
    root, _ = docs
    _, st = run(root, Pack(seq_len=64), n=4)
    assert st["position"]["pack"]["spans"]

    def load(mutate, pack=PACK64):
        s = json.loads(json.dumps(st))
        mutate(s)
        ds = stream(root, pack)
        ds.load_state_dict(s)
        next(iter(ds))

    with pytest.raises(StateError, match="settings"):
        load(lambda s: None, Pack(seq_len=65))
    with pytest.raises(StateError, match="settings"):
        load(lambda s: None, None)
    with pytest.raises(StateError, match="spans"):
        load(lambda s: s["position"]["pack"]["spans"].append([10**6, 0, 1]))
    with pytest.raises(StateError, match="start < end"):
        load(lambda s: s["position"]["pack"]["spans"].__setitem__(0, [0, 5, 3]))
    with pytest.raises(StateError, match="tokens"):
        load(lambda s: s["position"]["pack"]["spans"].__setitem__(0, [0, 0, 10**6]))
    with pytest.raises(StateError, match="pack"):
        load(lambda s: s["position"].pop("pack"))
    with pytest.raises(StateError):
        load(lambda s: s["position"]["pack"].__setitem__("rows", "!!"))


# -- workers, ranks, elastic -------------------------------------------------------------------
def test_stateful_dataloader_workers_resume_exactly(docs):
    from torchdata.stateful_dataloader import StatefulDataLoader

    root, lengths = docs
    pack = Pack(seq_len=48, algorithm="best_fit", buffer_docs=8)

    def loader(state=None):
        ds = stream(root, pack, batch_size=2, output="torch")
        dl = StatefulDataLoader(ds, batch_size=None, num_workers=2)
        if state is not None:
            dl.load_state_dict(state)
        return dl

    batches = list(loader())
    # handed over from the worker as views of one shared-memory buffer, not one per tensor
    for b in batches:
        tensors = [v for v in b.values() if hasattr(v, "untyped_storage")]
        assert len({t.untyped_storage().data_ptr() for t in tensors}) == 1, sorted(b)
    full = [{k: v.numpy() if hasattr(v, "numpy") else v for k, v in b.items()} for b in batches]
    rows = check_rows(full, 48)
    # each worker packs its own slot: together every document exactly once
    assert collections.Counter(tokens(rows)) == collections.Counter(
        all_tokens(lengths, range(len(lengths)))
    )
    dl = loader()
    head = []
    for b in dl:
        head.append({k: v.numpy() if hasattr(v, "numpy") else v for k, v in b.items()})
        if len(head) == 5:
            break
    st = dl.state_dict()
    tail = [{k: v.numpy() if hasattr(v, "numpy") else v for k, v in b.items()} for b in loader(st)]
    assert same(head + tail, full)


@pytest.mark.parametrize("pack", ALGOS[:2], ids=["concat", "best_fit"])
@pytest.mark.parametrize("shuffle", [0, 16])
def test_elastic_resume_emits_every_token_exactly_once(docs, pack, shuffle):
    root, lengths = docs
    kw = dict(shuffle_buffer=shuffle, seed=2, even=None, batch_size=1)
    before, states = [], []
    for r, n in enumerate((4, 7)):  # 2 ranks, stopped at different points
        items, st = run(root, pack, n=n, rank=r, world_size=2, **kw)
        before += items
        states.append(st)
    assert any(s["position"]["pack"]["rows"] for s in states)
    after = []
    for r in range(3):  # continued by 3 ranks
        items, _ = run(root, pack, state=states, rank=r, world_size=3, **kw)
        after += items
    rows = check_rows(before + after, 64)
    assert collections.Counter(tokens(rows)) == collections.Counter(
        all_tokens(lengths, range(len(lengths)))
    )
    if pack.algorithm == "best_fit":
        for d, off, n in pieces(rows):
            if lengths[d] <= 64:
                assert off == 0 and n == lengths[d]


@pytest.mark.parametrize("pack", ALGOS[:2], ids=["concat", "best_fit"])
def test_two_phase_elastic_resume_with_a_rank_that_never_iterated(docs, pack):
    """4 ranks (rank 3 never iterated: a state without a slot) -> 3 in two phases: the
    summaries say which old slots hold pending documents, so no new rank asks for the state
    of the rank that never iterated; each new rank's stream is the one loading every state
    gives, and every token of every document is emitted exactly once."""
    from shardstream.checkpoint import state_summaries

    root, lengths = docs
    kw = dict(shuffle_buffer=16, seed=2, even=None, batch_size=1)
    before, states = [], []
    for r, n in enumerate((4, 7, 2)):
        items, st = run(root, pack, n=n, rank=r, world_size=4, **kw)
        before += items
        states.append(st)
    states.append(stream(root, pack, rank=3, world_size=4, **kw).state_dict())
    assert states[3]["slot"] is None
    summaries = state_summaries(states)
    after = []
    for r in range(3):
        ds = stream(root, pack, rank=r, world_size=3, **kw)
        need = ds.needed_slots(summaries)
        assert 3 not in need  # the unstarted rank: nothing pending, no rows buffered
        assert {i for i in range(3) if i % 3 == r} <= set(need)  # its pending documents
        ds.load_state_dict([states[i] for i in need], summaries=summaries)
        items = list(ds)
        want, _ = run(root, pack, state=states, rank=r, world_size=3, **kw)
        assert same(items, want) and len(items) == len(want)
        after += items
    rows = check_rows(before + after, 64)
    assert collections.Counter(tokens(rows)) == collections.Counter(
        all_tokens(lengths, range(len(lengths)))
    )


@pytest.mark.parametrize("output", ["torch", "numpy", "python"])
def test_row_mode_and_outputs_agree_with_batches(docs, output):
    root, _ = docs
    p = Pack(seq_len=40, algorithm="best_fit", buffer_docs=8)
    batches = rows_of(list(stream(root, p, batch_size=4)))
    got = list(stream(root, p, batch_size=None, output=output))
    assert len(got) == batches["input_ids"].shape[0]
    for i, r in enumerate(got):
        for k in ("input_ids", "labels", "position_ids", "segment_ids"):
            assert np.array_equal(np.asarray(r[k]), batches[k][i])
        cu = np.asarray(r["cu_seqlens"])
        assert cu.tolist() == cu_seqlens(batches["segment_ids"][i : i + 1]).tolist()
        assert r["max_seqlen"] == int(np.diff(cu).max())
    # row mode resumes exactly too
    head, st = run(root, p, n=7, batch_size=None, output=output)
    tail, _ = run(root, p, state=st, batch_size=None, output=output)
    ids = [np.asarray(r["input_ids"]) for r in head + tail]
    assert np.array_equal(np.stack(ids), batches["input_ids"])


def test_hostile_pack_states_are_refused_or_harmless(docs):
    """Random changes to a state's packing fields: a StateError (at load or at the first batch),
    never a panic or another exception; a state that loads packs rows with the row
    properties, of real documents' tokens."""
    from hypothesis import HealthCheck, given, settings
    from hypothesis import strategies as st

    root, lengths = docs
    pack = Pack(seq_len=64)
    _, base = run(root, pack, n=4)
    valid = set(all_tokens(lengths, range(len(lengths))))
    fields = [
        ("position", "pack", "rows"),
        ("position", "pack", "spans"),
        ("settings", "pack", "seq_len"),
        ("settings", "pack", "algorithm"),
        ("position", "pack"),
        ("settings", "pack"),
    ]
    values = st.one_of(
        st.integers(-(2**65), 2**65),
        st.text(max_size=12),
        st.none(),
        st.lists(st.lists(st.integers(0, 300), max_size=4), max_size=4),
        st.dictionaries(st.text(max_size=5), st.integers(), max_size=2),
    )

    @settings(
        max_examples=60, deadline=None, database=None, suppress_health_check=list(HealthCheck)
    )
    @given(path=st.sampled_from(fields), value=values)
    def fuzz(path, value):
        s = json.loads(json.dumps(base))
        node = s
        for k in path[:-1]:
            node = node[k]
        node[path[-1]] = value
        ds = stream(root, pack)
        try:
            ds.load_state_dict(s)
            items = list(ds)
        except StateError as e:
            assert str(e).strip()
            return
        if items:
            rows = check_rows(items, 64)
            assert set(tokens(rows)) <= valid

    fuzz()


def test_a_packing_source_in_a_mixture_yields_its_own_packed_rows(docs):
    from shardstream import Mixture

    root, _ = docs
    p = Pack(seq_len=40, algorithm="best_fit", buffer_docs=8)
    alone = list(stream(root, p, batch_size=4))
    mixed = list(
        Mixture(
            {"a": stream(root, p, batch_size=None)},
            weights={"a": 1.0},
            batch_size=4,
            on_exhausted="drop",
            output="numpy",
        )
    )
    assert same(mixed, alone)
    for b in mixed:  # one source: index 0 on every real token, -1 on padding
        assert np.array_equal(b["source_ids"], np.where(b["segment_ids"] > 0, 0, -1))


@pytest.mark.parametrize(
    "lengths,pack",
    [
        ([0] * 20, Pack(seq_len=16)),  # every document empty
        ([40, 0, 33] * 5, Pack(seq_len=16, algorithm="best_fit", long_docs="drop")),  # all too long
    ],
    ids=["empty", "dropped"],
)
def test_endless_stream_without_a_packable_document_is_an_error_not_a_hang(tmp_path, lengths, pack):
    root = write_docs(str(tmp_path), lengths, shards=2, row_group=4)
    with pytest.raises(ValueError, match="input_ids.*forever"):
        next(iter(stream(root, pack, epochs=None)))
    # a finite pass just ends (nothing to pack)
    assert list(stream(root, pack, epochs=2)) == []


# -- EvenBatches (the 2-rank runs are in tests/integration/test_distributed.py) ----------------
def test_even_batches_without_a_process_group_passes_batches_and_state_through(docs):
    from shardstream import EvenBatches
    from shardstream.checkpoint import state_summaries

    root, _ = docs
    p = ALGOS[1]
    full = list(stream(root, p))
    w = EvenBatches(stream(root, p), "pad")
    got = list(w)
    assert len(got) == len(full) and same(got, full) and (w.padded, w.dropped) == (0, 0)
    w = EvenBatches(stream(root, p), "drop")
    head = [b for _, b in zip(range(4), w, strict=False)]
    st = w.state_dict()
    assert set(st) == {"even_batches", "loader"} and st["even_batches"]["steps"] == 4
    # the stream's state is found inside (DCP's dcp_entries, elastic loads, summaries)
    assert [s["slot"] for s in state_summaries(st)] == [st["loader"]["slot"]]
    for state in (st, st["loader"]):  # its own state, or a bare loader state
        w = EvenBatches(stream(root, p), "drop")
        w.load_state_dict(state)
        if state is st:  # loaded, not iterated yet: its state is the loaded one
            assert w.state_dict() == st
        assert same(head + list(w), full)


def test_even_batches_padding_is_a_packed_batch_without_tokens(docs):
    from shardstream.even import _like, _padding

    root, _ = docs
    for kw in (dict(batch_size=3), dict(batch_size=None)):
        for output in ("numpy", "torch"):
            b = next(iter(stream(root, ALGOS[1], output=output, **kw)))
            n = b["input_ids"].shape[0] if kw["batch_size"] else 1
            seg = b["segment_ids"]  # as a Mixture's source_ids (int32, a copy)
            b["source_ids"] = seg.astype(np.int32) if output == "numpy" else seg.int().clone()
            pad = _padding(_like(b), pad_id=5)
            assert sorted(pad) == sorted(b)
            for k, v in pad.items():
                if k != "max_seqlen":
                    assert type(v) is type(b[k]) and v.dtype == b[k].dtype, k
                    assert tuple(v.shape) == tuple(b[k].shape), k
            as_np = {k: np.asarray(v) for k, v in pad.items() if k != "max_seqlen"}
            as_np = {k: v.reshape(n, -1) if k != "cu_seqlens" else v for k, v in as_np.items()}
            as_np["max_seqlen"] = pad["max_seqlen"]
            rows = check_rows([as_np], 64, pad=5)
            assert tokens(rows) == [] and np.all(as_np["source_ids"] == -1)
            assert as_np["cu_seqlens"].tolist() == [64 * i for i in range(n + 1)]


def test_even_batches_bad_arguments_are_named(docs):
    from shardstream import EvenBatches
    from torch.utils.data import DataLoader

    root, _ = docs
    with pytest.raises(ValueError, match="policy must be one of"):
        EvenBatches(stream(root, PACK64), "even")
    with pytest.raises(TypeError, match="loader must be an iterable"):
        EvenBatches(3, "drop")  # type: ignore[arg-type]
    with pytest.raises(ValueError, match='policy="pad" needs a packed'):
        EvenBatches(ParquetStream(root, columns=["id"], batch_size=4), "pad")
    EvenBatches(ParquetStream(root, columns=["id"], batch_size=4), "drop")  # any loader
    with pytest.raises(ValueError, match="output='python'"):
        EvenBatches(stream(root, PACK64, output="python"), "pad")
    with pytest.raises(ValueError, match="batch_size=2"):
        EvenBatches(DataLoader(stream(root, PACK64, batch_size=None), batch_size=2), "pad")
    with pytest.raises(TypeError, match="has no state_dict"):
        EvenBatches([1, 2], "drop").state_dict()
    st = EvenBatches(stream(root, PACK64), "pad").state_dict()
    w = EvenBatches(stream(root, PACK64), "drop")
    with pytest.raises(ValueError, match="policy='pad'"):
        w.load_state_dict(st)
    bad = {**st, "even_batches": {**st["even_batches"], "steps": -1}}
    with pytest.raises(ValueError, match="'steps'"):
        EvenBatches(stream(root, PACK64), "pad").load_state_dict(bad)
    with pytest.raises(ValueError, match="keys"):
        EvenBatches(stream(root, PACK64), "pad").load_state_dict({**st, "x": 1})
    like = {"max_seqlen": ["int", None, []]}
    like |= {k: ["torch", "int64", [2, 64]] for k in ("input_ids", "labels", "position_ids")}
    like |= {"segment_ids": ["torch", "int64", [2, 64]], "cu_seqlens": ["torch", "int32", [3]]}
    good = {**st, "even_batches": {**st["even_batches"], "like": like}}
    EvenBatches(stream(root, PACK64), "pad").load_state_dict(good)
    for k, v in (
        ("input_ids", ["torch", "float64", [2, 64]]),
        ("labels", ["torch", "x", [2]]),
        ("segment_ids", ["numpy", "int64", [-1]]),
        ("source", ["torch", "int16", [2]]),
    ):
        bad = {**st, "even_batches": {**st["even_batches"], "like": {**like, k: v}}}
        with pytest.raises(ValueError, match="'like'"):
            EvenBatches(stream(root, PACK64), "pad").load_state_dict(bad)


def test_accelerate_dispatch_of_packed_batches_is_refused(docs):
    """accelerate's dispatcher cuts every tensor of a batch along dim 0, which would give each
    process wrong cu_seqlens: with several processes a packing stream (or a mixture with a
    packing source) is refused naming the reason; one process and plain streams are not."""
    from types import SimpleNamespace

    from shardstream import Mixture
    from shardstream.integrations.accelerate import _wrapper

    root, _ = docs
    p = Pack(seq_len=40)
    base = SimpleNamespace(num_workers=0, drop_last=True, batch_size=None)
    dl = SimpleNamespace(base_dataloader=base, split_batches=True, use_stateful_dataloader=False)
    packed = stream(root, p)
    per_source = Mixture({"a": stream(root, p, batch_size=None)}, weights={"a": 1.0}, batch_size=4)
    for ds in (packed, per_source):
        with pytest.raises(ValueError, match="cu_seqlens"):
            _wrapper((dl, True, 2), ds).slot(None)
        assert _wrapper((dl, True, 1), ds).slot(None) == (0, 1)
    assert _wrapper((dl, True, 2), stream(root, None)).slot(None) == (0, 1)


def test_the_longest_rows_reserve_no_more_than_they_fill(docs, tmp_path):
    """A batch of packed rows used to reserve room for 64 of them before reading a token:
    8 GiB a column at the longest seq_len, which aborted the process wherever the address space
    is capped (``ulimit -v``). Under a cap of 2 GiB over what the process already maps, a batch
    of 64 rows of 2**24 tokens from ~17k tokens of documents is one row (~470 MB: the tokens
    and the padding of a row that exists)."""
    root, lengths = docs
    code = f"""
import resource
from shardstream import Pack, ParquetStream
ds = ParquetStream({root!r}, columns=["input_ids"], batch_size=64, output="numpy",
                   pack=Pack(column="input_ids", seq_len=2**24))
with open("/proc/self/statm") as f:
    mapped = int(f.read().split()[0]) * resource.getpagesize()
resource.setrlimit(resource.RLIMIT_AS, (mapped + (2 << 30), resource.RLIM_INFINITY))
b = next(iter(ds))
print(b["input_ids"].shape, int((b["segment_ids"] > 0).sum()))
"""
    env = {**os.environ, "PYTHONPATH": os.pathsep.join(sys.path)}
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, env=env)
    assert out.returncode == 0, out.stderr[-2000:]
    assert out.stdout.split() == ["(1,", f"{2**24})", str(sum(lengths))], out.stdout


def test_cli_state_checks_a_packed_state_against_its_source(docs, tmp_path, capsys):
    """``shardstream state FILE --source DIR`` rebuilds the stream from the state's settings:
    the saved ``pack`` arguments become a ``Pack`` (it said MISMATCH, "pack must be a
    shardstream.Pack", for every packed state)."""
    from shardstream import cli

    root, _ = docs
    pack = Pack(seq_len=64, algorithm="best_fit", buffer_docs=8)
    items, st = run(root, pack, n=3)
    path = tmp_path / "st.json"
    path.write_text(json.dumps(st))
    assert cli.main(["state", str(path), "--source", root]) == 0
    assert "matches" in capsys.readouterr().out
    other = write_docs(str(tmp_path / "other"), [5, 7, 9] * 20)
    assert cli.main(["state", str(path), "--source", other]) == 1
    assert "DOES NOT MATCH" in capsys.readouterr().out
