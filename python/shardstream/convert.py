"""Turning Arrow record batches from the core into what the user asked for (``output=``).

Numeric columns without nulls reach numpy and torch without copies (numpy views of the Arrow
buffer; ``torch.from_dlpack``). ``list<number>`` columns become a :class:`SplitList`: one 1-D
array/tensor per row, each a view into the flattened values (sliced by the Arrow offsets), that
crosses a DataLoader's worker pipe as that one values array plus offsets. With torch output a
batch is a :class:`Batch` (a ``dict``) whose small tensors cross that pipe inside the pickle.
Strings stay ``str``;
anything else (nulls in numeric columns, nested structs, ...) falls back to Python values.
``output="python"`` values are exactly ``to_pylist()``'s, made faster by ``_rows``.
"""

from __future__ import annotations

from collections.abc import Iterable
from typing import Any

import numpy as np
import pyarrow as pa

from . import _rows

__all__ = ["LIST_FORMATS", "OUTPUTS", "Batch", "Converter", "SplitList", "check_output"]

OUTPUTS = ("torch", "numpy", "python", "arrow")
# How batch mode returns list<number> columns with numpy/torch output.
LIST_FORMATS = ("split", "offsets", "padded", "nested")

_NUM, _LIST_NUM, _OTHER, _STR = 0, 1, 2, 3


def _is_num(t: pa.DataType) -> bool:
    return pa.types.is_integer(t) or pa.types.is_floating(t) or pa.types.is_boolean(t)


def _kind(t: pa.DataType) -> int:
    if _is_num(t):
        return _NUM
    if (pa.types.is_list(t) or pa.types.is_large_list(t)) and _is_num(t.value_type):
        return _LIST_NUM
    if pa.types.is_string(t) or pa.types.is_large_string(t):
        return _STR
    return _OTHER


