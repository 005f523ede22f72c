#!/usr/bin/env python3
"""shardstream over an object store: throughput and deep-resume cost against a local moto S3
server (``python benches/bench_s3.py --help``; ``--quick`` for a small run).

The shard set is benches/bench.py's (cached under ./bench-data): id int64, tokens
list<int32> with 64..512 items, short strings, zstd, page index.  It is uploaded to a moto
server started on 127.0.0.1 (in its own process, tests/objstore_server.py) and read with
columns [id, tokens], batches of 1024 rows:

  iter     rows/s: shardstream on the local path; shardstream over s3://; pyarrow
           S3FileSystem(endpoint_override=moto) + ParquetFile.iter_batches over the same
           objects (default, and pre_buffer=True); pyarrow on the local path; plain boto3
           GETs of whole objects (moto's own ceiling)
  resume   fresh process, over s3://: constructor (catalog open), load_state_dict -> first
           batch at 1%/50%/90%; bytes and requests to the first batch (ds.stats()) against a
           full read; baseline: pyarrow S3FileSystem reaching the same row with a row-group
           seek (footer row counts) and dropping the rest of that row group's batches
  open     opening N small objects (--open-shards, default 100,1000,10000; 1 row group of 100
           rows each): ParquetStream's constructor without and with the remote sidecar
           (`shardstream index s3://...`), requests and bytes; baselines: pyarrow.dataset over
           S3FileSystem, listing only (dataset()) and with every footer read (count_rows(),
           what the constructor learns); wall and CPU time of the opening process
  spawn    a DataLoader with 4 spawn-started workers over the 1,000-object set: time from
           iter() to the first batch and to the end of the epoch, the workers getting the
           catalog pickled (now) vs re-opening it (the behaviour before, emulated by a subclass
           that drops the catalog when pickled), and the requests the store saw (a counting
           proxy in front of moto, in both runs)

moto is a Python (werkzeug) server: on a 2-core machine it shares the CPU with the reader
and is likely the bottleneck of every over-s3 number here; the "boto3 GET" row shows its
ceiling.  Every measurement runs in a fresh child process.
"""

from __future__ import annotations

import argparse
import json
import os
import pickle
import platform
import sys
import tempfile
import time
from typing import Any

HERE = os.path.dirname(os.path.abspath(__file__))
ROOT = os.path.dirname(HERE)
sys.path.insert(0, HERE)
sys.path.insert(0, os.path.join(ROOT, "tests"))

import benchlib  # noqa: E402
from bench import BATCH, COLUMNS, ensure_data, save_states, shard_files, warm_cache  # noqa: E402
from benchlib import print_table  # noqa: E402
from shardstream import ParquetStream  # noqa: E402

ALL = ("iter", "resume", "open", "spawn")
OPEN_ROWS = 100  # rows per object of the open benchmark (one row group each)
BUCKET, PREFIX = "bench", "data"
FRACS = [0.01, 0.5, 0.9]


# =========================================================================== child side


def _opts(endpoint: str) -> dict[str, str]:
    from objstore_server import storage_options

    return storage_options(endpoint)


def _pa_fs(endpoint: str) -> Any:
    import pyarrow.fs as pafs
    from objstore_server import ACCESS_KEY, REGION, SECRET_KEY

    return pafs.S3FileSystem(
        endpoint_override=endpoint,
        scheme="http",
        access_key=ACCESS_KEY,
        secret_key=SECRET_KEY,
        region=REGION,
    )


def _keys(spec: dict) -> list[str]:
    return [f"{BUCKET}/{PREFIX}/{os.path.basename(p)}" for p in shard_files(spec["data"])]


def _ss_iter(spec: dict) -> dict:
    from shardstream import ParquetStream
    from shardstream.cli.bench import timed_passes

    remote = spec["source"].startswith("s3://")
    kw = {"storage_options": _opts(spec["endpoint"])} if remote else {}

    def one_pass(info: dict[str, Any]) -> Any:  # timed from the constructor (catalog) on
        t = time.perf_counter()
        ds = ParquetStream(spec["source"], columns=COLUMNS, batch_size=BATCH, output="arrow", **kw)
        info["open_ms"] = (time.perf_counter() - t) * 1e3
        opened = info["open"] = ds.stats() if remote else {}
        yield from ds
        if remote:
            end = ds.stats()
            info["read"] = {k: end[k] - opened.get(k, 0) for k in end}

    runs = []
    for _ in range(spec["repeat"]):
        info: dict[str, Any] = {}
        r = timed_passes(lambda info=info: one_pass(info))
        runs.append({**r, **info} if remote else r)
    return min(runs, key=lambda r: r["seconds"])


