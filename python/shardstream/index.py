"""The metadata sidecar: open 10,000+ shards without reading 10,000 footers.

``shardstream index SOURCE`` (or :func:`write_index`) writes ``_shardstream_index.json`` into the
dataset root (the deepest directory, or object-store prefix, holding every shard) with what
opening would otherwise read from each footer: row groups, byte offsets, page-index presence,
footer and schema digests, each schema, and each file's size and mtime (objects: size and
ETag). ``ParquetStream`` uses it automatically when present, and checks it:

* an entry is used only if its file's size and mtime (objects: size and ETag) still match;
  other files' footers are read as usual (a stale sidecar costs speed, never correctness);
* in a bucket, opening then costs the listing plus one GET of the sidecar, and no footer
  request: a shard's footer is fetched when it is first read;
* a shard known from the sidecar has its footer read on first use, and that read checks the
  footer bytes against the recorded digest: a file rewritten in place with the same size and
  mtime is an error naming it, not a silently different stream;
* the fingerprint in saved states is the same with or without the sidecar.

Rewrite the sidecar after adding or changing shards (``shardstream index SOURCE`` again); delete
it to go back to reading every footer. The format lives in rust/core/src/index.rs.

Example:
    >>> import os, tempfile, shardstream.datagen as dg
    >>> from shardstream import ParquetStream
    >>> d = tempfile.mkdtemp()
    >>> _ = dg.write_shards(d, num_shards=3, rows_per_shard=10)
    >>> path = write_index(d)
    >>> os.path.basename(path)
    '_shardstream_index.json'
    >>> ParquetStream(d).num_rows
    30
"""

from __future__ import annotations

import os
from collections.abc import Sequence

from ._core import RawCatalog

__all__ = ["INDEX_FILE", "sidecar_path", "write_index"]

INDEX_FILE = "_shardstream_index.json"


def sidecar_path(root: str | os.PathLike[str]) -> str:
    """Where the sidecar of a dataset rooted at ``root`` lives."""
    return os.path.join(os.fspath(root), INDEX_FILE)


def write_index(
    source: str | os.PathLike[str] | Sequence[str | os.PathLike[str]],
    storage_options: dict[str, str] | None = None,
) -> str:
    """Read every footer of ``source`` (file, directory, glob, object-store URL or a list) and
    write the sidecar into the dataset root, atomically (a bucket: one PUT beside the shards).
    Returns its path or URL. ``storage_options`` as ``ParquetStream``'s."""
    items: list[str | os.PathLike[str]] = (
        list(source) if isinstance(source, (list, tuple)) else [source]  # type: ignore[list-item]
    )
    return RawCatalog([os.fspath(s) for s in items], None, storage_options).write_index()
