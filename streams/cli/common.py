"""What several ``laneway`` commands share: the settings a command was
given, the log-file arguments of the commands that start a stack, and the
ops endpoints of the long-running ones."""

from __future__ import annotations

import argparse
import contextlib
import time
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

from schemas.settings import Settings
from streams.devstack.logs import configure_logging
from streams.ops import OpsServer, ProcessState

__all__ = [
    "add_log_arguments",
    "log_path",
    "ops_endpoints",
    "quiet",
    "run_faust",
    "settings_of",
]


def settings_of(args: argparse.Namespace) -> Settings:
    """The settings ``main`` built for this command (environment, current
    stack, flags), carried on the parsed arguments."""
    settings = getattr(args, "settings", None)
    if not isinstance(settings, Settings):
        raise TypeError("the command was not started through streams.cli.main.main")
    return settings


def add_log_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument(
        "-v",
        "--verbose",
        action="store_true",
        help="show every process's log on the console instead of short status lines",
    )
    parser.add_argument(
        "--log-file",
        type=Path,
        default=None,
        help="where the processes' logs go (default: ~/.cache/laneway/logs/<command>-<time>.log)",
    )


def log_path(args: argparse.Namespace) -> Path | None:
    """Where ``up``/``demo``/the benches that start stacks write their
    processes' logs; ``None`` with ``-v`` (they go to the console)."""
    if args.verbose:
        return None
    if args.log_file is not None:
        return Path(args.log_file)
    stamp = time.strftime("%Y%m%d-%H%M%S")
    return Path.home() / ".cache" / "laneway" / "logs" / f"{args.command}-{stamp}.log"


def quiet(settings: Settings, args: argparse.Namespace) -> Path | None:
    """Unless ``-v``: this process's log joins its children's in the log
    file, and the console keeps status lines, warnings and errors."""
    path = log_path(args)
    if path is not None:
        configure_logging(settings.log_level, settings.log_format, args.command, path)
    return path


@contextlib.contextmanager
def ops_endpoints(settings: Settings) -> Iterator[ProcessState]:
    """/metrics, /healthz and /readyz for the life of a long-running process."""
    state = ProcessState(stall_s=settings.loop_stall_s)
    ops = (
        OpsServer(settings.http_host, settings.http_port, state).start()
        if settings.http_port
        else None
    )
    try:
        yield state
    finally:
        if ops is not None:
            ops.close()


def run_faust(settings: Settings, build: Callable[[Settings, ProcessState], Any]) -> int:
    """Serve the ops endpoints and run a faust app until it is stopped."""
    import faust

    with ops_endpoints(settings) as state:
        app = build(settings, state)
        worker = faust.Worker(app, loglevel=settings.log_level, override_logging=False)
        worker.spinner = None  # escape codes in a log file or a pipe help no one
        worker.execute_from_commandline()  # returns through SystemExit on stop
    return 0
