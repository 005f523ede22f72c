"""The ``shardstream`` command line (also ``python -m shardstream``).

Subcommands::

    shardstream inspect SOURCE... [--columns C ...] [--json]   # shards, row groups, page index
    shardstream state FILE [--source SOURCE ...] [--json]      # a saved state, readable
    shardstream demo [--rows N] [--dir D]                      # the exact-resume demo
    shardstream bench [--rows N] [--json]                      # quick side-by-side vs pyarrow

Exit status: 0 success; 1 a check failed (``state --source``: a state does not match the
source; ``demo``: the resumed stream differs); 2 bad command line or unusable input (missing
file, not Parquet, not a state file), with a one-line message on stderr and no traceback.

Progress bars go to stderr and only when stderr is a terminal. ``--json`` output goes to
stdout and is the stable interface for scripts; the text output is for people.

Adding a subcommand: write ``_add_NAME(sub)`` that creates the subparser and sets
``run=`` to a function taking the parsed ``argparse.Namespace`` and returning the exit
status, and append it to ``COMMANDS``.

The functions behind the commands are usable on their own:

    >>> import tempfile, shardstream.datagen as dg
    >>> d = tempfile.mkdtemp()
    >>> _ = dg.write_shards(d, num_shards=2, rows_per_shard=[300, 200], row_group_size=100)
    >>> info = inspect_source([d])
    >>> info["totals"]["shards"], info["totals"]["rows"], info["totals"]["row_groups"]
    (2, 500, 5)
    >>> info["resume"]["verdict"]
    'fast'
    >>> from shardstream import ParquetStream
    >>> ds = ParquetStream(d, batch_size=50, output="python")
    >>> it = iter(ds); _ = next(it); _ = next(it)
    >>> s = describe_state(ds.state_dict())
    >>> s["epoch"], s["emitted"], s["percent"], s["slot"]
    (0, 100, 20.0, {'index': 0, 'count': 1, 'even': 'off'})
"""

from __future__ import annotations

import argparse
import base64
import binascii
import io
import json
import os
import pickle
import statistics
import sys
import warnings
from collections.abc import Callable, Sequence
from typing import Any

__all__ = [
    "COMMANDS",
    "CliError",
    "build_parser",
    "check_states",
    "describe_state",
    "find_states",
    "inspect_source",
    "load_state_file",
    "main",
]

PROG = "shardstream"

# A shard without a page index resumes inside a row group by decoding from the row group's
# start: up to a whole row group per resume. Above either size that is "slow" (hundreds of ms
# to seconds per resume, per DataLoader worker).
SLOW_ROW_GROUP_BYTES = 64 * 2**20
SLOW_ROW_GROUP_ROWS = 1_000_000


class CliError(Exception):
    """An error reported as one line on stderr with exit status ``code`` (no traceback)."""

    def __init__(self, message: str, code: int = 2) -> None:
        super().__init__(message)
        self.code = code


# --------------------------------------------------------------------------- formatting


def human_bytes(n: float) -> str:
    """``1536`` -> ``'1.5 KiB'``.

    >>> human_bytes(0), human_bytes(1536), human_bytes(5 * 2**30)
    ('0 B', '1.5 KiB', '5.0 GiB')
    """
    for unit in ("B", "KiB", "MiB", "GiB", "TiB"):
        if abs(n) < 1024 or unit == "TiB":
            return f"{n:.0f} {unit}" if unit == "B" else f"{n:.1f} {unit}"
        n /= 1024
    raise AssertionError  # pragma: no cover


def table(headers: Sequence[str], rows: Sequence[Sequence[Any]], right: Sequence[bool]) -> str:
    """Plain-text table with aligned columns (``right[i]``: right-align column ``i``).

    >>> print(table(["name", "rows"], [["a", "1,000"], ["bb", "7"]], [False, True]))
    name   rows
    a     1,000
    bb        7
    """
    cells = [[str(h) for h in headers]] + [[str(c) for c in r] for r in rows]
    widths = [max(len(r[i]) for r in cells) for i in range(len(headers))]
    lines = []
    for r in cells:
        parts = [
            c.rjust(w) if right[i] else c.ljust(w)
            for i, (c, w) in enumerate(zip(r, widths, strict=True))
        ]
        lines.append("  ".join(parts).rstrip())
    return "\n".join(lines)


