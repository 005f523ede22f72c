"""What is in the tail of ``state_dict()`` (issue #14 goal 5): per call, wall and thread-CPU
time, the freeing of the previous state timed apart, minor faults and involuntary context
switches of the calling thread, and two controls run in the same loop iteration right after
the call: three 80 kB Latin-1 decodes (allocation-heavy work of about the call's size) and
two scans of 80 kB (no allocation).

    PYTHONPATH=python .venv/bin/python benches/state_tail.py DATA_DIR [--readahead N]
        [--calls 2000] [--buffer 10000] [--rows-out FILE]

DATA_DIR: `[id, tokens]` shards, e.g. `bench-data/rows2000000-shards8` as `benches/bench.py`
writes them. Prints one JSON line: p50 / p90 / p99 / max in microseconds of each column, how
many calls were preempted (wall exceeds CPU by more than 50 us), the CPU p99 of the others,
and of the slowest 1% of calls (by CPU) how many also had a control above its p90 (by chance
~10%: more means the slow calls come in slow moments of the machine, not slow work).
"""

from __future__ import annotations

import argparse
import json
import resource
import time


def pct(values: list[float], q: float) -> float:
    v = sorted(values)
    k = max(1, -(-len(v) * q // 100))
    return v[int(k) - 1]


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("data")
    ap.add_argument("--readahead", type=int, default=None, help="readahead_threads (default)")
    ap.add_argument("--calls", type=int, default=2000)
    ap.add_argument("--buffer", type=int, default=10_000)
    ap.add_argument("--rows-out", help="write the per-call rows (JSON) here")
    a = ap.parse_args()
    from shardstream import ParquetStream

    kw: dict = dict(columns=["id", "tokens"], batch_size=1024, output="arrow", epochs=None)
    kw["shuffle_buffer"] = a.buffer
    if a.readahead is not None:
        kw["readahead_threads"] = a.readahead
    ds = ParquetStream(a.data, **kw)
    raw = bytes(range(256)) * 313  # ~80 kB with high characters: a UCS1 str like the buffer's
    who = resource.RUSAGE_THREAD
    pc, tt, ru = time.perf_counter, time.thread_time, resource.getrusage
    rows: list[tuple[float, ...]] = []
    seen, st = 0, None
    for b in ds:
        seen += b.num_rows
        if seen < a.buffer:
            continue
        r0 = ru(who)
        t0, c0 = pc(), tt()
        new = ds.state_dict()
        c1, t1 = tt(), pc()
        st = new  # frees the previous state
        c2 = tt()
        x, y, z = raw.decode("latin-1"), raw.decode("latin-1"), raw.decode("latin-1")
        c3 = tt()
        raw.find(b"\x00\x01\x03")
        raw.find(b"\x00\x01\x03")
        c4 = tt()
        r1 = ru(who)
        del x, y, z
        rows.append(
            (
                t1 - t0,
                c1 - c0,
                c2 - c1,
                c3 - c2,
                c4 - c3,
                r1.ru_minflt - r0.ru_minflt,
                r1.ru_nivcsw - r0.ru_nivcsw,
            )
        )
        if len(rows) >= a.calls:
            break
    del st

    def us(x: float) -> float:
        return round(x * 1e6, 1)

    cols = {"wall": 0, "cpu": 1, "free_previous_cpu": 2, "decodes_cpu": 3, "scans_cpu": 4}
    out: dict = {
        c: [us(pct([r[i] for r in rows], q)) for q in (50, 90, 99)] + [us(max(r[i] for r in rows))]
        for c, i in cols.items()
    }
    calm = [r[1] for r in rows if r[0] - r[1] <= 50e-6]
    out["preempted_calls"] = len(rows) - len(calm)
    out["not_preempted_cpu_p99"] = us(pct(calm, 99))
    slow = sorted(rows, key=lambda r: -r[1])[: max(1, len(rows) // 100)]
    p90 = pct([r[3] for r in rows], 90)
    out["slowest_1pct"] = {
        "calls": len(slow),
        "decodes_above_p90": sum(1 for r in slow if r[3] >= p90),
        "minor_faults": sum(r[5] for r in slow),
        "with_involuntary_switch": sum(1 for r in slow if r[6]),
    }
    out["calls"] = len(rows)
    print(json.dumps(out))
    if a.rows_out:
        with open(a.rows_out, "w") as f:
            json.dump(rows, f)


if __name__ == "__main__":
    main()
