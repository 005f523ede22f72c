#!/usr/bin/env python3
"""Map-style benchmarks: ``ParquetRows`` random access and ``ResumableSampler``
(``python benches/mapstyle.py --help``; ``--quick``).

Data: bench.py's generated shard set (cached under ./bench-data): id int64, tokens
list<int32> 64..512 items, text, score float64, zstd, page index. Every figure is measured in
a fresh process forked from a preloaded server (benchlib.run_forked), runs interleaved,
--runs times, median (min–max), with the 1-minute load average beside it.

  access   (A) rows/s of ``__getitems__`` with batches of --batch (256) in the sampler's order,
           ``output="arrow"``, one process, for the orders: global shuffle, and the block
           order (--blocks): shardstream with the page cache and without it, and over the
           same rows as uncompressed Arrow IPC files (memory-mapped, ``ss-ipc``), vs HF
           ``datasets`` map-style ``Dataset`` (``from_parquet``, Arrow format) ``ds[indices]``
           on the same indices, vs pyarrow ``Table.take`` after a full ``read_table`` (the
           in-memory upper bound; the read is reported apart). Wall and CPU rate.
  quality  (B) the order's shuffle quality beside its speed: how far a source chunk's rows
           (1,024 consecutive rows) spread over the epoch (median span of their positions as
           a fraction of the epoch: ~1 for a uniform shuffle), the mean number of distinct
           chunks in a batch (uniform: what drawing --batch rows at random gives), and the
           mean distance of source neighbours in the epoch (uniform: 1/3 of the epoch).
  sampler  (C) at N = 10^9 rows, 8 ranks: memory (tracemalloc peak while iterating 10^5
           indices and taking states; RSS growth), ``state_dict()`` size (pickle, JSON) and
           latency (p50/p99 over calls after every batch of --batch), iteration rate.
  resume   (D) fresh process: ParquetRows + ResumableSampler + ``load_state_dict`` -> first
           batch (``__getitems__`` of --batch) at 1%/50%/99% of an epoch (and the 99%/1%
           ratio); the same through a torchdata ``StatefulDataLoader`` with 2 workers
           (``load_state_dict`` -> first batch, worker start-up included).
"""

from __future__ import annotations

import argparse
import json
import os
import pickle
import sys
import time
import tracemalloc
from typing import Any

HERE = os.path.dirname(os.path.abspath(__file__))
ROOT = os.path.dirname(HERE)
sys.path.insert(0, HERE)

import benchlib  # noqa: E402
from bench import _git_commit, ensure_data, shard_files, warm_cache  # noqa: E402
from benchlib import krows, load_range, print_table, summary, with_spread  # noqa: E402

ALL = ("access", "quality", "sampler", "resume")
COLUMNS = ["id", "tokens"]
FRACS = [0.01, 0.5, 0.99]
PRELOAD = ["pyarrow.parquet", "shardstream", "torch"]


def _orders(args: argparse.Namespace) -> dict[str, dict[str, Any]]:
    out: dict[str, dict[str, Any]] = {"global": {}}
    for b in args.blocks:
        block, window = (int(x) for x in b.split("x"))
        out[f"blocks {block}x{window}"] = {"block_size": block, "window": window}
    return out


# =========================================================================== child side


def _indices(n: int, order: dict, seed: int, batches: int, batch: int, start: float = 0.0):
    """The first ``batches`` batches of the sampler's order, from ``start`` of the epoch."""
    from shardstream import ResumableSampler

    s = ResumableSampler(n, seed=seed, **order)
    if start:
        st = s.state_dict()
        s.load_state_dict({**st, "position": int(n * start)})
    it = iter(s)
    out = []
    for _ in range(batches):
        b = [i for _, i in zip(range(batch), it, strict=False)]
        if not b:
            break
        out.append(b)
    return out


def _cpu() -> float:
    return time.process_time()


