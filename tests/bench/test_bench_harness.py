"""``benches/bench.py --quick`` on two cheap sections, so the harness behind ``make bench`` cannot
rot unnoticed: every run reads every row, pyarrow is measured at each batch size, rates come
with CPU time and the machine load, state_dict() percentiles are ordered, docs/benchmarks.md
shows the header rows the run prints. Not a speed test: no figure is compared with a
threshold."""

from __future__ import annotations

import json
import os
import subprocess
import sys

ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
BENCH = os.path.join(ROOT, "benches", "bench.py")


def test_bench_quick_iter_and_state(tmp_path):
    out = tmp_path / "results.json"
    cmd = [
        sys.executable, BENCH, "--quick", "--only", "iter,state", "--workloads", "flat",
        "--conditions", "free,ra0", "--pa-batch-sizes", "1024,65536", "--buffers", "0,2000",
        "--data-root", str(tmp_path / "data"), "--json", str(out),
    ]  # fmt: skip
    env = dict(os.environ, PYTHONPATH=os.pathsep.join(sys.path))
    p = subprocess.run(cmd, capture_output=True, text=True, timeout=240, env=env)
    assert p.returncode == 0, p.stdout + p.stderr
    res = json.loads(out.read_text())

    passes = res["passes"]
    assert sorted(passes) == [
        "flat/free/pa1024", "flat/free/pa65536", "flat/free/ss", "flat/free/ss_ra0",
    ]  # fmt: skip
    for key, runs in passes.items():
        assert len(runs) == 1, key  # --quick: one run each
        r = runs[0]
        assert r["rows_per_pass"] == 20_000 and r["rows"] == 20_000 * r["passes"], (key, r)
        assert r["seconds"] >= 0.1 and r["cpu_seconds"] > 0, (key, r)  # --min-time 0.1
        assert isinstance(r["load"], float) and r["rss_peak_mb"] >= r["rss_base_mb"] > 0

    state = res["state"]
    assert sorted(state) == ["0", "2000"]
    for sb, (r,) in state.items():
        assert r["calls"] == 100, (sb, r)  # --quick: 100 calls, endless epochs
        assert 0 < r["p50_us"] <= r["p90_us"] <= r["p99_us"] <= r["max_us"], (sb, r)
    # A state with 2,000 buffered rows carries them; one without a buffer does not.
    assert state["2000"][0]["pickled_bytes"] > state["0"][0]["pickled_bytes"] + 2000

    text = p.stdout
    for needle in (
        "(a)/(b) iteration",
        "| [id, score] int64, float64 | 2 cores free |",
        "| [id, score] int64, float64 | readahead_threads=0 |",
        "wall ratio | CPU ratio | load |",
        "pyarrow iter_batches by batch size",
        "(d) state_dict() after every batch",
        "| 2,000 | 100 |",
        "load average",
    ):
        assert needle in text, (needle, text)
    # pyarrow's winner is named, for wall time and for CPU time, and is one of those measured
    flat_row = next(line for line in text.splitlines() if "| 2 cores free |" in line)
    assert flat_row.count("@1024") + flat_row.count("@65536") == 2, flat_row
    # docs/benchmarks.md shows the tables' header rows as printed
    with open(os.path.join(ROOT, "docs", "benchmarks.md")) as f:
        doc = f.read()
    heads = [line for line in text.splitlines() if line.startswith("| workload | condition |")]
    heads += [line for line in text.splitlines() if line.startswith("| shuffle_buffer | calls |")]
    assert len(heads) == 3, heads  # (a), pyarrow by batch size, (d)
    assert heads[0] in doc and heads[2] in doc, heads
