"""Reliability 2 and 3: byte-level fuzzing of Parquet files, and hostile states.

* ``test_byte_fuzz`` runs tests/reliability/scripts/fuzz_files.py in a subprocess (address
  space capped, per-case watchdog, crash and hang detection; see that file) and checks its
  report. Length: ``SHARDSTREAM_FUZZ_EXAMPLES`` cases (default 1500) or
  ``SHARDSTREAM_FUZZ_SECONDS`` (default 45) whichever comes first; seed
  ``SHARDSTREAM_FUZZ_SEED`` (default fixed, so CI is reproducible; ``random`` for a fresh one).
* ``test_hostile_states`` mutates real ``state_dict()`` output with hypothesis (ints, types,
  keys, base64 buffers, fields swapped between real states or taken from another dataset's
  state, wrong versions, nested garbage) and loads it: the load either raises ``StateError``
  (a ``ShardstreamError``) with a message, or the stream it gives is one a valid state could
  give (the state round-trips; no row repeats within an epoch; every later epoch is complete).
  ``SHARDSTREAM_STATE_FUZZ_EXAMPLES`` (default 250 per setting).
"""

from __future__ import annotations

import base64
import copy
import json
import os
import random
import subprocess
import sys
from collections import Counter
from typing import Any

import numpy as np
import pytest
from harness import TESTS_DIR, flat_ids, keys_of, make_ds, take, walk
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st
from shardstream import ShardstreamError, StateError

SCRIPT = os.path.join(TESTS_DIR, "reliability", "scripts", "fuzz_files.py")


def _env_int(name: str, default: int) -> int:
    return int(os.environ.get(name, default))


# ------------------------------------------------------------------------------ file bytes


@pytest.mark.timeout(900)
def test_byte_fuzz(tmp_path):
    examples = _env_int("SHARDSTREAM_FUZZ_EXAMPLES", 1500)
    seconds = float(os.environ.get("SHARDSTREAM_FUZZ_SECONDS", 45))
    seed = os.environ.get("SHARDSTREAM_FUZZ_SEED", "20260601")
    report = tmp_path / "report.json"
    cmd = [
        sys.executable,
        SCRIPT,
        "--work",
        str(tmp_path / "work"),
        "--examples",
        str(examples),
        "--max-seconds",
        str(seconds),
        "--case-timeout",
        "60",
        "--mem-gib",
        "4",
        "--report",
        str(report),
    ]
    if seed != "random":
        cmd += ["--seed", seed]
    env = dict(os.environ, RUST_BACKTRACE="0")
    proc = subprocess.run(
        cmd, capture_output=True, text=True, timeout=seconds + 600, env=env, check=False
    )
    current = tmp_path / "work" / "current.json"
    if proc.returncode != 0:
        case = current.read_text() if current.exists() else "(none)"
        how = f"killed by signal {-proc.returncode}" if proc.returncode < 0 else "failed"
        # Drop the Rust panic-hook lines (caught panics print them; they are counted).
        err = "\n".join(
            ln
            for ln in proc.stderr.splitlines()
            if not ln.startswith(("thread '", "note: run with"))
        )
        pytest.fail(
            f"fuzzer {how} (exit {proc.returncode}); last case (replay with "
            f"`{sys.executable} {SCRIPT} --work DIR --report R --replay current.json`):\n"
            f"{case}\n--- stderr (tail) ---\n{err[-6000:]}"
        )
    r = json.loads(report.read_text())
    counts = r["counts"]
    print(f"\nbyte fuzz: {json.dumps(counts, sort_keys=True)}")
    # Enough cases for the run to mean something, within the time box.
    assert counts["examples"] >= min(examples, 300), counts
    # Every outcome kind that shows the fuzzer reaches the decoder was seen.
    assert counts.get("resume:rows", 0) > 0 and counts.get("error:ShardError", 0) > 0, counts
    assert counts.get("equal to pyarrow", 0) > 0, counts
    # Memory stayed flat: no growth across cases (RSS of the last sample vs the first).
    samples = r["process"]
    if len(samples) >= 2:
        grow = samples[-1]["VmRSS"] - samples[0]["VmRSS"]
        assert grow < 300 * 1024, f"RSS grew by {grow} KiB over the fuzz run: {samples}"
        assert samples[-1]["Threads"] <= samples[0]["Threads"] + 2, samples


# --------------------------------------------------------------------------- hostile states

STATE_SETTINGS = {
    "shuffled-batches": dict(output="python", shuffle_buffer=7, seed=3, batch_size=5, epochs=2),
    "shuffled-rows": dict(output="python", shuffle_buffer=40, seed=9, epochs=2),
    "sequential-rows": dict(output="python", epochs=2),
}