def _emit_json(obj: Any) -> None:
    json.dump(obj, sys.stdout, indent=2, sort_keys=False, default=str)
    sys.stdout.write("\n")


# --------------------------------------------------------------------------- inspect


def inspect_source(
    sources: Sequence[str],
    columns: Sequence[str] | None = None,
    storage_options: dict[str, str] | None = None,
) -> dict[str, Any]:
    """Footer facts about a shard set and what they mean for resume speed (JSON-able dict).

    Keys: ``root``, ``shards`` (per shard: ``path``, ``rel_path``, ``size``, ``rows``,
    ``page_index``, ``row_groups`` as ``{"rows", "byte_offset", "bytes"}``), ``totals``,
    ``schema`` (``name``/``type``/``nullable`` of the selected columns), ``fingerprint`` and
    ``resume`` (``verdict`` ``"fast"``/``"ok"``/``"slow"`` and ``advice`` lines).

    Raises:
        FileNotFoundError, ShardError, SchemaError: as ``ParquetStream`` would.
    """
    from ._core import RawCatalog

    cat = RawCatalog(
        [os.fspath(s) for s in sources],
        None if columns is None else list(columns),
        storage_options,
    )
    shards: list[dict[str, Any]] = []
    for s in cat.shards_info():
        rgs = [
            {"rows": int(r[0]), "byte_offset": int(r[1]), "bytes": int(r[2])}
            for r in s.get("row_groups", [])
        ]
        shards.append(
            {
                "path": s.get("path"),
                "rel_path": s.get("rel_path"),
                "size": int(s.get("size", 0)),
                "rows": int(s.get("rows", 0)),
                "page_index": bool(s.get("has_offset_index", False)),
                "row_groups": rgs,
            }
        )
    all_rgs = [rg for s in shards for rg in s["row_groups"]]
    rg_rows = [rg["rows"] for rg in all_rgs]
    totals: dict[str, int] = {
        "shards": len(shards),
        "rows": sum(s["rows"] for s in shards),
        "size": sum(s["size"] for s in shards),
        "row_groups": len(all_rgs),
        "page_index_shards": sum(1 for s in shards if s["page_index"]),
        "row_group_rows_min": min(rg_rows, default=0),
        "row_group_rows_median": int(statistics.median(rg_rows)) if rg_rows else 0,
        "row_group_rows_max": max(rg_rows, default=0),
        "row_group_bytes_max": max((rg["bytes"] for rg in all_rgs), default=0),
    }
    schema = [
        {"name": f.name, "type": str(f.type), "nullable": bool(f.nullable)} for f in cat.schema
    ]
    return {
        "root": cat.root,
        "shards": shards,
        "totals": totals,
        "schema": schema,
        "fingerprint": dict(cat.fingerprint()),
        "resume": _resume_assessment(shards),
    }


def _resume_assessment(shards: list[dict[str, Any]]) -> dict[str, Any]:
    without = [s for s in shards if not s["page_index"] and s["rows"] > 0]
    worst_rows = max((rg["rows"] for s in without for rg in s["row_groups"]), default=0)
    worst_bytes = max((rg["bytes"] for s in without for rg in s["row_groups"]), default=0)
    slow = [
        s["rel_path"]
        for s in without
        if any(
            rg["bytes"] >= SLOW_ROW_GROUP_BYTES or rg["rows"] >= SLOW_ROW_GROUP_ROWS
            for rg in s["row_groups"]
        )
    ]
    advice: list[str] = []
    if not without:
        verdict = "fast"
        advice.append(
            "every shard has a page index: a resume reads the footer, seeks to the row group "
            "and skips whole pages with the offset index (cost independent of the position "
            "and of row-group size)"
        )
    else:
        verdict = "slow" if slow else "ok"
        advice.append(
            f"no page index in {len(without)} of {len(shards)} shard(s): a resume inside "
            "their row groups decodes whole pages from the row group's start, up to "
            f"{worst_rows:,} rows / {human_bytes(worst_bytes)} compressed (largest row group)"
        )
        if slow:
            advice.append(
                f"slow resume: {len(slow)} shard(s) without page index have row groups of "
                f">= {SLOW_ROW_GROUP_ROWS:,} rows or >= {human_bytes(SLOW_ROW_GROUP_BYTES)} "
                f"(e.g. {slow[0]}): each resume may decode a whole one"
            )
        advice.append(
            "fix: rewrite those shards with a page index, e.g. pyarrow.parquet.write_table("
            "table, path, write_page_index=True) (and a smaller row_group_size)"
        )
    return {
        "verdict": verdict,
        "shards_without_page_index": [s["rel_path"] for s in without],
        "worst_case_rows": worst_rows,
        "worst_case_bytes": worst_bytes,
        "slow_shards": slow,
        "advice": advice,
    }


