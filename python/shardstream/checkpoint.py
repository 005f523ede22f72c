"""Crash-safe checkpoint files: atomic save, and load of the newest complete checkpoint.

A training job can be killed at any instant (preemption, OOM killer, ``SIGKILL``), including
in the middle of writing a checkpoint. :func:`save_checkpoint` never leaves a half-written
file under a checkpoint's name:

1. the payload is written to a temporary file *in the same directory* (same filesystem, so
   the rename below is atomic), then ``flush`` + ``fsync``;
2. ``os.replace`` renames it to its final name (atomic on POSIX: a reader sees the old
   state or the new file, never a mix);
3. the directory is ``fsync``-ed so the rename itself survives a power loss.

Older checkpoints are pruned only after the new one is durable, so at every instant at least
one complete checkpoint exists. :func:`load_latest_checkpoint` returns the newest checkpoint
that loads completely, skipping temporary files left by a killed save and (defensively) any
file that fails to load.

Files are plain ``torch.save`` files (``pickle`` when torch is not installed), loadable with
``torch.load(path, weights_only=True)`` without this module. Loading never imports or calls
what a file names: ``torch.save`` files are read with ``weights_only=True`` (tensors and plain
data), other pickles as plain built-ins only, with or without torch installed; a file naming
anything else is refused with an error, not skipped::

    from shardstream.checkpoint import load_latest_checkpoint, save_checkpoint

    found = load_latest_checkpoint("ckpt/")
    if found is not None:
        step, ckpt, _path = found
        model.load_state_dict(ckpt["model"])
        loader.load_state_dict(ckpt["loader"])
    ...
    save_checkpoint({"model": model.state_dict(), "loader": loader.state_dict()}, "ckpt/", step)
"""

from __future__ import annotations

import io
import os
import pickle
import re
import tempfile
import warnings
from collections.abc import Callable
from typing import IO, Any

from . import _pickle

__all__ = [
    "atomic_write",
    "checkpoint_path",
    "dcp_entries",
    "list_checkpoints",
    "load_dcp_states",
    "load_latest_checkpoint",
    "save_checkpoint",
    "state_summaries",
]

_TMP_MARK = ".tmp-"


def _fsync_dir(directory: str) -> None:
    try:
        fd = os.open(directory, os.O_RDONLY | getattr(os, "O_DIRECTORY", 0))
    except OSError:  # pragma: no cover - platforms that cannot open directories
        return
    try:
        os.fsync(fd)
    except OSError:  # pragma: no cover - some filesystems refuse fsync on directories
        pass
    finally:
        os.close(fd)


def atomic_write(path: str | os.PathLike[str], data: bytes | Callable[[IO[bytes]], None]) -> None:
    """Write ``path`` atomically and durably.

    ``data`` is the file's bytes, or a callable that writes them to the binary file object it
    is given. Either ``path`` keeps its previous content (or stays absent) or it holds all of
    ``data``, whenever the process dies. A temporary ``.<name>.tmp-*`` file may be left in the
    directory by a killed write; it is never mistaken for a checkpoint and the next
    :func:`save_checkpoint` in that directory removes it.
    """
    path = os.fspath(path)
    directory = os.path.dirname(os.path.abspath(path))
    name = os.path.basename(path)
    fd, tmp = tempfile.mkstemp(prefix=f".{name}{_TMP_MARK}", dir=directory)
    try:
        with os.fdopen(fd, "wb") as f:
            if callable(data):
                data(f)
            else:
                f.write(data)
            f.flush()
            os.fsync(f.fileno())
        os.replace(tmp, path)
    except BaseException:
        try:
            os.unlink(tmp)
        except OSError:
            pass
        raise
    _fsync_dir(directory)


def _dumps(obj: Any) -> bytes:
    buf = io.BytesIO()
    try:
        import torch
    except ImportError:  # pragma: no cover - exercised only without torch
        pickle.dump(obj, buf, protocol=pickle.HIGHEST_PROTOCOL)
    else:
        torch.save(obj, buf)
    return buf.getvalue()


