"""Arrow columns -> Python values for ``output="python"``, equal to ``Array.to_pylist()``.

Why a module of its own: in row mode over a ``list<number>`` column (token ids) turning Arrow
into Python objects is nearly all of the time, and doing it the obvious way costs twice what
it must. What it does instead (every value, type and ``None`` exactly as ``to_pylist()``):

* Lazily: a column becomes an iterator, so a row's list is made when the row is yielded. Making
  a chunk's 1,024 lists up front kept them all alive in the cyclic GC's young generation, and
  each collection then walked every element of every list: 30-50% of the time.
* ``list<int/float/bool>`` (``list`` and ``large_list``): one numpy view of the flat values, and
  each row is ``values[start:end].tolist()`` (numpy makes the Python numbers in C). A null row
  is ``None``; with null *elements* the flat values are one ``to_pylist()`` list, sliced per row.
* Token ids (integers in ``0 .. 2**18 - 1``) are not even created: rows share the int objects of
  one process-wide table (built once, as large as the largest id seen needs: at most ~9 MiB).
  Ints are immutable, so sharing them is invisible; creating them was a third of the time.
* Numbers without nulls: numpy's ``tolist()`` (older pyarrow converts them one scalar at a
  time). Everything else - nulls in numbers, float16, strings, dictionaries, structs, maps,
  timestamps, decimals, extension types - is ``to_pylist()`` itself, so it cannot differ.
* numpy arrays come from the Arrow buffers (``np.frombuffer``), not ``Array.to_numpy()``: that
  imports pandas when it is installed, 0.3 s added to the first row.
"""

from __future__ import annotations

from collections.abc import Callable, Iterator, Sequence
from typing import Any

import numpy as np
import pyarrow as pa


def _is_fast_num(t: pa.DataType) -> bool:
    """Types whose numpy ``tolist()`` gives exactly pyarrow's Python values (not float16:
    older pyarrow returns ``np.float16`` scalars for it)."""
    return (
        pa.types.is_integer(t)
        or pa.types.is_boolean(t)
        or pa.types.is_float32(t)
        or pa.types.is_float64(t)
    )


def _numpy(arr: pa.Array) -> np.ndarray:
    """``arr`` (a fast-number type, no nulls) as numpy: a view of its buffer; booleans unpacked."""
    n, buf = len(arr), arr.buffers()[1]
    if pa.types.is_boolean(arr.type):
        if not n:
            return np.zeros(0, np.bool_)
        bits = np.unpackbits(np.frombuffer(buf, np.uint8), bitorder="little")
        return bits[arr.offset : arr.offset + n].view(np.bool_)
    dtype = np.dtype(arr.type.to_pandas_dtype())
    if not n:
        return np.zeros(0, dtype)
    return np.frombuffer(buf, dtype, count=n, offset=arr.offset * dtype.itemsize)


# Python ints 0..len-1 in an object array, grown by powers of two up to _SHARED_INTS_MAX
# (2**18 covers the vocabularies of current tokenizers; 36 bytes per entry).
_SHARED_INTS_MAX = 1 << 18
_shared_ints = np.zeros(0, dtype=object)


def _as_shared_ints(flat: np.ndarray) -> np.ndarray:
    """Non-negative integers below ``_SHARED_INTS_MAX`` (token ids) as an object array of shared
    Python ints (its ``tolist()`` then copies pointers); anything else unchanged."""
    global _shared_ints
    if flat.dtype.kind not in "iu" or not len(flat):
        return flat
    lo, hi = int(flat.min()), int(flat.max())
    if lo < 0 or hi >= _SHARED_INTS_MAX:
        return flat
    table = _shared_ints
    if hi >= len(table):
        table = _shared_ints = np.array(range(1 << hi.bit_length()), dtype=object)
    return table[flat]


def column_values(arr: pa.Array) -> Iterator[Any]:
    """The Python values of ``arr``, one per row, as an iterator (``list(...)`` of it equals
    ``arr.to_pylist()``)."""
    t = arr.type
    if _is_fast_num(t) and not arr.null_count:
        return iter(_numpy(arr).tolist())
    if (pa.types.is_list(t) or pa.types.is_large_list(t)) and _is_fast_num(t.value_type):
        return _list_values(arr)
    return iter(arr.to_pylist())


def _list_values(arr: pa.ListArray | pa.LargeListArray) -> Iterator[Any]:
    if not len(arr):
        return iter(())
    # .offsets is this array's window (the slice offset applied), .values the whole child.
    offsets = _numpy(arr.offsets)
    start, end = int(offsets[0]), int(offsets[-1])
    values = arr.values.slice(start, end - start)
    bounds = (offsets - start).tolist()
    cuts = map(slice, bounds[:-1], bounds[1:])
    parts: Iterator[Any]
    if values.null_count:
        flat = values.to_pylist()
        parts = map(flat.__getitem__, cuts)
    else:
        flat_np = _numpy(values)
        flat_np = _as_shared_ints(flat_np)
        parts = map(np.ndarray.tolist, map(flat_np.__getitem__, cuts))
    if arr.null_count:
        valid = _numpy(arr.is_valid()).tolist()
        return (p if ok else None for p, ok in zip(parts, valid, strict=True))
    return parts


_ROW_MAKERS: dict[int, Callable[..., Iterator[dict[str, Any]]]] = {}


def _row_maker(n: int) -> Callable[..., Iterator[dict[str, Any]]]:
    """The cached :func:`_build_row_maker` for ``n`` columns (a plain dict: ``lru_cache``
    would hide the signature from the stub checker)."""
    maker = _ROW_MAKERS.get(n)
    if maker is None:
        if len(_ROW_MAKERS) >= 64:
            _ROW_MAKERS.clear()
        maker = _ROW_MAKERS[n] = _build_row_maker(n)
    return maker


def _build_row_maker(n: int) -> Callable[..., Iterator[dict[str, Any]]]:
    """``maker(*names, *columns)``: a generator of ``{names[0]: next(columns[0]), ...}``.

    Generated source (as ``collections.namedtuple`` does) because a dict display is ~3x faster
    per row than ``dict(zip(names, values))``, which is most of the per-row cost of narrow rows.
    Only the column count goes into the source; the names are passed in as values.
    """
    keys = [f"k{i}" for i in range(n)]
    cols = [f"c{i}" for i in range(n)]
    vals = [f"v{i}" for i in range(n)]
    display = ", ".join(f"{k}: {v}" for k, v in zip(keys, vals, strict=True))
    loop = f"for {', '.join(vals)}, in zip({', '.join(cols)}, strict=True)"
    src = f"def maker({', '.join(keys + cols)}):\n    return ({{{display}}} {loop})\n"
    namespace: dict[str, Any] = {}
    exec(compile(src, f"<shardstream._rows: {n} columns>", "exec"), namespace)
    return namespace["maker"]


def rows(names: Sequence[str], columns: Sequence[pa.Array]) -> Iterator[dict[str, Any]]:
    """One ``dict`` per row (``{name: value}``), made as the iterator is advanced."""
    if not columns:
        return iter(())
    return _row_maker(len(columns))(*names, *map(column_values, columns))
