"""``Pack``: pack a token column into rows of exactly ``seq_len`` tokens.

The packing itself (the algorithms, the pending documents in the state) is the core's
(``rust/core/src/pack``); this module holds the arguments and turns the core's packed rows into
the outputs a language model takes, including flash-attention's ``cu_seqlens``.
"""

from __future__ import annotations

from collections.abc import Iterator
from dataclasses import dataclass
from typing import Any

import numpy as np
import pyarrow as pa

from ._rows import _numpy

__all__ = ["Pack"]

ALGORITHMS = ("concat", "best_fit")
LONG_DOCS = ("split", "truncate", "drop")


def _int(v: Any, name: str, none_ok: bool = False) -> None:
    if none_ok and v is None:
        return
    if isinstance(v, bool) or not isinstance(v, int):
        want = "an int or None" if none_ok else "an int"
        raise TypeError(f"Pack {name} must be {want}, got {type(v).__name__} {v!r}")


@dataclass(frozen=True)
class Pack:
    """How :class:`ParquetStream` packs documents (rows of a ``list<int>`` token column) into
    rows of exactly ``seq_len`` tokens.

    Args:
        column: the token column (``list`` of int32, int64, uint16, uint32, ...); it must be
            among the stream's ``columns``.
        seq_len: tokens per packed row.
        algorithm: ``"concat"`` concatenates documents and cuts every ``seq_len`` tokens (a
            document may span rows; only the last row of a pass is padded). ``"best_fit"``
            fills each row from a window of the next ``buffer_docs`` documents, taking the
            longest that still fits until none does: a document of at most ``seq_len`` tokens
            is never split.
        buffer_docs: the ``best_fit`` window.
        long_docs: documents longer than ``seq_len`` (BOS/EOS included): ``"split"`` into
            whole rows plus a last part packed like any document, ``"truncate"`` to their first
            ``seq_len`` tokens, ``"drop"``. ``concat`` splits anyway (``"split"``).
        bos_id, eos_id: token added before / after every document (``None``: none).
        pad_id: ``input_ids`` of padding.
        shift_labels: ``labels`` are next-token targets (``labels[t] = input_ids[t + 1]``,
            ``-100`` on each document's last token in the row and on padding); ``False``:
            ``labels`` are the input ids for a model that shifts itself (``-100`` on each
            document's first token in the row and on padding).

    In a :class:`Mixture`, give it to the mixture (``Mixture(pack=...)``: pack after mixing)
    or to every source (``ParquetStream(pack=...)`` per source: each packed row from one
    source, mixed by packed rows).

    Each packed item has ``input_ids``, ``labels``, ``position_ids`` (restarting at 0 for each
    document in the row), ``segment_ids`` (1, 2, ... per document in the row, 0 = padding),
    each ``[batch_size, seq_len]`` (``[seq_len]`` in row mode), ``cu_seqlens`` (int32 boundaries
    of the documents and padding runs of the flattened batch, for flash-attention's varlen
    kernels) and ``max_seqlen``.
    """

    column: str = "input_ids"
    seq_len: int = 2048
    algorithm: str = "concat"
    buffer_docs: int = 256
    long_docs: str = "split"
    bos_id: int | None = None
    eos_id: int | None = None
    pad_id: int = 0
    shift_labels: bool = True

    def __post_init__(self) -> None:
        if not isinstance(self.column, str):
            raise TypeError(f"Pack column must be a str, got {type(self.column).__name__}")
        for name in ("seq_len", "buffer_docs", "pad_id"):
            _int(getattr(self, name), name)
        for name in ("bos_id", "eos_id"):
            _int(getattr(self, name), name, none_ok=True)
        if self.algorithm not in ALGORITHMS:
            raise ValueError(f"Pack algorithm must be one of {ALGORITHMS}, got {self.algorithm!r}")
        if self.long_docs not in LONG_DOCS:
            raise ValueError(f"Pack long_docs must be one of {LONG_DOCS}, got {self.long_docs!r}")
        if not isinstance(self.shift_labels, bool):
            raise TypeError("Pack shift_labels must be a bool")
        for name in ("pad_id", "bos_id", "eos_id"):
            v = getattr(self, name)
            if v is not None and not -(2**63) <= v < 2**63:
                raise ValueError(f"Pack {name} must fit in int64, got {v}")
        if self.seq_len < 1 or self.buffer_docs < 1:
            raise ValueError(
                f"Pack seq_len and buffer_docs must be positive, got {self.seq_len}, "
                f"{self.buffer_docs}"
            )

    def check_schema(self, schema: pa.Schema) -> None:
        """Raise ``ValueError`` unless ``column`` is a read column of token lists."""
        if self.column not in schema.names:
            raise ValueError(
                f"Pack column {self.column!r} is not among the columns read "
                f"({', '.join(schema.names)}): add it to columns="
            )
        t = schema.field(self.column).type
        if not (
            (pa.types.is_list(t) or pa.types.is_large_list(t)) and pa.types.is_integer(t.value_type)
        ):
            raise ValueError(
                f"Pack column {self.column!r} must be a list of integers (token ids: int32, "
                f"int64, uint16, uint32, ...), got {t}"
            )

    def record(self) -> dict[str, Any]:
        """The settings as the core and a saved state spell them."""
        return dict(
            column=self.column,
            seq_len=self.seq_len,
            algorithm=self.algorithm,
            buffer_docs=self.buffer_docs,
            long_docs=self.long_docs,
            bos_id=self.bos_id,
            eos_id=self.eos_id,
            pad_id=self.pad_id,
            shift_labels=self.shift_labels,
        )


