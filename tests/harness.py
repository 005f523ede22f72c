"""Shared helpers: id extraction for every output mode and THE resume harness.

The resume harness is in the spirit of torchdata's ``run_test_save_load_state``:

1. build a dataset from ``(source, settings)`` and record the uninterrupted stream as a
   list of keys (an ``int`` id per row in row mode, a ``tuple`` of ids per batch in batch
   mode, so batch boundaries are compared too);
2. for many interrupt points ``k`` (0, row-group / shard / epoch boundaries, mid row group,
   last item, after the last item, random points) take ``state_dict()`` after ``k`` items,
   build a FRESH dataset with the same settings, ``load_state_dict`` and iterate to the end;
3. assert ``uninterrupted[:k] + resumed == uninterrupted`` (full key streams).

Plus: the same state resumed twice gives identical results, a resumed run can be
interrupted and resumed again, and every state survives ``torch.save`` /
``torch.load(weights_only=True)`` and ``pickle`` unchanged.
"""

from __future__ import annotations

import base64
import copy
import io
import itertools
import json
import os
import pickle
import random
import re
import subprocess
import sys
import textwrap
from collections import Counter
from collections.abc import Iterable, Iterator
from typing import Any

import numpy as np
import pyarrow as pa
import pyarrow.parquet as pq
import torch
from shardstream import ParquetStream

TESTS_DIR = os.path.dirname(os.path.abspath(__file__))


# --------------------------------------------------------------------------- ids


def scalar_int(v: Any) -> int:
    """An int from whatever a row-mode id value is in any output mode."""
    if isinstance(v, bool):
        raise TypeError(f"id is a bool: {v!r}")
    if isinstance(v, int):
        return v
    if isinstance(v, torch.Tensor):
        assert v.dim() == 0, f"row-mode id tensor must be 0-d, got shape {tuple(v.shape)}"
        return int(v.item())
    if isinstance(v, np.generic):
        return int(v)
    if isinstance(v, np.ndarray) and v.ndim == 0:
        return int(v)
    if isinstance(v, pa.Scalar):
        return int(v.as_py())
    raise TypeError(f"cannot read an integer id from {type(v).__name__}: {v!r}")


def item_key(item: Any, batched: bool) -> int | tuple[int, ...]:
    """``int`` id of a row item, ``tuple`` of ids of a batch item (any output mode)."""
    if isinstance(item, pa.RecordBatch):
        ids = item.column(item.schema.get_field_index("id")).to_pylist()
        if not batched:
            assert len(ids) == 1, f"row-mode arrow output must be a 1-row batch, got {len(ids)}"
            return int(ids[0])
        return tuple(int(i) for i in ids)
    if not isinstance(item, dict):
        raise TypeError(f"expected dict or pyarrow.RecordBatch, got {type(item).__name__}")
    v = item["id"]
    if not batched:
        return scalar_int(v)
    if isinstance(v, torch.Tensor):
        assert v.dim() == 1, f"batch id tensor must be 1-D, got shape {tuple(v.shape)}"
        return tuple(int(x) for x in v.tolist())
    if isinstance(v, np.ndarray):
        assert v.ndim == 1, f"batch id array must be 1-D, got shape {v.shape}"
        return tuple(int(x) for x in v.tolist())
    if isinstance(v, list):
        return tuple(scalar_int(x) for x in v)
    raise TypeError(f"cannot read batch ids from {type(v).__name__}")


def is_batched(settings: dict) -> bool:
    return settings.get("batch_size") is not None


def keys_of(items: Iterable[Any], batched: bool) -> list:
    return [item_key(x, batched) for x in items]


def flat_ids(keys: Iterable) -> list[int]:
    out: list[int] = []
    for k in keys:
        if isinstance(k, tuple):
            out.extend(k)
        else:
            out.append(k)
    return out


def make_ds(source: Any, settings: dict) -> ParquetStream:
    return ParquetStream(source, **settings)


def full_stream(source: Any, settings: dict) -> list:
    return keys_of(make_ds(source, settings), is_batched(settings))


def take(it: Iterator, k: int) -> list:
    out = list(itertools.islice(it, k))
    assert len(out) == k, f"stream ended after {len(out)} items, wanted {k}"
    return out


# ------------------------------------------------------------------- layouts


def ipc_batches(path: str) -> list[pa.RecordBatch] | None:
    """The record batches of an Arrow IPC file or stream (by magic bytes); None for Parquet."""
    with open(path, "rb") as f:
        head = f.read(6)
    if head == b"ARROW1":
        with pa.ipc.open_file(path) as r:
            return [r.get_batch(i) for i in range(r.num_record_batches)]
    if head[:4] != b"PAR1":  # a stream (before format 0.15: no 0xFFFFFFFF marker)
        with pa.ipc.open_stream(path) as r:
            return list(r)
    return None


