"""``ResumableSampler``: a global shuffle for map-style datasets with a small, exact, elastic state.

Design decisions (the why; the order and the state are in the core, ``rust/core/src/sampler/``
and docs/state-format.md):

* Each epoch's order is a keyed bijection of ``[0, N)`` evaluated on the fly (a Feistel network
  with cycle-walking): no index array, so 10^9 rows cost nothing to shuffle, and resuming at
  any position costs one evaluation.
* Ranks take every ``world_size``-th position of the order, so after every rank yielded ``k``
  indices — ranks move in step, one batch per training step — the epoch's *global position* is
  ``start + k * world_size`` on every rank. The state is that position (with the seed and the
  epoch): the same on every rank, O(1), and any number of ranks continues from it.
* Like ``ParquetStream``, the state is the position right after the last index this sampler
  *yielded*; torchdata's ``StatefulDataLoader`` snapshots it as it hands each batch to a worker
  and saves the snapshot of the last batch it returned, so a resume continues exactly after
  the last batch the training loop received. A plain ``DataLoader`` with workers pulls batches
  ahead: save with ``state_dict(consumed=...)`` there.
* Like ``ParquetStream`` too: an iterator takes its start point at its first ``next()`` (so one
  made before ``load_state_dict``/``set_epoch`` follows them), only the newest iterator owns
  the position, and an iterator that ran to the end of the epoch is followed by the same epoch
  again unless ``set_epoch`` moves on (as ``DistributedSampler``).
* It samples indices of anything with a length (``ParquetRows``, an HF ``datasets.Dataset``, a
  plain length): it never reads data.
"""

from __future__ import annotations

import operator
import os
import sys
import warnings
from collections.abc import Iterator, Sized
from typing import Any

from . import _core
from . import state as _state
from ._core import SAMPLER_FORMAT, RawRun, RawSampler
from .errors import StateError
from .integrations import accelerate as _accelerate

__all__ = ["ResumableSampler"]

_DEFAULTS = _core.DEFAULTS
_CHUNK = int(_DEFAULTS["sampler_chunk"])


def _rank_world() -> tuple[int, int]:
    torch = sys.modules.get("torch")  # distributed can only be initialized if torch was imported
    if torch is not None:
        dist = torch.distributed
        if dist.is_available() and dist.is_initialized():
            return dist.get_rank(), dist.get_world_size()
    return int(os.environ.get("RANK", "0")), int(os.environ.get("WORLD_SIZE", "1"))


def _check_count(value: Any, name: str) -> None:
    if isinstance(value, bool) or not isinstance(value, int) or value < 0:
        raise ValueError(f"{name} must be an int >= 0, got {value!r}")


