"""HF accelerate with a plain training loop: exactly-once epochs, exact resume, refusals.

Recipe (docs/trainers.md): ``Accelerator(dataloader_config=DataLoaderConfiguration(
use_stateful_dataloader=True, split_batches=True))``, ``register(accelerator)``, a row-mode
``ParquetStream`` in a ``DataLoader`` with the global batch size, ``save_state``/``load_state``.
accelerate dispatches batches (its default for iterable datasets): process 0 reads every row.

Run as ``torchrun test_accelerate.py SPEC.json`` this file is the job of every process. Per
process and step it records the ids of the batch the model got; the global batch of a step is
the ranks' batches in rank order (``split_batches``: one loader batch cut in rank order), so runs
with 1 and 2 processes are compared on the same global stream.
"""

from __future__ import annotations

import os

import pytest
from shardstream import ParquetStream
from trainer_jobs import N_ROWS, accelerator, global_steps, job_main, refusal, run_job

pytestmark = pytest.mark.timeout(600)

HERE = os.path.abspath(__file__)
DATA = dict(columns=["id"], shuffle_buffer=64, seed=7)  # row mode, epochs=1 per pass
GLOBAL_BATCH = 16
EPOCHS = 2
SAVE_AT = 9  # steps into epoch 0


def reference(source: str, nw: int) -> list[list[int]]:
    """Global batches of EPOCHS uninterrupted passes of one process's loader (what process 0
    reads when it dispatches): its DataLoader workers split the rows, drop_last per worker."""
    from torch.utils.data import DataLoader

    ds = ParquetStream(source, **DATA, rank=0, world_size=1)
    dl = DataLoader(ds, batch_size=GLOBAL_BATCH, drop_last=True, num_workers=nw)
    out = []
    for epoch in range(EPOCHS):
        ds.set_epoch(epoch)
        out += [b["id"].tolist() for b in dl]
    return out


# ------------------------------------------------------------------------------------ the job


def _loader(spec, ds=None, drop_last: bool = True):
    from torch.utils.data import DataLoader

    ds = ds if ds is not None else ParquetStream(spec["source"], **DATA)
    return DataLoader(ds, batch_size=GLOBAL_BATCH, drop_last=drop_last, num_workers=spec["nw"])


def _train(spec, world: int, save: str | None = None, load: str | None = None) -> list:
    """EPOCHS passes of a tiny model; ``save_state(save)`` after SAVE_AT steps (the run goes
    on), or ``load_state(load)`` first. Returns the ids of every step's batch on this process."""
    import torch
    from shardstream.integrations.accelerate import register

    acc = accelerator(use_stateful_dataloader=True, split_batches=True)
    register(acc)
    model = torch.nn.Linear(1, 1)
    opt = torch.optim.SGD(model.parameters(), lr=0.01)
    model, opt, dl = acc.prepare(model, opt, _loader(spec))
    if load:
        acc.load_state(load)
    seen = []
    for _epoch in range(EPOCHS):
        for batch in dl:
            seen.append(batch["id"].tolist())
            loss = model(batch["id"].float().unsqueeze(1) / N_ROWS).pow(2).mean()
            acc.backward(loss)
            opt.step()
            opt.zero_grad()
            if save and len(seen) == SAVE_AT:
                acc.save_state(save)
    return seen


def _refusals(spec, world: int) -> dict:
    """What the stream says under the settings it cannot be exact with (every process raises)."""
    from accelerate.data_loader import prepare_data_loader

    out = {}

    def iterate(acc, ds=None):
        next(iter(acc.prepare(_loader(spec, ds))))

    out["unregistered"] = refusal(
        lambda: iterate(accelerator(use_stateful_dataloader=True, split_batches=True))
    )
    out["no_split"] = refusal(lambda: iterate(accelerator(use_stateful_dataloader=True)))
    out["no_dispatch"] = refusal(lambda: iterate(accelerator(dispatch_batches=False)))
    out["no_dispatch_prepare"] = refusal(
        lambda: next(iter(prepare_data_loader(_loader(spec), dispatch_batches=False)))
    )
    out["workers"] = refusal(
        lambda: next(iter(accelerator().prepare(_loader({**spec, "nw": 2}, None, False))))
    )
    out["ranked"] = refusal(
        lambda: iterate(accelerator(), ParquetStream(spec["source"], **DATA, rank=0, world_size=2))
    )
    return out


def _default_epoch(spec, world: int) -> list:
    """accelerate's defaults, no resume: ``Accelerator().prepare(DataLoader(stream, 16))``."""
    acc = accelerator()
    return [b["id"].tolist() for b in acc.prepare(_loader(spec, drop_last=False))]


def job(spec, rank: int, world: int) -> dict:
    out = {}
    for nw in (0, 2):
        spec = {**spec, "nw": nw}
        if nw == 0:  # with 2 workers and 2 processes: refused (below)
            out["default"] = _default_epoch(spec, world)
        out[f"full/{nw}"] = _train(spec, world, save=f"{spec['ckpt']}-{nw}")
        for name, ckpt in spec["resume"].items():
            out[f"{name}/{nw}"] = _train(spec, world, load=f"{ckpt}-{nw}")
    if world > 1:  # last: a refused loader stays in accelerate's GradientState
        out["refusals"] = _refusals({**spec, "nw": 0}, world)
    return out


# ------------------------------------------------------------------------------------ tests


def test_accelerate_loop(rows, tmp_path):
    """2 processes, then 1, DataLoader workers 0 and 2: the default settings read every row
    once; stateful runs equal the one-process loader's stream; resumes from a mid-epoch
    checkpoint, by as many and by fewer processes, continue it exactly; refusals name the
    setting to change."""
    ck2, ck1 = str(tmp_path / "ckpt2"), str(tmp_path / "ckpt1")
    two = run_job(HERE, tmp_path, "p2", 2, source=rows, ckpt=ck2, resume={"resumed": ck2})
    one = run_job(
        HERE, tmp_path, "p1", 1, source=rows, ckpt=ck1, resume={"resumed": ck1, "elastic": ck2}
    )
    for nw in (0, 2):
        expected = reference(rows, nw)
        assert len(expected) >= EPOCHS * (N_ROWS // GLOBAL_BATCH - nw)
        for results in (one, two):
            assert global_steps(results, f"full/{nw}") == expected
            assert global_steps(results, f"resumed/{nw}") == expected[SAVE_AT:]
        # Elastic: saved by 2 processes, resumed by 1 (same global batch).
        assert global_steps(one, f"elastic/{nw}") == expected[SAVE_AT:]

    for results in (one, two):
        # accelerate's defaults: every row once (402 rows: nothing to pad at the end).
        default = sorted(i for step in global_steps(results, "default") for i in step)
        assert default == list(range(N_ROWS))
    for r in two:
        msgs = r["refusals"]
        assert "num_workers=0 or 1" in msgs["workers"]
        assert "register(accelerator)" in msgs["unregistered"]
        assert "split_batches=True" in msgs["no_split"]
        assert "dispatch_batches=True" in msgs["no_dispatch"]
        assert "IterableDatasetShard" in msgs["no_dispatch_prepare"]
        assert "world_size=2" in msgs["ranked"]


if __name__ == "__main__":
    job_main(job)
