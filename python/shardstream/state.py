"""The saved-state envelope: versioned, plain built-ins, strict on load.

A state is a ``dict`` that ``torch.save``/``torch.load(weights_only=True)``, ``pickle`` and
``torch.distributed.checkpoint`` all accept::

    {
      "format": "shardstream.ParquetStream",
      "version": 2,
      "fingerprint": {"shards": int, "rows": int, "paths": hex, "content": hex,
                      "buckets": base64},  # see rust/core/src/catalog.rs
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
      "skips": [{"epoch": int, "slot": [int, int], "start": int, "stop": int}, ...],
    }

``slot`` is ``rank * num_workers + worker_id`` of ``world_size * num_workers``. ``specs`` is
empty except after an elastic resume, where it lists what this slot reads of the epochs that
the old layout had not finished (rust/core/src/elastic.rs). ``seek`` records where a resume
reads first (shard relative to the dataset root, row group, row in it, the row group's byte
offset); it is derived from the position and checked against it on load.

``skips`` records every ``skip()`` this run (and the runs it resumed from) applied: rows
``[start, stop)`` of epoch ``epoch``'s stream of slot ``slot = [index, count]`` were passed over
without being yielded. It is history, so a checkpoint says what the model did not see, and it
lets a re-run from an earlier checkpoint apply the same skips (``ParquetStream.replay_skips``).

``position`` is the Rust core's ``SlotState`` (see rust/core/src/state.rs): row coordinates
only, 8 bytes per buffered row (little-endian u64 row ids, base64), nothing that depends on
row width. The core validates it on load; this module checks the envelope and says exactly
what differs when a state does not belong here.
"""

from __future__ import annotations

import reprlib
from collections.abc import Callable
from typing import Any, NamedTuple

from .errors import ShardsChangedError, StateError

FORMAT = "shardstream.ParquetStream"
VERSION = 2

KEY_FORMAT = "format"
KEY_VERSION = "version"
KEY_FINGERPRINT = "fingerprint"
KEY_SETTINGS = "settings"
KEY_FIRST_EPOCH = "first_epoch"
KEY_SLOT = "slot"
KEY_POSITION = "position"
KEY_SKIPS = "skips"
KEYS = (
    KEY_FORMAT,
    KEY_VERSION,
    KEY_FINGERPRINT,
    KEY_SETTINGS,
    KEY_FIRST_EPOCH,
    KEY_SLOT,
    KEY_POSITION,
    KEY_SKIPS,
)

FINGERPRINT_KEYS = ("shards", "rows", "paths", "content", "buckets")
SETTINGS_KEYS = ("seed", "shuffle_buffer", "batch_size", "drop_last", "epochs", "even")
SLOT_KEYS = ("index", "count", "even")
SKIP_KEYS = ("epoch", "slot", "start", "stop")
EVEN_MODES = ("off", "drop", "pad")

Slot = tuple[int, int, str]  # (index, count, even policy the layout ran with)


