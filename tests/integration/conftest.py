"""Fixtures of the framework recipes; helpers are in trainer_jobs.py (the jobs import it too)."""

from __future__ import annotations

import pytest
from trainer_jobs import LAYOUT, N_ROWS


@pytest.fixture(scope="session")
def rows(shard_factory):
    s = shard_factory(**LAYOUT)
    assert sorted(s.ids) == list(range(N_ROWS))
    return s.root
