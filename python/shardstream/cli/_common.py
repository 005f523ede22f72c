"""What every command shares: the one-line error, text tables, sizes, JSON output, option
parsing, help text from docstrings, and the generated data of ``demo`` and ``bench``."""

from __future__ import annotations

import json
import os
import re
import sys
from collections.abc import Sequence
from typing import Any

from ..datagen import write_shards
from ._progress import Progress


class CliError(Exception):
    """An error reported as one line on stderr with exit status ``code`` (no traceback)."""

    def __init__(self, message: str, code: int = 2) -> None:
        super().__init__(message)
        self.code = code


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