def _load(path: str) -> Any:
    return _pickle.load(path)[0]


def state_summaries(state_dict: Any) -> list[dict[str, Any]]:
    """The summary of every shardstream state in ``state_dict`` (anything
    ``ParquetStream.load_state_dict`` takes), for a two-phase elastic resume: each state's
    ``first_epoch``, ``slot`` and ``position`` without its shuffle buffer (~0.2 kB against
    ~10.7 B per buffered row), each spec's ``injected`` row ids (left by an earlier elastic
    resume) replaced by their number ``injected_rows``; a state without a slot (a rank that
    never iterated) stays one, standing for the slot missing from the others. Save them beside
    the states; a new rank reads every summary, then only the states
    ``ParquetStream.needed_slots`` names. A ``Mixture``'s state is summarized as
    ``{"mixture": True, "slot": ...}`` only (not a state: no ``format``): a mixture resumes
    from every state (:func:`load_dcp_states` reads them all).
    """
    from ._core import MIXTURE_FORMAT
    from .state import gather

    out: list[dict[str, Any]] = []
    for st in gather(state_dict):
        if st.get("format") == MIXTURE_FORMAT:
            out.append({"mixture": True, "slot": st.get("slot")})
            continue
        if st.get("slot") is None and st.get("position") is None:
            # A rank that never iterated: it stands for the slot missing from the others.
            out.append({"first_epoch": st["first_epoch"], "slot": None, "position": None})
            continue
        pos = {k: v for k, v in st["position"].items() if k != "buffer"}
        if isinstance(pos.get("specs"), list):
            pos["specs"] = [_spec_summary(sp) for sp in pos["specs"]]
        out.append({"first_epoch": st["first_epoch"], "slot": st["slot"], "position": pos})
    return out


def _spec_summary(spec: Any) -> Any:
    """A spec with its ``injected`` row ids (as big as a buffer, after an elastic resume)
    replaced by their number, ``injected_rows``: all a summary needs of them."""
    if not (isinstance(spec, dict) and isinstance(spec.get("injected"), str)):
        return spec  # not a spec: loading the summary says what is wrong
    text = spec["injected"]
    size = len(text) // 4 * 3 - (len(text) - len(text.rstrip("=")))
    if len(text) % 4 or size % 8:
        return spec  # not base64 of row ids: loading the summary says so
    out = {k: v for k, v in spec.items() if k != "injected"}
    out["injected_rows"] = size // 8
    return out


def dcp_entries(state: Any, rank: int, *, prefix: str = "shardstream") -> dict[str, Any]:
    """One rank's entries for ``torch.distributed.checkpoint.save`` (DCP), for a two-phase
    elastic resume with :func:`load_dcp_states`: ``{"<prefix>/rank<rank>": (state,),
    "<prefix>/summaries/rank<rank>": (state_summaries(state),)}``.

    ``state`` is this rank's ``ParquetStream.state_dict()`` or ``StatefulDataLoader``
    ``state_dict()``. Merge the entries into the dict each rank passes to ``dcp.save`` (beside
    the model's); the keys name the rank, so DCP's de-duplication of equal keys across ranks
    never mixes ranks. Each value is a 1-tuple so that DCP stores it whole under any save
    planner (the default one flattens dicts and lists into one key per leaf, turning int keys
    into strings and dropping empty dicts); :func:`load_dcp_states` unwraps it.
    """
    if isinstance(rank, bool) or not isinstance(rank, int) or rank < 0:
        raise ValueError(f"rank must be an int >= 0, got {rank!r}")
    return {
        f"{prefix}/rank{rank}": (state,),
        f"{prefix}/summaries/rank{rank}": (state_summaries(state),),
    }


