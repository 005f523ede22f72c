#!/usr/bin/env python3
"""State size and elastic-merge cost at cluster scale, built in process (issue: ranks x workers).

Builds a real state for every slot of an OLD layout (default 1,024 ranks x 8 workers = 8,192
slots, each with a full shuffle buffer), then measures what an elastic resume costs:

* state size per slot and per rank (pickled, as torch.save stores it);
* ``load_state_dict`` of all states (validation of every state against shared epoch plans);
* one new worker's elastic resume (default new layouts 512 x 8 and 2,048 x 8), in a fresh
  process, from the checkpoint files (one per old rank, and every slot's summary beside them):
  reading every state and loading them all (``load_state_dict(states)``), against the two
  phases (read the summaries, ``needed_slots``, read only the rank files holding those slots,
  ``load_state_dict(needed, summaries=...)``); then the first batch. Wall and CPU time, states
  read, and peak RSS over the process's RSS after opening the dataset.

The shard set has many row groups (default 200 shards x 50 row groups = 10,000 units), since
plan cost is per row group; docs/ARCHITECTURE.md extrapolates to 100k shards.

    python benches/scale.py [--ranks 1024 --workers 8 --new-ranks 512 2048 --buffer 1000]
"""

from __future__ import annotations

import argparse
import json
import os
import pickle
import shutil
import subprocess
import sys
import tempfile
import time

import numpy as np
import pyarrow as pa
import pyarrow.parquet as pq
from shardstream import ParquetStream
from shardstream._core import RawResume, RawStream


def make_data(root: str, shards: int, row_groups: int, rg_rows: int) -> None:
    os.makedirs(root, exist_ok=True)
    n = row_groups * rg_rows
    for s in range(shards):
        path = os.path.join(root, f"s{s:05d}.parquet")
        if os.path.exists(path):
            continue
        ids = np.arange(s * n, (s + 1) * n, dtype=np.int64)
        pq.write_table(pa.table({"id": ids}), path, row_group_size=rg_rows, write_page_index=True)


def summary(state: dict) -> dict:
    """What the two-phase elastic resume reads first: the state without its shuffle buffer."""
    pos = {k: v for k, v in state["position"].items() if k != "buffer"}
    return {"first_epoch": state["first_epoch"], "slot": state["slot"], "position": pos}


def vm(field: str) -> int:
    with open("/proc/self/status") as f:
        for line in f:
            if line.startswith(field + ":"):
                return int(line.split()[1]) * 1024
    raise RuntimeError(f"no {field} in /proc/self/status")