def _pa_iter(spec: dict) -> dict:
    from shardstream.cli.bench import pa_batches, timed_passes

    fs = _pa_fs(spec["endpoint"]) if spec.get("endpoint") else None
    paths = _keys(spec) if fs is not None else shard_files(spec["data"])

    def batches() -> Any:
        sources = (fs.open_input_file(p) for p in paths) if fs is not None else paths
        return pa_batches(sources, COLUMNS, BATCH, pre_buffer=spec.get("pre_buffer", False))

    runs = [timed_passes(batches) for _ in range(spec["repeat"])]
    return min(runs, key=lambda r: r["seconds"])


def _boto_get(spec: dict) -> dict:
    from objstore_server import s3_client

    c = s3_client(spec["endpoint"])
    t = time.perf_counter()
    n = 0
    for key in _keys(spec):
        n += len(c.get_object(Bucket=BUCKET, Key=key.split("/", 1)[1])["Body"].read())
    return {"seconds": time.perf_counter() - t, "bytes": n}


def _ss_states(spec: dict) -> dict:
    """bench.py's states at each fraction, saved while iterating the local copy (a copy of the
    same files in the bucket is the same dataset)."""
    return save_states(spec["data"], 0, spec["fracs"], spec["out"])


def _ss_resume(spec: dict) -> dict:
    from shardstream import ParquetStream
    from shardstream.cli.bench import time_resume

    with open(spec["states"], "rb") as f:
        st = pickle.load(f)[spec["key"]]
    kw: dict[str, Any] = {}
    if spec.get("readahead_threads") is not None:
        kw["readahead_threads"] = spec["readahead_threads"]
    made: list[Any] = []

    def make() -> Any:
        ds = ParquetStream(
            spec["source"],
            columns=COLUMNS,
            batch_size=BATCH,
            output="arrow",
            storage_options=_opts(spec["endpoint"]),
            **kw,
        )
        made.append((ds, ds.stats()))  # the catalog's requests, before the resume
        return ds

    ctor, resume, b = time_resume(make, st["state"])
    ds, opened = made[0]
    after = ds.stats()
    return {
        "ctor_ms": ctor * 1e3,
        "resume_ms": resume * 1e3,
        "first_id": int(b.column(0)[0].as_py()),
        "open": opened,
        "resume": {k: after[k] - opened.get(k, 0) for k in after},
    }


def _pa_seek(spec: dict) -> dict:
    """pyarrow over S3: jump to the row group holding row `rows_before` by footer row counts,
    then read and drop batches up to it (bench.py's baseline, on S3FileSystem files)."""
    from shardstream.cli.bench import pa_skip_to

    fs = _pa_fs(spec["endpoint"])
    files = (fs.open_input_file(path) for path in _keys(spec))
    return pa_skip_to(files, spec["rows_before"], True, COLUMNS, BATCH)


def _open_opts(spec: dict) -> dict[str, str]:
    return _opts(spec.get("proxy") or spec["endpoint"])


def _ss_open(spec: dict) -> dict:
    """ParquetStream's constructor over N objects, then its first batch."""
    from shardstream import ParquetStream

    opts = _opts(spec["endpoint"])
    t, c = time.perf_counter(), time.process_time()
    ds = ParquetStream(spec["source"], batch_size=BATCH, output="arrow", storage_options=opts)
    out = {"seconds": time.perf_counter() - t, "cpu_seconds": time.process_time() - c}
    out["open"] = ds.stats()
    out["shards"] = len(ds.shards)
    t = time.perf_counter()
    first = next(iter(ds))
    out["first_batch_s"] = time.perf_counter() - t
    out["first_id"] = int(first.column(0)[0].as_py())
    return out