def make(
    fingerprint: dict[str, Any],
    settings: dict[str, Any],
    first_epoch: int,
    slot: Slot | None,
    position: dict[str, Any] | None,
    skips: list[dict[str, Any]] | None = None,
) -> dict[str, Any]:
    return {
        KEY_FORMAT: FORMAT,
        KEY_VERSION: VERSION,
        KEY_FINGERPRINT: dict(fingerprint),
        KEY_SETTINGS: dict(settings),
        KEY_FIRST_EPOCH: first_epoch,
        KEY_SLOT: None if slot is None else {"index": slot[0], "count": slot[1], "even": slot[2]},
        KEY_POSITION: position,
        KEY_SKIPS: [dict(k, slot=list(k["slot"])) for k in skips or ()],
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
    return [s for _, s in find_states(obj)]


#: More states than any layout has (ranks x workers); only shared references reach it, in an
#: object built to make listing them take exponential time.
MAX_STATES = 2**20


def find_states(obj: Any) -> list[tuple[str, dict[str, Any]]]:
    """The states of :func:`gather`, each with where it is in ``obj`` as the subscripts that
    reach it (``"['loader'][0]"``; ``""`` for ``obj`` itself).

    Depth first, dict values and list items in order, without recursion (nesting depth is no
    limit). A container inside itself is not entered again; one reached twice by reference is
    listed twice, as loading would see it (walked once if it holds no state).

    Raises:
        StateError: more than ``MAX_STATES`` states.
    """
    found: list[tuple[Any, dict[str, Any]]] = []
    walking: set[int] = set()  # containers being walked: reaching one again is a cycle
    stateless: set[int] = set()  # containers walked before that hold no state
    done = object()  # marks the end of a container's walk on the stack
    stack: list[tuple[Any, Any]] = [(obj, None)]  # (object, where: None | (parent, key))
    while stack:
        o, where = stack.pop()
        if o is done:
            ident, before = where
            walking.discard(ident)
            if len(found) == before:
                stateless.add(ident)
            continue
        if isinstance(o, dict):
            # Any of our top-level keys marks a (maybe broken) state: check() then says what
            # is wrong.
            if KEY_FORMAT in o or (KEY_POSITION in o and KEY_FINGERPRINT in o) or KEY_SETTINGS in o:
                if len(found) == MAX_STATES:
                    raise StateError(f"more than {MAX_STATES} shardstream states in one object")
                found.append((where, o))
                continue
            items: list[tuple[Any, Any]] = list(o.items())
        elif isinstance(o, (list, tuple)):
            items = list(enumerate(o))
        else:
            continue
        ident = id(o)
        if ident in walking or ident in stateless:
            continue
        walking.add(ident)
        stack.append((done, (ident, len(found))))
        stack.extend((v, (where, k)) for k, v in reversed(items))
    return [(_where(w), s) for w, s in found]


def _where(node: Any) -> str:
    keys = []
    while node is not None:
        node, k = node
        keys.append(repr(k) if isinstance(k, (str, int)) else reprlib.repr(k))
    return "".join(f"[{k}]" for k in reversed(keys))


class Checked(NamedTuple):
    first_epoch: int
    slot: Slot | None
    position: dict[str, Any] | None
    #: The shards changed since the state was saved (only with ``allow_changed``).
    changed: bool


def _changed_shards(
    saved: dict[str, Any],
    now: dict[str, Any],
    changes: Callable[[str], dict[str, Any]] | None,
) -> StateError:
    """The error for a fingerprint mismatch: another shard set, or the same one changed (then
    naming the shards, from the per-bucket digests)."""
    if not isinstance(saved.get("buckets"), str) or changes is None:
        return StateError(f"state's fingerprint {saved} does not match this dataset's {now}")
    try:
        diff = changes(saved["buckets"])
    except StateError as e:
        return StateError(f"state's fingerprint is malformed: {e}")
    added, changed, removed = diff["added"], diff["changed"], diff["removed_buckets"]
    if (
        saved["paths"] != now["paths"]
        and now["shards"] > 1
        and len(added) + len(changed) >= now["shards"]
    ):
        # No shard of this dataset is where the state's digests expect it: other data.
        return StateError(
            "state belongs to a different shard set: it was saved over "
            f"{saved['shards']} shards (paths digest {saved['paths']}), this dataset has "
            f"{now['shards']} shards (paths digest {now['paths']})"
        )
    parts = []
    if changed:
        parts.append(f"modified or replaced: {_names(changed)}")
    if added:
        parts.append(f"added: {_names(added)}")
    if removed or saved["shards"] > now["shards"]:
        gone = max(removed, saved["shards"] - now["shards"] - len(added))
        parts.append(f"removed or renamed: {gone} shard(s) (the state does not store their paths)")
    if not parts:  # digests collide or only the totals differ
        parts.append("the shards' sizes, row counts or footers differ")
    return ShardsChangedError(
        "shards changed since the state was saved "
        f"(then {saved['shards']} shards / {saved['rows']} rows, now {now['shards']} / "
        f"{now['rows']}): " + "; ".join(parts) + ". To continue anyway, pass "
        "load_state_dict(..., allow_changed_shards=True): the epoch and the rows already "
        "yielded in it are kept, the rest of that epoch is read from the new data",
        added,
        changed,
        removed,
    )


def _names(paths: list[str], limit: int = 10) -> str:
    more = f" and {len(paths) - limit} more" if len(paths) > limit else ""
    return ", ".join(paths[:limit]) + more


def check(
    state: Any,
    fingerprint: dict[str, Any],
    settings: dict[str, Any],
    *,
    changes: Callable[[str], dict[str, Any]] | None = None,
    allow_changed: bool = False,
) -> Checked:
    """Validate ``state`` against this dataset; return (first_epoch, slot, position, changed).

    ``changes(buckets)`` (``RawCatalog.changes_since``) names the shards that differ from the
    saved fingerprint; with ``allow_changed``, changed shards are reported in the result
    instead of raised.

    Raises:
        ShardsChangedError: same dataset, changed shards (names them).
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
    for k in ("shards", "rows"):
        _int(fp[k], f"state['fingerprint']['{k}']")
    for k in ("paths", "content", "buckets"):
        if not isinstance(fp[k], str):
            raise StateError(
                f"state['fingerprint']['{k}'] must be a str, got {type(fp[k]).__name__}"
            )
    shards_changed = None
    if any(fp[k] != fingerprint[k] for k in FINGERPRINT_KEYS):
        shards_changed = _changed_shards(fp, fingerprint, changes)

    st = _exact_keys(state[KEY_SETTINGS], SETTINGS_KEYS, "state['settings']")
    diffs = [
        f"{k}: state has {st[k]!r}, dataset has {settings[k]!r}"
        for k in SETTINGS_KEYS
        if st[k] != settings[k] or type(st[k]) is not type(settings[k])
    ]
    if diffs:
        raise StateError("state was saved with different settings: " + "; ".join(diffs))

    skips(state)
    first_epoch = _int(state[KEY_FIRST_EPOCH], "state['first_epoch']")
    slot_d = state[KEY_SLOT]
    position = state[KEY_POSITION]
    if shards_changed is not None and not (
        allow_changed and isinstance(shards_changed, ShardsChangedError)
    ):
        raise shards_changed  # after the settings: those never pass, changed data may
    changed = shards_changed is not None
    if slot_d is None:
        if position is not None:
            raise StateError("state has a position but no slot")
        return Checked(first_epoch, None, None, changed)
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
    return Checked(first_epoch, (index, count, even), position, changed)


def skips(state: dict[str, Any]) -> list[dict[str, Any]]:
    """The skip records of a state (``check`` validates them), as fresh dicts."""
    records = state.get(KEY_SKIPS)
    if not isinstance(records, list):
        raise StateError(f"state['skips'] must be a list, got {type(records).__name__}")
    out = []
    for i, rec in enumerate(records):
        what = f"state['skips'][{i}]"
        _exact_keys(rec, SKIP_KEYS, what)
        slot = rec["slot"]
        if not isinstance(slot, (list, tuple)) or len(slot) != 2:
            raise StateError(f"{what}['slot'] must be [index, count], got {slot!r}")
        index = _int(slot[0], f"{what}['slot'][0]", maximum=U32_MAX)
        count = _int(slot[1], f"{what}['slot'][1]", minimum=1, maximum=U32_MAX)
        if index >= count:
            raise StateError(f"{what}['slot'] index {index} is not below count {count}")
        start = _int(rec["start"], f"{what}['start']")
        stop = _int(rec["stop"], f"{what}['stop']")
        if stop <= start:
            raise StateError(f"{what} is empty or reversed: start {start}, stop {stop}")
        out.append(
            {
                "epoch": _int(rec["epoch"], f"{what}['epoch']"),
                "slot": [index, count],
                "start": start,
                "stop": stop,
            }
        )
    return out
