"""Edge-case Parquet corpus, written with pyarrow (used by test_reliability_corpus and the fuzzer).

Every case is a :class:`Case`: a deterministic table and how to write it (encodings,
compressions, data page v1/v2, page sizes, statistics, page index, zero-row row groups, ...).
``build_corpus(dir)`` writes every case once and returns ``{name: path}``.

The tables deliberately mix nulls, empty and null lists, empty strings, non-ASCII text,
negative and extreme integers, all-null pages and nested nulls, and are small (a few hundred
rows) so the whole corpus is written and read back in a few seconds.
"""

from __future__ import annotations

import decimal
import math
import os
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

import numpy as np
import pyarrow as pa
import pyarrow.parquet as pq

N = 240  # rows of most tables (several pages and row groups with the small settings below)


@dataclass(frozen=True)
class Case:
    name: str
    table: Callable[[], pa.Table]
    write: dict[str, Any] = field(default_factory=dict)
    # Custom writer (zero-row row groups, empty files): (table, path, write kwargs) -> None.
    writer: Callable[[pa.Table, str, dict[str, Any]], None] | None = None


# --------------------------------------------------------------------------- value makers


def _rng(seed: int) -> np.random.Generator:
    return np.random.default_rng(seed)


def _mask(rng: np.random.Generator, n: int, p: float) -> np.ndarray:
    m = rng.random(n) < p
    return m


def _with_nulls(values: list, rng: np.random.Generator, p: float = 0.15) -> list:
    m = _mask(rng, len(values), p)
    # a run of nulls long enough to fill whole tiny pages
    if len(values) > 60:
        m[40:60] = True
    return [None if x else v for v, x in zip(values, m, strict=True)]


WORDS = ["", "a", "héllo", "naïve", "日本語", "emoji-🙂", "x" * 300, "tab\tnl\n", "zz"]


def _strings(rng: np.random.Generator, n: int) -> list[str]:
    return [WORDS[int(i)] + str(j) for j, i in enumerate(rng.integers(0, len(WORDS), n))]


def _int_col(rng: np.random.Generator, n: int, t: pa.DataType) -> pa.Array:
    info = np.iinfo(t.to_pandas_dtype())
    v = rng.integers(info.min, info.max, n, dtype=t.to_pandas_dtype(), endpoint=True)
    v[:4] = [info.min, info.max, 0, 1] if info.min < 0 else [0, info.max, 1, 2]
    return pa.array(_with_nulls(v.tolist(), rng), t)


def _float_col(rng: np.random.Generator, n: int, t: pa.DataType) -> pa.Array:
    v = (rng.standard_normal(n) * 1e3).astype(t.to_pandas_dtype())
    specials = [0.0, -0.0, np.inf, -np.inf, np.nan, 1e-30 if t != pa.float16() else 1e-4]
    v[: len(specials)] = specials
    return pa.array(_with_nulls(v.tolist(), rng), t)


