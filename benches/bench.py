#!/usr/bin/env python3
"""shardstream benchmarks (``make bench``; ``python benches/bench.py --help``; ``--quick``).

Measured on a generated shard set (cached under ./bench-data, reused between runs): id int64,
tokens list<int32> with 64..512 items, text (short strings), score float64, zstd, page index.
Every measurement runs in a fresh child process (forked from a server process that has
imported pyarrow, torch and shardstream and run nothing else; --spawn: a new interpreter
each time, which costs ~1.5 s of imports per run); the runs of one section are interleaved
(A B C A B C ...), --runs times, and each figure is the median with its spread (min–max);
the machine's 1-minute load average at the start of each run is printed beside it.  Rates
are rows per second of wall time and rows per CPU-second (user + system time of every thread
of the measuring process); ratios are shardstream / baseline, both measured in this run.

  iter     (a) batch iteration, rows/s and rows/CPU-s: ParquetStream(batch_size=--batch-size,
           output="arrow", other settings default) vs pyarrow ParquetFile.iter_batches at its
           best of --pa-batch-sizes (each measured; the table says which won, for wall and
           for CPU), same files and columns, for the workloads tokens [id, tokens], flat
           [id, score], strings [id, text]; conditions: both cores free; shardstream with
           readahead_threads=0; one core busy (a spinning process pinned to one core, for
           both sides)
  shuffle  (b) the same with shuffle_buffer=--shuffle-buffer (100,000; tokens; baseline:
           pyarrow sequential), and its peak RSS against the buffer's rows' Arrow bytes
  resume   (c) fresh process: ParquetStream + load_state_dict -> first batch at 1%/50%/99%,
           shuffle buffers --buffers; the 99%/1% ratio per run; baseline (no buffer): pyarrow
           reading and dropping rows, and jumping to the row group by footer row counts
  state    (d) state_dict() latency p50/p90/p99/max, called after every batch while
           iterating (--state-calls calls), shuffle buffers --buffers, and the calling
           thread's CPU time per call p50/p99 (wall time also counts preemption); pickled size
  rss      (e) RSS after imports (bare interpreter, pyarrow, shardstream with numpy output,
           with torch), peak RSS of every (a)/(b) run over its imports, and RSS per 1,000
           shards (benches/startup.py's shard sets: open + first batch vs pyarrow.dataset)
  rows     (f) row mode: ParquetStream(batch_size=None, output="python") vs HuggingFace
           datasets streaming Parquet, first --row-limit rows, [id, tokens] and [id, label]
  resume-hf  (g) row mode, fresh process: load -> first row at 1%/50%/99%: shardstream
           load_state_dict vs datasets load_state_dict and .skip(n) (capped at --hf-cap s)
  loader   (h) DataLoader / StatefulDataLoader, 2 workers, batch 1024, torch output, tokens
           as a list of tensors, vs a plain pyarrow IterableDataset
  ceiling  (i) StatefulDataLoader, 2 workers: ParquetStream(output="torch") for each
           list_format (split, offsets, padded, nested) and batch size
           (--ceiling-batch-sizes) vs the loader's ceiling: a dataset that only yields fresh
           copies of pre-built batches of the same shapes through the same loader (plain
           dicts of plain tensors; --ceiling-same-types: ParquetStream's own types)

(f) and (g) run once each (a datasets run takes seconds to tens of seconds).  Loader
figures (h, i) are steady state: timed from the --warmup-th batch to the last, CPU of
the main process and of both workers.  The HuggingFace rows need `pip install
'datasets>=2.18'` (`make bench` installs the `bench` extra); without it they print
"skipped: datasets not installed".
"""

from __future__ import annotations

import argparse
import json
import os
import pickle
import platform
import subprocess
import sys
import tempfile
import time
from typing import Any

HERE = os.path.dirname(os.path.abspath(__file__))
ROOT = os.path.dirname(HERE)
sys.path.insert(0, HERE)

import benchlib  # noqa: E402
from benchlib import krows, load_range, mrows, print_table, summary, with_spread  # noqa: E402

ALL = ("iter", "shuffle", "resume", "state", "rss", "rows", "resume-hf", "loader", "ceiling")
COLUMNS = ["id", "tokens"]
WORKLOADS = {"tokens": ["id", "tokens"], "flat": ["id", "score"], "strings": ["id", "text"]}
WORKLOAD_LABEL = {
    "tokens": "[id, tokens] list<int32> 64–512",
    "flat": "[id, score] int64, float64",
    "strings": "[id, text] short strings",
}
CONDITIONS = ("free", "ra0", "busy")
CONDITION_LABEL = {
    "free": "2 cores free",
    "ra0": "readahead_threads=0",
    "busy": "one core busy",
}
BATCH = 1024
TOKENS_LEN = (64, 513)  # half-open: 64..512 tokens per row
FRACS = [0.01, 0.5, 0.99]

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


def shard_files(data: str) -> list[str]:
    return sorted(os.path.join(data, n) for n in os.listdir(data) if n.endswith(".parquet"))


def _stream(data: str, columns: list[str], **kw: Any) -> Any:
    from shardstream import ParquetStream

    kw.setdefault("batch_size", BATCH)
    kw.setdefault("output", "arrow")
    if kw.get("readahead_threads", 0) is None:
        del kw["readahead_threads"]
    return ParquetStream(data, columns=columns, **kw)


def _pass(spec: dict) -> dict[str, Any]:
    """(a)/(b): whole passes over the data until --min-time, wall and CPU time."""
    from shardstream.cli.bench import pa_batches, timed_passes

    data, cols, bs = spec["data"], spec["columns"], spec["batch_size"]
    if spec["src"] == "ss":
        ds = _stream(
            data,
            cols,
            batch_size=bs,
            shuffle_buffer=spec.get("shuffle_buffer", 0),
            readahead_threads=spec.get("readahead_threads"),
        )
        r = timed_passes(lambda: ds, spec["min_seconds"])
    else:
        files = shard_files(data)
        r = timed_passes(lambda: pa_batches(files, cols, bs), spec["min_seconds"])
    r["rows_per_pass"] = r["rows"] // r["passes"]
    return r


def save_states(data: str, shuffle_buffer: int, fracs: list[float], out: str) -> dict:
    """Iterate once; save state_dict() right after the first batch ending at/after each
    fraction of the rows.  Returns {frac: (rows_before, first_id_of_next_batch)}."""
    ds = _stream(data, COLUMNS, shuffle_buffer=shuffle_buffer)
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
    from shardstream.cli.bench import time_resume

    with open(states_file, "rb") as f:
        st = pickle.load(f)[key]
    ctor, resume, b = time_resume(
        lambda: _stream(data, COLUMNS, shuffle_buffer=shuffle_buffer), st["state"]
    )
    return {
        "ctor_ms": ctor * 1e3,
        "resume_ms": resume * 1e3,
        "first_id": int(b.column(0)[0].as_py()),
        "expected_first_id": st.get("next_first_id"),
    }


def _pa_skip(data: str, rows_before: int, seek: bool) -> dict:
    """Baselines: reach row `rows_before` and produce the next batch with pyarrow (read and
    drop, or jump to the row group by the footers' row counts)."""
    from shardstream.cli.bench import pa_skip_to

    return pa_skip_to(shard_files(data), rows_before, seek, COLUMNS, BATCH)


