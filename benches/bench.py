#!/usr/bin/env python3
"""shardstream benchmarks (``make bench``; ``python benches/bench.py --help``).

Measured on a generated shard set (cached under ./bench-data, reused between runs):
id int64, tokens list<int32> with 64..512 items, short strings, zstd, page index.

  iter     batch iteration rows/s: ParquetStream(batch_size=1024, output="arrow",
           columns=[id, tokens]) vs pyarrow ParquetFile.iter_batches, same files/columns
  shuffle  the same with shuffle_buffer=100_000 (baseline: pyarrow sequential)
  resume   fresh process: load_state_dict -> first batch at 1%/50%/99% of the data,
           vs pyarrow skipping rows (naive: read and drop; and a row-group-seek variant)
  state    state_dict() latency and size with shuffle buffer 0 / 10k / 100k rows
  rss      peak RSS of the iteration runs (reported with iter/shuffle)
  rows     row mode rows/s: ParquetStream(batch_size=None, output="python", columns=[id,
           tokens]) vs HuggingFace datasets streaming Parquet (load_dataset("parquet",
           streaming=True)), same files/columns, first --row-limit rows of the stream;
           again with [id, label] (no list column to convert to Python lists)
  resume-hf  fresh process, row mode: load -> first row at 1%/50%/99%: shardstream
           load_state_dict vs datasets IterableDataset.load_state_dict and .skip(n)
           (each HF run capped at --hf-cap seconds)
  loader   DataLoader / torchdata StatefulDataLoader (num_workers=2, snapshot_every_n_steps=1)
           batches/s over ParquetStream(batch_size=1024, output="torch", tokens as a list of
           tensors) vs a plain pyarrow IterableDataset (iter_batches, shards split by
           worker id), first --loader-batches batches

Every measurement runs in a fresh child process (so peak RSS and "fresh process"
resume numbers are clean); the baseline is measured in the same run.  The HuggingFace
rows need `pip install 'datasets>=2.18'` (`make bench` installs the `bench` extra);
without it they print "skipped: datasets not installed".
"""

from __future__ import annotations

import argparse
import json
import os
import pickle
import platform
import statistics
import subprocess
import sys
import tempfile
import time
from typing import Any

HERE = os.path.dirname(os.path.abspath(__file__))
ROOT = os.path.dirname(HERE)
ALL = ("iter", "shuffle", "resume", "state", "rss", "rows", "resume-hf", "loader")
COLUMNS = ["id", "tokens"]
BATCH = 1024
TOKENS_LEN = (64, 513)  # half-open: 64..512 tokens per row


# =========================================================================== child side


def _mem() -> dict[str, float]:
    """Current and peak RSS of this process in MiB (from /proc, else getrusage)."""
    out = {}
    try:
        with open("/proc/self/status") as f:
            for line in f:
                if line.startswith(("VmRSS:", "VmHWM:")):
                    k, v = line.split(":")
                    out[k] = int(v.split()[0]) / 1024
    except OSError:  # pragma: no cover - non-Linux
        import resource

        out["VmHWM"] = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024
        out["VmRSS"] = out["VmHWM"]
    return {"rss": out.get("VmRSS", 0.0), "peak": out.get("VmHWM", 0.0)}


def _files(data: str) -> list[str]:
    return sorted(os.path.join(data, n) for n in os.listdir(data) if n.endswith(".parquet"))


def _ss_iter(data: str, shuffle_buffer: int, repeat: int) -> dict[str, Any]:
    from shardstream import ParquetStream

    ds = ParquetStream(
        data, columns=COLUMNS, batch_size=BATCH, output="arrow", shuffle_buffer=shuffle_buffer
    )
    times, rows = [], 0
    for _ in range(repeat):
        t = time.perf_counter()
        rows = 0
        for b in ds:
            rows += b.num_rows
        times.append(time.perf_counter() - t)
    return {"seconds": min(times), "rows": rows}


def _pa_iter(data: str, repeat: int) -> dict[str, Any]:
    import pyarrow.parquet as pq

    times, rows = [], 0
    for _ in range(repeat):
        t = time.perf_counter()
        rows = 0
        for path in _files(data):
            for b in pq.ParquetFile(path).iter_batches(batch_size=BATCH, columns=COLUMNS):
                rows += b.num_rows
        times.append(time.perf_counter() - t)
    return {"seconds": min(times), "rows": rows}


def _ss_make_states(data: str, shuffle_buffer: int, fracs: list[float], out: str) -> dict:
    """Iterate once; save state_dict() right after the first batch ending at/after each
    fraction of the rows.  Returns {frac: (rows_before, first_id_of_next_batch)}."""
    from shardstream import ParquetStream

    ds = ParquetStream(
        data, columns=COLUMNS, batch_size=BATCH, output="arrow", shuffle_buffer=shuffle_buffer
    )
    n = ds.num_rows
    # Clamp so that a batch always follows the saved position (tiny --rows).
    targets = sorted((max(1, min(int(f * n), n - 2 * BATCH)), f) for f in fracs)
    states: dict[str, Any] = {}
    seen = 0
    pending: list[tuple[str, int]] = []
    i = 0
    for b in ds:
        if pending:  # the batch right after a saved state: remember its first id
            for key, rows in pending:
                states[key]["next_first_id"] = int(b.column(0)[0].as_py())
                states[key]["rows_before"] = rows
            pending = []
        seen += b.num_rows
        while i < len(targets) and seen >= targets[i][0]:
            key = repr(targets[i][1])
            states[key] = {"state": ds.state_dict(), "next_first_id": None, "rows_before": seen}
            pending.append((key, seen))
            i += 1
        if i >= len(targets) and not pending:
            break
    with open(out, "wb") as f:
        pickle.dump(states, f)
    return {k: {kk: vv for kk, vv in v.items() if kk != "state"} for k, v in states.items()}


