"""HF ``Trainer``: a ParquetStream as ``train_dataset``, a mid-epoch checkpoint, resume.

Recipe (docs/trainers.md): the defaults. The Trainer prepares its loader with accelerate, which
dispatches batches for iterable datasets: process 0 reads, and ParquetStream reads every row
there (it sees accelerate's loader). ``resume_from_checkpoint`` makes the Trainer skip the
batches of the interrupted epoch already trained on, by reading them again (the stream is the
same every time for the same seed and epoch), so the batches after resume are exactly the
uninterrupted run's.

Run as ``torchrun test_hf_trainer.py SPEC.json`` this file is the job of every process; a tiny
GPT-2 built from a config (nothing downloaded) records the row ids of every batch it got.
"""

from __future__ import annotations

import os

import pytest
from shardstream import Mixture, ParquetRows, ParquetStream, ResumableSampler
from trainer_jobs import N_ROWS, global_steps, job_main, run_job

pytestmark = pytest.mark.timeout(600)

HERE = os.path.abspath(__file__)
DATA = dict(columns=["id"], output="python", shuffle_buffer=64, seed=7)  # epochs=1 per pass
PER_DEVICE = 8
SAVE_AT = 9
# 402 rows: 51 steps an epoch with 1 process (8 rows a step), 26 with 2 (16): both go on into
# the second epoch.
STEPS = {1: 60, 2: 34}
# DataLoader workers: more than 1 is refused with several processes (see the refusal check).
NWS = (0, 1)
VOCAB = 64


