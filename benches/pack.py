"""Token packing benchmarks (issue #17), side by side in one run.

    python benches/pack.py [--only throughput,resume,loader,mixture] [--docs 20000]
        [--seq-len 2048] [--batch 8] [--runs 3] [--quick] [--dir bench-data/pack] [--json out]

Data: ``--docs`` documents of int32 tokens, lengths uniform in [1, seq_len], 4 zstd Parquet
shards (row groups of 2,000 documents, no page index). Every packer makes ``[batch, seq_len]``
numpy arrays of ``input_ids``, ``labels`` (next token, -100 at document ends and on padding),
``position_ids`` and ``segment_ids`` (0 = padding).

Sections (``--only``, comma-separated; default all):

throughput  packed rows/s and document tokens/s, wall and CPU (CPU includes shardstream's
            decode threads and Grain's reader threads), padding share, for: a straightforward
            numpy concat-and-split over ``pyarrow.parquet`` batches (at each of several read
            batch sizes: the baseline at its best), shardstream ``concat`` and ``best_fit``
            (window 256), Grain (``ParquetIterDataset`` -> ``FirstFitPackIterDataset`` /
            ``BestFitPackIterDataset`` at several ``num_packing_bins``, and
            ``ConcatThenSplitIterDataset``; ``.batch()``; labels from its segment ids in a
            ``.map``), HF trl ``pack_dataset`` (``bfd``, ``wrapped``; offline over an in-memory
            ``datasets.Dataset`` read with pyarrow, then batches padded to ``seq_len``; its
            read + pack step is reported apart). A library that is not installed is skipped
            with the import error printed.
resume      time from a fresh process's ``load_state_dict`` (Grain: ``set_state``) to the first
            batch, and the state size (pickled), at 1% / 50% / 99% of the pass, for shardstream
            ``concat`` and ``best_fit`` (single stream and a 3-source ``Mixture``), Grain's
            packers (they restore by replaying: re-reading and re-packing from their last
            checkpoint), and trl (offline, no state: a restarted job packs again, then indexes
            the packed dataset). Each resumed batch is compared with the uninterrupted run's.
loader      packed batches through a torchdata ``StatefulDataLoader`` with 2 workers vs the
            same documents as per-row batches (``list_format="padded"``, 8 and 16 documents
            per batch: the same rows per batch, and about the same tokens): items/s, document
            tokens/s, wall and CPU (the workers' CPU included); and packed batches with
            ``num_workers=0``: what the workers' hand-over costs.
mixture     ``Mixture(3 sources, pack=Pack(...))`` vs one packed ``ParquetStream`` over the same
            documents: document tokens/s and the ratio (the mixture's overhead with packing).
callgrind   (not by default: minutes) instructions of one pass (``--cg-docs`` documents) under
            valgrind's callgrind, all threads, instrumented only from after the imports to the
            end of the pass: the packer-vs-baseline ratio on a machine whose load makes wall
            times meaningless.

Every figure is the median (min-max) of ``--runs`` fresh processes (forked from a server that
imported the libraries once: ``benchlib.run_forked``), run interleaved, with the 1-minute load
at each run's start beside it.
"""

from __future__ import annotations

import argparse
import os
import pickle
import resource
import shutil
import sys
import time
from typing import Any

import numpy as np

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))

import benchlib  # noqa: E402

# pandas: pyarrow imports it on the first to_numpy() of a list's values (~0.7 s, once).
PRELOAD = ["pyarrow", "pyarrow.parquet", "pandas", "numpy", "torch", "shardstream"]
SECTIONS = ("throughput", "resume", "loader", "mixture", "callgrind")
BUFFER_DOCS = 256

# ------------------------------------------------------------------ data


