"""``shardstream state FILE [--source SOURCE...]``: the shardstream states in a checkpoint,
readable, and whether they load over some data.

Three steps, kept apart: :func:`load_state_file` reads the file without running code from it,
:func:`describe_state` reads one state (and lists what is malformed in it),
:func:`check_states` loads states into a ``ParquetStream`` over the data. A malformed state
is bad input (exit status 2); a well-formed state that does not load over the data is a failed
check (exit status 1).

    >>> import tempfile, shardstream.datagen as dg
    >>> from shardstream import ParquetStream
    >>> d = tempfile.mkdtemp()
    >>> _ = dg.write_shards(d, num_shards=2, rows_per_shard=[300, 200], row_group_size=100)
    >>> ds = ParquetStream(d, batch_size=50, output="python")
    >>> it = iter(ds); _ = next(it); _ = next(it)
    >>> s = describe_state(ds.state_dict())
    >>> s["epoch"], s["emitted"], s["percent"], s["slot"], s["problems"]
    (0, 100, 20.0, {'index': 0, 'count': 1, 'even': 'off'}, [])
    >>> check_states([d], [ds.state_dict()])
    ([None], None)
"""

from __future__ import annotations

import argparse
import io
import json
import os
import pickle
import stat
import warnings
from collections.abc import Sequence
from typing import Any

from .. import _core, _pickle
from .. import state as _state
from ..errors import StateError
from ._common import CliError, emit_json, refuse_special, special_kind

__all__ = ["add_parser", "check_states", "describe_state", "load_state_file"]

# --------------------------------------------------------------------------- loading


def load_state_file(path: str) -> tuple[Any, str]:
    """Load a saved object: ``torch.save`` (with ``weights_only=True``), JSON, or a pickle of
    plain built-ins; a ``torch.distributed.checkpoint`` directory too. Returns
    ``(object, kind)``.

    Raises:
        CliError: missing, unreadable, of none of these formats, or refused (a pickle naming
            a class or function).
    """
    expected = "expected a state file or a DCP checkpoint directory"
    try:
        mode = os.stat(path).st_mode
    except FileNotFoundError:
        raise CliError(f"{path}: no such file") from None
    except (OSError, ValueError) as e:
        raise CliError(f"{path}: cannot read: {getattr(e, 'strerror', None) or e}") from None
    if stat.S_ISDIR(mode):
        meta = os.path.join(path, ".metadata")
        if os.path.lexists(meta):
            refuse_special(meta, "DCP metadata")
            return _load_dcp(path), "torch.distributed.checkpoint"
        raise CliError(f"{path}: is a directory ({expected})")
    # Opening a FIFO waits for a writer (forever); a terminal or socket as well.
    what = special_kind(mode)
    if what is not None:
        raise CliError(f"{path}: not a regular file ({what}); {expected}")
    try:
        with open(path, "rb") as f:
            head = f.read(512)
    except FileNotFoundError:
        raise CliError(f"{path}: no such file") from None
    except OSError as e:
        raise CliError(f"{path}: cannot read: {e.strerror or e}") from None
    # pickle protocol >= 2 starts with 0x80 (so does a legacy torch.save)
    if _pickle.is_torch_zip(head) or head[:1] == b"\x80":
        return _load_pickled(path, zipped=_pickle.is_torch_zip(head))
    if head.lstrip()[:1] in (b"{", b"["):
        try:
            with open(path, encoding="utf-8") as f:
                return json.load(f), "json"
        except RecursionError:
            raise CliError(
                f"{path}: JSON nested too deeply (a state is a few levels deep)"
            ) from None
        except (ValueError, UnicodeDecodeError) as e:
            raise CliError(f"{path}: not valid JSON: {e}") from None
    expected = "expected torch.save, JSON or pickle"
    if not head:
        raise CliError(f"{path}: empty file ({expected})")
    raise CliError(f"{path}: not a state file ({expected}; the file starts with {head[:16]!r})")


