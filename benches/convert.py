"""What numpy and torch output cost per row over arrow output, beside pyarrow's own conversion.

A ``ParquetStream`` pass over ``[id, tokens]`` (``list<int32>``), ``readahead_threads=0``, in
fresh forked processes (``benchlib.run_forked``), for each output (``arrow``, ``numpy``,
``torch``; ``list_format="split"``, the default: one 1-D array/tensor per row, views of the
batch's values) and batch size. The baseline, measured in the same run over the same batches:
arrow output, each batch then converted by pyarrow itself (``Array.to_numpy``: the ids as a
numpy array, the token lists as an object array of per-row numpy views, its best form of the
same thing). Prints CPU ns per row after the first batch, median (min–max) of ``--runs``
interleaved rounds, the 1-minute load, and each output's cost over arrow output beside
pyarrow's.

``PYTHONPATH=python python benches/convert.py [--rows 1000000] [--runs 3] [--batches 32,1024]
[--tokens-len 16,128]`` (``--quick``: 100k rows, 1 run).
"""

from __future__ import annotations

import argparse
import os
import sys
import tempfile
import time
from typing import Any

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))

import benchlib  # noqa: E402

PRELOAD = ["pyarrow", "numpy", "torch", "shardstream"]
OUTPUTS = ("arrow", "pyarrow to_numpy", "numpy", "torch")


def child(spec: dict[str, Any]) -> dict[str, Any]:
    from shardstream import ParquetStream

    out = spec["output"]
    ds = ParquetStream(
        spec["data"],
        columns=["id", "tokens"],
        batch_size=spec["batch"],
        output="arrow" if out == "pyarrow to_numpy" else out,
        readahead_threads=0,
    )
    it = iter(ds)
    first = next(it)
    if out == "pyarrow to_numpy":  # its first call imports pandas (~0.4 s): not timed
        first.column(1).to_numpy(zero_copy_only=False)
    rows = 0
    c0 = time.process_time()
    if out == "pyarrow to_numpy":
        for b in it:
            b.column(0).to_numpy()
            b.column(1).to_numpy(zero_copy_only=False)
            rows += b.num_rows
    elif out == "arrow":
        for b in it:
            rows += b.num_rows
    else:
        for b in it:
            rows += len(b["id"])
    return {"rows": rows, "row_cpu_ns": (time.process_time() - c0) / rows * 1e9}


def main() -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--rows", type=int, default=1_000_000)
    p.add_argument("--runs", type=int, default=3)
    p.add_argument("--batches", default="32,1024")
    p.add_argument(
        "--tokens-len",
        type=lambda v: tuple(int(x) for x in v.split(",")),
        default=(16, 128),
        help="items per row, LO,HI (half-open)",
    )
    p.add_argument("--data", default=None, help="directory for the data (default: a temp dir)")
    p.add_argument("--quick", action="store_true", help="100k rows, 1 run")
    args = p.parse_args()
    if args.quick:
        args.rows, args.runs = 100_000, 1
    import mix

    root = args.data or tempfile.mkdtemp(prefix="shardstream-convert-bench-")
    data = mix.make_data(root, args.rows, 1, args.tokens_len)[0]
    batches = [int(b) for b in args.batches.split(",")]
    specs = [
        {"kind": "convert", "data": data, "batch": b, "output": o} for b in batches for o in OUTPUTS
    ]
    print(
        f"# output conversion: {args.rows:,} rows of {args.tokens_len[0]}..{args.tokens_len[1]} "
        f"tokens, {args.runs} run(s) each, 1-min load at start {benchlib.load1():.1f} "
        f"(cpus {os.cpu_count()})",
        flush=True,
    )
    runs = benchlib.runs_interleaved(child, specs, args.runs, PRELOAD)
    med = {
        (s["batch"], s["output"]): benchlib.summary([r["row_cpu_ns"] for r in rs])["median"]
        for s, rs in zip(specs, runs, strict=True)
    }
    table = []
    for s, rs in zip(specs, runs, strict=True):
        assert len({r["rows"] for r in rs}) == 1, rs
        b, o = s["batch"], s["output"]
        over = med[(b, o)] - med[(b, "arrow")]
        table.append(
            [
                str(b),
                o,
                benchlib.with_spread([r["row_cpu_ns"] for r in rs], lambda x: f"{x:.0f}"),
                "" if o == "arrow" else f"{over:+.0f}",
                ""
                if o in ("arrow", "pyarrow to_numpy")
                else f"{over / (med[(b, 'pyarrow to_numpy')] - med[(b, 'arrow')]):.2f}x",
                benchlib.load_range(rs),
            ]
        )
    benchlib.print_table(
        table,
        (
            "batch",
            "output",
            "CPU ns/row",
            "over arrow output",
            "vs pyarrow's conversion",
            "load",
        ),
        "one ParquetStream, readahead_threads=0, list_format='split'; median (min–max)",
    )
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