def generate(root: str, docs: int, max_len: int) -> int:
    """The token shards (once per size), and three source directories over the same files
    (symlinks: parts 0+1, 2, 3) for the mixture. Returns the number of tokens."""
    import pyarrow as pa
    import pyarrow.parquet as pq

    marker = os.path.join(root, f".done-{docs}-{max_len}")
    if not os.path.exists(marker):
        shutil.rmtree(root, ignore_errors=True)
        os.makedirs(root)
        rng = np.random.default_rng(0)
        lengths = rng.integers(1, max_len + 1, size=docs)
        total = 0
        per = docs // 4
        for s in range(4):
            ls = lengths[s * per : (s + 1) * per]
            offsets = np.r_[0, np.cumsum(ls)].astype(np.int32)
            values = rng.integers(0, 50_000, size=int(offsets[-1]), dtype=np.int32)
            arr = pa.ListArray.from_arrays(pa.array(offsets), pa.array(values))
            pq.write_table(
                pa.table({"input_ids": arr}),
                os.path.join(root, f"part-{s}.parquet"),
                row_group_size=2000,
                compression="zstd",
            )
            total += int(offsets[-1])
        for name, parts in (("s0", (0, 1)), ("s1", (2,)), ("s2", (3,))):
            d = os.path.join(root, "mix", name)
            os.makedirs(d)
            for p in parts:
                os.symlink(os.path.join("..", "..", f"part-{p}.parquet"), f"{d}/part-{p}.parquet")
        with open(marker, "w") as f:
            f.write(str(total))
    with open(marker) as f:
        return int(f.read())


def files_of(root: str) -> list[str]:
    return sorted(os.path.join(root, f) for f in os.listdir(root) if f.endswith(".parquet"))


# ------------------------------------------------------------------ the packers (in children)


def _clock() -> tuple[float, float]:
    """Wall and CPU seconds; CPU includes waited-for child processes (DataLoader workers)."""
    ru = resource.getrusage(resource.RUSAGE_CHILDREN)
    return time.perf_counter(), time.process_time() + ru.ru_utime + ru.ru_stime


def labels_from_segments(ids: np.ndarray, seg: np.ndarray) -> np.ndarray:
    """Next-token labels, -100 where the next token is another document's or padding."""
    lab = np.full(ids.shape, -100, dtype=np.int64)
    same = (seg[:, 1:] == seg[:, :-1]) & (seg[:, :-1] > 0)
    lab[:, :-1] = np.where(same, ids[:, 1:], -100)
    return lab


def numpy_batches(spec: dict) -> Any:
    """Concatenate every document's tokens and cut rows of seq_len (the same four arrays)."""
    import pyarrow.parquet as pq

    L, B = spec["seq_len"], spec["batch"]
    carry_t = np.empty(0, np.int64)
    carry_d = np.empty(0, np.int64)  # document number of each carried token
    doc0 = 0
    need = L * B
    for path in files_of(spec["dir"]):
        for rb in pq.ParquetFile(path).iter_batches(batch_size=spec["read"]):
            col = rb.column(0)
            off = col.offsets.to_numpy()
            vals = col.values.to_numpy().astype(np.int64)
            lens = np.diff(off)
            docs = np.repeat(np.arange(doc0, doc0 + len(lens)), lens)
            doc0 += len(lens)
            carry_t = np.concatenate([carry_t, vals])
            carry_d = np.concatenate([carry_d, docs])
            while carry_t.shape[0] >= need:
                ids = carry_t[:need].reshape(B, L)
                d = carry_d[:need].reshape(B, L)
                carry_t, carry_d = carry_t[need:], carry_d[need:]
                start = np.ones(d.shape, dtype=bool)
                start[:, 1:] = d[:, 1:] != d[:, :-1]
                seg = np.cumsum(start, axis=1, dtype=np.int32)
                idx = np.arange(L)[None, :].repeat(B, 0)
                pos = idx - np.maximum.accumulate(np.where(start, idx, 0), axis=1)
                yield {
                    "input_ids": ids,
                    "labels": labels_from_segments(ids, seg),
                    "position_ids": pos,
                    "segment_ids": seg,
                }


def ss_pack(spec: dict) -> Any:
    from shardstream import Pack

    if spec["algo"] == "concat":
        return Pack(seq_len=spec["seq_len"])
    return Pack(seq_len=spec["seq_len"], algorithm="best_fit", buffer_docs=BUFFER_DOCS)


def ss_stream(spec: dict) -> Any:
    from shardstream import Mixture, ParquetStream

    out = spec.get("output", "numpy")
    if not spec.get("mix"):
        return ParquetStream(
            files_of(spec["dir"]), columns=["input_ids"], batch_size=spec["batch"], output=out,
            pack=ss_pack(spec),
        )  # fmt: skip
    import pyarrow.parquet as pq

    srcs, sizes = {}, {}
    for name in ("s0", "s1", "s2"):
        d = os.path.join(spec["dir"], "mix", name)
        srcs[name] = ParquetStream(d, columns=["input_ids"])
        sizes[name] = sum(pq.ParquetFile(p).metadata.num_rows for p in files_of(d))
    return Mixture(
        srcs, weights=sizes, on_exhausted="drop", batch_size=spec["batch"], output=out,
        pack=ss_pack(spec),
    )  # fmt: skip