class _Ctx:
    """Real states of one setting: along one uninterrupted run, from another dataset, from
    another layout (rank 1 of 2)."""

    def __init__(self, small, tiny, settings: dict):
        self.root = small.root
        self.settings = dict(settings, columns=["id"])
        self.batched = settings.get("batch_size") is not None
        self.ids = Counter(small.ids)
        self.n = len(small.ids)
        ds = make_ds(self.root, self.settings)
        self.states: list[Any] = [copy.deepcopy(ds.state_dict())]
        full = []
        for item in ds:
            full.append(item)
            self.states.append(copy.deepcopy(ds.state_dict()))
        self.full = keys_of(full, self.batched)
        self.full_ids = flat_ids(self.full)
        other = make_ds(tiny.root, self.settings)
        take(iter(other), 3)
        self.other_dataset = copy.deepcopy(other.state_dict())
        r1 = make_ds(self.root, dict(self.settings, rank=1, world_size=2, even=None))
        take(iter(r1), 2)
        self.other_layout = copy.deepcopy(r1.state_dict())


@pytest.fixture(scope="module")
def state_ctx(small, tiny):
    return {name: _Ctx(small, tiny, s) for name, s in STATE_SETTINGS.items()}


def _leaves(state: Any) -> list[tuple]:
    return [p for p, _ in walk(state) if p]


def _set(obj: Any, path: tuple, value: Any) -> None:
    for p in path[:-1]:
        obj = obj[p]
    if isinstance(obj, tuple):
        return  # inside a tuple an earlier "type" mutation put there: immutable, left as is
    obj[path[-1]] = value


def _get(obj: Any, path: tuple) -> Any:
    for p in path:
        obj = obj[p]
    return obj


