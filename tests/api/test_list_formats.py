"""list_format: offsets / padded / nested forms of list<number> columns carry exactly the values
of the default per-row split form, for numpy and torch output."""

from __future__ import annotations

import pickle

import numpy as np
import pytest
import torch
from shardstream import ParquetStream, datagen


@pytest.fixture(scope="module")
def lists_dir(tmp_path_factory):
    d = tmp_path_factory.mktemp("lists")
    datagen.write_shards(d, num_shards=2, rows_per_shard=[90, 45], tokens_len=(0, 9), seed=5)
    return str(d)


def _batches(root, output, fmt):
    ds = ParquetStream(
        root,
        columns=["id", "tokens"],
        batch_size=16,
        shuffle_buffer=20,
        seed=1,
        output=output,
        list_format=fmt,
    )
    return list(ds)


def _rows_from(fmt, col):
    """Per-row python lists from any list_format value."""
    to_list = lambda x: x.tolist()  # noqa: E731 - numpy and torch alike
    if fmt == "split":
        return [to_list(r) for r in col]
    if fmt == "offsets":
        values, offsets = col
        return [to_list(values[offsets[i] : offsets[i + 1]]) for i in range(len(offsets) - 1)]
    if fmt == "padded":
        padded, lengths = col
        return [to_list(padded[i, : int(n)]) for i, n in enumerate(lengths)]
    return [to_list(t) for t in col.unbind()]


@pytest.mark.parametrize("output", ["numpy", "torch"])
@pytest.mark.parametrize("fmt", ["offsets", "padded", "nested"])
def test_list_formats_match_split(lists_dir, output, fmt):
    if fmt == "nested" and output == "numpy":
        with pytest.raises(ValueError, match="nested"):
            ParquetStream(lists_dir, output="numpy", list_format="nested")
        return
    want = [_rows_from("split", b["tokens"]) for b in _batches(lists_dir, output, "split")]
    got_batches = _batches(lists_dir, output, fmt)
    got = [_rows_from(fmt, b["tokens"]) for b in got_batches]
    assert got == want
    ids = [int(i) for b in got_batches for i in b["id"]]
    assert [datagen.expected_tokens(i, (0, 9)) for i in ids] == [r for b in got for r in b]
    if fmt == "padded":
        padded, lengths = got_batches[0]["tokens"]
        assert padded.shape == (16, int(max(lengths)))
        mask = np.arange(padded.shape[1])[None, :] >= np.asarray(lengths)[:, None]
        assert (np.asarray(padded)[mask] == 0).all()
    if fmt == "offsets" and output == "torch":
        values, _ = got_batches[0]["tokens"]
        assert values.dtype == torch.int32


def test_bad_list_format(lists_dir):
    with pytest.raises(ValueError, match="list_format"):
        ParquetStream(lists_dir, list_format="ragged")


@pytest.mark.parametrize("output", ["numpy", "torch"])
def test_null_rows_that_point_at_values_do_not_shift_later_rows(output):
    """A null list row may still span values in the child array (legal Arrow): each row must be
    sliced by its own offsets, not from the flattened non-null values."""
    import pyarrow as pa
    from shardstream.convert import Converter

    child = pa.array([7, 8, 9, 10, 11, 12], pa.int32())
    arr = pa.ListArray.from_arrays(
        pa.array([0, 2, 4, 5, 6], pa.int32()), child, mask=pa.array([False, True, False, False])
    )
    want = [[7, 8], None, [11], [12]]
    for a, expect in ((arr, want), (arr.slice(1), want[1:]), (arr.slice(2, 2), want[2:4])):
        out = Converter(output, pa.schema([("t", a.type)]), "split").batch(
            pa.record_batch([a], names=["t"])
        )["t"]
        got = [None if x is None else [int(v) for v in x] for x in out]
        assert got == expect == a.to_pylist()


# ------------------------------------------------------------------ split: SplitList transport


def _tokens_of(ids, lo_hi):
    return [datagen.expected_tokens(int(i), lo_hi) for i in ids]


def _one_storage(rows) -> bool:
    return len({r.untyped_storage().data_ptr() for r in rows}) == 1


@pytest.mark.parametrize("batch_size", [8, 2000])  # values inlined in the pickle, and not
def test_split_list_crosses_dataloader_workers_as_views(tmp_path, batch_size):
    """Through worker processes a split column arrives as a SplitList of views of one values
    tensor (not one tensor per row), holding exactly each row's tokens."""
    from shardstream.convert import SplitList
    from torch.utils.data import DataLoader

    lo_hi = (20, 60)
    datagen.write_shards(tmp_path, num_shards=2, rows_per_shard=3000, tokens_len=lo_hi, seed=2)
    ds = ParquetStream(
        str(tmp_path), columns=["id", "tokens"], batch_size=batch_size, output="torch"
    )
    seen = 0
    for b in DataLoader(ds, batch_size=None, num_workers=2):
        rows = b["tokens"]
        assert type(rows) is SplitList and len(rows) == len(b["id"])
        assert _one_storage(rows)
        assert [r.tolist() for r in rows] == _tokens_of(b["id"], lo_hi)
        seen += len(rows)
    assert seen == 6000