def grain_dataset(spec: dict) -> Any:
    import grain.experimental as ge

    L = spec["seq_len"]
    ds = ge.ParquetIterDataset(files_of(spec["dir"]))
    if spec["algo"] == "concat_then_split":
        ds = ge.ConcatThenSplitIterDataset(ds, length_struct={"input_ids": L})
    else:
        cls = (
            ge.FirstFitPackIterDataset if spec["algo"] == "first_fit" else ge.BestFitPackIterDataset
        )
        ds = cls(
            ds, length_struct={"input_ids": L}, num_packing_bins=spec["bins"], shuffle_bins=False
        )

    def finish(b: dict) -> dict:
        ids, seg = b["input_ids"], b["input_ids_segment_ids"]
        return {
            "input_ids": ids,
            "labels": labels_from_segments(ids, seg),
            "position_ids": b["input_ids_positions"],
            "segment_ids": seg,
        }

    return ds.batch(spec["batch"]).map(finish)


def trl_packed(spec: dict) -> Any:
    """trl's offline step: the documents into an in-memory ``datasets.Dataset`` (pyarrow), then
    ``pack_dataset`` (a batched ``map`` of 1,000 documents)."""
    import datasets
    import pyarrow.parquet as pq
    from datasets.table import InMemoryTable
    from trl import pack_dataset

    datasets.disable_progress_bars()
    table = pq.read_table(files_of(spec["dir"]), columns=["input_ids"])
    ds = datasets.Dataset(InMemoryTable(table))
    return pack_dataset(ds, spec["seq_len"], strategy=spec["algo"])


def trl_batch(tb: Any, L: int) -> dict:
    """A batch of trl's packed rows (each <= L tokens) as the four [rows, L] arrays: padded,
    positions and segments from its ``seq_lengths`` (``wrapped`` keeps no document bounds: one
    segment per row)."""
    col = tb.column("input_ids").combine_chunks()
    off = col.offsets.to_numpy()
    vals = col.values.to_numpy()[off[0] : off[-1]].astype(np.int64)
    off = off - off[0]
    rows = len(off) - 1
    rl = np.diff(off)
    if "seq_lengths" in tb.column_names:
        sl = tb.column("seq_lengths").combine_chunks()
        so = sl.offsets.to_numpy()
        dl = sl.values.to_numpy()[so[0] : so[-1]].astype(np.int64)
        ndocs = np.diff(so)
    else:
        dl, ndocs = rl.astype(np.int64), np.ones(rows, np.int64)
    r = np.repeat(np.arange(rows), rl)
    c = np.arange(len(vals)) - np.repeat(off[:-1], rl)
    doc_first = np.r_[0, np.cumsum(dl)[:-1]]
    row_first_doc = np.r_[0, np.cumsum(ndocs)[:-1]]
    seg_of_doc = np.arange(len(dl)) - np.repeat(row_first_doc, ndocs) + 1
    ids = np.zeros((rows, L), np.int64)
    pos = np.zeros((rows, L), np.int64)
    seg = np.zeros((rows, L), np.int32)
    ids[r, c] = vals
    pos[r, c] = np.arange(len(vals)) - np.repeat(doc_first, dl)
    seg[r, c] = np.repeat(seg_of_doc, dl)
    return {
        "input_ids": ids,
        "labels": labels_from_segments(ids, seg),
        "position_ids": pos,
        "segment_ids": seg,
    }


def trl_batches(packed: Any, spec: dict) -> Any:
    for tb in packed.with_format("arrow").iter(batch_size=spec["batch"]):
        yield trl_batch(tb, spec["seq_len"])


def count(batches: Any, t0: tuple[float, float]) -> dict:
    rows = real = 0
    for b in batches:
        rows += b["input_ids"].shape[0]
        real += int((b["segment_ids"] > 0).sum())
    t1 = _clock()
    return {"rows": rows, "real": real, "wall": t1[0] - t0[0], "cpu": t1[1] - t0[1]}


