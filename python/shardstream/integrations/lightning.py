"""Lightning: every rank's loader state in the checkpoint, and back to the right rank.

Lightning's fit loop saves the ``state_dict()`` of a stateful train loader (torchdata's
``StatefulDataLoader``) in the checkpoint and loads it on resume, which makes a mid-epoch resume
exact with one process. With several, the checkpoint is written by rank 0 only, so every rank
would load rank 0's loader state (``ParquetStream`` then refuses: no state for its slot).
:class:`ShardstreamCheckpoints` gathers the loader states of every rank into the checkpoint and,
on resume, hands each rank its own; with another number of processes (elastic), it hands every
rank the states of all old ranks, and each ``ParquetStream`` reads its share of what is left.

Use: ``Trainer(callbacks=[ShardstreamCheckpoints(), ...])``. Lightning is imported only here.
"""

from __future__ import annotations

import copy
from typing import Any

from lightning.pytorch.callbacks import Callback

__all__ = ["ShardstreamCheckpoints"]

KEY = "shardstream_loader_states"  # checkpoint entry: per rank, its fit loop's loader states


def _with_dataset_states(template: Any, states: list[Any]) -> Any:
    """``template`` (a loader state) with each ``dataset_state`` in it replaced by ``states``."""
    if isinstance(template, dict):
        return {
            k: states if k == "dataset_state" else _with_dataset_states(v, states)
            for k, v in template.items()
        }
    if isinstance(template, list):
        return [_with_dataset_states(v, states) for v in template]
    return template


def _fit_state(checkpoint: dict[str, Any]) -> dict[str, Any]:
    """The fit loop's own entry of a checkpoint (where it keeps ``combined_loader``)."""
    return checkpoint.get("loops", {}).get("fit_loop", {}).get("state_dict", {})


def _yielded(states: Any) -> int | None:
    """Batches the (first) loader had yielded, from its ``state_dict()`` (torchdata's keys, or
    an ``EvenBatches`` state's steps: its loader's count stops while it pads)."""
    if isinstance(states, dict):
        even = states.get("even_batches")  # shardstream.EvenBatches: its steps count padding
        if isinstance(even, dict) and isinstance(even.get("steps"), int):
            return int(even["steps"])
        snapshot = states.get("_snapshot")  # with workers: a snapshot, then steps since it
        if isinstance(snapshot, dict) and isinstance(snapshot.get("_snapshot_step"), int):
            return int(snapshot["_snapshot_step"]) + int(states.get("_steps_since_snapshot", 0))
        if isinstance(states.get("_num_yielded"), int):
            return int(states["_num_yielded"])
        items = list(states.values())
    elif isinstance(states, list):
        items = states
    else:
        return None
    for v in items:
        n = _yielded(v)
        if n is not None:
            return n
    return None


class ShardstreamCheckpoints(Callback):
    """Saves the train loader states of all ranks; loads each rank's own (or, elastic, all).

    Also corrects a lag: Lightning fetches one batch ahead of ``training_step`` when the loader
    has no length (an iterable dataset), so the loader state Lightning saves includes a batch
    not trained on yet, which a resume would skip. The callback keeps the loader states of the
    last few batches and saves the one without the batches fetched ahead.
    """

    def __init__(self) -> None:
        self._recent: list[tuple[int | None, list[Any]]] = []  # (batches yielded, loader states)

    def _capture(self, trainer: Any) -> None:
        loader = getattr(trainer.fit_loop, "_combined_loader", None)
        if loader is None:
            return
        states = loader._state_dicts()  # what Lightning's fit loop saves
        self._recent = [*self._recent[-2:], (_yielded(states), states)]

    def on_train_start(self, trainer: Any, pl_module: Any) -> None:
        self._recent = []
        self._capture(trainer)

    def on_train_epoch_start(self, trainer: Any, pl_module: Any) -> None:
        self._capture(trainer)

    def on_train_batch_start(self, trainer: Any, pl_module: Any, batch: Any, idx: int) -> None:
        self._capture(trainer)

    def on_save_checkpoint(self, trainer: Any, pl_module: Any, checkpoint: dict[str, Any]) -> None:
        fit = _fit_state(checkpoint)
        own = fit.get("combined_loader", [])
        fetcher = getattr(trainer.fit_loop, "_data_fetcher", None)
        ahead = len(getattr(fetcher, "batches", None) or ())
        now = _yielded(own)
        if own and ahead and now is not None:
            want = now - ahead
            found = [states for n, states in self._recent if n == want]
            if not found:
                raise RuntimeError(
                    f"ShardstreamCheckpoints: the loader is {ahead} batch(es) ahead of training "
                    f"and its state after {want} batches was not seen (seen: "
                    f"{[n for n, _ in self._recent]}); a checkpoint right after the first batch "
                    "of a Lightning epoch after the first cannot be made exact: checkpoint at "
                    "another step"
                )
            own = fit["combined_loader"] = found[-1]
        states: list[Any] = [own]
        if trainer.world_size > 1:
            import torch.distributed as dist

            states = [None] * trainer.world_size
            dist.all_gather_object(states, own)  # every rank dumps the checkpoint: a collective
        checkpoint[KEY] = states

    def on_load_checkpoint(self, trainer: Any, pl_module: Any, checkpoint: dict[str, Any]) -> None:
        states = checkpoint.get(KEY)
        fit = _fit_state(checkpoint)
        if states is None or "combined_loader" not in fit:
            return
        rank, world = trainer.global_rank, trainer.world_size
        if len(states) == world:
            fit["combined_loader"] = copy.deepcopy(states[rank])
            return
        # Another number of processes: the loader state keeps its shape (same num_workers),
        # and every dataset in it gets all old ranks' states, of which it reads its share.
        template = states[min(rank, len(states) - 1)]
        fit["combined_loader"] = [
            _with_dataset_states(t, [old[i] for old in states]) for i, t in enumerate(template)
        ]
