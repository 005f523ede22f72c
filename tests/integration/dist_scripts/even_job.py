"""One rank of a packed stream under ``shardstream.EvenBatches``, driven by
tests/integration/test_distributed.py (2 gloo processes). One launch runs every case:

* ``pad``: the whole pass; ``drop``: the whole pass, and the batches each rank dropped;
* ``no_batch``: ``pad`` where rank 0 has no batch at all (the error each rank raised);
* ``pad_w2``: ``pad`` through a 2-worker StatefulDataLoader, the whole pass;
* ``resume``: the same, stopped ``k`` steps in (one step after the rank with fewest real
  batches ran out, so inside its padding phase), saved with ``torch.save``, then a fresh
  loader and wrapper loaded from it run to the end.

The dataset gets NO rank/world_size: it takes them from torch.distributed.

Usage: ``even_job.py SPEC.json``; SPEC: ``source``, ``settings``, ``pack``
(``ParquetStream(source, columns=["input_ids"], pack=Pack(**pack), **settings)``), ``out``
(``{rank}`` filled in) and ``store`` (a file for the process group's file store, for plain
processes with RANK/WORLD_SIZE set; without it, torchrun's environment). Output JSON: per
case the batches as ``[input_ids, segment_ids]`` flat lists, ``dropped``, ``padded``,
whether the loader's state is end-of-pass (``finished``), and ``k``.
"""

from __future__ import annotations

import io
import json
import os
import sys


def main() -> None:
    with open(sys.argv[1]) as f:
        spec = json.load(f)

    import torch
    import torch.distributed as dist
    from shardstream import EvenBatches, Pack, ParquetStream
    from torchdata.stateful_dataloader import StatefulDataLoader

    if spec.get("store"):  # plain processes: RANK/WORLD_SIZE in the environment, a file store
        dist.init_process_group(
            "gloo",
            init_method="file://" + spec["store"],
            rank=int(os.environ["RANK"]),
            world_size=int(os.environ["WORLD_SIZE"]),
        )
    else:
        dist.init_process_group("gloo")
    rank = dist.get_rank()
    os.environ["RANK"], os.environ["WORLD_SIZE"] = "0", "1"

    def loader(num_workers: int) -> StatefulDataLoader:
        ds = ParquetStream(
            spec["source"], columns=["input_ids"], pack=Pack(**spec["pack"]), **spec["settings"]
        )
        return StatefulDataLoader(ds, batch_size=None, num_workers=num_workers)

    def rec(b) -> list[list[int]]:
        return [b["input_ids"].reshape(-1).tolist(), b["segment_ids"].reshape(-1).tolist()]

    out: dict = {"rank": rank}
    for policy in ("pad", "drop"):
        even = EvenBatches(loader(0), policy)
        out[policy] = [rec(b) for b in even]
        out[f"{policy}_dropped"] = even.dropped
        out[f"{policy}_padded"] = even.padded
        out[f"{policy}_finished"] = even.state_dict()["loader"]["_iterator_finished"]

    # Rank 0's documents are all longer than seq_len: with long_docs="drop" it has no batch,
    # so nothing to shape padding on; every rank must raise (not rank 0 alone: a hang).
    ds = ParquetStream(
        spec["source"],
        columns=["input_ids"],
        pack=Pack(**spec["pack"], long_docs="drop"),
        **spec["settings"],
    )
    try:
        out["no_batch"] = [rec(b) for b in EvenBatches(ds, "pad")]
    except ValueError as e:
        out["no_batch"] = str(e)

    even = EvenBatches(loader(2), "pad")
    out["pad_w2"] = [rec(b) for b in even]
    # The step inside the padding phase of the rank with the fewest real batches.
    n_real = torch.tensor([len(out["pad_w2"]) - even.padded])
    dist.all_reduce(n_real, op=dist.ReduceOp.MIN)
    k = out["k"] = int(n_real) + 1
    even = EvenBatches(loader(2), "pad")
    it = iter(even)
    head = [rec(next(it)) for _ in range(k)]
    buf = io.BytesIO()
    torch.save(even.state_dict(), buf)
    del it, even
    even = EvenBatches(loader(2), "pad")
    even.load_state_dict(torch.load(io.BytesIO(buf.getvalue()), weights_only=True))
    out["resume_head"] = head
    out["resume_tail"] = [rec(b) for b in even]

    with open(spec["out"].format(rank=rank), "w") as f:
        json.dump(out, f)
    dist.barrier()
    dist.destroy_process_group()
    sys.stdout.flush()
    sys.stderr.flush()
    os._exit(0)  # as shard_job.py: skip torch's teardown, which may abort a finished rank


if __name__ == "__main__":
    main()
