"""What the benches share on the parent side: fresh child processes, the machine load, a busy
core, medians with their spread, and markdown tables.  The measuring loops themselves (one
pass, a resume, ``state_dict()`` latencies, the pyarrow baselines) are
``shardstream.cli.bench``'s, which ``shardstream bench`` uses too.

Two kinds of fresh process: :func:`run_child` starts a new interpreter (it pays the imports,
~1.5 s with torch); :func:`run_forked` forks one from a server process that imported the
libraries once and has run nothing else (multiprocessing's forkserver), so a bench of
hundreds of runs does not spend minutes importing torch.  Either way nothing measured
before runs in the process.
"""

from __future__ import annotations

import json
import multiprocessing
import os
import statistics
import subprocess
import sys
import tempfile
import time
import traceback
from collections.abc import Iterator, Sequence
from contextlib import contextmanager
from typing import Any


def load1() -> float:
    """The machine's 1-minute load average (0.0 where the OS has none)."""
    try:
        return os.getloadavg()[0]
    except (AttributeError, OSError):  # pragma: no cover - not Unix
        return 0.0


def run_child(script: str, spec: dict, timeout: float = 1800) -> dict:
    """Run ``script --child <spec as JSON>`` in a fresh interpreter; its result is the JSON on
    the last line of its stdout, with the 1-minute load average at its start added as
    ``load``."""
    load = load1()
    cmd = [sys.executable, os.path.abspath(script), "--child", json.dumps(spec)]
    p = subprocess.run(cmd, capture_output=True, text=True, timeout=timeout)
    if p.returncode != 0:
        sys.stderr.write(p.stdout + p.stderr)
        raise RuntimeError(f"benchmark child {spec['kind']} failed (exit {p.returncode})")
    out = json.loads(p.stdout.strip().splitlines()[-1])
    if isinstance(out, dict):
        out.setdefault("load", load)
    return out


_SERVER: Any = None


def callgrind_window(
    argv: Sequence[str], marks: tuple[str, str], timeout: float, keep: str | None = None
) -> tuple[int, list[list[str]]]:
    """Instructions (all threads) a child spends between two marks, under callgrind.

    ``argv`` (after the interpreter) starts the child with instrumentation off; the child prints
    a line starting with ``marks[0]``, waits for a line on stdin, does the measured work, prints
    a line starting with ``marks[1]`` and waits again. Instrumentation is switched on
    (``callgrind_control``) at the first mark and off at the second. Returns the instructions
    and the two mark lines split into words. ``keep``: also copy callgrind's output to that
    path (for ``callgrind_annotate --inclusive=yes``)."""

    def control(pid: int, on: str) -> None:
        subprocess.run(["callgrind_control", "-i", on, str(pid)], check=True, capture_output=True)

    with tempfile.TemporaryDirectory(prefix="cg-") as tmp:
        out = os.path.join(tmp, "cg.out")
        cmd = [
            "valgrind", "--tool=callgrind", "--instr-atstart=no", f"--callgrind-out-file={out}",
            sys.executable, *argv,
        ]  # fmt: skip
        p = subprocess.Popen(
            cmd, stdin=subprocess.PIPE, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True
        )
        assert p.stdin is not None and p.stdout is not None
        lines = []
        try:
            for step in marks:
                line = p.stdout.readline().split()
                if not line or line[0] != step:
                    raise RuntimeError(f"callgrind run: expected {step!r}, got {line!r}: {argv}")
                lines.append(line)
                control(p.pid, "on" if step == marks[0] else "off")
                p.stdin.write("\n")
                p.stdin.flush()
            _, err = p.communicate(timeout=timeout)
        finally:
            if p.poll() is None:
                p.kill()
                p.wait()
        if p.returncode != 0:
            raise RuntimeError(f"callgrind run failed: {argv}\n{err[-4000:]}")
        if keep:
            import shutil

            os.makedirs(os.path.dirname(keep) or ".", exist_ok=True)
            shutil.copy(out, keep)
        with open(out) as f:
            for line in f:
                if line.startswith("totals:"):
                    return int(line.split()[1]), lines
    raise RuntimeError("no totals in the callgrind output")


def forkserver_available() -> bool:
    return "forkserver" in multiprocessing.get_all_start_methods()


def _server(preload: Sequence[str]) -> Any:
    global _SERVER
    if _SERVER is None:
        ctx = multiprocessing.get_context("forkserver")
        ctx.set_forkserver_preload(list(preload))
        _SERVER = ctx
    return _SERVER


def _forked(target: Any, spec: dict, conn: Any) -> None:
    # As in a new interpreter: the platform's default start method (a DataLoader's workers),
    # not the forkserver this process came from.
    multiprocessing.set_start_method(None, force=True)
    # Output (library warnings, workers' too) is kept and shown only if the run fails, as
    # run_child does with a new interpreter's.
    log = tempfile.TemporaryFile(mode="w+")
    sys.stdout.flush()
    sys.stderr.flush()
    os.dup2(log.fileno(), 1)
    os.dup2(log.fileno(), 2)
    try:
        result = ("ok", target(spec))
    except BaseException:
        sys.stdout.flush()
        sys.stderr.flush()
        log.seek(0)
        result = ("error", log.read() + traceback.format_exc())
    conn.send(result)
    conn.close()
    # No interpreter teardown: pyarrow's thread pool can hang at exit after a scan was
    # abandoned mid-way (datasets streaming stopped after n rows); the result is out.
    os._exit(0)