def child_pass(spec: dict) -> dict:
    lib = spec["lib"]
    if lib == "grain":
        import grain.experimental  # noqa: F401  (imports outside the timing)
    if lib == "trl":
        import datasets  # noqa: F401
        import trl.data_utils  # noqa: F401  (trl imports lazily)
    t0 = _clock()
    if lib == "numpy":
        return count(numpy_batches(spec), t0)
    if lib == "shardstream":
        return count(ss_stream(spec), t0)
    if lib == "grain":
        return count(grain_dataset(spec), t0)
    if lib == "trl":
        packed = trl_packed(spec)
        t1 = _clock()
        out = count(trl_batches(packed, spec), t0)
        return dict(out, pack_wall=t1[0] - t0[0], pack_cpu=t1[1] - t0[1])
    raise ValueError(lib)


def _same(a: dict, b: dict) -> bool:
    keys = ("input_ids", "labels", "position_ids", "segment_ids")
    return all(np.array_equal(np.asarray(a[k]), np.asarray(b[k])) for k in keys)


def child_resume(spec: dict) -> dict:
    """Run to item ``at``, take the state, note the next item; then a new pipeline restored
    from the state (pickled and unpickled, as a checkpoint is) makes its first item: timed
    from the restore call to that item, compared with the noted one."""
    lib, at = spec["lib"], spec["at"]
    if lib == "shardstream":
        ds = ss_stream(spec)
        it = iter(ds)
        for _ in range(at):
            next(it)
        blob = pickle.dumps(ds.state_dict())
        want = next(it)
        ds2 = ss_stream(spec)
        state = pickle.loads(blob)
        t0 = _clock()
        ds2.load_state_dict(state)
        got = next(iter(ds2))
    elif lib == "grain":
        it = iter(grain_dataset(spec))
        for _ in range(at):
            next(it)
        blob = pickle.dumps(it.get_state())
        want = next(it)
        it2 = iter(grain_dataset(spec))
        state = pickle.loads(blob)
        t0 = _clock()
        it2.set_state(state)
        got = next(it2)
    elif lib == "trl":
        # No state: a restarted job packs again (offline) and indexes the packed dataset.
        import datasets  # noqa: F401
        import trl.data_utils  # noqa: F401

        blob = b""  # nothing to save: the job only knows how many batches it took
        ref = trl_packed(spec).with_format("arrow")
        want = trl_batch(
            ref.select(range(at * spec["batch"], (at + 1) * spec["batch"]))[:], spec["seq_len"]
        )
        t0 = _clock()
        packed = trl_packed(spec).with_format("arrow")
        got = trl_batch(
            packed.select(range(at * spec["batch"], (at + 1) * spec["batch"]))[:], spec["seq_len"]
        )
    else:
        raise ValueError(lib)
    t1 = _clock()
    return {
        "ms": (t1[0] - t0[0]) * 1e3,
        "cpu_ms": (t1[1] - t0[1]) * 1e3,
        "bytes": len(blob),
        "exact": _same(want, got),
    }


def child_loader(spec: dict) -> dict:
    from shardstream import ParquetStream
    from torchdata.stateful_dataloader import StatefulDataLoader

    t0 = _clock()
    if spec["mode"] == "packed":
        ds = ss_stream(dict(spec, output="torch"))
    else:
        ds = ParquetStream(
            files_of(spec["dir"]),
            columns=["input_ids"],
            batch_size=spec["rows_batch"],
            output="torch",
            list_format="padded",
        )
    dl = StatefulDataLoader(ds, batch_size=None, num_workers=spec.get("workers", 2))
    items = real = slots = 0
    for b in dl:
        items += 1
        if spec["mode"] == "packed":
            real += int((b["segment_ids"] > 0).sum())
            slots += b["input_ids"].numel()
        else:
            padded, lengths = b["input_ids"]
            real += int(lengths.sum())
            slots += padded.numel()
    del dl  # the workers are joined: their CPU is in RUSAGE_CHILDREN
    t1 = _clock()
    return {
        "items": items,
        "real": real,
        "slots": slots,
        "wall": t1[0] - t0[0],
        "cpu": t1[1] - t0[1],
    }


def child(spec: dict) -> dict:
    return {"pass": child_pass, "resume": child_resume, "loader": child_loader}[spec["kind"]](spec)


# ------------------------------------------------------------------ parent


