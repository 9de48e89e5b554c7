"""``laneway bench <mode>``: one subcommand per benchmark mode.

Each mode is a module of ``streams.bench`` with ``HELP``,
``add_arguments(parser)`` and ``run(settings, args) -> BenchRun`` (and
``DRIVES_STACK`` when it drives a running stack, ``STARTS_STACK`` when it
starts stacks of its own); this
module registers them, gives each the options every mode has (``--result``,
``--save``, the log file of the stacks it starts) and writes the result
file (``streams.bench.results``)."""

from __future__ import annotations

import argparse
import importlib
import shlex
import sys
from pathlib import Path
from types import ModuleType
from typing import Any

from streams.cli.common import add_log_arguments, quiet, settings_of

__all__ = ["MODES", "USES_STACK", "cmd", "subparser_init"]

MODES = (
    "mix",
    "overload",
    "stream-cost",
    "compare",
    "burst",
    "batch",
    "classifier",
    "backend",
    "pipeline",
    "router",
    "gpu",
    "gateway",
    "chaos",
    "student",
)
"""Every mode, the module ``streams.bench.<mode with _ for ->``."""


def _mode(name: str) -> ModuleType:
    return importlib.import_module(f"streams.bench.{name.replace('-', '_')}")


def USES_STACK(args: argparse.Namespace) -> bool:
    """A mode that drives a running stack reaches the current one; a mode
    that starts its own stacks (or none) does not."""
    return bool(getattr(_mode(args.mode), "DRIVES_STACK", False)) and not getattr(
        args, "embedded", False
    )


def subparser_init(subparsers: Any) -> argparse.ArgumentParser:
    bench: argparse.ArgumentParser = subparsers.add_parser(
        "bench",
        help="benchmarks, one mode each; every mode can write a result file",
        description="Benchmarks, one subcommand per mode. Each prints its figures; "
        "--result PATH or --save also writes them as a result file "
        "(benchmarks/result.schema.json) that the docs' benchmark tables are drawn from.",
    )
    modes = bench.add_subparsers(dest="mode", required=True, metavar="MODE")
    for name in MODES:
        module = _mode(name)
        parser = modes.add_parser(name, help=module.HELP, description=module.__doc__)
        module.add_arguments(parser)
        _add_result_arguments(parser)
        if getattr(module, "STARTS_STACK", False) or getattr(module, "DRIVES_STACK", False):
            add_log_arguments(parser)
    return bench


def _add_result_arguments(parser: argparse.ArgumentParser) -> None:
    where = parser.add_mutually_exclusive_group()
    where.add_argument(
        "--result", type=Path, metavar="PATH", help="write the run's result file (JSON) here"
    )
    where.add_argument(
        "--save",
        action="store_true",
        help="write the result file into benchmarks/results/<mode>/"
        "<date>-<cpu>-<commit>.json of this checkout",
    )


def command_line(argv: list[str]) -> str:
    """The command as a person would type it again to measure the same
    (where the result file and the logs go is left out: ``--save``,
    ``--result PATH``, ``--log-file PATH``)."""
    words: list[str] = []
    rest = iter(argv)
    for word in rest:
        if word == "--save" or word.startswith(("--result=", "--log-file=")):
            continue
        if word in ("--result", "--log-file"):
            next(rest, None)
            continue
        words.append(word)
    return shlex.join(["laneway", *words])


def cmd(args: argparse.Namespace) -> int:
    from streams.bench.results import (
        InvalidResult,
        build_result,
        load_average,
        repo_root,
        result_name,
        write_result,
    )

    settings = settings_of(args)
    module = _mode(args.mode)
    if getattr(module, "STARTS_STACK", False) or getattr(args, "embedded", False):
        args.log_file = quiet(settings, args)  # the stacks it starts log to a file
    before = load_average()
    run = module.run(settings, args)
    if args.result is None and not args.save:
        return run.exit_code
    load = {"before": before, "after": load_average()}
    command = command_line(getattr(args, "argv", sys.argv[1:]))
    result = build_result(args.mode, command, run, load=load)
    path = args.result or repo_root() / "benchmarks" / "results" / result_name(result)
    try:
        write_result(path, result)
    except InvalidResult as exc:
        print(f"laneway bench {args.mode}: the result does not match its schema: {exc}")
        return 2
    print(f"result: {path}")
    return run.exit_code
