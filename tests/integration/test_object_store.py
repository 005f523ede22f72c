"""Shards in an object store (issues #5, #18): ``s3://`` against a local moto server and
``gs://`` against fake-gcs-server (the ``objstore`` fixture runs each shared test on both;
parametrized tests run each case on one store in turn: ``on_each_store``),
``file://``.

The same data as the local tests, uploaded to the store; every stream is compared in full
(row ids, batch boundaries) with the stream of the same files read from the local path:

* full iteration, prefix listing, globs, object lists, ``file://`` URLs;
* exact resume over ``s3://`` (the harness of test_resume.py), states carried between a
  local copy and the bucket in both directions, a StatefulDataLoader with 2 workers;
* faults through ``FaultProxy`` (503s, dropped connections, truncated bodies, slow
  answers): the stream stays exact and the retries are counted; a silent server
  (blackhole, stalled body) is an error within a bounded time, never a hang;
* errors: missing object / bucket / prefix -> FileNotFoundError, bad credentials or a
  denied GET -> PermissionError (moto with IAM checks on), an object rewritten after the
  dataset was opened -> ShardError, a state against a changed bucket -> ShardsChangedError;
* bytes fetched: a deep resume in a 60-row-group shard fetches < 10% of a full read.
"""

from __future__ import annotations

import http.client
import json
import os
import re
import subprocess
import sys
import threading
import time
from typing import Any

import pyarrow.parquet as pq
import pytest
from harness import (
    check_epochs,
    check_resume,
    full_stream,
    interrupt_points,
    keys_of,
    make_ds,
    resume_rest,
    take,
    torch_roundtrip,
)
from objstore_server import MotoServer, s3_client, storage_options, upload_dir
from shardstream import (
    ParquetStream,
    ShardError,
    ShardsChangedError,
    ShardstreamError,
    datagen,
)

pytestmark = pytest.mark.timeout(180)

# Retry settings for the fault tests: every request has a timeout, faults are retried fast.
FAST_RETRY = dict(
    timeout="5s", connect_timeout="2s", max_retries="4", retry_timeout="60s", backoff_initial="5ms"
)
# Give up quickly on a silent server.
GIVE_UP = dict(
    timeout="1s", connect_timeout="1s", max_retries="1", retry_timeout="3s", backoff_initial="5ms"
)
HANG_BOUND = 30.0  # seconds; far above what GIVE_UP allows, far below "hung"


STORES = ("s3", "gs")


def on_each_store(argname: str, cases: dict[str, Any]) -> Any:
    """Parametrize ``argname`` with ``cases``, each case on one store in turn (s3, gs, s3, ...):
    every case runs once and both stores see every kind of case, at half the time of running
    every case on both (the ``objstore`` fixture's params are overridden)."""
    stores = [STORES[i % len(STORES)] for i in range(len(cases))]
    return pytest.mark.parametrize(
        ("objstore", argname),
        list(zip(stores, cases.values(), strict=True)),
        ids=[f"{st}-{name}" for st, name in zip(stores, cases, strict=True)],
        indirect=["objstore"],
    )


def s3_settings(opts: dict[str, str], settings: dict) -> dict:
    return {**settings, "storage_options": opts}


def http_requests(stats: dict[str, int]) -> int:
    """HTTP requests sent, retries included (``requests`` counts coalesced logical requests
    when the core also reports ``http_requests``)."""
    return stats.get("http_requests", stats["requests"])


def run_bounded(fn: Any, seconds: float = HANG_BOUND) -> tuple[Any, BaseException | None, float]:
    """Run ``fn()`` in a thread; (result, exception, elapsed).  Fails the test if it has not
    returned after ``seconds`` (a hang: the thread is left behind, blocked)."""
    box: dict[str, Any] = {}

    def target() -> None:
        try:
            box["result"] = fn()
        except BaseException as e:  # noqa: BLE001 - reported to the caller
            box["error"] = e

    t0 = time.monotonic()
    th = threading.Thread(target=target, daemon=True)
    th.start()
    th.join(seconds)
    elapsed = time.monotonic() - t0
    if th.is_alive():
        pytest.fail(f"hung: no result or error after {seconds:.0f} s")
    return box.get("result"), box.get("error"), elapsed


@pytest.fixture(scope="module")
def small_url(objstore, small) -> str:
    return objstore.upload(small.root)


@pytest.fixture(scope="module")
def s3_small_url(s3, small) -> str:
    return s3.upload(small.root)


@pytest.fixture(scope="module")
def nopi_url(objstore, small_nopi) -> str:
    return objstore.upload(small_nopi.root)


# ------------------------------------------------------------------ plain iteration

STREAMS = [
    ("row-noshuf", dict(output="python", columns=["id", "tokens", "text"])),
    ("b5-buf7-e2", dict(output="python", batch_size=5, shuffle_buffer=7, seed=3, epochs=2)),
    ("b64-torch-buf100", dict(output="torch", batch_size=64, shuffle_buffer=100, seed=1)),
    ("b16-arrow-allcols", dict(output="arrow", batch_size=16)),
    (
        "rank1of3-b5-buf7",
        dict(output="python", batch_size=5, shuffle_buffer=7, seed=1, rank=1, world_size=3),
    ),
]


@on_each_store("settings", dict(STREAMS))
def test_remote_stream_equals_local(objstore, small, small_url, settings):
    local = full_stream(small.root, settings)
    if "rank" not in settings:
        check_epochs(local, list(small.paths), settings)
    got = full_stream(small_url, s3_settings(objstore.options(), settings))
    assert got == local


def test_remote_dataset_metadata(objstore, small, small_url):
    ds = ParquetStream(small_url, storage_options=objstore.options())
    loc = ParquetStream(small.root)
    names = [os.path.basename(p) for p in small.paths]
    assert [s.rsplit("/", 1)[-1] for s in ds.shards] == names
    assert all(s.startswith(small_url) for s in ds.shards), ds.shards
    assert ds.num_rows == loc.num_rows == small.num_rows
    assert ds.schema == loc.schema


def test_remote_no_page_index_equals_local(objstore, small_nopi, nopi_url):
    settings = dict(output="python", batch_size=5, shuffle_buffer=7, seed=2)
    assert full_stream(nopi_url, s3_settings(objstore.options(), settings)) == full_stream(
        small_nopi.root, settings
    )


def test_s3_from_environment_variables(s3, small, s3_small_url, monkeypatch):
    """No storage_options: the standard AWS_* variables configure the store."""
    monkeypatch.setenv("AWS_ENDPOINT_URL", s3.endpoint)
    monkeypatch.setenv("AWS_ALLOW_HTTP", "true")
    monkeypatch.setenv("AWS_ACCESS_KEY_ID", "testing")
    monkeypatch.setenv("AWS_SECRET_ACCESS_KEY", "testing")
    monkeypatch.setenv("AWS_REGION", "us-east-1")
    monkeypatch.setenv("AWS_DEFAULT_REGION", "us-east-1")
    settings = dict(output="python", columns=["id"], batch_size=7)
    assert full_stream(s3_small_url, settings) == full_stream(small.root, settings)


# ------------------------------------------------------------------ listing and globs


@pytest.fixture(scope="module")
def tree(tmp_path_factory):
    """A nested local tree and its upload: shards at the top and in sub-directories, a
    non-Parquet object, and names whose string order differs from their path order
    ('a-b.parquet' < 'a.b/...' < 'a/...' as strings; a/..., a-b..., a.b/... as paths)."""
    root = tmp_path_factory.mktemp("tree")
    layout = {
        "shard-00000.parquet": 30,
        "shard-00001.parquet": 17,
        "sub/shard-00002.parquet": 25,
        "sub/deeper/shard-00003.parquet": 9,
        "a/x.parquet": 11,
        "a-b.parquet": 13,
        "a.b/y.parquet": 7,
    }
    start = 0
    for rel, n in layout.items():
        d = root / os.path.dirname(rel)
        d.mkdir(parents=True, exist_ok=True)
        t = datagen.make_table(start, n)
        pq.write_table(t, root / rel, row_group_size=8, write_page_index=True)
        start += n
    (root / "_SUCCESS").write_bytes(b"")
    (root / "sub" / "notes.txt").write_text("not parquet")
    return root


