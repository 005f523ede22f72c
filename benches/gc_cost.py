"""What Python's cyclic garbage collector costs per row with torch output, by ``list_format``.

``list_format="split"`` (the default) makes one 1-D tensor per row: 1,024 new objects tracked
by the collector per batch of 1,024. Young collections then run about once per batch, and
every batch alive during one is promoted; enough promotions trigger a full collection, which
walks every tracked object of the process (~200k after ``import torch``). The other formats
make a few objects per batch.

One ``ParquetStream`` pass per fresh forked process (``benchlib.run_forked``), ``[id,
tokens]``, torch output, ``readahead_threads=0``, batch 1024, for each list format x the
collector as is / after ``gc.freeze()`` (what is alive before the pass is never walked again)
/ disabled; the cases interleaved, ``--runs`` rounds. Prints CPU ns per row after the first
batch, median (min–max), the collections per generation and the time spent in them (from
``gc.callbacks``), and the 1-minute load.

``PYTHONPATH=python python benches/gc_cost.py [--rows 1000000] [--runs 3] [--formats
split,offsets]`` (``--quick``: 100k rows, 1 run).
"""

from __future__ import annotations

import argparse
import gc
import os
import sys
import tempfile
import time
from typing import Any

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))

import benchlib  # noqa: E402

PRELOAD = ["pyarrow", "numpy", "torch", "shardstream"]
MODES = ("on", "freeze", "off")


def make_data(root: str, rows: int) -> str:
    """``benches/mix.py``'s data for one source: ``[id, tokens]``, 16–128 tokens a row."""
    import mix

    return mix.make_data(root, rows, 1)[0]


def child(spec: dict[str, Any]) -> dict[str, Any]:
    from shardstream import ParquetStream

    spent = {g: [0, 0.0] for g in range(3)}
    start = [0.0]

    def on_gc(phase: str, info: dict[str, Any]) -> None:
        if phase == "start":
            start[0] = time.perf_counter()
        else:
            s = spent[info["generation"]]
            s[0] += 1
            s[1] += time.perf_counter() - start[0]

    if spec["mode"] == "off":
        gc.disable()
    elif spec["mode"] == "freeze":
        gc.freeze()
    ds = ParquetStream(
        spec["data"],
        columns=["id", "tokens"],
        batch_size=1024,
        output="torch",
        list_format=spec["list_format"],
        readahead_threads=0,
    )
    it = iter(ds)
    first = len(next(it)["id"])
    gc.callbacks.append(on_gc)
    c0 = time.process_time()
    rest = sum(len(b["id"]) for b in it)
    cpu = time.process_time() - c0
    gc.callbacks.remove(on_gc)
    return {
        "rows": first + rest,
        "row_cpu_ns": cpu / rest * 1e9,
        "collections": [spent[g][0] for g in range(3)],
        "gc_ms": [spent[g][1] * 1e3 for g in range(3)],
    }


def main() -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--rows", type=int, default=1_000_000)
    p.add_argument("--runs", type=int, default=3)
    p.add_argument("--formats", default="split,offsets,padded")
    p.add_argument("--data", default=None, help="directory for the data (default: a temp dir)")
    p.add_argument("--quick", action="store_true", help="100k rows, 1 run")
    args = p.parse_args()
    if args.quick:
        args.rows, args.runs = 100_000, 1
    data = make_data(args.data or tempfile.mkdtemp(prefix="shardstream-gc-bench-"), args.rows)
    specs = [
        {"kind": "gc", "data": data, "list_format": f, "mode": m}
        for f in args.formats.split(",")
        for m in MODES
    ]
    print(
        f"# gc cost: {args.rows:,} rows, {args.runs} run(s) each, 1-min load at start "
        f"{benchlib.load1():.1f} (cpus {os.cpu_count()})",
        flush=True,
    )
    runs = benchlib.runs_interleaved(child, specs, args.runs, PRELOAD)
    table = []
    for s, rs in zip(specs, runs, strict=True):
        base = next(
            r
            for t, r in zip(specs, runs, strict=True)
            if t["list_format"] == s["list_format"] and t["mode"] == "on"
        )
        ratio = (
            benchlib.summary([r["row_cpu_ns"] for r in rs])["median"]
            / benchlib.summary([r["row_cpu_ns"] for r in base])["median"]
        )
        last = rs[-1]
        table.append(
            [
                s["list_format"],
                {"on": "as is", "freeze": "gc.freeze() first", "off": "gc.disable()"}[s["mode"]],
                benchlib.with_spread([r["row_cpu_ns"] for r in rs], lambda x: f"{x:.0f}"),
                f"{ratio:.2f}x",
                " / ".join(str(n) for n in last["collections"]),
                " / ".join(f"{t:.0f}" for t in last["gc_ms"]),
                benchlib.load_range(rs),
            ]
        )
    benchlib.print_table(
        table,
        (
            "list_format",
            "collector",
            "CPU ns/row",
            "vs as is",
            "collections gen 0/1/2 (last run)",
            "ms in them (last run)",
            "load",
        ),
        "torch output, one ParquetStream, readahead_threads=0, batch 1024; median (min–max)",
    )
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