def run_forked(target: Any, spec: dict, preload: Sequence[str], timeout: float = 1800) -> dict:
    """``target(spec)`` in a process forked from the server that imported ``preload`` (started
    on first use); its result (a dict) with the 1-minute load average at its start added as
    ``load``.  ``target`` must be importable (a module-level function)."""
    ctx = _server(preload)
    recv, send = ctx.Pipe(duplex=False)
    load = load1()
    p = ctx.Process(target=_forked, args=(target, spec, send))
    p.start()
    send.close()
    try:
        if not recv.poll(timeout):
            raise RuntimeError(f"benchmark child {spec['kind']} timed out after {timeout:.0f}s")
        status, out = recv.recv()
    except EOFError:
        p.join(10)
        raise RuntimeError(
            f"benchmark child {spec['kind']} died (exit {p.exitcode}; output above)"
        ) from None
    finally:
        p.join(30)
        if p.is_alive():
            p.kill()
            p.join()
    if status != "ok":
        sys.stderr.write(out)
        raise RuntimeError(f"benchmark child {spec['kind']} failed (output above)")
    if isinstance(out, dict):
        out.setdefault("load", load)
    return out


def runs_interleaved(
    target: Any, specs: Sequence[dict], runs: int, preload: Sequence[str]
) -> list[list[dict]]:
    """Every spec ``runs`` times through :func:`run_forked`, interleaved (spec 1, spec 2, ...,
    spec 1, ...), so a change in the machine's load falls on every spec alike: one list of
    results per spec, in ``specs``' order."""
    out: list[list[dict]] = [[] for _ in specs]
    for _ in range(runs):
        for i, s in enumerate(specs):
            out[i].append(run_forked(target, s, preload))
    return out


def busy_core_available() -> bool:
    return hasattr(os, "sched_setaffinity") and len(os.sched_getaffinity(0)) >= 2


@contextmanager
def busy_core() -> Iterator[int]:
    """A process spinning a Python loop pinned to one core (the highest this process may use)
    for as long as the block runs: "one core busy elsewhere".  Yields the core's number."""
    core = max(os.sched_getaffinity(0))
    code = f"import os\nos.sched_setaffinity(0, {{{core}}})\nprint(flush=True)\nwhile True: pass\n"
    p = subprocess.Popen([sys.executable, "-c", code], stdout=subprocess.PIPE)
    try:
        assert p.stdout is not None
        p.stdout.readline()  # pinned and about to spin
        time.sleep(0.2)
        yield core
    finally:
        p.kill()
        p.wait()


def summary(values: Sequence[float]) -> dict[str, float]:
    """Median, minimum, maximum and count of ``values``."""
    return {
        "median": statistics.median(values),
        "min": min(values),
        "max": max(values),
        "n": len(values),
    }


def with_spread(values: Sequence[float], fmt: Any) -> str:
    """``fmt(median)`` and, for more than one value, ``(fmt(min)–fmt(max))``."""
    s = summary(values)
    if s["n"] == 1:
        return fmt(s["median"])
    return f"{fmt(s['median'])} ({fmt(s['min'])}–{fmt(s['max'])})"


def mrows(x: float) -> str:
    """A rate in millions of rows, two decimals (``0.48``); the header says "M rows/s"."""
    return f"{x / 1e6:.2f}" if x < 1e8 else f"{x / 1e6:.0f}"


def krows(x: float) -> str:
    """A rate in thousands of rows (``37.5``); the header says "k rows/s"."""
    return f"{x / 1e3:.1f}" if x < 1e5 else f"{x / 1e3:.0f}"


def load_range(runs: Sequence[dict]) -> str:
    loads = [r["load"] for r in runs if "load" in r]
    if not loads:
        return "-"
    lo, hi = min(loads), max(loads)
    return f"{lo:.1f}" if f"{lo:.1f}" == f"{hi:.1f}" else f"{lo:.1f}–{hi:.1f}"


def print_table(
    table: Sequence[Sequence[str]],
    headers: Sequence[str] = ("benchmark", "shardstream", "baseline (same run)", "ratio"),
    title: str | None = None,
) -> None:
    """A markdown table (with a title line above it, if given)."""
    print()
    if title:
        print(title)
        print()
    print("| " + " | ".join(headers) + " |")
    print("|" + "---|" * len(headers))
    for row in table:
        print("| " + " | ".join(row) + " |")


def write_json(results: Any, path: str | None) -> None:
    if path:
        with open(path, "w") as f:
            json.dump(results, f, indent=2)
