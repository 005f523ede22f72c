"""HF accelerate with a ``Mixture``: the recipe of test_accelerate.py, exact with workers too.

``use_stateful_dataloader=True`` makes ``prepare()`` start the DataLoader workers before the
loader is known (accelerate asks torchdata's loader for its state); the mixture's workers must
still read every row on process 0 (which dispatches), not one process's share. Settings the
mixture cannot be exact with must raise on *every* process, naming the Mixture.

Run as ``torchrun test_accelerate_mixture.py SPEC.json`` this file is the job of every process.
"""

from __future__ import annotations

import os

import pytest
from shardstream import Mixture, Pack, ParquetStream
from trainer_jobs import accelerator, global_steps, job_main, refusal, run_job

pytestmark = pytest.mark.timeout(600)

HERE = os.path.abspath(__file__)
GLOBAL_BATCH = 16
SAMPLES = 320  # mixture items over all slots: 20 global batches
SAVE_AT = 7


def _mixture(spec, columns=("id",), **kw) -> Mixture:
    srcs = {
        n: ParquetStream(p, columns=list(columns), shuffle_buffer=32, seed=3)
        for n, p in spec["src"]
    }
    return Mixture(srcs, weights={"a": 2, "b": 1}, samples=SAMPLES, **kw)


def reference(spec, nw: int) -> list[list[int]]:
    """Global batches of one process's loader (what process 0 reads when it dispatches)."""
    from torch.utils.data import DataLoader

    dl = DataLoader(
        _mixture(spec, rank=0, world_size=1),
        batch_size=GLOBAL_BATCH,
        drop_last=True,
        num_workers=nw,
    )
    return [b["id"].tolist() for b in dl]


# ------------------------------------------------------------------------------------ the job


def _loader(ds, nw: int):
    from torch.utils.data import DataLoader

    return DataLoader(ds, batch_size=GLOBAL_BATCH, drop_last=True, num_workers=nw)


def _train(spec, nw: int, save: str | None = None, load: str | None = None) -> list:
    """One pass; ``save_state(save)`` after SAVE_AT steps (the run goes on), or
    ``load_state(load)`` first. Returns the ids of every step's batch on this process."""
    from shardstream.integrations.accelerate import register

    acc = accelerator(use_stateful_dataloader=True, split_batches=True)
    register(acc)
    dl = acc.prepare(_loader(_mixture(spec), nw))
    if load:
        acc.load_state(load)
    seen = []
    for batch in dl:
        seen.append(batch["id"].tolist())
        if save and len(seen) == SAVE_AT:
            acc.save_state(save)
    return seen


def job(spec, rank: int, world: int) -> dict:
    out = {}
    for nw in (0, 2):
        ckpt = f"{spec['ckpt']}-{nw}"
        out[f"full/{nw}"] = _train(spec, nw, save=ckpt)
        out[f"resumed/{nw}"] = _train(spec, nw, load=ckpt)
    if world > 1:  # refused on every process, not only on process 0 (which reads)
        packed = _mixture(spec, ["id", "tokens"], pack=Pack(column="tokens", seq_len=8))
        out["packed"] = refusal(lambda: next(iter(accelerator().prepare(_loader(packed, 0)))))
        shard = accelerator(dispatch_batches=False)
        out["no_dispatch"] = refusal(lambda: next(iter(shard.prepare(_loader(_mixture(spec), 2)))))
    return out


# ------------------------------------------------------------------------------------ tests


def test_accelerate_mixture(rows, shard_factory, tmp_path):
    """2 processes, DataLoader workers 0 and 2, the stateful recipe: the global stream equals
    one process's loader (every item once), a mid-pass resume continues it exactly, and the
    refused settings raise on both processes naming the Mixture."""
    b = shard_factory(num_shards=2, rows_per_shard=[60, 45], seed=9, start_id=1000)
    spec = {"src": [["a", rows], ["b", b.root]]}
    two = run_job(HERE, tmp_path, "p2", 2, **spec, ckpt=str(tmp_path / "ckpt"))
    for nw in (0, 2):
        expected = reference(spec, nw)
        assert len(expected) == SAMPLES // GLOBAL_BATCH
        assert global_steps(two, f"full/{nw}") == expected
        assert global_steps(two, f"resumed/{nw}") == expected[SAVE_AT:]
    for r in two:
        assert "packed batch's cu_seqlens" in r["packed"], r["packed"]
        assert "splits this Mixture between processes" in r["no_dispatch"], r["no_dispatch"]


if __name__ == "__main__":
    job_main(job)
