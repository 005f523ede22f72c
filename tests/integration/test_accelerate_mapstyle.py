"""HF accelerate with a map-style dataset: ``ParquetRows`` + ``ResumableSampler(rank=0,
world_size=1)`` in the loader ``prepare()`` wraps, 2 processes.

accelerate keeps the DataLoader's sampler and splits its batches between processes itself
(``BatchSamplerShard``), so the sampler yields one global order on every process. Checked here,
on full id streams: every row once an epoch; a sampler split by rank as well (its default under
torchrun) is a ``ValueError`` on both processes (it read a quarter of the rows, silently); a
resume with ``skip_first_batches`` in the second epoch follows the loader's epoch (accelerate's
skip wrapper does not pass ``set_epoch`` on: the sampler read epoch 0's order); the stateful
loader (``use_stateful_dataloader=True``), which ``prepare()`` starts early, iterates with
workers and resumes exactly from ``save_state``.

Run as ``torchrun test_accelerate_mapstyle.py SPEC.json`` this file is the job of every process.
"""

from __future__ import annotations

import os

import pytest
from shardstream import ParquetRows, ResumableSampler, collate
from trainer_jobs import N_ROWS, accelerator, global_steps, job_main, refusal, run_job

pytestmark = pytest.mark.timeout(600)

HERE = os.path.abspath(__file__)
BATCH = 8  # per process: a global step is 16 rows, 26 steps an epoch (the last one padded)
EPOCHS = 2
SKIP = 5  # resumed steps into epoch 1
SAVE_AT = 9  # steps into epoch 0


def _loader(spec, sampler=None):
    from torch.utils.data import DataLoader

    ds = ParquetRows(spec["source"], columns=["id"], output="python")
    if sampler is None:
        sampler = ResumableSampler(ds, seed=11, rank=0, world_size=1)
    return DataLoader(
        ds, batch_size=BATCH, sampler=sampler, num_workers=spec["nw"], collate_fn=collate
    )


def _epochs(acc, dl, first: int = 0, save: str | None = None) -> list:
    seen = []
    for epoch in range(first, EPOCHS):
        dl.set_epoch(epoch)
        for batch in dl:
            seen.append([int(i) for i in batch["id"]])
            if save and len(seen) == SAVE_AT:
                acc.save_state(save)
    return seen


def job(spec, rank: int, world: int) -> dict:
    out = {}
    for nw in (0, 1):
        s = {**spec, "nw": nw}
        acc = accelerator()
        out[f"full/{nw}"] = _epochs(acc, acc.prepare(_loader(s)))
        # Resume in epoch 1 the way accelerate (and the HF Trainer) does: skip the batches
        # already trained on; the skip wrapper does not pass set_epoch(1) on to the sampler.
        acc = accelerator()
        skipped = acc.skip_first_batches(acc.prepare(_loader(s)), SKIP)
        out[f"skip/{nw}"] = _epochs(acc, skipped, first=1)
        # The stateful loader: prepare() asks for its state_dict(), which starts its workers.
        acc = accelerator(use_stateful_dataloader=True)
        out[f"stateful/{nw}"] = _epochs(acc, acc.prepare(_loader(s)), save=f"{s['ckpt']}-{nw}")
        acc = accelerator(use_stateful_dataloader=True)
        dl = acc.prepare(_loader(s))
        acc.load_state(f"{s['ckpt']}-{nw}")
        out[f"resumed/{nw}"] = _epochs(acc, dl)
    s = {**spec, "nw": 0}
    ds = ParquetRows(spec["source"], columns=["id"], output="python")

    def iterate(sampler):
        acc = accelerator()
        dl = acc.prepare(_loader(s, sampler))
        dl.set_epoch(0)
        next(iter(dl))

    # last: a refused loader stays in accelerate's GradientState
    out["default_ranks"] = refusal(lambda: iterate(ResumableSampler(ds, seed=11)))
    out["given_ranks"] = refusal(
        lambda: iterate(ResumableSampler(ds, seed=11, rank=rank, world_size=world))
    )
    return out


def test_accelerate_mapstyle(rows, tmp_path):
    two = run_job(HERE, tmp_path, "p2", 2, source=rows, ckpt=str(tmp_path / "ckpt"))
    for nw in (0, 1):
        full = global_steps(two, f"full/{nw}")
        per_epoch = len(full) // EPOCHS
        assert len(full) == EPOCHS * per_epoch == EPOCHS * -(-N_ROWS // (2 * BATCH))
        epochs = [full[:per_epoch], full[per_epoch:]]
        for e in epochs:
            ids = [i for step in e for i in step]
            # every row once; accelerate pads the last step with rows from the epoch's start
            assert sorted(set(ids)) == list(range(N_ROWS)) and len(ids) == per_epoch * 16
        assert epochs[0] != epochs[1]
        assert global_steps(two, f"skip/{nw}") == epochs[1][SKIP:], f"skip, {nw} workers"
        assert global_steps(two, f"stateful/{nw}") == full, f"stateful, {nw} workers"
        assert global_steps(two, f"resumed/{nw}") == full[SAVE_AT:], f"resumed, {nw} workers"
    for r in two:
        for key in ("default_ranks", "given_ranks"):
            msg = r[key]
            assert "pass rank=0, world_size=1" in msg and "1/4 of the rows" in msg, msg
        assert "torch.distributed" in r["default_ranks"]


if __name__ == "__main__":
    job_main(job)