def available(mod: str) -> str | None:
    """None if ``mod`` imports, else the error (the reason its rows are skipped)."""
    import subprocess

    p = subprocess.run([sys.executable, "-c", f"import {mod}"], capture_output=True, text=True)
    if p.returncode == 0:
        return None
    return (p.stderr.strip().splitlines() or [f"exit {p.returncode}"])[-1]


def runs_of(specs: list[dict], runs: int) -> list[list[dict]]:
    """Every spec ``runs`` times, interleaved (``benchlib.runs_interleaved``)."""
    return benchlib.runs_interleaved(child, specs, runs, PRELOAD)


def med(runs: list[dict], f: Any) -> float:
    return float(np.median([f(r) for r in runs]))


def spread(runs: list[dict], f: Any, fmt: str) -> str:
    return benchlib.with_spread([f(r) for r in runs], lambda x: format(x, fmt))


def numpy_cases(base: dict, sizes: list[int]) -> list[tuple[str, dict]]:
    return [(f"numpy concat-split, read {rb:,}", dict(base, lib="numpy", read=rb)) for rb in sizes]


def ss_cases(base: dict) -> list[tuple[str, dict]]:
    return [
        ("shardstream `concat`", dict(base, lib="shardstream", algo="concat")),
        (
            f"shardstream `best_fit`, window {BUFFER_DOCS}",
            dict(base, lib="shardstream", algo="best_fit"),
        ),
    ]


def section_throughput(args: Any, base: dict, skip: dict, results: dict) -> None:
    L = args.seq_len
    cases = numpy_cases(base, args.read_sizes)
    cases += ss_cases(base)
    if not skip["grain"]:
        for algo in ("first_fit", "best_fit"):
            for bins in args.grain_bins:
                cases.append(
                    (f"Grain `{algo}`, {bins} bins", dict(base, lib="grain", algo=algo, bins=bins))
                )
        cases.append(
            ("Grain `concat_then_split`", dict(base, lib="grain", algo="concat_then_split"))
        )
    if not skip["trl"]:
        for algo in ("bfd", "wrapped"):
            cases.append((f"trl `pack_dataset` `{algo}`", dict(base, lib="trl", algo=algo)))
    res = runs_of([s for _, s in cases], args.runs)
    rows = []
    numpy_runs = [r for (n, _), r in zip(cases, res, strict=True) if n.startswith("numpy")]
    numpy_best_cpu = min(med(r, lambda x: x["cpu"]) for r in numpy_runs)
    numpy_best_wall = min(med(r, lambda x: x["wall"]) for r in numpy_runs)
    for (name, _), rs in zip(cases, res, strict=True):
        pad = 1 - rs[0]["real"] / (rs[0]["rows"] * L)
        note = ""
        if "pack_wall" in rs[0]:
            pw, pc = med(rs, lambda x: x["pack_wall"]), med(rs, lambda x: x["pack_cpu"])
            note = f" (read + pack {pw:.2f} s wall, {pc:.2f} CPU)"
        rows.append(
            [
                name + note,
                spread(rs, lambda x: x["rows"] / x["wall"], ",.0f"),
                spread(rs, lambda x: x["real"] / x["wall"] / 1e6, ".1f"),
                spread(rs, lambda x: x["wall"], ".2f"),
                spread(rs, lambda x: x["cpu"], ".2f"),
                f"{pad:.2%}",
                f"{med(rs, lambda x: x['wall']) / numpy_best_wall:.2f}",
                f"{med(rs, lambda x: x['cpu']) / numpy_best_cpu:.2f}",
                benchlib.load_range(rs),
            ]
        )
        results.setdefault("throughput", {})[name] = rs
    for lib in ("grain", "trl"):
        if skip[lib]:
            rows.append([f"{lib}: skipped ({skip[lib]})"] + [""] * 8)
    benchlib.print_table(
        rows,
        ("packer", "packed rows/s", "M doc tokens/s", "wall s", "CPU s", "padding",
         "wall vs best numpy", "CPU vs best numpy", "load"),
        f"(a) throughput: {args.docs:,} documents, [{args.batch}, {L}] batches, "
        f"{args.runs} run(s) each, interleaved",
    )  # fmt: skip