def _pa_open(spec: dict) -> dict:
    """pyarrow.dataset over S3FileSystem: dataset() (lists) and count_rows() (reads every
    footer), the same objects."""
    import pyarrow.dataset as pads

    fs = _pa_fs(spec["endpoint"])
    t, c = time.perf_counter(), time.process_time()
    d = pads.dataset(spec["prefix"], filesystem=fs, format="parquet")
    listed = time.perf_counter() - t
    rows = d.count_rows()
    return {
        "seconds": time.perf_counter() - t,
        "cpu_seconds": time.process_time() - c,
        "list_seconds": listed,
        "rows": rows,
        "files": len(d.files),
    }


def _index(spec: dict) -> dict:
    from shardstream.index import write_index

    t = time.perf_counter()
    path = write_index(spec["source"], _opts(spec["endpoint"]))
    return {"seconds": time.perf_counter() - t, "index": path}


class Reopening(ParquetStream):
    """ParquetStream as it pickled before: without its catalog, re-opened in the worker (the
    spawn benchmark's baseline; module level, so that spawned workers can unpickle it)."""

    def __getstate__(self) -> dict:
        d = super().__getstate__()
        d["_catalog"] = None
        return d

    def __setstate__(self, d: dict) -> None:
        from shardstream._core import RawCatalog

        super().__setstate__(d)
        self._catalog = RawCatalog(self._sources, self._columns, self._storage_options)


def _spawn(spec: dict) -> dict:
    """A DataLoader with spawn-started workers: iter() -> first batch -> end of the epoch."""
    from torch.utils.data import DataLoader

    cls = Reopening if spec["reopen"] else ParquetStream
    ds = cls(spec["source"], batch_size=BATCH, output="torch", storage_options=_open_opts(spec))
    loader = DataLoader(
        ds, batch_size=None, num_workers=spec["workers"], multiprocessing_context="spawn"
    )
    t = time.perf_counter()
    it = iter(loader)
    rows = len(next(it)["id"])
    first = time.perf_counter() - t
    for b in it:
        rows += len(b["id"])
    return {"first_batch_s": first, "seconds": time.perf_counter() - t, "rows": rows}


def child_main(spec: dict) -> dict:
    import pyarrow.parquet  # noqa: F401
    import shardstream  # noqa: F401

    kinds = {
        "ss_iter": _ss_iter,
        "pa_iter": _pa_iter,
        "boto_get": _boto_get,
        "ss_states": _ss_states,
        "ss_resume": _ss_resume,
        "pa_seek": _pa_seek,
        "ss_open": _ss_open,
        "pa_open": _pa_open,
        "index": _index,
        "spawn": _spawn,
    }
    if spec["kind"] not in kinds:
        raise SystemExit(f"unknown child kind {spec['kind']!r}")
    return kinds[spec["kind"]](spec)


# =========================================================================== parent side


def run_child(spec: dict, timeout: float = 1800) -> dict:
    return benchlib.run_child(__file__, spec, timeout)


def rate(r: dict) -> str:
    return f"{r['rows'] / r['seconds'] / 1e6:.2f} M rows/s ({r['seconds']:.2f} s)"


