"""Mixture benchmarks (issue #16), side by side in one run.

(a) The mixer's overhead: a ``Mixture`` of K sources (weights proportional to their sizes,
    every source read once: ``on_exhausted="drop"``) against one ``ParquetStream`` over the
    same shards, same batch size and output, K = 3 and 8, mixed and by-source batches,
    ``readahead_threads=0`` and default, and sources shuffling with 1,000-row buffers against
    one stream shuffling with 1,000 and with K x 1,000 (as many buffered rows as the mixture).
    Reported apart: the per-row cost (CPU and wall time per row after the first batch) and the
    fixed cost (open + first batch). Target: < 5% more per row. The consumer counts rows, or
    with ``--consume copy`` copies every batch's tokens out (arrow rows only), as a job does.
(b) Resume time vs position: ``load_state_dict`` + first batch at 1% / 50% / 99% of the
    mixture (flat: nothing before the position is read).
(c) State size vs number of sources (pickled ``state_dict()``, no shuffle buffer).
(d) HF ``datasets.interleave_datasets`` (streaming, same shards and probabilities), if it runs:
    rows/s, and whether its resume is exact: rows lost / duplicated after
    ``state_dict()``/``load_state_dict()`` mid-stream, with and without a shuffle buffer.

(e) ``--callgrind`` (instead of (a)-(d): minutes): instructions per row after the first batch
    under valgrind's callgrind, K sources vs one stream, arrow ``mixed`` (``--cg-output``,
    ``--cg-combine``), threads=0, with and without ``shuffle_buffer=1000``: the overhead as a
    count the machine's load does not move.

Every figure is the median (min–max) of ``--runs`` fresh processes (forked from a server that
imported the libraries once; ``benchlib.run_forked``), run interleaved, with the 1-minute load
beside it. ``python benches/mix.py [--rows N] [--runs R] [--tokens-len LO,HI] [--quick]
[--json out.json]``.
"""

from __future__ import annotations

import argparse
import os
import pickle
import sys
import tempfile
import time
from collections import Counter
from typing import Any

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))

import benchlib  # noqa: E402

PRELOAD = ["pyarrow", "pyarrow.parquet", "numpy", "torch", "shardstream", "datasets"]


# ------------------------------------------------------------------ data


TOKENS_LEN = (16, 128)


def make_data(root: str, rows: int, k: int, tokens_len: tuple[int, int] = TOKENS_LEN) -> list[str]:
    """K source directories with uneven sizes (1..K parts of ``rows``), [id, tokens] with
    ``tokens_len`` items per row (``datagen``'s half-open range)."""
    from shardstream import datagen

    parts = [i + 1 for i in range(k)]
    dirs = []
    start = 0
    for i, p in enumerate(parts):
        n = rows * p // sum(parts)
        lo, hi = tokens_len
        sized = f"rows{rows}-k{k}" + ("" if tokens_len == TOKENS_LEN else f"-t{lo}-{hi}")
        d = os.path.join(root, sized, f"src{i}")  # never reuse other sizes
        if not os.path.isdir(d):
            datagen.write_shards(
                d,
                num_shards=2,
                rows_per_shard=n // 2,
                row_group_size=8192,
                tokens_len=tokens_len,
                start_id=start,
                seed=i,
            )
        start += n
        dirs.append(d)
    return dirs


def shards(dirs: list[str]) -> list[str]:
    return sorted(os.path.join(d, f) for d in dirs for f in os.listdir(d) if f.endswith(".parquet"))


def mixture(dirs: list[str], spec: dict[str, Any]) -> Any:
    import pyarrow.parquet as pq
    from shardstream import Mixture, ParquetStream

    names = [f"s{i}" for i in range(len(dirs))]
    sizes = {
        n: sum(pq.ParquetFile(p).metadata.num_rows for p in shards([d]))
        for n, d in zip(names, dirs, strict=True)
    }
    src = {
        n: ParquetStream(
            d,
            columns=["id", "tokens"],
            shuffle_buffer=spec.get("shuffle", 0),
            seed=i,
            readahead_threads=spec.get("threads"),
            read_batch_rows=spec.get("read_batch_rows"),
        )
        for i, (n, d) in enumerate(zip(names, dirs, strict=True))
    }
    return Mixture(
        src,
        weights=sizes,
        on_exhausted="drop",
        batch_size=spec["batch"],
        output=spec["output"],
        combine=spec.get("combine", "mixed"),
    )


