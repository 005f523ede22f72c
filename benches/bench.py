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

Every measurement runs in a fresh child process (so peak RSS and "fresh process"
resume numbers are clean); the baseline is measured in the same run.
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
ALL = ("iter", "shuffle", "resume", "state", "rss")
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
    import pyarrow.parquet as pq

    t0 = time.perf_counter()
    left = rows_before
    first_id = None
    for path in _files(data):
        pf = pq.ParquetFile(path)
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
    else:
        raise SystemExit(f"unknown child kind {kind!r}")
    m = _mem()
    r.update({"rss_base_mb": base, "rss_peak_mb": m["peak"]})
    return r


# =========================================================================== parent side


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
    ap.add_argument("--json", default=None, help="also write raw results to this file")
    ap.add_argument("--child", default=None, help=argparse.SUPPRESS)
    args = ap.parse_args(argv)

    if args.child is not None:
        print(json.dumps(child_main(json.loads(args.child))))
        return 0

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
    print()
    print("| benchmark | shardstream | pyarrow baseline | ratio |")
    print("|---|---|---|---|")
    for row in table:
        print("| " + " | ".join(row) + " |")
    print()
    print(f"(total bench time {time.perf_counter() - t_all:.0f}s)")
    if args.json:
        with open(args.json, "w") as f:
            json.dump(results, f, indent=2)
    return 0


if __name__ == "__main__":
    sys.exit(main())