def _print_inspect(info: dict[str, Any]) -> None:
    rows = []
    for s in info["shards"]:
        rgs = s["row_groups"]
        rows.append(
            [
                s["rel_path"],
                f"{s['rows']:,}",
                f"{len(rgs):,}",
                f"{max((r['rows'] for r in rgs), default=0):,}",
                human_bytes(s["size"]),
                "yes" if s["page_index"] else "NO",
            ]
        )
    headers = ["shard", "rows", "row groups", "max rows/group", "size", "page index"]
    print(table(headers, rows, [False, True, True, True, True, False]))
    t = info["totals"]
    print()
    print(
        f"{t['shards']:,} shards, {t['rows']:,} rows, {t['row_groups']:,} row groups, "
        f"{human_bytes(t['size'])}; page index in {t['page_index_shards']} of {t['shards']} "
        f"shards; rows per row group min/median/max {t['row_group_rows_min']:,} / "
        f"{t['row_group_rows_median']:,} / {t['row_group_rows_max']:,}"
    )
    print(f"root: {info['root']}")
    cols = ", ".join(
        f"{c['name']}: {c['type']}{'' if c['nullable'] else ' not null'}" for c in info["schema"]
    )
    print(f"schema: {cols}")
    r = info["resume"]
    print(f"resume: {r['verdict']}")
    for line in r["advice"]:
        print(f"  - {line}")


def _run_inspect(args: argparse.Namespace) -> int:
    info = inspect_source(args.source, args.columns, _storage_options(args.storage_option))
    if args.json:
        _emit_json(info)
    else:
        _print_inspect(info)
    return 0


def _add_inspect(sub: Any) -> None:
    p = sub.add_parser(
        "inspect",
        help="shards, rows, row groups, sizes, page index, and what they mean for resume speed",
        description="Read the Parquet footers of SOURCE (files, directories, globs) and show "
        "shards, rows, row groups, sizes, whether each shard has a page index, the schema, and "
        "what that means for resume speed.",
    )
    p.add_argument(
        "source", nargs="+", metavar="SOURCE", help="file, directory, glob or s3:// etc. URL"
    )
    p.add_argument("--columns", nargs="+", metavar="C", help="only these columns (schema)")
    p.add_argument(
        "--storage-option",
        action="append",
        metavar="KEY=VALUE",
        help="object-store setting for URL sources (repeatable), as ParquetStream's "
        "storage_options",
    )
    p.add_argument("--json", action="store_true", help="machine-readable output")
    p.set_defaults(run=_run_inspect)


def _storage_options(items: Sequence[str] | None) -> dict[str, str] | None:
    if not items:
        return None
    out = {}
    for item in items:
        key, sep, value = item.partition("=")
        if not sep or not key:
            raise ValueError(f"--storage-option expects KEY=VALUE, got {item!r}")
        out[key] = value
    return out


# --------------------------------------------------------------------------- state

_TORCH_LEGACY_MAGIC = 0x1950A86A20F9469CFC6C  # first pickle of a legacy (non-zip) torch.save


class _PlainUnpickler(pickle.Unpickler):
    """Unpickles built-in containers and scalars only: a state is plain data, and pickle
    files from elsewhere must not run code."""

    def find_class(self, module: str, name: str) -> Any:
        raise pickle.UnpicklingError(
            f"refusing to load {module}.{name}: only plain built-in types are read from pickle "
            "files (a shardstream state holds nothing else)"
        )


