"""Reliability 4: SIGKILL soak of a checkpointing training loop.

tests/reliability/scripts/soak_train.py trains over a ``StatefulDataLoader(num_workers=2)``
of a shuffled ``ParquetStream``, checkpoints every few steps with
``shardstream.checkpoint.save_checkpoint`` (pausing inside every save) and logs every batch
with an fsync. This test SIGKILLs its whole process group at random moments (about a third
of them land inside a save) and restarts it, again and again; after each stream is complete
it replays the log the way a real job experiences it: batches after the checkpoint the next
run resumed from are discarded (the model state was rolled back with the checkpoint). Then:

* the surviving batches are exactly the batches of an uninterrupted run, in order (exact
  resume across every kill), so each epoch holds every row exactly once;
* the next run always resumed from a checkpoint at least as new as the last one the killed
  run had reported durable (no save that claimed to be complete was lost or torn);
* every run resumes from a complete checkpoint (``load_latest_checkpoint`` never has to skip
  a damaged file) and no temporary file is ever mistaken for one.

``SHARDSTREAM_SOAK_KILLS`` (default 50) kills; ``SHARDSTREAM_SOAK_SEED`` seeds the kill times.
``SHARDSTREAM_SOAK_EXEC=1`` starts every run as a new interpreter instead of forking it from
a pre-imported zygote (slower: ~2.5 s of imports per restart).
"""

from __future__ import annotations

import json
import os
import random
import signal
import subprocess
import sys
import time
from collections import Counter

import pytest
from harness import TESTS_DIR
from reliability.scripts.soak_train import read_log
from shardstream import datagen
from shardstream.checkpoint import list_checkpoints, load_latest_checkpoint

SCRIPT = os.path.join(TESTS_DIR, "reliability", "scripts", "soak_train.py")

# 2 shards x 192 rows, batches of 8, 2 workers: every worker yields 24 batches per epoch, so
# each epoch is 48 consecutive batches of the loader's stream.
ROWS, SHARDS, BATCH, EPOCHS, WORKERS = 192, 2, 8, 3, 2
BATCHES_PER_EPOCH = ROWS * SHARDS // BATCH
RUN_ARGS = dict(
    batch_size=BATCH,
    shuffle_buffer=20,
    seed=11,
    epochs=EPOCHS,
    num_workers=WORKERS,
    ckpt_every=4,
    step_sleep=0.01,
    save_delay=0.05,
)


class Runner:
    """Starts training runs (forked from a zygote, or exec'd) and kills them."""

    def __init__(self, exec_mode: bool):
        self.exec_mode = exec_mode
        self.procs: dict[int, subprocess.Popen] = {}
        self.zygote = None
        if not exec_mode:
            self.zygote = subprocess.Popen(
                [sys.executable, SCRIPT, "--zygote"],
                stdin=subprocess.PIPE,
                stdout=subprocess.PIPE,
                text=True,
            )

    def _ask(self, cmd: dict) -> dict:
        assert self.zygote is not None and self.zygote.stdin and self.zygote.stdout
        self.zygote.stdin.write(json.dumps(cmd) + "\n")
        self.zygote.stdin.flush()
        line = self.zygote.stdout.readline()
        assert line, "the zygote died"
        return json.loads(line)

    def start(self, args: dict) -> int:
        if self.exec_mode:
            out = open(os.path.join(args["work"], "runs.txt"), "a")  # noqa: SIM115
            p = subprocess.Popen(
                [sys.executable, SCRIPT, "--args", json.dumps(args)],
                stdout=out,
                stderr=out,
                start_new_session=True,
            )
            out.close()
            self.procs[p.pid] = p
            return p.pid
        return self._ask({"cmd": "run", "args": args})["pid"]

    def wait(self, pid: int) -> int:
        if self.exec_mode:
            return self.procs.pop(pid).wait()
        return self._ask({"cmd": "wait", "pid": pid})["status"]

    def kill(self, pid: int) -> None:
        try:
            os.killpg(pid, signal.SIGKILL)  # the run and its DataLoader workers
        except ProcessLookupError:
            pass

    def close(self) -> None:
        if self.zygote is not None:
            try:
                self._ask({"cmd": "quit"})
            except (AssertionError, BrokenPipeError, json.JSONDecodeError):
                pass
            self.zygote.wait(timeout=30)
            for f in (self.zygote.stdin, self.zygote.stdout):
                if f is not None:
                    f.close()


