"""Quick side-by-side benchmark: ``shardstream bench [--rows N] [--dir D] [--json]``.

Generates a small shard set (default 200k rows in 4 shards, list<int32> tokens of 16-127
items, zstd, page index) and measures, in this process with a warm page cache:

* iteration throughput: ``ParquetStream(batch_size=1024, output="arrow",
  columns=["id", "tokens"])`` vs ``pyarrow.parquet.ParquetFile.iter_batches`` over the same
  files and columns, and the same stream with a shuffle buffer;
* resume latency at 50% and 90% of the data: a new ``ParquetStream`` + ``load_state_dict`` ->
  first batch, vs reading and dropping rows with pyarrow up to the same position;
* ``state_dict()`` latency and pickled size with a 10,000-row shuffle buffer.

Takes seconds. The full benchmark (fresh processes for every resume, 2M rows, peak RSS)
is ``make bench`` (benches/bench.py); its figures are in the README's "Measured figures".
"""

from __future__ import annotations

import argparse
import functools
import os
import pickle
import statistics
import sys
import tempfile
import time
from collections.abc import Callable
from typing import Any

from ._common import CliError, emit_json, plain_text, table, write_fresh_shards
from ._progress import Progress

COLUMNS = ["id", "tokens"]


def add_arguments(p: argparse.ArgumentParser) -> None:
    p.add_argument("--rows", type=int, default=200_000, help="total rows (%(default)s)")
    p.add_argument("--shards", type=int, default=4, help="shards (%(default)s)")
    p.add_argument("--batch-size", type=int, default=1024, help="rows per batch (%(default)s)")
    p.add_argument(
        "--shuffle-buffer", type=int, default=10_000, help="for the shuffled rows (%(default)s)"
    )
    p.add_argument("--repeat", type=int, default=3, help="best of N for each figure (%(default)s)")
    p.add_argument(
        "--dir", default=None, help="directory for the generated shards (default: a temp dir)"
    )
    p.add_argument("--json", action="store_true", help="machine-readable output")


def _best(fn: Callable[[], float], repeat: int) -> float:
    return min(fn() for _ in range(max(1, repeat)))


def _ss(d: str, args: argparse.Namespace, shuffle: int = 0) -> Any:
    from .. import ParquetStream

    return ParquetStream(
        d, columns=COLUMNS, batch_size=args.batch_size, output="arrow", shuffle_buffer=shuffle
    )


def _time_ss_iter(d: str, args: argparse.Namespace, shuffle: int) -> float:
    t = time.perf_counter()
    n = sum(b.num_rows for b in _ss(d, args, shuffle))
    dt = time.perf_counter() - t
    assert n == args.rows, (n, args.rows)
    return dt


def _pa_batches(paths: list[str], batch_size: int) -> Any:
    import pyarrow.parquet as pq

    for p in paths:
        yield from pq.ParquetFile(p).iter_batches(batch_size=batch_size, columns=COLUMNS)


def _time_pa_iter(paths: list[str], args: argparse.Namespace) -> float:
    t = time.perf_counter()
    n = sum(b.num_rows for b in _pa_batches(paths, args.batch_size))
    dt = time.perf_counter() - t
    assert n == args.rows, (n, args.rows)
    return dt


def _state_at(d: str, args: argparse.Namespace, batches: int, shuffle: int = 0) -> Any:
    ds = _ss(d, args, shuffle)
    it = iter(ds)
    for _ in range(batches):
        next(it)
    state = ds.state_dict()
    del it
    return ds, state


def _time_ss_resume(d: str, args: argparse.Namespace, state: Any) -> float:
    t = time.perf_counter()
    ds = _ss(d, args)
    ds.load_state_dict(state)
    next(iter(ds))
    return time.perf_counter() - t


def _time_pa_skip(paths: list[str], args: argparse.Namespace, rows: int) -> float:
    t = time.perf_counter()
    seen = 0
    for b in _pa_batches(paths, args.batch_size):
        if seen >= rows:
            break
        seen += b.num_rows
    return time.perf_counter() - t