def single(dirs: list[str], spec: dict[str, Any]) -> Any:
    from shardstream import ParquetStream

    return ParquetStream(
        shards(dirs),
        columns=["id", "tokens"],
        batch_size=spec["batch"],
        shuffle_buffer=spec.get("shuffle", 0),
        output=spec["output"],
        readahead_threads=spec.get("threads"),
        read_batch_rows=spec.get("read_batch_rows"),
    )


def _count(item: Any) -> int:
    import pyarrow as pa

    if isinstance(item, pa.RecordBatch):
        return item.num_rows
    if "id" in item:
        return len(item["id"])
    return sum(len(v["id"]) for v in item.values())  # by_source


class _Copy:
    """``--consume copy``: the consumer copies every batch's ``tokens`` values into one buffer
    it reuses (as a copy into pinned memory or a device's staging buffer does), so the one
    stream's zero-copy batches are read as a job reads them, not only counted. Arrow output
    (``mixed`` batches and ``by_source``'s per-source batches). ``values``: the values copied,
    the same for the mixture and the one stream over the same rows (checked)."""

    def __init__(self) -> None:
        import numpy as np

        self.np = np
        self.buf = np.empty(1 << 20, dtype=np.int32)
        self.values = 0

    def _copy(self, batch: Any) -> int:
        flat = batch.column("tokens").flatten()  # this batch's values (`.values` ignores a slice)
        n = flat.offset + len(flat)
        a = self.np.frombuffer(flat.buffers()[1], dtype=self.np.int32, count=n)
        if len(flat) > len(self.buf):
            self.buf = self.np.empty(len(flat), dtype=self.np.int32)
        self.np.copyto(self.buf[: len(flat)], a[flat.offset :])
        self.values += len(flat)
        return batch.num_rows

    def __call__(self, item: Any) -> int:
        if isinstance(item, dict):  # by_source
            return sum(self._copy(b) for b in item.values())
        return self._copy(item)


# ------------------------------------------------------------------ children


def two_passes(make: Any, count: Any) -> dict[str, Any]:
    """Two passes in this process, each over a new object from ``make``: the first timed in two
    parts, the fixed cost (open + first item) and the rest (``first_row_*``: per row); the
    second pass per row after its first item (``row_*``), which is what a job reading epoch
    after epoch sees. A fresh process's first pass also pays the allocator's warm-up, more for
    one stream's 4 MiB batches than for a mixture's smaller ones (one stream's first pass: up
    to ~5% more CPU per row than its second, a mixture's about the same), so a first pass's
    ratio can understate a job's later epochs (docs/benchmarks.md, "Mixtures")."""
    c0, t0 = time.process_time(), time.perf_counter()
    it = iter(make())
    first = count(next(it))
    c1, t1 = time.process_time(), time.perf_counter()
    rest = sum(count(x) for x in it)
    c2, t2 = time.process_time(), time.perf_counter()
    it = iter(make())
    first2 = count(next(it))
    c3, t3 = time.process_time(), time.perf_counter()
    rest2 = sum(count(x) for x in it)
    c4, t4 = time.process_time(), time.perf_counter()
    assert first + rest == first2 + rest2, (first + rest, first2 + rest2)
    return {
        "rows": first + rest,
        "rate": (first + rest) / (t2 - t0),
        "cpu_rate": (first + rest) / (c2 - c0),
        "fixed_ms": (t1 - t0) * 1e3,
        "fixed_cpu_ms": (c1 - c0) * 1e3,
        "first_row_ns": (t2 - t1) / rest * 1e9,
        "first_row_cpu_ns": (c2 - c1) / rest * 1e9,
        "row_ns": (t4 - t3) / rest2 * 1e9,
        "row_cpu_ns": (c4 - c3) / rest2 * 1e9,
    }


