"""The ``shardstream`` command line (also ``python -m shardstream``).

Subcommands, one module each::

    shardstream inspect SOURCE... [--columns C ...] [--json]   # shards, row groups, page index
    shardstream state FILE [--source SOURCE ...] [--json]      # a saved state, readable
    shardstream index SOURCE... [--json]                       # the metadata sidecar
    shardstream demo [--rows N] [--dir D]                      # the exact-resume demo
    shardstream bench [--rows N] [--json]                      # quick side-by-side vs pyarrow

Exit status: 0 success; 1 a check failed (``state --source``: a state does not match the
source; ``demo``: the resumed stream differs); 2 bad command line or unusable input (missing
file, not Parquet, not a state file, a malformed state), with a one-line message on stderr and
no traceback.

Progress bars go to stderr and only when stderr is a terminal. ``--json`` output goes to
stdout and is the stable interface for scripts; the text output is for people.

Adding a subcommand: a module with ``add_parser(sub)``, which creates the subparser and sets
``run=`` to a function taking the parsed ``argparse.Namespace`` and returning the exit
status, appended to ``COMMANDS``. Help text shown to users is plain text (``plain_text`` turns
a docstring into it).

    >>> import contextlib, io, json, tempfile, shardstream.datagen as dg
    >>> d = tempfile.mkdtemp()
    >>> _ = dg.write_shards(d, num_shards=2, rows_per_shard=[300, 200], row_group_size=100)
    >>> out = io.StringIO()
    >>> with contextlib.redirect_stdout(out):
    ...     status = main(["inspect", d, "--json"])
    >>> status, json.loads(out.getvalue())["totals"]["rows"]
    (0, 500)
"""

from __future__ import annotations

import argparse
import io
import os
import sys
from collections.abc import Callable
from typing import Any

from . import bench, demo, index, inspect, state
from ._common import CliError

__all__ = ["COMMANDS", "PROG", "CliError", "build_parser", "main"]

PROG = "shardstream"

#: Subparser registrations, in ``--help`` order. Each takes the subparsers action.
COMMANDS: list[Callable[[Any], None]] = [
    inspect.add_parser,
    state.add_parser,
    index.add_parser,
    demo.add_parser,
    bench.add_parser,
]


class _Version(argparse.Action):
    def __init__(self, option_strings: list[str], dest: str, **kw: Any) -> None:
        super().__init__(option_strings, dest, nargs=0, help="print the version and exit")

    def __call__(self, parser: Any, namespace: Any, values: Any, option: Any = None) -> None:
        from .. import _core

        print(f"{PROG} {_core.__version__} ({os.path.dirname(os.path.abspath(_core.__file__))})")
        parser.exit()


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(
        prog=PROG,
        description="Exact, O(1) resume for PyTorch training streams over plain Parquet shards.",
        epilog="Exit status: 0 ok, 1 a check failed, 2 bad command line or input. "
        f"'{PROG} COMMAND --help' for a command's options.",
    )
    parser.add_argument("--version", action=_Version)
    sub = parser.add_subparsers(dest="command", metavar="COMMAND")
    sub.required = True
    for add in COMMANDS:
        add(sub)
    return parser


def main(argv: list[str] | None = None) -> int:
    """Run the command line; returns the exit status (argparse exits 2 on bad usage)."""
    from ..errors import ShardstreamError

    parser = build_parser()
    args = parser.parse_args(argv)
    where = f"{PROG} {args.command}"
    try:
        return int(args.run(args) or 0)
    except CliError as e:
        print(f"{where}: error: {e}", file=sys.stderr)
        return e.code
    except (ShardstreamError, OSError, ValueError) as e:
        if isinstance(e, BrokenPipeError):
            _quiet_broken_pipe()
            return 0
        # FileNotFoundError, ShardError, SchemaError, ... already name the path.
        print(f"{where}: error: {e}", file=sys.stderr)
        return 2
    except KeyboardInterrupt:
        print(f"{where}: interrupted", file=sys.stderr)
        return 130


def _quiet_broken_pipe() -> None:
    """``shardstream inspect ... | head``: stop quietly, without Python's flush error at exit."""
    try:
        devnull = os.open(os.devnull, os.O_WRONLY)
        os.dup2(devnull, sys.stdout.fileno())
    except (OSError, ValueError, io.UnsupportedOperation):
        pass