def load_state_file(path: str) -> tuple[Any, str]:
    """Load a saved object: ``torch.save`` (with ``weights_only=True``), JSON, or a pickle of
    plain built-ins; a ``torch.distributed.checkpoint`` directory too. Returns
    ``(object, kind)``.

    Raises:
        CliError: missing, unreadable or of none of these formats.
    """
    if os.path.isdir(path):
        if os.path.exists(os.path.join(path, ".metadata")):
            return _load_dcp(path), "torch.distributed.checkpoint"
        raise CliError(f"{path}: is a directory (expected a state file or a DCP checkpoint)")
    try:
        with open(path, "rb") as f:
            head = f.read(512)
    except FileNotFoundError:
        raise CliError(f"{path}: no such file") from None
    except OSError as e:
        raise CliError(f"{path}: cannot read: {e.strerror or e}") from None
    if head.startswith(b"PK\x03\x04"):  # torch.save's zip format
        # mmap: tensors of a large training checkpoint are mapped, not read.
        return _torch_load(path, mmap=True), "torch.save"
    if head.lstrip()[:1] in (b"{", b"["):
        try:
            with open(path, encoding="utf-8") as f:
                return json.load(f), "json"
        except (ValueError, UnicodeDecodeError) as e:
            raise CliError(f"{path}: not valid JSON: {e}") from None
    if head[:1] == b"\x80":  # pickle protocol >= 2 (also legacy torch.save)
        try:
            with open(path, "rb") as f:
                obj = _PlainUnpickler(f).load()
        except pickle.UnpicklingError as e:
            raise CliError(f"{path}: {e}") from None
        except Exception as e:
            raise CliError(f"{path}: not a readable pickle: {type(e).__name__}: {e}") from None
        if obj == _TORCH_LEGACY_MAGIC and type(obj) is int:
            return _torch_load(path), "torch.save (legacy format)"
        return obj, "pickle"
    raise CliError(
        f"{path}: not a state file (expected torch.save, JSON or pickle; the file starts with "
        f"{head[:16]!r})"
    )


def _torch_load(path: str, mmap: bool = False) -> Any:
    try:
        import torch
    except ImportError:
        raise CliError(f"{path}: a torch.save file; reading it needs torch installed") from None
    try:
        return torch.load(path, weights_only=True, map_location="cpu", mmap=mmap)
    except Exception as e:
        first = str(e).strip().splitlines()[0] if str(e).strip() else type(e).__name__
        raise CliError(f"{path}: torch.load(weights_only=True) failed: {first[:300]}") from None


def _load_dcp(path: str) -> Any:
    """A DCP checkpoint directory as one nested dict (no process group needed)."""
    import tempfile

    try:
        from torch.distributed.checkpoint.format_utils import dcp_to_torch_save
    except ImportError:
        raise CliError(f"{path}: a DCP checkpoint; reading it needs torch installed") from None
    with tempfile.TemporaryDirectory(prefix="shardstream-dcp-") as tmp:
        out = os.path.join(tmp, "ckpt.pt")
        try:
            with warnings.catch_warnings():  # "no process group: single process" notes
                warnings.simplefilter("ignore")
                dcp_to_torch_save(path, out)
        except Exception as e:
            raise CliError(f"{path}: cannot read the DCP checkpoint: {e}") from None
        return _torch_load(out)


def find_states(obj: Any) -> list[tuple[str, dict[str, Any]]]:
    """Every shardstream state inside ``obj`` with where it was found (``"[key][0]..."``);
    the same states, in the same order, as ``shardstream.state.gather``."""
    from . import state as _state

    found: list[tuple[str, dict[str, Any]]] = []

    def walk(o: Any, where: str) -> None:
        if isinstance(o, dict):
            g = _state.gather(o)
            if len(g) == 1 and g[0] is o:
                found.append((where, o))
                return
            for k, v in o.items():
                walk(v, f"{where}[{k!r}]")
        elif isinstance(o, (list, tuple)):
            for i, v in enumerate(o):
                walk(v, f"{where}[{i}]")

    walk(obj, "")
    expected = _state.gather(obj)
    if [id(s) for _, s in found] != [id(s) for s in expected]:  # pragma: no cover - defensive
        return [(f"#{i}", s) for i, s in enumerate(expected)]
    return found