def _load_pickled(path: str, *, zipped: bool, mmap: bool = True) -> tuple[Any, str]:
    try:
        # mmap: tensors of a large training checkpoint are mapped, not read.
        return _pickle.load(path, map_location="cpu", mmap=mmap)
    except (_pickle.RefusedPickleError, ImportError) as e:  # they name the file
        raise CliError(str(e)) from None
    except RecursionError:
        raise CliError(
            f"{path}: nested too deeply to load (a state is a few levels deep)"
        ) from None
    except Exception as e:
        what = (
            "torch.load(weights_only=True) failed"
            if zipped
            else "not a readable pickle or torch.save file"
        )
        text = str(e).strip()
        first = f"{type(e).__name__}: {text.splitlines()[0]}" if text else type(e).__name__
        raise CliError(f"{path}: {what}: {first[:300]}") from None


def _load_dcp(path: str) -> Any:
    """A DCP checkpoint directory as one nested dict (no process group needed), read without
    running code from it: torch's own reader unpickles ``.metadata`` and every non-tensor
    entry with plain ``pickle``; here the metadata is read by :class:`_DcpMetadataUnpickler`
    (DCP's metadata classes only) and entries with ``torch.load(weights_only=True)``."""
    try:
        import torch
        from torch.distributed.checkpoint import FileSystemReader
        from torch.distributed.checkpoint.default_planner import _EmptyStateDictLoadPlanner
        from torch.distributed.checkpoint.state_dict_loader import _load_state_dict
    except ImportError:
        raise CliError(f"{path}: a DCP checkpoint; reading it needs torch installed") from None

    # Subclasses made here (torch is optional): the reader's metadata and the planner's entries
    # read safely, everything else as torch does it.
    def read_metadata(self: Any, *args: Any, **kwargs: Any) -> Any:
        # The metadata read and checked below (before the load, which calls this): not twice.
        if getattr(metadata, "storage_meta", None) is None:
            from torch.distributed.checkpoint.metadata import StorageMeta

            metadata.storage_meta = StorageMeta()
        metadata.storage_meta.load_id = self.load_id
        return metadata

    def load_bytes(self: Any, read_item: Any, value: Any) -> None:
        # torch's loads the entry with weights_only=False: load it safely first, and hand
        # torch's placement the re-saved safe object
        obj = torch.load(value, weights_only=True)
        safe = io.BytesIO()
        torch.save(obj, safe)
        safe.seek(0)
        _EmptyStateDictLoadPlanner.load_bytes(self, read_item, safe)

    reader_cls = type("SafeReader", (FileSystemReader,), {"read_metadata": read_metadata})
    planner_cls = type("SafePlanner", (_EmptyStateDictLoadPlanner,), {"load_bytes": load_bytes})

    # The metadata first, here: torch's loader would log a traceback for each failure.
    try:
        with open(os.path.join(path, ".metadata"), "rb") as f:
            metadata = _DcpMetadataUnpickler(f).load()
        if not hasattr(metadata, "state_dict_metadata"):
            raise CliError(f"{path}: its .metadata is not DCP metadata")
    except (CliError, _pickle.RefusedPickleError) as e:
        raise CliError(f"{path}: {e}" if not isinstance(e, CliError) else str(e)) from None
    except Exception as e:
        raise CliError(f"{path}: its .metadata is not readable DCP metadata: {_first(e)}") from None
    # The entries' files, where the reader will open them: a FIFO would block it forever.
    storage = getattr(metadata, "storage_data", None)
    for info in storage.values() if isinstance(storage, dict) else ():
        rel = getattr(info, "relative_path", None)
        if isinstance(rel, str):
            refuse_special(os.path.join(path, rel), "a DCP data file")
    sd: dict[str, Any] = {}
    try:
        with warnings.catch_warnings():  # "no process group: single process" notes
            warnings.simplefilter("ignore")
            reader, planner = reader_cls(path), planner_cls()
            _load_state_dict(sd, storage_reader=reader, planner=planner, no_dist=True)
    except CliError:
        raise
    except _pickle.RefusedPickleError as e:
        raise CliError(f"{path}: {e}") from None
    except BaseException as e:  # DCP's CheckpointException is not an Exception
        if isinstance(e, (KeyboardInterrupt, SystemExit)):
            raise
        # its failures: {rank: (exception, traceback)}; name the first one's exception
        failures = list(getattr(e, "failures", {}).values())
        cause = failures[0][0] if failures and isinstance(failures[0], tuple) else e
        raise CliError(f"{path}: cannot read the DCP checkpoint: {_first(cause)}") from None
    return sd