def _ss_resume(data: str, shuffle_buffer: int, states_file: str, key: str) -> dict:
    with open(states_file, "rb") as f:
        st = pickle.load(f)[key]
    t0 = time.perf_counter()
    from shardstream import ParquetStream

    ds = ParquetStream(
        data, columns=COLUMNS, batch_size=BATCH, output="arrow", shuffle_buffer=shuffle_buffer
    )
    t1 = time.perf_counter()
    ds.load_state_dict(st["state"])
    b = next(iter(ds))
    t2 = time.perf_counter()
    return {
        "ctor_ms": (t1 - t0) * 1e3,
        "resume_ms": (t2 - t1) * 1e3,
        "first_id": int(b.column(0)[0].as_py()),
        "expected_first_id": st.get("next_first_id"),
    }


def _pa_skip(data: str, rows_before: int, seek: bool) -> dict:
    """Baselines: reach row `rows_before` and produce the next batch with pyarrow.
    seek=False: read and drop batches (what a generic 'skip N' resume does).
    seek=True: use footer row counts to jump to the row group, then drop the remainder."""
    return pa_skip_to(_files(data), rows_before, seek)


def pa_skip_to(sources: Any, rows_before: int, seek: bool) -> dict:
    """:func:`_pa_skip` over `sources`: anything `pyarrow.parquet.ParquetFile` opens (paths,
    or files of a pyarrow filesystem opened lazily, so opening them is timed too)."""
    import pyarrow.parquet as pq

    t0 = time.perf_counter()
    left = rows_before
    first_id = None
    for source in sources:
        pf = pq.ParquetFile(source)
        if seek:
            if left >= pf.metadata.num_rows:
                left -= pf.metadata.num_rows
                continue
            rgs = []
            for g in range(pf.metadata.num_row_groups):
                nrg = pf.metadata.row_group(g).num_rows
                if not rgs and left >= nrg:
                    left -= nrg
                    continue
                rgs.append(g)
            it = pf.iter_batches(batch_size=BATCH, columns=COLUMNS, row_groups=rgs)
        else:
            it = pf.iter_batches(batch_size=BATCH, columns=COLUMNS)
        for b in it:
            if left >= b.num_rows:
                left -= b.num_rows
                continue
            b = b.slice(left)
            first_id = int(b.column(0)[0].as_py())
            break
        if first_id is not None:
            break
    return {"resume_ms": (time.perf_counter() - t0) * 1e3, "first_id": first_id}


def _ss_state_latency(data: str, shuffle_buffer: int, frac: float, calls: int) -> dict:
    from shardstream import ParquetStream

    ds = ParquetStream(
        data, columns=COLUMNS, batch_size=BATCH, output="arrow", shuffle_buffer=shuffle_buffer
    )
    target = max(BATCH, int(frac * ds.num_rows))
    seen = 0
    it = iter(ds)
    for b in it:
        seen += b.num_rows
        if seen >= target:
            break
    lat = []
    state = None
    deadline = time.perf_counter() + 5.0
    for _ in range(calls):
        t = time.perf_counter()
        state = ds.state_dict()
        lat.append(time.perf_counter() - t)
        if time.perf_counter() > deadline:
            break
    size = len(pickle.dumps(state, protocol=pickle.HIGHEST_PROTOCOL))
    return {
        "median_us": statistics.median(lat) * 1e6,
        "max_us": max(lat) * 1e6,
        "calls": len(lat),
        "pickled_bytes": size,
    }


# --------------------------------------------------------------------- row mode, HF datasets


class _Capped(BaseException):
    """Raised by the --hf-cap alarm (BaseException: library `except Exception` won't eat it)."""


def _cap(seconds: float) -> None:
    """Interrupt this child's Python code after `seconds` (0 = no cap)."""
    import signal

    def fire(signum: int, frame: Any) -> None:
        raise _Capped()

    signal.signal(signal.SIGALRM, fire)
    signal.setitimer(signal.ITIMER_REAL, max(0.0, seconds))


def _hf_load(data: str, cache: str, columns: list[str] = COLUMNS) -> Any:
    """HuggingFace datasets streaming over the same files and columns (local, offline)."""
    os.environ.setdefault("HF_DATASETS_OFFLINE", "1")
    os.environ.setdefault("HF_HUB_OFFLINE", "1")
    os.environ.setdefault("HF_DATASETS_DISABLE_PROGRESS_BARS", "1")
    os.environ.setdefault("HF_DATASETS_CACHE", cache)
    import datasets

    datasets.logging.set_verbosity_error()
    return datasets.load_dataset(
        "parquet", data_files=_files(data), split="train", streaming=True, columns=columns
    )