def _d(x: Any) -> dict[str, Any]:
    return x if isinstance(x, dict) else {}


def _nonneg_int(x: Any) -> int | None:
    return x if isinstance(x, int) and not isinstance(x, bool) and x >= 0 else None


def describe_state(st: dict[str, Any]) -> dict[str, Any]:
    """A readable summary of one state (JSON-able). Tolerates versions 1 and 2 and reports
    what it cannot read in ``problems`` instead of failing.

    Keys: ``format``, ``version``, ``epoch``, ``first_epoch``, ``epochs``, ``emitted`` (rows
    this slot yielded in the epoch), ``cursor``, ``slot`` (``index``/``count``/``even``),
    ``rows_per_epoch`` (this slot's, approximate: fingerprint rows / slot count),
    ``percent`` (of that), ``buffer_rows``, ``skips`` (records), ``skipped_rows``,
    ``settings``, ``fingerprint``, ``seek``, ``elastic_specs``, ``started``, ``problems``.
    """
    problems: list[str] = []
    fmt, version = st.get("format"), st.get("version")
    from .state import FORMAT

    if fmt != FORMAT:
        problems.append(f"format is {fmt!r}, expected {FORMAT!r}")
    if version not in (1, 2):
        problems.append(f"version {version!r} is not one this command knows (1, 2)")
    fp, settings = _d(st.get("fingerprint")), _d(st.get("settings"))
    slot_d = st.get("slot")
    slot = None
    if isinstance(slot_d, dict):
        slot = {k: slot_d.get(k) for k in ("index", "count", "even")}
    elif slot_d is not None:
        problems.append(f"slot is a {type(slot_d).__name__}, expected a dict")
    pos = st.get("position")
    started = isinstance(pos, dict)
    if pos is not None and not started:
        problems.append(f"position is a {type(pos).__name__}, expected a dict")
    pos = _d(pos)
    epoch = pos.get("epoch") if started else st.get("first_epoch")
    emitted = pos.get("emitted", 0) if started else 0
    cursor = pos.get("cursor", 0) if started else 0
    buffer_rows = 0
    if started:
        try:
            raw = base64.b64decode(pos.get("buffer", ""), validate=True)
            buffer_rows = len(raw) // 8
        except (binascii.Error, ValueError, TypeError):
            problems.append("position['buffer'] is not valid base64")
    rows = _nonneg_int(fp.get("rows"))
    count = _nonneg_int(slot["count"]) if slot else None
    if slot is None:
        count = None
    rows_per_epoch = rows / count if rows is not None and count else None
    percent = None
    if rows_per_epoch and _nonneg_int(emitted) is not None:
        percent = round(100.0 * emitted / rows_per_epoch, 2)
    elif rows_per_epoch == 0:
        percent = 100.0
    skips_raw = st.get("skips", [])
    skips: list[dict[str, Any]] = []
    skipped = 0
    if isinstance(skips_raw, list):
        for rec in skips_raw:
            r = _d(rec)
            skips.append(r)
            a, b = _nonneg_int(r.get("start")), _nonneg_int(r.get("stop"))
            if a is not None and b is not None and b >= a:
                skipped += b - a
            else:
                problems.append(f"skip record {rec!r} has no valid [start, stop)")
    else:
        problems.append(f"skips is a {type(skips_raw).__name__}, expected a list")
    specs = pos.get("specs") if started else None
    return {
        "format": fmt,
        "version": version,
        "started": started,
        "epoch": epoch,
        "first_epoch": st.get("first_epoch"),
        "epochs": settings.get("epochs"),
        "emitted": emitted,
        "cursor": cursor,
        "slot": slot,
        "rows_per_epoch": None if rows_per_epoch is None else round(rows_per_epoch, 1),
        "percent": percent,
        "buffer_rows": buffer_rows,
        "skips": skips,
        "skipped_rows": skipped,
        "settings": settings,
        "fingerprint": fp,
        "seek": pos.get("seek") if started else None,
        "elastic_specs": len(specs) if isinstance(specs, list) else 0,
        "problems": problems,
    }