def mib(n: float) -> str:
    return f"{n / 2**20:.1f} MiB"


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(
        description=__doc__.split("\n\n")[0], formatter_class=argparse.RawDescriptionHelpFormatter
    )
    ap.add_argument("--only", default=",".join(ALL), help=f"subset of {','.join(ALL)}")
    ap.add_argument("--rows", type=int, default=2_000_000, help="total rows (%(default)s)")
    ap.add_argument("--shards", type=int, default=8, help="number of shards (%(default)s)")
    ap.add_argument("--repeat", type=int, default=2, help="passes per throughput run; best kept")
    ap.add_argument("--quick", action="store_true", help="200k rows, 2 shards, 1 pass")
    ap.add_argument(
        "--data-root", default=os.path.join(ROOT, "bench-data"), help="cache dir for shards"
    )
    ap.add_argument(
        "--open-shards",
        default="100,1000,10000",
        help="object counts of the open benchmark (%(default)s)",
    )
    ap.add_argument("--open-runs", type=int, default=3, help="runs per open condition")
    ap.add_argument("--json", default=None, help="also write raw results to this file")
    ap.add_argument("--child", default=None, help=argparse.SUPPRESS)
    args = ap.parse_args(argv)

    if args.child is not None:
        print(json.dumps(child_main(json.loads(args.child))), flush=True)
        sys.stderr.flush()
        os._exit(0)  # skip interpreter teardown (pyarrow's S3 client at exit)

    if args.quick:
        args.rows, args.shards, args.repeat = 200_000, 2, 1
        args.open_shards, args.open_runs = "100,1000", 1
    open_counts = sorted({int(x) for x in args.open_shards.split(",") if x.strip()})
    which = [w.strip() for w in args.only.split(",") if w.strip()]
    bad = sorted(set(which) - set(ALL))
    if bad:
        ap.error(f"unknown benchmark(s) {bad}; choose from {ALL}")

    from objstore_server import MotoServer, s3_client

    t_all = time.perf_counter()
    data = ensure_data(args.data_root, args.rows, args.shards)
    warm_cache(data)
    files = shard_files(data)
    size = sum(os.path.getsize(p) for p in files)
    import pyarrow.parquet as pq

    n_rg = sum(pq.ParquetFile(p).metadata.num_row_groups for p in files)
    results: dict[str, Any] = {"rows": args.rows, "shards": args.shards, "data_bytes": size}
    table: list[tuple[str, str, str, str]] = []

    def status(msg: str) -> None:
        print(f"# {msg}", file=sys.stderr, flush=True)

    with MotoServer() as srv:
        status(f"moto on {srv.endpoint}; uploading {len(files)} objects, {mib(size)}")
        client = s3_client(srv.endpoint)
        client.create_bucket(Bucket=BUCKET)
        for p in files:
            with open(p, "rb") as f:
                client.put_object(Bucket=BUCKET, Key=f"{PREFIX}/{os.path.basename(p)}", Body=f)
        url = f"s3://{BUCKET}/{PREFIX}/"
        base = {"data": data, "endpoint": srv.endpoint, "repeat": args.repeat}

        full_read: dict[str, int] | None = None
        if "iter" in which:
            status("boto3 GET of every object (moto's ceiling)")
            raw = run_child({**base, "kind": "boto_get"})
            status("pyarrow, local path")
            pa_local = run_child({**base, "kind": "pa_iter", "endpoint": None})
            status("pyarrow S3FileSystem (default)")
            pa_s3 = run_child({**base, "kind": "pa_iter"})
            status("pyarrow S3FileSystem (pre_buffer=True)")
            pa_s3_pb = run_child({**base, "kind": "pa_iter", "pre_buffer": True})
            status("shardstream, local path")
            ss_local = run_child({**base, "kind": "ss_iter", "source": data})
            status("shardstream, s3://")
            ss_s3 = run_child({**base, "kind": "ss_iter", "source": url})
            for r in (pa_local, pa_s3, pa_s3_pb, ss_local):
                if r["rows"] != ss_s3["rows"]:
                    raise SystemExit(f"row count mismatch: {r['rows']} vs {ss_s3['rows']}")
            results.update(
                boto_get=raw,
                pa_local=pa_local,
                pa_s3=pa_s3,
                pa_s3_prebuffer=pa_s3_pb,
                ss_local=ss_local,
                ss_s3=ss_s3,
            )
            full_read = ss_s3["read"]
            best_pa = max(pa_s3, pa_s3_pb, key=lambda r: r["rows"] / r["seconds"])
            tput = lambda r: r["rows"] / r["seconds"]  # noqa: E731
            rd, op = ss_s3["read"], ss_s3["open"]
            table += [
                (
                    "(a) iterate, local path",
                    rate(ss_local),
                    rate(pa_local) + " pyarrow iter_batches",
                    f"{tput(ss_local) / tput(pa_local):.2f}x throughput",
                ),
                (
                    "(b) iterate over s3:// (moto)",
                    rate(ss_s3)
                    + f"; {mib(rd['bytes'])} in {rd.get('http_requests', rd['requests'])} "
                    f"requests, {rd['retries']} retries",
                    rate(pa_s3) + " pyarrow S3FileSystem iter_batches",
                    f"{tput(ss_s3) / tput(pa_s3):.2f}x throughput",
                ),
                (
                    "(b) same, pyarrow with pre_buffer=True",
                    "-",
                    rate(pa_s3_pb),
                    f"{tput(ss_s3) / tput(pa_s3_pb):.2f}x throughput",
                ),
                (
                    "(c) s3 / local",
                    f"{tput(ss_s3) / tput(ss_local):.2f}x",
                    f"pyarrow best s3 / local {tput(best_pa) / tput(pa_local):.2f}x",
                    "-",
                ),
                (
                    "(d) catalog open over s3://",
                    f"{ss_s3['open_ms']:.0f} ms; {op.get('http_requests', op['requests'])} "
                    f"requests, {mib(op['bytes'])}",
                    "-",
                    "-",
                ),
                (
                    "(e) moto ceiling: boto3 GET whole objects",
                    f"{raw['bytes'] / raw['seconds'] / 2**20:.0f} MiB/s",
                    f"shardstream's fetch rate while iterating "
                    f"{rd['bytes'] / ss_s3['seconds'] / 2**20:.1f} MiB/s (decode-bound)",
                    "-",
                ),
            ]

        if "resume" in which:
            with tempfile.TemporaryDirectory(prefix="ssbench-s3-") as tmp:
                sf = os.path.join(tmp, "states.pkl")
                status("resume states (local copy)")
                info = run_child({**base, "kind": "ss_states", "fracs": FRACS, "out": sf})
                if full_read is None:
                    status("full read over s3:// (bytes reference)")
                    full_read = run_child({**base, "kind": "ss_iter", "source": url, "repeat": 1})[
                        "read"
                    ]
                res: dict[str, Any] = {}
                for f in FRACS:
                    k = repr(f)
                    for ra in (None, 0):
                        status(f"resume over s3:// at {f:.0%} (readahead_threads={ra})")
                        r = run_child(
                            {**base, "kind": "ss_resume", "source": url, "states": sf, "key": k,
                             "readahead_threads": ra}
                        )  # fmt: skip
                        if r["first_id"] != info[k]["next_first_id"]:
                            raise SystemExit(
                                f"resume at {f}: first id {r['first_id']} != "
                                f"{info[k]['next_first_id']}"
                            )
                        res[f"{k}-ra{ra}"] = r
                    status(f"pyarrow S3 row-group seek to {f:.0%}")
                    pa = run_child(
                        {**base, "kind": "pa_seek", "rows_before": info[k]["rows_before"]}
                    )
                    if pa["first_id"] != info[k]["next_first_id"]:
                        raise SystemExit(f"pyarrow seek baseline wrong at {f}: {pa}")
                    res[f"{k}-pa"] = pa
                results["resume"] = res
                results["full_read"] = full_read
                for f in FRACS:
                    k = repr(f)
                    r, r0, pa = res[f"{k}-raNone"], res[f"{k}-ra0"], res[f"{k}-pa"]
                    rb, rb0 = r["resume"]["bytes"], r0["resume"]["bytes"]
                    nreq = r["resume"].get("http_requests", r["resume"]["requests"])
                    ss_total = r["resume_ms"] + r["ctor_ms"]
                    table.append(
                        (
                            f"(f) resume over s3:// at {f:.0%}: load_state_dict -> first batch",
                            f"{r['resume_ms']:.0f} ms (+ {r['ctor_ms']:.0f} ms constructor); "
                            f"{mib(rb)} in {nreq} requests = {rb / full_read['bytes']:.2%} of "
                            f"a full read's {mib(full_read['bytes'])} (readahead_threads=0: "
                            f"{mib(rb0)} = {rb0 / full_read['bytes']:.2%}, "
                            f"{r0['resume_ms']:.0f} ms)",
                            f"{pa['resume_ms']:.0f} ms pyarrow S3 row-group seek + drop",
                            f"pyarrow / shardstream time {pa['resume_ms'] / ss_total:.2f}x "
                            "(shardstream incl. ctor)",
                        )
                    )

        if "open" in which or "spawn" in which:
            counts = set(open_counts) if "open" in which else set()
            if "spawn" in which:
                counts.add(SPAWN_SHARDS)
            res_open: dict[str, Any] = {}
            for n in sorted(counts):
                local = ensure_open_data(args.data_root, n)
                bucket = f"open-{n}"
                status(f"uploading {n:,} objects of {OPEN_ROWS} rows")
                upload_many(client, local, bucket)
                url = f"s3://{bucket}/{PREFIX}/"
                spec = {**base, "source": url, "prefix": f"{bucket}/{PREFIX}"}
                index_key = f"{PREFIX}/_shardstream_index.json"
                if "spawn" in which and n == SPAWN_SHARDS:
                    res_open["spawn"] = run_spawn(srv.endpoint, spec, args.open_runs, status)
                    table += spawn_rows(res_open["spawn"], n)
                if "open" not in which or n not in open_counts:
                    continue
                status(f"shardstream index {url}")
                run_child({**spec, "kind": "index"})
                sidecar = client.get_object(Bucket=bucket, Key=index_key)["Body"].read()
                runs: dict[str, list] = {"plain": [], "side": [], "pa": []}
                for r in range(args.open_runs):
                    client.delete_object(Bucket=bucket, Key=index_key)
                    status(f"open {n:,} objects, run {r + 1}: shardstream, pyarrow")
                    runs["plain"].append(run_child({**spec, "kind": "ss_open"}))
                    runs["pa"].append(run_child({**spec, "kind": "pa_open"}))
                    client.put_object(Bucket=bucket, Key=index_key, Body=sidecar)
                    status(f"open {n:,} objects, run {r + 1}: shardstream with the sidecar")
                    runs["side"].append(run_child({**spec, "kind": "ss_open"}))
                for r in runs["plain"] + runs["side"]:
                    if r["shards"] != n or r["first_id"] != 0:
                        raise SystemExit(f"open of {n} objects read {r['shards']} shards: {r}")
                for r in runs["pa"]:
                    if r["files"] != n or r["rows"] != n * OPEN_ROWS:
                        raise SystemExit(f"pyarrow found {r['files']} files, {r['rows']} rows")
                res_open[str(n)] = {**runs, "sidecar_bytes": len(sidecar)}
                table += open_rows(runs, n, len(sidecar))
            results["open"] = res_open

    import shardstream

    print()
    print(
        f"shardstream {getattr(shardstream, '__version__', '?')} | {args.rows:,} rows, "
        f"{args.shards} shards, {n_rg} row groups, {mib(size)} zstd, tokens list<int32> "
        f"64-512, columns "
        f"[id, tokens], batch {BATCH} | moto {_moto_version()} on 127.0.0.1 | "
        f"{platform.python_implementation()} {platform.python_version()}, "
        f"{os.cpu_count()} cores | {time.strftime('%Y-%m-%d')}"
    )
    quick = " --quick" if args.quick else ""
    print(
        f"command: python benches/bench_s3.py --rows {args.rows} --shards {args.shards} "
        f"--only {','.join(which)} --repeat {args.repeat}{quick}"
    )
    print_table(table)
    print()
    print(f"(total bench time {time.perf_counter() - t_all:.0f}s)")
    benchlib.write_json(results, args.json)
    return 0


