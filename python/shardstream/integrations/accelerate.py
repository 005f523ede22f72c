"""HF ``accelerate`` (and the HF ``Trainer``, built on it): exactly-once under its data loaders.

``accelerator.prepare(DataLoader(ParquetStream(...)))`` (or a ``Mixture``) wraps the loader in one
of two ways, and the dataset finds out which when it starts iterating (:func:`wrapper`) and in
its ``set_epoch``, which accelerate's loader calls on every process as a pass starts, so no
setting is needed for the default:

* ``dispatch_batches=True`` (accelerate's default for iterable datasets): process 0 iterates the
  loader and sends each process its part of every batch. The stream then reads *every* row on
  each process (it ignores ``torch.distributed`` ranks) and only process 0's copy is consumed.
* ``dispatch_batches=False``: accelerate wraps the dataset in ``IterableDatasetShard``, which keeps
  ``1/num_processes`` of what each process yields. ParquetStream already splits by rank, so this
  would train on half the rows (with 2 processes): the stream raises instead, naming the setting.

Exact resume with ``save_state``/``load_state`` (``use_stateful_dataloader=True``) and more than
one process also needs :func:`register` (one call after creating the ``Accelerator``) and
``split_batches=True``; without them the stream raises (see :class:`Wrapper`).

Only :func:`register` imports accelerate; otherwise it is looked at only if already imported.
"""

from __future__ import annotations

import sys
import weakref
from dataclasses import dataclass
from typing import Any

__all__ = ["Wrapper", "before_epoch", "register", "sampler_loader", "wrapper"]

# Accelerators register() was called with (their _dataloaders are the loaders it syncs).
_REGISTERED: weakref.WeakSet[Any] = weakref.WeakSet()


@dataclass(frozen=True)
class Wrapper:
    """How an accelerate loader wraps a stream (plain values: travels to spawned workers)."""

    dispatch: bool  # DataLoaderDispatcher (True) or DataLoaderShard + IterableDatasetShard
    num_processes: int
    split_batches: bool
    stateful: bool  # use_stateful_dataloader: its state_dict() is saved by save_state()
    registered: bool  # the loader's Accelerator went through register()
    workers: int = 0  # the DataLoader's num_workers
    short_batches: bool = False  # it batches rows without drop_last: each worker's last is short
    packed: bool = False  # the stream packs tokens (pack=): its batches carry cu_seqlens
    kind: str = "ParquetStream"  # the dataset's class, for the messages

    def slot(self, world_size: int | None) -> tuple[int, int]:
        """``(rank, world_size)`` the stream must use under this wrapper, or a ``ValueError``."""
        if not self.dispatch:
            raise ValueError(
                f"accelerate splits this {self.kind} between processes a second time: with "
                "dispatch_batches=False it wraps the dataset in IterableDatasetShard, which keeps "
                f"1/{self.num_processes} of what each process yields, but {self.kind} already "
                "yields only its rank's rows. Use dispatch_batches=True (accelerate's default "
                "for iterable datasets: DataLoaderConfiguration(dispatch_batches=True), or "
                "accelerator_config={'dispatch_batches': True} in HF TrainingArguments)"
            )
        if self.num_processes > 1 and self.workers > 1 and self.short_batches:
            raise ValueError(
                "accelerate dispatch_batches=True cuts every batch into "
                f"{self.num_processes} equal parts and drops the rows left over, except in the "
                f"last batch; with {self.workers} DataLoader workers each worker's last batch of "
                "an epoch comes before the end, and may be shorter: pass drop_last=True to the "
                "DataLoader, or use num_workers=0 or 1 (HF Trainer: dataloader_num_workers)"
            )
        if self.num_processes > 1 and self.packed:
            raise ValueError(
                "accelerate dispatch_batches=True cuts every tensor of a batch along its first "
                f"dimension into {self.num_processes} parts, but a packed batch's cu_seqlens "
                "(document boundaries over the whole batch) and max_seqlen are not per row, so "
                "each process would get wrong boundaries: with packing, run one process per "
                f"rank without dispatch (a plain loop: {self.kind}(rank=, world_size=), "
                "shardstream.EvenBatches for a finite pass)"
            )
        if world_size is not None and world_size > 1:
            raise ValueError(
                "accelerate dispatches batches (dispatch_batches=True): process 0 reads for every "
                f"process, so {self.kind} must read every row there, but world_size={world_size} "
                "was passed: drop rank=/world_size= (or pass rank=0, world_size=1)"
            )
        if self.stateful and self.num_processes > 1:
            if not self.split_batches:
                raise ValueError(
                    "accelerate dispatch_batches=True with use_stateful_dataloader=True and "
                    f"{self.num_processes} processes saves a loader state "
                    f"{self.num_processes - 1} batch(es) ahead of the training loop unless "
                    "split_batches=True (resume would skip batches): set "
                    "DataLoaderConfiguration(split_batches=True) and give the DataLoader the "
                    "global batch size (per-process batch x num_processes)"
                )
            if not self.registered:
                raise ValueError(
                    "accelerate save_state() writes every process's loader state to one file "
                    "(dl_state_dict.bin), and only process 0's is this stream's: call "
                    "shardstream.integrations.accelerate.register(accelerator) once after "
                    "creating the Accelerator so that every process saves process 0's state"
                )
        return 0, 1


