"""Turning Arrow record batches from the core into what the user asked for (``output=``).

Numeric columns without nulls reach numpy and torch without copies (numpy views of the Arrow
buffer; ``torch.from_dlpack``). ``list<number>`` columns become one 1-D array/tensor per row,
each a view into the flattened values (sliced by the Arrow offsets). Strings stay ``str``;
anything else (nulls in numeric columns, nested structs, ...) falls back to Python values.
``output="python"`` values are exactly ``to_pylist()``'s, made faster by ``_rows``.
"""

from __future__ import annotations

from collections.abc import Iterable
from typing import Any

import numpy as np
import pyarrow as pa

from . import _rows

OUTPUTS = ("torch", "numpy", "python", "arrow")
# How batch mode returns list<number> columns with numpy/torch output.
LIST_FORMATS = ("split", "offsets", "padded", "nested")

_NUM, _LIST_NUM, _OTHER = 0, 1, 2


def _is_num(t: pa.DataType) -> bool:
    return pa.types.is_integer(t) or pa.types.is_floating(t) or pa.types.is_boolean(t)


def _kind(t: pa.DataType) -> int:
    if _is_num(t):
        return _NUM
    if (pa.types.is_list(t) or pa.types.is_large_list(t)) and _is_num(t.value_type):
        return _LIST_NUM
    return _OTHER


class Converter:
    """Converts batches of one schema to one output kind.

    ``list_format`` (batch mode, numpy/torch, list<number> columns without nulls):
    ``"split"`` one 1-D array/tensor per row (views); ``"offsets"`` a ``(values, offsets)``
    pair (zero-copy values, ``len+1`` int64 offsets from 0); ``"padded"`` a ``(padded, lengths)``
    pair, rows right-padded with 0 to the longest row; ``"nested"`` a jagged
    ``torch.nested`` tensor (torch only).
    """

    def __init__(self, output: str, schema: pa.Schema, list_format: str = "split") -> None:
        if output not in OUTPUTS:
            raise ValueError(f"output must be one of {OUTPUTS}, got {output!r}")
        if list_format not in LIST_FORMATS:
            raise ValueError(f"list_format must be one of {LIST_FORMATS}, got {list_format!r}")
        if list_format == "nested" and output != "torch":
            raise ValueError('list_format="nested" needs output="torch"')
        self.output = output
        self.list_format = list_format
        self.names = list(schema.names)
        self.kinds = [_kind(f.type) for f in schema]
        self._torch: Any = None
        if output == "torch":
            import torch

            self._torch = torch

    # -- per column -------------------------------------------------------------------------
    def _num(self, arr: pa.Array) -> Any:
        if pa.types.is_boolean(arr.type):
            np_arr = arr.to_numpy(zero_copy_only=False)  # bit-packed: one copy is unavoidable
            return self._torch.from_numpy(np_arr) if self._torch else np_arr
        if self._torch is not None:
            return self._torch.from_dlpack(arr)
        return arr.to_numpy(zero_copy_only=True)

    def _list_num(self, arr: pa.Array, fmt: str = "split") -> Any:
        # Slice the child by the offsets (not ``flatten()``, which drops the values a null row
        # may still point at and would shift every later row).
        offsets = arr.offsets.to_numpy()
        values = arr.values.slice(int(offsets[0]), int(offsets[-1] - offsets[0]))
        if values.null_count:
            return arr.to_pylist()
        offsets = offsets - offsets[0]
        flat = self._num(values) if len(values) else None
        if flat is None:
            empty = np.empty(0, dtype=values.type.to_pandas_dtype())
            flat = self._torch.from_numpy(empty) if self._torch else empty
        if fmt != "split" and not arr.null_count:
            return self._list_joined(flat, offsets.astype(np.int64), fmt)
        if self._torch is not None:
            parts = list(self._torch.split(flat, np.diff(offsets).tolist()))
        else:
            parts = np.split(flat, offsets[1:-1])
        if arr.null_count:
            valid = arr.is_valid().to_pylist()
            parts = [p if ok else None for p, ok in zip(parts, valid, strict=True)]
        return parts

    def _list_joined(self, flat: Any, offsets: np.ndarray, fmt: str) -> Any:
        """``offsets`` / ``padded`` / ``nested`` forms of a list column (no null rows)."""
        lengths = np.diff(offsets)
        t = self._torch
        if fmt == "offsets":
            return (flat, t.from_numpy(offsets) if t else offsets)
        if fmt == "nested":
            return t.nested.nested_tensor_from_jagged(flat, t.from_numpy(offsets))
        width = int(lengths.max()) if len(lengths) else 0
        rows = np.repeat(np.arange(len(lengths)), lengths)
        cols = np.arange(len(rows)) - np.repeat(offsets[:-1], lengths)
        if t is not None:
            padded = t.zeros((len(lengths), width), dtype=flat.dtype)
            padded[t.from_numpy(rows), t.from_numpy(cols)] = flat
            return (padded, t.from_numpy(lengths))
        padded = np.zeros((len(lengths), width), dtype=flat.dtype)
        padded[rows, cols] = flat
        return (padded, lengths)

    def _column(self, arr: pa.Array, kind: int, fmt: str = "split") -> Any:
        if kind == _NUM and not arr.null_count:
            return self._num(arr)
        if kind == _LIST_NUM:
            return self._list_num(arr, fmt)
        return arr.to_pylist()

    # -- whole batches ----------------------------------------------------------------------
    def batch(self, rb: pa.RecordBatch) -> Any:
        if self.output == "arrow":
            return rb
        if self.output == "python":
            return {
                n: list(_rows.column_values(c)) for n, c in zip(self.names, rb.columns, strict=True)
            }
        fmt = self.list_format
        return {
            n: self._column(c, k, fmt)
            for n, c, k in zip(self.names, rb.columns, self.kinds, strict=True)
        }

    def rows(self, rb: pa.RecordBatch) -> Iterable[Any]:
        """The rows of ``rb``, ``rb.num_rows`` of them; python output makes each on ``next()``."""
        if self.output == "arrow":
            return [rb.slice(i, 1) for i in range(rb.num_rows)]
        if self.output == "python":
            return _rows.rows(self.names, rb.columns)
        cols = [
            self._num_rows(c) if k == _NUM else self._column(c, k)
            for c, k in zip(rb.columns, self.kinds, strict=True)
        ]
        names = self.names
        return [dict(zip(names, vals, strict=True)) for vals in zip(*cols, strict=True)]

    def _num_rows(self, arr: pa.Array) -> list[Any]:
        """One numpy scalar / 0-d tensor per row; ``None`` where the value is null."""
        if not arr.null_count:
            v = self._num(arr)
            return list(v.unbind(0)) if self._torch is not None else list(v)
        filled = arr.fill_null(False if pa.types.is_boolean(arr.type) else 0)
        vals = self._num_rows(filled)
        return [x if ok else None for x, ok in zip(vals, arr.is_valid().to_pylist(), strict=True)]
