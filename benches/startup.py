"""Start-up time vs shard count: open + first batch, and resume + first batch, for 100 / 1,000 /
10,000 small shards on local disk, with and without the metadata sidecar (``shardstream index``),
against pyarrow opening the same files (``pyarrow.dataset`` discovery + reading every footer).

    .venv/bin/python benches/startup.py [--counts 100,1000,10000] [--dir bench-data/startup]

Shards are generated once (cached under --dir). Timings are warm page cache (the files were just
written or read), best of --repeat runs, each in a fresh process (timed after imports) so nothing
is cached in memory. Each child also reports its RSS after imports and after the first batch;
``make bench``'s (e) section uses ``generate`` and ``child`` for the RSS per 1,000 shards.
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys

import pyarrow as pa
import pyarrow.parquet as pq

CHILD = r"""
import json, sys, time
import pyarrow.dataset as pads
from shardstream import ParquetStream
def rss_mb():  # resident set size of this process (Linux; 0 elsewhere)
    try:
        with open("/proc/self/status") as f:
            return next(int(l.split()[1]) for l in f if l.startswith("VmRSS:")) / 1024
    except OSError:
        return 0.0
mode, root, extra = sys.argv[1], sys.argv[2], sys.argv[3]
rss0 = rss_mb()
t0 = time.perf_counter()  # after imports: both sides pay the same interpreter start-up
if mode == "pyarrow":
    ds = pads.dataset(root, format="parquet")
    rows = sum(f.metadata.num_rows for f in ds.get_fragments())  # reads every footer
    first = next(ds.to_batches(columns=["id"], batch_size=32))
    t_open = t_first = time.perf_counter() - t0
else:
    ds = ParquetStream(root, columns=["id"], batch_size=32, output="numpy", shuffle_buffer=0)
    t_open = time.perf_counter() - t0
    if mode == "resume":
        ds.load_state_dict(json.loads(open(extra).read()))
    it = iter(ds)
    next(it)
    t_first = time.perf_counter() - t0
rss = rss_mb()
print(json.dumps({"open": t_open, "first": t_first, "rss_imports_mb": rss0, "rss_mb": rss,
                  "rss_over_imports_mb": rss - rss0}))
"""


def generate(root: str, n: int) -> None:
    if os.path.isdir(root) and len([f for f in os.listdir(root) if f.endswith(".parquet")]) == n:
        return
    os.makedirs(root, exist_ok=True)
    for i in range(n):
        ids = pa.array(range(i * 100, i * 100 + 100), pa.int64())
        t = pa.table({"id": ids, "x": pa.array([float(v) for v in range(100)])})
        pq.write_table(t, os.path.join(root, f"part-{i:06d}.parquet"), write_page_index=True)


def child(mode: str, root: str, extra: str = "-") -> dict:
    out = subprocess.run(
        [sys.executable, "-c", CHILD, mode, root, extra],
        check=True,
        capture_output=True,
        text=True,
    )
    return json.loads(out.stdout.strip().splitlines()[-1])


def best(mode: str, root: str, extra: str, repeat: int) -> dict:
    runs = [child(mode, root, extra) for _ in range(repeat)]
    return {k: min(r[k] for r in runs) for k in runs[0]}


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawTextHelpFormatter)
    ap.add_argument("--counts", default="100,1000,10000")
    ap.add_argument("--dir", default="bench-data/startup")
    ap.add_argument("--repeat", type=int, default=3)
    args = ap.parse_args()
    from shardstream import ParquetStream, index

    rows = []
    for n in [int(c) for c in args.counts.split(",")]:
        root = os.path.join(args.dir, f"n{n}")
        generate(root, n)
        sidecar = index.sidecar_path(root)
        if os.path.exists(sidecar):
            os.remove(sidecar)
        ds = ParquetStream(root, columns=["id"], batch_size=32, output="numpy")
        it = iter(ds)
        for _ in range(n):  # deep into the set: the resume seeks into a late shard
            next(it)
        state_file = os.path.join(args.dir, f"state-{n}.json")
        with open(state_file, "w") as f:
            json.dump(ds.state_dict(), f)
        base = best("pyarrow", root, "-", args.repeat)
        cold = best("open", root, "-", args.repeat)
        resume = best("resume", root, state_file, args.repeat)
        index.write_index(root)
        side = best("open", root, "-", args.repeat)
        side_resume = best("resume", root, state_file, args.repeat)
        os.remove(sidecar)
        rows.append((n, base, cold, resume, side, side_resume))

    print(
        f"{'shards':>7} | {'pyarrow open+1st':>16} | {'open+1st':>9} | {'resume+1st':>10} | "
        f"{'sidecar open+1st':>16} | {'sidecar resume+1st':>18} | {'vs pyarrow':>10}"
    )
    for n, base, cold, resume, side, side_resume in rows:
        print(
            f"{n:>7} | {base['first'] * 1e3:>13.0f} ms | {cold['first'] * 1e3:>6.0f} ms | "
            f"{resume['first'] * 1e3:>7.0f} ms | {side['first'] * 1e3:>13.0f} ms | "
            f"{side_resume['first'] * 1e3:>15.0f} ms | {base['first'] / cold['first']:>9.1f}x"
        )
    print("(each figure: best of", args.repeat, "fresh processes, after imports;")
    print(" 'vs pyarrow' = pyarrow open+first batch / shardstream open+first batch, no sidecar)")
    return 0


if __name__ == "__main__":
    sys.exit(main())
