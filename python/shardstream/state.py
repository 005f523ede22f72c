"""The saved-state envelope: versioned, plain built-ins, strict on load.

A state is a ``dict`` that ``torch.save``/``torch.load(weights_only=True)``, ``pickle`` and
``torch.distributed.checkpoint`` all accept::

    {
      "format": "shardstream.ParquetStream",
      "version": 1,
      "fingerprint": {"shards": int, "rows": int, "paths": hex, "content": hex},
      "settings": {"seed": int, "shuffle_buffer": int, "batch_size": int | None,
                   "drop_last": bool, "epochs": int | None, "even": str | None},
      "first_epoch": int,            # first epoch of the pass (set_epoch)
      "slot": None | {"index": int, "count": int,       # None: nothing read yet
                      "even": "off" | "drop" | "pad"},  # the policy this layout ran with
      "position": None | {"epoch": int, "cursor": int, "emitted": int,
                          "rng_word_pos": int, "buffer": str,
                          "specs": [{"epoch": int, "ranges": [[int, int], ...],
                                     "injected": str}, ...],
                          "seek": None | {"shard": str, "row_group": int, "row": int,
                                          "byte_offset": int}},
    }

``slot`` is ``rank * num_workers + worker_id`` of ``world_size * num_workers``. ``specs`` is
empty except after an elastic resume, where it lists what this slot reads of the epochs that
the old layout had not finished (rust/core/src/elastic.rs). ``seek`` records where a resume
reads first (shard relative to the dataset root, row group, row in it, the row group's byte
offset); it is derived from the position and checked against it on load.

``position`` is the Rust core's ``SlotState`` (see rust/core/src/state.rs): row coordinates
only, 8 bytes per buffered row (little-endian u64 row ids, base64), nothing that depends on
row width. The core validates it on load; this module checks the envelope and says exactly
what differs when a state does not belong here.
"""

from __future__ import annotations

from typing import Any

from .errors import StateError

FORMAT = "shardstream.ParquetStream"
VERSION = 1

KEY_FORMAT = "format"
KEY_VERSION = "version"
KEY_FINGERPRINT = "fingerprint"
KEY_SETTINGS = "settings"
KEY_FIRST_EPOCH = "first_epoch"
KEY_SLOT = "slot"
KEY_POSITION = "position"
KEYS = (
    KEY_FORMAT,
    KEY_VERSION,
    KEY_FINGERPRINT,
    KEY_SETTINGS,
    KEY_FIRST_EPOCH,
    KEY_SLOT,
    KEY_POSITION,
)

FINGERPRINT_KEYS = ("shards", "rows", "paths", "content")
SETTINGS_KEYS = ("seed", "shuffle_buffer", "batch_size", "drop_last", "epochs", "even")
SLOT_KEYS = ("index", "count", "even")
EVEN_MODES = ("off", "drop", "pad")

Slot = tuple[int, int, str]  # (index, count, even policy the layout ran with)


def make(
    fingerprint: dict[str, Any],
    settings: dict[str, Any],
    first_epoch: int,
    slot: Slot | None,
    position: dict[str, Any] | None,
) -> dict[str, Any]:
    return {
        KEY_FORMAT: FORMAT,
        KEY_VERSION: VERSION,
        KEY_FINGERPRINT: dict(fingerprint),
        KEY_SETTINGS: dict(settings),
        KEY_FIRST_EPOCH: first_epoch,
        KEY_SLOT: None if slot is None else {"index": slot[0], "count": slot[1], "even": slot[2]},
        KEY_POSITION: position,
    }


def _exact_keys(d: Any, keys: tuple[str, ...], what: str) -> dict[str, Any]:
    if not isinstance(d, dict):
        raise StateError(f"{what} must be a dict, got {type(d).__name__}")
    missing = [k for k in keys if k not in d]
    unknown = [k for k in d if k not in keys]
    if missing or unknown:
        parts = []
        if missing:
            parts.append(f"missing {missing}")
        if unknown:
            parts.append(f"unknown {unknown}")
        raise StateError(f"{what} has the wrong keys: " + ", ".join(parts))
    return d


U32_MAX = 2**32 - 1
U64_MAX = 2**64 - 1