def _rows_loop(it: Any, limit: int, cap: float) -> dict[str, Any]:
    """Consume up to `limit` rows (dicts) of `it`, stopping after `cap` s; ids checksummed."""
    t = time.perf_counter()
    first_ms = None
    rows = id_sum = 0
    for row in it:
        if first_ms is None:
            first_ms = (time.perf_counter() - t) * 1e3
        rows += 1
        id_sum += row["id"]
        if rows >= limit or (cap and rows % 1024 == 0 and time.perf_counter() - t > cap):
            break
    return {
        "seconds": time.perf_counter() - t,
        "rows": rows,
        "id_sum": id_sum,
        "first_ms": first_ms,
        "capped": rows < limit,
    }


def _ss_rows(data: str, limit: int, columns: list[str]) -> dict:
    from shardstream import ParquetStream

    ds = ParquetStream(data, columns=columns, batch_size=None, output="python")
    return _rows_loop(ds, limit, 0)


def _hf_rows(data: str, limit: int, columns: list[str], cap: float, cache: str) -> dict:
    t = time.perf_counter()
    ds = _hf_load(data, cache, columns)
    ctor_ms = (time.perf_counter() - t) * 1e3
    return {**_rows_loop(ds, limit, cap), "ctor_ms": ctor_ms}


def _ss_row_states(data: str, positions: list[int], out: str) -> dict:
    """Row mode: state_dict() after exactly k rows, for each k (read with columns=[id]: a
    state does not depend on the columns or the output kind)."""
    from shardstream import ParquetStream

    ds = ParquetStream(data, columns=["id"], batch_size=None, output="python")
    states: dict[str, Any] = {}
    want = sorted(positions)
    seen = 0
    pending = None
    for row in ds:
        if pending is not None:
            states[pending]["next_id"] = row["id"]
            pending = None
        seen += 1
        if want and seen == want[0]:
            pending = str(want.pop(0))
            states[pending] = {"state": ds.state_dict(), "next_id": None}
        if not want and pending is None:
            break
    with open(out, "wb") as f:
        pickle.dump(states, f)
    return {k: v["next_id"] for k, v in states.items()}


def _ss_row_resume(data: str, states_file: str, key: str) -> dict:
    with open(states_file, "rb") as f:
        st = pickle.load(f)[key]
    t0 = time.perf_counter()
    from shardstream import ParquetStream

    ds = ParquetStream(data, columns=COLUMNS, batch_size=None, output="python")
    t1 = time.perf_counter()
    ds.load_state_dict(st["state"])
    row = next(iter(ds))
    t2 = time.perf_counter()
    return {"ctor_ms": (t1 - t0) * 1e3, "resume_ms": (t2 - t1) * 1e3, "first_id": row["id"]}


def _hf_states(data: str, positions: list[int], out: str, cache: str) -> dict:
    """A genuine datasets state_dict() after exactly k rows, for each k.  Reaching k from the
    start would read k rows one by one (minutes at 99%), so: take a fresh dataset's state,
    point its shard index at the shard holding row k (what datasets itself saves at a shard
    start), load it, read the remaining rows of that shard one by one (arrow format, cheap),
    and save ds.state_dict() -- the state datasets produces there.  _hf_resume checks that it
    resumes at row k."""
    import pyarrow.parquet as pq

    counts = [pq.ParquetFile(p).metadata.num_rows for p in _files(data)]

    def point_at_shard(st: Any, shard: int) -> int:
        n = 0
        if isinstance(st, dict):
            if "shard_idx" in st and "shard_example_idx" in st:
                st["shard_idx"], st["shard_example_idx"] = shard, 0
                n += 1
            for v in st.values():
                n += point_at_shard(v, shard)
        return n

    states: dict[str, Any] = {}
    for k in positions:
        shard, within = 0, k
        while within >= counts[shard]:
            within -= counts[shard]
            shard += 1
        ds = _hf_load(data, cache).with_format("arrow")
        st = ds.state_dict()
        if point_at_shard(st, shard) != 1:
            raise RuntimeError(f"unexpected datasets state layout: {st}")
        ds.load_state_dict(st)
        it = iter(ds)
        for _ in range(within):
            next(it)
        state = ds.state_dict()
        nxt = next(it)
        states[str(k)] = {"state": state, "next_id": int(nxt.column("id")[0].as_py())}
    with open(out, "wb") as f:
        pickle.dump(states, f)
    return {k: v["next_id"] for k, v in states.items()}


def _hf_resume(data: str, mode: str, k: int, states_file: str, cap: float, cache: str) -> dict:
    """Fresh process: load_dataset -> (load_state_dict(state at row k) | skip(k)) -> first row."""
    st = None
    if mode == "state":
        with open(states_file, "rb") as f:
            st = pickle.load(f)[str(k)]["state"]
    t0 = time.perf_counter()
    _cap(cap)
    try:
        ds = _hf_load(data, cache)
        t1 = time.perf_counter()
        if mode == "state":
            ds.load_state_dict(st)
        else:
            ds = ds.skip(k)
        row = next(iter(ds))
        t2 = time.perf_counter()
    except _Capped:
        return {"capped": True, "total_ms": (time.perf_counter() - t0) * 1e3}
    finally:
        _cap(0)
    return {
        "capped": False,
        "ctor_ms": (t1 - t0) * 1e3,
        "resume_ms": (t2 - t1) * 1e3,
        "total_ms": (t2 - t0) * 1e3,
        "first_id": row["id"],
    }