class ResumableSampler:
    """A sampler over ``[0, len(data_source))``: a seeded permutation per epoch, split across
    ranks, whose state is the seed, the epoch and one global position.

    Args:
        data_source: a dataset with ``len()`` (e.g. :class:`~shardstream.ParquetRows`), or
            the number of rows.
        shuffle: ``False`` yields rows in order (ranks interleaved).
        seed: seed of every epoch's order (epoch ``e`` is keyed by ``(seed, e)``).
        block_size: ``None`` shuffles globally (every row equally likely at every position).
            An int selects the *locality* order: blocks of ``block_size`` consecutive rows are
            permuted, and rows are shuffled within each window of ``window`` consecutive
            blocks of that order, so a batch reads from at most ``window`` blocks and the next
            batches from the same ones (a page cache then serves them; see the guide for the
            speed and the shuffle quality measured).
        window: blocks per window of the locality order.
        rank, world_size: this process's place among ranks; default from
            ``torch.distributed`` if initialized, else ``RANK``/``WORLD_SIZE``, else 0 of 1.
            Under an accelerate loader (``prepare()``, the HF ``Trainer``), which splits the
            sampler's batches between its processes itself, pass ``rank=0, world_size=1``
            (a sampler split by rank there is a ``ValueError`` as the pass starts).
        even: with several ranks, ``"drop"`` gives every rank ``floor(rest / world_size)``
            indices (the last ``< world_size`` positions of the epoch are not read),
            ``"pad"`` gives every rank ``ceil(rest / world_size)`` (repeating positions from
            the epoch's start), ``None`` yields every index exactly once (ranks differ by at
            most one index). A single rank never drops or pads.

    DataLoader workers need nothing: the loader's main process iterates the sampler (through
    its batch sampler) and sends each worker whole batches of indices.

    ``state_dict()`` is the same on every rank of a job whose ranks move in step; a state saved
    on ``W`` ranks resumes on any number of ranks, each index of the epoch read exactly once
    (with ``even=None``). With ``even=None`` a rank that ran out near the end of an epoch
    reports the epoch's end: load every rank's state (or rank 0's) for an elastic resume.

    Example:
        >>> s = ResumableSampler(10, seed=3)
        >>> it = iter(s)
        >>> first = [next(it) for _ in range(4)]
        >>> saved = s.state_dict()
        >>> saved["position"]
        4
        >>> two = [ResumableSampler(10, seed=3, rank=r, world_size=2) for r in (0, 1)]
        >>> for t in two:
        ...     t.load_state_dict(saved)
        >>> rest = [list(t) for t in two]
        >>> sorted(first + rest[0] + rest[1]) == list(range(10))
        True
    """

    def __init__(
        self,
        data_source: Sized | int,
        *,
        shuffle: bool = True,
        seed: int = 0,
        block_size: int | None = None,
        window: int = _DEFAULTS["window"],
        rank: int | None = None,
        world_size: int | None = None,
        even: str | None = _DEFAULTS["even"],
    ) -> None:
        if isinstance(data_source, bool):
            raise TypeError("data_source must be a dataset with len() or an int, got bool")
        if hasattr(data_source, "__len__"):
            rows = len(data_source)
        else:
            try:
                rows = operator.index(data_source)  # an int, numpy int, ...
            except TypeError:
                raise TypeError(
                    "data_source must be a dataset with len() or an int, got "
                    f"{type(data_source).__name__}"
                ) from None
        if (rank is None) != (world_size is None):
            raise ValueError("pass rank and world_size together (or neither)")
        # (whether rank/world_size were given: the refusal under an accelerate loader, which
        # splits the order itself, says where they came from; given 0 of 1 may warn)
        self._ranks_given = rank is not None
        if rank is None or world_size is None:
            rank, world_size = _rank_world()
        self._args: dict[str, Any] = dict(
            rows=rows,
            seed=seed,
            shuffle=shuffle,
            block_size=block_size,
            window=window,
            rank=rank,
            world_size=world_size,
            even=even,
        )
        self._raw = RawSampler(**self._args)  # checks every argument, naming it
        self._start: dict[str, Any] = self._raw.start(0)  # where the next iterator starts
        self._iter: _SamplerIterator | None = None  # the newest iterator
        self._loaded = False  # _start came from load_state_dict and no iterator started yet
        # The epoch set_epoch() asked for, until an iterator starts: a state loaded after it at
        # the end of an earlier epoch then leads to this epoch, not to that one again.
        self._asked: int | None = None
        self._loads = 0  # load_state_dict() calls: which iterators were made after the last
        # set_epoch() while the newest iterator, started at that epoch's beginning, goes on (a
        # loader that started before the call): the next iterator starts at _start, not there.
        self._restart = False
        self._warned = False  # the same-order warning was given

    # -- what it is ---------------------------------------------------------------------------
    def __len__(self) -> int:
        """Indices this rank yields in a whole epoch (what ``DistributedSampler`` reports;
        an epoch resumed part-way yields fewer)."""
        return int(self._raw.epoch_len())

    @property
    def rank(self) -> int:
        return int(self._raw.rank)

    @property
    def world_size(self) -> int:
        return int(self._raw.world_size)

    @property
    def epoch(self) -> int:
        """The epoch the next index comes from."""
        return int(self._position()["epoch"])

    # -- where the next iterator starts --------------------------------------------------------
    def _start_point(self) -> dict[str, Any]:
        """Where a new iterator starts: where the newest one stands once it has started, or
        the start of its epoch again if it has nothing left (ran to the end, or was made at
        the end: torchdata's loader makes a second iterator after loading a finished pass and
        expects a new pass from it) — of the epoch ``set_epoch`` asked for instead, if a state
        of an earlier epoch's end was loaded after it (torchdata loads the state inside
        ``iter(loader)``, after the training loop's ``set_epoch``); else the start point."""
        it = self._iter
        if self._restart:  # set_epoch() let the newest iterator go on; the next one restarts
            self._restart, self._iter = False, None
            return self._start
        # (an iterator made before the last load and not started follows the loaded position,
        # even an epoch's end: the next iterator then yields nothing, as that epoch is done)
        made_at_end = it is not None and it.made == self._loads
        if it is not None and it.started and it.switched and made_at_end:
            # It started a later epoch from a loaded epoch's end (see __next__), and is replaced
            # before any other load: torchdata drops the iterator it loaded a finished state
            # into (its workers had prefetched from it) and makes a fresh one for the new pass.
            self._start, self._iter, self._loaded = it.begun, None, False
            return self._start
        if it is not None and (it.started or made_at_end and not len(self._raw.run(self._start))):
            self._start, self._iter = it.resume_point(), None
            self._loaded = False
            asked = self._asked
            if asked is not None and asked > self._start["epoch"] and self._start["position"] == 0:
                self._start = self._raw.start(asked, self._start)
        return self._start

    def _position(self) -> dict[str, Any]:
        it = self._iter
        if it is not None and it.started:
            return it.state_dict()
        return self._start

    # -- iteration ----------------------------------------------------------------------------
    def __iter__(self) -> Iterator[int]:
        _refuse_lightning_wrapper(sys._getframe(1))
        self._start_point()
        self._iter = _SamplerIterator(self)
        return self._iter

    def _follow_accelerate(self) -> Any:
        """The accelerate loader (``prepare()``, the HF ``Trainer``) drawing batches from this
        sampler right now, or ``None``. It splits the sampler's order between its processes
        itself, so a sampler split by rank too would have each process read ``1/processes``
        of its share (a quarter of the rows on 2 processes, silently): that is a
        ``ValueError``, raised as a pass starts (accelerate calls ``set_epoch`` on every
        process there) or at an iterator's first index."""
        found = _accelerate.sampler_loader(self)
        if found is None:
            return None
        loader, processes = found
        if processes > 1 and self.world_size > 1:
            given = (
                "was given" if self._ranks_given else "took from torch.distributed (its default)"
            )
            raise ValueError(
                f"accelerate splits this ResumableSampler's order between its {processes} "
                f"processes itself, but the sampler {given} rank={self.rank}, "
                f"world_size={self.world_size} and so splits it again: each process would "
                f"read 1/{processes * self.world_size} of the rows. Under accelerate (and the "
                "HF Trainer) pass rank=0, world_size=1"
            )
        return loader

    def _warn_same_order_on_every_rank(self) -> None:
        """A ``UserWarning`` (once) for ``rank=0, world_size=1`` given in a job of several
        ``torch.distributed`` processes outside an accelerate loader: every process then reads
        the same indices (under Lightning with ``use_distributed_sampler=False``, identical
        batches on every rank)."""
        if self._warned or not self._ranks_given or self.world_size != 1:
            return
        _, world = _rank_world()
        if world > 1:
            self._warned = True
            warnings.warn(
                f"ResumableSampler(rank=0, world_size=1) in a job of {world} torch.distributed "
                "processes: every process reads the same indices. Pass no rank/world_size (the "
                "sampler then splits by torch.distributed rank), unless a wrapper splits its "
                "batches (accelerate, where the sampler checks this itself)",
                UserWarning,
                stacklevel=4,
            )

    def _follow_epoch(self, loader: Any) -> None:
        """At an iterator's first index under an accelerate loader: start at the loader's epoch
        (``iteration``, which its ``set_epoch`` sets), unless a position was loaded. The loader
        passes ``set_epoch`` on to the sampler, except through the ``SkipBatchSampler`` that
        ``skip_first_batches`` adds (the HF Trainer's resume): resumed in a later epoch, the
        sampler would otherwise read epoch 0's order."""
        epoch = getattr(loader, "iteration", None)
        start = self._start
        if (
            isinstance(epoch, int)
            and not isinstance(epoch, bool)
            and 0 <= epoch < 2**63
            and not self._loaded
            and start["position"] == 0
            and start["epoch"] != epoch
        ):
            self._start = self._raw.start(epoch, start)

    def set_epoch(self, epoch: int) -> None:
        """Start the next iterator at the beginning of ``epoch`` (like
        ``DistributedSampler.set_epoch``). After :meth:`load_state_dict`, the loaded state's
        own epoch keeps the loaded position (so ``for e in range(start, n): s.set_epoch(e)``
        resumes); another epoch discards it, with a ``UserWarning`` if it was part-way."""
        _check_count(epoch, "epoch")
        if epoch >= 2**63:
            raise ValueError(f"epoch must be below 2**63, got {epoch}")
        self._follow_accelerate()
        it = self._iter
        if (
            it is not None
            and it.started
            and not self._loaded
            and (it.begins(epoch) or it.from_load and it.begun["epoch"] == epoch)
        ):
            # The newest iterator already yields this epoch, from its beginning or from a
            # position loaded in it: a loader that started before this call goes on with it
            # (torchdata's StatefulDataLoader makes its iterator in state_dict() or, resuming,
            # in iter(), and its workers prefetch from the sampler at once: accelerate's
            # prepare() and Lightning's resume do that); a new iterator starts the epoch over.
            self._start, self._restart = self._raw.start(epoch, it.begun), True
            self._asked = epoch
            return
        # (an iterator not started yet follows what is set here, even one made after loading
        # an epoch's end: Lightning resumes with iter(loader), then set_epoch(), then next())
        start = self._start if it is not None and not it.started else self._start_point()
        if self._loaded:
            if start["epoch"] == epoch:
                return  # (kept again by a second call: accelerate's loader makes two a pass)
            self._loaded = False
            if start["position"] > 0 and len(self._raw.run(start)) > 0:
                warnings.warn(
                    f"set_epoch({epoch}) discards the position loaded by load_state_dict() "
                    f"({start['position']} of epoch {start['epoch']}): the sampler starts epoch "
                    f"{epoch} from its beginning. To continue from the loaded position, call "
                    "set_epoch() with the loaded state's epoch (or not at all)",
                    UserWarning,
                    stacklevel=2,
                )
        self._start = self._raw.start(epoch, start)
        self._asked = epoch

    # -- state --------------------------------------------------------------------------------
    def state_dict(self, consumed: int | None = None) -> dict[str, Any]:
        """The position right after the last index this sampler yielded, as plain built-ins
        (fields: docs/state-format.md): ``{"format", "version", "settings", "epoch",
        "position", "skips"}``.

        ``consumed``: with a plain ``DataLoader`` whose workers prefetch, the sampler has
        yielded more indices than the training loop received; pass how many indices of the
        current iterator the loop did receive (e.g. ``steps * batch_size``) to save that
        position instead. torchdata's ``StatefulDataLoader`` needs nothing (it keeps the
        state of the last batch it returned).
        """
        it = self._iter
        if consumed is not None:
            _check_count(consumed, "consumed")
            if it is None or not it.started:
                if consumed:
                    raise ValueError("consumed > 0, but no iterator of this sampler has started")
                return dict(self._start)
            return it.state_dict(consumed)
        return dict(self._position())

    def load_state_dict(self, state_dict: Any) -> None:
        """Continue after a saved position on the next ``iter(self)``.

        ``state_dict`` is a state from :meth:`state_dict`, a list of every rank's states, or
        anything holding them (a ``StatefulDataLoader.state_dict()``, a checkpoint dict).
        Several states must be of one epoch and position (ranks in step; with ``even=None``
        ranks that ran out report the epoch's end, and the lowest position is taken). The
        number of ranks may differ from the run that saved it.

        Raises:
            StateError: no sampler state found, or one that is malformed, of another version,
                or saved with other settings (``len``, ``seed``, ``shuffle``, ``block_size``,
                ``window``: the message lists the differences).
        """
        found = [s for s in _state.gather(state_dict) if s.get("format") == SAMPLER_FORMAT]
        if not found:
            raise StateError(
                f"no shardstream sampler state found in the {type(state_dict).__name__} given "
                "(expected what ResumableSampler.state_dict() returns, or a list or loader "
                "state holding it)"
            )
        loaded = self._raw.load(found)
        self._start_point()  # a started iterator goes stale
        self._start, self._loaded = loaded, True
        self._loads += 1

    def skip(self, n: int) -> None:
        """Pass over this rank's next ``n`` indices without yielding them (every rank should
        skip the same ``n``), recorded in the state's ``skips`` as global positions. Applies to
        the live iterator, or before iterating to the start point; never past the epoch's end.
        To skip ``b`` batches of a ``DataLoader``, skip ``b * batch_size``."""
        _check_count(n, "n")
        it = self._iter
        if it is not None and it.started and not it.exhausted:
            it.skip(n)
            return
        start = self._start_point()
        run = self._raw.run(start)
        self._start = run.state_dict(run.skip(0, n))

    # -- pickling -----------------------------------------------------------------------------
    def __getstate__(self) -> dict[str, Any]:
        return {
            "args": self._args,
            "state": self.state_dict(),
            "loaded": self._loaded,
            "asked": self._asked,
            "ranks_given": self._ranks_given,
        }

    def __setstate__(self, d: dict[str, Any]) -> None:
        self._args = d["args"]
        self._raw = RawSampler(**self._args)
        self._start = self._raw.load([d["state"]])
        self._iter = None
        self._loaded = d["loaded"]
        self._asked = d.get("asked")
        self._loads = 0
        self._restart = False
        self._warned = False  # the same-order warning was given
        self._ranks_given = d.get("ranks_given", True)

    def __repr__(self) -> str:
        a = self._args
        return (
            f"ResumableSampler({a['rows']} rows, seed={a['seed']}, shuffle={a['shuffle']}, "
            f"block_size={a['block_size']}, rank={a['rank']} of {a['world_size']})"
        )