def _iterating() -> tuple[Any, list[Any]] | None:
    """``(accelerate.data_loader, the prepared loaders being iterated)``, or ``None`` when
    accelerate is not imported or has no state yet (nothing to cooperate with).

    accelerate's ``GradientState`` lists the prepared loaders being iterated; a loader is added
    before it creates its iterator, so DataLoader workers forked then see it too.
    """
    state_mod = sys.modules.get("accelerate.state")
    loader_mod = sys.modules.get("accelerate.data_loader")
    if state_mod is None or loader_mod is None or not state_mod.GradientState._shared_state:
        return None
    try:
        refs = state_mod.GradientState().dataloader_references
    except Exception:  # an accelerate whose GradientState differs: nothing to cooperate with
        return None
    return loader_mod, list(refs)


def _loader_of(dataset: Any) -> tuple[Any, bool, int] | None:
    """``(accelerate loader, dispatches, num_processes)`` iterating ``dataset`` right now."""
    found = _iterating()
    if found is None:
        return None
    loader_mod, refs = found
    for dl in refs:
        inner = getattr(getattr(dl, "base_dataloader", None), "dataset", None)
        if inner is None:
            continue
        if issubclass(type(dl), loader_mod.DataLoaderDispatcher) and inner is dataset:
            return dl, True, int(dl.state.num_processes)
        if isinstance(inner, loader_mod.IterableDatasetShard) and inner.dataset is dataset:
            return dl, False, int(inner.num_processes)
    return None


def _wrapper(found: tuple[Any, bool, int], dataset: Any) -> Wrapper:
    from ..even import _pack_of

    dl, dispatch, num = found
    base = dl.base_dataloader
    return Wrapper(
        dispatch=dispatch,
        num_processes=num,
        split_batches=bool(getattr(dl, "split_batches", False)),
        stateful=bool(getattr(dl, "use_stateful_dataloader", False)),
        registered=any(dl in getattr(acc, "_dataloaders", ()) for acc in _REGISTERED),
        workers=int(getattr(base, "num_workers", 0) or 0),
        short_batches=(
            not getattr(base, "drop_last", False)
            if getattr(base, "batch_size", None) is not None  # the loader batches rows
            else getattr(dataset, "batch_size", None) is not None
            and not getattr(dataset, "drop_last", False)
        ),
        packed=_pack_of(dataset) is not None,
        kind=type(dataset).__name__,
    )


