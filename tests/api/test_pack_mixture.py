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
from test_pack import M, check_rows, pending_ids, pieces, rows_of, same, tokens, write_docs

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


def take(ds, state=None, n=None):
    """``ds``'s items (the first ``n``), from ``state`` if given, and its state after them."""
    if state is not None:
        ds.load_state_dict(state)
    out = []
    for b in ds:
        out.append(b)
        if n is not None and len(out) == n:
            break
    return out, ds.state_dict()


def run(srcs, pack, state=None, n=None, **kw):
    return take(mixture(srcs, pack, **kw), state, n)


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


@pytest.mark.parametrize("order", ["after_mixing", "per_source"])
def test_stateful_dataloader_workers_resume_exactly(srcs, order):
    """2 workers, each its own slot's mixture: a resume continues with exactly the uninterrupted
    run's packed rows (and source_ids). Per source: b runs out ("drop") in each worker at its
    own item, found out late; a resume before and after that."""
    from torchdata.stateful_dataloader import StatefulDataLoader

    pack = Pack(seq_len=48, algorithm="best_fit", buffer_docs=8)

    def loader(state=None):
        if order == "after_mixing":
            ds = mixture(srcs, pack, batch_size=2, output="torch")
        else:
            ds = per_source(srcs, on_exhausted="drop", samples=None, batch_size=2, output="torch")
        dl = StatefulDataLoader(ds, batch_size=None, num_workers=2)
        if state is not None:
            dl.load_state_dict(state)
        return dl

    def np_(b):
        return {k: v.numpy() if hasattr(v, "numpy") else v for k, v in b.items()}

    full = [np_(b) for b in loader()]
    check_rows(full, 48)
    if order == "after_mixing":
        check_sources(full)
        points = [5]
    else:
        _, tags = split_rows(full)
        last_b = int(np.flatnonzero(tags == 1)[-1]) // 2  # the item of b's last row
        assert 5 < last_b < len(full) - 3
        points = [5, len(full) - 3]
    for k in points:
        dl = loader()
        head = []
        for b in dl:
            head.append(np_(b))
            if len(head) == k:
                break
        st = dl.state_dict()
        tail = [np_(b) for b in loader(st)]
        assert same_items(head + tail, full), f"resume after {k} items"


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


@pytest.mark.parametrize("pack", ALGOS, ids=["concat", "best_fit"])
def test_resume_while_the_window_holds_a_row_of_two_epochs(srcs, tmp_path, pack):
    """A source of four documents cycles inside the packer's window, so the queue holds the
    same (source, row) of two of its epochs: every state (one after each item) loads and
    continues exactly."""
    ra = srcs[0]
    rc = write_docs(str(tmp_path), [5, 30, 9, 17], shards=1, row_group=3)

    def mk():
        sources = {
            "a": ParquetStream(ra, columns=["input_ids"], shuffle_buffer=8, seed=1),
            "c": ParquetStream(rc, columns=["input_ids"]),
        }
        return Mixture(
            sources, weights={"a": 1, "c": 1}, pack=pack, batch_size=1, output="numpy", samples=80
        )

    full, _ = take(mk())
    assert len(full) > 15
    twice = 0
    for k in range(1, len(full)):
        head, st = take(mk(), n=k)
        names = [n for n, c in st["pack"]["sources"] for _ in range(c)]
        refs = list(zip(names, pending_ids(st["pack"]), strict=True))
        twice += len(refs) > len(set(refs))
        tail, _ = take(mk(), state=st)
        assert same(head + tail, full), f"resume after {k} items"
        assert all(
            np.array_equal(x["source_ids"], y["source_ids"])
            for x, y in zip(head + tail, full, strict=True)
        )
    assert twice > 0


def test_arguments_and_hostile_states_are_refused(srcs):
    ra, rb = srcs[0], srcs[1]
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


# -- packing per source, then mixing packed rows --------------------------------------------------
PER = {"a": Pack(seq_len=48), "b": Pack(seq_len=48, algorithm="best_fit", buffer_docs=8)}


def per_source(srcs, packs=PER, weights=None, **kw):
    """Every source packs its own documents; the mixture mixes packed rows."""
    ra, rb = srcs[0], srcs[1]
    kw.setdefault("batch_size", 3)
    kw.setdefault("output", "numpy")
    sources = {
        "a": ParquetStream(ra, columns=["input_ids"], shuffle_buffer=8, seed=1, pack=packs["a"]),
        "b": ParquetStream(rb, columns=["input_ids"], pack=packs["b"]),
    }
    return Mixture(sources, weights=weights or {"a": 2, "b": 1}, **kw)


