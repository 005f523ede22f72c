"""Packing after mixing (``Mixture(..., pack=Pack(...))``): the mixture's documents, from several
sources, packed together. Row properties and a per-token source column, token conservation in
mixing order, exact resume at many points (mid-document, at a source's epoch boundary, twice in
a row), StatefulDataLoader workers, elastic ranks 2 -> 3 (every token of every consumed document
exactly once) and hostile states refused. The checkers are test_pack.py's."""

from __future__ import annotations

import collections
import json
import os

import numpy as np
import pyarrow as pa
import pyarrow.parquet as pq
import pytest
from shardstream import Mixture, Pack, ParquetStream, StateError
from test_pack import M, check_rows, pieces, rows_of, same, tokens, write_docs

B0 = 1000  # source "b"'s documents are 1000, 1001, ...: a token says its source


@pytest.fixture(scope="module")
def srcs(tmp_path_factory):
    rng = np.random.default_rng(5)
    la = rng.integers(1, 70, size=160).tolist()
    la[3] = 200  # longer than a row
    la[40] = 0  # empty
    lb = rng.integers(1, 40, size=60).tolist()
    ra = write_docs(str(tmp_path_factory.mktemp("a")), la, shards=2, row_group=29)
    rb = str(tmp_path_factory.mktemp("b"))
    ids = [B0 + i for i in range(len(lb))]
    toks = [[d * M + j for j in range(n)] for d, n in zip(ids, lb, strict=True)]
    t = pa.table(
        {"id": pa.array(ids, pa.int64()), "input_ids": pa.array(toks, pa.list_(pa.int32()))}
    )
    pq.write_table(t, os.path.join(rb, "b.parquet"), row_group_size=25)
    return ra, rb, la, lb


def length(la, lb, d):
    return lb[d - B0] if d >= B0 else la[d]


def mixture(srcs, pack, columns=("input_ids",), **kw):
    ra, rb = srcs[0], srcs[1]
    kw.setdefault("batch_size", 3)
    kw.setdefault("output", "numpy")
    kw.setdefault("samples", 300)
    sources = {
        "a": ParquetStream(ra, columns=list(columns), shuffle_buffer=8, seed=1),
        "b": ParquetStream(rb, columns=list(columns)),
    }
    return Mixture(sources, weights={"a": 2, "b": 1}, pack=pack, **kw)


def doc_order(srcs, **kw):
    """Document ids in the order the unpacked mixture yields them (same settings)."""
    kw = dict(kw, batch_size=50)
    return [int(i) for b in mixture(srcs, None, columns=("id",), **kw) for i in b["id"]]


def run(srcs, pack, state=None, n=None, **kw):
    ds = mixture(srcs, pack, **kw)
    if state is not None:
        ds.load_state_dict(state)
    out = []
    for b in ds:
        out.append(b)
        if n is not None and len(out) == n:
            break
    return out, ds.state_dict()