def scalar_table(n: int = N, seed: int = 0) -> pa.Table:
    """Every flat type pyarrow writes to Parquet, nullable, with extreme values."""
    rng = _rng(seed)
    cols: dict[str, pa.Array] = {"row": pa.array(range(n), pa.int64())}
    for t in (
        pa.int8(),
        pa.int16(),
        pa.int32(),
        pa.int64(),
        pa.uint8(),
        pa.uint16(),
        pa.uint32(),
        pa.uint64(),
    ):
        cols[str(t)] = _int_col(rng, n, t)
    for name, t in (
        ("float16", pa.float16()),
        ("float32", pa.float32()),
        ("float64", pa.float64()),
    ):
        cols[name] = _float_col(rng, n, t)
    cols["bool"] = pa.array(_with_nulls((rng.random(n) < 0.3).tolist(), rng), pa.bool_())
    s = _strings(rng, n)
    cols["string"] = pa.array(_with_nulls(s, rng), pa.string())
    cols["large_string"] = pa.array(_with_nulls(s[::-1], rng), pa.large_string())
    cols["binary"] = pa.array(_with_nulls([x.encode() + b"\x00\xff" for x in s], rng), pa.binary())
    cols["large_binary"] = pa.array(_with_nulls([x.encode() for x in s], rng), pa.large_binary())
    cols["fixed_size_binary"] = pa.array(
        _with_nulls([rng.bytes(16) for _ in range(n)], rng), pa.binary(16)
    )
    q = decimal.Decimal
    cols["decimal_9_2"] = pa.array(
        _with_nulls([q(int(x)).scaleb(-2) for x in rng.integers(-(10**9) + 1, 10**9, n)], rng),
        pa.decimal128(9, 2),
    )
    cols["decimal_18_4"] = pa.array(
        _with_nulls([q(int(x)).scaleb(-4) for x in rng.integers(-(10**18) + 1, 10**18, n)], rng),
        pa.decimal128(18, 4),
    )
    cols["decimal_38_10"] = pa.array(
        _with_nulls(
            [
                q(int(x) * 10**20 + i).scaleb(-10)
                for i, x in enumerate(rng.integers(-(10**17), 10**17, n))
            ],
            rng,
        ),
        pa.decimal128(38, 10),
    )
    cols["decimal256_60_3"] = pa.array(
        _with_nulls(
            [
                q(int(x) * 10**40 - i).scaleb(-3)
                for i, x in enumerate(rng.integers(-(10**18), 10**18, n))
            ],
            rng,
        ),
        pa.decimal256(60, 3),
    )
    days = rng.integers(-40000, 40000, n)
    cols["date32"] = pa.array(_with_nulls(days.tolist(), rng), pa.int32()).cast(pa.date32())
    cols["date64"] = pa.array(_with_nulls((days * 86_400_000).tolist(), rng), pa.int64()).cast(
        pa.date64()
    )
    ms = rng.integers(0, 86_400_000, n)
    cols["time32_ms"] = pa.array(_with_nulls(ms.tolist(), rng), pa.int32()).cast(pa.time32("ms"))
    cols["time64_us"] = pa.array(_with_nulls((ms * 1000 + 7).tolist(), rng), pa.int64()).cast(
        pa.time64("us")
    )
    cols["time64_ns"] = pa.array(_with_nulls((ms * 10**6 + 9).tolist(), rng), pa.int64()).cast(
        pa.time64("ns")
    )
    # seconds within datetime's range (years 1 .. 9999), scaled to each unit
    secs = rng.integers(-(2**35), 2**37, n)
    scale = {"s": 1, "ms": 10**3, "us": 10**6, "ns": 10**9}
    for unit in ("s", "ms", "us", "ns"):
        v = secs // 1000 if unit == "ns" else secs  # ns: int64 holds only +-292 years
        v = v * scale[unit] + (rng.integers(0, scale[unit], n) if unit != "s" else 0)
        cols[f"ts_{unit}"] = pa.array(_with_nulls(v.tolist(), rng), pa.int64()).cast(
            pa.timestamp(unit)
        )
    ts = (secs // 1000) * 10**6
    cols["ts_us_utc"] = pa.array(_with_nulls(ts.tolist(), rng), pa.int64()).cast(
        pa.timestamp("us", tz="UTC")
    )
    cols["ts_ms_berlin"] = pa.array(_with_nulls(ts.tolist(), rng), pa.int64()).cast(
        pa.timestamp("ms", tz="Europe/Berlin")
    )
    cols["duration_ns"] = pa.array(_with_nulls(ts.tolist(), rng), pa.int64()).cast(
        pa.duration("ns")
    )
    return pa.table(cols)


def required_table(n: int = N, seed: int = 1) -> pa.Table:
    """Non-nullable (REQUIRED) columns, including a required list of required ints."""
    rng = _rng(seed)
    fields = [
        pa.field("row", pa.int64(), nullable=False),
        pa.field("i32", pa.int32(), nullable=False),
        pa.field("f64", pa.float64(), nullable=False),
        pa.field("s", pa.string(), nullable=False),
        pa.field("b", pa.bool_(), nullable=False),
        pa.field("l", pa.list_(pa.field("item", pa.int32(), nullable=False)), nullable=False),
    ]
    lens = rng.integers(0, 5, n)
    data = [
        pa.array(range(n), pa.int64()),
        pa.array(rng.integers(-100, 100, n), pa.int32()),
        pa.array(rng.standard_normal(n)),
        pa.array(_strings(rng, n)),
        pa.array((rng.random(n) < 0.5).tolist()),
        pa.array([list(range(int(k))) for k in lens], fields[5].type),
    ]
    return pa.Table.from_arrays(data, schema=pa.schema(fields))


def _lists(rng: np.random.Generator, n: int, make: Callable[[int], Any], max_len: int = 6) -> list:
    out: list = []
    for i in range(n):
        r = rng.random()
        if r < 0.1:
            out.append(None)
        elif r < 0.2:
            out.append([])
        else:
            out.append([make(i * 31 + k) for k in range(int(rng.integers(1, max_len)))])
    return out


def nested_table(n: int = N, seed: int = 2) -> pa.Table:
    """list, large_list, fixed_size_list, list<list>, list<struct>, struct<list>, map,
    nested nulls at every level."""
    rng = _rng(seed)

    def maybe(v: Any, k: int) -> Any:
        return None if k % 7 == 3 else v

    cols: dict[str, pa.Array] = {"row": pa.array(range(n), pa.int64())}
    cols["list_int32"] = pa.array(
        _lists(rng, n, lambda k: maybe(k % 1000, k)), pa.list_(pa.int32())
    )
    cols["large_list_int64"] = pa.array(
        _lists(rng, n, lambda k: k * 2**33), pa.large_list(pa.int64())
    )
    cols["fixed_size_list_f32"] = pa.array(
        _with_nulls([[float(i), float(-i), i / 3] for i in range(n)], rng),
        pa.list_(pa.float32(), 3),
    )
    cols["list_list_int16"] = pa.array(
        _lists(rng, n, lambda k: None if k % 5 == 0 else [k % 100] * (k % 3)),
        pa.list_(pa.list_(pa.int16())),
    )
    cols["list_string"] = pa.array(
        _lists(rng, n, lambda k: maybe(WORDS[k % len(WORDS)], k)), pa.list_(pa.string())
    )
    st = pa.struct([("a", pa.int32()), ("b", pa.string()), ("c", pa.list_(pa.float64()))])
    cols["list_struct"] = pa.array(
        _lists(
            rng,
            n,
            lambda k: maybe({"a": maybe(k, k + 1), "b": WORDS[k % 9], "c": [k / 2] * (k % 3)}, k),
        ),
        pa.list_(st),
    )
    cols["struct"] = pa.array(
        _with_nulls(
            [
                {
                    "x": maybe(i * 3, i),
                    "y": [str(i)] * (i % 3),
                    "z": {"deep": None if i % 4 == 0 else float(i)},
                }
                for i in range(n)
            ],
            rng,
        ),
        pa.struct(
            [
                ("x", pa.int64()),
                ("y", pa.list_(pa.string())),
                ("z", pa.struct([("deep", pa.float64())])),
            ]
        ),
    )
    cols["map_string_int32"] = pa.array(
        _with_nulls(
            [
                [(f"k{j}", None if (i + j) % 5 == 0 else i + j) for j in range(i % 4)]
                for i in range(n)
            ],
            rng,
        ),
        pa.map_(pa.string(), pa.int32()),
    )
    cols["map_int_list"] = pa.array(
        _with_nulls([[(j, [i % 100] * j) for j in range(i % 3)] for i in range(n)], rng),
        pa.map_(pa.int64(), pa.list_(pa.int8())),
    )
    cols["struct_all_null"] = pa.array([None] * n, pa.struct([("q", pa.int32())]))
    return pa.table(cols)


def dictionary_table(n: int = N, seed: int = 3) -> pa.Table:
    rng = _rng(seed)
    cats = ["alpha", "beta", "", "δέλτα", None]
    idx = rng.integers(0, len(cats), n)
    s = pa.array([cats[int(i)] for i in idx], pa.string())
    return pa.table(
        {
            "row": pa.array(range(n), pa.int64()),
            "dict_int32_string": s.dictionary_encode(),
            "dict_int8_string": pa.DictionaryArray.from_arrays(
                pa.array(idx.astype(np.int8)), pa.array(["a", "b", "c", "d", "e"])
            ),
            "dict_large_string": s.cast(pa.large_string()).dictionary_encode(),
            "dict_binary": s.cast(pa.binary()).dictionary_encode(),
            "dict_int64_values": pa.array(
                _with_nulls((idx * 1000).tolist(), rng)
            ).dictionary_encode(),
            # many distinct values: the dictionary page overflows and the writer falls back to plain
            "high_cardinality": pa.array([f"v{i * 7919 % 100003}" for i in range(n)]),
        }
    )


def misc_types_table(n: int = N, seed: int = 4) -> pa.Table:
    """Types with special Parquet mappings: null type, view types, uuid/json extension types."""
    rng = _rng(seed)
    s = _strings(rng, n)
    cols: dict[str, pa.Array] = {
        "row": pa.array(range(n), pa.int64()),
        "null_type": pa.nulls(n),
        "string_view": pa.array(_with_nulls(s, rng), pa.string_view()),
        "binary_view": pa.array(_with_nulls([x.encode() for x in s], rng), pa.binary_view()),
    }
    if hasattr(pa, "uuid"):
        cols["uuid"] = pa.ExtensionArray.from_storage(
            pa.uuid(), pa.array(_with_nulls([rng.bytes(16) for _ in range(n)], rng), pa.binary(16))
        )
    if hasattr(pa, "json_"):
        cols["json"] = pa.array(_with_nulls([f'{{"k": {i}}}' for i in range(n)], rng), pa.json_())
    return pa.table(cols)


def int96_table(n: int = N, seed: int = 5) -> pa.Table:
    rng = _rng(seed)
    ts = rng.integers(-(2**50), 2**50, n)
    return pa.table(
        {
            "row": pa.array(range(n), pa.int64()),
            "ts": pa.array(_with_nulls(ts.tolist(), rng), pa.int64()).cast(pa.timestamp("ns")),
        }
    )


def big_values_table(n: int = 40, seed: int = 6) -> pa.Table:
    """Few rows, large values (pages hold one value each; a value larger than a page)."""
    rng = _rng(seed)
    return pa.table(
        {
            "row": pa.array(range(n), pa.int64()),
            "blob": pa.array([rng.bytes(int(rng.integers(0, 200_000))) for _ in range(n)]),
            "long_list": pa.array(
                [list(range(int(rng.integers(0, 20_000)))) for _ in range(n)], pa.list_(pa.int32())
            ),
        }
    )


def wide_table(n: int = 60, seed: int = 7) -> pa.Table:
    rng = _rng(seed)
    return pa.table({f"c{i:03d}": pa.array(rng.integers(0, 10, n), pa.int16()) for i in range(300)})


# --------------------------------------------------------------------- encoding column sets

ENC_COLUMNS = {
    "PLAIN": None,  # every column
    "DELTA_BINARY_PACKED": [
        "int8", "int16", "int32", "int64", "uint8", "uint16", "uint32", "uint64",
        "date32", "time32_ms", "time64_us", "ts_us", "ts_ns", "decimal_9_2", "decimal_18_4",
    ],
    "DELTA_LENGTH_BYTE_ARRAY": ["string", "large_string", "binary", "large_binary"],
    "DELTA_BYTE_ARRAY": ["string", "large_string", "binary", "fixed_size_binary", "decimal_38_10"],
    "BYTE_STREAM_SPLIT": [
        "float16", "float32", "float64", "int32", "int64", "fixed_size_binary", "decimal_38_10",
    ],
    "RLE": ["bool"],
}  # fmt: skip


def _encoding_table(enc: str) -> Callable[[], pa.Table]:
    def make() -> pa.Table:
        t = scalar_table(seed=10 + len(enc))
        cols = ENC_COLUMNS[enc]
        return t if cols is None else t.select(["row", *cols])

    return make


def _encoding_write(enc: str) -> dict[str, Any]:
    cols = ENC_COLUMNS[enc]
    if enc == "PLAIN":
        return {"use_dictionary": False}
    assert cols is not None
    extra = {"store_decimal_as_integer": True} if enc == "DELTA_BINARY_PACKED" else {}
    return {"use_dictionary": False, "column_encoding": dict.fromkeys(cols, enc), **extra}


# --------------------------------------------------------------------------- writers


def write_zero_row_groups(table: pa.Table, path: str, kw: dict[str, Any]) -> None:
    """Row groups: [empty, 50, empty, empty, rest, empty]."""
    kw = {k: v for k, v in kw.items() if k != "row_group_size"}
    with pq.ParquetWriter(path, table.schema, **kw) as w:
        w.write_table(table.slice(0, 0))
        w.write_table(table.slice(0, 50))
        w.write_table(table.slice(0, 0))
        w.write_table(table.slice(0, 0))
        w.write_table(table.slice(50))
        w.write_table(table.slice(0, 0))


def write_schema_only(table: pa.Table, path: str, kw: dict[str, Any]) -> None:
    """A file with the schema and no row group at all."""
    kw = {k: v for k, v in kw.items() if k != "row_group_size"}
    with pq.ParquetWriter(path, table.schema, **kw):
        pass


def write_only_empty_group(table: pa.Table, path: str, kw: dict[str, Any]) -> None:
    kw = {k: v for k, v in kw.items() if k != "row_group_size"}
    with pq.ParquetWriter(path, table.schema, **kw) as w:
        w.write_table(table.slice(0, 0))


# ------------------------------------------------ footers as other writers leave them
#
# A minimal Thrift compact-protocol codec, to rewrite a pyarrow-written footer into the shapes
# other writers produce (which pyarrow still reads). A struct is a list of [field id, wire type,
# value]; a list is (element type, [values]); a map is (key type, value type, [(k, v)]).

T_BOOL_TRUE, T_BOOL_FALSE, T_I8, T_I16, T_I32, T_I64 = 1, 2, 3, 4, 5, 6
T_DOUBLE, T_BINARY, T_LIST, T_SET, T_MAP, T_STRUCT = 7, 8, 9, 10, 11, 12


def _t_varint(b: bytes, p: int) -> tuple[int, int]:
    """A Thrift compact varint at ``p``: ``(value, next p)``; ``ValueError`` if cut short."""
    out = shift = 0
    while True:
        if p >= len(b) or shift > 70:
            raise ValueError("truncated varint")
        x = b[p]
        p += 1
        out |= (x & 0x7F) << shift
        shift += 7
        if not x & 0x80:
            return out, p


def _t_zz(b: bytes, p: int) -> tuple[int, int]:
    z, p = _t_varint(b, p)
    return (z >> 1) ^ -(z & 1), p


def _t_read(b: bytes, p: int, t: int) -> tuple[Any, int]:
    if t in (T_BOOL_TRUE, T_BOOL_FALSE):
        return t == T_BOOL_TRUE, p
    if t == T_I8:
        return b[p], p + 1
    if t in (T_I16, T_I32, T_I64):
        return _t_zz(b, p)
    if t == T_DOUBLE:
        return b[p : p + 8], p + 8
    if t == T_BINARY:
        n, p = _t_varint(b, p)
        return b[p : p + n], p + n
    if t in (T_LIST, T_SET):
        h = b[p]
        p += 1
        n, et = h >> 4, h & 0x0F
        if n == 15:
            n, p = _t_varint(b, p)
        out = []
        for _ in range(n):
            if et in (T_BOOL_TRUE, T_BOOL_FALSE):
                out.append(b[p] == 1)
                p += 1
            else:
                v, p = _t_read(b, p, et)
                out.append(v)
        return (et, out), p
    if t == T_MAP:
        n, p = _t_varint(b, p)
        if not n:
            return (0, 0, []), p
        kv = b[p]
        p += 1
        items = []
        for _ in range(n):
            k, p = _t_read(b, p, kv >> 4)
            v, p = _t_read(b, p, kv & 0x0F)
            items.append((k, v))
        return (kv >> 4, kv & 0x0F, items), p
    if t == T_STRUCT:
        fields: list[list[Any]] = []
        fid = 0
        while True:
            h = b[p]
            p += 1
            if h == 0:
                return fields, p
            t2, d = h & 0x0F, h >> 4
            if d:
                fid += d
            else:
                fid, p = _t_zz(b, p)
            v, p = _t_read(b, p, t2)
            fields.append([fid, t2, v])
    raise ValueError(f"thrift type {t}")


def _t_uvarint(v: int) -> bytes:
    out = bytearray()
    while v >= 0x80:
        out.append((v & 0x7F) | 0x80)
        v >>= 7
    out.append(v)
    return bytes(out)


def _t_zzenc(v: int) -> bytes:
    return _t_uvarint((v << 1) ^ (v >> 63))


def _t_write(t: int, v: Any) -> bytes:
    if t in (T_BOOL_TRUE, T_BOOL_FALSE):
        return b""  # in a field header; list elements are handled below
    if t == T_I8:
        return bytes([v])
    if t in (T_I16, T_I32, T_I64):
        return _t_zzenc(v)
    if t == T_DOUBLE:
        return bytes(v)
    if t == T_BINARY:
        return _t_uvarint(len(v)) + bytes(v)
    if t in (T_LIST, T_SET):
        et, items = v
        head = bytes([(len(items) << 4) | et]) if len(items) < 15 else bytes([0xF0 | et])
        if len(items) >= 15:
            head += _t_uvarint(len(items))
        body = b"".join(
            bytes([1 if x else 2]) if et in (T_BOOL_TRUE, T_BOOL_FALSE) else _t_write(et, x)
            for x in items
        )
        return head + body
    if t == T_MAP:
        kt, vt, items = v
        if not items:
            return b"\x00"
        return (
            _t_uvarint(len(items))
            + bytes([(kt << 4) | vt])
            + b"".join(_t_write(kt, k) + _t_write(vt, x) for k, x in items)
        )
    if t == T_STRUCT:
        out = bytearray()
        last = 0
        for fid, t2, x in v:
            if t2 in (T_BOOL_TRUE, T_BOOL_FALSE):
                t2 = T_BOOL_TRUE if x else T_BOOL_FALSE
            if 0 < fid - last <= 15:
                out.append(((fid - last) << 4) | t2)
            else:
                out.append(t2)
                out += _t_zzenc(fid)
            out += _t_write(t2, x)
            last = fid
        out.append(0)
        return bytes(out)
    raise ValueError(f"thrift type {t}")


def _field(fields: list, fid: int) -> list | None:
    return next((f for f in fields if f[0] == fid), None)


def rewrite_footer(path: str, edit: Callable[[list, bytes], None]) -> None:
    """Parse the footer of ``path``, let ``edit(file_metadata_fields, file_bytes)`` change it in
    place, and write the file back with the new footer (pages and page indexes, which come
    before the footer, are untouched)."""
    with open(path, "rb") as f:
        data = f.read()
    flen = int.from_bytes(data[-8:-4], "little")
    start = len(data) - 8 - flen
    fmd, end = _t_read(data, start, T_STRUCT)
    assert end == len(data) - 8, "footer not parsed to its end"
    edit(fmd, data)
    footer = _t_write(T_STRUCT, fmd)
    with open(path, "wb") as f:
        f.write(data[:start] + footer + len(footer).to_bytes(4, "little") + b"PAR1")


def _column_metadatas(fmd: list) -> list[list]:
    """Every ColumnMetaData struct (FileMetaData.row_groups[*].columns[*].meta_data)."""
    out = []
    for rg in _field(fmd, 4)[2][1]:
        for cc in _field(rg, 1)[2][1]:
            md = _field(cc, 3)
            if md is not None:
                out.append(md[2])
    return out


def write_footer_num_rows_zero(table: pa.Table, path: str, kw: dict[str, Any]) -> None:
    """FileMetaData.num_rows = 0 with full row groups (old parquet-rs and other writers)."""
    pq.write_table(table, path, **kw)

    def edit(fmd: list, _: bytes) -> None:
        _field(fmd, 3)[2] = 0

    rewrite_footer(path, edit)


def write_undeclared_field_type(table: pa.Table, path: str, kw: dict[str, Any]) -> None:
    """What Dremio's parquet-mr 1.12 fork writes: ColumnMetaData field 15 (``i32
    bloom_filter_length`` in the spec) as a list of page-header structs, and
    ``dictionary_page_offset = 0`` for chunks without a dictionary page."""
    pq.write_table(table, path, **kw)

    def edit(fmd: list, _: bytes) -> None:
        for md in _column_metadatas(fmd):
            page = [[1, T_I32, 0], [2, T_I32, 162], [3, T_I32, 22]]
            md[:] = [f for f in md if f[0] != 15]
            md.append([15, T_LIST, (T_STRUCT, [[[1, T_STRUCT, page], [2, T_I64, 22]]])])
            if _field(md, 11) is None:
                md.append([11, T_I64, 0])
            md.sort(key=lambda f: f[0])
        _field(fmd, 6)[2] = b"parquet-mr version 1.12.0-201812210311360288-a86293f"

    rewrite_footer(path, edit)


def write_short_dictionary_chunks(table: pa.Table, path: str, kw: dict[str, Any]) -> None:
    """What parquet-mr before 1.2.9 wrote (IMPALA-694 / PARQUET-816): column chunk sizes that
    leave out the dictionary page header. pyarrow reads it (it pads such chunks)."""
    pq.write_table(table, path, **kw)

    def edit(fmd: list, data: bytes) -> None:
        for md in _column_metadatas(fmd):
            dict_off = _field(md, 11)
            if dict_off is None:
                continue
            header, end = _t_read(data, dict_off[2], T_STRUCT)
            assert _field(header, 1)[2] == 2, "not a dictionary page"
            _field(md, 7)[2] -= end - dict_off[2]
        _field(fmd, 6)[2] = b"parquet-mr"

    rewrite_footer(path, edit)


def narrow_dictionary_table(n: int = N, seed: int = 8, categories: int = 100) -> pa.Table:
    """Dictionary columns with every narrow key type (pandas writes ``category`` columns with
    int8 keys), null keys, ``categories`` values each. (pyarrow cannot write a null among the
    dictionary values.)"""
    rng = _rng(seed)
    cats = [f"c{seed}-{k}" for k in range(categories)]
    idx = rng.integers(0, categories, n)
    null = rng.random(n) < 0.1
    cols: dict[str, pa.Array] = {"row": pa.array(range(n), pa.int64())}
    for key in (pa.int8(), pa.int16(), pa.uint8(), pa.uint16(), pa.uint32()):
        keys = pa.array(idx, key, mask=null)
        cols[f"dict_{key}"] = pa.DictionaryArray.from_arrays(keys, pa.array(cats))
    cols["dict_int8_int64_values"] = pa.DictionaryArray.from_arrays(
        pa.array(idx % 100, pa.int8()), pa.array([seed * 1000 + k for k in range(100)])
    )
    return pa.table(cols)


# Small pages and row groups everywhere, so that pages, page boundaries, row-group boundaries
# and dictionary fallbacks all happen inside a few hundred rows.
TINY = dict(
    data_page_size=128, write_batch_size=7, row_group_size=97, dictionary_pagesize_limit=256
)
COMPRESSIONS = ["none", "snappy", "gzip", "brotli", "lz4", "zstd"]


def cases() -> list[Case]:
    out: list[Case] = []
    # 1. encodings x data page version (compression rotates)
    for i, enc in enumerate(ENC_COLUMNS):
        for v in ("1.0", "2.0"):
            kw = {
                **TINY,
                **_encoding_write(enc),
                "data_page_version": v,
                "compression": COMPRESSIONS[(i * 2 + (v == "2.0")) % len(COMPRESSIONS)],
                "write_page_index": True,
            }
            out.append(Case(f"enc-{enc.lower()}-v{v[0]}", _encoding_table(enc), kw))
    # dictionary encoding (default) with tiny dictionary pages: dictionary -> plain fallback
    for v in ("1.0", "2.0"):
        out.append(
            Case(
                f"enc-rle_dictionary-v{v[0]}",
                lambda: scalar_table(seed=20),
                {**TINY, "use_dictionary": True, "data_page_version": v},
            )
        )
    # 2. compressions x page versions, on the mixed scalar table and the nested table
    for c in COMPRESSIONS:
        for v in ("1.0", "2.0"):
            out.append(
                Case(
                    f"comp-{c}-v{v[0]}",
                    lambda: scalar_table(seed=30),
                    {**TINY, "compression": c, "data_page_version": v},
                )
            )
        out.append(
            Case(
                f"comp-{c}-nested",
                lambda: nested_table(seed=31),
                {**TINY, "compression": c, "data_page_version": "2.0"},
            )
        )
    # 3. types and structures
    for v in ("1.0", "2.0"):
        out.append(Case(f"nested-v{v[0]}", nested_table, {**TINY, "data_page_version": v}))
        out.append(
            Case(
                f"nested-plain-v{v[0]}",
                nested_table,
                {**TINY, "use_dictionary": False, "data_page_version": v},
            )
        )
    out.append(
        Case("nested-noncompliant", nested_table, {**TINY, "use_compliant_nested_type": False})
    )
    out.append(Case("dictionary", dictionary_table, dict(TINY)))
    out.append(
        Case(
            "dictionary-v2-zstd",
            dictionary_table,
            {**TINY, "data_page_version": "2.0", "compression": "zstd"},
        )
    )
    out.append(
        Case("dictionary-no-arrow-schema", dictionary_table, {**TINY, "store_schema": False})
    )
    out.append(Case("required", required_table, dict(TINY)))
    out.append(
        Case(
            "required-v2",
            required_table,
            {**TINY, "data_page_version": "2.0", "use_dictionary": False},
        )
    )
    out.append(Case("misc-types", misc_types_table, dict(TINY)))
    out.append(Case("int96", int96_table, {**TINY, "use_deprecated_int96_timestamps": True}))
    out.append(Case("scalars-no-arrow-schema", scalar_table, {**TINY, "store_schema": False}))
    out.append(
        Case(
            "scalars-format-1.0",
            scalar_table,
            {
                **TINY,
                "version": "1.0",
                "coerce_timestamps": "us",
                "allow_truncated_timestamps": True,
            },
        )
    )
    out.append(Case("nested-no-arrow-schema", nested_table, {**TINY, "store_schema": False}))
    out.append(Case("big-values", big_values_table, {"data_page_size": 1024, "row_group_size": 16}))
    out.append(Case("wide-300-columns", wide_table, {"row_group_size": 25}))
    # 4. page and row-group layouts
    out.append(
        Case(
            "tiny-pages-1-row-batches",
            lambda: scalar_table(seed=40),
            {"data_page_size": 1, "write_batch_size": 1, "row_group_size": 1000},
        )
    )
    out.append(Case("one-row-groups", lambda: nested_table(seed=41), {"row_group_size": 1}))
    out.append(
        Case(
            "no-stats-no-page-index",
            lambda: scalar_table(seed=42),
            {**TINY, "write_statistics": False, "write_page_index": False},
        )
    )
    out.append(
        Case(
            "no-stats-page-index",
            lambda: nested_table(seed=43),
            {**TINY, "write_statistics": False, "write_page_index": True},
        )
    )
    out.append(
        Case(
            "page-index-v2",
            lambda: nested_table(seed=44),
            {**TINY, "write_page_index": True, "data_page_version": "2.0"},
        )
    )
    out.append(
        Case(
            "checksums",
            lambda: scalar_table(seed=45),
            {**TINY, "write_page_checksum": True, "write_page_index": True},
        )
    )
    out.append(
        Case(
            "checksums-nested-v2",
            lambda: nested_table(seed=46),
            {**TINY, "write_page_checksum": True, "data_page_version": "2.0"},
        )
    )
    out.append(
        Case(
            "byte-stream-split-all-floats",
            lambda: scalar_table(seed=47),
            {
                **TINY,
                "use_byte_stream_split": ["float16", "float32", "float64"],
                "use_dictionary": False,
            },
        )
    )
    out.append(
        Case(
            "sorting-columns",
            lambda: scalar_table(seed=48).sort_by("row"),
            {**TINY, "sorting_columns": [pq.SortingColumn(0)]},
        )
    )
    out.append(
        Case("zero-row-groups", lambda: scalar_table(seed=49), dict(TINY), write_zero_row_groups)
    )
    out.append(
        Case(
            "zero-row-groups-nested",
            lambda: nested_table(seed=50),
            dict(TINY),
            write_zero_row_groups,
        )
    )
    out.append(Case("empty-schema-only", lambda: scalar_table(seed=51), {}, write_schema_only))
    out.append(
        Case("empty-one-empty-group", lambda: nested_table(seed=52), {}, write_only_empty_group)
    )
    out.append(Case("empty-table", lambda: scalar_table(seed=53).slice(0, 0), {}))
    out.append(Case("single-row", lambda: nested_table(1, seed=54), {}))
    # 5. what other writers leave (pyarrow reads all of these)
    out.append(
        Case(
            "footer-num-rows-zero",
            lambda: scalar_table(seed=55),
            dict(TINY),
            write_footer_num_rows_zero,
        )
    )
    out.append(
        Case(
            "footer-undeclared-field-type",
            lambda: nested_table(seed=56),
            {**TINY, "write_page_index": True, "use_dictionary": ["list_string", "row"]},
            write_undeclared_field_type,
        )
    )
    out.append(
        Case(
            "short-dictionary-chunks",
            lambda: scalar_table(seed=57),
            {**TINY, "use_dictionary": True},
            write_short_dictionary_chunks,
        )
    )
    out.append(Case("narrow-dictionary-keys", narrow_dictionary_table, dict(TINY)))
    return out


def write_case(case: Case, directory: str) -> str:
    os.makedirs(directory, exist_ok=True)
    path = os.path.join(directory, f"{case.name}.parquet")
    table = case.table()
    if case.writer is not None:
        case.writer(table, path, dict(case.write))
    else:
        pq.write_table(table, path, **case.write)
    return path


def build_corpus(directory: str) -> dict[str, str]:
    return {c.name: write_case(c, directory) for c in cases()}


# ------------------------------------------------------------- multi-shard sets
#
# What one file cannot show: shards that differ from each other (dictionaries, unifiable
# schemas), directories with files a walk must skip, and what must be refused.


@dataclass(frozen=True)
class Shard:
    rel: str  # path relative to the set's directory
    table: pa.Table | Callable[[], pa.Table]
    write: dict[str, Any] = field(default_factory=dict)
    data: bool = True  # False: a file the directory walk must skip


@dataclass(frozen=True)
class SetCase:
    """A directory read as one dataset. ``error``: the exception class name and substrings
    its message must contain (``{dir}`` stands for the set's directory); otherwise the rows
    must be those of the data shards in path order, each read by pyarrow alone."""

    name: str
    shards: Callable[[], list[Shard]]
    extra: Callable[[str], None] | None = None  # non-Parquet files, links (gets the directory)
    error: tuple[str, tuple[str, ...]] | None = None
    columns: list[str] | None = None


def _one(t: pa.Table | Callable[[], pa.Table]) -> pa.Table:
    return t() if callable(t) else t


def _pandas_category_shards() -> list[Shard]:
    import pandas as pd

    out = []
    for i in range(3):
        cats = [f"shard{i}-{k}" for k in range(100)]  # 300 categories overall, int8 keys
        codes = [(k * 7) % 100 if k % 13 else -1 for k in range(150)]  # -1: null
        df = pd.DataFrame(
            {
                "row": range(i * 150, (i + 1) * 150),
                "cat": pd.Categorical.from_codes(codes, categories=cats),
            }
        )
        out.append(Shard(f"p{i}.parquet", pa.Table.from_pandas(df, preserve_index=False)))
    return out


def _narrow_dictionary_shards() -> list[Shard]:
    # Different categories per shard: 3 x 100 values overflow int8 keys once merged.
    return [
        Shard(f"part-{i}.parquet", lambda i=i: narrow_dictionary_table(97 + i, seed=60 + i), TINY)
        for i in range(3)
    ]


def _mixed_key_width_shards() -> list[Shard]:
    def t(i: int, key: pa.DataType) -> pa.Table:
        cats = pa.array([f"k{i}-{j}" for j in range(120)])
        keys = pa.array([(j * 11) % 120 for j in range(200)], key)
        return pa.table(
            {
                "row": pa.array(range(i * 200, (i + 1) * 200), pa.int64()),
                "d": pa.DictionaryArray.from_arrays(keys, cats),
            }
        )

    return [
        Shard("a.parquet", t(0, pa.int8()), TINY),
        Shard("b.parquet", t(1, pa.int32()), TINY),
        Shard("c.parquet", t(2, pa.uint8()), TINY),
    ]


def _null_typed_shards() -> list[Shard]:
    empty = pa.Table.from_pylist([], schema=pa.schema([("row", pa.int64()), ("s", pa.null())]))
    return [
        # pyarrow types an all-null column `null`, and so an empty list of records too
        Shard(
            "a.parquet",
            pa.table(
                {
                    "row": pa.array(range(50), pa.int64()),
                    "s": pa.nulls(50),
                    "l": pa.array([None] * 50, pa.list_(pa.null())),
                    "st": pa.nulls(50),
                }
            ),
        ),
        Shard(
            "b.parquet",
            pa.table(
                {
                    "row": pa.array([], pa.int64()),
                    "s": pa.array([], pa.null()),
                    "l": pa.array([], pa.list_(pa.null())),
                    "st": pa.array([], pa.null()),
                }
            ),
        ),
        Shard(
            "c.parquet",
            lambda: pa.table(
                {
                    "row": pa.array(range(50, 290), pa.int64()),
                    "s": pa.array(_with_nulls(_strings(_rng(70), 240), _rng(71))),
                    "l": pa.array(_lists(_rng(72), 240, lambda k: k), pa.list_(pa.int64())),
                    "st": pa.array(
                        [{"a": i, "b": str(i)} if i % 5 else None for i in range(240)],
                        pa.struct([("a", pa.int32()), ("b", pa.string())]),
                    ),
                }
            ),
            TINY,
        ),
        Shard(
            "d.parquet",
            empty.append_column("l", pa.array([], pa.list_(pa.null()))).append_column(
                "st", pa.array([], pa.null())
            ),
        ),
    ]


def _list_naming_shards() -> list[Shard]:
    return [
        Shard(
            f"{i}.parquet",
            lambda i=i: nested_table(80, seed=80 + i).drop_columns(["struct_all_null"]),
            {**TINY, "use_compliant_nested_type": i % 2 == 1},
        )
        for i in range(3)
    ]


def _nullability_shards() -> list[Shard]:
    req = pa.schema(
        [
            pa.field("row", pa.int64(), nullable=False),
            pa.field("l", pa.list_(pa.field("item", pa.int32(), nullable=False))),
            pa.field("st", pa.struct([pa.field("a", pa.int32(), nullable=False)])),
        ]
    )
    a = pa.Table.from_pylist(
        [{"row": i, "l": [i, i + 1][: i % 3], "st": {"a": i}} for i in range(100)], schema=req
    )
    opt = pa.schema(
        [
            pa.field("row", pa.int64()),
            pa.field("l", pa.list_(pa.int32())),
            pa.field("st", pa.struct([pa.field("a", pa.int32())])),
        ]
    )
    b = pa.Table.from_pylist(
        [
            {"row": 100 + i, "l": [None, i] if i % 2 else None, "st": {"a": None if i % 3 else i}}
            for i in range(100)
        ],
        schema=opt,
    )
    return [Shard("a.parquet", a, TINY), Shard("b.parquet", b, TINY)]


def _timezone_shards() -> list[Shard]:
    def t(i: int) -> pa.Table:
        ms = pa.array([(i * 1000 + k) * 3_600_007 for k in range(120)], pa.int64())
        return pa.table(
            {
                "row": pa.array(range(i * 120, (i + 1) * 120), pa.int64()),
                "ts": ms.cast(pa.timestamp("ms", tz="Europe/Berlin")),
                "ts_utc": ms.cast(pa.timestamp("us", tz="UTC")),
            }
        )

    # store_schema=False: the zone is not stored, the column reads as UTC (same instants)
    return [
        Shard("a.parquet", t(0), {**TINY, "store_schema": False}),
        Shard("b.parquet", t(1), TINY),
        Shard("c.parquet", t(2), {**TINY, "store_schema": False}),
    ]


def _spark_output_shards() -> list[Shard]:
    def t(i: int) -> pa.Table:
        return scalar_table(60, seed=90 + i)

    return [
        Shard("part-00000-abc.snappy.parquet", t(0), TINY),
        Shard("part-00001-abc.snappy.parquet", t(1), TINY),
        Shard("year=2024/part-00002-abc.snappy.parquet", t(2), TINY),
        Shard("_temporary/0/_temporary/attempt_1/part-00003-abc.snappy.parquet", t(3), data=False),
        Shard("_temporary/0/task_1/part-00000-abc.snappy.parquet", t(0), data=False),
        Shard(".hidden.parquet", t(4), data=False),
        Shard("_metadata.parquet", t(5), data=False),
        Shard(".spark-staging-1/part-00009.parquet", t(6), data=False),
    ]


def _spark_markers(d: str) -> None:
    open(os.path.join(d, "_SUCCESS"), "w").close()
    for f in os.listdir(d):
        if f.startswith("part-"):
            with open(os.path.join(d, f".{f}.crc"), "wb") as out:
                out.write(b"crc\x00\x01")
    with open(os.path.join(d, "_temporary", "0", "partial.parquet"), "wb") as out:
        out.write(b"PAR1 not finished")


def _loop_link(d: str) -> None:
    os.symlink("..", os.path.join(d, "sub", "up"))


def _duplicate_names() -> list[Shard]:
    t = pa.Table.from_arrays([pa.array([1, 2, 3]), pa.array(["a", "b", "c"])], names=["a", "a"])
    return [Shard("dup.parquet", t)]


def set_cases() -> list[SetCase]:
    ok = [
        SetCase("pandas-category-shards", _pandas_category_shards),
        SetCase("narrow-dictionary-shards", _narrow_dictionary_shards),
        SetCase("dictionary-key-widths-differ", _mixed_key_width_shards),
        SetCase("null-typed-columns", _null_typed_shards),
        SetCase("list-item-vs-element", _list_naming_shards),
        SetCase("nested-nullability-differs", _nullability_shards),
        SetCase("timestamp-zone-vs-no-stored-schema", _timezone_shards),
        SetCase("spark-output-directory", _spark_output_shards, _spark_markers),
    ]
    scalar = lambda i: scalar_table(30, seed=100 + i)  # noqa: E731
    refused = [
        SetCase(
            "duplicate-column-names",
            _duplicate_names,
            error=("SchemaError", ("dup.parquet", '"a"', "more than once")),
        ),
        SetCase(
            "int-vs-string",
            lambda: [
                Shard("a.parquet", pa.table({"x": pa.array([1, 2], pa.int64())})),
                Shard("b.parquet", pa.table({"x": pa.array(["1"])})),
            ],
            error=("SchemaError", ("a.parquet", "b.parquet", "int64", "string")),
        ),
        SetCase(
            "list-int32-vs-list-int64",
            lambda: [
                Shard("a.parquet", pa.table({"x": pa.array([[1]], pa.list_(pa.int32()))})),
                Shard("b.parquet", pa.table({"x": pa.array([[1]], pa.list_(pa.int64()))})),
            ],
            error=("SchemaError", ("list<element: int32>", "list<element: int64>")),
        ),
        SetCase(
            "timestamp-zone-vs-naive",
            lambda: [
                Shard("a.parquet", scalar(0).select(["ts_us_utc"]).rename_columns(["t"])),
                Shard("b.parquet", scalar(1).select(["ts_us"]).rename_columns(["t"])),
            ],
            error=("SchemaError", ("timestamp[us, tz=UTC]", "timestamp[us]", "time zone")),
        ),
        SetCase(
            "directory-symlink-loop",
            lambda: [Shard("sub/a.parquet", scalar(2))],
            _loop_link,
            error=("OSError", ("sub/up", "contains it")),
        ),
        SetCase(
            "no-columns",
            lambda: [Shard("a.parquet", scalar(3))],
            error=("ValueError", ("columns=[]",)),
            columns=[],
        ),
    ]
    return ok + refused


def build_set(case: SetCase, directory: str) -> tuple[str, list[str]]:
    """Write a set; returns its directory and its data files (absolute, in path order)."""
    d = os.path.join(directory, case.name)
    data = []
    for sh in case.shards():
        p = os.path.join(d, sh.rel)
        os.makedirs(os.path.dirname(p), exist_ok=True)
        pq.write_table(_one(sh.table), p, **sh.write)
        if sh.data:
            data.append(p)
    if case.extra is not None:
        case.extra(d)
    return d, sorted(data)


def set_reference(files: list[str], schema: pa.Schema) -> pa.Table:
    """The data files read one by one by pyarrow, in path order, each column in shardstream's
    value type (a ``null`` column as nulls of it), concatenated."""
    parts = []
    for path in files:
        t = pq.read_table(path)
        cols = []
        for f in schema:
            want = f.type.value_type if pa.types.is_dictionary(f.type) else f.type
            a = _plain(t.column(f.name))
            a = pa.nulls(len(a), want) if pa.types.is_null(a.type) else a.cast(want)
            cols.append(a)
        parts.append(pa.Table.from_arrays(cols, names=schema.names))
    return pa.concat_tables(parts)


# --------------------------------------------------------------------------- comparing


def _plain(a: pa.ChunkedArray | pa.Array) -> pa.Array:
    """Values without presentation: dictionary decoded, extension types as their storage."""
    if isinstance(a, pa.ChunkedArray):
        a = a.combine_chunks()
    if isinstance(a.type, pa.BaseExtensionType):
        a = a.storage
    if pa.types.is_dictionary(a.type):
        a = a.dictionary_decode()
    return a


def allowed_type_difference(got: pa.DataType, ref: pa.DataType) -> bool:
    """Type differences between arrow-rs (shardstream) and Arrow C++ (pyarrow) reading the same
    file that are presentation only (the values are equal; checked separately):

    * Parquet DATE columns written from ``date64``: arrow-rs honours the stored Arrow schema
      (``date64``), pyarrow always reads ``date32``;
    * dictionary columns: arrow-rs keeps ``dictionary<int64>`` / ``dictionary<large_string>``
      as stored, pyarrow decodes non-string dictionaries and narrows ``large_string`` values;
    * uuid / json extension types: arrow-rs reads their storage type;
    * a timestamp column written with ``version="1.0"`` and a time zone: arrow-rs reads the
      zone as UTC, pyarrow keeps the stored zone (same instants).
    """
    if got == ref:
        return True
    if pa.types.is_date64(got) and pa.types.is_date32(ref):
        return True
    if isinstance(ref, pa.BaseExtensionType) and got == ref.storage_type:
        return True
    if pa.types.is_dictionary(got):
        if pa.types.is_dictionary(ref):
            return {got.value_type, ref.value_type} <= {pa.string(), pa.large_string()} or (
                got.value_type == ref.value_type
            )
        return got.value_type == ref
    if pa.types.is_timestamp(got) and pa.types.is_timestamp(ref):
        return got.unit == ref.unit and got.tz == "UTC" and ref.tz not in (None, "UTC")
    return False


def reference(path: str | pa.Table, schema: pa.Schema) -> pa.Table:
    """``pq.read_table(path)`` (or a table already read) with each column's values converted
    to shardstream's type (when the types differ in presentation only), so both read as equal
    Python values."""
    ref = pq.read_table(path) if isinstance(path, str) else path
    cols = []
    for f in schema:
        col = ref.column(f.name)
        assert allowed_type_difference(f.type, col.type), (
            f"{path}: column {f.name!r}: shardstream type {f.type}, pyarrow type {col.type}"
        )
        got_t = f.type.value_type if pa.types.is_dictionary(f.type) else f.type
        a = _plain(col)
        if a.type != got_t:
            a = a.cast(got_t)
        cols.append(a)
    return pa.Table.from_arrays(cols, names=schema.names)


class _NaN:
    def __eq__(self, other: object) -> bool:
        return isinstance(other, _NaN)

    def __hash__(self) -> int:
        return 0

    def __repr__(self) -> str:
        return "NaN"


def canon(v: Any) -> Any:
    """Python values comparable with ``==`` (NaN equals NaN)."""
    if isinstance(v, float) and math.isnan(v):
        return _NaN()
    if isinstance(v, dict):
        return {k: canon(x) for k, x in v.items()}
    if isinstance(v, (list, tuple)):
        return type(v)(canon(x) for x in v)
    return v


# ---------------------------------------------------------------- Arrow IPC shards
#
# The corpus tables as Arrow IPC files and streams (pyarrow-written; arrow-rs-written ones are
# in the core's unit tests), uncompressed, LZ4 and ZSTD, record batches of 97 rows, plus
# streams whose dictionaries are replaced or extended (delta) between batches.


@dataclass(frozen=True)
class IpcCase:
    name: str
    batches: Callable[[], list[pa.RecordBatch]]
    stream: bool
    compression: str | None = None
    deltas: bool = False


def _chunks(t: Callable[[], pa.Table]) -> Callable[[], list[pa.RecordBatch]]:
    return lambda: t().combine_chunks().to_batches(max_chunksize=97)


def _changing_dictionaries() -> list[pa.RecordBatch]:
    """Each batch with its own dictionary (growing: a delta where the writer may emit one)."""
    out = []
    for b in range(5):
        words = [f"w{k}" for k in range(b + 2)]
        idx = pa.array([(k * 3 + b) % len(words) if k % 4 else None for k in range(31)], pa.int16())
        lab = pa.DictionaryArray.from_arrays(idx, pa.array(words))
        row = pa.array(range(b * 31, (b + 1) * 31), pa.int64())
        out.append(pa.RecordBatch.from_arrays([row, lab], names=["row", "label"]))
    return out


def ipc_cases() -> list[IpcCase]:
    tables = {
        "scalar": lambda: scalar_table(seed=70),
        "nested": lambda: nested_table(seed=71),
        "dictionary": lambda: dictionary_table(seed=72),
        "big-values": lambda: big_values_table(seed=73),
    }
    comps = [None, "lz4", "zstd"]
    out = []
    for i, (name, t) in enumerate(tables.items()):
        for stream in (False, True):
            comp = comps[(2 * i + stream) % 3]
            kind = "stream" if stream else "file"
            out.append(IpcCase(f"ipc-{kind}-{name}-{comp or 'none'}", _chunks(t), stream, comp))
    for deltas in (False, True):
        out.append(
            IpcCase(
                f"ipc-stream-{'delta' if deltas else 'replaced'}-dictionaries",
                _changing_dictionaries,
                True,
                "zstd" if deltas else None,
                deltas,
            )
        )
    return out


def write_ipc_case(case: IpcCase, directory: str) -> str:
    os.makedirs(directory, exist_ok=True)
    path = os.path.join(directory, f"{case.name}.{'arrows' if case.stream else 'arrow'}")
    batches = case.batches()
    opts = pa.ipc.IpcWriteOptions(compression=case.compression, emit_dictionary_deltas=case.deltas)
    new = pa.ipc.new_stream if case.stream else pa.ipc.new_file
    with new(path, batches[0].schema, options=opts) as w:
        for b in batches:
            w.write_batch(b)
    return path


def read_ipc(path: str) -> pa.Table:
    """What pyarrow reads of an IPC file or stream (by its magic bytes)."""
    with open(path, "rb") as f:
        magic = f.read(6)
    if magic == b"ARROW1":
        return pa.ipc.open_file(path).read_all()
    return pa.ipc.open_stream(path).read_all()
