"""Token packing: shardstream's packer against a straightforward numpy concat-and-split over
pyarrow batches, on the same tokenized Parquet, measured in one run.

    .venv/bin/python benches/pack.py [--docs 40000] [--seq-len 2048] [--dir bench-data/pack]

Reports packed rows/s and tokens/s (wall and CPU: CPU includes shardstream's decode threads),
the padding share of each algorithm, and the state size and resume time (load_state_dict +
first batch) at 1% / 50% / 99% of the pass. Both sides produce input_ids, labels,
position_ids and segment_ids as [batch, seq_len] numpy arrays. The baseline runs at the best of
several pyarrow batch sizes. The 1-minute load average is printed beside the figures.
"""

from __future__ import annotations

import argparse
import json
import os
import time

import numpy as np
import pyarrow as pa
import pyarrow.parquet as pq
from shardstream import Pack, ParquetStream


def generate(root: str, docs: int, max_len: int) -> int:
    marker = os.path.join(root, f".done-{docs}-{max_len}")
    if os.path.exists(marker):
        return int(open(marker).read())
    os.makedirs(root, exist_ok=True)
    rng = np.random.default_rng(0)
    lengths = rng.integers(1, max_len + 1, size=docs)
    total = 0
    per = docs // 4
    for s in range(4):
        ls = lengths[s * per : (s + 1) * per]
        offsets = np.r_[0, np.cumsum(ls)].astype(np.int32)
        values = rng.integers(0, 50_000, size=int(offsets[-1]), dtype=np.int32)
        arr = pa.ListArray.from_arrays(pa.array(offsets), pa.array(values))
        pq.write_table(
            pa.table({"input_ids": arr}),
            os.path.join(root, f"part-{s}.parquet"),
            row_group_size=2000,
            compression="zstd",
        )
        total += int(offsets[-1])
    with open(marker, "w") as f:
        f.write(str(total))
    return total


def timed(fn):
    w, c = time.perf_counter(), time.process_time()
    out = fn()
    return out, time.perf_counter() - w, time.process_time() - c


def numpy_pack(root: str, seq_len: int, batch: int, read_batch: int) -> tuple[int, int]:
    """Concatenate every document's tokens and cut rows of seq_len: the outputs shardstream
    makes (labels next-token, -100 at document ends; positions and segments per document)."""
    files = sorted(os.path.join(root, f) for f in os.listdir(root) if f.endswith(".parquet"))
    carry_t = np.empty(0, np.int64)
    carry_d = np.empty(0, np.int64)  # document number of each carried token
    doc0 = 0
    rows = tokens = 0
    need = seq_len * batch
    for path in files:
        for rb in pq.ParquetFile(path).iter_batches(batch_size=read_batch):
            col = rb.column(0)
            off = col.offsets.to_numpy()
            vals = col.values.to_numpy().astype(np.int64)
            lens = np.diff(off)
            docs = np.repeat(np.arange(doc0, doc0 + len(lens)), lens)
            doc0 += len(lens)
            carry_t = np.concatenate([carry_t, vals])
            carry_d = np.concatenate([carry_d, docs])
            while carry_t.shape[0] >= need:
                ids = carry_t[:need].reshape(batch, seq_len)
                d = carry_d[:need].reshape(batch, seq_len)
                carry_t, carry_d = carry_t[need:], carry_d[need:]
                same = np.zeros_like(d, dtype=bool)
                same[:, :-1] = d[:, 1:] == d[:, :-1]
                labels = np.where(same, np.roll(ids, -1, axis=1), -100)
                start = np.ones_like(same)
                start[:, 1:] = d[:, 1:] != d[:, :-1]
                seg = np.cumsum(start, axis=1, dtype=np.int32)
                idx = np.arange(seq_len)[None, :].repeat(batch, 0)
                first = np.maximum.accumulate(np.where(start, idx, 0), axis=1)
                pos = idx - first
                rows += batch
                tokens += ids.size
                del labels, seg, pos
    return rows, tokens


def shardstream_pack(root: str, pack: Pack, batch: int) -> tuple[int, int, int]:
    ds = ParquetStream(root, columns=["input_ids"], batch_size=batch, output="numpy", pack=pack)
    rows = real = 0
    for b in ds:
        rows += b["input_ids"].shape[0]
        real += int((b["segment_ids"] > 0).sum())
    return rows, rows * pack.seq_len, real


def main() -> int:
    ap = argparse.ArgumentParser()
    ap.add_argument("--docs", type=int, default=40_000)
    ap.add_argument("--seq-len", type=int, default=2048)
    ap.add_argument("--batch", type=int, default=8)
    ap.add_argument("--dir", default="bench-data/pack")
    args = ap.parse_args()
    L, B = args.seq_len, args.batch
    total = generate(args.dir, args.docs, L)
    print(
        f"{args.docs} documents, lengths uniform in [1, {L}], {total:,} tokens; seq_len {L}, "
        f"batch {B}; load {os.getloadavg()[0]:.2f}"
    )
    print(f"{'':34} {'rows/s':>9} {'Mtok/s':>8} {'wall s':>7} {'cpu s':>7} {'padding':>8}")

    def line(name, rows, toks, wall, cpu, pad=None):
        p = "" if pad is None else f"{pad:8.2%}"
        print(
            f"{name:34} {rows / wall:9.0f} {toks / wall / 1e6:8.2f} {wall:7.2f} {cpu:7.2f} {p}"
            f"  (load {os.getloadavg()[0]:.2f})"
        )

    best = None
    for rb in (1024, 4096, 16384):
        (rows, toks), w, c = timed(lambda rb=rb: numpy_pack(args.dir, L, B, rb))
        line(f"numpy concat-split (read {rb})", rows, toks, w, c)
        best = w if best is None else min(best, w)
    algos = {
        "shardstream concat": Pack(seq_len=L),
        "shardstream best_fit (256)": Pack(seq_len=L, algorithm="best_fit", buffer_docs=256),
    }
    for name, p in algos.items():
        (rows, toks, real), w, c = timed(lambda p=p: shardstream_pack(args.dir, p, B))
        line(name, rows, toks, w, c, 1 - real / toks)
        print(f"{'':34} wall vs best numpy: {w / best:.2f}x")

    print("\nresume (load_state_dict + first batch) and state size vs position, best_fit:")
    p = algos["shardstream best_fit (256)"]
    n_items = total // (L * B)
    for frac in (0.01, 0.5, 0.99):
        k = max(1, int(n_items * frac))
        ds = ParquetStream(args.dir, columns=["input_ids"], batch_size=B, output="numpy", pack=p)
        it = iter(ds)
        for _ in range(k):
            next(it)
        st = ds.state_dict()
        t0 = time.perf_counter()
        ds2 = ParquetStream(args.dir, columns=["input_ids"], batch_size=B, output="numpy", pack=p)
        ds2.load_state_dict(st)
        next(iter(ds2))
        dt = time.perf_counter() - t0
        print(
            f"  at {frac:4.0%} (item {k}): {dt * 1e3:7.1f} ms, state {len(json.dumps(st)):,} B "
            f"(pending refs {len(json.dumps(st['position']['pack'])):,} B)  "
            f"(load {os.getloadavg()[0]:.2f})"
        )
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
