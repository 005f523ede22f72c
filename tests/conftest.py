"""Shard-set fixtures (session scoped, written once with shardstream.datagen).

Named shard sets (each a directory; ``ShardSet.paths`` are the files in sorted order):

* ``small``       4 shards, 130/75/210/95 rows, uneven row groups, page index ON,
                  nulls, list<int32>, strings, dictionary column.
* ``small_nopi``  exactly the same rows and row groups, page index OFF, no dictionary encoding.
* ``special``     an empty file (0 rows, no row groups), a file whose only row group has
                  0 rows, and files with zero-row row groups between normal ones
                  (pyarrow 26 does write zero-row row groups: ``ParquetWriter.write_table``
                  of a 0-row table produces one; checked in ``test_fixture_layouts``).
* ``big``         2 larger shards (2500 rows each, row groups of ~1000).
* ``tiny``        40 tiny shards of 0..7 rows each.

``shard_factory(**write_shards_kwargs)`` builds (and caches) any other layout.
"""

from __future__ import annotations

import json
import os
from dataclasses import dataclass

import pytest
from shardstream import datagen

pytest_plugins = ["objstore_server"]  # moto server, S3 helpers, fault proxy (object-store tests)

try:  # hypothesis profile for test_properties
    from hypothesis import HealthCheck, settings

    settings.register_profile(
        "shardstream",
        deadline=None,
        max_examples=25,
        suppress_health_check=[HealthCheck.function_scoped_fixture, HealthCheck.too_slow],
    )
    settings.load_profile("shardstream")
except ImportError:  # pragma: no cover
    pass


@dataclass(frozen=True)
class ShardSet:
    root: str
    paths: tuple[str, ...]
    kwargs: dict

    @property
    def num_rows(self) -> int:
        import pyarrow.parquet as pq

        return sum(pq.ParquetFile(p).metadata.num_rows for p in self.paths)

    @property
    def ids(self) -> list[int]:
        from harness import all_ids

        return all_ids(self.paths)

    @property
    def tokens_len(self):
        return tuple(self.kwargs.get("tokens_len", (0, 16)))

    @property
    def nulls(self) -> bool:
        return self.kwargs.get("nulls", True)


SPECIAL_LAYOUT = [[40, 0, 25], [], [0], [30, 30, 1], [17], [0, 9, 0]]


@pytest.fixture(scope="session")
def shard_factory(tmp_path_factory):
    cache: dict[str, ShardSet] = {}

    def make(**kwargs) -> ShardSet:
        key = json.dumps(kwargs, sort_keys=True, default=str)
        if key not in cache:
            root = str(tmp_path_factory.mktemp("shards"))
            paths = datagen.write_shards(root, **kwargs)
            cache[key] = ShardSet(root, tuple(paths), dict(kwargs))
        return cache[key]

    return make


SMALL = dict(num_shards=4, rows_per_shard=[130, 75, 210, 95], seed=3)


@pytest.fixture(scope="session")
def small(shard_factory) -> ShardSet:
    return shard_factory(**SMALL, page_index=True)


@pytest.fixture(scope="session")
def small_nopi(shard_factory, small) -> ShardSet:
    s = shard_factory(**SMALL, page_index=False, dictionary=False, compression="snappy")
    return s


@pytest.fixture(scope="session", params=[True, False], ids=["pageindex", "nopageindex"])
def small_any(request, small, small_nopi) -> ShardSet:
    return small if request.param else small_nopi


@pytest.fixture(scope="session")
def special(shard_factory) -> ShardSet:
    return shard_factory(row_group_size=SPECIAL_LAYOUT, seed=5)


@pytest.fixture(scope="session")
def big(shard_factory) -> ShardSet:
    return shard_factory(num_shards=2, rows_per_shard=2500, row_group_size=1000, tokens_len=(4, 64))


@pytest.fixture(scope="session")
def tiny(shard_factory) -> ShardSet:
    rows = [(i * 5) % 8 for i in range(40)]
    return shard_factory(num_shards=40, rows_per_shard=rows, seed=11)


@pytest.fixture(autouse=True)
def _no_dist_env(monkeypatch):
    """rank/world_size default from env; keep the environment out of the tests."""
    for var in ("RANK", "WORLD_SIZE", "LOCAL_RANK", "LOCAL_WORLD_SIZE"):
        monkeypatch.delenv(var, raising=False)


def pytest_configure(config):
    os.environ.setdefault("OMP_NUM_THREADS", "1")
    # When a hypothesis test fails, hypothesis' pytest plugin imports libcst (to print an
    # explicit-example patch), which triggers mypy_extensions' TypedDict DeprecationWarning;
    # with filterwarnings=error that turns a normal test failure into an INTERNALERROR that
    # aborts the whole session. Not our code: ignore exactly that warning.
    config.addinivalue_line(
        "filterwarnings", "ignore:mypy_extensions.TypedDict is deprecated:DeprecationWarning"
    )
