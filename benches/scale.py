#!/usr/bin/env python3
"""State size and elastic-merge cost at cluster scale, built in process (issue: ranks x workers).

Builds a real state for every slot of an OLD layout (default 1,024 ranks x 8 workers = 8,192
slots, each with a full shuffle buffer), then measures what an elastic resume costs:

* state size per slot and per rank (pickled, as torch.save stores it);
* ``load_state_dict`` of all states (validation of every state against shared epoch plans);
* the merge for one slot of a NEW layout (default 512 ranks x 8 workers), which every new
  worker does independently.

The shard set has many row groups (default 200 shards x 50 row groups = 10,000 units), since
plan cost is per row group; docs/ARCHITECTURE.md extrapolates to 100k shards.

    python benches/scale.py [--ranks 1024 --workers 8 --new-ranks 512 --buffer 1000]
"""

from __future__ import annotations

import argparse
import os
import pickle
import sys
import tempfile
import time

import numpy as np
import pyarrow as pa
import pyarrow.parquet as pq
from shardstream import ParquetStream
from shardstream._core import RawStream


def make_data(root: str, shards: int, row_groups: int, rg_rows: int) -> None:
    os.makedirs(root, exist_ok=True)
    n = row_groups * rg_rows
    for s in range(shards):
        path = os.path.join(root, f"s{s:05d}.parquet")
        if os.path.exists(path):
            continue
        ids = np.arange(s * n, (s + 1) * n, dtype=np.int64)
        pq.write_table(pa.table({"id": ids}), path, row_group_size=rg_rows, write_page_index=True)


def main() -> int:
    ap = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    ap.add_argument("--ranks", type=int, default=1024)
    ap.add_argument("--workers", type=int, default=8)
    ap.add_argument("--new-ranks", type=int, default=512)
    ap.add_argument("--new-workers", type=int, default=8)
    ap.add_argument("--buffer", type=int, default=1000, help="shuffle_buffer rows per slot")
    ap.add_argument("--shards", type=int, default=200)
    ap.add_argument("--row-groups", type=int, default=50, help="row groups per shard")
    ap.add_argument(
        "--rg-rows", type=int, default=0, help="rows per row group (0: enough to fill buffers)"
    )
    ap.add_argument("--dir", default=os.path.join(tempfile.gettempdir(), "shardstream-scale"))
    a = ap.parse_args()

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
    settings = dict(
        seed=1,
        shuffle_buffer=a.buffer,
        first_epoch=0,
        epochs=1,
        slot_count=slots,
        readahead_threads=0,
    )
    t = time.perf_counter()
    states = []
    template = ds.state_dict()
    for i in range(slots):
        s = RawStream(ds.catalog, slot_index=i, even="off", **settings)
        s.next_batch(32)  # fills the buffer: a realistic mid-epoch state
        st = dict(template, slot={"index": i, "count": slots, "even": "off"}, position=s.state())
        states.append(st)
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

    new = stream(rank=0, world_size=a.new_ranks)
    t = time.perf_counter()
    new.load_state_dict(states)
    load = time.perf_counter() - t
    new_slots = a.new_ranks * a.new_workers
    t = time.perf_counter()
    s = RawStream(new.catalog, slot_index=1, even="off", **dict(settings, slot_count=new_slots))
    s.restore_merged([(st["slot"]["index"], slots, st["position"]) for st in states], "off")
    merge = time.perf_counter() - t
    t = time.perf_counter()
    first = s.next_batch(32)
    first_batch = time.perf_counter() - t
    assert first is not None and first.num_rows == 32
    print(f"load_state_dict(all {slots:,} states): {load:.2f}s")
    print(
        f"merge for one slot of {a.new_ranks} x {a.new_workers}: {merge:.2f}s; "
        f"then first batch (refills its buffer): {first_batch * 1e3:.0f} ms"
    )
    print(
        f"units: {a.shards * a.row_groups:,} row groups; merge time is O(slots x buffer) "
        "+ O(row groups) per epoch in play"
    )
    return 0


if __name__ == "__main__":
    sys.exit(main())