def collate(rows: list[dict]) -> dict:
    import torch

    ids = torch.tensor([r["id"] for r in rows])
    tokens = torch.stack([ids % VOCAB, (ids // VOCAB) % VOCAB], dim=1)
    return {"input_ids": tokens, "labels": tokens, "row_ids": ids}


def reference_epochs(source: str, world: int, nw: int, batch: int = PER_DEVICE) -> list:
    """Global batches of the first two epochs, per epoch: process 0's loader (``world x batch``
    rows a step; its workers split the stream), as the Trainer calls set_epoch."""
    from torch.utils.data import DataLoader

    ds = ParquetStream(source, **DATA, rank=0, world_size=1)
    dl = DataLoader(ds, batch_size=batch, collate_fn=collate, num_workers=nw)
    epochs = []
    for epoch in range(2):
        ds.set_epoch(epoch)
        base = [b["row_ids"].tolist() for b in dl]
        epochs.append([sum(base[i : i + world], []) for i in range(0, len(base), world)])
    return epochs


def mixture(a: str, b: str, **kw) -> Mixture:
    """The endless mixture of the recipe (``samples=None``): source ``b`` (60 rows) runs
    through several of its epochs while ``a`` is in its first."""
    return Mixture(
        {
            "a": ParquetStream(a, columns=["id"], shuffle_buffer=64, seed=7),
            "b": ParquetStream(b, columns=["id"], shuffle_buffer=16, seed=8),
        },
        weights={"a": 0.7, "b": 0.3},
        output="python",
        **kw,
    )


def reference_endless(source: str, world: int, nw: int, steps: int, mix: str | None = None) -> list:
    """The first ``steps`` global batches of one endless pass (``epochs=None``), or of the
    endless mixture of ``source`` and ``mix``."""
    import itertools

    from torch.utils.data import DataLoader

    if mix is None:
        ds = ParquetStream(source, **DATA, epochs=None, rank=0, world_size=1)
    else:
        ds = mixture(source, mix, rank=0, world_size=1)
    dl = DataLoader(ds, batch_size=PER_DEVICE, collate_fn=collate, num_workers=nw)
    base = [b["row_ids"].tolist() for b in itertools.islice(dl, steps * world)]
    return [sum(base[i : i + world], []) for i in range(0, len(base), world)]


# ------------------------------------------------------------------------------------ the job


def _train(spec, run: dict, nw: int) -> list:
    """One ``Trainer.train``: ``run`` has ``dir``, ``resume`` (a run dir or None), ``batch``
    (per_device_train_batch_size), ``split`` (accelerator_config split_batches), ``steps``."""
    from transformers import GPT2Config, GPT2LMHeadModel, Trainer, TrainingArguments

    class Recording(Trainer):
        seen: list[list[int]] = []

        def compute_loss(self, model, inputs, *args, **kwargs):
            self.seen.append(inputs.pop("row_ids").tolist())
            return super().compute_loss(model, inputs, *args, **kwargs)

        def _get_train_sampler(self, train_dataset=None):
            if run["kind"] != "rows-sampler":
                return super()._get_train_sampler(train_dataset)
            # accelerate splits the sampler's batches between processes: one global order
            return ResumableSampler(self.train_dataset, seed=11, rank=0, world_size=1)

    config = GPT2Config(vocab_size=VOCAB, n_positions=4, n_embd=8, n_layer=1, n_head=2)
    args = TrainingArguments(
        output_dir=f"{run['dir']}-{nw}",
        per_device_train_batch_size=run["batch"],
        max_steps=run["steps"],
        accelerator_config={"split_batches": run["split"]},
        save_strategy="steps",
        save_steps=SAVE_AT,
        use_cpu=True,
        report_to="none",
        logging_strategy="no",
        disable_tqdm=True,
        dataloader_num_workers=nw,
        remove_unused_columns=False,
        seed=0,
    )
    trainer = Recording(
        model=GPT2LMHeadModel(config),
        args=args,
        train_dataset=(
            mixture(spec["source"], spec["mix"])
            if run["kind"] == "mixture"
            else ParquetRows(spec["source"], columns=["id"], output="python")
            if run["kind"].startswith("rows")
            else ParquetStream(spec["source"], **DATA, epochs=run["epochs"])
        ),
        data_collator=collate,
    )
    trainer.seen = []
    ckpt = f"checkpoint-{run['ckpt']}"
    resume = run["resume"] and os.path.join(f"{run['resume']}-{nw}", ckpt)
    trainer.train(resume_from_checkpoint=resume)
    return trainer.seen


def job(spec, rank: int, world: int) -> dict:
    out = {f"{run['name']}/{nw}": _train(spec, run, nw) for nw in NWS for run in spec["runs"]}
    if world > 1:  # 2 workers: their last batches of an epoch come mid-stream, maybe short
        try:
            _train(spec, _run("refused", spec["refused_dir"]), 2)
            out["refused"] = "no error"
        except ValueError as e:
            out["refused"] = str(e)
    return out


def _run(
    name: str,
    run_dir,
    resume=None,
    batch: int = PER_DEVICE,
    split=False,
    steps=34,
    epochs: int | None = 1,
    ckpt: int = SAVE_AT,
    kind: str = "stream",
) -> dict:
    return dict(
        kind=kind,
        name=name,
        dir=str(run_dir),
        resume=resume and str(resume),
        batch=batch,
        split=split,
        steps=steps,
        epochs=epochs,
        ckpt=ckpt,
    )


def _at_27(name: str, tmp_path, **kw) -> list[dict]:
    """Run ``name`` (2 processes) and ``{name}-resumed`` from its checkpoint at step 27."""
    return [
        _run(name, tmp_path / name, steps=STEPS[2], **kw),
        _run(
            f"{name}-resumed",
            tmp_path / f"{name}-r",
            resume=tmp_path / name,
            steps=STEPS[2],
            ckpt=3 * SAVE_AT,
            **kw,
        ),
    ]


# ------------------------------------------------------------------------------------ tests


def test_hf_trainer_resume(rows, shard_factory, tmp_path):
    """2 processes, then 1, DataLoader workers 0 and 1: the Trainer trains on every row once an
    epoch (the one-process stream); resuming from checkpoint-9 gives exactly the uninterrupted
    run's batches, by as many processes and (elastic, with split_batches so that the loader's
    batch stays the same) by 1 process from 2 processes' checkpoint. The endless recipe, for a
    stream and for a Mixture, resumed at step 27 (past a data epoch) is exact too."""
    d2, d1, ds = tmp_path / "run2", tmp_path / "run1", tmp_path / "split2"
    small = shard_factory(num_shards=2, rows_per_shard=[35, 25], seed=9, start_id=1000).root
    two = run_job(
        HERE,
        tmp_path,
        "p2",
        2,
        source=rows,
        mix=small,
        refused_dir=str(tmp_path / "no"),
        runs=[
            _run("full", d2, steps=STEPS[2]),
            _run("resumed", tmp_path / "run2r", resume=d2, steps=STEPS[2]),
            # split_batches: the loader's batch (16) is the global batch, cut between processes.
            _run("split", ds, batch=2 * PER_DEVICE, split=True, steps=STEPS[2]),
            # The recipe for runs longer than an epoch: one endless pass, resumed in data epoch
            # 1 (26 steps an epoch). The Trainer counts an iterable's epochs by max_steps, so
            # with epochs=1 it would skip past the end of the first pass and start another.
            *_at_27("endless", tmp_path, epochs=None),
            # The same recipe for a Mixture (samples=None): at step 27 source b is in its
            # third epoch.
            *_at_27("mix", tmp_path, epochs=None, kind="mixture"),
            # Map-style: ParquetRows with the Trainer's own sampler, and with a
            # ResumableSampler; resumed at step 27, in the second epoch.
            *_at_27("rows", tmp_path, kind="rows"),
            *_at_27("rows-sampler", tmp_path, kind="rows-sampler"),
        ],
    )
    one = run_job(
        HERE,
        tmp_path,
        "p1",
        1,
        source=rows,
        runs=[
            _run("full", d1, steps=STEPS[1]),
            _run("resumed", tmp_path / "run1r", resume=d1, steps=STEPS[1]),
            _run(
                "elastic",
                tmp_path / "split1r",
                resume=ds,
                batch=2 * PER_DEVICE,
                split=True,
                steps=STEPS[2],
            ),
        ],
    )
    for r in two:
        assert "dataloader_num_workers" in r["refused"]
    for nw in NWS:
        for results, world in ((one, 1), (two, 2)):
            epochs = reference_epochs(rows, world, nw)
            # Every row once an epoch; the run goes on into the second.
            assert sorted(i for step in epochs[0] for i in step) == list(range(N_ROWS))
            expected = (epochs[0] + epochs[1])[: STEPS[world]]
            assert len(epochs[0]) < STEPS[world] == len(expected)
            where = f"{world} process(es), {nw} workers"
            assert global_steps(results, f"full/{nw}") == expected, where
            assert global_steps(results, f"resumed/{nw}") == expected[SAVE_AT:], where
        endless = reference_endless(rows, 2, nw, STEPS[2])
        assert len(endless) == STEPS[2] > 3 * SAVE_AT > N_ROWS // (2 * PER_DEVICE)
        assert global_steps(two, f"endless/{nw}") == endless, f"endless, {nw} workers"
        assert global_steps(two, f"endless-resumed/{nw}") == endless[3 * SAVE_AT :], nw
        mixed = reference_endless(rows, 2, nw, STEPS[2], mix=small)
        ids = [i for step in mixed[: 3 * SAVE_AT] for i in step]
        assert len([i for i in ids if i >= 1000]) > 2 * 60  # b is in its third epoch
        assert global_steps(two, f"mix/{nw}") == mixed, f"mixture, {nw} workers"
        assert global_steps(two, f"mix-resumed/{nw}") == mixed[3 * SAVE_AT :], nw
        # Map-style: 26 steps an epoch of 16 rows, the last one padded by accelerate with rows
        # from the epoch's start; the resumed run in epoch 1 continues exactly.
        for kind in ("rows", "rows-sampler"):
            full = global_steps(two, f"{kind}/{nw}")
            assert sorted(set(i for step in full[:26] for i in step)) == list(range(N_ROWS))
            resumed = global_steps(two, f"{kind}-resumed/{nw}")
            assert resumed == full[3 * SAVE_AT :], f"{kind}, {nw} workers"
        # The sampler's order, one global order cut by accelerate into steps of 16 rows:
        # epoch 0's 25 full steps (then the padded one), then epoch 1's.
        steps = []
        for epoch in (0, 1):
            s = ResumableSampler(N_ROWS, seed=11, rank=0, world_size=1)
            s.set_epoch(epoch)
            o = list(s)
            steps.append([o[i : i + 16] for i in range(0, N_ROWS - 16, 16)])
        full = global_steps(two, f"rows-sampler/{nw}")
        assert full[:25] == steps[0] and full[26:] == steps[1][: STEPS[2] - 26], nw
        # Elastic: checkpoint of 2 processes, resumed by 1, the loader's batch kept (split).
        epochs = reference_epochs(rows, 1, nw, batch=2 * PER_DEVICE)
        expected = (epochs[0] + epochs[1])[: STEPS[2]]
        assert global_steps(two, f"split/{nw}") == expected, f"split_batches, {nw} workers"
        assert global_steps(one, f"elastic/{nw}") == expected[SAVE_AT:], f"elastic, {nw} workers"


if __name__ == "__main__":
    job_main(job)