def _first(e: BaseException) -> str:
    """``Type: first line of the message`` (at most 300 characters)."""
    text = str(e).strip().splitlines()
    return (f"{type(e).__name__}: {text[0]}" if text else type(e).__name__)[:300]


class _DcpMetadataUnpickler(pickle.Unpickler):
    """DCP's ``.metadata``: its dataclasses, ``torch.Size``, dtypes and layouts, paths; any
    other class or function is refused (a pickle can name ``os.system``)."""

    def find_class(self, module: str, name: str) -> Any:
        import torch

        obj = None
        if module.startswith("torch.distributed.checkpoint.") or (module, name) in (
            ("torch", "Size"),
            ("pathlib", "PosixPath"),
            ("pathlib", "PurePosixPath"),
            ("collections", "OrderedDict"),
        ):
            obj = super().find_class(module, name)
            if not isinstance(obj, type):
                obj = None
        elif module == "torch" and isinstance(getattr(torch, name, None), torch.dtype):
            obj = getattr(torch, name)
        elif (module, name) == ("torch.serialization", "_get_layout"):
            obj = super().find_class(module, name)
        if obj is None:
            raise _pickle.RefusedPickleError(
                f"refusing to load {module}.{name} from the DCP metadata: only DCP's own "
                "metadata classes are read"
            )
        return obj


# --------------------------------------------------------------------------- describe

_FIELDS = (
    "format",
    "version",
    "started",
    "epoch",
    "first_epoch",
    "epochs",
    "emitted",
    "cursor",
    "slot",
    "rows_per_epoch",
    "percent",
    "buffer_rows",
    "skips",
    "skipped_rows",
    "settings",
    "fingerprint",
    "seek",
    "elastic_specs",
)


def describe_state(st: dict[str, Any]) -> dict[str, Any]:
    """A readable summary of one state (JSON-able). The core parses it, exactly as a load
    would (``_core.parse_states``); if it is malformed, ``problems`` holds the core's message
    (naming the field) and the other keys are None.

    A mixture's state (``shardstream.Mixture``) has the keys ``format``, ``version``,
    ``started``, ``slot``, ``items`` (this slot's), ``left`` (items it may still yield),
    ``set_epoch`` (the epoch ``set_epoch`` gave the pass, or None), ``settings``, ``weights``
    (as fractions), ``sources`` (per source: ``items`` taken, ``active``, ``epoch``,
    ``emitted``, ``cursor``, ``buffer_rows``, ``percent``, ``settings``, ``policy``),
    ``removed`` (per removed source, how many of its states this one holds),
    ``removed_spread`` (the removed sources whose position is spread over every slot's state:
    they left at a resize, and adding one back needs every slot's state) and ``problems``.

    A map-style sampler's state (``shardstream.Sampler``): see :func:`_describe_sampler`.

    Keys of a stream's state: ``format``, ``version``, ``epoch``, ``first_epoch``, ``epochs``,
    ``emitted`` (rows this slot yielded in the epoch), ``cursor``, ``slot``
    (``index``/``count``/``even``),
    ``rows_per_epoch`` (this slot's, approximate: fingerprint rows / slot count),
    ``percent`` (of that), ``buffer_rows``, ``skips`` (records), ``skipped_rows``,
    ``settings``, ``fingerprint``, ``seek``, ``elastic_specs``, ``started``, ``problems``.
    """
    if isinstance(st, dict) and st.get("format") == _core.SAMPLER_FORMAT:
        return _describe_sampler(st)
    try:
        (parsed,) = _core.parse_states([st])
    except StateError as e:
        msg = str(e)
        msg = msg if len(msg) <= 300 else f"{msg[:150]}...{msg[-150:]}"
        return {**dict.fromkeys(_FIELDS), "problems": [msg]}
    if parsed["format"] == _core.MIXTURE_FORMAT:
        return _describe_mixture(parsed)
    return _describe_stream(parsed)