def load_dcp_states(
    dataset: Any,
    checkpoint_id: str | os.PathLike[str] | None = None,
    *,
    num_workers: int | None = None,
    prefix: str = "shardstream",
    storage_reader: Any = None,
) -> list[int]:
    """Two-phase elastic resume from a DCP checkpoint saved with :func:`dcp_entries`: load
    every old rank's summaries, then only the states of the old ranks holding the slots
    ``dataset.needed_slots(summaries, num_workers)`` names, into
    ``dataset.load_state_dict(states, summaries=summaries)``. The stream is the one loading
    every state gives; with the same layout each rank reads only its own state.

    ``dataset`` is the new layout's ``ParquetStream``; ``num_workers``: the DataLoader workers
    it will run in (their union is loaded; default: the stream of this process). A
    ``Mixture`` (no two phases) reads every old rank's state and loads them all.
    ``checkpoint_id`` or ``storage_reader`` are passed to ``dcp.load``. Reads are local to
    this rank (``no_dist=True``): no collective call, so ranks need not call it together.
    Returns the old ranks whose states were read, sorted.

    Raises:
        StateError: the checkpoint has no ``<prefix>/summaries/rank<N>`` entries, or an
            entry is not what :func:`dcp_entries` saves (names the key).
    """
    import torch.distributed.checkpoint as dcp

    from .errors import StateError

    def reader() -> Any:
        if storage_reader is not None:
            return storage_reader
        return dcp.FileSystemReader(os.fspath(checkpoint_id))  # type: ignore[arg-type]

    def read(keys: list[str]) -> list[Any]:
        template: dict[str, Any] = dict.fromkeys(keys)  # DCP replaces each with what is stored
        with warnings.catch_warnings():
            # no_dist is deliberate (a per-rank read); DCP warns about it on every call
            warnings.filterwarnings("ignore", "torch.distributed is disabled", UserWarning)
            dcp.load(template, checkpoint_id=checkpoint_id, storage_reader=reader(), no_dist=True)
        out = []
        for k in keys:
            v = template[k]
            if not (isinstance(v, tuple) and len(v) == 1):
                raise StateError(
                    f"DCP entry {k!r} is a {type(v).__name__}, expected the 1-tuple "
                    "dcp_entries() saves"
                )
            out.append(v[0])
        return out

    where = checkpoint_id if checkpoint_id is not None else "the checkpoint"
    stored = reader().read_metadata().state_dict_metadata
    ranks: dict[str, dict[int, str]] = {}
    for kind, rest in (("state", "rank"), ("summaries", "summaries/rank")):
        rx = re.compile(rf"{re.escape(prefix)}/{rest}(\d+)")
        ranks[kind] = {int(m.group(1)): k for k in stored if (m := rx.fullmatch(k))}
    if not ranks["summaries"]:
        raise StateError(
            f"{where} has no {prefix}/summaries/rank<N> entries (save each rank's "
            "dcp_entries(state, rank) in it)"
        )
    order = sorted(ranks["summaries"])
    per_rank = read([ranks["summaries"][r] for r in order])
    for r, sums in zip(order, per_rank, strict=True):
        if not isinstance(sums, list):
            raise StateError(
                f"DCP entry {ranks['summaries'][r]!r} holds a {type(sums).__name__}, expected "
                "the list of summaries dcp_entries() saves"
            )
    summaries = [s for sums in per_rank for s in sums]
    if not hasattr(dataset, "needed_slots"):  # a Mixture: every state, one phase
        missing = [r for r in order if r not in ranks["state"]]
        if missing:
            raise StateError(
                f"{where} has summaries but no {prefix}/rank<N> state for old rank(s) {missing}"
            )
        dataset.load_state_dict(read([ranks["state"][r] for r in order]))
        return order
    slots = set(dataset.needed_slots(summaries, num_workers))
    need = sorted(
        r for r, sums in zip(order, per_rank, strict=True) if any(_slot(s) in slots for s in sums)
    )
    missing = [r for r in need if r not in ranks["state"]]
    if missing:
        raise StateError(
            f"{where} has summaries but no {prefix}/rank<N> state for old rank(s) {missing}"
        )
    states = read([ranks["state"][r] for r in need]) if need else []
    dataset.load_state_dict(states, summaries=summaries)
    return need


