"""The CLI reference: every ``laneway`` command and its options, from the argparse
parsers the command itself builds."""

from __future__ import annotations

import argparse
import os
from collections.abc import Callable, Iterator

__all__ = ["cli_page", "commands"]


def _build_parser() -> argparse.ArgumentParser:
    # The one place that names where the CLI's parser is built.
    from streams.cli.main import build_parser

    return build_parser()


def _subcommands(parser: argparse.ArgumentParser) -> dict[str, argparse.ArgumentParser]:
    found: dict[str, argparse.ArgumentParser] = {}
    for action in parser._actions:
        if isinstance(action, argparse._SubParsersAction):
            found.update(action.choices)
    return found


def commands(
    parser: argparse.ArgumentParser, prefix: str = "laneway"
) -> Iterator[tuple[str, argparse.ArgumentParser]]:
    """``(command line, parser)`` for the parser and every subcommand under it."""
    yield prefix, parser
    for name, sub in _subcommands(parser).items():
        yield from commands(sub, f"{prefix} {name}")


def _help_text(parser: argparse.ArgumentParser) -> str:
    # A fixed width, so the page does not depend on the terminal that built it.
    previous = os.environ.get("COLUMNS")
    os.environ["COLUMNS"] = "100"
    try:
        return parser.format_help().rstrip()
    finally:
        if previous is None:
            del os.environ["COLUMNS"]
        else:
            os.environ["COLUMNS"] = previous


def cli_page(build_parser: Callable[[], argparse.ArgumentParser] = _build_parser) -> str:
    """The whole page, Markdown: one section per command, its ``--help``."""
    lines = [
        "# CLI",
        "",
        "Generated at build time from the `laneway` command's argparse parsers: each",
        "section is what `--help` prints for that command. Flags override the",
        "environment (see [Settings](settings.md)) for that run only.",
        "",
    ]
    for line, parser in commands(build_parser()):
        depth = min(line.count(" ") + 1, 4)
        lines += [
            f"{'#' * (depth + 1)} `{line}`",
            "",
            "```text",
            _help_text(parser),
            "```",
            "",
        ]
    return "\n".join(lines)