def _b64_variants(v: str, rnd: random.Random, n_rows: int) -> list[str]:
    """Truncations, a flipped character, and re-encoded buffers with ids changed."""
    out = [v[:-1], v[: len(v) // 2], v + "A", v.replace("A", "B", 1), "!" + v[1:]]
    try:
        raw = base64.b64decode(v, validate=True)
    except Exception:  # noqa: BLE001 - not base64: the string variants are enough
        return out
    ids = [int.from_bytes(raw[i : i + 8], "little") for i in range(0, len(raw) - 7, 8)]
    muts = []
    if ids:
        j = rnd.randrange(len(ids))
        muts.append(ids[:j] + [ids[j] ^ 1] + ids[j + 1 :])  # another (maybe valid) row
        muts.append(ids + [ids[0]])  # a duplicate
        muts.append(ids[::-1])  # same rows, other order
        muts.append(ids[:-1])  # one row short
        muts.append(ids[:j] + [rnd.randrange(n_rows)] + ids[j + 1 :])  # a random real row
    muts.append(ids + [n_rows + 5])  # a row outside the dataset
    muts.append(ids + [2**64 - 1])
    for m in muts:
        out.append(base64.b64encode(b"".join(i.to_bytes(8, "little") for i in m)).decode())
    out.append(base64.b64encode(raw + b"\x01").decode())  # not a multiple of 8 bytes
    return out


def _int_variants(v: int, rnd: random.Random) -> list[Any]:
    return [v + 1, v - 1, 0, -1, v * 2 + 1, 2**63, 2**64, -(2**64), rnd.randrange(10**6), 10**30]


def _garbage(rnd: random.Random, depth: int = 0) -> Any:
    kinds = ["int", "str", "none", "float", "bool", "bytes", "list", "dict", "nan", "tuple"]
    k = rnd.choice(kinds if depth < 3 else kinds[:6])
    if k == "int":
        return rnd.choice([0, -1, 1, 2**64, 7])
    if k == "str":
        return rnd.choice(["", "x", "shardstream.ParquetStream", "AAAA", "\x00"])
    if k == "none":
        return None
    if k == "float":
        return rnd.choice([0.5, -1.0, 1e300])
    if k == "bool":
        return rnd.random() < 0.5
    if k == "bytes":
        return b"\x00\xff"
    if k == "nan":
        return float("nan")
    if k == "tuple":
        return tuple(_garbage(rnd, depth + 1) for _ in range(2))
    if k == "list":
        return [_garbage(rnd, depth + 1) for _ in range(rnd.randrange(3))]
    return {rnd.choice(["format", "position", "slot", "x"]): _garbage(rnd, depth + 1)}


MUTATIONS = [
    "int",
    "type",
    "delete",
    "add-key",
    "b64",
    "swap-position",
    "swap-subtree",
    "other-dataset-subtree",
    "other-dataset",
    "other-layout",
    "version",
    "garbage",
    "wrap",
]


def mutate_state(ctx: _Ctx, base_i: int, muts: list[tuple[str, int]]) -> tuple[Any, list[str]]:
    state = copy.deepcopy(ctx.states[base_i])
    log = []
    for kind, r in muts:
        rnd = random.Random(r)
        if not isinstance(state, dict):
            state = {"format": "shardstream.ParquetStream", "nested": state}
        leaves = _leaves(state)
        path = leaves[rnd.randrange(len(leaves))] if leaves else ("format",)
        try:
            old = _get(state, path)
        except Exception:  # noqa: BLE001 - an earlier mutation changed the shape
            old = None
        if kind == "int":
            ints = [p for p in leaves if isinstance(_get(state, p), int)]
            if ints:
                path = ints[rnd.randrange(len(ints))]
                old = _get(state, path)
                _set(state, path, rnd.choice(_int_variants(old, rnd)))
        elif kind == "type":
            _set(state, path, _garbage(rnd))
        elif kind == "delete" and len(path) >= 1:
            parent = _get(state, path[:-1])
            # (the fallback path ("format",) of a state with no leaves may be gone already)
            if isinstance(parent, dict) and path[-1] in parent:
                del parent[path[-1]]
            elif isinstance(parent, list) and parent:
                parent.pop(path[-1] if isinstance(path[-1], int) else 0)
        elif kind == "add-key":
            dicts = [p for p in [()] + leaves if isinstance(_get(state, p), dict)]
            p = dicts[rnd.randrange(len(dicts))]
            _get(state, p)[rnd.choice(["extra", "epoch", "buffer", "format"])] = _garbage(rnd)
        elif kind == "b64":
            strs = [
                p for p in leaves if isinstance(_get(state, p), str) and len(_get(state, p)) >= 4
            ]
            if strs:
                path = strs[rnd.randrange(len(strs))]
                _set(state, path, rnd.choice(_b64_variants(_get(state, path), rnd, ctx.n)))
        elif kind in ("swap-position", "swap-subtree"):
            other = ctx.states[rnd.randrange(len(ctx.states))]
            if kind == "swap-position":
                path = ("position",)
            try:
                _set(state, path, copy.deepcopy(_get(other, path)))
            except Exception:  # noqa: BLE001 - the other state lacks it
                pass
        elif kind == "other-dataset-subtree":
            try:
                _set(state, path, copy.deepcopy(_get(ctx.other_dataset, path)))
            except Exception:  # noqa: BLE001
                pass
        elif kind == "other-dataset":
            state = copy.deepcopy(ctx.other_dataset)
        elif kind == "other-layout":
            state = copy.deepcopy(ctx.other_layout)
        elif kind == "version":
            state["version"] = rnd.choice([0, 2**40, "1", 1.0, None, -1, True])
        elif kind == "garbage":
            state = _garbage(rnd)
        elif kind == "wrap":
            state = rnd.choice([[state], {"dl": {"w": [state]}}, (state,), [state, state]])
        log.append(f"{kind}@{path}")
    return state, log


def state_cases(n_states: int, examples: int):
    """Hypothesis cases for a state fuzzer: a state along the run (`base_i` of `n_states`) and
    1-3 mutations of it, `examples` of them, none remembered between runs."""

    def wrap(f):
        return settings(
            max_examples=examples,
            deadline=None,
            database=None,
            suppress_health_check=list(HealthCheck),
        )(
            given(
                base_i=st.integers(0, n_states - 1),
                muts=st.lists(
                    st.tuples(st.sampled_from(MUTATIONS), st.integers(0, 2**32)),
                    min_size=1,
                    max_size=3,
                ),
            )(f)
        )

    return wrap


def check_refusal(e: BaseException, log: list[str]) -> None:
    """A refused load raised a StateError (a ShardstreamError, not a panic) with a message."""
    assert isinstance(e, Exception) and type(e).__name__ != "PanicException", (
        f"mutations {log}: non-Exception {type(e).__mro__}: {e!r}"
    )
    assert isinstance(e, ShardstreamError), (
        f"mutations {log}: {type(e).__name__} (not a StateError): {e}"
    )
    assert isinstance(e, StateError), f"mutations {log}: {type(e).__name__}: {e}"
    assert str(e).strip(), f"mutations {log}: StateError without a message"


def bounded(ds, limit: int):
    """The items of `ds`, failing the test after `limit` of them: a loaded state that reads
    without end fails instead of hanging."""
    for i, item in enumerate(ds):
        assert i < limit, f"more than {limit} items after the load: a stream without end"
        yield item


def check_loaded_stream(ctx: _Ctx, ds, state: Any, log: list[str]) -> str:
    """The stream after a successful load must be one a valid state could give."""
    ctx_msg = f"mutations {log}"
    try:
        # state_dict() before iterating resolves this iterator's slot as iteration does: a
        # single state of another layout (slot 1 of 2, say) loads, because DataLoader workers
        # may yet give that layout, and is refused here when the layout turns out different.
        roundtrip = copy.deepcopy(ds.state_dict())
        # a valid state gives at most the whole run's rows (in batches split otherwise: a few
        # more items); the count itself is checked below
        rest = keys_of(bounded(ds, 2 * len(ctx.full) + 2), ctx.batched)
    except StateError:
        # The contract validates fully on load; a refusal while iterating is still a refusal
        # (a StateError with a message), but it is worth knowing about.
        return "accepted, refused while iterating"
    ids = flat_ids(rest)
    # later epochs are complete, the partial first one has no repeats, every id is a real row
    q = len(ids) // ctx.n
    partial, later = ids[: len(ids) - q * ctx.n], ids[len(ids) - q * ctx.n :]
    if q > (ctx.settings.get("epochs") or 1):
        pytest.fail(f"{ctx_msg}: {len(ids)} rows after the load, more than the pass holds")
    assert not (Counter(partial) - ctx.ids), f"{ctx_msg}: unknown rows {Counter(partial) - ctx.ids}"
    dup = [i for i, c in Counter(partial).items() if c > 1]
    assert not dup, f"{ctx_msg}: rows repeated within the resumed epoch: {dup[:10]}"
    for e in range(q):
        chunk = Counter(later[e * ctx.n : (e + 1) * ctx.n])
        assert chunk == ctx.ids, f"{ctx_msg}: a later epoch is not every row exactly once"
    # the state round-trips: loading what state_dict() says gives the same stream again
    ds2 = make_ds(ctx.root, ctx.settings)
    ds2.load_state_dict(roundtrip)
    again = keys_of(ds2, ctx.batched)
    assert again == rest, f"{ctx_msg}: state_dict() after the load does not resume the same"
    n = len(ctx.full)
    if len(rest) <= n and ctx.full[n - len(rest) :] == rest:
        return "accepted, equal to a clean resume"
    return "accepted, another valid stream"


OUTCOMES: Counter[str] = Counter()


@pytest.mark.timeout(900)
@pytest.mark.parametrize("setting", list(STATE_SETTINGS))
def test_hostile_states(state_ctx, setting):
    ctx = state_ctx[setting]
    OUTCOMES.clear()

    @state_cases(len(ctx.states), _env_int("SHARDSTREAM_STATE_FUZZ_EXAMPLES", 250))
    def fuzz(base_i, muts):
        state, log = mutate_state(ctx, base_i, muts)
        ds = make_ds(ctx.root, ctx.settings)
        try:
            ds.load_state_dict(state)
        except BaseException as e:  # noqa: BLE001 - PanicException must be seen
            check_refusal(e, log)
            OUTCOMES["refused with StateError"] += 1
            # the failed load left the dataset usable
            assert keys_of(ds, ctx.batched) == ctx.full
            return
        OUTCOMES[check_loaded_stream(ctx, ds, state, log)] += 1

    fuzz()
    print(f"\nhostile states ({setting}): {dict(OUTCOMES)}")
    assert OUTCOMES["refused with StateError"] > 0


# --------------------------------------------------------------------------- hostile pack states

PACK_SETTINGS = {
    "concat-batches": dict(seq_len=24),
    "best-fit": dict(seq_len=24, algorithm="best_fit", buffer_docs=6, eos_id=9999),
}


def packed_items(items, seq_len: int) -> list[tuple[Any, Any]]:
    """(input_ids, segment_ids) of each packed item, every row checked for its shape: `seq_len`
    tokens, segments 1..k then padding, labels -100 on padding."""
    out = []
    for b in items:
        seg, lab, ids = b["segment_ids"], b["labels"], b["input_ids"]
        assert ids.shape[1] == seq_len
        for r in range(seg.shape[0]):
            real = seg[r] > 0
            k = int(real.sum())
            assert real[:k].all() and not real[k:].any()
            assert (lab[r][~real] == -100).all()
        out.append((ids, seg))
    return out


def same_ids(a: list, b: list) -> bool:
    """Two lists of token-id arrays are equal, item by item."""
    return len(a) == len(b) and all(np.array_equal(x, y) for x, y in zip(a, b, strict=True))


def ends_the_run(full: list, rest: list) -> bool:
    """`rest` is the end of the uninterrupted run `full`: what a clean resume gives."""
    return len(rest) <= len(full) and same_ids(full[len(full) - len(rest) :], rest)


def fuzz_packed_states(ctx, make, seq_len: int) -> Counter[str]:
    """Run the state mutations on the states of a packing stream or mixture (`ctx`: its
    `states` along one run, their `full` token ids item by item and the data's `tokens`; `make`
    a fresh one): each load either raises a StateError (and the stream stays usable) or gives
    well-formed packed rows of the data's tokens, no more items than twice the run's, and a
    `state_dict()` that resumes the same. Returns the outcomes' counts."""
    outcomes: Counter[str] = Counter()
    limit = 2 * len(ctx.full) + 2

    @state_cases(len(ctx.states), _env_int("SHARDSTREAM_STATE_FUZZ_EXAMPLES", 250) // 2)
    def fuzz(base_i, muts):
        state, log = mutate_state(ctx, base_i, muts)
        ds = make()
        try:
            ds.load_state_dict(state)
            roundtrip = copy.deepcopy(ds.state_dict())
            rest = packed_items(bounded(ds, limit), seq_len)
        except BaseException as e:  # noqa: BLE001 - PanicException must be seen
            check_refusal(e, log)
            outcomes["refused with StateError"] += 1
            fresh = packed_items(bounded(make(), limit), seq_len)
            assert same_ids([ids for ids, _ in fresh], ctx.full)
            return
        got = {int(t) for ids, seg in rest for t in ids[seg > 0]}
        assert got <= ctx.tokens, f"mutations {log}: tokens not in the data"
        rest = [ids for ids, _ in rest]
        ds2 = make()
        ds2.load_state_dict(roundtrip)
        again = [ids for ids, _ in packed_items(bounded(ds2, limit), seq_len)]
        assert same_ids(again, rest), (
            f"mutations {log}: state_dict() after the load does not resume the same"
        )
        if ends_the_run(ctx.full, rest):
            outcomes["accepted, equal to a clean resume"] += 1
        else:
            outcomes["accepted, another stream"] += 1

    fuzz()
    return outcomes


class _PackCtx:
    """Real states of a packing stream (``pack=Pack(...)`` over the ``tokens`` column) along
    one run, plus another dataset's and another layout's, for ``mutate_state``."""

    def __init__(self, small, tiny, pack: dict):
        from shardstream import Pack

        self.root = small.root
        self.pack = Pack(column="tokens", **pack)
        self.settings = dict(
            columns=["tokens"],
            output="numpy",
            batch_size=2,
            shuffle_buffer=7,
            seed=3,
            pack=self.pack,
        )
        self.n = len(small.ids)
        ds = make_ds(self.root, self.settings)
        self.states: list[Any] = [copy.deepcopy(ds.state_dict())]
        full = []
        for item in ds:
            full.append((item["input_ids"], item["segment_ids"]))
            self.states.append(copy.deepcopy(ds.state_dict()))
        self.full = [ids for ids, _ in full]
        # every real token of the data (with the EOS each document gets)
        self.tokens = {int(t) for ids, seg in full for t in ids[seg > 0]}
        other = make_ds(tiny.root, self.settings)
        take(iter(other), 2)
        self.other_dataset = copy.deepcopy(other.state_dict())
        r1 = make_ds(self.root, dict(self.settings, rank=1, world_size=2, even=None))
        take(iter(r1), 2)
        self.other_layout = copy.deepcopy(r1.state_dict())


@pytest.fixture(scope="module")
def pack_ctx(small, tiny):
    return {name: _PackCtx(small, tiny, p) for name, p in PACK_SETTINGS.items()}


@pytest.mark.timeout(900)
@pytest.mark.parametrize("setting", list(PACK_SETTINGS))
def test_hostile_pack_states(pack_ctx, setting):
    """The state mutations on a packing stream's states: a StateError with a message (the
    stream still usable), or packed rows of the right shape (segments 1..k then padding,
    labels -100 on padding) whose tokens are tokens of the data, and a ``state_dict()`` that
    resumes the same rows. (An accepted state whose pending row ids were changed to rows the
    slot has not read yet packs those documents twice: ids alone cannot tell.)"""
    ctx = pack_ctx[setting]
    outcomes = fuzz_packed_states(ctx, lambda: make_ds(ctx.root, ctx.settings), ctx.pack.seq_len)
    print(f"\nhostile pack states ({setting}): {dict(outcomes)}")
    assert outcomes["refused with StateError"] > 0
    assert outcomes["accepted, equal to a clean resume"] > 0