_COLUMNS = ("input_ids", "labels", "position_ids", "segment_ids")
# Packed in a Mixture (after mixing, or per source): each token's source (index into
# Mixture.source_names; -1 = padding).
_SOURCE_IDS = "source_ids"


def cu_seqlens(segment_ids: np.ndarray) -> np.ndarray:
    """int32 boundaries of the runs of equal segment ids of each row (documents and padding),
    over the rows flattened: ``[0, end of run 1, ..., rows * seq_len]``."""
    rows, seq_len = segment_ids.shape
    flat = segment_ids.reshape(-1)
    change = np.empty(flat.shape[0], dtype=bool)
    change[0] = True
    np.not_equal(flat[1:], flat[:-1], out=change[1:])
    change[::seq_len] = True  # every row starts a run
    starts = np.flatnonzero(change)
    out = np.empty(starts.shape[0] + 1, dtype=np.int32)
    out[:-1] = starts
    out[-1] = flat.shape[0]
    return out


def _one_shared_storage(torch: Any, d: dict[str, Any]) -> dict[str, Any]:
    """The batch's tensors as views of ONE shared-memory buffer (in a DataLoader worker).

    A worker hands each tensor storage to the main process as its own shared-memory segment
    (created, copied into, its descriptor passed and mapped again per storage): with the five
    or six outputs of a packed batch each in its own storage that was ~6 CPU-ms per batch,
    ten times the packing itself. One segment per batch halves it (benches/pack.py, loader
    section). The copy is the one the hand-over made anyway.
    """
    tensors = {k: v for k, v in d.items() if isinstance(v, torch.Tensor)}
    # each tensor starts on an 8-byte boundary so the uint8 buffer can be viewed as its dtype
    sizes = {k: -(-t.nbytes // 8) * 8 for k, t in tensors.items()}
    buf = torch.empty(sum(sizes.values()), dtype=torch.uint8).share_memory_()
    out = dict(d)
    offset = 0
    for k, t in tensors.items():
        view = buf[offset : offset + t.nbytes].view(t.dtype).view(t.shape)
        view.copy_(t)
        out[k] = view
        offset += sizes[k]
    return out


class PackConverter:
    """Packed rows (a RecordBatch of ``[seq_len]`` fixed-size lists) to the chosen output."""

    def __init__(self, output: str) -> None:
        self.output = output
        # batch() returns its argument: the iterator (``_core.RawIter``) then skips the call
        self.passthrough = output == "arrow"
        self._torch: Any = None
        if output == "torch":
            import torch
            import torch.utils.data

            self._torch = torch

    def _arrays(self, rb: pa.RecordBatch) -> dict[str, Any]:
        """The four columns as [rows, seq_len] views of the core's buffers (fixed-size lists
        without nulls: the values are the matrix), in the output's array type."""
        out: dict[str, Any] = {}
        names = _COLUMNS + ((_SOURCE_IDS,) if _SOURCE_IDS in rb.schema.names else ())
        for name in names:
            col = rb.column(name)
            shape = (len(col), col.type.list_size)
            if self._torch is not None:
                out[name] = self._torch.from_dlpack(col.values).view(shape)
            else:
                # a view of the buffer: Array.to_numpy() would import pandas (~0.5 s, once)
                out[name] = _numpy(col.values).reshape(shape)
        return out

    def _finish(self, d: dict[str, Any]) -> dict[str, Any]:
        seg = d["segment_ids"]
        cu = cu_seqlens(seg.numpy() if self._torch is not None else seg)
        d["max_seqlen"] = int(np.diff(cu).max())
        if self._torch is not None:
            d["cu_seqlens"] = self._torch.from_numpy(cu)
            if self._torch.utils.data.get_worker_info() is not None:
                d = _one_shared_storage(self._torch, d)
        elif self.output == "python":
            d = {k: v.tolist() for k, v in d.items() if k != "max_seqlen"} | {
                "cu_seqlens": cu.tolist(),
                "max_seqlen": d["max_seqlen"],
            }
        else:
            d["cu_seqlens"] = cu
        return d

    def batch(self, rb: pa.RecordBatch) -> Any:
        if self.output == "arrow":
            return rb
        return self._finish(self._arrays(rb))

    def rows(self, rb: pa.RecordBatch) -> Iterator[Any]:
        if self.output == "arrow":
            for i in range(rb.num_rows):
                yield rb.slice(i, 1)
            return
        arrays = self._arrays(rb)
        for i in range(rb.num_rows):
            # One [1, seq_len] row through the batch path, then its [seq_len] rows.
            d = self._finish({k: arrays[k][i : i + 1] for k in arrays})
            yield {k: (v[0] if k in arrays else v) for k, v in d.items()}