def _ss_state_latency(data: str, shuffle_buffer: int, calls: int) -> dict:
    """(d): state_dict() after every batch, once the shuffle buffer is full (endless epochs,
    so the calls do not run out)."""
    from shardstream.cli.bench import percentile, state_dict_latencies

    ds = _stream(data, COLUMNS, shuffle_buffer=shuffle_buffer, epochs=None)
    cpu: list[float] = []
    lat, state = state_dict_latencies(ds, calls, after_rows=shuffle_buffer, cpu=cpu)
    lat.sort()
    cpu.sort()
    out = {f"p{q}_us": percentile(lat, q) * 1e6 for q in (50, 90, 99)}
    out.update({f"cpu_p{q}_us": percentile(cpu, q) * 1e6 for q in (50, 99)})
    out.update(
        max_us=lat[-1] * 1e6,
        calls=len(lat),
        pickled_bytes=len(pickle.dumps(state, protocol=pickle.HIGHEST_PROTOCOL)),
    )
    return out


def _imports(mode: str, data: str) -> dict:
    """(e): RSS of a fresh interpreter after importing what `mode` needs (and, for
    shardstream, opening the data and reading one batch)."""
    t = time.perf_counter()
    first = None
    if mode == "pyarrow":
        import pyarrow.parquet  # noqa: F401
    elif mode in ("numpy", "torch"):
        if mode == "torch":
            import torch  # noqa: F401
        from shardstream import ParquetStream

        t_first = time.perf_counter()
        ds = ParquetStream(data, columns=COLUMNS, batch_size=BATCH, output=mode)
        next(iter(ds))
        first = (time.perf_counter() - t_first) * 1e3
    m = _mem()
    return {
        "rss_mb": m["rss"],
        "peak_mb": m["peak"],
        "seconds": time.perf_counter() - t,
        "first_batch_ms": first,
        "torch_imported": "torch" in sys.modules,
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
        "parquet", data_files=shard_files(data), split="train", streaming=True, columns=columns
    )


def _rows_loop(it: Any, limit: int, cap: float) -> dict[str, Any]:
    """Consume up to `limit` rows (dicts) of `it`, stopping after `cap` s; ids checksummed.
    Wall and CPU time (every thread of this process) include the first row."""
    t, c = time.perf_counter(), time.process_time()
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
        "cpu_seconds": time.process_time() - c,
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

    counts = [pq.ParquetFile(p).metadata.num_rows for p in shard_files(data)]

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


def _recipe(value: Any, same_types: bool = False) -> Any:
    """How to rebuild a batch value with fresh storage: a tensor is cloned; a list of tensors
    (list_format="split": views of one values tensor) becomes one values tensor split again
    into a plain list (with `same_types`, a `SplitList` again, which crosses the loader as
    values + offsets); a nested (jagged) tensor is rebuilt from cloned values and offsets;
    tuples (offsets, padded) part by part."""
    import torch
    from shardstream.convert import SplitList

    if same_types and isinstance(value, SplitList):
        assert value._compact(), "a batch straight from ParquetStream is compact"
        return ("splitlist", value._values, value._offsets, value._valid)
    if isinstance(value, torch.Tensor) and value.is_nested:
        return ("nested", value.values(), value.offsets())
    if isinstance(value, torch.Tensor):
        return ("tensor", value)
    if isinstance(value, tuple):
        return ("tuple", [_recipe(v, same_types) for v in value])
    if isinstance(value, list) and value and all(isinstance(v, torch.Tensor) for v in value):
        return ("split", torch.cat(value), [len(v) for v in value])
    return ("object", value)


def _fresh(recipe: Any) -> Any:
    import copy

    import torch

    kind = recipe[0]
    if kind == "tensor":
        return recipe[1].clone()
    if kind == "splitlist":
        from shardstream.convert import SplitList

        valid = None if recipe[3] is None else recipe[3].copy()
        return SplitList._from_parts(recipe[1].clone(), recipe[2].copy(), valid)
    if kind == "nested":
        return torch.nested.nested_tensor_from_jagged(recipe[1].clone(), recipe[2].clone())
    if kind == "tuple":
        return tuple(_fresh(r) for r in recipe[1])
    if kind == "split":
        return list(torch.split(recipe[1].clone(), recipe[2]))
    return copy.deepcopy(recipe[1])


def _null_dataset(templates: list[dict], same_types: bool = False) -> Any:
    """The loader's ceiling: yields, forever, fresh copies of pre-built batches (fresh storage
    each time, as a reader's are: a tensor already in shared memory would cross the process
    boundary without a copy). By default plain ones: a `dict` of plain tensors, a split column
    a plain list of per-row tensors, as any dataset would yield them; with `same_types`, of
    the types ParquetStream yields (its batch `dict` type, `SplitList`), so the transfer is the
    same and only producing the batches differs."""
    from torch.utils.data import IterableDataset

    recipes = [(type(t), {k: _recipe(v, same_types) for k, v in t.items()}) for t in templates]

    class NullBatches(IterableDataset):
        def __iter__(self) -> Any:
            while True:
                for t, r in recipes:
                    b = {k: _fresh(v) for k, v in r.items()}
                    yield t(b) if same_types else b

    return NullBatches()


def _proc_cpu(pid: int) -> float | None:
    """User + system CPU seconds of process `pid`, all threads (Linux /proc; else None)."""
    try:
        with open(f"/proc/{pid}/stat") as f:
            rest = f.read().rsplit(")", 1)[1].split()
    except OSError:
        return None
    return (int(rest[11]) + int(rest[12])) / os.sysconf("SC_CLK_TCK")


def _cpu_with_workers(it: Any) -> float | None:
    """CPU seconds of this process and of the loader iterator's worker processes."""
    total = time.process_time()
    for w in getattr(it, "_workers", None) or []:
        c = _proc_cpu(w.pid)
        if c is None:
            return None
        total += c
    return total


def _loader_run(dl: Any, batches: int, warmup: int, check: Any = None) -> dict:
    """Steady state of a loader: from the `warmup`-th batch received to the `batches`-th,
    wall time and CPU time of the main process plus its workers."""
    it = iter(dl)
    rows = n = 0
    t0 = c0 = None
    r0 = 0
    for b in it:
        n += 1
        if check is not None:
            check(b)
        rows += len(b["id"])
        if n == warmup:
            t0, c0, r0 = time.perf_counter(), _cpu_with_workers(it), rows
        if n >= batches:
            break
    if t0 is None:
        raise SystemExit(f"loader yielded {n} batches, fewer than the warm-up ({warmup})")
    seconds = time.perf_counter() - t0
    c1 = _cpu_with_workers(it)
    del it, dl  # shut the workers down before measuring peak RSS
    return {
        "seconds": seconds,
        "cpu_seconds": None if c0 is None or c1 is None else c1 - c0,
        "batches": n - warmup,
        "rows": rows - r0,
    }


def _loader(data: str, src: str, loader: str, workers: int, batches: int, warmup: int) -> dict:
    """(h): a DataLoader / StatefulDataLoader over ParquetStream or a pyarrow dataset."""
    if src == "ss":
        ds = _stream(data, COLUMNS, output="torch")
    else:
        ds = _pa_torch_dataset(shard_files(data))
    if loader == "sdl":
        from torchdata.stateful_dataloader import StatefulDataLoader

        dl = StatefulDataLoader(ds, batch_size=None, num_workers=workers, snapshot_every_n_steps=1)
    else:
        from torch.utils.data import DataLoader

        dl = DataLoader(ds, batch_size=None, num_workers=workers)

    def check(b: Any) -> None:
        assert isinstance(b["tokens"], list)

    return _loader_run(dl, batches, warmup, check)