def check_sources(items):
    """source_ids: each real token's source (b's documents are >= B0), -1 on padding."""
    for b in items:
        seg, src, ids = b["segment_ids"], b["source_ids"], b["input_ids"]
        assert src.shape == ids.shape
        assert np.all(src[seg == 0] == -1)
        real = seg > 0
        assert np.array_equal(src[real], (ids[real] // M >= B0).astype(src.dtype))


ALGOS = [Pack(seq_len=64), Pack(seq_len=64, algorithm="best_fit", buffer_docs=16)]


@pytest.mark.parametrize("pack", ALGOS, ids=["concat", "best_fit"])
def test_rows_sources_and_tokens_in_mixing_order(srcs, pack):
    _, _, la, lb = srcs
    items = list(mixture(srcs, pack))
    rows = check_rows(items, 64)
    check_sources(items)
    order = doc_order(srcs)
    assert len(order) == 300 and sum(d >= B0 for d in order) > len(lb)  # b cycled
    want = [d * M + j for d in order for j in range(length(la, lb, d))]
    if pack.algorithm == "concat":
        assert tokens(rows) == want  # the documents in mixing order, cut every 64 tokens
    else:
        got = collections.Counter(tokens(rows))
        assert got == collections.Counter(want)
        for d, off, n in pieces(rows):
            if length(la, lb, d) <= 64:
                assert off == 0 and n == length(la, lb, d)


@pytest.mark.parametrize("pack", ALGOS, ids=["concat", "best_fit"])
def test_resume_is_exact_at_many_points_and_twice(srcs, pack):
    full, _ = run(srcs, pack)
    assert len(full) > 10
    spans_seen = False
    for k in range(1, len(full), max(1, len(full) // 8)):
        head, st = run(srcs, pack, n=k)
        json.dumps(st)  # plain built-ins
        spans_seen |= bool(st["pack"]["spans"])
        mid, st2 = run(srcs, pack, state=st, n=2)
        tail, _ = run(srcs, pack, state=st2)
        assert same(head + mid + tail, full), f"resume after {k} items"
        assert all(
            np.array_equal(x["source_ids"], y["source_ids"])
            for x, y in zip(head + mid + tail, full, strict=True)
        )
    if pack.algorithm == "concat":
        assert spans_seen  # some resume point was mid-document


def test_resume_at_a_sources_epoch_boundary(srcs):
    _, _, _, lb = srcs
    pack = Pack(seq_len=32)
    full, _ = run(srcs, pack, batch_size=1)
    rows = rows_of(full)
    b_docs = [d for d in doc_order(srcs) if d >= B0]
    last = b_docs[len(lb) - 1]  # b's last document of its first epoch
    at = next(i for i, r in enumerate(rows["input_ids"]) if np.any(r // M == last))
    for k in (at, at + 1):
        head, st = run(srcs, pack, n=k, batch_size=1)
        tail, _ = run(srcs, pack, state=st, batch_size=1)
        assert same(head + tail, full)


def test_stateful_dataloader_workers_resume_exactly(srcs):
    from torchdata.stateful_dataloader import StatefulDataLoader

    pack = Pack(seq_len=48, algorithm="best_fit", buffer_docs=8)

    def loader(state=None):
        ds = mixture(srcs, pack, batch_size=2, output="torch")
        dl = StatefulDataLoader(ds, batch_size=None, num_workers=2)
        if state is not None:
            dl.load_state_dict(state)
        return dl

    def np_(b):
        return {k: v.numpy() if hasattr(v, "numpy") else v for k, v in b.items()}

    full = [np_(b) for b in loader()]
    check_rows(full, 48)
    check_sources(full)
    dl = loader()
    head = []
    for b in dl:
        head.append(np_(b))
        if len(head) == 5:
            break
    st = dl.state_dict()
    tail = [np_(b) for b in loader(st)]
    assert same(head + tail, full)


@pytest.mark.parametrize("pack", ALGOS, ids=["concat", "best_fit"])
def test_elastic_resume_emits_every_token_exactly_once(srcs, pack):
    _, _, la, lb = srcs
    # every document of both sources once: each source leaves the mix when it runs out
    kw = dict(batch_size=1, samples=None, on_exhausted="drop", even=None)
    before, states = [], []
    for r, n in enumerate((3, 6)):  # 2 ranks, stopped at different points
        items, st = run(srcs, pack, n=n, rank=r, world_size=2, **kw)
        before += items
        states.append(st)
    assert any(s["pack"]["rows"] for s in states)
    after = []
    for r in range(3):  # continued by 3 ranks
        items, _ = run(srcs, pack, state=states, rank=r, world_size=3, **kw)
        after += items
    rows = check_rows(before + after, 64)
    check_sources(before + after)
    docs = list(range(len(la))) + [B0 + i for i in range(len(lb))]
    want = [d * M + j for d in docs for j in range(length(la, lb, d))]
    assert collections.Counter(tokens(rows)) == collections.Counter(want)


def test_row_mode_torch_has_source_ids(srcs):
    p = Pack(seq_len=40, algorithm="best_fit", buffer_docs=8)
    batches = rows_of(list(mixture(srcs, p, batch_size=4, samples=60)))
    got = list(mixture(srcs, p, batch_size=None, samples=60, output="torch"))
    assert len(got) == batches["input_ids"].shape[0]
    for i, r in enumerate(got):
        assert np.array_equal(r["input_ids"].numpy(), batches["input_ids"][i])
        assert r["source_ids"].shape == (40,)
    head, st = run(srcs, p, n=5, batch_size=None, samples=60)
    tail, _ = run(srcs, p, state=st, batch_size=None, samples=60)
    ids = np.stack([r["input_ids"] for r in head + tail])
    assert np.array_equal(ids, batches["input_ids"])


def test_arguments_and_hostile_states_are_refused(srcs):
    ra, rb = srcs[0], srcs[1]
    with pytest.raises(ValueError, match="pack after mixing instead"):
        Mixture({"a": ParquetStream(ra, columns=["input_ids"], pack=Pack())}, weights={"a": 1})
    with pytest.raises(ValueError, match="by_source"):
        mixture(srcs, Pack(), combine="by_source")
    with pytest.raises(ValueError, match="source 'b'.*not among the columns"):
        Mixture(
            {"a": ParquetStream(ra, columns=["input_ids"]), "b": ParquetStream(rb, columns=["id"])},
            weights={"a": 1, "b": 1},
            pack=Pack(),
        )
    pack = Pack(seq_len=64)
    _, st = run(srcs, pack, n=4)
    assert st["pack"]["spans"] and st["pack"]["sources"]

    def load(mutate, p=pack):
        s = json.loads(json.dumps(st))
        mutate(s)
        ds = mixture(srcs, p)
        ds.load_state_dict(s)
        next(iter(ds))

    load(lambda s: None)  # the unchanged state loads
    with pytest.raises(StateError, match="settings"):
        load(lambda s: None, Pack(seq_len=65))
    with pytest.raises(StateError, match="settings"):
        load(lambda s: None, None)
    with pytest.raises(StateError, match="pack"):
        load(lambda s: s.pop("pack"))
    with pytest.raises(StateError, match="sources"):
        load(lambda s: s["pack"]["sources"].append(["a", 1]))
    with pytest.raises(StateError, match="not one of its sources"):
        load(lambda s: s["pack"]["sources"].__setitem__(0, ["zz", s["pack"]["sources"][0][1]]))
    with pytest.raises(StateError, match="spans"):
        load(lambda s: s["pack"]["spans"].append([10**6, 0, 1]))
    with pytest.raises(StateError, match="tokens"):
        load(lambda s: s["pack"]["spans"].__setitem__(0, [0, 0, 10**6]))
    with pytest.raises(StateError):
        load(lambda s: s["pack"].__setitem__("rows", "!!"))
    # an unpacked mixture's state has no "pack" (states without packing are unchanged)
    _, plain = run(srcs, None, n=2)
    assert "pack" not in plain and "pack" not in plain["settings"]
    ds = mixture(srcs, pack)
    with pytest.raises(StateError, match="pack: state has None"):
        ds.load_state_dict(plain)
