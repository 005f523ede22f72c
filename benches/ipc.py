"""Arrow IPC shards and HF `datasets` directories (issue 15), side by side in one run:

* iteration over IPC *files* (`output="arrow"`; a new dataset per pass, and one dataset
  iterated pass after pass as epochs are) vs a `pyarrow.ipc.open_file(...).get_batch(i)` loop
  (the file read, and memory-mapped: zero-copy like shardstream; the target; for epochs, the
  mapped readers opened once and looped pass after pass, as the epochs' baseline) and vs
  `pyarrow.dataset(format="arrow")` (best of several batch sizes); as a reference only, the
  memory-mapped loop with `batch.validate(full=True)` per batch (shardstream validates what it
  decodes);
* iteration over an HF `save_to_disk` directory (IPC streams) vs
  `datasets.load_from_disk(d).with_format("arrow").iter(batch_size)` (batches) and vs
  `to_iterable_dataset()` rows (row mode, on the first --row-limit rows);
* resume to the first batch at 1% / 50% / 99% of the HF directory (fresh dataset, warm page
  cache) vs `datasets`' `IterableDataset.load_state_dict` + first row at the same positions;
* open time of a 1,000-file stream-format dataset, without and with the sidecar.

    .venv/bin/python benches/ipc.py [--rows 1000000] [--runs 3] [--dir bench-data/ipc]
                                    [--json out.json] [--only-files]

Data is generated once under --dir (the HF directory with `datasets` itself). Timings are wall
and CPU seconds, warm page cache; the load average is recorded beside them. Each IPC-files
case runs in a fresh process forked from a preloaded server, the cases interleaved (order
rotated each round), --runs rounds, reported as median (min-max) with the ratios of the pairs
compared; the HF, resume and open-time figures run once, in this process.
"""

from __future__ import annotations

import argparse
import json
import os
import sys
import time

import numpy as np
import pyarrow as pa
import pyarrow.dataset as pads

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import benchlib  # noqa: E402
from benchlib import load1, load_range, mrows, print_table, summary, with_spread, write_json  # noqa: E402
from shardstream import ParquetStream  # noqa: E402
from shardstream.cli.bench import time_resume, timed_passes  # noqa: E402

TOKENS = 256


def _table(first: int, n: int) -> pa.Table:
    ids = np.arange(first, first + n, dtype=np.int64)
    values = (np.arange(n * TOKENS, dtype=np.int64) % 50_000).astype(np.int32)
    offsets = np.arange(0, (n + 1) * TOKENS, TOKENS, dtype=np.int32)
    tokens = pa.ListArray.from_arrays(pa.array(offsets), pa.array(values))
    return pa.table({"id": ids, "tokens": tokens})


def hf_dir(root: str, rows: int, shards: int) -> str:
    d = os.path.join(root, f"hf-{rows}")
    if os.path.exists(os.path.join(d, "state.json")):
        return d
    import datasets

    datasets.disable_progress_bars()
    parts = [_table(i, min(100_000, rows - i)) for i in range(0, rows, 100_000)]
    datasets.Dataset(pa.concat_tables(parts)).save_to_disk(d, num_shards=shards)
    return d


def ipc_files(root: str, rows: int, shards: int) -> list[str]:
    d = os.path.join(root, f"files-{rows}")
    os.makedirs(d, exist_ok=True)
    per = rows // shards
    out = []
    for s in range(shards):
        p = os.path.join(d, f"part-{s:05d}.arrow")
        out.append(p)
        if os.path.exists(p):
            continue
        t = _table(s * per, per)
        with pa.ipc.new_file(p + ".tmp", t.schema) as w:
            for b in t.to_batches(max_chunksize=1000):
                w.write_batch(b)
        os.replace(p + ".tmp", p)
    return out


def many_streams(root: str, n: int) -> str:
    d = os.path.join(root, f"streams-{n}")
    if os.path.isdir(d) and len(os.listdir(d)) >= n:
        return d
    os.makedirs(d, exist_ok=True)
    for i in range(n):
        t = _table(i * 200, 200)
        with pa.ipc.new_stream(os.path.join(d, f"data-{i:05d}.arrow"), t.schema) as w:
            for b in t.to_batches(max_chunksize=50):
                w.write_batch(b)
    return d


