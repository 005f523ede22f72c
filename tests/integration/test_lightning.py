"""Lightning ``Trainer``: fit, a mid-epoch checkpoint, resume with ``ckpt_path`` -- exactly.

Recipe (docs/trainers.md): the ``ParquetStream`` (split by rank itself; Lightning adds no
sampler to iterable datasets) in a torchdata ``StatefulDataLoader``, whose state Lightning's
fit loop saves in the checkpoint and loads on resume; with several processes also the
``ShardstreamCheckpoints`` callback, which puts every rank's loader state into the checkpoint
(Lightning saves rank 0's only) and gives each rank its own back, or, with another number of
processes, every rank's states to the stream to split what is left.

Run as ``torchrun test_lightning.py SPEC.json`` this file is the job of every process; it
records the ids of every batch ``training_step`` got.
"""

from __future__ import annotations

import glob
import os

import pytest
from shardstream import ParquetStream
from trainer_jobs import N_ROWS, job_main, run_job

pytestmark = pytest.mark.timeout(600)

HERE = os.path.abspath(__file__)
# Endless (max_steps ends the run); even=None: every row once per epoch, for the elastic check.
DATA = dict(columns=["id"], shuffle_buffer=64, seed=7, epochs=None, even=None)
BATCH = 8
SAVE_AT = 9
# 2 ranks: 201 rows each, 26 batches per stream epoch: 34 steps cross into the second epoch.
STEPS = {1: 60, 2: 34}


def reference(source: str, rank: int, world: int, nw: int, steps: int) -> list[list[int]]:
    """The first ``steps`` batches of rank ``rank``'s uninterrupted loader."""
    from torchdata.stateful_dataloader import StatefulDataLoader

    ds = ParquetStream(source, **DATA, rank=rank, world_size=world)
    it = iter(StatefulDataLoader(ds, batch_size=BATCH, num_workers=nw))
    return [next(it)["id"].tolist() for _ in range(steps)]


# ------------------------------------------------------------------------------------ the job


def _fit(spec, world: int, nw: int, ckpt_dir: str | None, resume: str | None) -> list:
    import lightning as L
    import torch
    from lightning.pytorch.callbacks import ModelCheckpoint
    from torchdata.stateful_dataloader import StatefulDataLoader

    class Tiny(L.LightningModule):
        def __init__(self) -> None:
            super().__init__()
            self.layer = torch.nn.Linear(1, 1)
            self.seen: list[list[int]] = []

        def training_step(self, batch, _idx):
            self.seen.append(batch["id"].tolist())
            return self.layer(batch["id"].float().unsqueeze(1) / 1000).pow(2).mean()

        def configure_optimizers(self):
            return torch.optim.SGD(self.parameters(), lr=0.01)

    callbacks = []
    if spec["callback"]:
        from shardstream.integrations.lightning import ShardstreamCheckpoints

        callbacks.append(ShardstreamCheckpoints())
    if ckpt_dir:
        callbacks.append(
            ModelCheckpoint(dirpath=ckpt_dir, every_n_train_steps=SAVE_AT, save_top_k=-1)
        )
    trainer = L.Trainer(
        accelerator="cpu",
        devices=world,
        strategy="ddp" if world > 1 else "auto",
        max_steps=STEPS[world],
        callbacks=callbacks,
        logger=False,
        enable_progress_bar=False,
        enable_model_summary=False,
        enable_checkpointing=bool(ckpt_dir),
    )
    model = Tiny()
    loader = StatefulDataLoader(
        ParquetStream(spec["source"], **DATA), batch_size=BATCH, num_workers=nw
    )
    trainer.fit(model, loader, ckpt_path=resume)
    return model.seen


def _first_checkpoint(ckpt_dir: str) -> str:
    found = sorted(glob.glob(os.path.join(ckpt_dir, f"*step={SAVE_AT}*.ckpt")))
    assert found, f"no checkpoint at step {SAVE_AT} in {ckpt_dir}: {os.listdir(ckpt_dir)}"
    return found[0]


def job(spec, rank: int, world: int) -> dict:
    out = {}
    for nw in spec["nws"]:
        ckpt_dir = f"{spec['ckpt']}-{nw}"
        if spec.get("full"):
            out[f"full/{nw}"] = _fit(spec, world, nw, ckpt_dir, None)
        for name, (other, nws) in spec.get("resume", {}).items():
            if nw in nws:
                ckpt = _first_checkpoint(f"{other}-{nw}")
                out[f"{name}/{nw}"] = _fit(spec, world, nw, None, ckpt)
    return out


# ------------------------------------------------------------------------------------ tests


def test_lightning_fit_resume(rows, tmp_path):
    """2 processes, then 1, DataLoader workers 0 and 2: fit equals each rank's uninterrupted
    loader; resuming from the checkpoint of step 9 continues it exactly; resumed by 1 process
    from 2 processes' checkpoint (elastic), the rest of the epoch is read exactly once."""
    ck2, ck1 = str(tmp_path / "ck2"), str(tmp_path / "ck1")
    common = dict(source=rows, nws=[0, 2], callback=True, full=True)
    two = run_job(HERE, tmp_path, "p2", 2, ckpt=ck2, resume={"resumed": (ck2, [0, 2])}, **common)
    one = run_job(
        HERE,
        tmp_path,
        "p1",
        1,
        ckpt=ck1,
        resume={"resumed": (ck1, [0, 2]), "elastic": (ck2, [0])},
        **common,
    )
    for nw in (0, 2):
        for results, world in ((one, 1), (two, 2)):
            for r, res in enumerate(results):
                expected = reference(rows, r, world, nw, STEPS[world])
                where = f"rank {r} of {world}, {nw} workers"
                assert res[f"full/{nw}"] == expected, f"uninterrupted run, {where}"
                assert res[f"resumed/{nw}"] == expected[SAVE_AT:], f"resumed run, {where}"

    # Elastic: 2 ranks read SAVE_AT batches each of epoch 0; 1 rank reads the rest of it next.
    before = [i for r in two for b in r["full/0"][:SAVE_AT] for i in b]
    after = [i for b in one[0]["elastic/0"] for i in b]
    rest = N_ROWS - len(before)
    assert len(after) >= rest
    assert sorted(before + after[:rest]) == list(range(N_ROWS))


if __name__ == "__main__":
    job_main(job)


def test_lag_count_of_an_even_batches_state_is_its_steps(monkeypatch):
    """ShardstreamCheckpoints finds the state of the batch trained on by the batches yielded;
    under shardstream.EvenBatches that is the wrapper's step count (padding included), not its
    loader's (which stops while the rank pads). The module is loaded under another name with a
    stand-in for Lightning's Callback (importing Lightning costs seconds); nothing of the
    package or of a Lightning imported by other tests is replaced."""
    import importlib.util
    import sys
    import types

    import shardstream.integrations

    fake = {n: types.ModuleType(n) for n in ("lightning", "lightning.pytorch")}
    fake["lightning.pytorch.callbacks"] = types.ModuleType("lightning.pytorch.callbacks")
    fake["lightning.pytorch.callbacks"].Callback = object  # type: ignore[attr-defined]
    for name, mod in fake.items():
        monkeypatch.setitem(sys.modules, name, mod)
    path = os.path.join(shardstream.integrations.__path__[0], "lightning.py")
    spec = importlib.util.spec_from_file_location("_lightning_under_test", path)
    assert spec is not None and spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)

    loader = {"_num_yielded": 7, "_iterator_finished": True}
    assert module._yielded([loader]) == 7
    assert module._yielded([{"even_batches": {"steps": 11, "out": True}, "loader": loader}]) == 11