def child(a: argparse.Namespace) -> int:
    """One new worker (slot 1 of the new layout) resumes from the checkpoint files."""
    ds = ParquetStream(
        a.data,
        columns=["id"],
        batch_size=32,
        shuffle_buffer=a.buffer,
        seed=1,
        output="arrow",
        even=None,
        readahead_threads=0,
        rank=1,
        world_size=a.new_ranks[0] * a.new_workers,
    )
    base = vm("VmRSS")
    t, c = time.perf_counter(), time.process_time()
    read = 0

    def rank_file(r: int) -> list:
        nonlocal read
        path = os.path.join(a.ckpt, f"rank{r:05d}.pkl")
        read += os.path.getsize(path)
        with open(path, "rb") as f:
            return pickle.load(f)

    if a.child == "all":
        states = [st for r in range(a.ranks) for st in rank_file(r)]
        ds.load_state_dict(states)
    else:
        path = os.path.join(a.ckpt, "summaries.pkl")
        read += os.path.getsize(path)
        with open(path, "rb") as f:
            summaries = pickle.load(f)
        need = ds.needed_slots(summaries)
        files = sorted({i // a.workers for i in need})
        held = {r: rank_file(r) for r in files}
        states = [held[i // a.workers][i % a.workers] for i in need]
        ds.load_state_dict(states, summaries=summaries)
    first = next(iter(ds))
    assert first.num_rows == 32
    out = dict(
        states=len(states),
        read=read,
        wall=time.perf_counter() - t,
        cpu=time.process_time() - c,
        peak=vm("VmHWM") - base,
    )
    print(json.dumps(out))
    return 0


def main() -> int:
    ap = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    ap.add_argument("--ranks", type=int, default=1024)
    ap.add_argument("--workers", type=int, default=8)
    ap.add_argument("--new-ranks", type=int, nargs="+", default=[512, 2048])
    ap.add_argument("--new-workers", type=int, default=8)
    ap.add_argument("--buffer", type=int, default=1000, help="shuffle_buffer rows per slot")
    ap.add_argument("--shards", type=int, default=200)
    ap.add_argument("--row-groups", type=int, default=50, help="row groups per shard")
    ap.add_argument(
        "--rg-rows", type=int, default=0, help="rows per row group (0: enough to fill buffers)"
    )
    ap.add_argument("--dir", default=os.path.join(tempfile.gettempdir(), "shardstream-scale"))
    ap.add_argument("--child", choices=["all", "two-phase"], help=argparse.SUPPRESS)
    ap.add_argument("--data", help=argparse.SUPPRESS)
    ap.add_argument("--ckpt", help=argparse.SUPPRESS)
    a = ap.parse_args()
    if a.child:
        return child(a)

    slots = a.ranks * a.workers
    rows_needed = slots * (a.buffer + 64) * 2
    rg_rows = a.rg_rows or -(-rows_needed // (a.shards * a.row_groups))
    data = os.path.join(a.dir, f"{a.shards}x{a.row_groups}x{rg_rows}")
    t = time.perf_counter()
    make_data(data, a.shards, a.row_groups, rg_rows)
    total = a.shards * a.row_groups * rg_rows
    print(
        f"data: {a.shards} shards x {a.row_groups} row groups x {rg_rows} rows = {total:,} rows "
        f"({time.perf_counter() - t:.1f}s to prepare)"
    )

    def stream(**layout: int) -> ParquetStream:
        return ParquetStream(
            data,
            columns=["id"],
            batch_size=32,
            shuffle_buffer=a.buffer,
            seed=1,
            output="arrow",
            even=None,
            readahead_threads=0,
            **layout,
        )

    ds = stream()
    t = time.perf_counter()
    states = []
    start = RawResume.start(0)
    for i in range(slots):
        s = RawStream(ds.catalog, ds._settings, start, (i, slots, 0, 1))
        s.next_item()  # fills the buffer: a realistic mid-epoch state
        states.append(s.state_dict())
    build = time.perf_counter() - t
    per_slot = len(pickle.dumps(states[0]))
    per_rank = len(pickle.dumps(states[: a.workers]))
    everything = len(pickle.dumps(states))
    print(
        f"built {slots:,} slot states ({a.ranks} ranks x {a.workers} workers, buffer {a.buffer}) "
        f"in {build:.1f}s"
    )
    print(
        f"state size: {per_slot:,} B per slot, {per_rank:,} B per rank, "
        f"{everything / 2**20:.1f} MiB all"
    )

    ckpt = os.path.join(a.dir, f"ckpt-{a.ranks}x{a.workers}-b{a.buffer}")
    os.makedirs(ckpt, exist_ok=True)
    # As a job saves it: one file per old rank (its workers' states), and beside them every
    # slot's summary (first_epoch, slot, position without its buffer) in one small file.
    for r in range(a.ranks):
        with open(os.path.join(ckpt, f"rank{r:05d}.pkl"), "wb") as f:
            pickle.dump(states[r * a.workers : (r + 1) * a.workers], f)
    summaries = [summary(st) for st in states]
    with open(os.path.join(ckpt, "summaries.pkl"), "wb") as f:
        pickle.dump(summaries, f)
    print(
        f"summaries: {len(pickle.dumps(summaries[0])):,} B per slot, "
        f"{os.path.getsize(os.path.join(ckpt, 'summaries.pkl')) / 2**20:.1f} MiB all"
    )
    del states, summaries
    print(f"load: {os.getloadavg()[0]:.2f} (1-min load average before measuring)")
    print(
        "\none new worker's elastic resume, in a fresh process each (read from the files, "
        "load_state_dict, first batch); peak = process peak RSS over its RSS after opening "
        "the dataset"
    )
    print(
        f"{'new layout':>12} {'how':>10} {'states read':>11} {'MiB read':>8} {'wall s':>7} "
        f"{'CPU s':>6} {'peak MiB':>8} {'load':>5}"
    )
    for new_ranks in a.new_ranks:
        for how in ("all", "two-phase"):
            cmd = [sys.executable, __file__, "--child", how, "--data", data, "--ckpt", ckpt]
            cmd += ["--buffer", str(a.buffer), "--ranks", str(a.ranks), "--workers", str(a.workers)]
            cmd += ["--new-ranks", str(new_ranks), "--new-workers", str(a.new_workers)]
            load = os.getloadavg()[0]
            out = json.loads(subprocess.run(cmd, check=True, capture_output=True).stdout)
            print(
                f"{new_ranks:>5} x {a.new_workers:<4} {how:>10} {out['states']:>11,} "
                f"{out['read'] / 2**20:>8.1f} {out['wall']:>7.2f} {out['cpu']:>6.2f} "
                f"{out['peak'] / 2**20:>8.1f} {load:>5.2f}"
            )
    shutil.rmtree(ckpt)
    return 0


if __name__ == "__main__":
    sys.exit(main())