def _rate(r: dict) -> dict:
    return {
        "rows_per_s": r["rows"] / r["seconds"],
        "rows_per_cpu_s": r["rows"] / max(r["cpu_seconds"], 1e-9),
        "load1": load1(),
    }


def best(fn, sizes) -> dict:
    runs = {bs: fn(bs) for bs in sizes}
    bs = max(runs, key=lambda k: runs[k]["rows_per_s"])
    return {**runs[bs], "batch_size": bs}


# The IPC-files cases, each run in a fresh process (files_child); FILE_CASES' values say what
# each is. The pairs compared are (shardstream_epochs, pyarrow_get_batch_mmap_epochs) and
# (shardstream, pyarrow_get_batch_mmap): the target is the zero-copy get_batch loop at its best.
FILE_CASES = {
    "shardstream": "shardstream, a new dataset per pass (catalog opened each pass), best size",
    "shardstream_epochs": "shardstream, one dataset iterated pass after pass (epochs), batch 1,000",
    "pyarrow_get_batch": "pyarrow `open_file(path).get_batch(i)` loop (reads each batch)",
    "pyarrow_get_batch_mmap": "pyarrow `get_batch` loop, `pa.memory_map`, files opened per pass",
    "pyarrow_get_batch_mmap_epochs": "pyarrow `get_batch` loop, mapped readers opened once",
    "pyarrow_get_batch_mmap_validate_full": "same as per pass + `validate(full=True)` (reference)",
    "pyarrow_dataset": '`pyarrow.dataset(format="arrow")`, best batch size',
}
PRELOAD = ["pyarrow", "pyarrow.dataset", "pyarrow.ipc", "numpy", "shardstream"]


def files_child(spec: dict) -> dict:
    """One IPC-files case (``spec["kind"]``) in this (fresh) process."""
    files, sizes, t = spec["files"], spec["sizes"], spec["seconds"]
    kind = spec["kind"]

    def ss_files(bs):
        mk = lambda: ParquetStream(files, batch_size=bs, output="arrow", shuffle_buffer=0)  # noqa: E731
        return _rate(timed_passes(mk, t))

    def ss_files_epochs(bs):
        # one dataset iterated pass after pass (epochs): the catalog is opened once
        ds = ParquetStream(files, batch_size=bs, output="arrow", shuffle_buffer=0)
        return _rate(timed_passes(lambda: ds, t))

    def pa_get_batch(bs):
        def one():
            for p in files:
                with pa.ipc.open_file(p) as r:
                    for i in range(r.num_record_batches):
                        yield r.get_batch(i)

        return _rate(timed_passes(one, t))

    def pa_get_batch_mmap(bs):
        def one():
            for p in files:
                with pa.memory_map(p) as m, pa.ipc.open_file(m) as r:
                    for i in range(r.num_record_batches):
                        yield r.get_batch(i)

        return _rate(timed_passes(one, t))

    def pa_get_batch_mmap_epochs(bs):
        # the baseline of `shardstream_epochs`: every file mapped and opened once, then the
        # get_batch loop pass after pass (what a loop over the same files for several epochs
        # would do at its best; reopening each pass costs the mapping's page faults again)
        readers = [pa.ipc.open_file(pa.memory_map(p)) for p in files]

        def one():
            for r in readers:
                for i in range(r.num_record_batches):
                    yield r.get_batch(i)

        return _rate(timed_passes(one, t))

    def pa_get_batch_mmap_validate(bs):
        # a reference, not the target: what validating every batch (as shardstream does) costs
        def one():
            for p in files:
                with pa.memory_map(p) as m, pa.ipc.open_file(m) as r:
                    for i in range(r.num_record_batches):
                        b = r.get_batch(i)
                        b.validate(full=True)
                        yield b

        return _rate(timed_passes(one, t))

    def pa_dataset(bs):
        ds = pads.dataset(files, format="arrow")
        return _rate(timed_passes(lambda: ds.to_batches(batch_size=bs), t))

    if kind == "shardstream":
        return best(ss_files, sizes)
    if kind == "shardstream_epochs":
        return ss_files_epochs(1000)
    if kind == "pyarrow_dataset":
        return best(pa_dataset, sizes)
    return {
        "pyarrow_get_batch": pa_get_batch,
        "pyarrow_get_batch_mmap": pa_get_batch_mmap,
        "pyarrow_get_batch_mmap_epochs": pa_get_batch_mmap_epochs,
        "pyarrow_get_batch_mmap_validate_full": pa_get_batch_mmap_validate,
    }[kind](0)


