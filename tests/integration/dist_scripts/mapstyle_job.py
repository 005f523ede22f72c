"""One rank of a map-style job (``ParquetRows`` + ``ResumableSampler`` + torchdata's
``StatefulDataLoader``), driven by tests/integration/test_mapstyle_loader.py under torchrun.

The sampler gets NO rank/world_size: it must take them from ``torch.distributed`` (the
environment torchrun sets is overwritten with 0/1 after ``init_process_group``).

Usage: ``mapstyle_job.py SPEC.json``; SPEC keys (``{rank}`` in paths is filled in):

* ``source``, ``seed``, ``block_size``, ``batch_size``, ``num_workers``, ``epoch``.
* ``load``: ``None`` or a list of ``torch.save`` files (loader states of the old run; ``{rank}``
  filled in); one is loaded into the loader (same worker count), several into the sampler
  (elastic).
* ``stop``: ``None`` or the number of batches after which the loader's state is saved to
  ``save`` (ranks save in step, as training steps do); the job reads on to the epoch's end
  either way, so one run gives the uninterrupted stream and a state inside it.
* ``out``: JSON ``{"rank", "world", "ids": [...], "saved_at": ids read when saving or None}``.
"""

from __future__ import annotations

import json
import os
import sys


def main() -> None:
    with open(sys.argv[1]) as f:
        spec = json.load(f)

    import torch
    import torch.distributed as dist
    from shardstream import ParquetRows, ResumableSampler, collate
    from torchdata.stateful_dataloader import StatefulDataLoader

    dist.init_process_group("gloo")
    rank, world = dist.get_rank(), dist.get_world_size()
    os.environ["RANK"], os.environ["WORLD_SIZE"] = "0", "1"

    ds = ParquetRows(spec["source"], columns=["id"], output="python")
    sampler = ResumableSampler(ds, seed=spec["seed"], block_size=spec["block_size"], even=None)
    assert (sampler.rank, sampler.world_size) == (rank, world)
    sampler.set_epoch(spec["epoch"])
    loader = StatefulDataLoader(
        ds,
        batch_size=spec["batch_size"],
        sampler=sampler,
        num_workers=spec["num_workers"],
        collate_fn=collate,
    )
    load = spec.get("load")
    if load:
        states = [torch.load(p.format(rank=rank), weights_only=True) for p in load]
        if len(states) == 1:
            loader.load_state_dict(states[0])
        else:
            sampler.load_state_dict(states)
        sampler.set_epoch(spec["epoch"])  # the loaded epoch: keeps the loaded position

    ids: list[int] = []
    saved_at = None
    stop = spec.get("stop")
    for b, batch in enumerate(loader):
        ids += [int(i) for i in batch["id"]]
        if stop is not None and b + 1 == stop:
            torch.save(loader.state_dict(), spec["save"].format(rank=rank))
            saved_at = len(ids)
    with open(spec["out"].format(rank=rank), "w") as f:
        json.dump({"rank": rank, "world": world, "ids": ids, "saved_at": saved_at}, f)
    dist.barrier()
    dist.destroy_process_group()


if __name__ == "__main__":
    main()
