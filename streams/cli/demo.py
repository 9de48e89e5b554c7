"""``laneway demo`` (what ``make run`` runs): start the embedded stack, ask
a question on every lane, stop."""

from __future__ import annotations

import argparse
from typing import Any

from streams.cli.common import add_log_arguments, quiet, settings_of

__all__ = ["USES_STACK", "cmd", "subparser_init"]

USES_STACK = False
"""It starts a stack of its own."""


def subparser_init(subparsers: Any) -> argparse.ArgumentParser:
    parser: argparse.ArgumentParser = subparsers.add_parser(
        "demo", help="start the embedded stack, ask a question on every lane, stop"
    )
    add_log_arguments(parser)
    return parser


def cmd(args: argparse.Namespace) -> int:
    from streams.devstack.demo import run_demo
    from streams.devstack.stackfile import stack_file_path

    settings = settings_of(args)
    return run_demo(settings, quiet(settings, args), stack_file_path())