def section_resume(args: Any, base: dict, skip: dict, n_items: int, results: dict) -> None:
    fracs = (0.01, 0.5, 0.99)
    cases: list[tuple[str, dict]] = []
    for mix in (False, True):
        for algo in ("concat", "best_fit"):
            name = f"shardstream `{algo}`" + (", 3-source Mixture" if mix else "")
            cases.append((name, dict(base, lib="shardstream", algo=algo, mix=mix)))
    if not skip["grain"]:
        cases.append(
            (f"Grain `first_fit`, {args.grain_resume_bins} bins",
             dict(base, lib="grain", algo="first_fit", bins=args.grain_resume_bins))
        )  # fmt: skip
        cases.append(
            ("Grain `concat_then_split`", dict(base, lib="grain", algo="concat_then_split"))
        )
    if not skip["trl"]:
        cases.append(("trl `bfd` (packs again)", dict(base, lib="trl", algo="bfd")))
    specs, where = [], []
    for i, (_, s) in enumerate(cases):
        for f in fracs if s["lib"] == "shardstream" else (0.5,):
            specs.append(dict(s, kind="resume", at=max(1, int(n_items * f))))
            where.append((i, f))
    res = runs_of(specs, args.runs)
    by: dict[int, dict[float, list[dict]]] = {}
    for (i, f), rs in zip(where, res, strict=True):
        by.setdefault(i, {})[f] = rs
    rows = []
    for i, (name, _) in enumerate(cases):
        cells = []
        for f in fracs:
            rs = by[i].get(f)
            if rs is None:
                cells.append("-")
                continue
            ok = all(r["exact"] for r in rs)
            size = f"{rs[0]['bytes']:,} B" if rs[0]["bytes"] else "no state"
            cells.append(
                f"{spread(rs, lambda x: x['ms'], '.1f')} ms, {size}"
                + ("" if ok else " **NOT the same batch**")
            )
        allr = [r for rs in by[i].values() for r in rs]
        rows.append([name, *cells, benchlib.load_range(allr)])
        results.setdefault("resume", {})[name] = {str(f): rs for f, rs in by[i].items()}
    for lib in ("grain", "trl"):
        if skip[lib]:
            rows.append([f"{lib}: skipped ({skip[lib]})", "", "", "", ""])
    benchlib.print_table(
        rows,
        ("packer", "1%: restore -> first batch, state", "50%", "99%", "load"),
        "(b) resume: restore (load_state_dict / set_state) -> first batch in a fresh process, "
        "pickled state size; the batch is checked against the uninterrupted run's",
    )


def section_loader(args: Any, base: dict, results: dict) -> None:
    lb = dict(base, kind="loader", lib="shardstream")
    cases = [
        ("packed `concat`, no workers", dict(lb, mode="packed", algo="concat", workers=0)),
        ("packed `concat`", dict(lb, mode="packed", algo="concat")),
        (f"packed `best_fit` (window {BUFFER_DOCS})", dict(lb, mode="packed", algo="best_fit")),
    ]
    for rb in args.rows_batch:
        cases.append(
            (
                f"per-row, {rb} documents, padded",
                dict(base, kind="loader", mode="rows", rows_batch=rb),
            )
        )
    res = runs_of([s for _, s in cases], args.runs)
    per_row = res[3:]
    rows_tok = max(med(r, lambda x: x["real"] / x["wall"]) for r in per_row)
    rows_tok_cpu = max(med(r, lambda x: x["real"] / x["cpu"]) for r in per_row)
    rows = []
    for (name, _), rs in zip(cases, res, strict=True):
        rows.append(
            [
                name,
                spread(rs, lambda x: x["items"] / x["wall"], ",.0f"),
                spread(rs, lambda x: x["real"] / x["wall"] / 1e6, ".1f"),
                spread(rs, lambda x: x["real"] / x["cpu"] / 1e6, ".1f"),
                spread(rs, lambda x: x["wall"], ".2f"),
                spread(rs, lambda x: x["cpu"], ".2f"),
                f"{1 - rs[0]['real'] / rs[0]['slots']:.1%}",
                f"{med(rs, lambda x: x['real'] / x['wall']) / rows_tok:.2f} / "
                f"{med(rs, lambda x: x['real'] / x['cpu']) / rows_tok_cpu:.2f}",
                benchlib.load_range(rs),
            ]
        )
        results.setdefault("loader", {})[name] = rs
    benchlib.print_table(
        rows,
        ("output", "items/s", "M doc tokens/s", "M doc tokens per CPU-s", "wall s", "CPU s",
         "padding", "tokens/s vs best per-row (wall / CPU)", "load"),
        "(c) StatefulDataLoader, 2 workers (and one packed row without), torch output "
        "(CPU includes the workers')",
    )  # fmt: skip


