"""Arguments at their extremes: each case runs in a subprocess under an address-space cap
(2 GiB over what the process maps after its imports) and a time limit, and either is refused
with a ``ValueError``/``TypeError``/``IndexError`` whose message names the argument, or yields
its first items within those limits. Never a hang, an abort, or memory reserved in proportion to
an argument before there are rows to fill it (docs/reliability.md, "Arguments that hung or
aborted, fixed": a stratified block of 10**12 items hung its first item; 64 packed rows of
2**24 tokens reserved 8 GiB a column and aborted under ``ulimit -v``).
"""

from __future__ import annotations

import os
import subprocess
import sys
import textwrap

import pytest

pytestmark = pytest.mark.skipif(not sys.platform.startswith("linux"), reason="/proc, rlimits")

# (case, expression building the dataset or making the call, what a refusal must name or None
# when it must run). `srcs()` are two endless ("cycle") sources of 100 rows each.
CASES = [
    ("stratified block 10**12", "mix(mixing='stratified', block=10**12, batch_size=4)", "block"),
    ("stratified batch 10**12", "mix(mixing='stratified', batch_size=10**12)", "batch_size"),
    ("stratified block at the limit", "mix(mixing='stratified', block=2**20, batch_size=4)", None),
    ("batch 10**12, sources that end", "mix(batch_size=10**12, on_exhausted='drop')", None),
    ("batch 2**62, a source that stops", "mix(batch_size=2**62, on_exhausted='stop')", None),
    ("batch 10**12, samples 10", "mix(batch_size=10**12, samples=10)", None),
    ("samples 2**63", "mix(batch_size=4, samples=2**63)", "samples"),
    ("max_epochs 2**63", "mix(batch_size=4, max_epochs=2**63)", "max_epochs"),
    ("weights inf", "mix(batch_size=4, weights={'a': float('inf'), 'b': 1})", "weight"),
    ("weights tiny", "mix(batch_size=4, weights={'a': 1e-300, 'b': 1})", None),
    ("schedule point 2**63", "mix(batch_size=4, weights=[(0, W), (2**63, W)])", "item"),
    ("schedule of 5,000 points", "mix(batch_size=4, weights=[(i, W) for i in range(5000)])", None),
    ("world_size 2**40", "mix(batch_size=4, rank=0, world_size=2**40)", "world_size"),
    ("pack seq_len 10**12", "stream(pack=Pack(column='tokens', seq_len=10**12))", "seq_len"),
    (
        "pack seq_len 2**24, batch 64",
        "stream(batch_size=64, pack=Pack(column='tokens', seq_len=2**24))",
        None,
    ),
    (
        "pack buffer_docs 10**12",
        "stream(pack=Pack(column='tokens', algorithm='best_fit', buffer_docs=10**12))",
        "buffer_docs",
    ),
    (
        "mixture pack seq_len 2**24",
        "mix(batch_size=64, samples=64, pack=Pack(column='tokens', seq_len=2**24))",
        None,
    ),
    ("read_batch_rows 10**12", "stream(read_batch_rows=10**12)", "read_batch_rows"),
    ("shuffle_buffer 2**62", "stream(shuffle_buffer=2**62)", "shuffle_buffer"),
    (
        "the largest tuning",
        "stream(readahead_threads=256, readahead_depth=1024, read_batch_rows=2**20)",
        None,
    ),
    ("batch_size 2**62, buffer", "stream(batch_size=2**62, shuffle_buffer=10)", None),
    ("set_epoch 2**62", "stream(epochs=None, shuffle_buffer=7).set_epoch_then(2**62)", None),
    (
        "page_cache_bytes 2**62",
        "ParquetRows(ROOT + '/a', columns=['id'], page_cache_bytes=2**62)",
        "page_cache_bytes",
    ),
    ("index 2**62", "ParquetRows(ROOT + '/a', columns=['id']).__getitems__([2**62])", "index"),
    ("sampler over 2**62 rows", "ResumableSampler(2**62, block_size=2**32, window=2**20)", None),
    ("sampler block_size 10**15", "ResumableSampler(1000, block_size=10**15)", "block_size"),
]

PRELUDE = """
import itertools, os, resource, sys
from shardstream import Mixture, Pack, ParquetRows, ParquetStream, ResumableSampler, datagen
ROOT = sys.argv[1]
W = {'a': 1, 'b': 2}
for i, n in enumerate('ab'):
    d = os.path.join(ROOT, n)
    if not os.path.isdir(d):
        datagen.write_shards(d, num_shards=2, rows_per_shard=50, row_group_size=16,
                             tokens_len=(4, 20), start_id=1000 * i, seed=i)
def srcs():
    return {n: ParquetStream(os.path.join(ROOT, n), columns=['id', 'tokens']) for n in 'ab'}
def mix(**kw):
    kw.setdefault('weights', W)
    return Mixture(srcs(), output='arrow', **kw)
class _S(ParquetStream):
    def set_epoch_then(self, e):
        self.set_epoch(e)
        return self
def stream(**kw):
    kw.setdefault('batch_size', 4)
    return _S(os.path.join(ROOT, 'a'), columns=['id', 'tokens'], output='arrow', **kw)
with open('/proc/self/statm') as f:
    mapped = int(f.read().split()[0]) * resource.getpagesize()
resource.setrlimit(resource.RLIMIT_AS, (mapped + (2 << 30), resource.RLIM_INFINITY))
"""

BODY = """
try:
    ds = {expr}
    n = sum(1 for _ in itertools.islice(iter(ds), 20)) if hasattr(ds, '__iter__') else 1
    print('RAN', n)
except (ValueError, TypeError, IndexError) as e:
    print('REFUSED', type(e).__name__, e)
"""


@pytest.fixture(scope="module")
def root(tmp_path_factory):
    return str(tmp_path_factory.mktemp("arguments"))


@pytest.mark.parametrize(("case", "expr", "named"), CASES, ids=[c[0] for c in CASES])
def test_arguments_at_their_extremes(root, case, expr, named):
    code = PRELUDE + textwrap.dedent(BODY).format(expr=expr)
    env = {**os.environ, "PYTHONPATH": os.pathsep.join(sys.path), "OPENBLAS_NUM_THREADS": "1"}
    try:
        out = subprocess.run(
            [sys.executable, "-c", code, root], capture_output=True, text=True, env=env, timeout=60
        )
    except subprocess.TimeoutExpired:
        pytest.fail(f"{case}: no item and no error within 60 s")
    assert out.returncode == 0, f"{case}: exit {out.returncode}\n{out.stderr[-3000:]}"
    last = out.stdout.strip().splitlines()[-1]
    if named is None:
        assert last.startswith("RAN ") and int(last.split()[1]) > 0, (case, last)
    else:
        assert last.startswith("REFUSED ") and named in last, (case, last)
