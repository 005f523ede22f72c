"""``shardstream index SOURCE...``: write the metadata sidecar (see :mod:`shardstream.index`)."""

from __future__ import annotations

import argparse
import os
import time
from typing import Any

from .. import index
from ._common import emit_json, parse_storage_options, plain_text

__all__ = ["add_parser"]


def run(args: argparse.Namespace) -> int:
    from .._core import RawCatalog

    t0 = time.perf_counter()
    options = parse_storage_options(args.storage_option)
    cat = RawCatalog([os.fspath(s) for s in args.source], None, options)
    path = cat.write_index()
    info = {"index": path, "shards": len(cat.shard_paths), "rows": cat.num_rows}
    info["seconds"] = round(time.perf_counter() - t0, 3)
    if args.json:
        emit_json(info)
    else:
        print(f"wrote {path}: {info['shards']:,} shards, {info['rows']:,} rows")
    return 0


def add_parser(sub: Any) -> None:
    p = sub.add_parser(
        "index",
        help="write the metadata sidecar so large shard sets open without reading every footer",
        description=plain_text((index.__doc__ or "").split("Example:")[0]),
        formatter_class=argparse.RawDescriptionHelpFormatter,
    )
    p.add_argument(
        "source", nargs="+", metavar="SOURCE", help="file, directory, glob or object-store URL"
    )
    p.add_argument(
        "--storage-option",
        action="append",
        metavar="KEY=VALUE",
        help="object-store setting for URL sources (repeatable), as ParquetStream's "
        "storage_options",
    )
    p.add_argument("--json", action="store_true", help="machine-readable output")
    p.set_defaults(run=run)