def wrapper(dataset: Any) -> Wrapper | None:
    """How the accelerate loader iterating ``dataset`` right now wraps it (``None``: none)."""
    found = _loader_of(dataset)
    return None if found is None else _wrapper(found, dataset)


def before_epoch(dataset: Any, world_size: int | None) -> None:
    """Called by ``ParquetStream.set_epoch`` and ``Mixture.set_epoch``, which accelerate's
    loader calls as it starts, on every process: a setting the dataset cannot be exact with
    raises here on all of them (in the iterator it would raise on process 0 only, and the others
    would wait for its batch).

    With ``use_stateful_dataloader=True`` and ``num_workers > 0``, ``prepare()`` already started
    the workers (accelerate asks torchdata's ``StatefulDataLoader`` for its ``state_dict()``,
    which creates the iterator), so their copies of the stream predate this epoch and cannot see
    the loader. ``load_state_dict({})`` (public; keeps a state loaded to resume from) drops that
    iterator: the loader starts its workers now.
    """
    found = _loader_of(dataset)
    if found is None:
        return
    _wrapper(found, dataset).slot(world_size)
    base = found[0].base_dataloader
    if getattr(base, "num_workers", 0) > 0 and hasattr(base, "load_state_dict"):
        base.load_state_dict({})


def sampler_loader(sampler: Any) -> tuple[Any, int] | None:
    """``(accelerate loader, processes it splits the sampler's order between)`` drawing its
    batches from ``sampler`` right now (``None``: none).

    For a map-style dataset accelerate keeps the DataLoader's sampler and splits its batches:
    ``BatchSamplerShard`` gives each process every ``num_processes``-th batch (or a part of
    each), ``DataLoaderDispatcher`` has process 0 read every batch and send the parts. The
    sampler is found by following ``batch_sampler``/``sampler`` from the loader (through
    ``SkipBatchSampler``, which a resume's ``skip_first_batches`` adds).
    """
    found = _iterating()
    if found is None:
        return None
    loader_mod, refs = found
    for dl in refs:
        if dl is None:
            continue
        processes = 1
        if issubclass(type(dl), loader_mod.DataLoaderDispatcher):
            processes = int(dl.state.num_processes)
        todo, seen = [dl], {id(dl)}
        for _ in range(8):  # a few wrappers deep
            nxt = []
            for obj in todo:
                for name in ("batch_sampler", "sampler"):
                    x = getattr(obj, name, None)
                    if x is None or id(x) in seen:
                        continue
                    if x is sampler:
                        return dl, processes
                    if isinstance(x, loader_mod.BatchSamplerShard):
                        processes = max(processes, int(x.num_processes))
                    seen.add(id(x))
                    nxt.append(x)
            todo = nxt
    return None


def register(accelerator: Any) -> None:
    """Make ``accelerator.save_state()`` save process 0's loader state on every process.

    ``save_state`` writes each prepared loader's ``state_dict()`` from every process to the same
    file (``dl_state_dict.bin``); under ``dispatch_batches=True`` only process 0 iterates, so
    another process's (never advanced) state could be the one left in the file and a resume
    would start the epoch over. A save-state pre-hook sends process 0's states to the others
    first, so every process writes the same bytes.
    """
    from accelerate.data_loader import DataLoaderDispatcher
    from accelerate.utils import broadcast_object_list

    def sync(_models: list[Any], _weights: list[Any], _output_dir: str) -> None:
        if accelerator.num_processes == 1:
            return
        loaders = [
            dl
            for dl in accelerator._dataloaders
            if issubclass(type(dl), DataLoaderDispatcher) and dl.use_stateful_dataloader
        ]
        states = [dl.state_dict() for dl in loaders]
        broadcast_object_list(states, from_process=0)
        for dl, st in zip(loaders, states, strict=True):
            dl.dl_state_dict = st

    accelerator.register_save_state_pre_hook(sync)
    _REGISTERED.add(accelerator)