SPAWN_SHARDS = 1000  # objects of the spawn benchmark
SPAWN_WORKERS = 4


def ensure_open_data(data_root: str, n: int) -> str:
    """``n`` objects of OPEN_ROWS rows, one row group each (cached)."""
    from shardstream import datagen

    d = os.path.join(data_root, f"open-{n}x{OPEN_ROWS}")
    done = os.path.join(d, ".complete")
    if not os.path.exists(done):
        datagen.write_shards(
            d, num_shards=n, rows_per_shard=OPEN_ROWS, row_group_size=OPEN_ROWS, seed=1
        )
        open(done, "w").close()
    return d


def upload_many(client: Any, local: str, bucket: str) -> None:
    from concurrent.futures import ThreadPoolExecutor

    from objstore_server import create_bucket

    create_bucket(client, bucket)
    names = sorted(f for f in os.listdir(local) if f.endswith(".parquet"))

    def put(name: str) -> None:
        with open(os.path.join(local, name), "rb") as f:
            client.put_object(Bucket=bucket, Key=f"{PREFIX}/{name}", Body=f.read())

    with ThreadPoolExecutor(8) as pool:
        list(pool.map(put, names))


def run_spawn(endpoint: str, spec: dict, runs: int, status: Any) -> dict:
    """Spawn start-up through a counting proxy: catalog pickled vs re-opened, interleaved."""
    from objstore_server import FaultProxy

    out: dict[str, list] = {"pickled": [], "reopen": []}
    with FaultProxy(endpoint) as proxy:
        for r in range(runs):
            for cond in ("reopen", "pickled"):
                status(f"spawn {SPAWN_WORKERS} workers ({cond}), run {r + 1}")
                proxy.reset_stats()
                res = run_child(
                    {
                        **spec,
                        "kind": "spawn",
                        "reopen": cond == "reopen",
                        "workers": SPAWN_WORKERS,
                        "proxy": proxy.endpoint,
                    }
                )
                res["requests"] = proxy.stats()["requests"]
                out[cond].append(res)
    return out