def _int(v: Any, what: str, *, minimum: int = 0, maximum: int = U64_MAX) -> int:
    if isinstance(v, bool) or not isinstance(v, int):
        raise StateError(f"{what} must be an int, got {type(v).__name__}")
    if not minimum <= v <= maximum:
        raise StateError(f"{what} must be in [{minimum}, {maximum}], got {v}")
    return v


def gather(obj: Any) -> list[dict[str, Any]]:
    """Every shardstream state inside ``obj``: a state, a list of states (e.g. one per rank), a
    StatefulDataLoader ``state_dict()`` (worker states are nested in it), or lists of those."""
    if isinstance(obj, dict):
        # Any of our top-level keys marks a (maybe broken) state: check() then says what is wrong.
        if (
            KEY_FORMAT in obj
            or (KEY_POSITION in obj and KEY_FINGERPRINT in obj)
            or KEY_SETTINGS in obj
        ):
            return [obj]
        return [s for v in obj.values() for s in gather(v)]
    if isinstance(obj, (list, tuple)):
        return [s for v in obj for s in gather(v)]
    return []


def check(
    state: Any, fingerprint: dict[str, Any], settings: dict[str, Any]
) -> tuple[int, Slot | None, dict[str, Any] | None]:
    """Validate ``state`` against this dataset; return (first_epoch, slot, position).

    Raises:
        StateError: saying what is malformed or what differs.
    """
    if not isinstance(state, dict):
        raise StateError(f"a shardstream state is a dict, got {type(state).__name__}")
    if state.get(KEY_FORMAT) != FORMAT:
        raise StateError(
            f"not a shardstream ParquetStream state ({KEY_FORMAT}={state.get(KEY_FORMAT)!r})"
        )
    version = state.get(KEY_VERSION)
    if version != VERSION:
        raise StateError(
            f"state version {version!r} is not supported: this shardstream reads version {VERSION}"
        )
    _exact_keys(state, KEYS, "state")

    fp = _exact_keys(state[KEY_FINGERPRINT], FINGERPRINT_KEYS, "state['fingerprint']")
    if fp["paths"] != fingerprint["paths"] or fp["shards"] != fingerprint["shards"]:
        raise StateError(
            "state belongs to a different shard set: it was saved over "
            f"{fp['shards']} shards (paths digest {fp['paths']}), this dataset has "
            f"{fingerprint['shards']} shards (paths digest {fingerprint['paths']})"
        )
    if fp["content"] != fingerprint["content"] or fp["rows"] != fingerprint["rows"]:
        raise StateError(
            "shards changed since the state was saved: same paths, but sizes or row counts "
            f"differ (state: {fp['rows']} rows, content digest {fp['content']}; now: "
            f"{fingerprint['rows']} rows, content digest {fingerprint['content']})"
        )

    st = _exact_keys(state[KEY_SETTINGS], SETTINGS_KEYS, "state['settings']")
    diffs = [
        f"{k}: state has {st[k]!r}, dataset has {settings[k]!r}"
        for k in SETTINGS_KEYS
        if st[k] != settings[k] or type(st[k]) is not type(settings[k])
    ]
    if diffs:
        raise StateError("state was saved with different settings: " + "; ".join(diffs))

    first_epoch = _int(state[KEY_FIRST_EPOCH], "state['first_epoch']")
    slot_d = state[KEY_SLOT]
    position = state[KEY_POSITION]
    if slot_d is None:
        if position is not None:
            raise StateError("state has a position but no slot")
        return first_epoch, None, None
    _exact_keys(slot_d, SLOT_KEYS, "state['slot']")
    index = _int(slot_d["index"], "state['slot']['index']", maximum=U32_MAX)
    count = _int(slot_d["count"], "state['slot']['count']", minimum=1, maximum=U32_MAX)
    if index >= count:
        raise StateError(f"state['slot'] index {index} is not below count {count}")
    even = slot_d["even"]
    if even not in EVEN_MODES:
        raise StateError(f"state['slot']['even'] must be one of {EVEN_MODES}, got {even!r}")
    if not isinstance(position, dict):
        raise StateError(f"state['position'] must be a dict, got {type(position).__name__}")
    return first_epoch, (index, count, even), position