def row_group_layout(paths: Iterable[str]) -> list[list[int]]:
    """Row-group (IPC: record batch) sizes per shard (shards in the given order)."""
    out = []
    for p in paths:
        batches = ipc_batches(p)
        if batches is not None:
            out.append([b.num_rows for b in batches])
            continue
        md = pq.ParquetFile(p).metadata
        out.append([md.row_group(i).num_rows for i in range(md.num_row_groups)])
    return out


def all_ids(paths: Iterable[str]) -> list[int]:
    ids: list[int] = []
    for p in paths:
        batches = ipc_batches(p)
        if batches is not None:
            ids.extend(i for b in batches for i in b.column("id").to_pylist())
            continue
        ids.extend(pq.read_table(p, columns=["id"]).column("id").to_pylist())
    return ids


def items_per_epoch(num_rows: int, batch_size: int | None, drop_last: bool) -> int:
    if batch_size is None:
        return num_rows
    return num_rows // batch_size if drop_last else -(-num_rows // batch_size)


def check_epochs(full: list, paths: list[str], settings: dict) -> None:
    """Every row exactly once per epoch (at most once and only full batches when drop_last)."""
    ids = all_ids(paths)
    bs = settings.get("batch_size")
    drop_last = settings.get("drop_last", False)
    epochs = settings.get("epochs", 1)
    per = items_per_epoch(len(ids), bs, drop_last)
    assert len(full) == per * epochs, (
        f"expected {epochs} epochs x {per} items, got {len(full)} items"
    )
    want = Counter(ids)
    for e in range(epochs):
        chunk = full[e * per : (e + 1) * per]
        got = Counter(flat_ids(chunk))
        if bs is not None:
            sizes = [len(b) for b in chunk]
            if drop_last:
                assert all(s == bs for s in sizes), f"epoch {e}: batch sizes {sizes}"
                assert not (got - want), f"epoch {e}: unexpected/duplicate ids {got - want}"
                assert sum(got.values()) == per * bs
                continue
            assert all(s == bs for s in sizes[:-1]) and (not sizes or 1 <= sizes[-1] <= bs), (
                f"epoch {e}: batch sizes {sizes}"
            )
        assert got == want, (
            f"epoch {e}: missing {sorted((want - got).elements())[:20]} "
            f"extra {sorted((got - want).elements())[:20]}"
        )