def _slot(summary: Any) -> int | None:
    slot = summary.get("slot") if isinstance(summary, dict) else None
    return slot.get("index") if isinstance(slot, dict) else None


def checkpoint_path(directory: str | os.PathLike[str], step: int, prefix: str = "ckpt") -> str:
    """The file name :func:`save_checkpoint` uses for ``step``: ``<prefix>-<step:012d>.pt``."""
    if isinstance(step, bool) or not isinstance(step, int) or step < 0:
        raise ValueError(f"step must be an int >= 0, got {step!r}")
    return os.path.join(os.fspath(directory), f"{prefix}-{step:012d}.pt")


def list_checkpoints(directory: str | os.PathLike[str], prefix: str = "ckpt") -> list[int]:
    """Steps of the checkpoint files in ``directory`` (ascending; temporary files excluded)."""
    pattern = re.compile(rf"^{re.escape(prefix)}-(\d+)\.pt$")
    try:
        names = os.listdir(directory)
    except FileNotFoundError:
        return []
    return sorted(int(m.group(1)) for n in names if (m := pattern.match(n)))


def save_checkpoint(
    obj: Any,
    directory: str | os.PathLike[str],
    step: int,
    *,
    prefix: str = "ckpt",
    keep: int = 2,
    write: Callable[[IO[bytes], bytes], None] | None = None,
) -> str:
    """Save ``obj`` (``torch.save`` format) as the checkpoint of ``step``, atomically.

    Keeps the newest ``keep`` checkpoints (>= 1) and removes older ones and stale temporary
    files, only after the new file is durable. ``write(file, payload)`` replaces the plain
    ``file.write(payload)`` (for throttling or fault injection); it must write all of
    ``payload``. Returns the checkpoint's path.
    """
    if keep < 1:
        raise ValueError(f"keep must be >= 1, got {keep!r}")
    directory = os.fspath(directory)
    os.makedirs(directory, exist_ok=True)
    path = checkpoint_path(directory, step, prefix)
    payload = _dumps(obj)
    if write is None:
        atomic_write(path, payload)
    else:
        atomic_write(path, lambda f: write(f, payload))
    for old in list_checkpoints(directory, prefix)[:-keep]:
        _remove(checkpoint_path(directory, old, prefix))
    for n in os.listdir(directory):
        if n.startswith(f".{prefix}-") and _TMP_MARK in n:
            _remove(os.path.join(directory, n))
    return path


def _remove(path: str) -> None:
    try:
        os.unlink(path)
    except FileNotFoundError:
        pass


def load_latest_checkpoint(
    directory: str | os.PathLike[str], prefix: str = "ckpt"
) -> tuple[int, Any, str] | None:
    """``(step, obj, path)`` of the newest checkpoint in ``directory`` that loads completely,
    or ``None`` if there is none. A file that fails to load (which an atomic save never
    produces, but a damaged disk might) is skipped in favour of the next older one.

    Raises:
        pickle.UnpicklingError: a checkpoint names a class or function that loading would
            import or call (only tensors and plain data are read); it names the file.
        ModuleNotFoundError: a checkpoint is a ``torch.save`` file and torch is not installed.
    """
    for step in reversed(list_checkpoints(directory, prefix)):
        path = checkpoint_path(directory, step, prefix)
        try:
            return step, _load(path), path
        except FileNotFoundError:  # pruned by a concurrent save
            continue
        except (_pickle.RefusedPickleError, ImportError):
            raise  # not damage: a file that must not be loaded, or one this process cannot read
        except Exception:  # noqa: BLE001 - a damaged file: fall back to an older one
            continue
    return None