def _split_list(with_nulls: bool):
    from shardstream.convert import SplitList

    values = torch.arange(100, 130, dtype=torch.int32)
    offsets = np.array([0, 4, 4, 10, 30], dtype=np.int64)
    valid = np.array([True, False, True, True]) if with_nulls else None
    return SplitList._from_parts(values, offsets, valid)


@pytest.mark.parametrize("with_nulls", [False, True])
def test_split_list_pickles_compactly_and_rebuilds_views(with_nulls):
    import copy

    s = _split_list(with_nulls)
    want = [None if r is None else r.tolist() for r in s]
    assert want[1] == (None if with_nulls else [])
    for got in (pickle.loads(pickle.dumps(s)), copy.deepcopy(s), copy.copy(s)):
        assert type(got) is type(s) and got._compact()
        assert [None if r is None else r.tolist() for r in got] == want
        assert _one_storage([r for r in got if r is not None])
    # One values array and the offsets (4 + 0.8 MB here), not one tensor per row.
    big = type(s)._from_parts(
        torch.zeros(10**6, dtype=torch.int32), np.arange(0, 10**6 + 1, 10), None
    )
    assert len(big) == 10**5 and len(pickle.dumps(big)) < 4_810_000


def test_split_list_changed_pickles_its_items():
    """Once the list changes, what crosses is the list as it is now."""
    for change in (
        lambda s: s.append(torch.tensor([7], dtype=torch.int32)),
        lambda s: s.__setitem__(0, torch.tensor([9], dtype=torch.int32)),
        lambda s: s.reverse(),
        lambda s: s.pop(),
        lambda s: s.__delitem__(slice(0, 2)),
        lambda s: s.__iadd__([torch.tensor([1])]),
    ):
        s = _split_list(False)
        change(s)
        want = [r.tolist() for r in s]
        assert not s._compact()
        assert [r.tolist() for r in pickle.loads(pickle.dumps(s))] == want
    s = _split_list(False)
    s[2] = s[2]  # the same object: no change (DataLoader's default_convert does this)
    assert s._compact()


def test_split_list_through_default_convert_and_pin_memory(monkeypatch):
    """DataLoader's worker-side default_convert keeps it compact; pin_memory (pin_memory=True)
    pins the values once and returns views of the pinned copy. No accelerator here: pinning is
    stood in for by a copy that counts its calls."""
    from shardstream.convert import SplitList
    from torch.utils.data._utils.collate import default_convert
    from torch.utils.data._utils.pin_memory import pin_memory

    batch = {"id": torch.arange(4), "tokens": _split_list(True)}
    want = [None if r is None else r.tolist() for r in batch["tokens"]]
    conv = default_convert(batch)
    assert type(conv["tokens"]) is SplitList and conv["tokens"]._compact()
    pinned: list = []

    def fake_pin(self, device=None):
        pinned.append(self.numel())
        return self.clone()

    monkeypatch.setattr(torch.Tensor, "pin_memory", fake_pin)
    out = pin_memory(conv)
    assert sorted(pinned) == [4, 30]  # id, and the tokens' values once
    rows = out["tokens"]
    assert type(rows) is SplitList and rows._compact()
    assert [None if r is None else r.tolist() for r in rows] == want
    assert rows._values.data_ptr() != batch["tokens"]._values.data_ptr()
    assert _one_storage([r for r in rows if r is not None] + [rows._values])


def test_split_list_works_where_a_list_of_tensors_does():
    s = _split_list(False)
    rows = [r.tolist() for r in s]
    padded = torch.nn.utils.rnn.pad_sequence(s, batch_first=True, padding_value=-1)
    assert padded.shape == (4, 20)
    assert [p[: len(r)].tolist() for p, r in zip(padded, rows, strict=True)] == rows
    assert torch.cat(s).tolist() == sum(rows, [])
    assert isinstance(s, list) and len(s) == 4 and s[-1].tolist() == rows[-1]


# ------------------------------------------------------------------ Batch: small tensors inline


def _values_of(v):
    """A batch value as comparable Python data, with its exact tensor types and dtypes."""
    from shardstream.convert import SplitList

    if isinstance(v, torch.Tensor) and v.is_nested:
        return ("nested", str(v.dtype), [_values_of(t) for t in v.unbind()])
    if isinstance(v, torch.Tensor):
        return (type(v).__name__, str(v.dtype), tuple(v.shape), v.tolist())
    if isinstance(v, SplitList):
        return ("SplitList", v._compact(), [_values_of(t) for t in v])
    if isinstance(v, (list, tuple)):  # default_convert turns the (offsets/padded) tuples into lists
        return ("seq", [_values_of(t) for t in v])
    return (type(v).__name__, v)


def _batch_values(b):
    return (type(b).__name__, {k: _values_of(v) for k, v in b.items()})