# --------------------------------------------------------------------- DataLoader


def _pa_torch_dataset(files: list[str]) -> Any:
    """The plain baseline: a torch IterableDataset over pyarrow iter_batches, shards split by
    worker id, converted like ParquetStream(output="torch"): id -> tensor, tokens -> list of
    1-D tensors (views of one values tensor)."""
    import numpy as np
    import pyarrow.parquet as pq
    import torch
    from torch.utils.data import IterableDataset, get_worker_info

    class PyarrowShards(IterableDataset):
        def __iter__(self) -> Any:
            info = get_worker_info()
            wid, nw = (info.id, info.num_workers) if info is not None else (0, 1)
            for path in files[wid::nw]:
                for rb in pq.ParquetFile(path).iter_batches(batch_size=BATCH, columns=COLUMNS):
                    tok = rb.column(1)
                    offsets = tok.offsets.to_numpy()
                    values = torch.from_dlpack(tok.values)
                    yield {
                        "id": torch.from_dlpack(rb.column(0)),
                        "tokens": list(torch.split(values, np.diff(offsets).tolist())),
                    }

    return PyarrowShards()


def _loader(data: str, src: str, loader: str, workers: int, max_batches: int) -> dict:
    if src == "ss":
        from shardstream import ParquetStream

        ds = ParquetStream(data, columns=COLUMNS, batch_size=BATCH, output="torch")
    else:
        ds = _pa_torch_dataset(_files(data))
    if loader == "sdl":
        from torchdata.stateful_dataloader import StatefulDataLoader

        dl = StatefulDataLoader(ds, batch_size=None, num_workers=workers, snapshot_every_n_steps=1)
    else:
        from torch.utils.data import DataLoader

        dl = DataLoader(ds, batch_size=None, num_workers=workers)
    t = time.perf_counter()
    batches = rows = 0
    for b in dl:
        assert isinstance(b["tokens"], list)
        batches += 1
        rows += len(b["id"])
        if max_batches and batches >= max_batches:
            break
    seconds = time.perf_counter() - t
    del dl  # shut the workers down before measuring peak RSS
    return {"seconds": seconds, "batches": batches, "rows": rows}


def child_main(spec: dict) -> dict:
    kind = spec["kind"]
    data = spec["data"]
    # Import both libraries up front in every child so the RSS baselines are comparable.
    import pyarrow.parquet  # noqa: F401
    import shardstream  # noqa: F401  (imports torch when present)

    base = _mem()["rss"]
    if kind == "ss_iter":
        r = _ss_iter(data, spec["shuffle_buffer"], spec["repeat"])
    elif kind == "pa_iter":
        r = _pa_iter(data, spec["repeat"])
    elif kind == "ss_states":
        r = _ss_make_states(data, spec["shuffle_buffer"], spec["fracs"], spec["out"])
    elif kind == "ss_resume":
        r = _ss_resume(data, spec["shuffle_buffer"], spec["states"], spec["key"])
    elif kind == "pa_skip":
        r = _pa_skip(data, spec["rows_before"], spec["seek"])
    elif kind == "ss_state":
        r = _ss_state_latency(data, spec["shuffle_buffer"], spec["frac"], spec["calls"])
    elif kind == "ss_rows":
        r = _ss_rows(data, spec["limit"], spec["columns"])
    elif kind == "hf_rows":
        r = _hf_rows(data, spec["limit"], spec["columns"], spec["cap"], spec["hf_cache"])
    elif kind == "ss_row_states":
        r = _ss_row_states(data, spec["positions"], spec["out"])
    elif kind == "ss_row_resume":
        r = _ss_row_resume(data, spec["states"], spec["key"])
    elif kind == "hf_states":
        r = _hf_states(data, spec["positions"], spec["out"], spec["hf_cache"])
    elif kind == "hf_resume":
        r = _hf_resume(data, spec["mode"], spec["k"], spec["states"], spec["cap"], spec["hf_cache"])
    elif kind == "loader":
        r = _loader(data, spec["src"], spec["loader"], spec["workers"], spec["max_batches"])
    else:
        raise SystemExit(f"unknown child kind {kind!r}")
    m = _mem()
    r.update({"rss_base_mb": base, "rss_peak_mb": m["peak"]})
    return r


# =========================================================================== parent side


def _hf_missing() -> str:
    """Why the HuggingFace datasets rows cannot run ("" if they can)."""
    from importlib import metadata

    try:
        v = metadata.version("datasets")
    except metadata.PackageNotFoundError:
        return "skipped: datasets not installed"
    major_minor = tuple(int(x) for x in (v.split(".") + ["0"])[:2] if x.isdigit())
    if major_minor < (2, 18):
        return f"skipped: datasets {v} < 2.18 (no IterableDataset.state_dict)"
    return ""


