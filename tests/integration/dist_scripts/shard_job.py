"""One rank of a multi-process shardstream job, driven by tests/integration/test_distributed.py.

Run either by ``torchrun`` (``init == "dist"``: gloo process group; the dataset gets NO
rank/world_size arguments and must take them from ``torch.distributed`` -- the RANK/WORLD_SIZE
environment is overwritten with ``0``/``1`` after ``init_process_group`` so an env fallback
would be caught) or as a plain process with RANK/WORLD_SIZE in the environment
(``init == "env"``).

Usage: ``shard_job.py SPEC.json``. SPEC keys (``{rank}`` / ``{world}`` in paths are filled in):

* ``source``, ``settings``: ``ParquetStream(source, **settings)``.
* ``num_workers``: ``None`` iterates the dataset directly; an int wraps it in a torchdata
  ``StatefulDataLoader(ds, batch_size=None, num_workers=...)``.
* ``load``: ``None`` or ``{"via": "torch"|"dcp", "target": "dataset"|"loader", ...}``:
  ``via == "torch"``: ``"files"`` is a list of ``torch.save`` files; one file is passed as is,
  several as a list. ``via == "dcp"``: ``"dir"`` and ``"keys"`` = ``"own"`` (this rank's
  entry) or ``"all"`` (every rank's entry of the checkpoint, as a list).
  ``via == "dcp_two_phase"``: ``shardstream.checkpoint.load_dcp_states(ds, dir)`` (a checkpoint
  of ``save_dcp_entries``; target ``"dataset"`` only); the output gets ``dcp_ranks_read``.
  ``target == "dataset"``: ``ds.load_state_dict(x)``; ``"loader"``: ``loader.load_state_dict(x)``.
  ``"same_as_dcp"``: a DCP directory of the same checkpoint; the output gets ``dcp_equal``:
  whether it gives back exactly what was loaded (same ``keys``).
* ``stop``: ``None`` (iterate to the end) or a list of item counts indexed by rank
  (the last entry is used for higher ranks); after that many items the state is saved.
* ``save_torch``: path for ``torch.save(state)``; ``save_dcp``: a DCP checkpoint directory
  (entry ``shardstream/rank{rank}``, saved unflattened so each rank's state stays one value);
  ``save_dcp_entries``: a DCP checkpoint of ``shardstream.checkpoint.dcp_entries(state, rank)``
  beside a tensor, saved with the default planner.
* ``out``: JSON file written with ``{"rank", "world", "items": [[ids of each item], ...]}``.
"""

from __future__ import annotations

import json
import os
import sys


def dcp_key(rank: int) -> str:
    return f"shardstream/rank{rank}"


def load_torch(files: list[str]):
    import torch

    objs = [torch.load(p, weights_only=True) for p in files]
    return objs[0] if len(objs) == 1 else objs


def load_dcp(ckpt: str, which: str, rank: int):
    import torch.distributed.checkpoint as dcp

    if which == "own":
        keys = [dcp_key(rank)]
    else:
        keys = sorted(dcp.FileSystemReader(ckpt).read_metadata().state_dict_metadata)
    # Placeholder leaves: DCP replaces each non-tensor value with the stored object.
    template = {k: None for k in keys}
    dcp.load(template, checkpoint_id=ckpt)
    objs = [template[k] for k in keys]
    return objs[0] if len(objs) == 1 else objs


def main() -> None:
    with open(sys.argv[1]) as f:
        spec = json.load(f)

    import torch
    from shardstream import ParquetStream

    dist = None
    if spec["init"] == "dist":
        import torch.distributed as dist

        dist.init_process_group("gloo")
        rank, world = dist.get_rank(), dist.get_world_size()
        # The dataset must use torch.distributed, not the environment torchrun also sets.
        os.environ["RANK"], os.environ["WORLD_SIZE"] = "0", "1"
    else:
        rank, world = int(os.environ["RANK"]), int(os.environ["WORLD_SIZE"])

    def fill(path: str) -> str:
        return path.format(rank=rank, world=world)

    ds = ParquetStream(spec["source"], **spec["settings"])
    num_workers = spec.get("num_workers")
    loader = None

    load = spec.get("load")
    loaded = None
    extra: dict = {}
    if load is not None:
        if load["via"] == "torch":
            loaded = load_torch([fill(p) for p in load["files"]])
        elif load["via"] == "dcp":
            loaded = load_dcp(fill(load["dir"]), load["keys"], rank)
        elif load["via"] == "dcp_two_phase":
            from shardstream.checkpoint import load_dcp_states

            extra["dcp_ranks_read"] = load_dcp_states(ds, fill(load["dir"]))
        else:
            raise ValueError(load["via"])
        if load.get("same_as_dcp"):
            # The same checkpoint also saved with DCP must give back exactly the same states.
            other = load_dcp(fill(load["same_as_dcp"]), load["keys"], rank)
            extra["dcp_equal"] = other == loaded
        if load["target"] == "dataset" and load["via"] != "dcp_two_phase":
            ds.load_state_dict(loaded)

    if num_workers is not None:
        from torchdata.stateful_dataloader import StatefulDataLoader

        loader = StatefulDataLoader(ds, batch_size=None, num_workers=num_workers)
        if load is not None and load["target"] == "loader":
            loader.load_state_dict(loaded)
        source = loader
    else:
        if load is not None and load["target"] == "loader":
            raise ValueError("target 'loader' needs num_workers")
        source = ds

    stop = spec.get("stop")
    k = None if stop is None else stop[min(rank, len(stop) - 1)]
    items: list[list[int]] = []
    it = iter(source)
    while k is None or len(items) < k:
        try:
            item = next(it)
        except StopIteration:
            break
        ids = item["id"]
        if isinstance(ids, torch.Tensor):
            ids = ids.tolist()
        items.append([int(i) for i in ids])

    if k is not None:
        state = loader.state_dict() if loader is not None else ds.state_dict()
        if spec.get("save_torch"):
            torch.save(state, fill(spec["save_torch"]))
        if spec.get("save_dcp"):
            import torch.distributed.checkpoint as dcp
            from torch.distributed.checkpoint import DefaultSavePlanner

            # Keyed by rank: DCP deduplicates equal keys across ranks (keeping one rank's
            # value), and unflattened so the state is stored as one object, not as leaves.
            dcp.save(
                {dcp_key(rank): state},
                checkpoint_id=fill(spec["save_dcp"]),
                planner=DefaultSavePlanner(flatten_state_dict=False),
            )

        if spec.get("save_dcp_entries"):
            import torch.distributed.checkpoint as dcp
            from shardstream.checkpoint import dcp_entries

            # The default (flattening) planner, beside a tensor, as a training job saves.
            entries = {f"model.w{rank}": torch.full((2,), float(rank))}
            dcp.save(
                {**entries, **dcp_entries(state, rank)},
                checkpoint_id=fill(spec["save_dcp_entries"]),
            )

    with open(fill(spec["out"]), "w") as f:
        json.dump({"rank": rank, "world": world, "items": items, **extra}, f)

    if dist is not None:
        dist.barrier()
        dist.destroy_process_group()
    # Everything this job reports is written and closed above. Skip interpreter teardown:
    # under load torch's static destructors (gloo, DCP) occasionally abort a finished rank
    # ("terminate called without an active exception", exit -6).
    sys.stdout.flush()
    sys.stderr.flush()
    os._exit(0)


if __name__ == "__main__":
    main()