def wait_for_save(ckpt_dir, timeout: float) -> None:
    """Return as soon as a checkpoint is being written (its temporary file exists)."""
    end = time.time() + timeout
    while time.time() < end:
        try:
            if any(".tmp-" in n for n in os.listdir(ckpt_dir)):
                return
        except FileNotFoundError:
            pass
        time.sleep(0.002)


def effective_stream(records: list[dict]) -> tuple[list[list[int]], dict]:
    """Replay a log the way the job experienced it; returns the surviving batches and facts."""
    kept: list[tuple[int, list[int]]] = []
    facts = Counter()
    last_durable = 0  # newest checkpoint the current run reported complete
    ended = False
    for rec in records:
        kind = rec["r"]
        if kind == "start":
            s = rec["resumed_from"]
            assert s >= last_durable, (
                f"a run resumed from step {s}, but step {last_durable} had been reported durable"
            )
            assert len(kept) >= s, f"resumed from step {s} but only {len(kept)} batches logged"
            facts["discarded batches"] += len(kept) - s
            del kept[s:]
            facts["runs"] += 1
            last_durable = s
            ended = False
        elif kind == "batch":
            assert rec["step"] == len(kept) + 1, f"step {rec['step']} after {len(kept)} batches"
            kept.append((rec["step"], rec["ids"]))
        elif kind == "ckpt":
            assert rec["step"] == len(kept), rec
            last_durable = rec["step"]
        elif kind == "end":
            ended = True
    assert ended, "the last run did not finish"
    return [ids for _, ids in kept], facts


def check_epochs(batches: list[list[int]], all_ids: list[int]) -> None:
    assert len(batches) == EPOCHS * BATCHES_PER_EPOCH, len(batches)
    want = Counter(all_ids)
    for e in range(EPOCHS):
        got = Counter(
            i for b in batches[e * BATCHES_PER_EPOCH : (e + 1) * BATCHES_PER_EPOCH] for i in b
        )
        assert got == want, (
            f"epoch {e}: missing {sorted(want - got)[:10]} extra {sorted(got - want)[:10]}"
        )


