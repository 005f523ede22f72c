"""Quick side-by-side benchmark: ``shardstream bench [--rows N] [--dir D] [--json]``.

Generates a small shard set (default 200k rows in 4 shards, list<int32> tokens of 16-127
items, zstd, page index) and measures, in this process with a warm page cache:

* iteration throughput, rows per second of wall time and per CPU-second (all threads):
  ``ParquetStream(batch_size=1024, output="arrow", columns=["id", "tokens"])`` vs
  ``pyarrow.parquet.ParquetFile.iter_batches`` over the same files and columns at the same
  batch size, and the same stream with a shuffle buffer;
* resume latency at 50% and 90% of the data: a new ``ParquetStream`` + ``load_state_dict`` ->
  first batch, vs reading and dropping rows with pyarrow up to the same position;
* ``state_dict()`` latency (median, p99; called after each batch while iterating) and pickled
  size with a 10,000-row shuffle buffer.

Takes seconds. The full benchmark (fresh processes, pyarrow at its best batch size, CPU time,
a busy core, the DataLoader ceiling, peak RSS) is ``make bench`` (benches/bench.py); its
figures are in docs/benchmarks.md. The measuring loops here (``timed_passes``,
``pa_batches``, ``pa_skip_to``, ``time_resume``, ``state_dict_latencies``) are the ones
benches/ uses.
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
from collections.abc import Callable, Iterable, Iterator, Sequence
from typing import Any

from ._common import (
    MAX_ROWS,
    MAX_SHUFFLE_BUFFER,
    add_data_arguments,
    check_rows,
    emit_json,
    int_in,
    plain_text,
    table,
    write_fresh_shards,
)
from ._progress import Progress

COLUMNS = ["id", "tokens"]


def add_arguments(p: argparse.ArgumentParser) -> None:
    add_data_arguments(p, rows=200_000, shards=4)
    p.add_argument(
        "--batch-size", type=int_in(1, MAX_ROWS), default=1024, help="rows per batch (%(default)s)"
    )
    p.add_argument(
        "--shuffle-buffer",
        type=int_in(0, MAX_SHUFFLE_BUFFER),
        default=10_000,
        help="for the shuffled rows (%(default)s)",
    )
    p.add_argument(
        "--repeat", type=int_in(1, 1000), default=3, help="best of N for each figure (%(default)s)"
    )
    p.add_argument(
        "--dir", default=None, help="directory for the generated shards (default: a temp dir)"
    )
    p.add_argument("--json", action="store_true", help="machine-readable output")


# ---------------------------------------------------------------- measuring (shared with benches/)


def timed_passes(
    make_pass: Callable[[], Iterable[Any]],
    min_seconds: float = 0.0,
    count: Callable[[Any], int] = lambda b: b.num_rows,
) -> dict[str, Any]:
    """Consume ``make_pass()`` to its end, again and again until ``min_seconds`` of wall time
    have passed (at least once). Returns ``seconds`` (wall), ``cpu_seconds`` (user + system
    time of every thread of this process, ``time.process_time``), ``rows`` (``count`` of each
    item, all passes) and ``passes``.

    >>> r = timed_passes(lambda: [[1, 2], [3]], count=len)
    >>> r["rows"], r["passes"], r["seconds"] >= 0 and r["cpu_seconds"] >= 0
    (3, 1, True)
    """
    rows = passes = 0
    t0, c0 = time.perf_counter(), time.process_time()
    while True:
        for item in make_pass():
            rows += count(item)
        passes += 1
        wall = time.perf_counter() - t0
        if wall >= min_seconds:
            break
    return {
        "seconds": wall,
        "cpu_seconds": time.process_time() - c0,
        "rows": rows,
        "passes": passes,
    }


def pa_batches(
    sources: Iterable[Any], columns: Sequence[str], batch_size: int, **parquet_file: Any
) -> Iterator[Any]:
    """The baseline reader: ``pyarrow.parquet.ParquetFile(source, **parquet_file)
    .iter_batches(batch_size, columns)`` over each source in turn (paths, or files opened from
    a pyarrow filesystem)."""
    import pyarrow.parquet as pq

    for source in sources:
        yield from pq.ParquetFile(source, **parquet_file).iter_batches(
            batch_size=batch_size, columns=columns
        )


def pa_skip_to(
    sources: Iterable[Any], rows_before: int, seek: bool, columns: Sequence[str], batch_size: int
) -> dict[str, Any]:
    """Reach row ``rows_before`` with pyarrow and produce the next batch (the baselines of a
    resume): ``seek=False`` reads and drops batches (a generic "skip n"); ``seek=True`` jumps to
    the row group holding the row by the footers' row counts, then drops the rest. ``sources``
    as for :func:`pa_batches` (opened lazily, so opening them is timed too). Returns
    ``resume_ms`` and the first ``id`` of the batch (None past the end)."""
    import pyarrow.parquet as pq

    t0 = time.perf_counter()
    left = rows_before
    first_id = None
    for source in sources:
        pf = pq.ParquetFile(source)
        row_groups: list[int] | None = None
        if seek:
            if left >= pf.metadata.num_rows:
                left -= pf.metadata.num_rows
                continue
            row_groups = []
            for g in range(pf.metadata.num_row_groups):
                nrg = pf.metadata.row_group(g).num_rows
                if not row_groups and left >= nrg:
                    left -= nrg
                    continue
                row_groups.append(g)
        for b in pf.iter_batches(batch_size=batch_size, columns=columns, row_groups=row_groups):
            if left >= b.num_rows:
                left -= b.num_rows
                continue
            first_id = int(b.slice(left).column(0)[0].as_py())
            break
        if first_id is not None:
            break
    return {"resume_ms": (time.perf_counter() - t0) * 1e3, "first_id": first_id}


def time_resume(make_stream: Callable[[], Any], state: Any) -> tuple[float, float, Any]:
    """``make_stream()`` (the constructor), then ``load_state_dict(state)`` and the first item
    of ``iter()``: (constructor seconds, load -> first item seconds, the first item)."""
    t0 = time.perf_counter()
    ds = make_stream()
    t1 = time.perf_counter()
    ds.load_state_dict(state)
    first = next(iter(ds))
    return t1 - t0, time.perf_counter() - t1, first


def state_dict_latencies(
    ds: Any, calls: int, after_rows: int = 0, cpu: list[float] | None = None
) -> tuple[list[float], Any]:
    """Seconds taken by each ``ds.state_dict()`` called after every batch while iterating
    ``ds`` (``output="arrow"``; what a loader snapshotting every step does), the first once
    ``after_rows`` rows were read (a full shuffle buffer), until ``calls`` calls or the end
    of the stream. With ``cpu`` (a list), each call's CPU time on this thread is appended to it
    too: wall time also counts the moments the scheduler gave this core to another thread.
    Returns the latencies and the first of those states."""
    lat: list[float] = []
    state = None
    seen = 0
    for b in ds:
        seen += b.num_rows
        if seen < after_rows:
            continue
        t, c = time.perf_counter(), time.thread_time()
        st = ds.state_dict()
        c1, t1 = time.thread_time(), time.perf_counter()
        lat.append(t1 - t)
        if cpu is not None:
            cpu.append(c1 - c)
        if state is None:
            state = st
        if len(lat) >= calls:
            break
    return lat, state


def percentile(sorted_values: Sequence[float], q: float) -> float:
    """Nearest-rank percentile ``q`` (0-100) of an ascending, non-empty sequence.

    >>> percentile([1, 2, 3, 4], 50), percentile([1, 2, 3, 4], 99), percentile([5], 90)
    (2, 4, 5)
    """
    k = max(1, -(-len(sorted_values) * q // 100))
    return sorted_values[int(k) - 1]


# ---------------------------------------------------------------- this command


def _best(fn: Callable[[], dict[str, Any]], repeat: int) -> dict[str, Any]:
    return min((fn() for _ in range(max(1, repeat))), key=lambda r: r["seconds"])


def _ss(d: str, args: argparse.Namespace, shuffle: int = 0) -> Any:
    from .. import ParquetStream

    return ParquetStream(
        d, columns=COLUMNS, batch_size=args.batch_size, output="arrow", shuffle_buffer=shuffle
    )


def _time_ss_iter(d: str, args: argparse.Namespace, shuffle: int) -> dict[str, Any]:
    ds = _ss(d, args, shuffle)
    r = timed_passes(lambda: ds)
    assert r["rows"] == args.rows, (r["rows"], args.rows)
    return r


def _time_pa_iter(paths: list[str], args: argparse.Namespace) -> dict[str, Any]:
    r = timed_passes(lambda: pa_batches(paths, COLUMNS, args.batch_size))
    assert r["rows"] == args.rows, (r["rows"], args.rows)
    return r


def _state_at(d: str, args: argparse.Namespace, batches: int, shuffle: int = 0) -> Any:
    ds = _ss(d, args, shuffle)
    it = iter(ds)
    for _ in range(batches):
        next(it)
    state = ds.state_dict()
    del it
    return ds, state


def _time_ss_resume(d: str, args: argparse.Namespace, state: Any) -> dict[str, Any]:
    ctor, resume, _ = time_resume(lambda: _ss(d, args), state)
    return {"seconds": ctor + resume}


def _time_pa_skip(paths: list[str], args: argparse.Namespace, rows: int) -> dict[str, Any]:
    r = pa_skip_to(paths, rows, False, COLUMNS, args.batch_size)
    return {"seconds": r["resume_ms"] / 1e3}


def measure(d: str, paths: list[str], args: argparse.Namespace, bar: Progress) -> dict[str, Any]:
    """All figures (seconds, rows/s, bytes) as a dict."""
    res: dict[str, Any] = {"rows": args.rows, "shards": args.shards, "batch_size": args.batch_size}
    _time_pa_iter(paths, args)  # warm the page cache (both readers then read from memory)
    bar.update()
    pa = _best(lambda: _time_pa_iter(paths, args), args.repeat)
    bar.update()
    ss = _best(lambda: _time_ss_iter(d, args, 0), args.repeat)
    bar.update()
    sh = _best(lambda: _time_ss_iter(d, args, args.shuffle_buffer), args.repeat)
    bar.update()

    def rates(r: dict[str, Any]) -> tuple[float, float]:
        return r["rows"] / r["seconds"], r["rows"] / max(r["cpu_seconds"], 1e-9)

    (ss_w, ss_c), (pa_w, pa_c), (sh_w, sh_c) = rates(ss), rates(pa), rates(sh)
    res["iterate"] = {
        "shardstream_rows_s": ss_w,
        "pyarrow_rows_s": pa_w,
        "shardstream_rows_cpu_s": ss_c,
        "pyarrow_rows_cpu_s": pa_c,
    }
    res["iterate_shuffled"] = {
        "shuffle_buffer": args.shuffle_buffer,
        "shardstream_rows_s": sh_w,
        "shardstream_rows_cpu_s": sh_c,
    }
    total_batches = -(-args.rows // args.batch_size)
    res["resume"] = []
    for frac in (0.5, 0.9):
        k = max(1, min(total_batches - 1, int(total_batches * frac)))
        _, state = _state_at(d, args, k)
        ss_r = _best(functools.partial(_time_ss_resume, d, args, state), args.repeat)["seconds"]
        pa_r = _best(
            functools.partial(_time_pa_skip, paths, args, k * args.batch_size), args.repeat
        )["seconds"]
        res["resume"].append(
            {"at": frac, "rows": k * args.batch_size, "shardstream_s": ss_r, "pyarrow_skip_s": pa_r}
        )
        bar.update()
    ds = _ss(d, args, args.shuffle_buffer)
    calls, state = state_dict_latencies(
        ds, 200, after_rows=min(args.shuffle_buffer, args.rows // 2)
    )
    calls.sort()
    res["state_dict"] = {
        "shuffle_buffer": args.shuffle_buffer,
        "calls": len(calls),
        "median_s": statistics.median(calls),
        "p99_s": percentile(calls, 99),
        "pickled_bytes": len(pickle.dumps(state)),
    }
    bar.update()
    return res


STEPS = 7  # bar.update() calls in measure()


def _rate(x: float) -> str:
    return f"{x / 1e6:.2f} M rows/s"


def _cpu_rate(x: float) -> str:
    return f"{x / 1e6:.2f} M rows/CPU-s"


def _ms(s: float) -> str:
    return f"{s * 1e3:.1f} ms"


def render(res: dict[str, Any]) -> str:
    it, sh = res["iterate"], res["iterate_shuffled"]
    rows = [
        [
            f"iterate, batch {res['batch_size']}, arrow, {COLUMNS}",
            _rate(it["shardstream_rows_s"]) + f"; {_cpu_rate(it['shardstream_rows_cpu_s'])}",
            _rate(it["pyarrow_rows_s"])
            + f"; {_cpu_rate(it['pyarrow_rows_cpu_s'])} (iter_batches, same batch size)",
            f"{it['shardstream_rows_s'] / it['pyarrow_rows_s']:.2f}x wall, "
            f"{it['shardstream_rows_cpu_s'] / it['pyarrow_rows_cpu_s']:.2f}x CPU",
        ],
        [
            f"same, shuffle_buffer={sh['shuffle_buffer']:,}",
            _rate(sh["shardstream_rows_s"]) + f"; {_cpu_rate(sh['shardstream_rows_cpu_s'])}",
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
            f"state_dict() after each batch, shuffle_buffer={sd['shuffle_buffer']:,}",
            f"{sd['median_s'] * 1e6:.1f} us median, p99 {sd['p99_s'] * 1e6:.1f} us "
            f"({sd['calls']} calls), {sd['pickled_bytes']:,} B",
            "-",
            "-",
        ]
    )
    head = ["benchmark", "shardstream", "pyarrow", "ratio"]
    return table(head, rows, [False, True, True, True])


def run(args: argparse.Namespace) -> int:
    check_rows(args)
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
            f"measured in {res['measure_s']:.1f}s; CPU = user + system time of all threads. "
            "Full benchmark (fresh processes, pyarrow at its best batch size, peak RSS): "
            "make bench; figures in docs/benchmarks.md."
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