def child(spec: dict[str, Any]) -> dict[str, Any]:
    kind = spec["kind"]
    dirs = spec["dirs"]
    if kind in ("mix", "single"):
        make = mixture if kind == "mix" else single
        if spec.get("consume") != "copy":
            return two_passes(lambda: make(dirs, spec), _count)
        copy = _Copy()
        return dict(two_passes(lambda: make(dirs, spec), copy), values=copy.values)
    if kind == "resume":
        from shardstream.cli.bench import time_resume

        ds = mixture(dirs, spec)
        it = iter(ds)
        for _ in range(spec["at"]):
            next(it)
        state = ds.state_dict()
        _, seconds, first = time_resume(lambda: mixture(dirs, spec), state)
        return {"ms": seconds * 1e3}
    if kind == "size":
        ds = mixture(dirs, spec)
        it = iter(ds)
        for _ in range(spec["at"]):
            next(it)
        return {"bytes": len(pickle.dumps(ds.state_dict()))}
    if kind in ("hf", "hf-resume"):
        return hf(spec)
    raise ValueError(kind)


def hf_stream(dirs: list[str], spec: dict[str, Any]) -> Any:
    import datasets
    import pyarrow.parquet as pq

    datasets.disable_progress_bars()
    parts = []
    sizes = []
    for d in dirs:
        files = shards([d])
        sizes.append(sum(pq.ParquetFile(p).metadata.num_rows for p in files))
        ds = datasets.load_dataset("parquet", data_files=files, split="train", streaming=True)
        parts.append(ds.select_columns(["id", "tokens"]))
    mixed = datasets.interleave_datasets(
        parts,
        probabilities=[s / sum(sizes) for s in sizes],
        seed=0,
        stopping_strategy="all_exhausted",
    )
    if spec.get("shuffle"):
        mixed = mixed.shuffle(seed=0, buffer_size=spec["shuffle"])
    return mixed


def hf(spec: dict[str, Any]) -> dict[str, Any]:
    dirs = spec["dirs"]
    if spec["kind"] == "hf":
        t0, c0 = time.perf_counter(), time.process_time()
        stream = hf_stream(dirs, spec).with_format("arrow")  # pyarrow tables, as output="arrow"
        n = sum(len(b["id"]) for b in stream.iter(batch_size=spec["batch"]))
        wall, cpu = time.perf_counter() - t0, time.process_time() - c0
        return {"rate": n / wall, "cpu_rate": n / cpu, "rows": n}
    # Resume: take `at` rows, save, read the rest; a fresh stream loads the state and reads
    # to its end. Lost = rest - resumed, duplicated = resumed - rest (as multisets of ids).
    ds = hf_stream(dirs, spec)
    it = iter(ds)
    for _ in range(spec["at"]):
        next(it)
    state = ds.state_dict()
    rest = Counter(x["id"] for x in it)
    ds2 = hf_stream(dirs, spec)
    ds2.load_state_dict(state)
    resumed = Counter(x["id"] for x in ds2)
    return {
        "lost": sum((rest - resumed).values()),
        "duplicated": sum((resumed - rest).values()),
        "rest": sum(rest.values()),
    }


def mix_exact(dirs: list[str], spec: dict[str, Any]) -> dict[str, Any]:
    """The same resume check on a Mixture (rows)."""
    ds = mixture(dirs, {**spec, "batch": None, "output": "python"})
    it = iter(ds)
    for _ in range(spec["at"]):
        next(it)
    state = ds.state_dict()
    rest = Counter(x["id"] for x in it)
    ds2 = mixture(dirs, {**spec, "batch": None, "output": "python"})
    ds2.load_state_dict(state)
    resumed = Counter(x["id"] for x in ds2)
    return {
        "lost": sum((rest - resumed).values()),
        "duplicated": sum((resumed - rest).values()),
        "rest": sum(rest.values()),
    }


# ------------------------------------------------------------------ callgrind


def cg_child(spec: dict[str, Any]) -> None:
    """``--cg-spec`` (under callgrind, instrumentation off): open the stream and take its first
    batch, then the rest of the pass while the parent has the instrumentation on."""
    make = mixture if spec["kind"] == "mix" else single
    it = iter(make(spec["dirs"], spec))
    first = _count(next(it))
    print(f"first {first}", flush=True)
    sys.stdin.readline()
    rest = sum(_count(x) for x in it)
    print(f"done {rest}", flush=True)
    sys.stdin.readline()