def _median_of(runs: list[dict]) -> dict:
    out = {k: summary([r[k] for r in runs])["median"] for k in ("rows_per_s", "rows_per_cpu_s")}
    return {**out, "runs": runs}


def _print_files(runs: dict[str, list[dict]]) -> None:
    def rate(case: str, key: str) -> str:
        return with_spread([r[key] for r in runs[case]], mrows)

    print_table(
        [
            [
                FILE_CASES[c],
                rate(c, "rows_per_s"),
                rate(c, "rows_per_cpu_s"),
                "/".join(str(r.get("batch_size", "-")) for r in v),
                load_range(v),
            ]
            for c, v in runs.items()
        ],
        ("case", "M rows/s", "M rows/CPU-s", "batch size per run", "load"),
        title='IPC files, `output="arrow"` batches (median (min-max) of fresh processes)',
    )
    rows = []
    for ours, theirs in (
        ("shardstream_epochs", "pyarrow_get_batch_mmap_epochs"),
        ("shardstream", "pyarrow_get_batch_mmap"),
    ):
        cells = [f"{ours} / {theirs}"]
        for key in ("rows_per_s", "rows_per_cpu_s"):
            a = [r[key] for r in runs[ours]]
            b = [r[key] for r in runs[theirs]]
            per_run = ", ".join(f"{x / y:.2f}" for x, y in zip(a, b, strict=True))
            med = summary(a)["median"] / summary(b)["median"]
            cells.append(f"{med:.2f} (per round: {per_run})")
        rows.append(cells)
    print_table(rows, ("pair", "wall ratio of medians", "CPU ratio of medians"))


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--rows", type=int, default=1_000_000)
    ap.add_argument("--shards", type=int, default=8)
    ap.add_argument("--row-limit", type=int, default=100_000)
    ap.add_argument("--many", type=int, default=1000)
    ap.add_argument("--seconds", type=float, default=2.0)
    ap.add_argument("--dir", default="bench-data/ipc")
    ap.add_argument("--json")
    ap.add_argument("--only-files", action="store_true", help="just the IPC files comparison")
    ap.add_argument("--runs", type=int, default=3, help="fresh processes per IPC-files case")
    args = ap.parse_args()
    import datasets

    datasets.disable_progress_bars()
    res: dict = {"load1_start": load1()}
    files = ipc_files(args.dir, args.rows, args.shards)
    hf = None if args.only_files else hf_dir(args.dir, args.rows, args.shards)
    # 1000: the record batch size of the files (then a batch is a zero-copy slice)
    sizes = [1000, 1024, 8192, 65536]
    t = args.seconds

    # 1. IPC files, batches: every case in a fresh forked process, the cases interleaved (their
    # order rotated each round), --runs rounds; a figure is the median of its runs.
    order = list(FILE_CASES)
    runs: dict[str, list[dict]] = {c: [] for c in order}
    for r in range(args.runs):
        for case in order[r % len(order) :] + order[: r % len(order)]:
            spec = {"kind": case, "files": files, "sizes": sizes, "seconds": t}
            runs[case].append(benchlib.run_forked(files_child, spec, PRELOAD))
    res["files"] = {c: _median_of(v) for c, v in runs.items()}
    _print_files(runs)

    if args.only_files:
        res["load1_end"] = load1()
        print(json.dumps(res, indent=1, default=float))
        write_json(res, args.json)
        return 0

    # 2. HF directory, batches and rows
    def ss_hf(bs):
        mk = lambda: ParquetStream(hf, batch_size=bs, output="arrow", shuffle_buffer=0)  # noqa: E731
        return _rate(timed_passes(mk, t))

    hf_ds = datasets.load_from_disk(hf)

    def hf_arrow(bs):
        return _rate(timed_passes(lambda: hf_ds.with_format("arrow").iter(batch_size=bs), t))

    lim = args.row_limit

    def ss_rows():
        def one():
            it = iter(ParquetStream(hf, output="python", columns=["id", "tokens"]))
            for _ in range(lim):
                yield next(it)

        return _rate(timed_passes(one, t, count=lambda _: 1))

    def hf_rows():
        def one():
            it = iter(hf_ds.to_iterable_dataset())
            for _ in range(lim):
                yield next(it)

        return _rate(timed_passes(one, t, count=lambda _: 1))

    res["hf"] = {
        "shardstream_batches": best(ss_hf, sizes),
        "datasets_arrow_iter": best(hf_arrow, sizes),
        "shardstream_rows": ss_rows(),
        "datasets_iterable_rows": hf_rows(),
    }

    # 3. resume at 1% / 50% / 99%
    def make():
        return ParquetStream(hf, batch_size=1024, output="arrow", shuffle_buffer=0)

    resume = {}
    n_batches = -(-args.rows // 1024)
    for pct in (1, 50, 99):
        k = n_batches * pct // 100
        ds = make()
        ds.skip(k)
        state = ds.state_dict()
        times = [time_resume(make, state) for _ in range(3)]
        first_ids = times[-1][2].column("id")[0].as_py()
        assert first_ids == k * 1024, (first_ids, k)
        resume[f"{pct}%"] = {
            "construct_ms": min(x[0] for x in times) * 1e3,
            "load_to_first_batch_ms": min(x[1] for x in times) * 1e3,
            "load1": load1(),
        }
        # datasets: state of an IterableDataset at the same row, loaded into a fresh one
        ids = hf_ds.to_iterable_dataset(num_shards=args.shards)
        per_shard = args.rows // args.shards
        row = k * 1024
        st = ids.state_dict()
        # (datasets 5.x: a RebatchedArrowExamplesIterable over an ArrowExamplesIterable)
        at = {"shard_idx": row // per_shard, "shard_example_idx": row % per_shard}
        outer = st["examples_iterable"]
        for key in ("examples_iterable", "previous_state"):
            outer[key] = {"type": "ArrowExamplesIterable", **at}
        outer.update(batch_idx=0, num_chunks_since_previous_state=0, cropped_chunk_length=0)
        t0 = time.perf_counter()
        fresh = hf_ds.to_iterable_dataset(num_shards=args.shards)
        fresh.load_state_dict(st)
        first = next(iter(fresh))
        resume[f"{pct}%"]["datasets_load_to_first_row_ms"] = (time.perf_counter() - t0) * 1e3
        resume[f"{pct}%"]["datasets_first_id"] = first["id"]
    res["resume"] = resume

    # 4. open time, 1,000 stream files
    many = many_streams(args.dir, args.many)
    side = os.path.join(many, "_shardstream_index.json")
    if os.path.exists(side):
        os.remove(side)

    def open_first():
        t0 = time.perf_counter()
        ds = ParquetStream(many, columns=["id"], batch_size=32, output="numpy", shuffle_buffer=0)
        next(iter(ds))
        return time.perf_counter() - t0

    no_side = min(open_first() for _ in range(3))
    from shardstream.cli import main as cli

    cli(["index", many])
    with_side = min(open_first() for _ in range(3))
    res["open_1000_streams"] = {
        "no_sidecar_ms": no_side * 1e3,
        "sidecar_ms": with_side * 1e3,
        "load1": load1(),
    }
    res["load1_end"] = load1()
    print(json.dumps(res, indent=1, default=float))
    write_json(res, args.json)
    return 0


if __name__ == "__main__":
    sys.exit(main())
