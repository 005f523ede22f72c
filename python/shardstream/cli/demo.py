"""End-to-end resume demo: ``python -m shardstream demo [--rows N] [--dir D]``.

1. Writes a small synthetic shard set (``shardstream.datagen.write_shards``).
2. Runs the *uninterrupted* reference stream through a torchdata ``StatefulDataLoader``
   (2 workers, shuffled) and records every row id.
3. Runs the same "training loop" again, stops mid-epoch, and checkpoints the loader
   state with ``torch.save``.
4. Starts a NEW Python process which ``torch.load``s the checkpoint, restores the loader
   with ``load_state_dict``, times load -> first batch, and trains to the end of the epoch.
5. Checks that ids(before) + ids(after) == ids(reference) and that every row was seen
   exactly once; exits 1 otherwise.

Only the public API (``ParquetStream``, ``state_dict``/``load_state_dict``) is used.
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import tempfile
import time
import warnings
from typing import Any

import numpy as np

from ._common import (
    MAX_ROWS,
    MAX_SEED,
    MAX_SHUFFLE_BUFFER,
    MAX_WORKERS,
    add_data_arguments,
    check_rows,
    fraction,
    int_in,
    plain_text,
    write_fresh_shards,
)

DEFAULTS: dict[str, Any] = {
    "rows": 200_000,
    "shards": 8,
    "batch_size": 256,
    "shuffle_buffer": 10_000,
    "seed": 1234,
    "workers": 2,
    "stop_at": 0.4,
}


def add_arguments(p: argparse.ArgumentParser) -> None:
    add_data_arguments(p, rows=DEFAULTS["rows"], shards=DEFAULTS["shards"])
    p.add_argument(
        "--dir",
        default=None,
        help="directory for the generated shards (default: a temporary directory)",
    )
    p.add_argument("--batch-size", type=int_in(1, MAX_ROWS), default=DEFAULTS["batch_size"])
    p.add_argument(
        "--shuffle-buffer", type=int_in(0, MAX_SHUFFLE_BUFFER), default=DEFAULTS["shuffle_buffer"]
    )
    p.add_argument("--seed", type=int_in(0, MAX_SEED), default=DEFAULTS["seed"])
    p.add_argument(
        "--workers",
        type=int_in(0, MAX_WORKERS),
        default=DEFAULTS["workers"],
        help="DataLoader workers (%(default)s)",
    )
    p.add_argument(
        "--stop-at",
        type=fraction,
        default=DEFAULTS["stop_at"],
        help="interrupt after this fraction of the epoch's batches, strictly between 0 and 1 "
        "(%(default)s)",
    )
    # Internal: the resumed half runs in a fresh interpreter.
    p.add_argument("--resume-child", action="store_true", help=argparse.SUPPRESS)
    p.add_argument("--ckpt", default=None, help=argparse.SUPPRESS)
    p.add_argument("--out", default=None, help=argparse.SUPPRESS)


# --------------------------------------------------------------------------- helpers


def _require_torch() -> None:
    try:
        import torch  # noqa: F401
        from torchdata.stateful_dataloader import StatefulDataLoader  # noqa: F401
    except ImportError as e:  # pragma: no cover - depends on the environment
        raise SystemExit(
            f"the demo needs torch and torchdata ({e}); "
            "install them with: pip install 'shardstream[torch]'"
        ) from e


def _make_dataset(data_dir: str, args: argparse.Namespace) -> Any:
    from shardstream import ParquetStream

    return ParquetStream(
        data_dir,
        columns=["id", "tokens"],
        batch_size=args.batch_size,
        shuffle_buffer=args.shuffle_buffer,
        seed=args.seed,
    )


def _make_loader(data_dir: str, args: argparse.Namespace) -> Any:
    from torchdata.stateful_dataloader import StatefulDataLoader

    # batch_size=None: the dataset already yields batches; each worker reads its own slot.
    return StatefulDataLoader(
        _make_dataset(data_dir, args), batch_size=None, num_workers=args.workers
    )


def _train_step(batch: dict[str, Any]) -> tuple[np.ndarray, int]:
    """The "training step": return the batch's row ids and count its tokens."""
    ids = np.asarray(batch["id"], dtype=np.int64)
    n_tokens = sum(len(t) for t in batch["tokens"])
    return ids, n_tokens