def callgrind_per_row(spec: dict[str, Any], keep: str | None = None) -> float:
    """Instructions per row (all threads) after the first batch of one pass, in a fresh
    interpreter under callgrind: instrumented from the first batch's return to the pass's
    end (``callgrind_control``), so per row = those instructions / the rows after the first
    batch (what "whole pass minus a run stopped after the first batch" measures, in one run).
    ``keep``: also copy callgrind's output there (for ``callgrind_annotate --inclusive=yes``)."""
    import json

    argv = [os.path.abspath(__file__), "--cg-spec", json.dumps(spec)]
    name = (
        f"{spec['kind']}-k{len(spec['dirs'])}-shuffle{spec['shuffle']}-{spec['output']}"
        f"-{spec.get('combine', 'single')}.cg.out"
    )
    ir, lines = benchlib.callgrind_window(
        argv, ("first", "done"), 1800, keep and os.path.join(keep, name)
    )
    return ir / int(lines[1][1])


def section_callgrind(root: str, args: Any, ks: list[int]) -> list[dict[str, Any]]:
    """(e) Instructions per row after the first batch: K sources vs one stream, output
    ``--cg-output`` (arrow), combine ``--cg-combine`` (mixed), ``readahead_threads=0``, with
    and without a shuffle buffer per source (the same for the one stream). Independent of the
    machine's load."""
    table, out = [], []
    output, combine = args.cg_output, args.cg_combine
    for k in ks:
        dirs = make_data(root, args.rows, k, args.tokens_len)
        for shuffle in (int(x) for x in args.cg_shuffle.split(",")):
            base = dict(
                dirs=dirs,
                batch=args.batch,
                output=output,
                shuffle=shuffle,
                threads=0,
                read_batch_rows=args.cg_read_batch_rows,
            )
            one = callgrind_per_row(dict(base, kind="single"), args.cg_out)
            mixed = callgrind_per_row(dict(base, kind="mix", combine=combine), args.cg_out)
            print(f"  callgrind K={k} shuffle {shuffle}: {one:,.0f} / {mixed:,.0f}", flush=True)
            table.append(
                [
                    f"K={k} {output} {combine} threads=0"
                    + (f" shuffle {shuffle}" if shuffle else ""),
                    f"{mixed:,.0f}",
                    f"{one:,.0f}",
                    f"{mixed / one:.3f}",
                ]
            )
            out.append(
                {"k": k, "shuffle": shuffle, "output": output, "combine": combine}
                | {"single": one, "mix": mixed}
            )
    benchlib.print_table(
        table,
        ("workload", "Mixture instructions/row", "one ParquetStream instructions/row", "ratio"),
        f"(e) callgrind: instructions per row after the first batch, all threads (load "
        f"{benchlib.load1():.1f}: counts do not depend on it)",
    )
    return out


# ------------------------------------------------------------------ parent


def runs_of(specs: list[dict[str, Any]], runs: int) -> list[list[dict[str, Any]]]:
    """Every spec ``runs`` times, interleaved (``benchlib.runs_interleaved``)."""
    return benchlib.runs_interleaved(child, specs, runs, PRELOAD)