def interrupt_points(
    n_items: int,
    paths: list[str],
    settings: dict,
    *,
    n_random: int = 4,
    max_boundary_points: int = 16,
    rng_seed: int = 0,
) -> list[int]:
    """0, 1, middle, last item, after the last item, epoch boundaries (+-1), every row-group and
    shard boundary of the first epoch, a sample of (boundary + 1) and mid-row-group positions,
    random points."""
    rnd = random.Random(rng_seed)
    bs = settings.get("batch_size")
    drop_last = settings.get("drop_last", False)
    epochs = settings.get("epochs", 1)
    layout = row_group_layout(paths)
    num_rows = sum(map(sum, layout))
    per = items_per_epoch(num_rows, bs, drop_last)
    essential = {0, 1, n_items // 2, n_items - 1, n_items}
    for e in range(1, (epochs or 1) + 1):
        essential |= {e * per - 1, e * per, e * per + 1}
    # every row-group / shard end of the first epoch is always a point; the item after it
    # and mid-row-group positions are sampled
    boundary: set[int] = set()
    row = 0
    for shard in layout:
        for size in shard:
            mid = row + size // 2
            row += size
            essential.add(row if bs is None else row // bs)
            for r in (row, mid):
                k = r if bs is None else r // bs
                boundary |= {k, k + 1}
    boundary -= essential
    boundary_list = sorted(boundary)
    if len(boundary_list) > max_boundary_points:
        boundary_list = rnd.sample(boundary_list, max_boundary_points)
    pts = essential | set(boundary_list)
    pts |= {rnd.randint(0, n_items) for _ in range(n_random)}
    return sorted(p for p in pts if 0 <= p <= n_items)


# ------------------------------------------------------------- serialization


def torch_roundtrip(state: Any) -> Any:
    buf = io.BytesIO()
    torch.save(state, buf)
    buf.seek(0)
    return torch.load(buf, weights_only=True)


def pickle_roundtrip(state: Any) -> Any:
    return pickle.loads(pickle.dumps(state, protocol=pickle.HIGHEST_PROTOCOL))


def as_version_2(state: dict) -> dict:
    """A stream state (version 3) as shardstream wrote it before 2026-12-02 (version 2): the
    same, with the buffer's row ids as base64 text instead of Latin-1 text."""
    st = copy.deepcopy(state)
    assert st["version"] == 3, st["version"]
    if st["position"] is not None:
        raw = st["position"]["buffer"].encode("latin-1")
        st["position"]["buffer"] = base64.b64encode(raw).decode("ascii")
    st["version"] = 2
    return st


# ----------------------------------------------------------------- harness


def resume_rest(source: Any, settings: dict, state: Any) -> list:
    ds = make_ds(source, settings)
    ds.load_state_dict(state)
    return keys_of(ds, is_batched(settings))


def states_along(source: Any, settings: dict, points: list[int]) -> tuple[list, dict[int, Any]]:
    """Iterate once, taking ``state_dict()`` after each point; return the stream and states.

    States are deep-copied at capture time *and* kept as returned, so a state object that is
    later mutated by the dataset (a live view instead of a snapshot) is detected.
    """
    batched = is_batched(settings)
    ds = make_ds(source, settings)
    want = set(points)
    states: dict[int, Any] = {}
    raw: dict[int, Any] = {}
    stream: list = []
    if 0 in want:
        raw[0] = ds.state_dict()
        states[0] = copy.deepcopy(raw[0])
    it = iter(ds)
    top = max(points) if points else 0
    while len(stream) < top:
        try:
            item = next(it)
        except StopIteration:
            break
        stream.append(item_key(item, batched))
        k = len(stream)
        if k in want:
            raw[k] = ds.state_dict()
            states[k] = copy.deepcopy(raw[k])
    for k in states:
        assert raw[k] == states[k], f"state taken after {k} items changed later (not a snapshot)"
    return stream, states


def check_resume(
    source: Any,
    settings: dict,
    *,
    points: list[int] | None = None,
    n_random: int = 4,
    max_boundary_points: int = 16,
    rng_seed: int = 0,
    check_coverage: bool = True,
    nested: bool = True,
    twice: bool = True,
) -> list:
    """Run the full resume check; returns the uninterrupted stream (list of keys)."""
    ds0 = make_ds(source, settings)
    paths = list(ds0.shards)
    full = keys_of(ds0, is_batched(settings))
    if check_coverage:
        check_epochs(full, paths, settings)
    n = len(full)
    if points is None:
        points = interrupt_points(
            n,
            paths,
            settings,
            n_random=n_random,
            max_boundary_points=max_boundary_points,
            rng_seed=rng_seed,
        )
    stream, states = states_along(source, settings, points)
    assert stream == full[: len(stream)], "calling state_dict() while iterating changed the stream"
    for i, k in enumerate(points):
        state = states[k]
        t_state = torch_roundtrip(state)
        p_state = pickle_roundtrip(state)
        assert t_state == state, f"k={k}: state changed through torch.save/torch.load(weights_only)"
        assert p_state == state, f"k={k}: state changed through pickle"
        use = (state, t_state, p_state)[i % 3]
        rest = resume_rest(source, settings, use)
        if full[:k] + rest != full:
            raise AssertionError(_diff_msg(settings, k, full, rest))
    mids = [k for k in points if 0 < k < n]
    chosen = sorted({mids[0], mids[len(mids) // 2], mids[-1]}) if mids else []
    for k in chosen:
        state = states[k]
        if twice:
            a = resume_rest(source, settings, state)
            b = resume_rest(source, settings, state)
            assert a == b == full[k:], f"k={k}: resuming the same state twice differed"
            # same object loaded twice in a row
            ds = make_ds(source, settings)
            ds.load_state_dict(state)
            a = keys_of(ds, is_batched(settings))
            ds.load_state_dict(state)
            b = keys_of(ds, is_batched(settings))
            assert a == b == full[k:], f"k={k}: re-loading into the same object differed"
        if nested:
            j = max(1, (n - k) // 2)
            ds = make_ds(source, settings)
            ds.load_state_dict(torch_roundtrip(state))
            it = iter(ds)
            part = keys_of(take(it, j), is_batched(settings))
            state2 = torch_roundtrip(ds.state_dict())
            rest = resume_rest(source, settings, state2)
            got = full[:k] + part + rest
            if got != full:
                raise AssertionError(
                    f"resume of a resumed run (k={k}, j={j}) differs: "
                    + _diff_msg(settings, k + j, full, part + rest, base=k)
                )
    return full


def _diff_msg(settings: dict, k: int, full: list, rest: list, base: int | None = None) -> str:
    base = k if base is None else base
    expect = full[base:]
    pairs = enumerate(zip(expect, rest, strict=False))
    i = next((i for i, (a, b) in pairs if a != b), min(len(expect), len(rest)))
    return (
        f"settings={settings} interrupt k={k}: resumed stream differs at resumed item {i} "
        f"(stream item {base + i}); expected {len(expect)} items, got {len(rest)}; "
        f"expected[{i}:{i + 2}]={_short(expect[i : i + 2])} "
        f"got[{i}:{i + 2}]={_short(rest[i : i + 2])}"
    )


def _short(x: Any, n: int = 240) -> str:
    r = repr(x)
    return r if len(r) <= n else r[:n] + "..."


# -------------------------------------------------------------- subprocess

_CHILD = textwrap.dedent(
    """
    import json, sys
    sys.path.insert(0, {tests_dir!r})
    import torch
    from harness import make_ds, keys_of, is_batched
    spec = json.load(open(sys.argv[1]))
    ds = make_ds(spec["source"], spec["settings"])
    if spec["state_file"] is not None:
        ds.load_state_dict(torch.load(spec["state_file"], weights_only=True))
    keys = keys_of(ds, is_batched(spec["settings"]))
    print("RESULT" + json.dumps(keys))
    """
)


def run_child(tmp_dir: str, source: Any, settings: dict, state: Any = None, tag: str = "c") -> list:
    """In a fresh interpreter: build the dataset, optionally load ``state`` (written with
    torch.save), iterate to the end and return the keys."""
    state_file = None
    if state is not None:
        state_file = os.path.join(tmp_dir, f"{tag}-state.pt")
        torch.save(state, state_file)
    spec_file = os.path.join(tmp_dir, f"{tag}-spec.json")
    with open(spec_file, "w") as f:
        json.dump({"source": source, "settings": settings, "state_file": state_file}, f)
    code = _CHILD.format(tests_dir=TESTS_DIR)
    proc = subprocess.run(
        [sys.executable, "-c", code, spec_file],
        capture_output=True,
        text=True,
        timeout=240,
    )
    assert proc.returncode == 0, f"child failed ({proc.returncode}):\n{proc.stderr[-3000:]}"
    line = [ln for ln in proc.stdout.splitlines() if ln.startswith("RESULT")][-1]
    keys = json.loads(line[len("RESULT") :])
    return [tuple(k) if isinstance(k, list) else k for k in keys]


# ------------------------------------------------------------------ multi-process jobs


def child_env() -> dict:
    """Environment for a job's processes: no rank variables of ours leak in, one thread each,
    the tests directory importable (``harness``)."""
    env = dict(os.environ)
    for var in (
        "RANK",
        "WORLD_SIZE",
        "LOCAL_RANK",
        "LOCAL_WORLD_SIZE",
        "MASTER_ADDR",
        "MASTER_PORT",
        "GROUP_RANK",
        "ROLE_RANK",
        "TORCHELASTIC_RUN_ID",
    ):
        env.pop(var, None)
    env["OMP_NUM_THREADS"] = "1"
    env["PYTHONPATH"] = os.pathsep.join([TESTS_DIR] + [p for p in [env.get("PYTHONPATH")] if p])
    return env


def torchrun(nproc: int, script: str, *args: str, env: dict | None = None, timeout: int = 300):
    """Run ``script args`` in ``nproc`` processes under torchrun (``--standalone`` picks a free
    port); fails the test with the output's tail unless every process exits 0."""
    cmd = [sys.executable, "-m", "torch.distributed.run", "--standalone"]
    cmd += [f"--nproc_per_node={nproc}", script, *args]
    proc = subprocess.run(
        cmd, capture_output=True, text=True, timeout=timeout, env={**child_env(), **(env or {})}
    )
    # Each rank's exception line first: torchrun's own summary fills the tail.
    raised = [ln for ln in proc.stderr.splitlines() if re.match(r"\[rank\d+\]: \w[\w.]*: ", ln)]
    assert proc.returncode == 0, (
        f"torchrun {os.path.basename(script)} {' '.join(args)} failed ({proc.returncode}):\n"
        + "\n".join(raised[-8:])
        + f"\n{proc.stdout[-3000:]}\n{proc.stderr[-6000:]}"
    )
    return proc


# ------------------------------------------------------------------ states


def walk(obj: Any, path: tuple = ()) -> Iterator[tuple[tuple, Any]]:
    """(path, value) for every node of a nested dict/list state."""
    yield path, obj
    if isinstance(obj, dict):
        for k, v in obj.items():
            yield from walk(v, path + (k,))
    elif isinstance(obj, (list, tuple)):
        for i, v in enumerate(obj):
            yield from walk(v, path + (i,))


def get_path(obj: Any, path: tuple) -> Any:
    for p in path:
        obj = obj[p]
    return obj


def set_path(obj: Any, path: tuple, value: Any) -> Any:
    """A deep copy of ``obj`` with the node at ``path`` replaced."""
    out = copy.deepcopy(obj)
    parent = get_path(out, path[:-1])
    parent[path[-1]] = value
    return out


def del_path(obj: Any, path: tuple) -> Any:
    out = copy.deepcopy(obj)
    parent = get_path(out, path[:-1])
    del parent[path[-1]]
    return out