def _access(spec: dict) -> dict:
    """One reader over the first batches of one order: rows/s, wall and CPU."""
    import pyarrow.parquet as pq

    data, kind, order = spec["data"], spec["reader"], spec["order"]
    files = shard_files(data)
    n = sum(pq.ParquetFile(p).metadata.num_rows for p in files)
    batches = _indices(n, order, 1, spec["batches"], spec["batch"])
    extra: dict[str, Any] = {}
    if kind.startswith("ss"):
        from shardstream import ParquetRows

        cache = spec["cache"] if kind == "ss-cache" else 0
        src = spec["ipc_dir"] if kind == "ss-ipc" else data
        ds = ParquetRows(src, columns=COLUMNS, output="arrow", page_cache_bytes=cache, threads=1)

        def get(idx: list[int]) -> Any:
            return ds.__getitems__(idx).arrow
    elif kind == "hf":
        import datasets

        datasets.disable_progress_bars()
        hf = datasets.Dataset.from_parquet(files, cache_dir=spec["hf_cache"], columns=COLUMNS)
        hf = hf.with_format("arrow")

        def get(idx: list[int]) -> Any:
            return hf[idx]
    elif kind == "pa-take":
        import pyarrow as pa

        t0, c0 = time.perf_counter(), _cpu()
        table = pa.concat_tables([pq.read_table(p, columns=COLUMNS) for p in files])
        # One chunk per column: take() on a chunked list column concatenates its chunks on
        # every call (~1k rows/s here), which is not pyarrow at its best.
        table = table.combine_chunks()
        extra = {"read_s": time.perf_counter() - t0, "read_cpu_s": _cpu() - c0}

        def get(idx: list[int]) -> Any:
            return table.take(idx)
    else:
        raise SystemExit(f"unknown reader {kind}")
    get(batches[0])  # warm: opens, first pages (not timed)
    rows = 0
    t0, c0 = time.perf_counter(), _cpu()
    for b in batches[1:]:
        out = get(b)
        rows += out.num_rows
        assert out.num_rows == len(b)
    r = {"rows": rows, "seconds": time.perf_counter() - t0, "cpu_seconds": _cpu() - c0, **extra}
    if kind == "ss-cache":
        r["cache"] = ds.cache_stats()
    return r