class SplitList(list):  # type: ignore[type-arg]
    """A ``list`` column of a batch (``list_format="split"``): a plain ``list`` whose items are
    1-D ``torch.Tensor``s (``output="torch"``) or ``numpy.ndarray``s (``output="numpy"``), one
    per row, each a view into one flat values array; ``None`` for a null row.

    It is a real ``list`` (indexing, iteration, ``len()``, ``torch.stack``/``cat``,
    ``torch.nn.utils.rnn.pad_sequence`` work as on any list), with two differences, both about
    moving it: pickled (e.g. from a DataLoader worker to the main process) it travels as the
    values array plus the offsets and is rebuilt there as views, instead of one tensor per row;
    and ``pin_memory()`` (called by a ``DataLoader(pin_memory=True)``) pins the values once and
    returns views of the pinned copy. Once the list itself is changed (items set, added, removed
    or reordered) it is pickled and pinned item by item like any list.
    """

    __slots__ = ("_offsets", "_valid", "_values")
    _values: Any  # the flat values (tensor or array); None once the list has changed
    _offsets: Any  # int64 numpy offsets from 0, one more than rows
    _valid: Any  # numpy bool per row, or None: no null rows

    @classmethod
    def _from_parts(cls, values: Any, offsets: np.ndarray, valid: np.ndarray | None) -> SplitList:
        """Views of ``values`` cut at ``offsets`` (int64, from 0); ``None`` where not ``valid``."""
        n = len(offsets) - 1
        if n == 0:
            parts: Any = []
        elif isinstance(values, np.ndarray):
            # A slice per row: ~150 ns a row, against ~700 for np.split (a Python loop that
            # also swaps axes twice a row; docs/benchmarks.md, "SplitList's row views").
            o = offsets.tolist()
            parts = [values[a:b] for a, b in zip(o[:-1], o[1:], strict=True)]
        else:
            # torch.split by lengths: ~350-520 ns a row against ~630 for tensor_split at the
            # offsets. It needs lengths that add up to the values, which they do here (the
            # values are cut to the offsets' span); a slice of the values first cost more
            # (~6 us a batch) than the split saves at 32 rows.
            if len(values) == offsets[-1]:
                parts = values.split(np.diff(offsets).tolist())
            else:
                parts = values.tensor_split(offsets[1:-1].tolist())
        out = cls(parts)
        if valid is not None:
            for i in np.flatnonzero(~valid).tolist():
                list.__setitem__(out, i, None)
        out._values, out._offsets, out._valid = values, offsets, valid
        return out

    def _compact(self) -> bool:
        return getattr(self, "_values", None) is not None

    def _changed(self) -> None:
        self._values = self._offsets = self._valid = None

    def __reduce_ex__(self, protocol: Any) -> Any:
        if not self._compact():
            return (SplitList, (list(self),))
        values = self._values
        if not isinstance(values, np.ndarray) and values.nbytes <= _INLINE_BYTES:
            # Small values travel inside the pickle: a DataLoader would otherwise move them to
            # shared memory and pass its file descriptor through a socket, which costs more.
            return (_rebuild_split, (values.numpy(), self._offsets, self._valid, True))
        return (_rebuild_split, (values, self._offsets, self._valid))

    def __copy__(self) -> SplitList:
        out = SplitList(self)
        if self._compact():
            out._values, out._offsets, out._valid = self._values, self._offsets, self._valid
        return out

    def pin_memory(self, device: Any = None) -> SplitList:
        if self._compact() and not isinstance(self._values, np.ndarray):
            return SplitList._from_parts(self._values.pin_memory(), self._offsets, self._valid)
        return SplitList(None if x is None else x.pin_memory() for x in self)

    # Any change to the list itself: from then on it is an ordinary list of its items.
    def __setitem__(self, i: Any, v: Any) -> None:
        if not (isinstance(i, int) and self._compact() and list.__getitem__(self, i) is v):
            self._changed()  # setting an item to itself (DataLoader's default_convert) is no change
        list.__setitem__(self, i, v)

    def __delitem__(self, i: Any) -> None:
        self._changed()
        list.__delitem__(self, i)

    def __iadd__(self, other: Any) -> SplitList:  # type: ignore[override,misc]
        self._changed()
        return list.__iadd__(self, other)  # type: ignore[return-value]

    def __imul__(self, n: Any) -> SplitList:  # type: ignore[override,misc]
        self._changed()
        return list.__imul__(self, n)  # type: ignore[return-value]

    def append(self, v: Any) -> None:
        self._changed()
        list.append(self, v)

    def extend(self, v: Any) -> None:
        self._changed()
        list.extend(self, v)

    def insert(self, i: Any, v: Any) -> None:
        self._changed()
        list.insert(self, i, v)

    def pop(self, i: Any = -1) -> Any:
        self._changed()
        return list.pop(self, i)

    def remove(self, v: Any) -> None:
        self._changed()
        list.remove(self, v)

    def clear(self) -> None:
        self._changed()
        list.clear(self)

    def reverse(self) -> None:
        self._changed()
        list.reverse(self)

    def sort(self, *args: Any, **kwargs: Any) -> None:
        self._changed()
        list.sort(self, *args, **kwargs)


def _rebuild_split(
    values: Any, offsets: np.ndarray, valid: np.ndarray | None, tensor: bool = False
) -> SplitList:
    if tensor:
        import torch

        values = torch.from_numpy(values)
    return SplitList._from_parts(values, offsets, valid)


_INLINE_BYTES = 1 << 16


class Batch(dict):  # type: ignore[type-arg]
    """A batch with ``output="torch"``: a plain ``dict`` of column -> value, with one difference,
    about moving it between processes. Sent through a ``multiprocessing`` pipe (a DataLoader
    worker's result queue), each of its CPU tensors of at most 64 KiB (and those in a tuple or
    list value, e.g. ``list_format="offsets"``'s pair, or a ``"nested"`` column's offsets)
    travels inside the pickle and is rebuilt as a tensor of the same dtype, shape and values,
    instead of being moved to a shared-memory segment whose file descriptor is then passed over
    a socket: that costs ~1 ms of CPU per tensor between the worker and the main process, most
    of a small batch's transfer. Larger tensors take torch's shared-memory path as before; a
    2-D jagged nested tensor travels as its values and offsets and is rebuilt from them. Other
    picklers (``pickle``, ``torch.save``) are unaffected.
    """

    __slots__ = ()

    def __copy__(self) -> Batch:
        # DataLoader's default_convert and pin_memory copy the mapping, then update it
        return Batch(self)