# ParquetStream arguments a state's "settings" carry (anything else in them is ignored here).
_SETTINGS_ARGS = ("seed", "shuffle_buffer", "batch_size", "drop_last", "epochs", "even")


def check_states(
    source: Sequence[str], states: Sequence[dict[str, Any]]
) -> tuple[list[str | None], str | None]:
    """Load each state into a ``ParquetStream(source, <the state's settings>)``; return one
    error message (None: it matches) per state, and for several states the error of loading
    them all together (what an elastic resume does), or None.

    Raises:
        FileNotFoundError, ShardError, SchemaError: ``source`` itself is unusable.
    """
    from . import ParquetStream
    from .errors import StateError

    streams: dict[str, Any] = {}

    def stream_for(st: dict[str, Any]) -> Any:
        settings = _d(st.get("settings"))
        kwargs = {k: settings[k] for k in _SETTINGS_ARGS if k in settings}
        key = repr(sorted(kwargs.items()))
        if key not in streams:
            try:
                streams[key] = ParquetStream(list(source), output="python", **kwargs)
            except (TypeError, ValueError) as e:
                if isinstance(e, StateError):
                    raise
                return f"the state's settings are invalid: {e}"
        return streams[key]

    errors: list[str | None] = []
    for st in states:
        ds = stream_for(st)
        if isinstance(ds, str):
            errors.append(ds)
            continue
        try:
            ds.load_state_dict(st)
            errors.append(None)
        except StateError as e:
            errors.append(str(e))
    together = None
    if len(states) > 1 and all(e is None for e in errors):
        ds = stream_for(states[0])
        try:
            ds.load_state_dict(list(states))
        except StateError as e:
            together = str(e)
    return errors, together


def _fmt_opt(x: Any, spec: str = ",") -> str:
    return "?" if x is None else format(x, spec) if isinstance(x, (int, float)) else str(x)


def _state_lines(d: dict[str, Any], error: Any) -> list[tuple[str, str]]:
    lines: list[tuple[str, str]] = [("format", f"{d['format']} version {d['version']}")]
    add = lines.append
    slot = d["slot"]
    if slot is None:
        add(("slot", "none (nothing read yet)"))
    else:
        where = "slot = rank * num_workers + worker_id"
        add(("slot", f"{slot['index']} of {slot['count']} (even: {slot['even']}; {where})"))
    epochs = "endless" if d["epochs"] is None else d["epochs"]
    first = _fmt_opt(d["first_epoch"])
    add(("epoch", f"{_fmt_opt(d['epoch'])} (the pass starts at {first}; epochs: {epochs})"))
    if d["started"]:
        pct = "?" if d["percent"] is None else f"{d['percent']:.1f}%"
        per = _fmt_opt(None if d["rows_per_epoch"] is None else round(d["rows_per_epoch"]))
        approx = " (after an elastic resume: approximate)" if d["elastic_specs"] else ""
        emitted = _fmt_opt(d["emitted"])
        add(("position", f"{emitted} rows yielded this epoch = {pct} of ~{per} rows{approx}"))
        size = _fmt_opt(d["settings"].get("shuffle_buffer"))
        cursor = _fmt_opt(d["cursor"])
        add(("buffer", f"{d['buffer_rows']:,} of {size} rows (rows read: {cursor})"))
        seek = _d(d["seek"])
        if seek:
            rg, row, off = (_fmt_opt(seek.get(k)) for k in ("row_group", "row", "byte_offset"))
            add(("seek", f"{seek.get('shard')} row group {rg}, row {row} (byte offset {off})"))
    else:
        add(("position", "not started (resumes at the start of the epoch)"))
    if d["skips"]:
        recs = "; ".join(
            f"epoch {r.get('epoch')} slot {r.get('slot')} rows [{r.get('start')}, {r.get('stop')})"
            for r in d["skips"][:5]
        )
        more = f"; and {len(d['skips']) - 5} more" if len(d["skips"]) > 5 else ""
        add(("skips", f"{len(d['skips'])} ({d['skipped_rows']:,} rows): {recs}{more}"))
    else:
        add(("skips", "none (version 1 state: not recorded)" if d["version"] == 1 else "none"))
    add(("settings", " ".join(f"{k}={v!r}" for k, v in d["settings"].items())))
    add(("fingerprint", " ".join(f"{k}={_short(v)}" for k, v in d["fingerprint"].items())))
    lines.extend(("problem", p) for p in d["problems"])
    if error is not _UNCHECKED:
        add(("source", "matches" if error is None else f"DOES NOT MATCH: {error}"))
    return lines


