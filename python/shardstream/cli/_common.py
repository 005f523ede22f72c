"""What every command shares: the one-line error, text tables, sizes, JSON output, option
parsing, help text from docstrings, and the generated data of ``demo`` and ``bench``."""

from __future__ import annotations

import argparse
import json
import math
import os
import re
import stat
import sys
from collections.abc import Callable, Sequence
from typing import Any

from ..datagen import write_shards
from ._progress import Progress


class CliError(Exception):
    """An error reported as one line on stderr with exit status ``code`` (no traceback)."""

    def __init__(self, message: str, code: int = 2) -> None:
        super().__init__(message)
        self.code = code


# Ranges of the generated data's arguments (``demo``, ``bench``). --rows: ~16 B of shards per
# row on disk and ~40 B of row ids in memory for demo's check; --shards: one file each (and the
# names shard-NNNNN sort in order); --workers: one process each; the others: the core's own.
MAX_ROWS = 100_000_000
MAX_SHARDS = 10_000
MAX_WORKERS = 64
MAX_SHUFFLE_BUFFER = 2**32 - 1
MAX_SEED = 2**64 - 1


def check_rows(args: argparse.Namespace) -> None:
    """The generated data's arguments together: every shard gets rows, and an epoch has at
    least two batches (so a stop or a resume point falls inside it).

    >>> try:
    ...     check_rows(argparse.Namespace(rows=100, shards=4, batch_size=100))
    ... except CliError as e:
    ...     print(str(e).split(":")[0])
    --rows (100) must be more than --batch-size (100)
    """
    if args.rows < args.shards:
        raise CliError(
            f"--rows ({args.rows:,}) must be at least --shards ({args.shards:,}): every shard "
            "gets rows"
        )
    if args.rows <= args.batch_size:
        raise CliError(
            f"--rows ({args.rows:,}) must be more than --batch-size ({args.batch_size:,}): an "
            "epoch needs at least two batches"
        )


def add_data_arguments(p: argparse.ArgumentParser, rows: int, shards: int) -> None:
    """``--rows`` and ``--shards`` of the generated data (``demo``, ``bench``), checked
    together by :func:`check_rows`."""
    p.add_argument(
        "--rows",
        type=int_in(2, MAX_ROWS),
        default=rows,
        help="total rows, more than --batch-size (%(default)s)",
    )
    p.add_argument(
        "--shards",
        type=int_in(1, MAX_SHARDS),
        default=shards,
        help="shards, at most --rows (%(default)s)",
    )


def int_in(lo: int, hi: int) -> Callable[[str], int]:
    """An argparse ``type``: an int in ``[lo, hi]``; otherwise argparse's usage error, exit 2,
    naming the argument and the range (before the command does any work).

    >>> int_in(1, 10)("7")
    7
    >>> int_in(1, 10)("0")
    Traceback (most recent call last):
    ...
    argparse.ArgumentTypeError: expected an integer from 1 to 10, got '0'
    """

    def parse(text: str) -> int:
        try:
            value = int(text)
        except ValueError:
            value = None
        if value is None or not lo <= value <= hi:
            raise argparse.ArgumentTypeError(
                f"expected an integer from {_num(lo)} to {_num(hi)}, got {text!r}"
            )
        return value

    return parse


def _num(n: int) -> str:
    return f"2**{n.bit_length()}-1" if n > 10**12 and (n + 1) & n == 0 else f"{n:,}"


def fraction(text: str) -> float:
    """An argparse ``type``: a number strictly between 0 and 1.

    >>> fraction("0.4")
    0.4
    >>> fraction("1.5")
    Traceback (most recent call last):
    ...
    argparse.ArgumentTypeError: expected a fraction strictly between 0 and 1, got '1.5'
    """
    try:
        value = float(text)
    except ValueError:
        value = math.nan
    if not 0.0 < value < 1.0:  # also NaN
        raise argparse.ArgumentTypeError(
            f"expected a fraction strictly between 0 and 1, got {text!r}"
        )
    return value


_SPECIAL = (
    (stat.S_ISFIFO, "a named pipe"),
    (stat.S_ISSOCK, "a socket"),
    (stat.S_ISCHR, "a character device"),
    (stat.S_ISBLK, "a block device"),
)


def special_kind(mode: int) -> str | None:
    """What a file of ``st_mode`` ``mode`` is if it is neither a regular file nor a directory
    (reading a FIFO or a terminal waits for a writer, forever); None for those two."""
    if stat.S_ISREG(mode) or stat.S_ISDIR(mode):
        return None
    return next((what for test, what in _SPECIAL if test(mode)), "not a regular file")


