"""Instructions per batch (callgrind) of iterating Arrow IPC files, against pyarrow's zero-copy
loop, and of a flat Parquet read (issue 15, and issue 14's per-batch cost):

* ``epochs``: one ``ParquetStream(files, batch_size=1000, output="arrow")`` iterated pass
  after pass (the catalog opened once);
* ``new``: a new such dataset per pass (each pass opens the catalog);
* ``pyarrow``: ``pa.ipc.open_file(pa.memory_map(p)).get_batch(i)`` over every batch;
* ``parquet``: one ``ParquetStream`` over Parquet ``[id: int64, score: float64]`` (zstd,
  batch 1024, ``readahead_threads=0``) iterated pass after pass.

Data: 2 IPC files of 100 record batches of 1,000 rows (``id: int64``, ``tokens: list<int32>``
of 256), as ``benches/ipc.py`` writes them; 2 Parquet files of 102,400 rows. Each case runs
in two fresh processes under ``valgrind --tool=callgrind`` (all threads), one pass and
``--passes`` passes; ``(I(passes) - I(1)) / batches of the extra passes`` cancels start-up and
imports. ``--top N`` also prints the N functions whose inclusive cost grew most per batch
(``callgrind_annotate --inclusive=yes`` of both runs, subtracted). Counts do not depend on the
machine's load.

    PYTHONPATH=python python benches/ipc_callgrind.py [--cases epochs,pyarrow] [--passes 3]
        [--dir /tmp/ipc-callgrind] [--top 40]
"""

from __future__ import annotations

import argparse
import os
import re
import subprocess
import sys

CASES = ("epochs", "new", "pyarrow", "parquet")
BATCHES = 100  # per IPC file
ROWS = 1000
TOKENS = 256
PQ_ROWS = 102_400
PQ_BATCH = 1024


def write_data(d: str) -> tuple[list[str], list[str]]:
    import numpy as np
    import pyarrow as pa
    import pyarrow.parquet as pq

    os.makedirs(d, exist_ok=True)
    ipc, parquet = [], []
    for s in range(2):
        p = os.path.join(d, f"part-{s}.arrow")
        ipc.append(p)
        if not os.path.exists(p):
            n = BATCHES * ROWS
            ids = np.arange(s * n, (s + 1) * n, dtype=np.int64)
            values = (np.arange(n * TOKENS, dtype=np.int64) % 50_000).astype(np.int32)
            offsets = np.arange(0, (n + 1) * TOKENS, TOKENS, dtype=np.int32)
            tokens = pa.ListArray.from_arrays(pa.array(offsets), pa.array(values))
            t = pa.table({"id": ids, "tokens": tokens})
            with pa.ipc.new_file(p + ".tmp", t.schema) as w:
                for b in t.to_batches(max_chunksize=ROWS):
                    w.write_batch(b)
            os.replace(p + ".tmp", p)
        q = os.path.join(d, f"flat-{s}.parquet")
        parquet.append(q)
        if not os.path.exists(q):
            ids = np.arange(s * PQ_ROWS, (s + 1) * PQ_ROWS, dtype=np.int64)
            score = np.random.default_rng(s).random(PQ_ROWS)
            t = pa.table({"id": ids, "score": score})
            pq.write_table(
                t, q + ".tmp", row_group_size=PQ_ROWS // 2, compression="zstd",
                write_page_index=True,
            )  # fmt: skip
            os.replace(q + ".tmp", q)
    return ipc, parquet


def child(case: str, passes: int, d: str) -> None:
    import pyarrow as pa
    from shardstream import ParquetStream

    ipc, parquet = write_data(d)
    n = 0
    if case == "epochs":
        ds = ParquetStream(ipc, batch_size=ROWS, output="arrow", shuffle_buffer=0)
        for _ in range(passes):
            for b in ds:
                n += b.num_rows
    elif case == "new":
        for _ in range(passes):
            for b in ParquetStream(ipc, batch_size=ROWS, output="arrow", shuffle_buffer=0):
                n += b.num_rows
    elif case == "pyarrow":
        for _ in range(passes):
            for p in ipc:
                with pa.memory_map(p) as m, pa.ipc.open_file(m) as r:
                    for i in range(r.num_record_batches):
                        n += r.get_batch(i).num_rows
    elif case == "parquet":
        ds = ParquetStream(
            parquet, batch_size=PQ_BATCH, output="arrow", shuffle_buffer=0, readahead_threads=0
        )
        for _ in range(passes):
            for b in ds:
                n += b.num_rows
    print(n)


def batches_per_pass(case: str) -> int:
    if case == "parquet":
        return -(-PQ_ROWS // PQ_BATCH) * 2
    return 2 * BATCHES


def run(case: str, passes: int, d: str, out: str) -> int:
    env = dict(os.environ, PYTHONHASHSEED="0")
    cmd = [
        "valgrind", "--tool=callgrind", f"--callgrind-out-file={out}", "--dump-instr=no",
        sys.executable, os.path.abspath(__file__), "--child", case, "--passes", str(passes),
        "--dir", d,
    ]  # fmt: skip
    subprocess.run(cmd, env=env, check=True, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    with open(out) as f:
        for line in f:
            if line.startswith(("summary:", "totals:")):
                return int(line.split()[1])
    raise RuntimeError(f"no totals in {out}")


def inclusive(out: str) -> dict[str, int]:
    text = subprocess.run(
        ["callgrind_annotate", "--inclusive=yes", "--threshold=100", out],
        capture_output=True, text=True, check=True,
    ).stdout  # fmt: skip
    costs: dict[str, int] = {}
    for line in text.splitlines():
        m = re.match(r"\s*([\d,]+)\s+\([^)]*\)\s+(.*)$", line)
        # (call-site lines, "=> f (600x)", differ between runs by their count: left out)
        if m and not m.group(2).startswith("=>"):
            name = re.sub(r" \[[^\]]*\]$", "", m.group(2))
            costs[name] = costs.get(name, 0) + int(m.group(1).replace(",", ""))
    return costs


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--cases", default="epochs,pyarrow")
    ap.add_argument("--passes", type=int, default=3)
    ap.add_argument("--dir", default="/tmp/ipc-callgrind")
    ap.add_argument("--top", type=int, default=0)
    ap.add_argument("--tag", default="", help="suffix of the callgrind output files")
    ap.add_argument("--child", help=argparse.SUPPRESS)
    args = ap.parse_args()
    if args.child:
        child(args.child, args.passes, args.dir)
        return 0
    write_data(args.dir)
    for case in args.cases.split(","):
        if case not in CASES:
            raise SystemExit(f"unknown case {case!r}: one of {CASES}")
        outs = [os.path.join(args.dir, f"cg-{case}{args.tag}-{p}.out") for p in (1, args.passes)]
        one, many = (run(case, p, args.dir, o) for p, o in zip((1, args.passes), outs, strict=True))
        per = (many - one) / ((args.passes - 1) * batches_per_pass(case))
        print(f"{case}: {per / 1e3:.1f}k instructions per batch ({one:,} / {many:,})")
        if args.top:
            a, b = inclusive(outs[0]), inclusive(outs[1])
            n = (args.passes - 1) * batches_per_pass(case)
            diff = sorted(((b.get(k, 0) - a.get(k, 0)) / n, k) for k in set(a) | set(b))
            for v, k in reversed(diff[-args.top :]):
                print(f"  {v:9.0f}  {k[:150]}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