@pytest.mark.parametrize("fmt", ["split", "offsets", "padded", "nested"])
@pytest.mark.parametrize("batch_size", [8, 700])  # every tensor inline; values over 64 KiB
def test_batches_through_stateful_loader_workers_are_the_streams_batches(tmp_path, fmt, batch_size):
    """Each batch a StatefulDataLoader's 2 workers deliver is, in full (types, dtypes, shapes,
    values), the batch the same slot's stream yields in-process; every batch arrives once."""
    from shardstream.convert import Batch
    from torch.utils.data._utils.collate import default_convert
    from torchdata.stateful_dataloader import StatefulDataLoader

    datagen.write_shards(tmp_path, num_shards=2, rows_per_shard=1500, tokens_len=(20, 60), seed=3)
    kw = dict(columns=["id", "tokens"], batch_size=batch_size, output="torch", list_format=fmt)
    want = {}
    for rank in (0, 1):  # slot `rank` of 2 = DataLoader worker `rank` of 2
        for b in ParquetStream(str(tmp_path), rank=rank, world_size=2, **kw):
            assert type(b) is Batch
            want[int(b["id"][0])] = _batch_values(default_convert(b))
    ds = ParquetStream(str(tmp_path), **kw)
    got = {}
    for b in StatefulDataLoader(ds, batch_size=None, num_workers=2, snapshot_every_n_steps=1):
        assert type(b) is Batch and not b["id"].is_shared()  # came inside the pickle
        got[int(b["id"][0])] = _batch_values(b)
    assert got == want
    assert sum(len(v[1]["id"][3]) for v in got.values()) == 3000


def test_batch_pipe_pickle_inlines_small_tensors_and_plain_pickle_is_a_dict():
    """Through multiprocessing's pickler (a DataLoader worker's queue) a Batch's small tensors
    travel inside the pickle (no shared memory) and come back equal; larger ones take torch's
    shared-memory path; plain pickle is unaffected."""
    from multiprocessing.reduction import ForkingPickler

    import pyarrow as pa
    from shardstream.convert import Batch, Converter

    Converter("torch", pa.schema([]))  # registers the pipe reducer, as any torch stream does
    small = torch.arange(5, dtype=torch.int32)
    big = torch.arange(20_000, dtype=torch.float64)  # 160 kB
    nested = torch.nested.nested_tensor_from_jagged(
        torch.arange(7, dtype=torch.int32), torch.tensor([0, 3, 3, 7])
    )
    nested_big = torch.nested.nested_tensor_from_jagged(big, torch.tensor([0, 19_999, 20_000]))
    b = Batch(
        id=torch.arange(3),
        tokens=(small, torch.tensor([0, 2, 5])),
        big=big,
        name=["a", "b", "c"],
        nested=nested,
        nested_big=nested_big,
    )
    out = pickle.loads(ForkingPickler.dumps(b))
    assert type(out) is Batch and list(out) == list(b)
    assert _batch_values(out) == _batch_values(b)
    assert type(out["tokens"]) is tuple
    assert not out["id"].is_shared() and not out["tokens"][0].is_shared()
    assert out["big"].is_shared()  # the shared-memory path, as before
    # a nested column: rebuilt from its values and offsets, the offsets inside the pickle
    for k in ("nested", "nested_big"):
        assert out[k].is_nested and out[k].layout is torch.jagged
        assert torch.equal(out[k].offsets(), b[k].offsets()) and not out[k].offsets().is_shared()
        assert torch.equal(out[k].values(), b[k].values())
    assert not out["nested"].values().is_shared() and out["nested_big"].values().is_shared()
    for t in (out["id"], *out["tokens"]):  # writable, own memory
        t.add_(0)
    plain = pickle.loads(pickle.dumps(b))
    assert type(plain) is Batch and _batch_values(plain) == _batch_values(b)


@pytest.mark.parametrize("fmt", ["split", "offsets", "padded"])
def test_pin_memory_of_worker_batches(tmp_path, monkeypatch, fmt):
    """DataLoader(pin_memory=True)'s pinning (torch's pin_memory on each received batch) keeps
    the Batch type and every value; each tensor is pinned once (the split column's values once).
    No accelerator here: pinning is stood in for by a copy that counts its calls."""
    from shardstream.convert import Batch, SplitList
    from torch.utils.data import DataLoader
    from torch.utils.data._utils.pin_memory import pin_memory

    datagen.write_shards(tmp_path, num_shards=2, rows_per_shard=300, tokens_len=(20, 60), seed=4)
    ds = ParquetStream(
        str(tmp_path), columns=["id", "tokens"], batch_size=32, output="torch", list_format=fmt
    )
    batches = list(DataLoader(ds, batch_size=None, num_workers=2))
    pinned: list = []

    def fake_pin(self, device=None):
        pinned.append(self.numel())
        return self.clone()

    monkeypatch.setattr(torch.Tensor, "pin_memory", fake_pin)
    for b in batches:
        pinned.clear()
        out = pin_memory(b)
        assert type(out) is Batch and _batch_values(out) == _batch_values(b)
        assert out["id"].data_ptr() != b["id"].data_ptr()
        if fmt == "split":
            assert type(out["tokens"]) is SplitList and out["tokens"]._compact()
            assert sorted(pinned) == sorted([len(b["id"]), out["tokens"]._values.numel()])
        else:
            assert len(pinned) == 3  # id and the pair
