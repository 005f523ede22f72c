"""Command line: ``python -m shardstream demo [--rows N] [--dir D]`` (also ``shardstream demo``)."""

from __future__ import annotations

import argparse
import sys


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(
        prog="shardstream",
        description="Exact, O(1) resume for PyTorch training streams over plain Parquet shards.",
    )
    sub = parser.add_subparsers(dest="command", metavar="COMMAND")
    sub.required = True

    from shardstream import demo

    p_demo = sub.add_parser(
        "demo",
        help="generate shards, interrupt a DataLoader mid-epoch, resume it in a new process "
        "and verify the stream is identical",
        description=(demo.__doc__ or "").strip(),
        formatter_class=argparse.RawDescriptionHelpFormatter,
    )
    demo.add_arguments(p_demo)

    args = parser.parse_args(argv)
    if args.command == "demo":
        return demo.run(args)
    parser.error(f"unknown command {args.command!r}")  # pragma: no cover
    return 2  # pragma: no cover


if __name__ == "__main__":
    sys.exit(main())