def _describe_sampler(st: dict[str, Any]) -> dict[str, Any]:
    """A map-style sampler's state (``shardstream.Sampler``), checked as its sampler's load
    checks it: ``format``, ``version``, ``epoch``, ``position`` (global, of ``rows``),
    ``percent``, ``skips``, ``skipped_rows``, ``settings``, ``problems``."""
    settings = st.get("settings")
    try:
        if not isinstance(settings, dict):
            raise StateError("state['settings'] must be a dict")
        args = {k: settings.get(k) for k in ("rows", "seed", "shuffle", "block_size", "window")}
        if args["window"] is None:  # a global shuffle's state: the sampler's default window
            args["window"] = _core.DEFAULTS["window"]
        raw = _core.RawSampler(
            **args,
            rank=0,
            world_size=1,
            even=None,
        )
        raw.load([st])
    except (StateError, TypeError, ValueError) as e:
        msg = str(e)
        msg = msg if len(msg) <= 300 else f"{msg[:150]}...{msg[-150:]}"
        return {**dict.fromkeys(_FIELDS), "problems": [msg]}
    rows, pos = int(settings["rows"]), int(st["position"])
    return {
        "format": st["format"],
        "version": st["version"],
        "epoch": st["epoch"],
        "position": pos,
        "rows": rows,
        "percent": 100.0 * pos / rows if rows else None,
        "skips": st["skips"],
        "skipped_rows": sum(int(r["stop"]) - int(r["start"]) for r in st["skips"]),
        "settings": settings,
        "problems": [],
    }


def _sampler_lines(d: dict[str, Any]) -> list[tuple[str, str]]:
    pct = "" if d["percent"] is None else f" ({d['percent']:.1f}%)"
    return [
        ("format", f"{d['format']} version {d['version']} (a map-style ResumableSampler)"),
        ("position", f"epoch {d['epoch']}, {d['position']:,} of {d['rows']:,} positions{pct}"),
        ("skips", f"{len(d['skips'])} record(s), {d['skipped_rows']:,} positions"),
        ("settings", " ".join(f"{k}={v!r}" for k, v in d["settings"].items())),
    ]


def _describe_stream(parsed: dict[str, Any]) -> dict[str, Any]:
    pos, slot = parsed["position"], parsed["slot"]
    started = pos is not None
    rows = parsed["fingerprint"]["rows"]
    rows_per_epoch = rows / slot["count"] if slot else None
    emitted = pos["emitted"] if started else 0
    percent = None
    if rows_per_epoch:
        percent = round(100.0 * emitted / rows_per_epoch, 2)
    elif rows_per_epoch == 0:
        percent = 100.0
    return {
        "format": parsed["format"],
        "version": parsed["version"],
        "started": started,
        "epoch": pos["epoch"] if started else parsed["first_epoch"],
        "first_epoch": parsed["first_epoch"],
        "epochs": parsed["settings"]["epochs"],
        "emitted": emitted,
        "cursor": pos["cursor"] if started else 0,
        "slot": slot,
        "rows_per_epoch": None if rows_per_epoch is None else round(rows_per_epoch, 1),
        "percent": percent,
        # Latin-1 text, one character per byte, 8 per row id (`parse_states` upgrades a
        # version-2 state's base64 to it).
        "buffer_rows": len(pos["buffer"]) // 8 if started else 0,
        "skips": parsed["skips"],
        "skipped_rows": sum(r["stop"] - r["start"] for r in parsed["skips"]),
        "settings": parsed["settings"],
        "fingerprint": parsed["fingerprint"],
        "seek": pos["seek"] if started else None,
        "elastic_specs": len(pos["specs"]) if started else 0,
        "problems": [],
    }