def section_mixture(args: Any, base: dict, results: dict) -> None:
    rows = []
    for algo in ("concat", "best_fit"):
        specs = [
            dict(base, lib="shardstream", algo=algo, mix=False),
            dict(base, lib="shardstream", algo=algo, mix=True),
        ]
        one, mix = runs_of(specs, args.runs)
        assert {r["real"] for r in one} == {r["real"] for r in mix}, (one, mix)
        ratio_w = [m["wall"] / o["wall"] for m, o in zip(mix, one, strict=True)]
        ratio_c = [m["cpu"] / o["cpu"] for m, o in zip(mix, one, strict=True)]
        rows.append(
            [
                f"`{algo}`",
                spread(mix, lambda x: x["real"] / x["wall"] / 1e6, ".1f"),
                spread(one, lambda x: x["real"] / x["wall"] / 1e6, ".1f"),
                benchlib.with_spread(ratio_w, lambda x: f"{x:.2f}"),
                benchlib.with_spread(ratio_c, lambda x: f"{x:.2f}"),
                f"{1 - mix[0]['real'] / (mix[0]['rows'] * args.seq_len):.2%} / "
                f"{1 - one[0]['real'] / (one[0]['rows'] * args.seq_len):.2%}",
                benchlib.load_range(mix + one),
            ]
        )
        results.setdefault("mixture", {})[algo] = {"mix": mix, "single": one}
    benchlib.print_table(
        rows,
        ("algorithm", "Mixture M doc tokens/s", "one stream M doc tokens/s", "wall ratio (pair)",
         "CPU ratio (pair)", "padding mix / one", "load"),
        "(d) Mixture(3 sources, pack=Pack(...)) vs one packed ParquetStream over the same "
        "documents (numpy output)",
    )  # fmt: skip


# ------------------------------------------------------------------ callgrind

LIB_IMPORTS = {
    "numpy": ["pyarrow.parquet", "pandas", "numpy"],
    "shardstream": ["pyarrow.parquet", "pandas", "numpy", "shardstream"],
    "grain": ["pyarrow.parquet", "pandas", "numpy", "grain.experimental"],
    "trl": ["pyarrow.parquet", "pandas", "numpy", "datasets", "trl.data_utils"],
}


def run_spec(spec: dict) -> None:
    """``--run-spec`` (under callgrind, instrumentation off): the lib's imports, then one pass
    between two lines read from stdin, while the parent has the instrumentation on."""
    import importlib

    for m in LIB_IMPORTS[spec["lib"]]:
        importlib.import_module(m)
    if spec["lib"] == "trl":
        import datasets

        datasets.disable_progress_bars()
    print("ready", flush=True)
    sys.stdin.readline()
    child_pass(spec)
    print("done", flush=True)
    sys.stdin.readline()


def callgrind_ir(spec: dict) -> int:
    """Instructions (all threads) of one ``child_pass(spec)`` in a fresh interpreter under
    callgrind: started with the instrumentation off, switched on (``callgrind_control``) only
    for the pass."""
    import json

    argv = [os.path.abspath(__file__), "--run-spec", json.dumps(spec)]
    return benchlib.callgrind_window(argv, ("ready", "done"), 600)[0]


