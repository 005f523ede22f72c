"""What a saved state looks like (typing only), and the one walker of nested checkpoints.

The Rust core owns the state: it builds it, parses it strictly and checks it against the
dataset (``rust/core/src/state/envelope.rs``, ``rust/core/src/resume.rs``). The schema is
documented once, in ``docs/state-format.md``; the ``TypedDict``\\ s below describe the same shape
for type checkers and readers of this package, and are never used to validate anything.
"""

from __future__ import annotations

import reprlib
from typing import Any, TypedDict

from ._core import STATE_FORMAT, STATE_VERSION
from .errors import StateError

__all__ = ["FORMAT", "VERSION", "StreamState", "find_states", "gather"]

FORMAT: str = STATE_FORMAT
VERSION: int = STATE_VERSION


class Fingerprint(TypedDict):
    shards: int
    rows: int
    paths: str
    content: str
    buckets: str


class Settings(TypedDict):
    seed: int
    shuffle_buffer: int
    batch_size: int | None
    drop_last: bool
    epochs: int | None
    even: str | None


class Slot(TypedDict):
    index: int
    count: int
    even: str


class Seek(TypedDict):
    shard: str
    row_group: int
    row: int
    byte_offset: int


class Spec(TypedDict):
    epoch: int
    ranges: list[list[int]]
    injected: str


class Position(TypedDict):
    epoch: int
    cursor: int
    emitted: int
    rng_word_pos: int
    buffer: str  # row ids: Latin-1 text of their little-endian u64 bytes (base64 in version 2)
    specs: list[Spec]
    seek: Seek | None


class SkipRecord(TypedDict):
    epoch: int
    slot: list[int]
    start: int
    stop: int


class StreamState(TypedDict):
    """``ParquetStream.state_dict()``: see docs/state-format.md."""

    format: str
    version: int
    fingerprint: Fingerprint
    settings: Settings
    first_epoch: int
    slot: Slot | None
    position: Position | None
    skips: list[SkipRecord]


def _is_state(d: dict[Any, Any]) -> bool:
    # Any of a state's top-level keys marks a (maybe broken) state: loading it says what is wrong.
    return "format" in d or ("position" in d and "fingerprint" in d) or "settings" in d


#: More states than any layout has (ranks x workers); only shared references reach it, in an
#: object built to make listing them take exponential time.
MAX_STATES = 2**20


def find_states(obj: Any) -> list[tuple[str, dict[str, Any]]]:
    """Every shardstream state inside ``obj``, each with where it is as the subscripts that
    reach it (``"['loader'][0]"``; ``""`` for ``obj`` itself): a state, a list of states (e.g.
    one per rank), a StatefulDataLoader ``state_dict()`` (worker states are nested in it), or
    lists and dicts of those. A state is not searched further.

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
            if _is_state(o):
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


def gather(obj: Any) -> list[dict[str, Any]]:
    """The states of :func:`find_states`, without where they are."""
    return [s for _, s in find_states(obj)]