def _describe_mixture(parsed: dict[str, Any]) -> dict[str, Any]:
    """A mixture state (already parsed by the core): its mixer and, per source, the source's
    own summary (:func:`describe_state` of its stream state) plus ``items`` taken from it and
    whether it is still ``active`` in the mix."""
    mixer = parsed["mixer"]
    unit = float(2**32)
    sources = {}
    for name, st in parsed["sources"].items():
        d = _describe_stream(st)
        sources[name] = {
            "items": mixer["taken"].get(name, 0) if mixer else 0,
            "active": mixer is None or name in mixer["deficits"],
            "epoch": d["epoch"],
            "emitted": d["emitted"],
            "cursor": d["cursor"],
            "buffer_rows": d["buffer_rows"],
            "percent": d["percent"],
            "settings": d["settings"],
            "policy": parsed["policies"][name],
        }
    return {
        "format": parsed["format"],
        "version": parsed["version"],
        "started": mixer is not None,
        "slot": parsed["slot"],
        "items": mixer["items"] if mixer else 0,
        "left": mixer["left"] if mixer else parsed["settings"]["samples"],
        "set_epoch": parsed.get("epoch"),
        "settings": parsed["settings"],
        "weights": {
            "kind": parsed["weights"]["kind"],
            "points": [
                {"at": p["at"], "weights": {n: w / unit for n, w in p["weights"].items()}}
                for p in parsed["weights"]["points"]
            ],
        },
        "sources": sources,
        "removed": {n: len(v) for n, v in parsed["removed"].items()},
        # Removed sources whose position is not this slot's own state alone (they left at a
        # resize): adding one back needs every slot's state.
        "removed_spread": sorted(
            n
            for n, v in parsed["removed"].items()
            if not (len(v) == 1 and v[0]["slot"] in (None, parsed["slot"]))
        ),
        "problems": [],
    }


def _head_lines(d: dict[str, Any]) -> list[tuple[str, str]]:
    """The format and slot lines every state kind starts with."""
    lines: list[tuple[str, str]] = [("format", f"{d['format']} version {d['version']}")]
    slot = d["slot"]
    if slot is None:
        lines.append(("slot", "none (nothing read yet)"))
    else:
        where = "slot = rank * num_workers + worker_id"
        lines.append(
            ("slot", f"{slot['index']} of {slot['count']} (even: {slot['even']}; {where})")
        )
    return lines


def _mixture_lines(d: dict[str, Any], error: Any) -> list[tuple[str, str]]:
    lines = _head_lines(d)
    add = lines.append
    if not d["started"]:  # no slot yet: `left` is the mixture's samples over all slots
        total = "no limit" if d["left"] is None else f"samples={d['left']:,} over all slots"
        add(("items", f"0 yielded ({total})"))
    else:
        left = "no limit" if d["left"] is None else f"{d['left']:,} left"
        add(("items", f"{d['items']:,} yielded by this slot ({left})"))
    if d["set_epoch"] is not None:
        add(("set_epoch", f"{d['set_epoch']} (the epoch set_epoch gave the pass it was saved in)"))
    pts = d["weights"]["points"]
    desc = "; ".join(
        f"from item {p['at']:,}: " + " ".join(f"{n}={w:.4g}" for n, w in p["weights"].items())
        for p in pts[:4]
    )
    more = f"; and {len(pts) - 4} more points" if len(pts) > 4 else ""
    add(("weights", f"{d['weights']['kind']}: {desc}{more}"))
    for name, s in d["sources"].items():
        pol = s["policy"]
        cap = "" if pol["max_epochs"] is None else f", max_epochs {pol['max_epochs']}"
        state = "active" if s["active"] else "out of the mix"
        pct = "" if s["percent"] is None else f" ({s['percent']:.1f}% of its slot's rows)"
        add(
            (
                f"source {name}",
                f"{s['items']:,} items taken; epoch {s['epoch']}, {s['emitted']:,} rows of it "
                f"yielded{pct}; buffer {s['buffer_rows']:,}; {state} "
                f"(on_exhausted {pol['on_exhausted']}{cap})",
            )
        )
    for name, n in d["removed"].items():
        if name in d["removed_spread"]:
            add(
                (
                    f"removed {name}",
                    f"its position is kept, spread over every slot's state ({n} here: it left "
                    "at a resize): it continues if added back with every slot's state loaded",
                )
            )
        else:
            add(
                (
                    f"removed {name}",
                    f"its position is kept ({n} state(s)): it continues if added back",
                )
            )
    add(("settings", " ".join(f"{k}={v!r}" for k, v in d["settings"].items())))
    if error is not _UNCHECKED:
        add(("source", "matches" if error is None else f"DOES NOT MATCH: {error}"))
    return lines


