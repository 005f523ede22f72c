"""list_format: offsets / padded / nested forms of list<number> columns carry exactly the values
of the default per-row split form, for numpy and torch output."""

from __future__ import annotations

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
