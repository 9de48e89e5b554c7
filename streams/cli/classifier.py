"""``laneway classifier``: run the classifier (one process of ``laneway up``)."""

from __future__ import annotations

import argparse
from typing import Any

from streams.cli.common import run_faust, settings_of

__all__ = ["cmd", "subparser_init"]


def subparser_init(subparsers: Any) -> argparse.ArgumentParser:
    parser: argparse.ArgumentParser = subparsers.add_parser(
        "classifier", help="run the classifier: the request intake, cache, rules and lane routing"
    )
    return parser


def cmd(args: argparse.Namespace) -> int:
    from streams.classify.app import build_app

    return run_faust(settings_of(args), build_app)
