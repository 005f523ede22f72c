"""Where an iterator sits among ranks and DataLoader workers: shared by every dataset class.

A slot is ``rank * num_workers + worker_id`` of ``world_size * num_workers``; the core turns the
four numbers into its layout. The rank comes from the dataset's own ``rank``/``world_size``, or
an accelerate loader wrapping it (``integrations/accelerate.py``), or ``torch.distributed``,
or ``RANK``/``WORLD_SIZE``; the worker from ``torch.utils.data.get_worker_info()``. Resolved
when an iterator starts (inside the DataLoader worker), never when the dataset is built.
"""

from __future__ import annotations

import os
import sys
from typing import Any

from .integrations import accelerate as _accelerate


def dist_rank_world() -> tuple[int, int]:
    torch = sys.modules.get("torch")  # not imported: torch.distributed cannot be initialized
    if (
        torch is not None
        and torch.distributed.is_available()
        and torch.distributed.is_initialized()
    ):
        return torch.distributed.get_rank(), torch.distributed.get_world_size()
    return int(os.environ.get("RANK", "0")), int(os.environ.get("WORLD_SIZE", "1"))


def worker() -> tuple[int, int]:
    torch = sys.modules.get("torch")  # not imported: not in a DataLoader worker
    info = torch.utils.data.get_worker_info() if torch is not None else None
    return (info.id, info.num_workers) if info is not None else (0, 1)


def layout(dataset: Any, rank: int | None, world_size: int | None) -> tuple[int, int, int, int]:
    """``(rank, world_size, worker, num_workers)`` of an iterator of ``dataset`` made here and
    now (``rank``/``world_size``: the dataset's own arguments, ``None`` when not given)."""
    wrapped = dataset.__dict__.get("_wrapped") or _accelerate.wrapper(dataset)
    if wrapped is not None:  # inside an accelerate loader: read all rows, or refuse
        r, world = wrapped.slot(world_size)
    elif rank is not None and world_size is not None:
        r, world = rank, world_size
    else:
        r, world = dist_rank_world()
    if not 0 <= r < world:
        raise ValueError(f"rank {r} is not in [0, world_size={world})")
    return (r, world, *worker())


def check_rank(rank: Any, world_size: Any) -> None:
    """``rank``/``world_size`` arguments: both or neither, ints, ``0 <= rank < world_size``."""
    if (rank is None) != (world_size is None):
        raise ValueError("pass rank and world_size together (or neither)")
    for name, v in (("rank", rank), ("world_size", world_size)):
        if v is not None and (isinstance(v, bool) or not isinstance(v, int)):
            raise TypeError(f"{name} must be an int or None, got {type(v).__name__} {v!r}")
    if world_size is not None and rank is not None and not 0 <= rank < world_size < 2**32:
        raise ValueError(
            "rank must be in [0, world_size) and world_size below 2**32, got "
            f"rank={rank} world_size={world_size}"
        )