def _print_state(where: str, i: int, n: int, d: dict[str, Any], error: Any) -> None:
    print(f"state {i + 1} of {n}" + (f" at {where}" if where else ""))
    lines = _state_lines(d, error)
    w = max(len(k) for k, _ in lines)
    for k, v in lines:
        print(f"  {k.ljust(w)}  {v}")


def _short(v: Any) -> str:
    if isinstance(v, int) and not isinstance(v, bool):
        return f"{v:,}"
    s = str(v)
    return s if len(s) <= 40 else f"{s[:16]}...({len(s)} chars)"


_UNCHECKED = object()


def _run_state(args: argparse.Namespace) -> int:
    obj, kind = load_state_file(args.file)
    found = find_states(obj)
    if not found:
        raise CliError(
            f"{args.file}: no shardstream state in this {kind} file (looked for dicts with "
            "'format': 'shardstream.ParquetStream' at any depth)"
        )
    states = [s for _, s in found]
    described = [describe_state(s) for s in states]
    errors: list[Any] = [_UNCHECKED] * len(states)
    together: str | None = None
    if args.source:
        errors, together = check_states(args.source, states)
    bad = args.source is not None and (any(e is not None for e in errors) or together is not None)
    if args.json:
        out: dict[str, Any] = {"file": args.file, "kind": kind, "states": []}
        for (where, _), d, e in zip(found, described, errors, strict=True):
            item = {"where": where, **d}
            if args.source:
                item["matches_source"] = e is None
                item["source_error"] = e
            out["states"].append(item)
        if args.source:
            out["source"] = list(args.source)
            out["all_match"] = not bad
            out["together_error"] = together
        _emit_json(out)
    else:
        print(f"{args.file}: {kind}, {len(states)} shardstream state(s)")
        for i, ((where, _), d, e) in enumerate(zip(found, described, errors, strict=True)):
            print()
            _print_state(where, i, len(states), d, e)
        if args.source:
            print()
            if len(states) > 1:
                print(
                    f"all {len(states)} states together (an elastic resume loads them all): "
                    + ("match" if together is None and not bad else f"{together or 'see above'}")
                )
            src = " ".join(args.source)
            print(f"source {src}: " + ("OK, the state(s) can be loaded" if not bad else "MISMATCH"))
    return 1 if bad else 0


def _add_state(sub: Any) -> None:
    p = sub.add_parser(
        "state",
        help="show a saved state (torch.save / JSON / pickle) readably; check it against data",
        description="Show every shardstream state inside FILE (a torch.save checkpoint, loaded "
        "with weights_only=True; JSON; a pickle of plain built-ins; or a torch.distributed."
        "checkpoint directory): epoch, rows yielded, position in the epoch, slot, shuffle "
        "buffer fill, skips, settings and fingerprint. With --source, also check that the "
        "state can be loaded over SOURCE (exit status 1 if not).",
    )
    p.add_argument("file", metavar="FILE")
    p.add_argument(
        "--source", nargs="+", metavar="SOURCE", help="check the state(s) against this data"
    )
    p.add_argument("--json", action="store_true", help="machine-readable output")
    p.set_defaults(run=_run_state)


# --------------------------------------------------------------------------- demo, bench


def _add_demo(sub: Any) -> None:
    from . import demo

    p = sub.add_parser(
        "demo",
        help="generate shards, interrupt a DataLoader mid-epoch, resume it in a new process "
        "and verify the stream is identical",
        description=(demo.__doc__ or "").strip(),
        formatter_class=argparse.RawDescriptionHelpFormatter,
    )
    demo.add_arguments(p)
    p.set_defaults(run=demo.run)