def _cat(chunks: list[np.ndarray]) -> np.ndarray:
    return np.concatenate(chunks) if chunks else np.zeros(0, dtype=np.int64)


def _prepare_data(args: argparse.Namespace, data_dir: str) -> int:
    t = time.perf_counter()
    desc = "[data]      writing shards"
    write_fresh_shards(data_dir, args.rows, args.shards, desc=desc, seed=args.seed)
    print(
        f"[data]      wrote {args.rows:,} rows in {args.shards} shards to {data_dir} "
        f"(list<int32> tokens, zstd, page index) in {time.perf_counter() - t:.1f}s"
    )
    return args.rows


# --------------------------------------------------------------------------- child


def _resume_child(args: argparse.Namespace) -> int:
    """Runs in a fresh interpreter: restore the loader and finish the epoch."""
    import torch

    t_import = time.perf_counter()
    ckpt = torch.load(args.ckpt, weights_only=True)

    # For scale: a fresh (not resumed) start of the same loader to its first batch.
    # One unmeasured start first pays this process's one-off warm-up (lazy imports,
    # first fork), so neither measured start below is flattered by running second.
    fresh_s = 0.0
    for _ in range(2):
        fresh = _make_loader(args.dir, args)
        t1 = time.perf_counter()
        it0 = iter(fresh)
        next(it0)
        fresh_s = time.perf_counter() - t1
        del it0, fresh

    loader = _make_loader(args.dir, args)
    t0 = time.perf_counter()
    loader.load_state_dict(ckpt["loader"])
    it = iter(loader)
    first = next(it, None)
    resume_s = time.perf_counter() - t0

    chunks: list[np.ndarray] = []
    steps = 0
    tokens = 0
    batch = first
    while batch is not None:
        ids, n = _train_step(batch)
        chunks.append(ids)
        tokens += n
        steps += 1
        batch = next(it, None)
    ids_after = _cat(chunks)
    del it, loader

    np.save(args.out + ".ids.npy", ids_after)
    with open(args.out + ".json", "w") as f:
        json.dump(
            {
                "resume_ms": resume_s * 1e3,
                "fresh_start_ms": fresh_s * 1e3,
                "steps": steps,
                "tokens": tokens,
                "child_s": time.perf_counter() - t_import,
            },
            f,
        )
    return 0


# --------------------------------------------------------------------------- parent


def _run_epoch(loader: Any, stop_after: int | None = None) -> tuple[np.ndarray, int, Any]:
    """Iterate the loader; if stop_after is given, stop after that many batches and
    return the loader's state_dict taken right there."""
    chunks: list[np.ndarray] = []
    steps = 0
    state = None
    for batch in loader:
        ids, _ = _train_step(batch)
        chunks.append(ids)
        steps += 1
        if stop_after is not None and steps >= stop_after:
            state = loader.state_dict()
            break
    return _cat(chunks), steps, state