# --------------------------------------------------------------------------- check


def check_states(
    source: Sequence[str], states: Sequence[dict[str, Any]]
) -> tuple[list[str | None], str | None]:
    """Load each state into a ``ParquetStream(source, <the state's settings>)``; return one
    error message (None: it matches) per state, and for several states the error of loading
    them all together (what an elastic resume does), or None.

    Raises:
        FileNotFoundError, ShardError, SchemaError: ``source`` itself is unusable.
    """
    from .. import Pack, ParquetStream

    streams: dict[str, Any] = {}

    def stream_for(st: dict[str, Any]) -> Any:
        settings = st.get("settings")
        kwargs = dict(settings) if isinstance(settings, dict) else {}
        key = repr(sorted(kwargs.items()))
        if key not in streams:
            try:
                if isinstance(kwargs.get("pack"), dict):  # the Pack's arguments, as saved
                    kwargs["pack"] = Pack(**kwargs["pack"])
                streams[key] = ParquetStream(list(source), output="python", **kwargs)
            except (TypeError, ValueError) as e:
                if isinstance(e, StateError):
                    raise
                return f"the state's settings are invalid: {e}"
        return streams[key]

    errors: list[str | None] = []
    for st in states:
        if st.get("format") == _core.MIXTURE_FORMAT:
            errors.append(
                "a Mixture state: load it into its Mixture (Mixture.load_state_dict) to check "
                "it; --source checks ParquetStream states"
            )
            continue
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


# --------------------------------------------------------------------------- the command


def _fmt_opt(x: Any, spec: str = ",") -> str:
    return "?" if x is None else format(x, spec) if isinstance(x, (int, float)) else str(x)


def _short(v: Any) -> str:
    if isinstance(v, int) and not isinstance(v, bool):
        return f"{v:,}"
    s = str(v)
    return s if len(s) <= 40 else f"{s[:16]}...({len(s)} chars)"


def _clip(s: str, n: int = 200) -> str:
    return s if len(s) <= n else f"{s[: n // 2]}...{s[-n // 2 :]}"


_UNCHECKED = object()


def _state_lines(d: dict[str, Any], error: Any) -> list[tuple[str, str]]:
    lines = _head_lines(d)
    add = lines.append
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
        seek = d["seek"]
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
    if error is not _UNCHECKED:
        add(("source", "matches" if error is None else f"DOES NOT MATCH: {error}"))
    return lines


def _print_state(where: str, i: int, n: int, d: dict[str, Any], error: Any) -> None:
    print(f"state {i + 1} of {n}" + (f" at {where}" if where else ""))
    if d["format"] == _core.SAMPLER_FORMAT:
        lines = _sampler_lines(d)
    elif d["format"] == _core.MIXTURE_FORMAT:
        lines = _mixture_lines(d, error)
    else:
        lines = _state_lines(d, error)
    w = max(len(k) for k, _ in lines)
    for k, v in lines:
        print(f"  {k.ljust(w)}  {v}")