def _refuse_lightning_wrapper(frame: Any) -> None:
    """A ``ValueError`` when Lightning's ``DistributedSamplerWrapper`` is iterating the
    sampler (``Trainer(use_distributed_sampler=True)``, its default under DDP, wraps any sampler
    that is not a ``DistributedSampler``): it reads the whole epoch with ``list()`` and splits it
    between ranks again, so a sampler split by rank read half the rows on 2 ranks, silently, and
    the sampler's state is the epoch's end whatever was trained on (a resume in a later epoch
    replayed epoch 0's order)."""
    caller = frame.f_locals.get("self") if frame is not None else None
    kind = type(caller)
    if kind.__name__ != "_DatasetSamplerWrapper" or kind.__module__.split(".")[0] not in (
        "lightning",
        "lightning_fabric",
        "pytorch_lightning",
    ):
        return
    raise ValueError(
        "Lightning's DistributedSamplerWrapper is iterating this ResumableSampler (the Trainer's "
        "use_distributed_sampler=True, its default under DDP): it reads the sampler's whole "
        "epoch and splits it between ranks again, so the sampler's position no longer says "
        "what was trained on, and a sampler split by rank would read 1/world_size of its share. "
        "Pass use_distributed_sampler=False to the Trainer: the sampler splits by "
        "torch.distributed rank itself (its default), and its state rides in a "
        "StatefulDataLoader's"
    )


