"""Smoke test of an installed shardstream on any CPython >= 3.10, without torch.

Run by ``make wheel-smoke`` inside a venv of another interpreter that has only the wheel
and its dependencies (numpy, pyarrow): the abi3 extension imports, a shuffled stream resumes
exactly from a JSON state, and the command line works (``inspect``, ``state --source``).
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
import tempfile

import shardstream
import shardstream.datagen as dg
from shardstream import ParquetStream


def stream(d: str) -> ParquetStream:
    return ParquetStream(
        d, columns=["id", "tokens"], batch_size=50, shuffle_buffer=100, seed=1, output="python"
    )


def main() -> int:
    d = tempfile.mkdtemp(prefix="shardstream-smoke-")
    dg.write_shards(d, num_shards=3, rows_per_shard=500)
    ref = [b["id"] for b in stream(d)]
    ds = stream(d)
    it = iter(ds)
    before = [next(it)["id"] for _ in range(7)]
    path = os.path.join(d, "state.json")
    with open(path, "w") as f:
        json.dump(ds.state_dict(), f)
    resumed = stream(d)
    with open(path) as f:
        resumed.load_state_dict(json.load(f))
    after = [b["id"] for b in resumed]
    assert before + after == ref, "resumed stream differs"
    assert sorted(i for b in ref for i in b) == list(range(1500))
    cli = [sys.executable, "-m", "shardstream"]
    out = subprocess.run([*cli, "inspect", d, "--json"], capture_output=True, text=True)
    assert out.returncode == 0 and json.loads(out.stdout)["totals"]["rows"] == 1500, out.stderr
    out = subprocess.run([*cli, "state", path, "--source", d], capture_output=True, text=True)
    assert out.returncode == 0 and "can be loaded" in out.stdout, out.stdout + out.stderr
    print(
        f"smoke OK: CPython {sys.version.split()[0]}, shardstream {shardstream.__version__} "
        f"from {os.path.dirname(shardstream.__file__)}"
    )
    return 0


if __name__ == "__main__":
    sys.exit(main())