def measure(d: str, paths: list[str], args: argparse.Namespace, bar: Progress) -> dict[str, Any]:
    """All figures (seconds, rows/s, bytes) as a dict."""
    res: dict[str, Any] = {"rows": args.rows, "shards": args.shards, "batch_size": args.batch_size}
    _time_pa_iter(paths, args)  # warm the page cache (both readers then read from memory)
    bar.update()
    pa_s = _best(lambda: _time_pa_iter(paths, args), args.repeat)
    bar.update()
    ss_s = _best(lambda: _time_ss_iter(d, args, 0), args.repeat)
    bar.update()
    sh_s = _best(lambda: _time_ss_iter(d, args, args.shuffle_buffer), args.repeat)
    bar.update()
    res["iterate"] = {"shardstream_rows_s": args.rows / ss_s, "pyarrow_rows_s": args.rows / pa_s}
    res["iterate_shuffled"] = {
        "shuffle_buffer": args.shuffle_buffer,
        "shardstream_rows_s": args.rows / sh_s,
    }
    total_batches = -(-args.rows // args.batch_size)
    res["resume"] = []
    for frac in (0.5, 0.9):
        k = max(1, min(total_batches - 1, int(total_batches * frac)))
        _, state = _state_at(d, args, k)
        ss_r = _best(functools.partial(_time_ss_resume, d, args, state), args.repeat)
        pa_r = _best(
            functools.partial(_time_pa_skip, paths, args, k * args.batch_size), args.repeat
        )
        res["resume"].append(
            {"at": frac, "rows": k * args.batch_size, "shardstream_s": ss_r, "pyarrow_skip_s": pa_r}
        )
        bar.update()
    ds, state = _state_at(d, args, max(1, total_batches // 2), shuffle=args.shuffle_buffer)
    calls = []
    for _ in range(50):
        t = time.perf_counter()
        ds.state_dict()
        calls.append(time.perf_counter() - t)
    res["state_dict"] = {
        "shuffle_buffer": args.shuffle_buffer,
        "median_s": statistics.median(calls),
        "pickled_bytes": len(pickle.dumps(state)),
    }
    bar.update()
    return res


STEPS = 7  # bar.update() calls in measure()


def _rate(x: float) -> str:
    return f"{x / 1e6:.2f} M rows/s"


def _ms(s: float) -> str:
    return f"{s * 1e3:.1f} ms"


def render(res: dict[str, Any]) -> str:
    it, sh = res["iterate"], res["iterate_shuffled"]
    rows = [
        [
            f"iterate, batch {res['batch_size']}, arrow, {COLUMNS}",
            _rate(it["shardstream_rows_s"]),
            _rate(it["pyarrow_rows_s"]) + " (iter_batches)",
            f"{it['shardstream_rows_s'] / it['pyarrow_rows_s']:.2f}x",
        ],
        [
            f"same, shuffle_buffer={sh['shuffle_buffer']:,}",
            _rate(sh["shardstream_rows_s"]),
            "- (no shuffle)",
            "-",
        ],
    ]
    for r in res["resume"]:
        rows.append(
            [
                f"resume at {r['at']:.0%} ({r['rows']:,} rows)",
                _ms(r["shardstream_s"]),
                _ms(r["pyarrow_skip_s"]) + " (read and skip)",
                f"{r['pyarrow_skip_s'] / r['shardstream_s']:.1f}x faster",
            ]
        )
    sd = res["state_dict"]
    rows.append(
        [
            f"state_dict(), shuffle_buffer={sd['shuffle_buffer']:,}",
            f"{sd['median_s'] * 1e6:.1f} us, {sd['pickled_bytes']:,} B",
            "-",
            "-",
        ]
    )
    head = ["benchmark", "shardstream", "pyarrow", "ratio"]
    return table(head, rows, [False, True, True, True])


def run(args: argparse.Namespace) -> int:
    if args.rows < args.shards or args.shards < 1:
        raise CliError("need --shards >= 1 and --rows >= --shards")
    if args.batch_size < 1 or args.repeat < 1 or args.shuffle_buffer < 0:
        raise CliError("--batch-size and --repeat must be >= 1, --shuffle-buffer >= 0")
    tmp = None
    if args.dir is None:
        tmp = tempfile.TemporaryDirectory(prefix="shardstream-bench-")
        d = tmp.name
    else:
        d = os.path.abspath(args.dir)
    try:
        t = time.perf_counter()
        paths = write_fresh_shards(d, args.rows, args.shards, desc="writing shards")
        gen_s = time.perf_counter() - t
        t = time.perf_counter()
        with Progress(STEPS, "benchmarking", unit="steps") as bar:
            res = measure(d, paths, args, bar)
        res["generate_s"] = gen_s
        res["measure_s"] = time.perf_counter() - t
        if args.json:
            emit_json(res)
            return 0
        print(
            f"{args.rows:,} rows in {args.shards} shards (list<int32> tokens 16-127, zstd, page "
            f"index), written in {gen_s:.1f}s; best of {args.repeat}, one process, warm cache:"
        )
        print()
        print(render(res))
        print()
        print(
            f"measured in {res['measure_s']:.1f}s. Full benchmark (fresh processes, 2M rows, "
            "peak RSS): make bench; figures in README.md 'Measured figures'."
        )
        sys.stdout.flush()
        return 0
    finally:
        if tmp is not None:
            tmp.cleanup()


def add_parser(sub: Any) -> None:
    p = sub.add_parser(
        "bench",
        help="quick side-by-side on generated data: shardstream vs pyarrow (seconds)",
        description=plain_text(__doc__),
        formatter_class=argparse.RawDescriptionHelpFormatter,
    )
    add_arguments(p)
    p.set_defaults(run=run)