def _add_bench(sub: Any) -> None:
    from . import quickbench

    p = sub.add_parser(
        "bench",
        help="quick side-by-side on generated data: shardstream vs pyarrow (seconds)",
        description=(quickbench.__doc__ or "").strip(),
        formatter_class=argparse.RawDescriptionHelpFormatter,
    )
    quickbench.add_arguments(p)
    p.set_defaults(run=quickbench.run)


# --------------------------------------------------------------------------- index


def _run_index(args: argparse.Namespace) -> int:
    import time

    from . import index
    from ._core import RawCatalog

    t0 = time.perf_counter()
    path = index.write_index(args.source)
    cat = RawCatalog([os.fspath(s) for s in args.source])
    info = {"index": path, "shards": len(cat.shard_paths), "rows": cat.num_rows}
    info["seconds"] = round(time.perf_counter() - t0, 3)
    if args.json:
        _emit_json(info)
    else:
        print(f"wrote {path}: {info['shards']:,} shards, {info['rows']:,} rows")
    return 0


def _add_index(sub: Any) -> None:
    from . import index

    p = sub.add_parser(
        "index",
        help="write the metadata sidecar so large shard sets open without reading every footer",
        description=(index.__doc__ or "").split("Example:")[0].strip(),
        formatter_class=argparse.RawDescriptionHelpFormatter,
    )
    p.add_argument("source", nargs="+", metavar="SOURCE", help="file, directory or glob")
    p.add_argument("--json", action="store_true", help="machine-readable output")
    p.set_defaults(run=_run_index)


# --------------------------------------------------------------------------- main

#: Subparser registrations, in ``--help`` order. Each takes the subparsers action.
COMMANDS: list[Callable[[Any], None]] = [
    _add_inspect,
    _add_state,
    _add_index,
    _add_demo,
    _add_bench,
]


class _Version(argparse.Action):
    def __init__(self, option_strings: list[str], dest: str, **kw: Any) -> None:
        super().__init__(option_strings, dest, nargs=0, help="print the version and exit")

    def __call__(self, parser: Any, namespace: Any, values: Any, option: Any = None) -> None:
        from . import _core

        print(f"{PROG} {_core.__version__} ({os.path.dirname(os.path.abspath(_core.__file__))})")
        parser.exit()


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(
        prog=PROG,
        description="Exact, O(1) resume for PyTorch training streams over plain Parquet shards.",
        epilog="Exit status: 0 ok, 1 a check failed, 2 bad command line or input. "
        f"'{PROG} COMMAND --help' for a command's options.",
    )
    parser.add_argument("--version", action=_Version)
    sub = parser.add_subparsers(dest="command", metavar="COMMAND")
    sub.required = True
    for add in COMMANDS:
        add(sub)
    return parser


def main(argv: list[str] | None = None) -> int:
    """Run the command line; returns the exit status (argparse exits 2 on bad usage)."""
    from .errors import ShardstreamError

    parser = build_parser()
    args = parser.parse_args(argv)
    where = f"{PROG} {args.command}"
    try:
        return int(args.run(args) or 0)
    except CliError as e:
        print(f"{where}: error: {e}", file=sys.stderr)
        return e.code
    except (ShardstreamError, OSError, ValueError) as e:
        if isinstance(e, BrokenPipeError):
            _quiet_broken_pipe()
            return 0
        # FileNotFoundError, ShardError, SchemaError, ... already name the path.
        print(f"{where}: error: {e}", file=sys.stderr)
        return 2
    except KeyboardInterrupt:
        print(f"{where}: interrupted", file=sys.stderr)
        return 130


def _quiet_broken_pipe() -> None:
    """``shardstream inspect ... | head``: stop quietly, without Python's flush error at exit."""
    try:
        devnull = os.open(os.devnull, os.O_WRONLY)
        os.dup2(devnull, sys.stdout.fileno())
    except (OSError, ValueError, io.UnsupportedOperation):
        pass


if __name__ == "__main__":  # pragma: no cover
    sys.exit(main())