def own_rows(srcs, name, n, packs=PER, **kw):
    """The first `n` packed rows of source `name` packing alone (same settings, endless)."""
    root = srcs[0] if name == "a" else srcs[1]
    kw = dict(kw, epochs=kw.get("epochs"))
    if name == "a":
        kw.update(shuffle_buffer=8, seed=1)
    ds = ParquetStream(
        root, columns=["input_ids"], pack=packs[name], batch_size=1, output="numpy", **kw
    )
    out = []
    for b in ds:
        if len(out) == n:
            break
        out.append(b)
    return rows_of(out)


def split_rows(items):
    """All rows, and each row's source: one source per row, source_ids that source on every
    real token and -1 on padding."""
    rows = rows_of(items)
    src = np.concatenate([b["source_ids"] for b in items])
    seg = rows["segment_ids"]
    tags = []
    for r in range(seg.shape[0]):
        real = seg[r] > 0
        assert np.all(src[r][~real] == -1)
        t = set(src[r][real].tolist())
        assert len(t) == 1, f"row {r} mixes sources {t}"
        tag = t.pop()
        # and its tokens are that source's documents
        assert np.all((rows["input_ids"][r][real] // M >= B0) == (tag == 1))
        tags.append(tag)
    return rows, np.array(tags)


def check_proportions(tags, weights):
    """Deterministic mixing: every prefix holds each source within one row of its target."""
    w = np.array(weights, dtype=float) / sum(weights)
    t = np.arange(1, len(tags) + 1)
    for s, ws in enumerate(w):
        assert np.all(np.abs(np.cumsum(tags == s) - ws * t) < 1), f"source {s}"


def by_source(rows, tags, s):
    return {k: v[tags == s] for k, v in rows.items()}


def same_rows(a, b):
    return all(np.array_equal(a[k], b[k]) for k in a)


def test_per_source_rows_are_each_sources_own_packed_rows_in_exact_proportions(srcs):
    items = list(per_source(srcs, samples=120))
    rows, tags = split_rows(items)
    check_rows(items, 48)
    assert len(tags) == 120 and [len(b["input_ids"]) for b in items] == [3] * 40
    check_proportions(tags, [2, 1])
    # each source's rows, in order, are exactly its own stream's packed rows
    for s, name in enumerate("ab"):
        mine = by_source(rows, tags, s)
        assert same_rows(mine, own_rows(srcs, name, len(mine["input_ids"])))
    b_tokens = collections.Counter(tokens(by_source(rows, tags, 1)))
    assert max(b_tokens.values()) == 2  # b cycled into its second epoch


def test_per_source_drop_emits_every_token_once_and_cycle_caps_epochs(srcs):
    _, _, la, lb = srcs
    items = list(per_source(srcs, on_exhausted="drop", samples=None, batch_size=4))
    rows, tags = split_rows(items)
    check_rows(items, 48)
    docs = list(range(len(la))) + [B0 + i for i in range(len(lb))]
    want = [d * M + j for d in docs for j in range(length(la, lb, d))]
    assert collections.Counter(tokens(rows)) == collections.Counter(want)
    for s, name in enumerate("ab"):
        mine = by_source(rows, tags, s)
        assert same_rows(mine, own_rows(srcs, name, 10**6, epochs=1))
    # b ran out first: the rows after its last are all a's; before it, within one of 2:1
    last_b = int(np.flatnonzero(tags == 1)[-1])
    assert np.all(tags[last_b + 1 :] == 0) and last_b + 1 < len(tags)
    check_proportions(tags[:last_b], [2, 1])
    # cycle with max_epochs: b packs exactly two epochs, then leaves
    items = list(per_source(srcs, on_exhausted="cycle", max_epochs={"a": 1, "b": 2}))
    rows, tags = split_rows(items)
    for s, name, ep in ((0, "a", 1), (1, "b", 2)):
        mine = by_source(rows, tags, s)
        assert same_rows(mine, own_rows(srcs, name, 10**6, epochs=ep))


def per_run(srcs, state=None, n=None, **kw):
    return take(per_source(srcs, **kw), state, n)


def same_items(a, b):
    ra, rb = rows_of(a), rows_of(b)
    sa = np.concatenate([x["source_ids"] for x in a])
    sb = np.concatenate([x["source_ids"] for x in b])
    return all(np.array_equal(ra[k], rb[k]) for k in ra) and np.array_equal(sa, sb)


@pytest.mark.parametrize(
    "kw",
    [
        dict(samples=60),
        dict(on_exhausted="drop", samples=None, mixing="stratified", block=4),
        dict(on_exhausted="drop", samples=None, mixing="random", batch_size=None),
    ],
    ids=["cycle", "drop_stratified", "drop_random_rows"],
)
def test_per_source_resume_is_exact_at_many_points_and_twice(srcs, kw):
    full, _ = per_run(srcs, **kw)
    assert len(full) > 10
    spans = False
    for k in range(1, len(full), max(1, len(full) // 7)):
        head, st = per_run(srcs, n=k, **kw)
        json.dumps(st)  # plain built-ins
        spans |= bool(st["sources"]["a"]["position"]["pack"]["spans"])
        mid, st2 = per_run(srcs, state=st, n=2, **kw)
        tail, _ = per_run(srcs, state=st2, **kw)
        assert same_items(head + mid + tail, full), f"resume after {k} items"
    assert spans  # some resume point had a document of a pending mid-way


def test_per_source_reweighting_continues_each_sources_rows(srcs):
    head, st = per_run(srcs, n=6, samples=None)
    tail, _ = per_run(srcs, state=st, n=10, samples=None, weights={"a": 1, "b": 3})
    _, t_head = split_rows(head)
    rows, tags = split_rows(head + tail)
    check_proportions(tags[len(t_head) :], [1, 3])  # the targets rebase at the resume
    for s, name in enumerate("ab"):
        mine = by_source(rows, tags, s)
        assert same_rows(mine, own_rows(srcs, name, len(mine["input_ids"])))


def test_per_source_elastic_resume_emits_every_token_exactly_once(srcs):
    _, _, la, lb = srcs
    kw = dict(batch_size=2, samples=None, on_exhausted="drop", even=None)
    before, states = [], []
    for r, n in enumerate((2, 5)):  # 2 ranks, stopped at different points
        items, st = per_run(srcs, n=n, rank=r, world_size=2, **kw)
        before += items
        states.append(st)
    assert any(s["sources"][n]["position"]["pack"]["rows"] for s in states for n in "ab")
    after = []
    for r in range(3):  # continued by 3 ranks
        items, _ = per_run(srcs, state=states, rank=r, world_size=3, **kw)
        after += items
    rows, _ = split_rows(before + after)
    check_rows(before + after, 48)
    docs = list(range(len(la))) + [B0 + i for i in range(len(lb))]
    want = [d * M + j for d in docs for j in range(length(la, lb, d))]
    assert collections.Counter(tokens(rows)) == collections.Counter(want)


def test_per_source_arguments_are_refused(srcs, tmp_path):
    ra, rb = srcs[0], srcs[1]
    # accepted: token columns of different types (each source packs its own into int64 rows)
    for name, t in (("x", pa.int32()), ("y", pa.uint16())):
        os.makedirs(tmp_path / name)
        toks = pa.array([[1, 2, 3], [4, 5]], pa.list_(t))
        pq.write_table(pa.table({"input_ids": toks}), tmp_path / name / "s.parquet")
    two = {n: ParquetStream(str(tmp_path / n), pack=Pack(seq_len=4)) for n in "xy"}
    got = next(iter(Mixture(two, weights={"x": 1, "y": 1}, batch_size=2, output="numpy")))
    assert got["input_ids"].tolist() == [[1, 2, 3, 4], [1, 2, 3, 4]]
    assert got["source_ids"].tolist() == [[0, 0, 0, 0], [1, 1, 1, 1]]
    a = ParquetStream(ra, columns=["input_ids"], pack=Pack(seq_len=48))
    with pytest.raises(ValueError, match="'a' packs.*'b' does not"):
        Mixture({"a": a, "b": ParquetStream(rb, columns=["input_ids"])}, weights={"a": 1, "b": 1})
    with pytest.raises(ValueError, match="choose one order"):
        Mixture({"a": a}, weights={"a": 1}, pack=Pack(seq_len=48))
    with pytest.raises(ValueError, match=r"different seq_len \[32, 48\]"):
        per_source(srcs, packs={"a": Pack(seq_len=48), "b": Pack(seq_len=32)})
    with pytest.raises(ValueError, match="by_source"):
        per_source(srcs, combine="by_source")
    with pytest.raises(ValueError, match="'stop'.*cannot stop together"):
        per_source(srcs, on_exhausted={"b": "stop"}, even="drop")
    # with even=None, 'stop' ends this slot when the mixer picks b again after its last
    # packed row (found out then): all of b's rows, then at most the a rows before b's turn
    items = list(per_source(srcs, on_exhausted={"b": "stop"}, even=None, batch_size=1))
    rows, tags = split_rows(items)
    last_b = int(np.flatnonzero(tags == 1)[-1])
    assert np.all(tags[last_b + 1 :] == 0) and len(tags) - 1 - last_b <= 2
    assert same_rows(by_source(rows, tags, 1), own_rows(srcs, "b", 10**6, epochs=1))
    # a per-source packed state is not an unpacked mixture's (the sources' settings differ)
    _, st = per_run(srcs, n=2)
    with pytest.raises(StateError, match='source "a"'):
        mixture(srcs, None, samples=None).load_state_dict(st)