def _quality(spec: dict) -> dict:
    """Shuffle quality of one order over ``n`` rows (no data read)."""
    import numpy as np
    from shardstream import ResumableSampler

    n, chunk, batch = spec["n"], spec["chunk"], spec["batch"]
    order = np.fromiter(ResumableSampler(n, seed=1, **spec["order"]), dtype=np.int64, count=n)
    pos = np.empty(n, dtype=np.int64)
    pos[order] = np.arange(n)
    chunks = n // chunk
    p = pos[: chunks * chunk].reshape(chunks, chunk)
    span = np.median((p.max(axis=1) - p.min(axis=1)) / n)
    src_chunk = order // chunk
    distinct = np.mean(
        [len(np.unique(src_chunk[i : i + batch])) for i in range(0, n - batch + 1, batch)]
    )
    rng = np.random.default_rng(0)
    uniform = np.mean(
        [len(np.unique(rng.integers(0, n, batch) // chunk)) for _ in range(n // batch)]
    )
    neighbour = float(np.mean(np.abs(pos[1:] - pos[:-1])) / n)
    return {
        "span": float(span),
        "distinct": float(distinct),
        "uniform_distinct": float(uniform),
        "neighbour": neighbour,
    }


def _sampler(spec: dict) -> dict:
    """N = 10^9, rank 3 of 8: iteration rate and ``state_dict()`` latency (untraced), then the
    same loop under tracemalloc for the Python-heap peak; RSS growth over both."""
    import resource

    from shardstream import ResumableSampler

    def loop(s: ResumableSampler, lat: list[float] | None) -> float:
        it = iter(s)
        t0 = time.perf_counter()
        for k in range(spec["indices"]):
            next(it)
            if lat is not None and (k + 1) % spec["batch"] == 0:
                t = time.perf_counter()
                s.state_dict()
                lat.append(time.perf_counter() - t)
        return time.perf_counter() - t0

    rss0 = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024
    s = ResumableSampler(10**9, seed=1, rank=3, world_size=8)
    rate = spec["indices"] / loop(s, None)
    lat: list[float] = []
    loop(ResumableSampler(10**9, seed=1, rank=3, world_size=8), lat)
    tracemalloc.start()
    s = ResumableSampler(10**9, seed=1, rank=3, world_size=8)
    loop(s, [])
    st = s.state_dict()
    _, peak = tracemalloc.get_traced_memory()
    tracemalloc.stop()
    rss1 = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024
    lat.sort()
    return {
        "peak_bytes": peak,
        "rss_growth_mb": rss1 - rss0,
        "pickle_bytes": len(pickle.dumps(st)),
        "json_bytes": len(json.dumps(st)),
        "p50_us": lat[len(lat) // 2] * 1e6,
        "p99_us": lat[int(len(lat) * 0.99)] * 1e6,
        "rate": rate,
    }


def _resume(spec: dict) -> dict:
    """Fresh process: build, load a state at ``frac`` of the epoch, first batch."""
    from shardstream import ParquetRows, ResumableSampler, collate

    data, frac, batch = spec["data"], spec["frac"], spec["batch"]
    t0 = time.perf_counter()
    ds = ParquetRows(data, columns=COLUMNS, output="torch")
    s = ResumableSampler(ds, seed=1, **spec["order"])
    # At least one batch left (--quick's small data).
    state = {**s.state_dict(), "position": min(int(len(ds) * frac), len(ds) - batch)}
    if spec["loader"]:
        from torchdata.stateful_dataloader import StatefulDataLoader

        dl = StatefulDataLoader(ds, batch_size=batch, sampler=s, num_workers=2, collate_fn=collate)
        t1 = time.perf_counter()
        s.load_state_dict(state)
        first = next(iter(dl))
    else:
        t1 = time.perf_counter()
        s.load_state_dict(state)
        it = iter(s)
        first = collate(ds.__getitems__([next(it) for _ in range(batch)]))
    t2 = time.perf_counter()
    assert len(first["id"]) == batch
    return {"open_ms": (t1 - t0) * 1e3, "first_ms": (t2 - t1) * 1e3}


def child_main(spec: dict) -> dict:
    kind = spec["kind"]
    if kind == "access":
        return _access(spec)
    if kind == "quality":
        return _quality(spec)
    if kind == "sampler":
        return _sampler(spec)
    if kind == "resume":
        return _resume(spec)
    raise SystemExit(f"unknown child kind {kind!r}")


# =========================================================================== parent side


def run(spec: dict) -> dict:
    if not benchlib.forkserver_available():
        return benchlib.run_child(__file__, spec)
    return benchlib.run_forked(child_main, spec, PRELOAD)


def status(msg: str) -> None:
    print(f"# {msg}", file=sys.stderr, flush=True)


def _rate(r: dict) -> float:
    return r["rows"] / r["seconds"]


def _cpu_rate(r: dict) -> float:
    return r["rows"] / r["cpu_seconds"] if r["cpu_seconds"] > 0 else float("nan")


def _hf_ok() -> str:
    try:
        import datasets  # noqa: F401
    except ImportError:
        return "skipped: datasets not installed"
    return ""


def ipc_copy(data: str, root: str) -> str:
    """The same rows as uncompressed Arrow IPC files (one per shard, record batches of 8,192
    rows), written once: shardstream memory-maps them, so a row is a slice of the mapping."""
    import pyarrow as pa
    import pyarrow.parquet as pq

    out = os.path.join(root, "ipc-" + os.path.basename(os.path.normpath(data)))
    if not os.path.isdir(out):
        tmp = out + ".tmp"
        os.makedirs(tmp, exist_ok=True)
        for p in shard_files(data):
            table = pq.read_table(p, columns=COLUMNS)
            name = os.path.splitext(os.path.basename(p))[0] + ".arrow"
            with pa.ipc.new_file(os.path.join(tmp, name), table.schema) as w:
                w.write_table(table, max_chunksize=8192)
        os.rename(tmp, out)
    return out


def bench_access(args: argparse.Namespace, data: str, results: dict) -> None:
    readers = ["ss-nocache", "ss-cache", "ss-ipc", "pa-take"]
    ipc_dir = ipc_copy(data, args.data_root)
    hf = _hf_ok()
    if not hf:
        readers.insert(2, "hf")
    hf_cache = os.path.join(args.data_root, "hf-cache")
    table = []
    for name, order in _orders(args).items():
        runs: dict[str, list[dict]] = {r: [] for r in readers}
        for _ in range(args.runs):
            for reader in readers:  # interleaved
                spec = dict(
                    kind="access",
                    data=data,
                    reader=reader,
                    order=order,
                    batches=args.batches,
                    batch=args.batch,
                    cache=args.cache_mb << 20,
                    hf_cache=hf_cache,
                    ipc_dir=ipc_dir,
                )
                runs[reader].append(run(spec))
                status(f"access {name} {reader}: {krows(_rate(runs[reader][-1]))}k rows/s")
        results.setdefault("access", {})[name] = runs
        base = summary([_rate(r) for r in runs["pa-take"]])["median"]
        for reader in readers:
            rs = runs[reader]
            wall = [_rate(r) for r in rs]
            cpu = [_cpu_rate(r) for r in rs]
            note = ""
            if reader == "pa-take":
                read = summary([r["read_s"] for r in rs])["median"]
                note = f"read_table + combine_chunks first: {read:.1f} s"
            if reader == "ss-cache":
                c = rs[-1]["cache"]
                hits = c["hits"] / max(1, c["hits"] + c["misses"])
                note = f"page hits {hits:.0%}"
            table.append(
                [
                    name,
                    reader,
                    with_spread(wall, krows),
                    with_spread(cpu, krows),
                    f"{summary(wall)['median'] / base:.3f}x",
                    note,
                    load_range(rs),
                ]
            )
    if hf:
        table.append(["-", "hf", hf, "", "", "", ""])
    print_table(
        table,
        headers=(
            "order",
            "reader",
            "k rows/s (wall)",
            "k rows/CPU-s",
            "vs pa-take (wall)",
            "note",
            "load",
        ),
        title=f"(A) random access, __getitems__ of {args.batch} rows in the sampler's order, "
        f"{COLUMNS}, arrow output, one process, page cache {args.cache_mb} MiB",
    )


def bench_quality(args: argparse.Namespace, data: str, results: dict) -> None:
    table = []
    for name, order in _orders(args).items():
        r = run(
            dict(kind="quality", n=args.quality_rows, chunk=1024, batch=args.batch, order=order)
        )
        results.setdefault("quality", {})[name] = r
        table.append(
            [
                name,
                f"{r['span']:.3f}",
                f"{r['distinct']:.1f} (uniform {r['uniform_distinct']:.1f})",
                f"{r['neighbour']:.4f} (uniform 0.3333)",
            ]
        )
    print_table(
        table,
        headers=(
            "order",
            "span of a 1,024-row source chunk / epoch",
            f"distinct chunks per batch of {args.batch}",
            "source neighbours' distance / epoch",
        ),
        title=f"(B) shuffle quality over {args.quality_rows:,} rows (no data read)",
    )


def bench_sampler(args: argparse.Namespace, results: dict) -> None:
    def us(x: float) -> str:
        return f"{x:.1f}"

    runs = [
        run(dict(kind="sampler", indices=args.sampler_indices, batch=args.batch))
        for _ in range(args.runs)
    ]
    results["sampler"] = runs
    table = [
        [
            "tracemalloc peak while iterating",
            with_spread([r["peak_bytes"] / 1024 for r in runs], lambda x: f"{x:.1f} KiB"),
        ],
        ["RSS growth", with_spread([r["rss_growth_mb"] for r in runs], lambda x: f"{x:.1f} MiB")],
        ["state_dict() pickled / JSON", f"{runs[0]['pickle_bytes']} B / {runs[0]['json_bytes']} B"],
        [
            "state_dict() p50 / p99",
            f"{with_spread([r['p50_us'] for r in runs], us)} / "
            f"{with_spread([r['p99_us'] for r in runs], us)} µs",
        ],
        [
            "iteration",
            with_spread([r["rate"] for r in runs], lambda x: f"{x / 1e6:.2f} M indices/s"),
        ],
        ["load", load_range(runs)],
    ]
    print_table(
        table,
        headers=("ResumableSampler at N = 10^9, rank 3 of 8", "figure"),
        title=f"(C) sampler: {args.sampler_indices:,} indices, "
        f"state_dict() after every {args.batch}",
    )


def bench_resume(args: argparse.Namespace, data: str, results: dict) -> None:
    table = []
    for loader in (False, True):
        for name, order in list(_orders(args).items())[:2]:
            per: dict[float, list[dict]] = {f: [] for f in FRACS}
            for _ in range(args.runs):
                for f in FRACS:
                    spec = dict(
                        kind="resume",
                        data=data,
                        frac=f,
                        batch=args.batch,
                        order=order,
                        loader=loader,
                    )
                    per[f].append(run(spec))
            results.setdefault("resume", {})[f"{name} loader={loader}"] = per
            cells = [
                with_spread([r["first_ms"] for r in per[f]], lambda x: f"{x:.1f}") for f in FRACS
            ]
            ratio = [
                a["first_ms"] / b["first_ms"] for a, b in zip(per[0.99], per[0.01], strict=True)
            ]
            table.append(
                [
                    "StatefulDataLoader, 2 workers" if loader else "in process",
                    name,
                    *cells,
                    with_spread(ratio, lambda x: f"{x:.2f}"),
                    load_range([r for f in FRACS for r in per[f]]),
                ]
            )
    print_table(
        table,
        headers=("path", "order", "1% (ms)", "50% (ms)", "99% (ms)", "99%/1%", "load"),
        title=f"(D) load_state_dict -> first batch of {args.batch} (torch output, collate)",
    )


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    p.add_argument("--only", nargs="*", choices=ALL, default=list(ALL))
    p.add_argument("--rows", type=int, default=200_000)
    p.add_argument("--shards", type=int, default=4)
    p.add_argument("--batch", type=int, default=256)
    p.add_argument("--batches", type=int, default=60, help="batches timed per access run")
    p.add_argument(
        "--blocks", nargs="*", default=["1024x16", "256x4"], help="block orders BLOCKxWINDOW"
    )
    p.add_argument("--cache-mb", type=int, default=256)
    p.add_argument("--runs", type=int, default=3)
    p.add_argument("--quality-rows", type=int, default=1_000_000)
    p.add_argument("--sampler-indices", type=int, default=200_000)
    p.add_argument("--data-root", default=os.path.join(ROOT, "bench-data"))
    p.add_argument("--json", default=None, help="write the raw results here")
    p.add_argument("--quick", action="store_true", help="small and fast: a smoke test")
    args = p.parse_args(argv)
    if args.quick:
        args.rows, args.batches, args.runs = 20_000, 8, 1
        args.quality_rows, args.sampler_indices = 50_000, 20_000
    data = ensure_data(args.data_root, args.rows, args.shards)
    warm_cache(data)
    print(
        f"# shardstream {_git_commit()}, {args.rows:,} rows in {args.shards} shards, "
        f"load {benchlib.load1():.1f}"
    )
    results: dict[str, Any] = {"args": vars(args)}
    if "access" in args.only:
        bench_access(args, data, results)
    if "quality" in args.only:
        bench_quality(args, data, results)
    if "sampler" in args.only:
        bench_sampler(args, results)
    if "resume" in args.only:
        bench_resume(args, data, results)
    benchlib.write_json(results, args.json)
    return 0


if __name__ == "__main__":
    if len(sys.argv) > 2 and sys.argv[1] == "--child":
        print(json.dumps(child_main(json.loads(sys.argv[2]))))
    else:
        sys.exit(main())