def section_callgrind(args: Any, skip: dict, results: dict) -> None:
    """Instruction counts of one pass: the packer-vs-baseline ratio that the machine's load
    does not move."""
    root = args.dir + f"-cg{args.cg_docs}"
    total = generate(root, args.cg_docs, args.seq_len)
    base = {"kind": "pass", "dir": root, "seq_len": args.seq_len, "batch": args.batch}
    cases = numpy_cases(base, args.read_sizes) + ss_cases(base)
    if not skip["grain"]:
        cases.append(
            ("Grain `concat_then_split`", dict(base, lib="grain", algo="concat_then_split"))
        )
        for bins in args.grain_bins:
            gb = dict(base, lib="grain", algo="first_fit", bins=bins)
            cases.append((f"Grain `first_fit`, {bins} bins", gb))
    if not skip["trl"]:
        for a in ("bfd", "wrapped"):
            cases.append((f"trl `{a}` (read + pack + batches)", dict(base, lib="trl", algo=a)))
    irs = []
    for name, s in cases:
        irs.append((name, callgrind_ir(s)))
        print(f"  callgrind: {name}: {irs[-1][1]:,} instructions", file=sys.stderr, flush=True)
    best = min(ir for name, ir in irs if name.startswith("numpy"))
    rows = [[name, f"{ir / 1e6:,.0f}", f"{ir / total:.1f}", f"{ir / best:.2f}"] for name, ir in irs]
    results["callgrind"] = {"docs": args.cg_docs, "tokens": total, "ir": dict(irs)}
    benchlib.print_table(
        rows,
        ("packer", "M instructions per pass", "instructions per token", "vs best numpy"),
        f"(e) callgrind: instructions of one pass over {args.cg_docs:,} documents ({total:,} "
        f"tokens), all threads (load {benchlib.load1():.2f}: counts do not depend on it)",
    )


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument(
        "--only", default=",".join(SECTIONS[:4]),
        help=f"comma-separated: {','.join(SECTIONS)} (default: all but callgrind: slow)",
    )  # fmt: skip
    ap.add_argument("--docs", type=int, default=20_000)
    ap.add_argument("--seq-len", type=int, default=2048)
    ap.add_argument("--batch", type=int, default=8)
    ap.add_argument("--rows-batch", default="8,16", help="documents per per-row batch (loader)")
    ap.add_argument("--runs", type=int, default=3)
    ap.add_argument(
        "--read-sizes", default="1024,4096,16384", help="numpy baseline read batch sizes"
    )
    ap.add_argument("--grain-bins", default="8,64,256", help="Grain num_packing_bins to try")
    ap.add_argument("--grain-resume-bins", type=int, default=64)
    ap.add_argument("--dir", default="bench-data/pack")
    ap.add_argument("--quick", action="store_true", help="2,000 documents, 1 run, fewer variants")
    ap.add_argument("--cg-docs", type=int, default=4000, help="documents for the callgrind section")
    ap.add_argument("--json", default=None)
    ap.add_argument("--run-spec", default=None, help=argparse.SUPPRESS)
    args = ap.parse_args()
    if args.run_spec:
        import json

        run_spec(json.loads(args.run_spec))
        return 0
    only = [s for s in args.only.split(",") if s]
    bad = [s for s in only if s not in SECTIONS]
    if bad:
        ap.error(f"--only: unknown section(s) {bad}; choose from {', '.join(SECTIONS)}")
    args.read_sizes = [int(x) for x in args.read_sizes.split(",")]
    args.grain_bins = [int(x) for x in args.grain_bins.split(",")]
    args.rows_batch = [int(x) for x in args.rows_batch.split(",")]
    if args.quick:
        args.docs, args.runs = 2000, 1
        args.read_sizes, args.grain_bins = args.read_sizes[:1], args.grain_bins[:1]
    args.dir = os.path.abspath(args.dir)
    total = generate(args.dir, args.docs, args.seq_len)
    skip = {"grain": available("grain.experimental"), "trl": available("trl")}
    L, B = args.seq_len, args.batch
    print(
        f"# packing benchmarks: {args.docs:,} documents, lengths uniform in [1, {L}], "
        f"{total:,} tokens; [{B}, {L}] batches; {args.runs} run(s) each; "
        f"1-min load at start {benchlib.load1():.2f} (cpus {os.cpu_count()})"
    )
    for lib, why in skip.items():
        if why:
            print(f"{lib}: not installed, its rows are skipped: {why}")
    base = {"kind": "pass", "dir": args.dir, "seq_len": L, "batch": B}
    results: dict = {"docs": args.docs, "tokens": total, "seq_len": L, "batch": B}
    if "throughput" in only:
        section_throughput(args, base, skip, results)
    if "resume" in only:
        section_resume(args, base, skip, max(2, total // (L * B)), results)
    if "loader" in only:
        section_loader(args, base, results)
    if "mixture" in only:
        section_mixture(args, base, results)
    if "callgrind" in only:
        section_callgrind(args, skip, results)
    print(f"\n1-min load at the end {benchlib.load1():.2f}")
    benchlib.write_json(results, args.json)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
