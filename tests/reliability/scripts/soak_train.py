"""A training loop that survives SIGKILL: what test_reliability_soak.py kills over and over.

The loop reads ``ParquetStream`` through a torchdata ``StatefulDataLoader`` (2 workers),
"trains" (sleeps a little per step), and every ``--ckpt-every`` steps saves
``{"step", "loader"}`` with :func:`shardstream.checkpoint.save_checkpoint` (atomic: temp
file, fsync, rename, fsync dir). The payload is written in two halves with a random pause
between them (``--save-delay``), so a kill often lands *inside* a save. On start it resumes
from :func:`shardstream.checkpoint.load_latest_checkpoint`.

Every event is appended to ``<work>/ids.log`` and fsync'd before the loop goes on; one JSON
record per line with a CRC-32, so a record torn by the kill is recognised:

* ``{"r": "start", "resumed_from": S}``: a run began from the checkpoint of step S (0: none);
* ``{"r": "batch", "step": s, "ids": [...]}``: the batch of step s was trained on;
* ``{"r": "ckpt", "step": s}``: the checkpoint of step s is durable;
* ``{"r": "end", "step": s}``: the stream is exhausted.

Modes: ``--zygote`` imports torch/torchdata/shardstream once and then forks one fresh run per
``{"cmd": "run"}`` line on stdin (each child is a new process and session; its only state is
what is on disk), which keeps ~2.5 s of imports out of every restart; without it the script
runs one training run and exits.
"""

from __future__ import annotations

import argparse
import json
import os
import random
import sys
import time
import zlib
from typing import Any


def record(log: Any, rec: dict) -> None:
    line = json.dumps(rec, separators=(",", ":"))
    log.write(f"{line}\t{zlib.crc32(line.encode()):08x}\n")
    log.flush()
    os.fsync(log.fileno())


def read_log(path: str) -> list[dict]:
    """Records of a log; a torn last line (the kill hit the append) is dropped, a damaged
    line anywhere else is an error."""
    out = []
    with open(path) as f:
        lines = f.read().split("\n")
    for i, ln in enumerate(lines):
        if not ln:
            continue
        body, _, crc = ln.rpartition("\t")
        ok = crc and len(crc) == 8 and f"{zlib.crc32(body.encode()):08x}" == crc
        if not ok:
            if i == len(lines) - 1:  # no newline after it: torn by the kill
                break
            raise ValueError(f"{path}: damaged record on line {i + 1}: {ln[:200]!r}")
        out.append(json.loads(body))
    return out


def train(a: dict) -> int:
    import torch  # noqa: F401
    from shardstream import ParquetStream
    from shardstream.checkpoint import load_latest_checkpoint, save_checkpoint
    from torchdata.stateful_dataloader import StatefulDataLoader

    rnd = random.Random()
    work = a["work"]
    ckpt_dir = os.path.join(work, "ckpt")
    os.makedirs(ckpt_dir, exist_ok=True)
    found = load_latest_checkpoint(ckpt_dir)
    ds = ParquetStream(
        a["data"],
        columns=["id"],
        batch_size=a["batch_size"],
        shuffle_buffer=a["shuffle_buffer"],
        seed=a["seed"],
        epochs=a["epochs"],
        output="numpy",
    )
    loader = StatefulDataLoader(ds, batch_size=None, num_workers=a["num_workers"])
    step = 0
    if found is not None:
        step, ckpt, _ = found
        assert ckpt["step"] == step
        loader.load_state_dict(ckpt["loader"])

    def slow_write(f: Any, payload: bytes) -> None:
        half = len(payload) // 2
        f.write(payload[:half])
        f.flush()
        time.sleep(rnd.uniform(0, a["save_delay"]))
        f.write(payload[half:])

    with open(os.path.join(work, "ids.log"), "a") as log:
        record(log, {"r": "start", "resumed_from": step, "pid": os.getpid(), "t": time.time()})
        for batch in loader:
            step += 1
            ids = [int(i) for i in batch["id"]]
            record(log, {"r": "batch", "step": step, "ids": ids, "t": time.time()})
            time.sleep(a["step_sleep"])  # the "training step"
            if step % a["ckpt_every"] == 0:
                state = {"step": step, "loader": loader.state_dict()}
                save_checkpoint(state, ckpt_dir, step, keep=2, write=slow_write)
                record(log, {"r": "ckpt", "step": step})
        record(log, {"r": "end", "step": step})
    return 0


def zygote() -> int:
    import tempfile

    import torch  # noqa: F401 - imported once, shared by every forked run
    import torchdata.stateful_dataloader  # noqa: F401
    from shardstream import ParquetStream, datagen
    from shardstream.checkpoint import load_latest_checkpoint, save_checkpoint

    # Warm up in a throw-away directory: the lazy imports of a first iteration, collate and
    # save/load (pyarrow.compute alone takes ~1 s) happen here once, not in every run.
    with tempfile.TemporaryDirectory() as tmp:
        datagen.write_shards(tmp, num_shards=1, rows_per_shard=10)
        loader = torchdata.stateful_dataloader.StatefulDataLoader(
            ParquetStream(tmp, columns=["id"], batch_size=4, output="numpy", readahead_threads=0),
            batch_size=None,
        )
        list(loader)
        save_checkpoint({"loader": loader.state_dict()}, tmp, 0)
        load_latest_checkpoint(tmp)

    for line in sys.stdin:
        cmd = json.loads(line)
        if cmd["cmd"] == "run":
            pid = os.fork()
            if pid == 0:  # a fresh run: new session (killpg reaches its workers), own output
                code = 1
                try:
                    os.setsid()
                    random.seed()
                    fd = os.open(
                        os.path.join(cmd["args"]["work"], "runs.txt"),
                        os.O_WRONLY | os.O_CREAT | os.O_APPEND,
                    )
                    os.dup2(fd, 1)
                    os.dup2(fd, 2)
                    devnull = os.open(os.devnull, os.O_RDONLY)
                    os.dup2(devnull, 0)
                    code = train(cmd["args"])
                except BaseException:  # noqa: BLE001
                    import traceback

                    traceback.print_exc()
                finally:
                    sys.stdout.flush()
                    sys.stderr.flush()
                    os._exit(code)
            print(json.dumps({"pid": pid}), flush=True)
        elif cmd["cmd"] == "wait":
            _, status = os.waitpid(cmd["pid"], 0)
            print(json.dumps({"status": os.waitstatus_to_exitcode(status)}), flush=True)
        elif cmd["cmd"] == "quit":
            return 0
    return 0


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--zygote", action="store_true")
    ap.add_argument("--args", help="JSON of the run's arguments (without --zygote)")
    ns = ap.parse_args()
    if ns.zygote:
        return zygote()
    return train(json.loads(ns.args))


if __name__ == "__main__":
    sys.exit(main())