def main() -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--rows", type=int, default=400_000, help="rows over all sources")
    p.add_argument("--runs", type=int, default=3)
    p.add_argument("--batch", type=int, default=1024)
    p.add_argument("--data", default=None, help="directory for the data (default: a temp dir)")
    p.add_argument("--quick", action="store_true", help="40k rows, 1 run, K=3 only")
    p.add_argument("--no-hf", action="store_true")
    p.add_argument("--json", default=None)
    p.add_argument(
        "--tokens-len",
        type=lambda v: tuple(int(x) for x in v.split(",")),
        default=TOKENS_LEN,
        help="items per row, LO,HI (half-open; default %(default)s: short rows, where the "
        "mixer's per-row cost weighs most; 64,512 is make bench's tokens workload)",
    )
    p.add_argument(
        "--consume",
        choices=("count", "copy"),
        default="count",
        help="what (a)'s consumer does with a batch: count its rows (default), or copy its tokens "
        "into a buffer it reuses, as a job's copy to pinned/device memory reads them (arrow "
        "output only: the torch rows are left out)",
    )
    p.add_argument(
        "--callgrind", action="store_true", help="only (e): instructions per row under callgrind"
    )
    p.add_argument("--cg-out", default=None, help="with --callgrind: keep callgrind's outputs here")
    p.add_argument("--cg-shuffle", default="0,1000", help="with --callgrind: shuffle buffers")
    p.add_argument("--cg-output", default="arrow", help="with --callgrind: arrow, torch, numpy")
    p.add_argument("--cg-combine", default="mixed", help="with --callgrind: mixed or by_source")
    p.add_argument(
        "--cg-read-batch-rows",
        type=int,
        default=None,
        help="with --callgrind: read_batch_rows of every source and the one stream (default: "
        "automatic)",
    )
    p.add_argument("--cg-spec", default=None, help=argparse.SUPPRESS)
    args = p.parse_args()
    if args.cg_spec:
        import json

        cg_child(json.loads(args.cg_spec))
        return 0
    if args.quick:
        args.rows, args.runs = 40_000, 1
    root = args.data or tempfile.mkdtemp(prefix="shardstream-mix-bench-")
    ks = [3] if args.quick else [3, 8]
    results: dict[str, Any] = {
        "rows": args.rows,
        "batch": args.batch,
        "tokens_len": list(args.tokens_len),
        "consume": args.consume,
        "load_start": benchlib.load1(),
    }
    print(
        f"# mixture benchmarks: {args.rows:,} rows of {args.tokens_len[0]}..{args.tokens_len[1]} "
        f"tokens, batch {args.batch}, {args.runs} run(s) each, consumer: {args.consume}, "
        f"1-min load at start {results['load_start']:.1f} (cpus {os.cpu_count()})"
    )

    if args.callgrind:
        results["callgrind"] = section_callgrind(root, args, ks)
        benchlib.write_json(results, args.json)
        return 0

    # (a) overhead: per row (after the first item) and fixed (open + first item), CPU and wall
    table = []
    for k in ks:
        dirs = make_data(root, args.rows, k, args.tokens_len)
        # The last row: every source shuffles with its own 1,000-row buffer, so the mixture
        # holds K times the buffered rows of one stream with shuffle_buffer=1000; beside it,
        # one stream holding as many (K * 1,000) as the baseline.
        for output, combine, shuffle, threads, one_shuffle in (
            ("arrow", "mixed", 0, 0, 0),
            ("arrow", "mixed", 0, None, 0),
            ("arrow", "by_source", 0, None, 0),
            ("torch", "mixed", 0, 0, 0),
            ("torch", "mixed", 0, None, 0),
            ("torch", "by_source", 0, None, 0),
            ("arrow", "mixed", 1000, None, 1000),
            ("arrow", "mixed", 1000, None, 1000 * k),
        ):
            if args.consume == "copy" and output != "arrow":
                continue
            base = dict(dirs=dirs, batch=args.batch, output=output, shuffle=shuffle)
            base["threads"] = threads
            base["consume"] = args.consume
            specs = [
                dict(base, kind="single", shuffle=one_shuffle),
                dict(base, kind="mix", combine=combine),
            ]
            one, mixed = runs_of(specs, args.runs)
            assert {r["rows"] for r in one} == {r["rows"] for r in mixed}, (one, mixed)
            assert {r.get("values") for r in one} == {r.get("values") for r in mixed}, "copied"

            def ratio(key: str, one: list = one, mixed: list = mixed) -> str:
                r = [m[key] / o[key] for m, o in zip(mixed, one, strict=True)]
                return benchlib.with_spread(r, lambda x: f"{x:.3f}")

            def ns(runs: list, key: str) -> str:
                return benchlib.with_spread([r[key] for r in runs], lambda x: f"{x:.0f}")

            table.append(
                [
                    f"K={k} {output} {combine}"
                    + (f" shuffle {shuffle}" if shuffle else "")
                    + (f" (one stream: {one_shuffle})" if one_shuffle != shuffle else "")
                    + (" threads=0" if threads == 0 else ""),
                    ns(mixed, "row_cpu_ns"),
                    ns(one, "row_cpu_ns"),
                    ratio("row_cpu_ns"),
                    ratio("row_ns"),
                    ratio("first_row_cpu_ns"),
                    ns(mixed, "fixed_cpu_ms") + " / " + ns(one, "fixed_cpu_ms"),
                    benchlib.load_range(mixed + one),
                ]
            )
            results.setdefault("overhead", []).append(
                {
                    "k": k,
                    "output": output,
                    "combine": combine,
                    "shuffle": shuffle,
                    "one_stream_shuffle": one_shuffle,
                    "threads": threads,
                    "mix": mixed,
                    "single": one,
                }
            )
    benchlib.print_table(
        table,
        (
            "workload",
            "Mixture CPU ns/row",
            "one ParquetStream CPU ns/row (same run)",
            "ratio per row (CPU)",
            "ratio per row (wall)",
            "first pass: ratio per row (CPU)",
            "fixed: open + first batch, CPU ms (Mixture / one)",
            "load",
        ),
        "(a) mixer overhead: a Mixture of K sources vs one stream over the same shards; per row "
        "= the second pass in the process, after its first batch (the first pass's ratio "
        "beside it); fixed = the first pass's",
    )

    # (b) resume time vs position
    dirs = make_data(root, args.rows, 3, args.tokens_len)
    n_batches = args.rows // args.batch
    table = []
    for frac in (0.01, 0.5, 0.99):
        at = max(1, int(n_batches * frac))
        spec = dict(kind="resume", dirs=dirs, batch=args.batch, output="arrow", at=at)
        (r,) = runs_of([spec], args.runs)
        table.append(
            [
                f"{frac:.0%} ({at} batches)",
                benchlib.with_spread([x["ms"] for x in r], lambda v: f"{v:.1f}"),
                benchlib.load_range(r),
            ]
        )
        results.setdefault("resume", []).append({"at": at, "runs": r})
    benchlib.print_table(
        table,
        ("position", "load_state_dict + first batch (ms)", "load"),
        "(b) resume time vs position (K=3)",
    )

    # (c) state size vs sources
    table = []
    for k in (1, 2, 4, 8, 16):
        d = make_data(root, max(args.rows // 10, 2000 * k), k, args.tokens_len)
        spec = dict(kind="size", dirs=d, batch=16, output="arrow", at=5)
        (r,) = runs_of([spec], 1)
        table.append([str(k), f"{r[0]['bytes']:,}"])
        results.setdefault("size", []).append({"k": k, "bytes": r[0]["bytes"]})
    benchlib.print_table(
        table,
        ("sources", "pickled state_dict() bytes"),
        "(c) state size vs number of sources (no shuffle buffer)",
    )

    # (d) HF interleave_datasets
    if not args.no_hf:
        table = []
        base = dict(dirs=dirs, batch=args.batch, output="arrow")
        try:
            hf_runs, mix_runs = runs_of([dict(base, kind="hf"), dict(base, kind="mix")], args.runs)
        except RuntimeError as e:
            print(f"\n(d) HF interleave_datasets did not run: {e}")
        else:
            ratio = [m["rate"] / h["rate"] for m, h in zip(mix_runs, hf_runs, strict=True)]
            table.append(
                [
                    "rows/s (M)",
                    benchlib.with_spread([r["rate"] for r in mix_runs], benchlib.mrows),
                    benchlib.with_spread([r["rate"] for r in hf_runs], benchlib.mrows),
                    benchlib.with_spread(ratio, lambda x: f"{x:.1f}x"),
                    benchlib.load_range(hf_runs + mix_runs),
                ]
            )
            at = args.rows // 3
            for shuffle in (0, 1000):
                spec = dict(base, kind="hf-resume", at=at, shuffle=shuffle)
                h = benchlib.run_forked(child, spec, PRELOAD)
                m = mix_exact(dirs, dict(spec, shuffle=shuffle))
                table.append(
                    [
                        f"resume at row {at:,}" + (f", shuffle {shuffle}" if shuffle else ""),
                        f"lost {m['lost']}, duplicated {m['duplicated']} of {m['rest']:,}",
                        f"lost {h['lost']}, duplicated {h['duplicated']} of {h['rest']:,}",
                        "",
                        f"{h['load']:.1f}",
                    ]
                )
                results.setdefault("hf_resume", []).append({"shuffle": shuffle, "hf": h, "mix": m})
            results["hf"] = {"hf": hf_runs, "mix": mix_runs}
            benchlib.print_table(
                table,
                ("", "Mixture", "HF interleave_datasets (streaming)", "ratio", "load"),
                "(d) HF datasets interleave_datasets, same shards and probabilities (K=3)",
            )
    results["load_end"] = benchlib.load1()
    print(f"\n1-min load at end {results['load_end']:.1f}")
    benchlib.write_json(results, args.json)
    return 0


if __name__ == "__main__":
    sys.exit(main())