def _ceiling(
    data: str,
    src: str,
    list_format: str,
    batch_size: int,
    batches: int,
    warmup: int,
    same_types: bool = False,
) -> dict:
    """(i): StatefulDataLoader, 2 workers, over ParquetStream(output="torch", list_format) or
    over the null dataset yielding its first batches again and again."""
    from torchdata.stateful_dataloader import StatefulDataLoader

    def stream(**kw: Any) -> Any:
        return _stream(
            data, COLUMNS, batch_size=batch_size, output="torch", list_format=list_format, **kw
        )

    if src == "ss":
        ds = stream()
    else:  # read here without readahead threads: the loader forks this process
        it = iter(stream(readahead_threads=0))
        ds = _null_dataset([next(it) for _ in range(8)], same_types)
        del it
    dl = StatefulDataLoader(ds, batch_size=None, num_workers=2, snapshot_every_n_steps=1)
    return _loader_run(dl, batches, warmup)


def child_main(spec: dict) -> dict:
    kind = spec["kind"]
    data = spec["data"]
    if kind == "imports":  # measures the imports themselves: nothing imported before
        return _imports(spec["mode"], data)
    # Import both libraries up front in every child so the RSS baselines are comparable.
    import pyarrow.parquet  # noqa: F401
    import shardstream  # noqa: F401  (imports torch when present)

    base = _mem()["rss"]
    if kind == "pass":
        r = _pass(spec)
    elif kind == "ss_states":
        r = save_states(data, spec["shuffle_buffer"], spec["fracs"], spec["out"])
    elif kind == "ss_resume":
        r = _ss_resume(data, spec["shuffle_buffer"], spec["states"], spec["key"])
    elif kind == "pa_skip":
        r = _pa_skip(data, spec["rows_before"], spec["seek"])
    elif kind == "ss_state":
        r = _ss_state_latency(data, spec["shuffle_buffer"], spec["calls"])
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
        r = _loader(
            data, spec["src"], spec["loader"], spec["workers"], spec["batches"], spec["warmup"]
        )
    elif kind == "ceiling":
        r = _ceiling(
            data,
            spec["src"],
            spec["list_format"],
            spec["batch_size"],
            spec["batches"],
            spec["warmup"],
            spec.get("same_types", False),
        )
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


PRELOAD = ["pyarrow.parquet", "shardstream", "shardstream.cli.bench"]
SPAWN = {"always": False}  # --spawn: a new interpreter for every run


def run_child(spec: dict, timeout: float = 1800) -> dict:
    """One measurement in a fresh process: forked from the preloaded server, or a new
    interpreter for --spawn and for (e)'s imports (which measure the imports)."""
    if SPAWN["always"] or spec["kind"] == "imports" or not benchlib.forkserver_available():
        return benchlib.run_child(__file__, spec, timeout)
    return benchlib.run_forked(child_main, spec, PRELOAD, timeout)


def status(msg: str) -> None:
    print(f"# {msg}", file=sys.stderr, flush=True)


def ensure_data(root: str, rows: int, shards: int, page_index: bool = True) -> str:
    """Generate (once) and return the data directory for this size: datagen's shards
    (uneven row groups) with a float64 `score` column added to every row group; without
    `page_index`, pyarrow's default files (no page index) in a directory of their own."""
    import numpy as np
    import pyarrow as pa
    import pyarrow.parquet as pq
    from shardstream.datagen import write_shards

    params = {
        "rows": rows,
        "shards": shards,
        "tokens_len": list(TOKENS_LEN),
        "compression": "zstd",
        "page_index": page_index,
        "score": "float64",
        "v": 2,
    }
    d = os.path.join(root, f"rows{rows}-shards{shards}" + ("" if page_index else "-nopi"))
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
    paths = write_shards(
        d,
        num_shards=shards,
        rows_per_shard=per,
        tokens_len=TOKENS_LEN,
        compression="zstd",
        page_index=page_index,
        seed=0,
    )
    mix = np.uint64(0x9E3779B97F4A7C15)
    for path in paths:  # rewrite each shard row group by row group, with `score` appended
        src = pq.ParquetFile(path)
        schema = src.schema_arrow.append(pa.field("score", pa.float64(), nullable=False))
        tmp = path + ".tmp"
        with pq.ParquetWriter(tmp, schema, compression="zstd", write_page_index=page_index) as w:
            for g in range(src.metadata.num_row_groups):
                t_g = src.read_row_group(g)
                ids = t_g.column("id").to_numpy().astype(np.uint64)
                score = ((ids * mix) >> np.uint64(11)).astype(np.float64) / 2.0**53
                w.write_table(
                    t_g.append_column(schema.field("score"), pa.array(score)),
                    row_group_size=max(t_g.num_rows, 1),
                )
        os.replace(tmp, path)
    with open(marker, "w") as f:
        json.dump(params, f)
    print(f"# generated in {time.perf_counter() - t:.1f}s", flush=True)
    return d


def warm_cache(data: str) -> None:
    for p in shard_files(data):
        with open(p, "rb") as f:
            while f.read(1 << 24):
                pass


def arrow_row_bytes(data: str, columns: list[str]) -> float:
    """Mean Arrow bytes per row of `columns` (what one buffered row holds)."""
    import pyarrow.parquet as pq

    rows = nbytes = 0
    for p in shard_files(data):
        t = pq.read_table(p, columns=columns)
        rows += t.num_rows
        nbytes += t.nbytes
    return nbytes / max(rows, 1)


def in_flight_batches(readahead_threads: int | None, readahead_depth: int) -> int:
    """Decoded batches a stream with these settings can hold in flight (one worker, local
    files): each readahead thread has ``readahead_depth`` queued and one more in hand while it
    waits to queue it, and the consumer holds the input batch its rows are being taken from
    (with ``readahead_threads=0``, that batch only).  Threads not set: ``min(max local, cores)``
    as ``Tuning::threads`` resolves them (cores: this process's CPU affinity)."""
    from shardstream import _core

    if readahead_threads is None:
        try:
            cores = len(os.sched_getaffinity(0))
        except AttributeError:  # pragma: no cover - non-Linux
            cores = os.cpu_count() or 1
        readahead_threads = max(1, min(_core.DEFAULTS["max_local_readahead_threads"], cores))
    return readahead_threads * (readahead_depth + 1) + 1


