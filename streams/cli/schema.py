"""``laneway schema``: export the JSON Schema of every wire message."""

from __future__ import annotations

import argparse
from pathlib import Path
from typing import Any

__all__ = ["cmd", "subparser_init"]


def subparser_init(subparsers: Any) -> argparse.ArgumentParser:
    parser: argparse.ArgumentParser = subparsers.add_parser(
        "schema", help="export the JSON Schema of every wire message"
    )
    parser.add_argument(
        "--out", default=None, help="folder to write to (default: the package's schemas/json)"
    )
    return parser


def cmd(args: argparse.Namespace) -> int:
    from schemas.wire_schema import SCHEMA_DIR, export

    for path in export(Path(args.out) if args.out else SCHEMA_DIR):
        print(path)
    return 0