def refuse_special(path: str, expected: str = "a file") -> None:
    """CliError if ``path`` exists and is a FIFO, socket or device (not followed by a missing
    or unreadable path: the reader reports those)."""
    try:
        mode = os.stat(path).st_mode
    except (OSError, ValueError):
        return
    what = special_kind(mode)
    if what is not None:
        raise CliError(f"{path}: not a regular file ({what}); expected {expected}")


def human_bytes(n: float) -> str:
    """``1536`` -> ``'1.5 KiB'``.

    >>> human_bytes(0), human_bytes(1536), human_bytes(5 * 2**30)
    ('0 B', '1.5 KiB', '5.0 GiB')
    """
    for unit in ("B", "KiB", "MiB", "GiB", "TiB"):
        if abs(n) < 1024 or unit == "TiB":
            return f"{n:.0f} {unit}" if unit == "B" else f"{n:.1f} {unit}"
        n /= 1024
    raise AssertionError  # pragma: no cover


def table(headers: Sequence[str], rows: Sequence[Sequence[Any]], right: Sequence[bool]) -> str:
    """Plain-text table with aligned columns (``right[i]``: right-align column ``i``).

    >>> print(table(["name", "rows"], [["a", "1,000"], ["bb", "7"]], [False, True]))
    name   rows
    a     1,000
    bb        7
    """
    cells = [[str(h) for h in headers]] + [[str(c) for c in r] for r in rows]
    widths = [max(len(r[i]) for r in cells) for i in range(len(headers))]
    lines = []
    for r in cells:
        parts = [
            c.rjust(w) if right[i] else c.ljust(w)
            for i, (c, w) in enumerate(zip(r, widths, strict=True))
        ]
        lines.append("  ".join(parts).rstrip())
    return "\n".join(lines)


def emit_json(obj: Any) -> None:
    """``obj`` as indented JSON on stdout (``--json``: the interface for scripts)."""
    json.dump(obj, sys.stdout, indent=2, sort_keys=False, default=str)
    sys.stdout.write("\n")


def parse_storage_options(items: Sequence[str] | None) -> dict[str, str] | None:
    """``--storage-option KEY=VALUE`` arguments as ``ParquetStream``'s ``storage_options``.

    >>> parse_storage_options(["region=eu-west-1", "endpoint=http://h:9000/x=y"])
    {'region': 'eu-west-1', 'endpoint': 'http://h:9000/x=y'}
    >>> parse_storage_options(["region"])
    Traceback (most recent call last):
    ...
    shardstream.cli._common.CliError: --storage-option expects KEY=VALUE, got 'region'
    """
    if not items:
        return None
    out = {}
    for item in items:
        key, sep, value = item.partition("=")
        if not sep or not key:
            raise CliError(f"--storage-option expects KEY=VALUE, got {item!r}")
        out[key] = value
    return out


_ROLE = re.compile(r":[a-z]+(?::[a-z]+)?:`~?([^`]+)`")
_LITERAL = re.compile(r"``(.+?)``", re.S)


def plain_text(doc: str | None) -> str:
    """A docstring as ``--help`` text: reStructuredText roles and literals lose their markup,
    a ``::`` that opens a literal block becomes ``:``.

    >>> plain_text("Run :func:`write_index` or ``shardstream index SOURCE``, e.g.::")
    'Run write_index or shardstream index SOURCE, e.g.:'
    """
    text = _LITERAL.sub(r"\1", _ROLE.sub(r"\1", doc or ""))
    text = re.sub(r"\s+::$", "", text, flags=re.M)
    return re.sub(r"::$", ":", text, flags=re.M).strip()


def write_fresh_shards(
    directory: str, rows: int, shards: int, *, desc: str, seed: int = 0
) -> list[str]:
    """Write ``rows`` synthetic rows (list<int32> tokens of 16-127 items, zstd, page index)
    as ``shards`` shards into ``directory``, drawing a progress bar on a terminal; the shards
    of an earlier run there (maybe another layout) are removed first. Returns the paths."""
    os.makedirs(directory, exist_ok=True)
    for name in os.listdir(directory):
        if name.startswith("shard-") and name.endswith(".parquet"):
            os.remove(os.path.join(directory, name))
    per = [rows // shards + (1 if i < rows % shards else 0) for i in range(shards)]
    with Progress(rows, desc) as bar:
        return write_shards(
            directory,
            num_shards=shards,
            rows_per_shard=per,
            page_index=True,
            compression="zstd",
            tokens_len=(16, 128),
            seed=seed,
            progress=bar.update,
        )