def auto_batch_rows(row_bytes: float) -> int:
    """Rows per decoded batch with ``read_batch_rows=None`` for rows of ``row_bytes`` Arrow bytes,
    as ``settings::auto_batch_rows`` computes them from the footers' estimate: the default
    bytes per batch over the row's bytes, rounded down to a power of two, within 16 .. the
    automatic maximum (the footers' estimate and the Arrow bytes can differ slightly)."""
    from shardstream import _core

    d = _core.DEFAULTS
    rows = int(d["read_batch_bytes"] // max(row_bytes, 1e-9))
    if rows >= d["max_auto_read_batch_rows"]:
        return int(d["max_auto_read_batch_rows"])
    return max(16, 1 << max(rows, 16).bit_length() - 1)


def fmt_rate(rows: int, s: float) -> str:
    return f"{rows / s / 1e6:.2f} M rows/s ({s:.2f} s)"


def _wall(r: dict) -> float:
    return r["rows"] / r["seconds"]


def _cpu(r: dict) -> float:
    return r["rows"] / r["cpu_seconds"] if r.get("cpu_seconds") else float("nan")


def _med(runs: list[dict], rate: Any) -> float:
    return summary([rate(r) for r in runs])["median"]


def _ratio(a: float, b: float) -> str:
    return f"{a / b:.2f}x" if b == b and a == a and b > 0 else "-"


def _git_commit() -> str:
    try:
        out = subprocess.run(
            ["git", "-C", ROOT, "describe", "--always", "--dirty", "--abbrev=7"],
            capture_output=True,
            text=True,
            timeout=10,
        )
        return out.stdout.strip() or "?"
    except (OSError, subprocess.SubprocessError):
        return "?"


class Bench:
    """One `bench.py` run: the data, the options, the results so far."""

    def __init__(self, args: argparse.Namespace, data: str) -> None:
        self.args = args
        self.data = data
        self.results: dict[str, Any] = {}
        self.base = {"data": data}
        self.passes: dict[tuple[str, str, str], list[dict]] = {}

    # ------------------------------------------------------------------ (a), (b): passes

    def label(self, condition: str) -> str:
        if condition == "shuffle":
            return f"shuffle_buffer={self.args.shuffle_buffer:,}"
        return CONDITION_LABEL[condition]

    def pass_configs(self, which: list[str]) -> list[tuple[str, str, str, dict]]:
        """(workload, condition, variant, child spec) of every run of (a)/(b), in the
        order one round runs them."""
        a = self.args
        out = []
        pa_sizes = a.pa_batch_sizes
        conds = [c for c in a.conditions if c != "busy" or benchlib.busy_core_available()]

        def pa(wl: str, cond: str) -> None:
            for bs in pa_sizes:
                spec = {"kind": "pass", "src": "pa", "columns": WORKLOADS[wl], "batch_size": bs}
                out.append((wl, cond, f"pa{bs}", spec))

        def ss(wl: str, cond: str, variant: str, **kw: Any) -> None:
            spec = {
                "kind": "pass",
                "src": "ss",
                "columns": WORKLOADS[wl],
                "batch_size": a.batch_size,
                **kw,
            }
            out.append((wl, cond, variant, spec))

        workloads = a.workloads if "iter" in which else []
        for wl in workloads:
            for cond in conds:
                if cond in ("free", "busy"):
                    pa(wl, cond)
                if cond == "ra0":
                    ss(wl, "free", "ss_ra0", readahead_threads=0)
                else:
                    ss(wl, cond, "ss")
        if "shuffle" in which:
            if "tokens" not in workloads or "free" not in conds:
                pa("tokens", "free")
            ss("tokens", "free", "ss_shuffle", shuffle_buffer=a.shuffle_buffer)
        for *_, spec in out:
            spec.update(self.base, min_seconds=a.min_time)
        return out

    def run_passes(self, which: list[str]) -> None:
        configs = self.pass_configs(which)
        if not configs:
            return
        n = self.args.runs
        free = [c for c in configs if c[1] != "busy"]
        busy = [c for c in configs if c[1] == "busy"]
        for i in range(n):
            for wl, cond, variant, spec in free:
                status(f"(a/b) run {i + 1}/{n}: {wl}, {CONDITION_LABEL[cond]}, {variant}")
                self.passes.setdefault((wl, cond, variant), []).append(run_child(spec))
            if busy:
                with benchlib.busy_core() as core:
                    for wl, cond, variant, spec in busy:
                        status(f"(a/b) run {i + 1}/{n}: {wl}, core {core} busy, {variant}")
                        r = run_child(spec)
                        self.passes.setdefault((wl, cond, variant), []).append(r)
        for (wl, cond, variant), runs in self.passes.items():
            for r in runs:
                if r["rows_per_pass"] != self.args.rows or r["rows"] % self.args.rows:
                    raise SystemExit(
                        f"{wl} {cond} {variant}: {r['rows']} rows in {r['passes']} passes, "
                        f"expected {self.args.rows:,} per pass"
                    )
        self.results["passes"] = {"/".join(k): v for k, v in self.passes.items()}

    def pa_best(self, wl: str, cond: str, rate: Any) -> tuple[int, list[dict]] | None:
        """pyarrow's best batch size for this workload and condition, by median `rate`."""
        cands = [(bs, self.passes.get((wl, cond, f"pa{bs}"))) for bs in self.args.pa_batch_sizes]
        cands = [(bs, runs) for bs, runs in cands if runs]
        if not cands:
            return None
        return max(cands, key=lambda c: _med(c[1], rate))

    def table_passes(self) -> None:
        if not self.passes:
            return
        a = self.args
        rows = []
        order = [("free", "ss"), ("free", "ss_ra0"), ("busy", "ss"), ("free", "ss_shuffle")]
        for wl in WORKLOADS:
            for cond, variant in order:
                ss = self.passes.get((wl, cond, variant))
                if not ss:
                    continue
                bw, bc = self.pa_best(wl, cond, _wall), self.pa_best(wl, cond, _cpu)
                label = {"ss_ra0": "ra0", "ss_shuffle": "shuffle"}.get(variant, cond)
                pa_w = pa_c = "-"
                rw = rc = "-"
                runs_all = list(ss)
                if bw and bc:
                    pa_w = f"{with_spread([_wall(r) for r in bw[1]], mrows)} @{bw[0]}"
                    pa_c = f"{with_spread([_cpu(r) for r in bc[1]], mrows)} @{bc[0]}"
                    rw = _ratio(_med(ss, _wall), _med(bw[1], _wall))
                    rc = _ratio(_med(ss, _cpu), _med(bc[1], _cpu))
                    runs_all += bw[1] + bc[1]
                rows.append(
                    [
                        WORKLOAD_LABEL[wl],
                        self.label(label),
                        with_spread([_wall(r) for r in ss], mrows),
                        with_spread([_cpu(r) for r in ss], mrows),
                        pa_w,
                        pa_c,
                        rw,
                        rc,
                        load_range(runs_all),
                    ]
                )
        print_table(
            rows,
            [
                "workload",
                "condition",
                "shardstream M rows/s",
                "M rows/CPU-s",
                "pyarrow best M rows/s @batch",
                "M rows/CPU-s @batch",
                "wall ratio",
                "CPU ratio",
                "load",
            ],
            f'(a)/(b) iteration, shardstream batch_size={a.batch_size}, output="arrow", '
            f"defaults, vs pyarrow iter_batches at its best batch size of "
            f"{'/'.join(map(str, a.pa_batch_sizes))} (per metric); median (min–max) of "
            f"{a.runs} fresh processes, each >= {a.min_time:g} s of whole passes",
        )
        rows = []
        for wl in WORKLOADS:
            for cond in ("free", "busy"):
                if not self.pa_best(wl, cond, _wall):
                    continue
                bw, bc = self.pa_best(wl, cond, _wall), self.pa_best(wl, cond, _cpu)
                cells = []
                for bs in a.pa_batch_sizes:
                    runs = self.passes.get((wl, cond, f"pa{bs}"))
                    if not runs:
                        cells.append("-")
                        continue
                    mark = "".join(m for m, b in (("W", bw), ("C", bc)) if b and b[0] == bs)
                    cells.append(
                        f"{mrows(_med(runs, _wall))} / {mrows(_med(runs, _cpu))}"
                        + (f" ({mark})" if mark else "")
                    )
                rows.append([WORKLOAD_LABEL[wl], CONDITION_LABEL[cond], *cells])
        print_table(
            rows,
            [
                "workload",
                "condition",
                *[f"batch {bs}: M rows/s / M rows/CPU-s" for bs in a.pa_batch_sizes],
            ],
            "pyarrow iter_batches by batch size (medians; W = best wall, C = best CPU)",
        )

    # ------------------------------------------------------------------ (c) resume

    def resume(self) -> None:
        a = self.args
        res: dict[str, Any] = {}
        with tempfile.TemporaryDirectory(prefix="ssbench-") as tmp:
            info: dict[int, dict] = {}
            for sb in a.buffers:
                status(f"(c) resume states (shuffle_buffer={sb})")
                sf = os.path.join(tmp, f"states-{sb}.pkl")
                info[sb] = run_child(
                    {
                        **self.base,
                        "kind": "ss_states",
                        "shuffle_buffer": sb,
                        "fracs": FRACS,
                        "out": sf,
                    }
                )
                info[sb]["file"] = sf
            for i in range(a.runs):
                for sb in a.buffers:
                    for f in FRACS:
                        k = repr(f)
                        status(f"(c) run {i + 1}/{a.runs}: resume at {f:.0%}, buffer {sb}")
                        r = run_child(
                            {
                                **self.base,
                                "kind": "ss_resume",
                                "shuffle_buffer": sb,
                                "states": info[sb]["file"],
                                "key": k,
                            }
                        )
                        if r["first_id"] != info[sb][k]["next_first_id"]:
                            raise SystemExit(
                                f"resume at {f}: first id {r['first_id']} != "
                                f"{info[sb][k]['next_first_id']} (shuffle_buffer={sb})"
                            )
                        res.setdefault(f"ss/{sb}/{k}", []).append(r)
                for f in FRACS if 0 in a.buffers else []:  # pyarrow: compared without a buffer
                    k = repr(f)
                    rows_before = info[0][k]["rows_before"]
                    for seek in (False, True):
                        status(f"(c) run {i + 1}/{a.runs}: pyarrow to {f:.0%} (seek={seek})")
                        r = run_child(
                            {
                                **self.base,
                                "kind": "pa_skip",
                                "rows_before": rows_before,
                                "seek": seek,
                            }
                        )
                        if r["first_id"] != rows_before:  # ids are consecutive from 0
                            raise SystemExit(f"pyarrow skip baseline wrong at {f}: {r}")
                        res.setdefault(f"pa/{'seek' if seek else 'drop'}/{k}", []).append(r)
        self.results["resume"] = res

        def ms(x: float) -> str:
            return f"{x:.1f}" if x < 100 else f"{x:.0f}"

        rows = []
        for sb in a.buffers:
            for f in FRACS:
                k = repr(f)
                ss = res[f"ss/{sb}/{k}"]
                pa_cells = ["-", "-"]
                if sb == 0:
                    drop, seek = res[f"pa/drop/{k}"], res[f"pa/seek/{k}"]
                    pa_cells = [with_spread([r["resume_ms"] for r in x], ms) for x in (drop, seek)]
                rows.append(
                    [
                        f"{sb:,}",
                        f"{f:.0%} (row {info[sb][k]['rows_before']:,})",
                        with_spread([r["resume_ms"] for r in ss], ms),
                        with_spread([r["ctor_ms"] for r in ss], ms),
                        *pa_cells,
                        load_range(ss),
                    ]
                )
            lo, hi = res[f"ss/{sb}/{FRACS[0]!r}"], res[f"ss/{sb}/{FRACS[-1]!r}"]
            per_run = [h["resume_ms"] / low["resume_ms"] for low, h in zip(lo, hi, strict=True)]
            pa_flat = "-"
            if sb == 0:
                d_lo = res[f"pa/drop/{FRACS[0]!r}"]
                d_hi = res[f"pa/drop/{FRACS[-1]!r}"]
                pa_flat = "read+drop " + with_spread(
                    [h["resume_ms"] / low["resume_ms"] for low, h in zip(d_lo, d_hi, strict=True)],
                    lambda x: f"{x:.1f}x",
                )
            rows.append(
                [
                    f"{sb:,}",
                    "99% / 1%, per run",
                    with_spread(per_run, lambda x: f"{x:.2f}x"),
                    "",
                    pa_flat,
                    "",
                    load_range(lo + hi),
                ]
            )
        print_table(
            rows,
            [
                "shuffle_buffer",
                "position",
                "load_state_dict -> first batch, ms",
                "constructor, ms",
                "pyarrow read+drop, ms",
                "pyarrow row-group seek, ms",
                "load",
            ],
            f"(c) resume in a fresh process, [id, tokens], batch {BATCH}, arrow; median (min–max) "
            f"of {a.runs} runs; 1.0x = flat (O(1))",
        )

    # ------------------------------------------------------------------ (d) state_dict

    def state(self) -> None:
        a = self.args
        res: dict[int, list[dict]] = {}
        for i in range(a.runs):
            for sb in a.buffers:
                status(f"(d) run {i + 1}/{a.runs}: state_dict() latency, buffer {sb}")
                r = run_child(
                    {**self.base, "kind": "ss_state", "shuffle_buffer": sb, "calls": a.state_calls}
                )
                if not r["p50_us"] <= r["p90_us"] <= r["p99_us"] <= r["max_us"]:
                    raise SystemExit(f"state_dict percentiles out of order: {r}")
                res.setdefault(sb, []).append(r)
        self.results["state"] = {str(k): v for k, v in res.items()}

        def us(x: float) -> str:
            return f"{x:.1f}" if x < 1000 else f"{x:,.0f}"

        rows = []
        for sb, runs in res.items():
            rows.append(
                [
                    f"{sb:,}",
                    f"{summary([r['calls'] for r in runs])['min']:,.0f}",
                    *[
                        with_spread([r[f"{q}_us"] for r in runs], us)
                        for q in ("p50", "p90", "p99", "max", "cpu_p50", "cpu_p99")
                    ],
                    f"{runs[0]['pickled_bytes']:,}",
                    load_range(runs),
                ]
            )
        print_table(
            rows,
            [
                "shuffle_buffer",
                "calls",
                "p50, us",
                "p90, us",
                "p99, us",
                "max, us",
                "CPU p50, us",
                "CPU p99, us",
                "pickled bytes",
                "load",
            ],
            f"(d) state_dict() after every batch while iterating ([id, tokens], batch {BATCH}, "
            f"from a full buffer on); median (min–max) of {a.runs} runs",
        )

    # ------------------------------------------------------------------ (e) memory

    def rss(self) -> None:
        a = self.args
        res: dict[str, list[dict]] = {}
        modes = {
            "bare": "python (bare interpreter)",
            "pyarrow": "import pyarrow.parquet",
            "numpy": 'import shardstream; ParquetStream(output="numpy") + first batch',
            "torch": 'import torch, shardstream; ParquetStream(output="torch") + first batch',
        }
        for i in range(a.runs):
            for mode in modes:
                status(f"(e) run {i + 1}/{a.runs}: RSS after imports, {mode}")
                res.setdefault(mode, []).append(
                    run_child({**self.base, "kind": "imports", "mode": mode})
                )
        self.results["rss_imports"] = res
        bare = _med_key(res["bare"], "rss_mb")
        rows = []
        for mode, label in modes.items():
            runs = res[mode]
            torch_in = {r["torch_imported"] for r in runs}
            rows.append(
                [
                    label,
                    with_spread([r["rss_mb"] for r in runs], lambda x: f"{x:.0f}"),
                    f"{_med_key(runs, 'rss_mb') - bare:+.0f}",
                    with_spread([r["seconds"] for r in runs], lambda x: f"{x:.2f}"),
                    "yes" if torch_in == {True} else "no" if torch_in == {False} else "varies",
                    load_range(runs),
                ]
            )
        print_table(
            rows,
            [
                "process",
                "RSS, MiB",
                "over bare interpreter, MiB",
                "imports + open, s",
                "torch imported",
                "load",
            ],
            f"(e) RSS of a fresh process after imports; median (min–max) of {a.runs} runs",
        )
        self.table_peak_rss()
        self.shards_rss()

    def table_peak_rss(self) -> None:
        rows = []
        for (wl, cond, variant), runs in self.passes.items():
            if not variant.startswith("ss"):
                continue
            pa = self.pa_best(wl, cond, _wall)
            over = [r["rss_peak_mb"] - r["rss_base_mb"] for r in runs]
            cells = ["-", "-"]
            if pa:
                pa_over = [r["rss_peak_mb"] - r["rss_base_mb"] for r in pa[1]]
                cells = [
                    f"{summary(pa_over)['median']:.0f} (@{pa[0]})",
                    _ratio(summary(over)["median"], summary(pa_over)["median"]),
                ]
            note = ""
            if variant == "ss_shuffle":
                # Goal 2's denominator: the buffered rows' bytes + the in-flight read batches'
                # (default settings, as the run used them), both at the data's mean Arrow
                # bytes per row.
                from shardstream import _core

                per_row = arrow_row_bytes(self.data, WORKLOADS[wl])
                rows_held = min(self.args.shuffle_buffer, self.args.rows)
                buf = rows_held * per_row / 2**20
                nb = in_flight_batches(None, _core.DEFAULTS["readahead_depth"])
                brows = auto_batch_rows(per_row)
                flight = nb * brows * per_row / 2**20
                peak = summary(over)["median"]
                note = (
                    f"buffer {buf:.0f} MiB ({rows_held:,} rows) + in flight {flight:.0f} MiB "
                    f"({nb} batches x {brows:,} rows: threads x (depth + 1) + the input "
                    f"batch) = {buf + flight:.0f} MiB: peak over imports = "
                    f"{peak / (buf + flight):.2f}x that (goal <= 1.3x); {peak / buf:.2f}x the "
                    f"buffer alone"
                )
            label = {"ss_ra0": "ra0", "ss_shuffle": "shuffle"}.get(variant, cond)
            rows.append(
                [
                    WORKLOAD_LABEL[wl],
                    self.label(label),
                    f"{summary([r['rss_peak_mb'] for r in runs])['median']:.0f}"
                    if SPAWN["always"]
                    else "-",
                    f"{summary(over)['median']:.0f}",
                    *cells,
                    note,
                ]
            )
        if rows:
            print_table(
                rows,
                [
                    "workload",
                    "condition",
                    "shardstream peak RSS, MiB (--spawn)",
                    "peak over imports, MiB",
                    "pyarrow best over imports, MiB",
                    "ratio",
                    "note",
                ],
                "(e) peak RSS of the (a)/(b) runs over their RSS after imports (medians; every "
                "run has imported pyarrow, torch and shardstream). Absolute peaks only with "
                "--spawn: a forked run's RSS leaves out the server's file-backed pages it never "
                "touches",
            )

    def shards_rss(self) -> None:
        import startup

        a = self.args
        res: dict[str, list[dict]] = {}
        for n in a.shard_counts:
            startup.generate(os.path.join(a.data_root, "startup", f"n{n}"), n)
        for i in range(a.runs):
            for n in a.shard_counts:
                root = os.path.join(a.data_root, "startup", f"n{n}")
                for mode in ("open", "pyarrow"):
                    status(f"(e) run {i + 1}/{a.runs}: {n} shards, {mode}")
                    load = benchlib.load1()
                    r = {**startup.child(mode, root), "load": load}
                    res.setdefault(f"{mode}/{n}", []).append(r)
        self.results["rss_shards"] = res
        rows = []
        prev: dict[str, tuple[int, float]] = {}
        for n in sorted(a.shard_counts):
            cells = []
            for mode in ("open", "pyarrow"):
                runs = res[f"{mode}/{n}"]
                over = _med_key(runs, "rss_over_imports_mb")
                slope = "-"
                if mode in prev and n > prev[mode][0]:  # growth per shard, fixed costs cancel
                    slope = f"{(over - prev[mode][1]) / (n - prev[mode][0]) * 1000:.1f}"
                prev[mode] = (n, over)
                cells += [f"{over:.0f}", slope, f"{_med_key(runs, 'first') * 1e3:.0f}"]
            rows.append([f"{n:,}", *cells, load_range(res[f"open/{n}"])])
        print_table(
            rows,
            [
                "shards",
                "shardstream: RSS over imports, MiB",
                "per 1,000 shards (slope from the row above)",
                "open + 1st, ms",
                "pyarrow.dataset: RSS over imports",
                "per 1,000 shards (slope)",
                "open + 1st, ms",
                "load",
            ],
            "(e) RSS after opening N small shards and reading the first batch "
            f"(benches/startup.py's shard sets, no sidecar); medians of {a.runs} fresh processes",
        )

    # ------------------------------------------------------------------ (h), (i) loaders

    def loader(self) -> None:
        a = self.args
        nb = a.loader_batches or max(a.warmup + 1, a.rows // BATCH - 2)
        nb = min(nb, max(a.warmup + 1, a.rows // BATCH - 2))
        runs: dict[str, list[dict]] = {}
        for i in range(a.runs):
            for loader in ("dl", "sdl"):
                for src in ("ss", "pa"):
                    status(f"(h) run {i + 1}/{a.runs}: {loader} over {src}, {nb} batches")
                    r = run_child(
                        {
                            **self.base,
                            "kind": "loader",
                            "src": src,
                            "loader": loader,
                            "workers": 2,
                            "batches": nb,
                            "warmup": a.warmup,
                        }
                    )
                    runs.setdefault(f"{loader}-{src}", []).append(r)
        self.results["loader"] = runs
        names = {"dl": "DataLoader", "sdl": "StatefulDataLoader(snapshot_every_n_steps=1)"}
        rows = []
        for loader in ("dl", "sdl"):
            ss, pa = runs[f"{loader}-ss"], runs[f"{loader}-pa"]
            rows.append(
                [
                    names[loader],
                    with_spread([_wall(r) for r in ss], mrows),
                    with_spread([_cpu(r) for r in ss], mrows),
                    with_spread([_wall(r) for r in pa], mrows),
                    with_spread([_cpu(r) for r in pa], mrows),
                    _ratio(_med(ss, _wall), _med(pa, _wall)),
                    _ratio(_med(ss, _cpu), _med(pa, _cpu)),
                    load_range(ss + pa),
                ]
            )
        print_table(
            rows,
            [
                "loader, 2 workers",
                "shardstream M rows/s",
                "M rows/CPU-s",
                "pyarrow dataset M rows/s",
                "M rows/CPU-s",
                "wall ratio",
                "CPU ratio",
                "load",
            ],
            f"(h) loaders, batch {BATCH}, torch, tokens as a list of tensors, batches "
            f"{a.warmup}..{nb} (steady state; CPU of main process + workers); median (min–max) "
            f"of {a.runs} runs",
        )

    def ceiling(self) -> None:
        a = self.args
        runs: dict[str, list[dict]] = {}
        plan = []
        for bs in a.ceiling_batch_sizes:
            nb = max(a.warmup + 1, min(a.ceiling_rows // bs, a.rows // bs - 2))
            for fmt in ("split", "offsets", "padded", "nested"):
                plan.append((fmt, bs, nb))
        for i in range(a.runs):
            for fmt, bs, nb in plan:
                for src in ("ss", "null"):
                    status(f"(i) run {i + 1}/{a.runs}: {fmt}, batch {bs}, {src}, {nb} batches")
                    r = run_child(
                        {
                            **self.base,
                            "kind": "ceiling",
                            "src": src,
                            "list_format": fmt,
                            "batch_size": bs,
                            "batches": nb,
                            "warmup": a.warmup,
                            "same_types": a.ceiling_same_types,
                        }
                    )
                    runs.setdefault(f"{fmt}/{bs}/{src}", []).append(r)
        self.results["ceiling"] = runs
        rows = []
        for fmt, bs, _ in plan:
            ss, null = runs[f"{fmt}/{bs}/ss"], runs[f"{fmt}/{bs}/null"]

            def bps(r: dict) -> float:
                return r["batches"] / r["seconds"]

            rows.append(
                [
                    fmt,
                    f"{bs:,}",
                    with_spread([bps(r) for r in ss], lambda x: f"{x:.0f}"),
                    with_spread([_cpu(r) for r in ss], krows),
                    with_spread([bps(r) for r in null], lambda x: f"{x:.0f}"),
                    with_spread([_cpu(r) for r in null], krows),
                    _ratio(_med(ss, bps), _med(null, bps)),
                    _ratio(_med(ss, _cpu), _med(null, _cpu)),
                    with_spread(
                        [
                            s["batches"] / s["seconds"] / (n["batches"] / n["seconds"])
                            for s, n in zip(ss, null, strict=True)
                        ],
                        lambda x: f"{x:.2f}x",
                    ),
                    load_range(ss + null),
                ]
            )
        print_table(
            rows,
            [
                "list_format",
                "batch",
                "shardstream batches/s",
                "k rows/CPU-s",
                "ceiling batches/s",
                "k rows/CPU-s",
                "ratio of medians",
                "CPU ratio",
                "ratio per run",
                "load",
            ],
            '(i) StatefulDataLoader(2 workers, snapshot_every_n_steps=1), output="torch", '
            "[id, tokens]: shardstream vs the loader's ceiling (a dataset yielding fresh copies "
            "of pre-built batches of the same shapes, "
            + ("of ParquetStream's own types" if a.ceiling_same_types else "plain tensors")
            + f"); steady state from batch {a.warmup}; "
            f"median (min–max) of {a.runs} runs",
        )


def _med_key(runs: list[dict], key: str) -> float:
    return summary([r[key] for r in runs])["median"]


def hf_rows(b: Bench, table: list) -> None:
    """(f): row mode, shardstream vs HuggingFace datasets streaming (one run each)."""
    args, base, results = b.args, b.base, b.results
    hf_missing, hf_cache = _hf_missing(), os.path.join(args.data_root, "hf-cache")
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
            f"{ss['rows'] / ss['seconds'] / 1e3:.1f} k rows/s, {_cpu(ss) / 1e3:.1f} k "
            f"rows/CPU-s ({ss['seconds']:.2f} s; first row {ss['first_ms']:.0f} ms)"
        )
        if hf_missing:
            table.append((label, ss_s, f"datasets streaming: {hf_missing}", "-"))
            continue
        status(f"row mode [{name}]: datasets streaming (cap {args.hf_cap:.0f}s)")
        hf = _hf_child(
            {
                **base,
                "kind": "hf_rows",
                "limit": limit,
                "columns": cols,
                "cap": args.hf_cap,
                "hf_cache": hf_cache,
            }
        )
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
                f"datasets streaming {n / hf['seconds'] / 1e3:.1f} k rows/s, "
                f"{_cpu(hf) / 1e3:.1f} k rows/CPU-s ({hf['seconds']:.2f} s; first row "
                f"{hf['first_ms']:.0f} ms; + {hf['ctor_ms']:.0f} ms load_dataset{capped})",
                f"{_wall(ss) / _wall(hf):.2f}x wall, {_ratio(_cpu(ss), _cpu(hf))} CPU",
            )
        )


def hf_resume(b: Bench, table: list) -> None:
    """(g): row-mode resume, shardstream vs datasets load_state_dict / skip(n) (one run each)."""
    args, base, results = b.args, b.base, b.results
    hf_missing, hf_cache = _hf_missing(), os.path.join(args.data_root, "hf-cache")
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
            hinfo = _hf_child(
                {**base, "kind": "hf_states", "positions": pos, "out": hsf, "hf_cache": hf_cache}
            )
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
                r = _hf_child(
                    {
                        **base,
                        "kind": "hf_resume",
                        "mode": mode,
                        "k": k,
                        "states": hsf,
                        "cap": args.hf_cap,
                        "hf_cache": hf_cache,
                    }
                )
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
            first, last = res_hf[f"{pos[0]}-{mode}"], res_hf[f"{pos[-1]}-{mode}"]
            cap = ">" if last["capped"] else ""
            name = "load_state_dict" if mode == "state" else "skip(n)"
            parts.append(f"{name} {cap}{last['total_ms'] / first['total_ms']:.1f}x")
        hf_flat = "datasets " + "; ".join(parts) + " (incl. load_dataset)"
    table.append(
        (
            "(g) flatness: row-mode resume 99% / 1%",
            f"{hi['resume_ms'] / lo['resume_ms']:.2f}x",
            hf_flat,
            "1.0 = O(1)",
        )
    )


def _ints(s: str) -> list[int]:
    return [int(x) for x in s.split(",") if x.strip()]


def _names(choices: Any) -> Any:
    def parse(s: str) -> list[str]:
        out = [x.strip() for x in s.split(",") if x.strip()]
        bad = sorted(set(out) - set(choices))
        if bad:
            raise argparse.ArgumentTypeError(f"unknown {bad}; choose from {','.join(choices)}")
        return out

    return parse


def _arg(v: Any) -> str:
    return ",".join(map(str, v)) if isinstance(v, list) else str(v)


QUICK = {  # --quick: every section at small sizes (a smoke run, not figures to quote)
    "rows": 20_000,
    "shards": 2,
    "runs": 1,
    "min_time": 0.1,
    "shuffle_buffer": 5_000,
    "buffers": [0, 1_000, 5_000],
    "state_calls": 100,
    "shard_counts": [100, 1_000],
    "row_limit": 5_000,
    "hf_cap": 10.0,
    "loader_batches": 12,
    "ceiling_rows": 8_192,
    "warmup": 4,
}


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    ap.add_argument(
        "--only",
        type=_names(ALL),
        default=list(ALL),
        help=f"comma-separated subset of {','.join(ALL)} (default: all)",
    )
    ap.add_argument(
        "--quick",
        action="store_true",
        help="every section at small sizes, one run each: "
        + ", ".join(f"--{k.replace('_', '-')} {_arg(v)}" for k, v in QUICK.items())
        + " (explicit options still win)",
    )
    ap.add_argument("--rows", type=int, default=2_000_000, help="total rows (%(default)s)")
    ap.add_argument("--shards", type=int, default=8, help="number of shards (%(default)s)")
    ap.add_argument(
        "--runs",
        type=int,
        default=3,
        help="fresh processes per figure, interleaved; median and spread (%(default)s)",
    )
    ap.add_argument(
        "--min-time",
        type=float,
        default=2.0,
        help="seconds of whole passes per (a)/(b) run (%(default)s)",
    )
    ap.add_argument(
        "--batch-size",
        type=int,
        default=BATCH,
        help="shardstream's batch size in (a)/(b) (%(default)s)",
    )
    ap.add_argument(
        "--pa-batch-sizes",
        type=_ints,
        default=[1024, 8192, 65536],
        help="pyarrow batch sizes; the best is the baseline (1024,8192,65536)",
    )
    ap.add_argument(
        "--workloads",
        type=_names(WORKLOADS),
        default=list(WORKLOADS),
        help=f"(a) workloads, of {','.join(WORKLOADS)} (all)",
    )
    ap.add_argument(
        "--conditions",
        type=_names(CONDITIONS),
        default=list(CONDITIONS),
        help="(a) conditions: free (both cores), ra0 (shardstream with "
        "readahead_threads=0), busy (one core spinning) (all)",
    )
    ap.add_argument(
        "--shuffle-buffer",
        type=int,
        default=100_000,
        help="(b)'s shuffle buffer, rows (%(default)s)",
    )
    ap.add_argument(
        "--buffers",
        type=_ints,
        default=[0, 10_000, 100_000],
        help="shuffle buffers of (c) and (d) (0,10000,100000)",
    )
    ap.add_argument(
        "--state-calls",
        type=int,
        default=2_000,
        help="state_dict() calls per (d) run (%(default)s)",
    )
    ap.add_argument(
        "--shard-counts",
        type=_ints,
        default=[1_000, 10_000],
        help="shard counts of (e)'s RSS per shard (1000,10000)",
    )
    ap.add_argument(
        "--data-root", default=os.path.join(ROOT, "bench-data"), help="cache dir for shards"
    )
    ap.add_argument(
        "--row-limit",
        type=int,
        default=500_000,
        help="rows read by each row-mode throughput run (%(default)s)",
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
        help="batches per (h) run, 0 = about an epoch (%(default)s)",
    )
    ap.add_argument(
        "--ceiling-batch-sizes", type=_ints, default=[32, 1024], help="batch sizes of (i) (32,1024)"
    )
    ap.add_argument(
        "--ceiling-same-types",
        action="store_true",
        help="(i)'s ceiling yields ParquetStream's own batch types (its dict type, SplitList) "
        "instead of plain dicts of plain tensors",
    )
    ap.add_argument(
        "--ceiling-rows", type=int, default=131_072, help="rows per (i) run (%(default)s)"
    )
    ap.add_argument(
        "--warmup",
        type=int,
        default=20,
        help="loader batches before the clock starts in (h)/(i) (%(default)s)",
    )
    ap.add_argument(
        "--spawn",
        action="store_true",
        help="start every run in a new interpreter (default: fork it from a server process "
        "that imported pyarrow, torch and shardstream once and ran nothing else)",
    )
    ap.add_argument(
        "--no-page-index",
        action="store_true",
        help="data written without a page index (pyarrow's default; a separate data dir)",
    )
    ap.add_argument("--json", default=None, help="also write raw results to this file")
    ap.add_argument("--child", default=None, help=argparse.SUPPRESS)
    raw = list(sys.argv[1:] if argv is None else argv)
    args = ap.parse_args(raw)

    if args.child is not None:
        print(json.dumps(child_main(json.loads(args.child))), flush=True)
        sys.stderr.flush()
        # Skip interpreter teardown: pyarrow's thread pool can hang at exit after a scan was
        # abandoned mid-way (datasets streaming stopped after n rows); the result is out.
        os._exit(0)

    if args.quick:  # small sizes, except where an option was given explicitly
        given = {a.split("=")[0] for a in raw if a.startswith("--")}
        for k, v in QUICK.items():
            if f"--{k.replace('_', '-')}" not in given:
                setattr(args, k, v)
    if args.rows < 4 * BATCH or args.runs < 1 or args.warmup < 1:
        ap.error(f"need --rows >= {4 * BATCH}, --runs >= 1, --warmup >= 1")
    SPAWN["always"] = args.spawn
    which = args.only
    t_all = time.perf_counter()
    load_start = benchlib.load1()
    data = ensure_data(args.data_root, args.rows, args.shards, not args.no_page_index)
    warm_cache(data)
    size_mb = sum(os.path.getsize(p) for p in shard_files(data)) / 2**20
    b = Bench(args, data)
    b.results.update(rows=args.rows, shards=args.shards, data_mb=size_mb, load_start=load_start)

    import pyarrow
    import shardstream

    try:
        import torch

        torch_v = torch.__version__
    except ImportError:  # pragma: no cover
        torch_v = "-"
    print()
    print(
        f"shardstream {getattr(shardstream, '__version__', '?')} at {_git_commit()} | "
        f"{args.rows:,} rows, {args.shards} shards, {size_mb:.0f} MiB zstd | "
        f"{platform.python_implementation()} {platform.python_version()}, pyarrow "
        f"{pyarrow.__version__}, torch {torch_v} | {os.cpu_count()} cores | "
        f"load average {load_start:.2f} at start | {time.strftime('%Y-%m-%d %H:%M')}"
    )
    print(f"command: python benches/bench.py {' '.join(raw) or '(defaults)'}")
    if load_start > 0.5:
        print(
            f"note: the machine was not quiet (load {load_start:.2f} at start): "
            "do not quote these figures"
        )
    sys.stdout.flush()

    b.run_passes(which)
    b.table_passes()
    if "resume" in which:
        b.resume()
    if "state" in which:
        b.state()
    if "rss" in which:
        b.rss()
    hf_table: list[tuple[str, str, str, str]] = []
    if "rows" in which:
        hf_rows(b, hf_table)
    if "resume-hf" in which:
        hf_resume(b, hf_table)
    if hf_table:
        print_table(hf_table, title="(f)/(g) row mode vs HuggingFace datasets (one run each)")
    if "loader" in which:
        b.loader()
    if "ceiling" in which:
        b.ceiling()
    load_end = benchlib.load1()
    b.results["load_end"] = load_end
    print()
    print(
        f"(load average {load_end:.2f} at end; total bench time {time.perf_counter() - t_all:.0f}s)"
    )
    benchlib.write_json(b.results, args.json)
    return 0


if __name__ == "__main__":
    sys.exit(main())