class _Inline:
    """A small tensor pickled as its numpy array (bytes inside the pickle), unpickled as a
    tensor again."""

    __slots__ = ("array",)

    def __init__(self, array: np.ndarray) -> None:
        self.array = array

    def __reduce__(self) -> Any:
        return (_tensor_from_numpy, (self.array,))


def _tensor_from_numpy(array: np.ndarray) -> Any:
    import torch

    return torch.from_numpy(array)


class _Nested:
    """A jagged nested tensor (``list_format="nested"``) pickled as its values and offsets, each
    as :func:`_inline` sends a tensor (the offsets, small, inside the pickle), and rebuilt from
    them: torch's own pickling of it sends every component through shared memory."""

    __slots__ = ("offsets", "values")

    def __init__(self, values: Any, offsets: Any) -> None:
        self.values, self.offsets = values, offsets

    def __reduce__(self) -> Any:
        return (_nested_from_jagged, (self.values, self.offsets))


def _nested_from_jagged(values: Any, offsets: Any) -> Any:
    import torch

    return torch.nested.nested_tensor_from_jagged(values, offsets)


def _inline(v: Any, torch: Any) -> Any:
    """``v`` with its small plain CPU tensors (top level, or in a plain tuple/list) wrapped to
    travel inside the pickle, and a 2-D jagged nested tensor as its values and offsets (rebuilt
    as it was made: ``nested_tensor_from_jagged``); anything else as it is."""
    t = type(v)
    if (
        t is not torch.Tensor
        and isinstance(v, torch.Tensor)
        and v.is_nested
        and v.layout is torch.jagged
        and v.dim() == 2
        and v.device.type == "cpu"
        and not v.requires_grad
        and v.lengths() is None
    ):
        return _Nested(_inline(v.values(), torch), _inline(v.offsets(), torch))
    if t is torch.Tensor:
        if (
            v.device.type == "cpu"
            and v.layout is torch.strided
            and not v.requires_grad
            and v.is_contiguous()
            and v.nbytes <= _INLINE_BYTES
            and v.dtype in _NUMPY_DTYPES
        ):
            return _Inline(v.numpy())
        return v
    if t is tuple or t is list:
        return t(_inline(x, torch) for x in v)
    return v


_NUMPY_DTYPES: set[Any] = set()


def _reduce_batch_for_pipe(b: Batch) -> Any:
    import torch

    return (Batch, ({k: _inline(v, torch) for k, v in b.items()},))


def _register_pipe_reducer() -> None:
    """Make multiprocessing's pickler (DataLoader workers' queues) send ``Batch`` with its small
    tensors inline; other picklers are unaffected."""
    if _NUMPY_DTYPES:
        return
    from multiprocessing.reduction import ForkingPickler

    import torch

    _NUMPY_DTYPES.update(
        (torch.bool, torch.uint8, torch.int8, torch.int16, torch.int32, torch.int64)
        + (torch.float16, torch.float32, torch.float64)
    )
    ForkingPickler.register(Batch, _reduce_batch_for_pipe)


def check_output(output: str, list_format: str) -> None:
    """A clear ``ValueError`` for an unknown ``output`` or ``list_format`` or a pair that does
    not go together. Datasets call it when they are made; it imports nothing, so a dataset
    whose own output is never used (a Mixture's source, whose default output is "torch") does
    not import torch: a :class:`Converter` for torch output does, when one is made to iterate.
    """
    if output not in OUTPUTS:
        raise ValueError(f"output must be one of {OUTPUTS}, got {output!r}")
    if list_format not in LIST_FORMATS:
        raise ValueError(f"list_format must be one of {LIST_FORMATS}, got {list_format!r}")
    if list_format == "nested" and output != "torch":
        raise ValueError('list_format="nested" needs output="torch"')