def run(args: argparse.Namespace) -> int:
    obj, kind = load_state_file(args.file)
    try:
        found = _state.find_states(obj)
    except StateError as e:
        raise CliError(f"{args.file}: {e}") from None
    if not found:
        raise CliError(
            f"{args.file}: no shardstream state in this {kind} file (looked for dicts with "
            "'format': 'shardstream.ParquetStream', 'shardstream.Mixture' or "
            "'shardstream.Sampler' at any depth)"
        )
    states = [s for _, s in found]
    described = [describe_state(s) for s in states]
    for i, ((where, _), d) in enumerate(zip(found, described, strict=True)):
        if d["problems"]:
            at = f" at {_clip(where)}" if where else ""
            more = len(d["problems"]) - 1
            also = f" (and {more} more problem{'s' if more > 1 else ''})" if more else ""
            raise CliError(
                f"{args.file}: state {i + 1} of {len(states)}{at} is malformed: "
                f"{d['problems'][0]}{also}"
            )
    errors: list[Any] = [_UNCHECKED] * len(states)
    together: str | None = None
    mixtures = [i + 1 for i, s in enumerate(states) if s.get("format") == _core.MIXTURE_FORMAT]
    samplers = [i + 1 for i, s in enumerate(states) if s.get("format") == _core.SAMPLER_FORMAT]
    if args.source and samplers:
        raise CliError(
            f"{args.file}: state {samplers[0]} of {len(states)} is a map-style sampler's state: "
            "--source checks ParquetStream states against one data set; a sampler's state is "
            "checked by ResumableSampler.load_state_dict; run without --source to show it"
        )
    if args.source and mixtures:
        # Not a mismatch (exit 1): nothing would be checked. A Mixture state names several
        # sources, each with its own data; its Mixture checks it on load.
        raise CliError(
            f"{args.file}: state {mixtures[0]} of {len(states)} is a Mixture state: --source "
            "checks ParquetStream states against one data set; load a Mixture state into its "
            "Mixture (Mixture.load_state_dict) to check it, or run without --source to show it"
        )
    if args.source:
        errors, together = check_states(args.source, states)
    bad = args.source is not None and (any(e is not None for e in errors) or together is not None)
    if args.json:
        out: dict[str, Any] = {"file": args.file, "kind": kind, "states": []}
        for (where, _), d, error in zip(found, described, errors, strict=True):
            item = {"where": where, **d}
            if args.source:
                item["matches_source"] = error is None
                item["source_error"] = error
            out["states"].append(item)
        if args.source:
            out["source"] = list(args.source)
            out["all_match"] = not bad
            out["together_error"] = together
        emit_json(out)
    else:
        print(f"{args.file}: {kind}, {len(states)} shardstream state(s)")
        for i, ((where, _), d, error) in enumerate(zip(found, described, errors, strict=True)):
            print()
            _print_state(where, i, len(states), d, error)
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


def add_parser(sub: Any) -> None:
    p = sub.add_parser(
        "state",
        help="show a saved state (torch.save / JSON / pickle) readably; check it against data",
        description="Show every shardstream state inside FILE (a torch.save checkpoint, loaded "
        "with weights_only=True; JSON; a pickle of plain built-ins; or a torch.distributed."
        "checkpoint directory): epoch, rows yielded, position in the epoch, slot, shuffle "
        "buffer fill, skips, settings and fingerprint; for a Mixture state, each source's "
        "items, epoch and position and the mixer's weights. With --source, also check that "
        "the ParquetStream state(s) can be loaded over SOURCE (exit status 1 if not; a "
        "Mixture state with --source is bad input). A malformed state is bad input (exit "
        "status 2).",
    )
    p.add_argument("file", metavar="FILE")
    p.add_argument(
        "--source", nargs="+", metavar="SOURCE", help="check the state(s) against this data"
    )
    p.add_argument("--json", action="store_true", help="machine-readable output")
    p.set_defaults(run=run)