@pytest.mark.timeout(1800)
def test_sigkill_soak(tmp_path):
    kills_wanted = int(os.environ.get("SHARDSTREAM_SOAK_KILLS", 50))
    rnd = random.Random(int(os.environ.get("SHARDSTREAM_SOAK_SEED", 7)))
    exec_mode = os.environ.get("SHARDSTREAM_SOAK_EXEC") == "1"
    data = tmp_path / "data"
    datagen.write_shards(str(data), num_shards=SHARDS, rows_per_shard=ROWS, row_group_size=40)
    all_ids = list(range(ROWS * SHARDS))
    runner = Runner(exec_mode)
    t0 = time.time()
    try:
        # the uninterrupted reference
        ref_work = tmp_path / "reference"
        ref_work.mkdir()
        args = dict(RUN_ARGS, data=str(data), work=str(ref_work))
        assert runner.wait(runner.start(args)) == 0, (ref_work / "runs.txt").read_text()[-3000:]
        reference, _ = effective_stream(read_log(str(ref_work / "ids.log")))
        check_epochs(reference, all_ids)

        kills = during_save = generations = restarts = 0
        totals: Counter = Counter()
        # A forked run yields its first batch ~0.15 s after the fork, an exec'd one after ~3 s.
        # A third of the kills wait for a save to be in progress, the rest land anywhere.
        low, high = (0.02, 0.8) if not exec_mode else (0.5, 5.0)
        while kills < kills_wanted:
            generations += 1
            work = tmp_path / f"gen{generations}"
            work.mkdir()
            args = dict(RUN_ARGS, data=str(data), work=str(work))
            while True:
                found = load_latest_checkpoint(str(work / "ckpt"))
                steps = list_checkpoints(str(work / "ckpt"))
                if steps:  # the newest checkpoint file is always complete
                    assert found is not None and found[0] == steps[-1], (steps, found)
                pid = runner.start(args)
                restarts += 1
                if kills < kills_wanted:
                    if rnd.random() < 0.35:
                        wait_for_save(work / "ckpt", timeout=high * 4)
                    else:
                        time.sleep(rnd.uniform(low, high))
                    runner.kill(pid)
                status = runner.wait(pid)
                if status == -signal.SIGKILL:
                    kills += 1
                    tmp = [n for n in os.listdir(work / "ckpt") if ".tmp-" in n]
                    during_save += bool(tmp)
                    continue
                log = (work / "runs.txt").read_text() if (work / "runs.txt").exists() else ""
                assert status == 0, f"run exited with {status}:\n{log[-3000:]}"
                break
            got, facts = effective_stream(read_log(str(work / "ids.log")))
            totals.update(facts)
            assert got == reference, (
                f"generation {generations}: the stream after {facts['runs'] - 1} kills differs "
                f"from the uninterrupted run"
            )
            check_epochs(got, all_ids)
    finally:
        runner.close()
    summary = dict(
        kills=kills,
        kills_during_save=during_save,
        restarts=restarts,
        completed_streams=generations,
        discarded_batches=totals["discarded batches"],
        seconds=round(time.time() - t0, 1),
    )
    print(f"\nsigkill soak: {summary}")
    assert kills >= kills_wanted
    assert during_save > 0, "no kill landed inside a save: the soak is not testing the saves"


# ------------------------------------------------------------------ the checkpoint helper


def test_checkpoint_helper_basics(tmp_path):
    from shardstream.checkpoint import atomic_write, checkpoint_path, save_checkpoint

    d = tmp_path / "ck"
    assert load_latest_checkpoint(str(d)) is None
    for step in (5, 10, 15):
        save_checkpoint({"step": step}, str(d), step, keep=2)
    assert list_checkpoints(str(d)) == [10, 15]  # pruned to the newest two
    step, obj, path = load_latest_checkpoint(str(d))
    assert (step, obj, path) == (15, {"step": 15}, checkpoint_path(str(d), 15))
    # a temporary file left by a killed save is never taken for a checkpoint...
    (d / ".ckpt-000000000020.pt.tmp-abc").write_bytes(b"half a checkpoint")
    assert load_latest_checkpoint(str(d))[0] == 15
    # ...and the next save removes it
    save_checkpoint({"step": 20}, str(d), 20)
    assert not [n for n in os.listdir(d) if ".tmp-" in n]
    # a damaged newest file (not something an atomic save leaves) falls back to the previous
    with open(checkpoint_path(str(d), 20), "r+b") as f:
        f.truncate(10)
    assert load_latest_checkpoint(str(d))[:2] == (15, {"step": 15})

    # a write that fails midway leaves the previous content and no temporary file
    target = tmp_path / "file.bin"
    atomic_write(str(target), b"old")

    def boom(f):
        f.write(b"new, partial")
        raise OSError("disk full")

    with pytest.raises(OSError, match="disk full"):
        atomic_write(str(target), boom)
    assert target.read_bytes() == b"old"
    assert os.listdir(tmp_path / "ck") and sorted(os.listdir(tmp_path)) == ["ck", "file.bin"]
    with pytest.raises(ValueError):
        save_checkpoint({}, str(d), -1)
    with pytest.raises(ValueError):
        save_checkpoint({}, str(d), 1, keep=0)