class Converter:
    """Converts batches of one schema to one output kind.

    ``list_format`` (batch mode, numpy/torch, list<number> columns without nulls):
    ``"split"`` one 1-D array/tensor per row (views); ``"offsets"`` a ``(values, offsets)``
    pair (zero-copy values, ``len+1`` int64 offsets from 0); ``"padded"`` a ``(padded, lengths)``
    pair, rows right-padded with 0 to the longest row; ``"nested"`` a jagged
    ``torch.nested`` tensor (torch only).
    """

    def __init__(self, output: str, schema: pa.Schema, list_format: str = "split") -> None:
        check_output(output, list_format)
        self.output = output
        # batch() returns its argument: the iterator (``_core.RawIter``) then skips the call
        self.passthrough = output == "arrow"
        self.list_format = list_format
        self.names = list(schema.names)
        self.kinds = [_kind(f.type) for f in schema]
        self._torch: Any = None
        if output == "torch":
            import torch

            self._torch = torch
            _register_pipe_reducer()

    # -- per column -------------------------------------------------------------------------
    # numpy arrays are views of the Arrow buffers (`_rows._numpy`), not `Array.to_numpy()`:
    # that imports pandas on its first call (0.3-0.5 s and ~50 MB in every process and
    # DataLoader worker, on the first batch: a resume's first batch included).
    def _num(self, arr: pa.Array) -> Any:
        if pa.types.is_boolean(arr.type):
            np_arr = _rows._numpy(arr)  # bit-packed: one copy is unavoidable
            return self._torch.from_numpy(np_arr) if self._torch else np_arr
        if self._torch is not None:
            return self._torch.from_dlpack(arr)
        return _rows._numpy(arr)

    def _list_num(self, arr: pa.Array, fmt: str = "split") -> Any:
        # Slice the child by the offsets (not ``flatten()``, which drops the values a null row
        # may still point at and would shift every later row).
        offsets = _rows._numpy(arr.offsets)
        values = arr.values.slice(int(offsets[0]), int(offsets[-1] - offsets[0]))
        if values.null_count:
            return arr.to_pylist()
        offsets = offsets - offsets[0]
        flat = self._num(values) if len(values) else None
        if flat is None:
            empty = np.empty(0, dtype=values.type.to_pandas_dtype())
            flat = self._torch.from_numpy(empty) if self._torch else empty
        offsets = offsets.astype(np.int64, copy=False)
        if fmt != "split" and not arr.null_count:
            return self._list_joined(flat, offsets, fmt)
        valid = _rows._numpy(arr.is_valid()) if arr.null_count else None
        return SplitList._from_parts(flat, offsets, valid)

    def _list_joined(self, flat: Any, offsets: np.ndarray, fmt: str) -> Any:
        """``offsets`` / ``padded`` / ``nested`` forms of a list column (no null rows)."""
        lengths = np.diff(offsets)
        t = self._torch
        if fmt == "offsets":
            return (flat, t.from_numpy(offsets) if t else offsets)
        if fmt == "nested":
            return t.nested.nested_tensor_from_jagged(flat, t.from_numpy(offsets))
        width = int(lengths.max()) if len(lengths) else 0
        values = flat.numpy() if t is not None else flat
        padded = np.zeros((len(lengths), width), dtype=values.dtype)
        # The cells left of each row's length, in row-major order, are exactly the values.
        padded[np.arange(width) < lengths[:, None]] = values
        if t is not None:
            return (t.from_numpy(padded), t.from_numpy(lengths))
        return (padded, lengths)

    def _column(self, arr: pa.Array, kind: int, fmt: str = "split") -> Any:
        if kind == _NUM and not arr.null_count:
            return self._num(arr)
        if kind == _LIST_NUM:
            return self._list_num(arr, fmt)
        if kind == _STR:
            # The same list of str/None as to_pylist(), made in C through numpy: ~30% less CPU
            # per batch (this one does import pandas, once: strings only).
            return arr.to_numpy(zero_copy_only=False).tolist()
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
        out = {
            n: self._column(c, k, fmt)
            for n, c, k in zip(self.names, rb.columns, self.kinds, strict=True)
        }
        return Batch(out) if self._torch is not None else out

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
        # The values under the nulls are whatever the buffer holds; each is replaced by None.
        # (Not `fill_null`: its `pa.scalar` imports pandas.)
        raw = np.array(_rows._numpy(arr))  # a writable copy: torch refuses read-only arrays
        vals = list(self._torch.from_numpy(raw).unbind(0)) if self._torch is not None else list(raw)
        return [x if ok else None for x, ok in zip(vals, arr.is_valid().to_pylist(), strict=True)]