class _SamplerIterator:
    """One pass of a ``ResumableSampler``: this rank's indices of one epoch, from the sampler's
    start point (taken at the first ``next()``)."""

    __slots__ = ("_buf", "_k", "_owner", "_pos", "_run", "begun", "from_load", "made", "switched")

    def __init__(self, owner: ResumableSampler) -> None:
        self._owner = owner
        self.made = owner._loads  # the owner's loads before it was made
        self.begun: dict[str, Any] = {}  # the state it started from (at its first next())
        self.from_load = False  # that state came from load_state_dict()
        self.switched = False  # it left a loaded epoch's end for set_epoch()'s later epoch
        self._run: RawRun | None = None
        self._k = 0  # indices yielded (or skipped) since the run's start
        self._buf: list[int] = []  # indices computed ahead; _buf[_pos:] not yielded yet
        self._pos = 0

    @property
    def started(self) -> bool:
        return self._run is not None

    @property
    def exhausted(self) -> bool:
        return self._run is not None and self._k >= len(self._run)

    def begins(self, epoch: int) -> bool:
        """Started at the beginning of ``epoch`` (where ``set_epoch(epoch)`` starts)."""
        raw = self._owner._raw
        return self._run is not None and self.begun == raw.start(epoch, self.begun)

    def __iter__(self) -> _SamplerIterator:
        return self

    def __next__(self) -> int:
        if self._owner._iter is not self:
            raise RuntimeError(
                "this sampler iterator is stale: iter() was called again on the same "
                "ResumableSampler (or set_epoch/load_state_dict moved it on), and only the "
                "newest iterator owns the sampler's position"
            )
        if self._pos < len(self._buf):
            i = self._buf[self._pos]
            self._pos += 1
            self._k += 1
            return i
        if self._run is None:
            loader = self._owner._follow_accelerate()
            if loader is not None:
                self._owner._follow_epoch(loader)
            else:
                self._owner._warn_same_order_on_every_rank()
            owner = self._owner
            start, asked, raw = owner._start, owner._asked, owner._raw
            self.from_load = owner._loaded
            if (
                owner._loaded
                and asked is not None
                and asked > start["epoch"]
                and not len(raw.run(start))
            ):
                # A state saved after an epoch's last batch, loaded after the loop's
                # set_epoch() of a later epoch (torchdata loads it inside iter(loader)): that
                # epoch, as a ParquetStream does.
                start, self.switched = raw.start(asked, start), True
            self.begun = start
            self._run = raw.run(start)
            owner._start, owner._loaded = start, False
            if len(self._run):  # (one made at a loaded epoch's end yields nothing: keep it)
                owner._asked = None
        self._buf, self._pos = self._run.indices(self._k, _CHUNK), 0
        if not self._buf:
            raise StopIteration
        return self.__next__()

    def state_dict(self, consumed: int | None = None) -> dict[str, Any]:
        assert self._run is not None
        k = self._k if consumed is None else min(consumed, self._k)
        return self._run.state_dict(k)

    def resume_point(self) -> dict[str, Any]:
        """Where the next iterator starts: here, or the start of this epoch once nothing is
        left (started or not)."""
        raw = self._owner._raw
        if self._run is None:  # not started: its start point has nothing left
            start = self._owner._start
            return raw.start(int(start["epoch"]), start)
        state = self._run.state_dict(self._k)
        if self.exhausted:
            return raw.start(self._run.epoch, state)
        return state

    def skip(self, n: int) -> None:
        assert self._run is not None
        self._k = self._run.skip(self._k, n)
        self._buf, self._pos = [], 0