def run(args: argparse.Namespace) -> int:
    check_rows(args)
    _require_torch()
    # torchdata calls a deprecated torch API on some version pairs; not ours, keep output clean.
    warnings.filterwarnings("ignore", message=".*set_vital.*")
    if args.resume_child:
        return _resume_child(args)

    import torch

    import shardstream

    t_start = time.perf_counter()
    tmp = None
    if args.dir is None:
        tmp = tempfile.TemporaryDirectory(prefix="shardstream-demo-")
        data_dir = tmp.name
    else:
        data_dir = os.path.abspath(args.dir)
        os.makedirs(data_dir, exist_ok=True)
    work = tempfile.TemporaryDirectory(prefix="shardstream-demo-ckpt-")
    try:
        total = _prepare_data(args, data_dir)
        ds = _make_dataset(data_dir, args)
        print(
            f"[dataset]   ParquetStream: {ds.num_rows:,} rows, {len(ds.shards)} shards, "
            f"batch_size={args.batch_size}, shuffle_buffer={args.shuffle_buffer:,}, "
            f"seed={args.seed}; StatefulDataLoader(num_workers={args.workers}) "
            f"[shardstream {getattr(shardstream, '__version__', '?')}]"
        )

        # 1) Reference: one uninterrupted epoch.
        t = time.perf_counter()
        ref, n_batches, _ = _run_epoch(_make_loader(data_dir, args))
        print(
            f"[reference] uninterrupted epoch: {len(ref):,} rows in {n_batches} batches "
            f"({time.perf_counter() - t:.1f}s)"
        )

        # 2) Interrupted run: stop mid-epoch and checkpoint the loader.
        stop_after = max(1, min(n_batches - 1, int(n_batches * args.stop_at)))
        before, steps, state = _run_epoch(_make_loader(data_dir, args), stop_after=stop_after)
        ckpt = os.path.join(work.name, "ckpt.pt")
        torch.save({"loader": state, "step": steps}, ckpt)
        print(
            f"[interrupt] stopped after {steps} batches = {len(before):,} rows; "
            f"loader state saved with torch.save ({os.path.getsize(ckpt):,} bytes)"
        )

        # 3) Resume in a brand-new process.
        out = os.path.join(work.name, "child")
        cmd = [
            sys.executable, "-m", "shardstream", "demo", "--resume-child",
            "--dir", data_dir, "--ckpt", ckpt, "--out", out,
            "--rows", str(args.rows), "--shards", str(args.shards),
            "--batch-size", str(args.batch_size), "--shuffle-buffer", str(args.shuffle_buffer),
            "--seed", str(args.seed), "--workers", str(args.workers),
        ]  # fmt: skip
        t = time.perf_counter()
        proc = subprocess.run(cmd, check=False)
        if proc.returncode != 0:
            print(f"FAIL: resume child exited with {proc.returncode}", file=sys.stderr)
            return 1
        after = np.load(out + ".ids.npy")
        with open(out + ".json") as f:
            info = json.load(f)
        print(
            f"[resume]    new process (pid != {os.getpid()}) restored the loader and read "
            f"{len(after):,} rows in {info['steps']} batches ({time.perf_counter() - t:.1f}s "
            "incl. interpreter + torch import)"
        )

        # 4) Verdict.
        combined = np.concatenate([before, after])
        same = len(combined) == len(ref) and bool(np.array_equal(combined, ref))
        counts = np.bincount(combined, minlength=total) if len(combined) else np.zeros(total)
        exactly_once = len(counts) == total and bool(np.all(counts == 1))
        print()
        print("  rows before interrupt     :", f"{len(before):,}")
        print("  rows after resume         :", f"{len(after):,}")
        print("  total / expected          :", f"{len(combined):,} / {total:,}")
        print(
            "  before+after == reference :",
            "YES (identical id sequence)" if same else "NO  <-- MISMATCH",
        )
        print(
            "  every row exactly once    :",
            "YES"
            if exactly_once
            else f"NO  (missing {int(np.sum(counts == 0))}, dup {int(np.sum(counts > 1))})",
        )
        print(
            "  resume time               :",
            f"{info['resume_ms']:.1f} ms  (load_state_dict -> first batch, incl. starting "
            f"{args.workers} workers; fresh start of the loader: {info['fresh_start_ms']:.1f} ms)",
        )
        print(f"  demo wall time            : {time.perf_counter() - t_start:.1f}s")
        if not (same and exactly_once):
            if not same:
                diff = np.flatnonzero(
                    combined[: min(len(combined), len(ref))] != ref[: min(len(combined), len(ref))]
                )
                where = int(diff[0]) if len(diff) else min(len(combined), len(ref))
                print(f"FAIL: streams diverge at position {where:,}", file=sys.stderr)
            return 1
        print("\nOK: exact resume verified")
        return 0
    finally:
        work.cleanup()
        if tmp is not None:
            tmp.cleanup()


def add_parser(sub: Any) -> None:
    p = sub.add_parser(
        "demo",
        help="generate shards, interrupt a DataLoader mid-epoch, resume it in a new process "
        "and verify the stream is identical",
        description=plain_text(__doc__),
        formatter_class=argparse.RawDescriptionHelpFormatter,
    )
    add_arguments(p)
    p.set_defaults(run=run)