def _med(runs: list, key: str) -> float:
    import statistics

    return statistics.median(r[key] for r in runs)


def _ms_spread(runs: list, key: str = "seconds") -> str:
    return benchlib.with_spread([r[key] * 1e3 for r in runs], lambda v: f"{v:,.0f}")


def open_rows(runs: dict, n: int, sidecar_bytes: int) -> list[tuple[str, str, str, str]]:
    plain, side, pa = runs["plain"], runs["side"], runs["pa"]
    load = benchlib.load_range(plain + side + pa)
    op, os_ = plain[0]["open"], side[0]["open"]
    return [
        (
            f"(g) open {n:,} objects (load {load})",
            f"{_ms_spread(plain)} ms, CPU {_med(plain, 'cpu_seconds'):.2f} s; "
            f"{op.get('http_requests', op['requests']):,} requests, {mib(op['bytes'])}",
            f"pyarrow.dataset: {_ms_spread(pa, 'list_seconds')} ms listing only; "
            f"{_ms_spread(pa)} ms with count_rows() (every footer), CPU "
            f"{_med(pa, 'cpu_seconds'):.2f} s",
            f"pyarrow count_rows / shardstream {_med(pa, 'seconds') / _med(plain, 'seconds'):.2f}x",
        ),
        (
            f"(g) same with the sidecar ({mib(sidecar_bytes)}, {sidecar_bytes / n:.0f} B/shard)",
            f"{_ms_spread(side)} ms, CPU {_med(side, 'cpu_seconds'):.2f} s; "
            f"{os_.get('http_requests', os_['requests']):,} requests, {mib(os_['bytes'])}; "
            f"first batch {_ms_spread(side, 'first_batch_s')} ms after",
            f"without: {_med(plain, 'seconds') * 1e3:,.0f} ms",
            f"{_med(plain, 'seconds') / _med(side, 'seconds'):.1f}x faster; pyarrow listing "
            f"only / this {_med(pa, 'list_seconds') / _med(side, 'seconds'):.2f}x",
        ),
    ]


def spawn_rows(res: dict, n: int) -> list[tuple[str, str, str, str]]:
    pk, ro = res["pickled"], res["reopen"]
    load = benchlib.load_range(pk + ro)
    return [
        (
            f"(h) DataLoader, {SPAWN_WORKERS} spawn workers, {n:,} objects (load {load}): "
            "iter() -> first batch",
            f"{_ms_spread(pk, 'first_batch_s')} ms (catalog pickled); epoch "
            f"{_ms_spread(pk)} ms; {_med(pk, 'requests'):.0f} requests",
            f"{_ms_spread(ro, 'first_batch_s')} ms (each worker re-opens); epoch "
            f"{_ms_spread(ro)} ms; {_med(ro, 'requests'):.0f} requests",
            f"{_med(ro, 'first_batch_s') / _med(pk, 'first_batch_s'):.2f}x faster start, "
            f"{_med(ro, 'requests') / _med(pk, 'requests'):.1f}x fewer requests",
        )
    ]


def _moto_version() -> str:
    try:
        import moto

        return moto.__version__
    except Exception:  # pragma: no cover
        return "?"


if __name__ == "__main__":
    sys.exit(main())