def _hf_child(spec: dict) -> Any:
    """run_child for a HuggingFace datasets run: a failure there (another datasets version,
    say) becomes a table cell instead of stopping the whole benchmark."""
    try:
        return run_child(spec, timeout=spec.get("cap", 0) + 300)
    except RuntimeError as e:
        return f"failed ({e}; output above)"
    except subprocess.TimeoutExpired:
        return "failed (child timed out)"


def run_child(spec: dict, timeout: float = 1800) -> dict:
    cmd = [sys.executable, os.path.abspath(__file__), "--child", json.dumps(spec)]
    p = subprocess.run(cmd, capture_output=True, text=True, timeout=timeout)
    if p.returncode != 0:
        sys.stderr.write(p.stdout + p.stderr)
        raise RuntimeError(f"benchmark child {spec['kind']} failed (exit {p.returncode})")
    return json.loads(p.stdout.strip().splitlines()[-1])


def ensure_data(root: str, rows: int, shards: int) -> str:
    """Generate (once) and return the data directory for this size."""
    from shardstream.datagen import write_shards

    params = {
        "rows": rows,
        "shards": shards,
        "tokens_len": list(TOKENS_LEN),
        "compression": "zstd",
        "page_index": True,
        "v": 1,
    }
    d = os.path.join(root, f"rows{rows}-shards{shards}")
    marker = os.path.join(d, "params.json")
    if os.path.exists(marker):
        with open(marker) as f:
            if json.load(f) == params:
                return d
    os.makedirs(d, exist_ok=True)
    for n in os.listdir(d):
        os.remove(os.path.join(d, n))
    per = [rows // shards + (1 if i < rows % shards else 0) for i in range(shards)]
    print(f"# generating {rows:,} rows in {shards} shards under {d} ...", flush=True)
    t = time.perf_counter()
    write_shards(
        d,
        num_shards=shards,
        rows_per_shard=per,
        tokens_len=TOKENS_LEN,
        compression="zstd",
        page_index=True,
        seed=0,
    )
    with open(marker, "w") as f:
        json.dump(params, f)
    print(f"# generated in {time.perf_counter() - t:.1f}s", flush=True)
    return d


def warm_cache(data: str) -> None:
    for p in _files(data):
        with open(p, "rb") as f:
            while f.read(1 << 24):
                pass


def fmt_rate(rows: int, s: float) -> str:
    return f"{rows / s / 1e6:.2f} M rows/s ({s:.2f} s)"


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(
        description=__doc__.split("\n\n")[0], formatter_class=argparse.RawDescriptionHelpFormatter
    )
    ap.add_argument(
        "--only",
        default=",".join(ALL),
        help=f"comma-separated subset of {','.join(ALL)} (default: all)",
    )
    ap.add_argument("--rows", type=int, default=2_000_000, help="total rows (%(default)s)")
    ap.add_argument("--shards", type=int, default=8, help="number of shards (%(default)s)")
    ap.add_argument("--repeat", type=int, default=2, help="passes per throughput run; best kept")
    ap.add_argument(
        "--data-root", default=os.path.join(ROOT, "bench-data"), help="cache dir for shards"
    )
    ap.add_argument(
        "--row-limit",
        type=int,
        default=500_000,
        help="rows read by each row-mode throughput run (rows; %(default)s)",
    )
    ap.add_argument(
        "--hf-cap",
        type=float,
        default=30.0,
        help="seconds after which a HuggingFace datasets run is stopped (%(default)s)",
    )
    ap.add_argument(
        "--loader-batches",
        type=int,
        default=250,
        help="batches per DataLoader run, 0 = whole epoch (loader; %(default)s)",
    )
    ap.add_argument("--json", default=None, help="also write raw results to this file")
    ap.add_argument("--child", default=None, help=argparse.SUPPRESS)
    args = ap.parse_args(argv)

    if args.child is not None:
        print(json.dumps(child_main(json.loads(args.child))), flush=True)
        sys.stderr.flush()
        # Skip interpreter teardown: pyarrow's thread pool can hang at exit after a scan was
        # abandoned mid-way (datasets streaming stopped after n rows); the result is out.
        os._exit(0)

    which = [w.strip() for w in args.only.split(",") if w.strip()]
    bad = sorted(set(which) - set(ALL))
    if bad:
        ap.error(f"unknown benchmark(s) {bad}; choose from {ALL}")
    t_all = time.perf_counter()
    data = ensure_data(args.data_root, args.rows, args.shards)
    warm_cache(data)
    size_mb = sum(os.path.getsize(p) for p in _files(data)) / 2**20
    results: dict[str, Any] = {"rows": args.rows, "shards": args.shards, "data_mb": size_mb}
    table: list[tuple[str, str, str, str]] = []

    def status(msg: str) -> None:
        print(f"# {msg}", file=sys.stderr, flush=True)

    base = {"data": data, "repeat": args.repeat}
    pa = None
    if {"iter", "shuffle", "rss"} & set(which):
        status("pyarrow iter_batches baseline")
        pa = run_child({**base, "kind": "pa_iter"})
        results["pa_iter"] = pa
    if "iter" in which or "rss" in which:
        status("shardstream iteration")
        ss = run_child({**base, "kind": "ss_iter", "shuffle_buffer": 0})
        results["ss_iter"] = ss
        assert pa is not None
        if ss["rows"] != pa["rows"]:
            raise SystemExit(f"row count mismatch: shardstream {ss['rows']} vs {pa['rows']}")
        if "iter" in which:
            table.append(
                (
                    "(a) iterate, batch 1024, arrow, [id, tokens]",
                    fmt_rate(ss["rows"], ss["seconds"]),
                    fmt_rate(pa["rows"], pa["seconds"]) + " iter_batches",
                    f"{pa['seconds'] / ss['seconds']:.2f}x throughput",
                )
            )
    if "shuffle" in which or "rss" in which:
        status("shardstream iteration, shuffle_buffer=100k")
        sh = run_child({**base, "kind": "ss_iter", "shuffle_buffer": 100_000})
        results["ss_shuffle"] = sh
        assert pa is not None
        if "shuffle" in which:
            table.append(
                (
                    "(b) same + shuffle_buffer=100,000",
                    fmt_rate(sh["rows"], sh["seconds"]),
                    fmt_rate(pa["rows"], pa["seconds"]) + " (sequential)",
                    f"{pa['seconds'] / sh['seconds']:.2f}x throughput",
                )
            )
    if "resume" in which:
        fracs = [0.01, 0.5, 0.99]
        with tempfile.TemporaryDirectory(prefix="ssbench-") as tmp:
            for sb in (0, 100_000):
                status(f"resume states (shuffle_buffer={sb})")
                sf = os.path.join(tmp, f"states-{sb}.pkl")
                info = run_child(
                    {**base, "kind": "ss_states", "shuffle_buffer": sb, "fracs": fracs, "out": sf}
                )
                res_ss = {}
                for f in fracs:
                    k = repr(f)
                    status(f"resume at {f:.0%} (shuffle_buffer={sb})")
                    r = run_child(
                        {**base, "kind": "ss_resume", "shuffle_buffer": sb, "states": sf, "key": k}
                    )
                    if r["first_id"] != info[k]["next_first_id"]:
                        raise SystemExit(
                            f"resume at {f}: first id {r['first_id']} != "
                            f"{info[k]['next_first_id']} (shuffle_buffer={sb})"
                        )
                    res_ss[k] = {**r, **info[k]}
                results[f"resume_ss_sb{sb}"] = res_ss
                if sb == 0:
                    res_pa: dict[str, Any] = {}
                    for f in fracs:
                        k = repr(f)
                        rows_before = info[k]["rows_before"]
                        for seek in (False, True):
                            status(f"pyarrow skip to {f:.0%} (seek={seek})")
                            r = run_child(
                                {**base, "kind": "pa_skip", "rows_before": rows_before,
                                 "seek": seek}
                            )  # fmt: skip
                            if r["first_id"] != info[k]["next_first_id"]:
                                raise SystemExit(f"pyarrow skip baseline wrong at {f}: {r}")
                            res_pa[f"{k}-{'seek' if seek else 'drop'}"] = r
                    results["resume_pa"] = res_pa
                for f in fracs:
                    k = repr(f)
                    r = res_ss[k]
                    tot = r["ctor_ms"] + r["resume_ms"]
                    label = f"(c) resume at {f:.0%}" + ("" if sb == 0 else ", shuffle_buffer=100k")
                    ss_s = f"{r['resume_ms']:.1f} ms (+ {r['ctor_ms']:.1f} ms constructor)"
                    if sb == 0:
                        drop = results["resume_pa"][f"{k}-drop"]["resume_ms"]
                        seek = results["resume_pa"][f"{k}-seek"]["resume_ms"]
                        table.append(
                            (
                                label,
                                ss_s,
                                f"read+drop {drop:.1f} ms; row-group seek {seek:.1f} ms",
                                f"{drop / tot:.1f}x / {seek / tot:.1f}x faster (incl. ctor)",
                            )
                        )
                    else:
                        table.append((label, ss_s, "-", "-"))
                lo, hi = res_ss[repr(fracs[0])], res_ss[repr(fracs[-1])]
                flat = hi["resume_ms"] / lo["resume_ms"]
                pa_flat = "-"
                if sb == 0:
                    d = results["resume_pa"]
                    hi_pa = d[repr(fracs[-1]) + "-drop"]["resume_ms"]
                    lo_pa = d[repr(fracs[0]) + "-drop"]["resume_ms"]
                    pa_flat = f"read+drop {hi_pa / lo_pa:.1f}x"
                table.append(
                    (
                        "(c) flatness: resume 99% / 1%"
                        + ("" if sb == 0 else ", shuffle_buffer=100k"),
                        f"{flat:.2f}x",
                        pa_flat,
                        "1.0 = O(1)",
                    )
                )
    if "state" in which:
        for sb in (0, 10_000, 100_000):
            status(f"state_dict latency (shuffle_buffer={sb})")
            r = run_child(
                {**base, "kind": "ss_state", "shuffle_buffer": sb, "frac": 0.3, "calls": 200}
            )
            results[f"state_sb{sb}"] = r
            table.append(
                (
                    f"(d) state_dict(), shuffle_buffer={sb:,}",
                    f"{r['median_us']:.1f} us median (max {r['max_us']:.1f}), "
                    f"{r['pickled_bytes']:,} B pickled",
                    "-",
                    "-",
                )
            )
    if "rss" in which:
        assert pa is not None
        ss, sh = results["ss_iter"], results["ss_shuffle"]
        for label, r in (("(e) peak RSS, iterate", ss), ("(e) peak RSS, shuffle 100k", sh)):
            table.append(
                (
                    label,
                    f"{r['rss_peak_mb']:.0f} MiB (+{r['rss_peak_mb'] - r['rss_base_mb']:.0f} "
                    "over imports)",
                    f"{pa['rss_peak_mb']:.0f} MiB (+{pa['rss_peak_mb'] - pa['rss_base_mb']:.0f})",
                    f"{r['rss_peak_mb'] / pa['rss_peak_mb']:.2f}x",
                )
            )

    hf_missing = _hf_missing()
    hf_cache = os.path.join(args.data_root, "hf-cache")
    if "rows" in which:
        limit = min(args.row_limit, args.rows)
        # [id, tokens] as everywhere else; [id, label] (no list column) shows the per-row cost
        # without list<int32> -> Python list conversion, which bounds both libraries.
        for cols in (COLUMNS, ["id", "label"]):
            name = ", ".join(cols)
            status(f"row mode [{name}]: shardstream, first {limit:,} rows")
            ss = run_child({**base, "kind": "ss_rows", "limit": limit, "columns": cols})
            results[f"rows_ss_{'_'.join(cols)}"] = ss
            label = f"(f) row mode, python, [{name}], first {limit:,} rows"
            ss_s = (
                f"{ss['rows'] / ss['seconds'] / 1e3:.1f} k rows/s ({ss['seconds']:.2f} s; "
                f"first row {ss['first_ms']:.0f} ms)"
            )
            if hf_missing:
                table.append((label, ss_s, f"datasets streaming: {hf_missing}", "-"))
                continue
            status(f"row mode [{name}]: datasets streaming (cap {args.hf_cap:.0f}s)")
            hf = _hf_child({**base, "kind": "hf_rows", "limit": limit, "columns": cols,
                            "cap": args.hf_cap, "hf_cache": hf_cache})  # fmt: skip
            results[f"rows_hf_{'_'.join(cols)}"] = hf
            if isinstance(hf, str):
                table.append((label, ss_s, f"datasets streaming: {hf}", "-"))
                continue
            n = hf["rows"]
            if n == ss["rows"] and hf["id_sum"] != ss["id_sum"]:
                raise SystemExit(f"row mode: datasets read other rows than shardstream: {hf}")
            capped = f"; capped at {args.hf_cap:.0f} s after {n:,} rows" if hf["capped"] else ""
            table.append(
                (
                    label,
                    ss_s,
                    f"datasets streaming {n / hf['seconds'] / 1e3:.1f} k rows/s "
                    f"({hf['seconds']:.2f} s; first row {hf['first_ms']:.0f} ms; "
                    f"+ {hf['ctor_ms']:.0f} ms load_dataset{capped})",
                    f"{(ss['rows'] / ss['seconds']) / (n / hf['seconds']):.2f}x throughput",
                )
            )
    if "resume-hf" in which:
        n = args.rows
        fracs = [0.01, 0.5, 0.99]
        # Same positions as (c): the end of the first 1024-row batch at/after each fraction.
        pos = [max(1, min(-(-int(f * n) // BATCH) * BATCH, n - 2 * BATCH)) for f in fracs]
        with tempfile.TemporaryDirectory(prefix="ssbench-") as tmp:
            status("row-mode resume states (shardstream)")
            sf = os.path.join(tmp, "ss-row-states.pkl")
            info = run_child({**base, "kind": "ss_row_states", "positions": pos, "out": sf})
            res_ss: dict[str, Any] = {}
            for f, k in zip(fracs, pos, strict=True):
                status(f"row-mode resume at {f:.0%} (shardstream)")
                r = run_child({**base, "kind": "ss_row_resume", "states": sf, "key": str(k)})
                if r["first_id"] != info[str(k)] or r["first_id"] != k:
                    raise SystemExit(f"row-mode resume at {f}: first id {r['first_id']} != {k}")
                res_ss[str(k)] = r
            results["resume_rows_ss"] = res_ss
            res_hf: dict[str, Any] = {}
            hf_err = hf_missing
            if not hf_err:
                status("row-mode resume states (datasets)")
                hsf = os.path.join(tmp, "hf-states.pkl")
                hinfo = _hf_child({**base, "kind": "hf_states", "positions": pos, "out": hsf,
                                   "hf_cache": hf_cache})  # fmt: skip
                if isinstance(hinfo, str):
                    hf_err = hinfo
                else:
                    for k in pos:
                        if hinfo[str(k)] != k:
                            raise SystemExit(f"datasets state at row {k} resumes at {hinfo}")
            for f, k in zip(fracs, pos, strict=True):
                if hf_err:
                    break
                for mode in ("state", "skip"):
                    status(f"datasets resume at {f:.0%} ({mode}, cap {args.hf_cap:.0f}s)")
                    r = _hf_child({**base, "kind": "hf_resume", "mode": mode, "k": k,
                                   "states": hsf, "cap": args.hf_cap,
                                   "hf_cache": hf_cache})  # fmt: skip
                    if isinstance(r, str):
                        hf_err = r
                        break
                    if not r["capped"] and r["first_id"] != k:
                        raise SystemExit(f"datasets {mode} resume at row {k}: {r}")
                    res_hf[f"{k}-{mode}"] = r
            results["resume_rows_hf"] = res_hf

        def hf_cell(r: dict) -> str:
            if r["capped"]:
                return f"> {r['total_ms'] / 1e3:.0f} s (capped)"
            return f"{r['resume_ms']:.0f} ms (+ {r['ctor_ms']:.0f} ms load_dataset)"

        def hf_ratio(r: dict, ss_total: float) -> str:
            return f"{'>' if r['capped'] else ''}{r['total_ms'] / ss_total:.0f}x"

        for f, k in zip(fracs, pos, strict=True):
            r = res_ss[str(k)]
            tot = r["ctor_ms"] + r["resume_ms"]
            label = f"(g) row-mode resume at {f:.0%} (row {k:,}), python, [id, tokens]"
            ss_s = f"{r['resume_ms']:.1f} ms (+ {r['ctor_ms']:.1f} ms constructor)"
            if hf_err:
                table.append((label, ss_s, f"datasets: {hf_err}", "-"))
                continue
            st, sk = res_hf[f"{k}-state"], res_hf[f"{k}-skip"]
            table.append(
                (
                    label,
                    ss_s,
                    f"datasets load_state_dict {hf_cell(st)}; skip(n) {hf_cell(sk)}",
                    f"{hf_ratio(st, tot)} / {hf_ratio(sk, tot)} faster (incl. ctor)",
                )
            )
        lo, hi = res_ss[str(pos[0])], res_ss[str(pos[-1])]
        hf_flat = "-"
        if not hf_err:
            parts = []
            for mode in ("state", "skip"):
                a, b = res_hf[f"{pos[0]}-{mode}"], res_hf[f"{pos[-1]}-{mode}"]
                cap = ">" if b["capped"] else ""
                name = "load_state_dict" if mode == "state" else "skip(n)"
                parts.append(f"{name} {cap}{b['total_ms'] / a['total_ms']:.1f}x")
            hf_flat = "datasets " + "; ".join(parts) + " (incl. load_dataset)"
        table.append(
            (
                "(g) flatness: row-mode resume 99% / 1%",
                f"{hi['resume_ms'] / lo['resume_ms']:.2f}x",
                hf_flat,
                "1.0 = O(1)",
            )
        )
    if "loader" in which:
        nb = args.loader_batches
        runs: dict[str, list[dict]] = {}
        for _ in range(args.repeat):  # interleaved, best kept: the machine may be noisy
            for loader in ("dl", "sdl"):
                for src in ("ss", "pa"):
                    status(f"{loader} over {src}, 2 workers, {nb or 'all'} batches")
                    r = run_child({**base, "kind": "loader", "src": src, "loader": loader,
                                   "workers": 2, "max_batches": nb})  # fmt: skip
                    runs.setdefault(f"{loader}-{src}", []).append(r)
        results["loader"] = runs

        def best(key: str) -> dict:
            return max(runs[key], key=lambda r: r["rows"] / r["seconds"])

        def cell(r: dict) -> str:
            return (
                f"{r['batches'] / r['seconds']:.1f} batches/s "
                f"({r['rows'] / r['seconds'] / 1e3:.0f} k rows/s)"
            )

        names = {"dl": "DataLoader", "sdl": "StatefulDataLoader(snapshot_every_n_steps=1)"}
        for loader in ("dl", "sdl"):
            ss, pa_ = best(f"{loader}-ss"), best(f"{loader}-pa")
            table.append(
                (
                    f"(h) {names[loader]}, 2 workers, batch 1024, torch, tokens as list"
                    f" of tensors, first {nb or 'all'} batches",
                    cell(ss),
                    cell(pa_) + " pyarrow IterableDataset",
                    f"{(ss['rows'] / ss['seconds']) / (pa_['rows'] / pa_['seconds']):.2f}x "
                    "throughput",
                )
            )
    import shardstream

    print()
    print(
        f"shardstream {getattr(shardstream, '__version__', '?')} | {args.rows:,} rows, "
        f"{args.shards} shards, {size_mb:.0f} MiB zstd, tokens list<int32> 64-512 | "
        f"{platform.python_implementation()} {platform.python_version()}, "
        f"{os.cpu_count()} cores | {time.strftime('%Y-%m-%d')}"
    )
    print(f"command: python benches/bench.py --rows {args.rows} --shards {args.shards} "
          f"--only {','.join(which)} --repeat {args.repeat}")  # fmt: skip
    print_table(table, t_all, results, args.json)
    return 0


def print_table(table: list, t_all: float, results: Any, json_path: str | None) -> None:
    """The markdown table every bench prints (and its raw results as JSON, if asked)."""
    print()
    print("| benchmark | shardstream | baseline (same run) | ratio |")
    print("|---|---|---|---|")
    for row in table:
        print("| " + " | ".join(row) + " |")
    print()
    print(f"(total bench time {time.perf_counter() - t_all:.0f}s)")
    if json_path:
        with open(json_path, "w") as f:
            json.dump(results, f, indent=2)


if __name__ == "__main__":
    sys.exit(main())
