"""Reliability 5 and 6: long runs in one process, and concurrency.

Long runs: 1,500 resume cycles (state_dict -> new ParquetStream -> load_state_dict -> new
iterator) and 300 epochs in one process keep RSS, open file descriptors and threads bounded;
iterators dropped mid-epoch leave no readahead thread behind. Readahead threads are Rust
threads that Python's ``threading`` does not see, so threads are counted in
``/proc/self/task``, descriptors in ``/proc/self/fd``, memory in ``/proc/self/status``.

Concurrency: two iterators over one dataset (the older one becomes stale: ``RuntimeError``,
the documented behaviour), iterators dropped early, a dataset pickled into spawn-started
workers (mid-pass too), and a fork after the first iteration (the child continues correctly).
"""

from __future__ import annotations

import gc
import os
import pickle
import sys
import time
import warnings

import pytest
from harness import flat_ids, item_key, keys_of, make_ds, take
from torch.utils.data import DataLoader

pytestmark = pytest.mark.skipif(not sys.platform.startswith("linux"), reason="/proc")


def rss_kib() -> int:
    with open("/proc/self/status") as f:
        for line in f:
            if line.startswith("VmRSS:"):
                return int(line.split()[1])
    raise AssertionError("no VmRSS")


def n_fds() -> int:
    return len(os.listdir("/proc/self/fd"))


def n_threads() -> int:
    return len(os.listdir("/proc/self/task"))


def settle_threads(baseline: int, timeout: float = 10.0) -> int:
    """Collect garbage and wait (readahead threads exit at their next send) until the thread
    count is back to ``baseline``; returns the last count."""
    end = time.time() + timeout
    while True:
        gc.collect()
        n = n_threads()
        if n <= baseline or time.time() > end:
            return n
        time.sleep(0.05)


# ------------------------------------------------------------------------------ long runs

CYCLE = dict(output="numpy", columns=["id"], batch_size=4, shuffle_buffer=32, seed=5, epochs=None)


@pytest.mark.timeout(600)
def test_resume_cycles_bounded(small):
    """1,500 cycles of 3 batches each: the stitched stream equals the uninterrupted one, and
    memory, descriptors and threads stay flat."""
    cycles = int(os.environ.get("SHARDSTREAM_RESUME_CYCLES", 1500))
    per = 3
    settings = dict(CYCLE, readahead_threads=2)
    ref = make_ds(small.root, settings)
    it = iter(ref)
    full = [item_key(next(it), True) for _ in range(cycles * per)]
    del it, ref
    base_threads = settle_threads(n_threads())
    got: list = []
    state = None
    marks = {}
    for c in range(cycles):
        ds = make_ds(small.root, settings)
        if state is not None:
            ds.load_state_dict(state)
        it = iter(ds)
        got += keys_of(take(it, per), True)
        state = ds.state_dict()
        del it, ds
        if c == 100:  # warmed up: allocator pools, import caches, first threads
            gc.collect()
            marks["start"] = (rss_kib(), n_fds())
    gc.collect()
    marks["end"] = (rss_kib(), n_fds())
    threads = settle_threads(base_threads)
    assert got == full, "the stream stitched from resume cycles differs from the uninterrupted one"
    (rss0, fd0), (rss1, fd1) = marks["start"], marks["end"]
    print(
        f"\n{cycles} resume cycles: RSS {rss0} -> {rss1} KiB, fds {fd0} -> {fd1}, threads {threads}"
    )
    # 1,400 cycles after warm-up; a leak of one 32-row buffer or one footer per cycle shows.
    assert rss1 - rss0 < 40 * 1024, f"RSS grew {rss1 - rss0} KiB over {cycles - 100} cycles"
    assert fd1 <= fd0 + 2, f"file descriptors {fd0} -> {fd1}"
    assert threads <= base_threads, f"threads {base_threads} -> {threads}"