@pytest.fixture(scope="module")
def tree_url(objstore, tree) -> str:
    return objstore.upload(str(tree), prefix="tree")


SETTINGS_ID = dict(output="python", columns=["id"], batch_size=4)


def test_prefix_listing_equals_local_directory(objstore, tree, tree_url):
    """``s3://bucket/prefix/`` = every *.parquet below the prefix, in the local order."""
    local_ds = ParquetStream(str(tree), **SETTINGS_ID)
    ds = ParquetStream(tree_url, storage_options=objstore.options(), **SETTINGS_ID)
    rel_local = [os.path.relpath(p, tree) for p in local_ds.shards]
    rel_s3 = [s[len(tree_url) :] for s in ds.shards]
    assert rel_s3 == rel_local
    assert keys_of(ds, True) == keys_of(local_ds, True)


def test_prefix_without_trailing_slash_and_glob(objstore, tree, tree_url):
    opts = objstore.options()
    local = full_stream(os.path.join(str(tree), "*.parquet"), SETTINGS_ID)
    assert local, "glob matched nothing locally"
    got = full_stream(tree_url + "*.parquet", s3_settings(opts, SETTINGS_ID))
    assert got == local
    local_sub = full_stream(os.path.join(str(tree), "sub", "*", "*.parquet"), SETTINGS_ID)
    got_sub = full_stream(tree_url + "sub/*/*.parquet", s3_settings(opts, SETTINGS_ID))
    assert got_sub == local_sub


def test_list_of_object_urls_equals_list_of_files(objstore, tree, tree_url):
    rels = ["sub/shard-00002.parquet", "shard-00000.parquet", "a-b.parquet"]
    local = full_stream([os.path.join(str(tree), r) for r in rels], SETTINGS_ID)
    got = full_stream([tree_url + r for r in rels], s3_settings(objstore.options(), SETTINGS_ID))
    assert got == local


def test_state_from_local_tree_resumes_remote(objstore, tree, tree_url):
    """The tree's relative paths sort differently as strings and as paths: the read order
    (and so the fingerprint) must not depend on where the copy lives."""
    settings = dict(output="python", columns=["id"], batch_size=4, shuffle_buffer=9, seed=4)
    full = full_stream(str(tree), settings)
    ds = make_ds(str(tree), settings)
    k = len(full) // 2
    take(iter(ds), k)
    state = torch_roundtrip(ds.state_dict())
    rest = resume_rest(tree_url, s3_settings(objstore.options(), settings), state)
    assert full[:k] + rest == full


# ------------------------------------------------------------------ file:// URLs


def test_file_urls_equal_local(small):
    settings = dict(output="python", batch_size=5, shuffle_buffer=7, seed=3)
    local = full_stream(small.root, settings)
    root_url = "file://" + os.path.abspath(small.root).rstrip("/") + "/"
    assert full_stream(root_url, settings) == local
    assert full_stream(["file://" + p for p in small.paths], settings) == local
    # a state saved over the local path resumes over file:// and back
    ds = make_ds(small.root, settings)
    k = len(local) // 3
    take(iter(ds), k)
    state = torch_roundtrip(ds.state_dict())
    assert local[:k] + resume_rest(root_url, settings, state) == local
    ds = make_ds(root_url, settings)
    take(iter(ds), k)
    state = torch_roundtrip(ds.state_dict())
    assert local[:k] + resume_rest(small.root, settings, state) == local


# ------------------------------------------------------------------ exact resume over s3

RESUME = [
    ("row-noshuf", dict(output="python", columns=["id", "text"])),
    ("row-buf7", dict(output="python", shuffle_buffer=7, seed=2)),
    ("b5-buf7-e2", dict(output="python", batch_size=5, shuffle_buffer=7, seed=3, epochs=2)),
    (
        "b16-torch-buf100-droplast",
        dict(output="torch", batch_size=16, shuffle_buffer=100, seed=7, drop_last=True),
    ),
    (
        "rank2of3-b5-buf7",
        dict(output="python", batch_size=5, shuffle_buffer=7, seed=1, rank=2, world_size=3),
    ),
]


@on_each_store("settings", dict(RESUME))
def test_resume_remote(objstore, small, small_url, settings):
    """The harness of test_resume.py over s3:// (interrupt points from the local layout,
    including mid-row-group and mid-shuffle-buffer points), plus the local stream."""
    local = full_stream(small.root, settings)
    points = interrupt_points(
        len(local), list(small.paths), settings, n_random=2, max_boundary_points=6
    )
    full = check_resume(
        small_url,
        s3_settings(objstore.options(), settings),
        points=points,
        check_coverage=False,
    )
    assert full == local


def test_resume_remote_no_page_index(objstore, small_nopi, nopi_url):
    settings = dict(output="python", batch_size=5, shuffle_buffer=7, seed=3)
    local = full_stream(small_nopi.root, settings)
    points = interrupt_points(
        len(local), list(small_nopi.paths), settings, n_random=2, max_boundary_points=6
    )
    full = check_resume(
        nopi_url, s3_settings(objstore.options(), settings), points=points, check_coverage=False
    )
    assert full == local