@pytest.mark.timeout(600)
def test_many_epochs_one_process(big):
    epochs = int(os.environ.get("SHARDSTREAM_EPOCHS", 300))
    ds = make_ds(
        big.root,
        dict(output="arrow", batch_size=256, shuffle_buffer=500, seed=1, epochs=epochs),
    )
    per_epoch = -(-5000 // 256)
    rows = 0
    fd0 = n_fds()
    base_threads = n_threads()
    rss = {}
    for i, rb in enumerate(ds):
        rows += rb.num_rows
        if i == 5 * per_epoch:  # after 5 epochs
            rss["start"] = rss_kib()
    gc.collect()
    rss["end"] = rss_kib()
    assert rows == 5000 * epochs
    assert i + 1 == per_epoch * epochs
    print(f"\n{epochs} epochs: RSS {rss['start']} -> {rss['end']} KiB")
    assert rss["end"] - rss["start"] < 40 * 1024, rss
    assert n_fds() <= fd0 + 2
    assert settle_threads(base_threads) <= base_threads


@pytest.mark.timeout(300)
def test_dropped_iterators_leave_no_threads(big):
    """Iterators dropped mid-epoch (readahead running, channels full) release their threads."""
    base = settle_threads(n_threads())
    fds = n_fds()
    for k in range(40):
        ds = make_ds(
            big.root,
            dict(output="arrow", batch_size=64, shuffle_buffer=k % 3 * 50, readahead_threads=4),
        )
        it = iter(ds)
        take(it, 1 + k % 5)
        if k % 2:
            time.sleep(0.01)  # let the readahead fill its channels
        del it, ds
    after = settle_threads(base)
    assert after <= base, f"threads {base} -> {after} after dropping 40 iterators"
    assert n_fds() <= fds + 2


# ---------------------------------------------------------------------------- concurrency

SEQ = dict(output="python", columns=["id"], batch_size=7, shuffle_buffer=11, seed=2, epochs=2)


def test_second_iterator_makes_first_stale(small):
    full = keys_of(make_ds(small.root, SEQ), True)
    ds = make_ds(small.root, SEQ)
    it1 = iter(ds)
    head = keys_of(take(it1, 5), True)
    it2 = iter(ds)  # the newest iterator owns the position: it continues after it1's items
    with pytest.raises(RuntimeError, match="stale"):
        next(it1)
    with pytest.raises(StopIteration):  # a stale iterator stays finished
        next(it1)
    rest = keys_of(it2, True)
    assert head + rest == full


def test_iterators_dropped_early_continue(small):
    """Dropping iterators at any point: the next one continues where the last yielded item
    left off, and state_dict() always describes that position."""
    full = keys_of(make_ds(small.root, SEQ), True)
    ds = make_ds(small.root, SEQ)
    got: list = []
    for k in (3, 1, 0, 7, 2):
        it = iter(ds)
        got += keys_of(take(it, k), True)
        state = ds.state_dict()
        del it
        gc.collect()
        other = make_ds(small.root, SEQ)
        other.load_state_dict(state)
        assert keys_of(other, True) == full[len(got) :]
    got += keys_of(ds, True)
    assert got == full


@pytest.mark.timeout(600)
def test_pickled_into_spawn_workers(small):
    """A dataset pickled mid-pass into 1 spawn worker continues exactly; into 2 workers the
    rest is split between them, every row once (fresh datasets in spawn workers:
    test_dataloader.py)."""
    s = dict(SEQ, epochs=1)
    full = keys_of(make_ds(small.root, s), True)
    ds = make_ds(small.root, s)
    it = iter(ds)
    head = keys_of(take(it, 9), True)
    one = DataLoader(ds, batch_size=None, num_workers=1, multiprocessing_context="spawn")
    assert head + keys_of(one, True) == full
    two = DataLoader(ds, batch_size=None, num_workers=2, multiprocessing_context="spawn")
    assert sorted(flat_ids(head) + flat_ids(keys_of(two, True))) == sorted(small.ids)
    # plain pickle round trip in this process continues too
    clone = pickle.loads(pickle.dumps(ds))
    assert head + keys_of(clone, True) == full


@pytest.mark.timeout(300)
@pytest.mark.parametrize("threads", [0, 2])
def test_fork_after_first_iteration(small, threads):
    """fork() while an iterator is live (readahead threads running in the parent): the child
    either continues the stream exactly or fails with a clear exception; never hangs or
    crashes; the parent is unaffected."""
    s = dict(SEQ, readahead_threads=threads)
    full = keys_of(make_ds(small.root, s), True)
    ds = make_ds(small.root, s)
    it = iter(ds)
    head = keys_of(take(it, 4), True)
    r, w = os.pipe()
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", DeprecationWarning)  # 3.12+: fork with threads
        pid = os.fork()
    if pid == 0:  # child: continue the iterator, report the result, exit without cleanup
        code = 0
        try:
            rest = keys_of(it, True)
            msg = pickle.dumps(("ok", rest))
        except BaseException as e:  # noqa: BLE001
            msg = pickle.dumps(("error", f"{type(e).__name__}: {e}", isinstance(e, Exception)))
        try:
            with os.fdopen(w, "wb") as f:
                f.write(msg)
        except BaseException:  # noqa: BLE001
            code = 1
        os._exit(code)
    os.close(w)
    parent_rest = keys_of(it, True)
    deadline = time.time() + 120
    while True:
        done, status = os.waitpid(pid, os.WNOHANG)
        if done:
            break
        if time.time() > deadline:
            os.kill(pid, 9)
            os.waitpid(pid, 0)
            pytest.fail("the forked child hung")
        time.sleep(0.05)
    with os.fdopen(r, "rb") as f:
        data = f.read()
    assert os.waitstatus_to_exitcode(status) == 0, f"child died: status {status}"
    assert head + parent_rest == full
    result = pickle.loads(data)
    detail = "" if result[0] == "ok" else result[1]
    print(f"\nfork with readahead_threads={threads}: child {result[0]} {detail}")
    if result[0] == "ok":
        assert head + result[1] == full, "the forked child continued with other rows"
    else:
        assert result[2], f"the child failed with a non-Exception: {result[1]}"
        assert len(result[1]) > 20, f"unclear error in the child: {result[1]}"