@pytest.mark.parametrize("direction", ["local-to-s3", "s3-to-local"])
def test_state_moves_between_local_copy_and_bucket(objstore, small, small_url, direction):
    """The fingerprint hashes relative paths and footers: a copy of the same files in a
    bucket is the same dataset, so a state saved on one resumes on the other."""
    settings = dict(output="python", batch_size=5, shuffle_buffer=7, seed=3, epochs=2)
    s3_set = s3_settings(objstore.options(), settings)
    full = full_stream(small.root, settings)
    src, dst = (small.root, settings), (small_url, s3_set)
    if direction == "s3-to-local":
        src, dst = dst, src
    for k in (1, len(full) // 4, len(full) // 2 + 3, len(full) - 1):
        ds = make_ds(*src)
        take(iter(ds), k)
        state = torch_roundtrip(ds.state_dict())
        rest = resume_rest(dst[0], dst[1], state)
        assert full[:k] + rest == full, f"{direction}: resume after {k} items differs"


def test_stateful_dataloader_two_workers_remote(objstore, small, small_url):
    """Workers fork after the catalog was opened over the network in the parent."""
    from torchdata.stateful_dataloader import StatefulDataLoader

    settings = dict(output="torch", batch_size=8, shuffle_buffer=20, seed=5)

    def loader(source: str, st: dict) -> StatefulDataLoader:
        return StatefulDataLoader(make_ds(source, st), batch_size=None, num_workers=2, timeout=60)

    local = keys_of(loader(small.root, settings), True)
    s3_set = s3_settings(objstore.options(), settings)
    assert keys_of(loader(small_url, s3_set), True) == local
    k = len(local) // 2 + 1
    ld = loader(small_url, s3_set)
    take(iter(ld), k)
    state = torch_roundtrip(ld.state_dict())
    ld2 = loader(small_url, s3_set)
    ld2.load_state_dict(state)
    assert local[:k] + keys_of(ld2, True) == local


# ------------------------------------------------------------------ counters


def test_stats_count_what_the_server_saw(objstore, small, small_url, fault_proxy):
    proxy = fault_proxy()
    ds = ParquetStream(
        small_url, storage_options=objstore.options(proxy.endpoint), output="python", batch_size=7
    )
    opened = ds.stats()
    assert {"requests", "bytes", "retries"} <= set(opened), opened
    assert opened["requests"] > 0 and opened["bytes"] > 0 and opened["retries"] == 0
    keys = keys_of(ds, True)
    after = ds.stats()
    assert flat(keys) == small.ids
    assert after["retries"] == 0
    assert after["bytes"] > opened["bytes"] and after["requests"] > opened["requests"]
    assert http_requests(after) == proxy.stats()["requests"], (after, proxy.stats())
    # cumulative: a second pass adds to the counters
    assert keys_of(ds, True) == keys
    again = ds.stats()
    assert again["bytes"] > after["bytes"] and http_requests(again) > http_requests(after)
    total = sum(os.path.getsize(p) for p in small.paths)
    print(
        f"\nsmall set: open {opened['bytes']:,} B, open + one pass {after['bytes']:,} B, "
        f"files {total:,} B"
    )


def flat(keys: list) -> list[int]:
    return [i for k in keys for i in (k if isinstance(k, tuple) else (k,))]


# ------------------------------------------------------------------ faults


def _objects_only(method: str, path: str) -> bool:
    return "list-type=" not in path


FAULTS = {
    "503": dict(error_rate=0.3),
    "drop": dict(drop_rate=0.3),
    # a response cut off mid-body: object GETs only, then every request (list included)
    "truncate-get": dict(truncate_rate=0.3, only=_objects_only),
    "truncate": dict(truncate_rate=0.3),
    "mixed": dict(error_rate=0.15, drop_rate=0.1, truncate_rate=0.1, delay_rate=0.2, delay=0.05),
}


@on_each_store("kind", {k: k for k in FAULTS})
def test_faults_keep_the_stream_exact(objstore, small, small_url, fault_proxy, kind):
    settings = dict(output="python", batch_size=5, shuffle_buffer=7, seed=3, epochs=2)
    local = full_stream(small.root, settings)
    proxy = fault_proxy(seed=11, **FAULTS[kind])
    s3_set = s3_settings(objstore.options(proxy.endpoint, **FAST_RETRY), settings)
    ds = make_ds(small_url, s3_set)
    got = keys_of(ds, True)
    ps, st = proxy.stats(), ds.stats()
    info = f"ds.stats()={st} proxy={ps}"
    assert ps["faults"] > 0, f"the proxy injected no fault: {info}"
    assert got == local, f"stream differs under faults ({info})"
    assert st["retries"] > 0, info
    # every injected fault is one failed attempt that was retried
    assert st["retries"] == ps["faults"], info
    assert http_requests(st) == ps["requests"], info
    # resume through the faulty proxy too
    k = len(local) // 2
    ds = make_ds(small_url, s3_set)
    take(iter(ds), k)
    state = torch_roundtrip(ds.state_dict())
    assert local[:k] + resume_rest(small_url, s3_set, state) == local


def test_slow_answers_time_out_and_are_retried(objstore, small, small_url, fault_proxy):
    """A share of requests is held longer than the per-request timeout: each such attempt
    times out and is retried; the stream is exact."""
    settings = dict(output="python", batch_size=9)
    local = full_stream(small.root, settings)
    proxy = fault_proxy(seed=5, delay_rate=0.15, delay=2.5)
    opts = objstore.options(proxy.endpoint, **{**FAST_RETRY, "timeout": "1s"})
    ds = make_ds(small_url, s3_settings(opts, settings))
    t0 = time.monotonic()
    got = keys_of(ds, True)
    assert proxy.stats()["delayed"] > 0
    assert got == local
    assert ds.stats()["retries"] > 0, (ds.stats(), proxy.stats())
    assert time.monotonic() - t0 < 120


def test_short_delays_need_no_retry(objstore, small, small_url, fault_proxy):
    settings = dict(output="python", batch_size=9, shuffle_buffer=50, seed=1)
    local = full_stream(small.root, settings)
    proxy = fault_proxy(seed=2, delay_rate=0.5, delay=0.2)
    ds = make_ds(small_url, s3_settings(objstore.options(proxy.endpoint, **FAST_RETRY), settings))
    assert keys_of(ds, True) == local
    assert proxy.stats()["delayed"] > 0
    assert ds.stats()["retries"] == 0, ds.stats()


def _expect_io_error(err: BaseException | None, elapsed: float) -> None:
    assert err is not None, "a silent server did not raise"
    assert isinstance(err, (OSError, ShardstreamError)), f"{type(err).__name__}: {err}"
    assert elapsed < HANG_BOUND


def test_blackhole_at_open_raises_not_hangs(objstore, small_url, fault_proxy):
    proxy = fault_proxy(blackhole=True)
    opts = objstore.options(proxy.endpoint, **GIVE_UP)
    _, err, elapsed = run_bounded(lambda: ParquetStream(small_url, storage_options=opts).num_rows)
    _expect_io_error(err, elapsed)
    assert proxy.stats()["blackhole"] >= 1


def _attempts(err: BaseException) -> tuple[int, float]:
    """(attempts, seconds) from a "gave up after N attempts in S s" error."""
    m = re.search(r"gave up after (\d+) attempts? in ([\d.]+) s", str(err))
    assert m, f"the error does not say how long it tried: {err}"
    return int(m.group(1)), float(m.group(2))


@on_each_store(
    "limits",
    {
        # retry_timeout binds: no attempt starts after 3 s, each lasts at most 1 s
        "retry_timeout": dict(timeout="1s", retry_timeout="3s", max_retries="10"),
        # max_retries binds: 1 + 2 attempts, each of them counted by the server once
        "max_retries": dict(timeout="1s", retry_timeout="60s", max_retries="2"),
    },
)
def test_silent_server_at_open_fails_within_the_configured_limits(
    objstore, small_url, fault_proxy, limits
):
    """One retry policy, applied once: the listing of a silent server is tried 1 +
    max_retries times at most (the server sees every attempt), no attempt starts after
    retry_timeout, so opening fails within retry_timeout + timeout, and the error says how
    long it tried. (Before: a listing loop around object_store's own retries took 18.6 s at
    timeout=2s, retry_timeout=5s, max_retries=2.)"""
    proxy = fault_proxy(blackhole=True)
    opts = objstore.options(proxy.endpoint, **limits, backoff_initial="50ms")
    _, err, elapsed = run_bounded(lambda: ParquetStream(small_url, storage_options=opts))
    _expect_io_error(err, elapsed)
    attempts, said = _attempts(err)
    timeout, retry_timeout = 1.0, float(limits["retry_timeout"].rstrip("s"))
    assert proxy.stats()["requests"] == attempts, (proxy.stats(), str(err))
    assert attempts <= 1 + int(limits["max_retries"])
    assert elapsed < min(retry_timeout, attempts * timeout + 1.0) + timeout + 1.5, (elapsed, err)
    assert abs(said - elapsed) < 1.0, (said, elapsed)
    if limits["max_retries"] == "2":
        assert attempts == 3, str(err)
    else:
        assert said >= retry_timeout, f"gave up before retry_timeout: {err}"
    assert "max_retries=" in str(err) and small_url in str(err)


def test_silent_server_while_reading_fails_within_the_limits(objstore, small_url, fault_proxy):
    """The same bound for a ranged GET: 1 + max_retries attempts of it reach the server."""
    proxy = fault_proxy()
    limits = dict(timeout="1s", retry_timeout="60s", max_retries="2", backoff_initial="50ms")
    ds = ParquetStream(
        small_url,
        storage_options=objstore.options(proxy.endpoint, **limits),
        output="python",
        batch_size=5,
        readahead_threads=0,
    )
    assert ds.num_rows > 0
    proxy.reset_stats()
    proxy.set_faults(blackhole=True)
    _, err, elapsed = run_bounded(lambda: keys_of(ds, True))
    _expect_io_error(err, elapsed)
    attempts, _ = _attempts(err)
    assert attempts == 3 and proxy.stats()["requests"] == 3, (proxy.stats(), str(err))
    assert elapsed < 3 * 1.0 + 1.5, elapsed
    assert "shard-0000" in str(err), str(err)


@on_each_store("mode", {m: m for m in ("blackhole", "stalled-body")})
def test_silent_server_while_reading_raises_not_hangs(objstore, small_url, fault_proxy, mode):
    proxy = fault_proxy()
    opts = objstore.options(proxy.endpoint, **GIVE_UP)
    ds = ParquetStream(small_url, storage_options=opts, output="python", batch_size=5)
    assert ds.num_rows > 0  # opened through the healthy proxy
    if mode == "blackhole":
        proxy.set_faults(blackhole=True)
    else:
        proxy.set_faults(stall_rate=1.0, max_faults_per_request=10**6)
    _, err, elapsed = run_bounded(lambda: keys_of(ds, True))
    _expect_io_error(err, elapsed)
    assert proxy.stats()["faults"] >= 1


# ------------------------------------------------------------------ errors


MISSING = {
    "object": "{url}nope.parquet",
    "empty-prefix": "{url}empty-prefix/",
    "glob-without-match": "{url}*.nomatch",
}
# S3 only: fake-gcs-server answers a listing of a missing bucket with 500 "no bucket named ..."
# where GCS answers 404, so on it this would test the emulator, not the store code.
MISSING_BUCKET = {
    "bucket": "s3://no-such-bucket-shardstream/data/",
    "object-in-missing-bucket": "s3://no-such-bucket-shardstream/data/shard-00000.parquet",
}


def _expect_file_not_found(url: str, options: dict[str, str]) -> None:
    _, err, _ = run_bounded(lambda: ParquetStream(url, storage_options=options).num_rows)
    assert isinstance(err, FileNotFoundError), f"{type(err).__name__}: {err}"
    assert url.rstrip("/") in str(err), str(err)


@pytest.mark.parametrize("case", list(MISSING))
def test_missing_is_file_not_found_naming_it(objstore, small_url, case):
    _expect_file_not_found(MISSING[case].format(url=small_url), objstore.options(**GIVE_UP))


@pytest.mark.parametrize("case", list(MISSING_BUCKET))
def test_missing_bucket_is_file_not_found_naming_it(s3, case):
    _expect_file_not_found(MISSING_BUCKET[case], s3.options(**GIVE_UP))


def test_missing_object_among_existing_ones(objstore, small_url):
    bad = small_url + "shard-99999.parquet"
    with pytest.raises(FileNotFoundError, match="shard-99999.parquet"):
        ParquetStream([small_url + "shard-00000.parquet", bad], storage_options=objstore.options())


@pytest.fixture(scope="module")
def auth_server(small):
    """moto with IAM checks on: user 'reader' may do anything in S3, user 'lister' may list
    the bucket but not read objects.  The shards sit at the bucket's root: moto checks the
    signature of a list request whose prefix contains '/' against the decoded query string
    and rejects it (a moto limitation, boto3 hits it too), so ``s3://private/`` is listed
    without a prefix."""
    server = MotoServer(auth=True, no_auth_actions=6)
    try:
        key, secret = server.create_user("reader")
        deny_get = json.dumps(
            {
                "Version": "2012-10-17",
                "Statement": [
                    {"Effect": "Allow", "Action": "s3:ListBucket", "Resource": "*"},
                    {"Effect": "Deny", "Action": "s3:GetObject", "Resource": "*"},
                ],
            }
        )
        lkey, lsecret = server.create_user("lister", policy=deny_get)
        client = s3_client(server.endpoint, key=key, secret=secret)
        upload_dir(client, small.root, "private", "")
        yield server, (key, secret), (lkey, lsecret)
    finally:
        server.stop()


def test_good_credentials_on_an_auth_checking_server(auth_server, small):
    """The positive control of the two tests below: signed requests are accepted."""
    server, (key, secret), _ = auth_server
    opts = storage_options(server.endpoint, key=key, secret=secret)
    settings = dict(output="python", columns=["id"], batch_size=10)
    local = full_stream(small.root, settings)
    assert full_stream("s3://private/", s3_settings(opts, settings)) == local
    objs = ["s3://private/" + os.path.basename(p) for p in small.paths]
    assert full_stream(objs, s3_settings(opts, settings)) == local


@pytest.mark.parametrize("which", ["unknown-key", "wrong-secret"])
def test_bad_credentials_are_permission_error(auth_server, small, which):
    server, (key, _secret), _ = auth_server
    key, secret = ("AKIAUNKNOWNKEY000000", "x") if which == "unknown-key" else (key, "wrong")
    opts = storage_options(server.endpoint, key=key, secret=secret, **GIVE_UP)
    for url in ("s3://private/", "s3://private/" + os.path.basename(small.paths[1])):
        _, err, _ = run_bounded(lambda u=url: ParquetStream(u, storage_options=opts).num_rows)
        assert isinstance(err, PermissionError), f"{url}: {type(err).__name__}: {err}"
        assert url.rstrip("/") in str(err), str(err)


def test_denied_get_is_permission_error_naming_the_object(auth_server):
    server, _, (lkey, lsecret) = auth_server
    opts = storage_options(server.endpoint, key=lkey, secret=lsecret, **GIVE_UP)
    _, err, _ = run_bounded(lambda: ParquetStream("s3://private/", storage_options=opts).num_rows)
    assert isinstance(err, PermissionError), f"{type(err).__name__}: {err}"
    assert "s3://private/shard-0000" in str(err) and ".parquet" in str(err), str(err)


def _rewrite(env: Any, bucket: str, key: str, start_id: int, tmp: str) -> None:
    """Overwrite ``key`` with another shard: same schema, other ids."""
    d = os.path.join(tmp, f"rewrite-{start_id}")
    paths = datagen.write_shards(d, num_shards=1, rows_per_shard=75, start_id=start_id, seed=3)
    with open(paths[0], "rb") as f:
        env.put(bucket, key, f.read())


# fake-gcs-server ignores If-Match (see tests/objstore_server.py): S3 only.
def test_object_rewritten_after_open_is_shard_error(s3, small, tmp_path):
    url = s3.upload(small.root, bucket="rewritten", cache=False)
    ds = ParquetStream(url, storage_options=s3.options(), output="python", batch_size=5)
    assert ds.num_rows == small.num_rows
    _rewrite(s3, "rewritten", "data/shard-00001.parquet", 50_000, str(tmp_path))
    with pytest.raises(ShardError) as e:
        keys_of(ds, True)
    assert "s3://rewritten/data/shard-00001.parquet" in str(e.value), str(e.value)


def test_object_rewritten_mid_iteration_is_shard_error(s3, small, tmp_path):
    url = s3.upload(small.root, bucket="rewritten-mid", cache=False)
    ds = ParquetStream(
        url, storage_options=s3.options(), output="python", batch_size=5, readahead_threads=0
    )
    it = iter(ds)
    take(it, 3)  # reading shard 0
    _rewrite(s3, "rewritten-mid", "data/shard-00003.parquet", 70_000, str(tmp_path))
    with pytest.raises(ShardError, match="s3://rewritten-mid/data/shard-00003.parquet"):
        for _ in it:
            pass


def test_state_against_changed_bucket_is_shards_changed_error(objstore, small, tmp_path):
    url = objstore.upload(small.root, bucket="changed", cache=False)
    settings = dict(output="python", batch_size=5, shuffle_buffer=7, seed=3)
    s3_set = s3_settings(objstore.options(), settings)
    ds = make_ds(url, s3_set)
    take(iter(ds), 20)
    state = torch_roundtrip(ds.state_dict())
    _rewrite(objstore, "changed", "data/shard-00002.parquet", 60_000, str(tmp_path))
    fresh = make_ds(url, s3_set)
    with pytest.raises(ShardsChangedError) as e:
        fresh.load_state_dict(state)
    assert "shard-00002.parquet" in str(e.value)
    assert any("shard-00002.parquet" in p for p in e.value.changed), e.value.changed


# ------------------------------------------------------------------ bytes of a deep resume

BIG_ROWS, BIG_RG = 120_000, 2_000  # one shard, 60 row groups


@pytest.fixture(scope="module")
def one_big_shard(shard_factory, objstore):
    sset = shard_factory(
        num_shards=1, rows_per_shard=BIG_ROWS, row_group_size=BIG_RG, tokens_len=(8, 96), seed=7
    )
    return sset, objstore.upload(sset.root, prefix="big")


def _fetched(ds: ParquetStream, fn: Any) -> tuple[Any, int]:
    before = ds.stats()["bytes"]
    out = fn()
    return out, ds.stats()["bytes"] - before


def test_deep_resume_fetches_a_small_fraction(objstore, one_big_shard):
    sset, url = one_big_shard
    opts = objstore.options()
    settings = dict(output="arrow", batch_size=1000, readahead_threads=0)
    # a full read (bytes after the catalog was opened)
    full_ds = ParquetStream(url, storage_options=opts, **settings)
    rows, full_bytes = _fetched(full_ds, lambda: sum(b.num_rows for b in full_ds))
    assert rows == BIG_ROWS
    # a read from the start fetches each needed byte about once (footer at open included)
    size = os.path.getsize(sset.paths[0])
    assert full_ds.stats()["bytes"] <= 1.1 * size, (full_ds.stats(), size)
    # state at 90% + half a row group, in the middle of a row group
    k = int(0.9 * BIG_ROWS) // 1000 + 1
    ds = ParquetStream(url, storage_options=opts, **settings)
    it = iter(ds)
    take(it, k)
    state = torch_roundtrip(ds.state_dict())
    nxt = next(it)
    del it
    # a fresh dataset: open (not counted), load_state_dict, first batch
    fresh = ParquetStream(url, storage_options=opts, **settings)
    assert fresh.num_rows == BIG_ROWS  # catalog opened

    def first() -> Any:
        fresh.load_state_dict(state)
        return next(iter(fresh))

    batch, resume_bytes = _fetched(fresh, first)
    assert batch.column(0).to_pylist() == nxt.column(0).to_pylist()
    ratio = resume_bytes / full_bytes
    print(
        f"\ndeep resume at row {k * 1000:,} of {BIG_ROWS:,} ({BIG_ROWS // BIG_RG} row groups): "
        f"{resume_bytes:,} B to the first batch vs {full_bytes:,} B for a full read "
        f"= {ratio:.2%}"
    )
    assert ratio < 0.10, f"deep resume fetched {ratio:.1%} of a full read"
    # default readahead: the other readahead threads wait until the first batch was handed out,
    # so it costs what readahead_threads=0 costs (issue: < 2% of a full read)
    dflt = {k_: v for k_, v in settings.items() if k_ != "readahead_threads"}
    fresh2 = ParquetStream(url, storage_options=opts, **dflt)
    assert fresh2.num_rows == BIG_ROWS

    def first2() -> Any:
        fresh2.load_state_dict(state)
        return next(iter(fresh2))

    batch2, b2 = _fetched(fresh2, first2)
    assert batch2.column(0).to_pylist() == nxt.column(0).to_pylist()
    print(f"same with default readahead: {b2:,} B = {b2 / full_bytes:.2%} of a full read")
    assert b2 / full_bytes < 0.02, f"default readahead fetched {b2 / full_bytes:.2%}"
    assert b2 <= 1.5 * resume_bytes, (b2, resume_bytes)


def test_projection_fetches_only_its_columns(objstore, one_big_shard):
    sset, url = one_big_shard
    opts = objstore.options()
    md = pq.ParquetFile(sset.paths[0]).metadata
    id_bytes = sum(
        md.row_group(g).column(0).total_compressed_size for g in range(md.num_row_groups)
    )
    all_bytes = sum(
        md.row_group(g).column(c).total_compressed_size
        for g in range(md.num_row_groups)
        for c in range(md.num_columns)
    )
    ds = ParquetStream(url, storage_options=opts, columns=["id"], output="arrow", batch_size=4096)
    n, got = _fetched(ds, lambda: sum(b.num_rows for b in ds))
    assert n == BIG_ROWS
    print(
        f"\ncolumns=[id]: {got:,} B fetched; id chunks {id_bytes:,} B; all chunks {all_bytes:,} B"
    )
    assert id_bytes <= got < 0.5 * all_bytes


def test_uploaded_objects_are_the_files(objstore, small):
    """The upload helper itself: the bucket holds the files byte for byte (so a difference
    above is never the fixture's)."""
    url = objstore.upload(small.root)
    bucket, prefix = url.split("://", 1)[1].split("/", 1)
    for p in small.paths:
        body = objstore.get(bucket, prefix + os.path.basename(p))
        with open(p, "rb") as f:
            assert body == f.read()


# ------------------------------------------------------------------ the proxy itself (boto3)


def _ranged_gets(client: Any, bucket: str, key: str, size: int, n: int = 12) -> list[bytes]:
    out = []
    for i in range(n):
        lo = (i * 7919) % max(1, size - 64)
        r = client.get_object(Bucket=bucket, Key=key, Range=f"bytes={lo}-{lo + 63}")
        out.append(r["Body"].read())
    return out


def test_moto_proxy_is_transparent_and_deterministic(s3, small, s3_small_url, moto_proxy):
    """Without faults the proxy passes bytes through exactly; with faults, the same seed
    makes the same decisions for the same requests (attempt by attempt)."""
    bucket, prefix = s3_small_url[len("s3://") :].split("/", 1)
    key = prefix + os.path.basename(small.paths[2])
    with open(small.paths[2], "rb") as f:
        data = f.read()
    clean = moto_proxy()
    c = s3_client(clean.endpoint)
    assert c.head_object(Bucket=bucket, Key=key)["ContentLength"] == len(data)
    assert c.get_object(Bucket=bucket, Key=key)["Body"].read() == data
    want = [data[lo : lo + 64] for lo in ((i * 7919) % (len(data) - 64) for i in range(12))]
    assert _ranged_gets(c, bucket, key, len(data)) == want
    assert clean.stats()["faults"] == 0 and clean.stats()["requests"] == 14
    runs = []
    # moto routes an unsigned request by its Authorization header's credential scope
    hdr = {
        "Authorization": "AWS4-HMAC-SHA256 Credential=testing/20260101/us-east-1/s3/aws4_request,"
        " SignedHeaders=host;range, Signature=0"
    }
    for _ in range(2):  # plain HTTP, retried at once (boto3 backs off for seconds on 503s)
        p = moto_proxy(seed=4, error_rate=0.4)
        got, statuses = [], []
        conn = http.client.HTTPConnection("127.0.0.1", p.port, timeout=10)
        for i in range(12):
            lo = (i * 7919) % (len(data) - 64)
            while True:
                conn.request(
                    "GET", f"/{bucket}/{key}", headers={**hdr, "Range": f"bytes={lo}-{lo + 63}"}
                )
                r = conn.getresponse()
                body = r.read()
                statuses.append(r.status)
                if r.status != 503:
                    break
            got.append(body)
        conn.close()
        assert got == want
        runs.append((statuses, p.stats()))
    assert runs[0] == runs[1] and runs[0][1]["503"] > 0, runs


def test_moto_proxy_faults_are_what_they_claim(s3, small, s3_small_url, moto_proxy):
    from botocore.exceptions import ClientError, ReadTimeoutError, ResponseStreamingError

    bucket, prefix = s3_small_url[len("s3://") :].split("/", 1)
    key = prefix + os.path.basename(small.paths[0])
    p = moto_proxy(error_rate=1.0)
    with pytest.raises(ClientError, match="503|SlowDown"):
        s3_client(p.endpoint, retries=1).get_object(Bucket=bucket, Key=key)
    p = moto_proxy(truncate_rate=1.0)
    body = s3_client(p.endpoint, retries=1).get_object(Bucket=bucket, Key=key)["Body"]
    with pytest.raises(ResponseStreamingError):
        body.read()
    p = moto_proxy(drop_rate=1.0)
    with pytest.raises(Exception, match="(?i)connection|reset|closed|aborted"):
        s3_client(p.endpoint, retries=1).get_object(Bucket=bucket, Key=key)
    for knobs in (dict(blackhole=True), dict(stall_rate=1.0)):
        p = moto_proxy(**knobs)
        t0 = time.monotonic()
        with pytest.raises(ReadTimeoutError):
            c = s3_client(p.endpoint, retries=1, timeout=1)
            c.get_object(Bucket=bucket, Key=key)["Body"].read()
        assert time.monotonic() - t0 < HANG_BOUND
        assert p.stats()["faults"] >= 1, p.stats()


# ------------------------------------------------------------------ plain HTTP(S) objects


def test_http_object_urls_equal_local(s3, small, s3_small_url):
    """``http(s)://host/path`` names single objects (plain HTTP has no listing): moto serves
    the uploaded objects path-style over HTTP, with ranges and ETags, and no signature."""
    bucket_prefix = s3_small_url.removeprefix("s3://").rstrip("/")
    bucket, prefix = bucket_prefix.split("/", 1)
    client = s3_client(s3.endpoint)
    for p in small.paths:  # anonymous readers need public objects
        key = f"{prefix}/{os.path.basename(p)}"
        client.put_object_acl(Bucket=bucket, Key=key, ACL="public-read")
    urls = [f"{s3.endpoint}/{bucket_prefix}/{os.path.basename(p)}" for p in sorted(small.paths)]
    settings = dict(output="python", batch_size=5, shuffle_buffer=7, seed=3, epochs=2)
    local = full_stream(small.root, settings)
    got = full_stream(urls, {**settings, "storage_options": {"allow_http": "true"}})
    assert got == local
    ds = ParquetStream(urls, storage_options={"allow_http": "true"})
    assert ds.shards == urls
    # the state of the local copy resumes over HTTP
    loc = make_ds(small.root, settings)
    head = keys_of(take(iter(loc), 7), True)
    remote = make_ds(urls, {**settings, "storage_options": {"allow_http": "true"}})
    remote.load_state_dict(torch_roundtrip(loc.state_dict()))
    assert head + keys_of(remote, True) == local
    with pytest.raises(FileNotFoundError, match="nope.parquet"):
        ParquetStream(
            f"{s3.endpoint}/{bucket_prefix}/nope.parquet", storage_options={"allow_http": "true"}
        )


def test_plain_http_without_allow_http_says_what_to_set(s3, s3_small_url):
    """reqwest refuses http:// unless allowed and says only "builder error": the error
    names the option (and is not retried: it fails at once)."""
    bucket_prefix = s3_small_url.removeprefix("s3://").rstrip("/")
    url = f"{s3.endpoint}/{bucket_prefix}/shard-00000.parquet"
    for source, opts in [
        (url, None),
        (s3_small_url, {**s3.options(), "aws_allow_http": "false"}),
    ]:
        t0 = time.monotonic()
        with pytest.raises(ValueError, match='"allow_http" is "true"') as e:
            ParquetStream(source, storage_options=opts)
        assert time.monotonic() - t0 < 5, "a configuration error was retried"
        assert source.rstrip("/") in str(e.value), str(e.value)


# ------------------------------------------------------------------ the sidecar in a bucket


def _recorder(seen: list) -> Any:
    """A fault proxy's ``only`` hook that records every (method, path) and lets the knobs
    apply (none set: a counting proxy)."""

    def only(method: str, path: str) -> bool:
        seen.append((method, path))
        return True

    return only


def test_remote_sidecar_opens_with_one_listing_and_one_get(s3, small, moto_proxy, tmp_path):
    """``shardstream index s3://...`` puts the sidecar beside the shards; opening is then a
    listing and one GET (no footer request), with the same fingerprint and stream; a resume
    fetches the footers of the shards it reads only; an entry whose object changed (ETag)
    falls back to that footer. (Writing: S3 only, fake-gcs-server takes no XML upload.)"""
    url = s3.upload(small.root, bucket="indexed", cache=False)
    opts = s3.options()
    settings = dict(output="python", batch_size=5, shuffle_buffer=7, seed=3, epochs=2)
    local = full_stream(small.root, settings)
    plain = ParquetStream(url, storage_options=opts)
    fp, n = plain.catalog.fingerprint(), len(plain.shards)
    assert plain.stats()["requests"] == 1 + n, plain.stats()  # a listing + a footer each
    cmd = [sys.executable, "-m", "shardstream", "index", url, "--json"]
    cmd += [f"--storage-option={k}={v}" for k, v in opts.items()]
    info = json.loads(subprocess.run(cmd, capture_output=True, text=True, check=True).stdout)
    assert info["index"] == url + "_shardstream_index.json" and info["shards"] == n
    listed = s3.client.list_objects_v2(Bucket="indexed", Prefix="data/")["Contents"]
    assert "data/_shardstream_index.json" in [o["Key"] for o in listed]

    seen: list = []
    proxy = moto_proxy(only=_recorder(seen))
    popts = s3.options(proxy.endpoint)
    ds = ParquetStream(url, storage_options=popts)
    assert [m for m, _ in seen] == ["GET", "GET"], seen  # the listing, the sidecar
    assert "list-type=" in seen[0][1] and seen[1][1].endswith("_shardstream_index.json")
    assert ds.stats()["requests"] == 2
    assert ds.catalog.fingerprint() == fp
    assert full_stream(url, s3_settings(popts, settings)) == local

    # a resume in the last shard: only that shard's footer (and pages) are fetched
    rs = dict(output="python", columns=["id"], batch_size=5, readahead_threads=0)
    rows_before = small.num_rows - 7
    loc = make_ds(small.root, rs)
    take(iter(loc), rows_before // 5)
    state = torch_roundtrip(loc.state_dict())
    seen.clear()
    fresh = make_ds(url, s3_settings(popts, rs))
    fresh.load_state_dict(state)
    rest = keys_of(fresh, True)
    assert flat(rest) == small.ids[(rows_before // 5) * 5 :]
    shards_read = {p.rsplit("/", 1)[-1] for m, p in seen if p.endswith(".parquet")}
    assert shards_read == {os.path.basename(small.paths[-1])}, seen

    # a changed object (new ETag): its footer is read, the others still come from the sidecar
    _rewrite(s3, "indexed", "data/" + os.path.basename(small.paths[1]), 50_000, str(tmp_path))
    seen.clear()
    changed = ParquetStream(url, storage_options=popts)
    footers = [p for m, p in seen if p.endswith(".parquet")]
    assert footers == ["/indexed/data/" + os.path.basename(small.paths[1])], seen
    assert changed.catalog.fingerprint() != fp
    assert changed.num_rows == small.num_rows - len(pq.read_table(small.paths[1])) + 75


@pytest.mark.timeout(600)
def test_spawned_workers_get_the_catalog_not_a_listing(objstore, small, small_url, fault_proxy):
    """Spawn-started DataLoader workers receive the parent's catalog: the store sees one
    listing (the parent's); a worker fetches a footer only for a shard it reads; the stream
    is exact. (Before: each worker listed and read every footer again.)"""
    from torch.utils.data import DataLoader

    settings = dict(output="torch", batch_size=8, shuffle_buffer=20, seed=5)
    want = keys_of(DataLoader(make_ds(small.root, settings), batch_size=None, num_workers=2), True)
    seen: list = []
    proxy = fault_proxy(only=_recorder(seen))
    ds = make_ds(small_url, s3_settings(objstore.options(proxy.endpoint), settings))
    opened = len(seen)
    loader = DataLoader(
        ds, batch_size=None, num_workers=2, multiprocessing_context="spawn", timeout=120
    )
    assert keys_of(loader, True) == want
    lists = [p for _, p in seen if "list-type=" in p]
    assert len(lists) == 1 and "list-type=" in seen[0][1], seen[:3]
    assert opened == 1 + len(small.paths), seen[:opened]  # the parent: a listing, the footers
    assert len(seen) > opened


# ------------------------------------------------------------------ Arrow IPC shards (#15)

IPC_LAYOUT = [[7, 0, 13, 5], [20], [3, 9, 1, 11]]  # record batches per shard
IPC_DICT = ["L0", "L1", "L2"]


def _ipc_batch(first: int, n: int) -> Any:
    import pyarrow as pa

    ids = pa.array(range(first, first + n), pa.int64())
    tokens = pa.array(
        [[i + k for k in range(i % 5)] for i in range(first, first + n)], pa.list_(pa.int32())
    )
    text = pa.array([f"row-{i}" for i in range(first, first + n)], pa.large_string())
    label = pa.DictionaryArray.from_arrays(
        pa.array([i % 3 for i in range(first, first + n)], pa.int32()), pa.array(IPC_DICT)
    )
    return pa.RecordBatch.from_arrays([ids, tokens, text, label], ["id", "tokens", "text", "label"])


def write_ipc(path: str, batches: list, kind: str, compression: str | None = None) -> str:
    """An IPC ``file``, ``stream``, or ``legacy`` stream (pre-0.15: no continuation marker)."""
    import pyarrow as pa

    opts = pa.ipc.IpcWriteOptions(compression=compression, use_legacy_format=kind == "legacy")
    with pa.OSFile(path, "wb") as sink:
        new = pa.ipc.new_file if kind == "file" else pa.ipc.new_stream
        with new(sink, batches[0].schema, options=opts) as w:
            for b in batches:
                w.write_batch(b)
    return path


def write_ipc_set(root: str, kind: str, compression: str | None, layout=IPC_LAYOUT) -> list[str]:
    os.makedirs(root, exist_ok=True)
    first, paths = 0, []
    for s, sizes in enumerate(layout):
        batches = []
        for n in sizes:
            batches.append(_ipc_batch(first, n))
            first += n
        ext = "arrow" if kind == "file" else "arrows"
        paths.append(write_ipc(os.path.join(root, f"s{s:03d}.{ext}"), batches, kind, compression))
    return paths


IPC_SETS = {"file-lz4": ("file", "lz4"), "stream": ("stream", None), "legacy": ("legacy", None)}


@pytest.fixture(scope="module")
def ipc_sets(tmp_path_factory) -> dict[str, tuple[str, list[str]]]:
    out = {}
    for name, (kind, comp) in IPC_SETS.items():
        root = str(tmp_path_factory.mktemp(f"ipc-{name}"))
        out[name] = (root, write_ipc_set(root, kind, comp))
    return out


IPC_CASES = {
    "file-lz4-b5-buf7-e2": (
        "file-lz4",
        dict(output="python", batch_size=5, shuffle_buffer=7, seed=3, epochs=2),
    ),
    "stream-row-noshuf": ("stream", dict(output="python", columns=["id", "label", "text"])),
    "legacy-b4-buf9": ("legacy", dict(output="python", batch_size=4, shuffle_buffer=9, seed=1)),
    "stream-rank1of2-b3": (
        "stream",
        dict(output="python", batch_size=3, shuffle_buffer=5, seed=2, rank=1, world_size=2),
    ),
}


@on_each_store("case", IPC_CASES)
def test_remote_ipc_equals_local_and_resumes_exactly(objstore, ipc_sets, case):
    """IPC files (lz4) and streams (current and pre-0.15 format) with a dictionary column in
    a bucket: the full stream equals the local one, every interrupt point resumes exactly,
    the fingerprint is the local one's, and a state saved on the local copy resumes on the
    bucket."""
    name, settings = case
    root, paths = ipc_sets[name]
    url = objstore.upload(root, prefix=f"ipc-{name}")
    rs = s3_settings(objstore.options(), settings)
    local = full_stream(root, settings)
    assert len(flat(local) if settings.get("batch_size") else local) > 0
    points = interrupt_points(len(local), paths, settings, n_random=1, max_boundary_points=4)
    assert check_resume(url, rs, points=points, check_coverage=False, twice=False) == local
    remote = make_ds(url, rs)
    assert [s.rsplit("/", 1)[-1] for s in remote.shards] == [os.path.basename(p) for p in paths]
    assert remote.catalog.fingerprint() == make_ds(root, settings).catalog.fingerprint()
    k = len(local) // 2
    ds = make_ds(root, settings)
    take(iter(ds), k)
    assert local[:k] + resume_rest(url, rs, torch_roundtrip(ds.state_dict())) == local


def test_file_url_ipc_and_named_object_without_extension(ipc_sets, objstore):
    """file:// URLs of IPC shards read as the local paths; an object named alone whose key
    has no shard extension is told by its magic bytes."""
    settings = dict(output="python", batch_size=5, shuffle_buffer=7, seed=3)
    for name in ("file-lz4", "legacy"):
        root, paths = ipc_sets[name]
        local = full_stream(root, settings)
        assert full_stream("file://" + os.path.abspath(root) + "/", settings) == local
    root, paths = ipc_sets["stream"]
    bucket = "ipc-noext"
    url = objstore.upload(root, bucket=bucket, prefix="x", cache=False)
    with open(paths[1], "rb") as f:
        objstore.put(bucket, "named/shard", f.read())
    one = url.replace("/x/", "/named/shard")
    rs = s3_settings(objstore.options(), settings)
    assert full_stream(one, rs) == full_stream(paths[1], settings)


BIG_IPC_BATCHES, BIG_IPC_ROWS = 6, 20_000  # 160 KB of ids per batch: bodies > the read-ahead


@pytest.fixture(scope="module")
def big_ipc(tmp_path_factory) -> dict[str, str]:
    import pyarrow as pa

    root = tmp_path_factory.mktemp("big-ipc")
    out = {}
    for kind in ("file", "stream"):
        d = root / kind
        d.mkdir()
        batches = [
            pa.RecordBatch.from_arrays(
                [pa.array(range(b * BIG_IPC_ROWS, (b + 1) * BIG_IPC_ROWS), pa.int64())], ["id"]
            )
            for b in range(BIG_IPC_BATCHES)
        ]
        write_ipc(str(d / f"big.{'arrow' if kind == 'file' else 'arrows'}"), batches, kind)
        out[kind] = str(d)
    return out


@on_each_store("kind", {"file": "file", "stream": "stream"})
def test_remote_ipc_open_reads_headers_not_bodies(objstore, big_ipc, fault_proxy, kind):
    """Opening an IPC object fetches its footer and batch headers (a file) or walks its
    message headers with an adaptive read-ahead (a stream), never whole bodies: the bytes and
    requests the store counted, checked against what the counting proxy saw. A resume in the
    last batch fetches that batch and little else."""
    root = big_ipc[kind]
    url = objstore.upload(root, prefix=f"big-ipc-{kind}")
    size = sum(os.path.getsize(os.path.join(root, f)) for f in os.listdir(root))
    body = BIG_IPC_ROWS * 8
    seen: list = []
    proxy = fault_proxy(only=_recorder(seen))
    settings = dict(output="arrow", batch_size=1000, readahead_threads=0)
    rs = s3_settings(objstore.options(proxy.endpoint), settings)
    ds = make_ds(url, rs)
    opened = ds.stats()
    assert http_requests(opened) == len(seen) == proxy.stats()["requests"], (opened, seen)
    if kind == "file":
        # a listing, the 64 KiB tail (footer), one ranged GET per batch header
        assert opened["requests"] == 2 + BIG_IPC_BATCHES, opened
        assert opened["bytes"] <= 64 * 1024 + BIG_IPC_BATCHES * 1024, opened
    else:
        # a listing, the tail, then a read-ahead per message header: 64 KiB at first, down to
        # 4 KiB once bodies turn out larger than that (so not 64 KiB of body per message)
        assert opened["requests"] <= 3 + BIG_IPC_BATCHES, opened
        assert opened["bytes"] <= 3 * 64 * 1024, opened
    assert opened["bytes"] < size / 2, (opened, size)
    local = full_stream(root, settings)
    k = len(local) - 3  # inside the last batch
    loc = make_ds(root, settings)
    take(iter(loc), k)
    state = torch_roundtrip(loc.state_dict())
    before = ds.stats()["bytes"]
    ds.load_state_dict(state)
    assert keys_of(ds, True) == local[k:]
    assert ds.stats()["bytes"] - before < 1.2 * body, (ds.stats(), body)


def test_remote_ipc_stream_sidecar_opens_with_one_listing_and_one_get(s3, ipc_sets, moto_proxy):
    """``shardstream index`` records a stream's batch index (every message's offset and
    length): opening is then a listing and one GET, with the same fingerprint and stream."""
    root, _ = ipc_sets["stream"]
    url = s3.upload(root, bucket="ipc-indexed", cache=False)
    opts = s3.options()
    settings = dict(output="python", batch_size=5, shuffle_buffer=7, seed=3)
    fp = ParquetStream(url, storage_options=opts).catalog.fingerprint()
    cmd = [sys.executable, "-m", "shardstream", "index", url, "--json"]
    cmd += [f"--storage-option={k}={v}" for k, v in opts.items()]
    info = json.loads(subprocess.run(cmd, capture_output=True, text=True, check=True).stdout)
    assert info["shards"] == len(IPC_LAYOUT)
    seen: list = []
    proxy = moto_proxy(only=_recorder(seen))
    popts = s3.options(proxy.endpoint)
    ds = ParquetStream(url, storage_options=popts)
    assert [m for m, _ in seen] == ["GET", "GET"], seen  # the listing, the sidecar
    assert seen[1][1].endswith("_shardstream_index.json"), seen
    assert ds.catalog.fingerprint() == fp
    assert full_stream(url, s3_settings(popts, settings)) == full_stream(root, settings)


# fake-gcs-server ignores If-Match (see tests/objstore_server.py): S3 only.
def test_remote_ipc_object_rewritten_after_open_is_shard_error(s3, ipc_sets, tmp_path):
    root, paths = ipc_sets["file-lz4"]
    url = s3.upload(root, bucket="ipc-rewritten", cache=False)
    ds = ParquetStream(url, storage_options=s3.options(), output="python", batch_size=5)
    key = "data/" + os.path.basename(paths[1])
    other = write_ipc(str(tmp_path / "o.arrow"), [_ipc_batch(90_000, 20)], "file", "lz4")
    with open(other, "rb") as f:
        s3.put("ipc-rewritten", key, f.read())
    with pytest.raises(ShardError) as e:
        keys_of(ds, True)
    assert f"s3://ipc-rewritten/{key}" in str(e.value) and "changed" in str(e.value), e.value


@on_each_store(
    "cut",
    {
        "file-no-footer": ("file-lz4", 0.6, "no ARROW1 magic at the end"),
        "stream-mid-message": ("stream", 0.5, "runs past the end of the data"),
    },
)
def test_truncated_remote_ipc_object_is_shard_error_naming_it(objstore, ipc_sets, cut):
    name, frac, what = cut
    root, paths = ipc_sets[name]
    with open(paths[0], "rb") as f:
        data = f.read()
    bucket = f"ipc-cut-{name}"
    url = objstore.upload(root, bucket=bucket, cache=False)
    key = "data/" + os.path.basename(paths[0])
    objstore.put(bucket, key, data[: int(len(data) * frac)])
    with pytest.raises(ShardError) as e:
        ParquetStream(url, storage_options=objstore.options())
    assert url + os.path.basename(paths[0]) in str(e.value) and what in str(e.value), e.value


def test_remote_hf_save_to_disk_layout_equals_local(s3, tmp_path):
    """An HF ``save_to_disk`` directory in a bucket: its ``data-*.arrow`` streams in the order
    its ``state.json`` lists them (here not name order; one GET of it), ``state.json`` and
    ``dataset_info.json`` not data, the rows and order of the local directory, resumable
    across the two. A listed file missing from the bucket is named."""
    d = tmp_path / "hf"
    d.mkdir()
    files = []
    for i, sizes in enumerate([[6, 4], [9], [2, 5]]):
        name = f"data-{i:05d}-of-00003.arrow"
        first = 100 * i
        batches = [_ipc_batch(first + sum(sizes[:j]), n) for j, n in enumerate(sizes)]
        write_ipc(str(d / name), batches, "stream")
        files.append({"filename": name})
    order = [files[2], files[0], files[1]]
    (d / "state.json").write_text(json.dumps({"_data_files": order, "_fingerprint": "x"}))
    (d / "dataset_info.json").write_text("{}")
    url = s3.upload(str(d), bucket="hf-dir", cache=False)
    plain = dict(output="python", shuffle_buffer=0)
    want = list(range(200, 207)) + list(range(10)) + list(range(100, 109))
    assert full_stream(url, s3_settings(s3.options(), plain)) == want
    shards = make_ds(url, s3_settings(s3.options(), plain)).shards
    assert [u.rsplit("/", 1)[-1] for u in shards] == [f["filename"] for f in order]
    settings = dict(output="python", batch_size=4, shuffle_buffer=5, seed=4)
    rs = s3_settings(s3.options(), settings)
    local = full_stream(str(d), settings)
    assert full_stream(url, rs) == local
    assert make_ds(url, rs).catalog.fingerprint() == make_ds(str(d), settings).catalog.fingerprint()
    ds = make_ds(str(d), settings)
    take(iter(ds), 3)
    assert local[:3] + resume_rest(url, rs, torch_roundtrip(ds.state_dict())) == local
    s3.put(
        "hf-dir",
        "data/state.json",
        json.dumps({"_data_files": [{"filename": "gone.arrow"}]}).encode(),
    )
    with pytest.raises(
        FileNotFoundError,
        match=r"listed in s3://hf-dir/data/state\.json but missing: s3://hf-dir/data/gone\.arrow",
    ):
        ParquetStream(url, storage_options=s3.options())


DICT_WORDS, DICT_BATCHES = 20_000, 6


@on_each_store("kind", {"file": "file", "stream": "stream"})
def test_remote_ipc_dictionary_is_fetched_once(objstore, tmp_path, fault_proxy, kind):
    """Every record batch of an IPC object needs its (large) dictionary message: it is
    fetched for the first batch and then served from the store's cache, so reading every
    batch fetches the dictionary's bytes once (not once per batch); the rows are the local
    file's, and the store's counts are what the counting proxy saw."""
    import pyarrow as pa

    words = pa.array([f"word-{i:06d}" for i in range(DICT_WORDS)])
    batches = [
        pa.RecordBatch.from_arrays(
            [
                pa.array(range(b * 50, b * 50 + 50), pa.int64()),
                pa.DictionaryArray.from_arrays(
                    pa.array([(b * 50 + i) * 7 % DICT_WORDS for i in range(50)], pa.int32()), words
                ),
            ],
            ["id", "word"],
        )
        for b in range(DICT_BATCHES)
    ]
    root = tmp_path / kind
    root.mkdir()
    write_ipc(str(root / "dict.arrow"), batches, kind)
    dict_bytes = DICT_WORDS * (11 + 4)  # the values and offsets of the dictionary message
    url = objstore.upload(str(root), prefix=f"ipc-dict-{kind}", cache=False)
    seen: list = []
    proxy = fault_proxy(only=_recorder(seen))
    settings = dict(output="python", shuffle_buffer=0, readahead_threads=0)
    ds = make_ds(url, s3_settings(objstore.options(proxy.endpoint), settings))
    opened = ds.stats()["bytes"]
    got = [r for r in ds]
    pairs = [(r["id"], r["word"]) for r in got]
    assert pairs == [(r["id"], r["word"]) for r in make_ds(str(root), settings)]
    assert pairs[:2] == [(0, "word-000000"), (1, "word-000007")]
    assert [i for i, _ in pairs] == list(range(DICT_BATCHES * 50))
    fetched = ds.stats()["bytes"] - opened
    assert dict_bytes <= fetched < 1.5 * dict_bytes, (fetched, dict_bytes)
    assert http_requests(ds.stats()) == proxy.stats()["requests"] == len(seen), (ds.stats(), seen)
