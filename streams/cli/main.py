"""The ``laneway`` command.

One module per subcommand in ``streams.cli``, each with
``subparser_init(subparsers)`` (its arguments) and ``cmd(args) -> int``
(its run). ``main`` builds the process's settings once, from the
environment (``LANEWAY_*``), the current-stack file of a running ``laneway
up`` (below the environment) and the ``--bootstrap`` flag, and hands them
to the command on ``args.settings``. ``build_parser`` has no side effects:
the docs generate the CLI reference from it.
"""

from __future__ import annotations

import argparse
import importlib
import sys
from collections.abc import Sequence
from types import ModuleType

__all__ = ["COMMANDS", "build_parser", "load_settings", "main"]

COMMANDS = (
    "up",
    "demo",
    "status",
    "ask",
    "top",
    "batch",
    "bench",
    "models",
    "distill",
    "prewarm",
    "doctor",
    "check",
    "gateway",
    "keys",
    "topics",
    "schema",
    "classifier",
    "router",
    "worker",
)
"""Every subcommand, each the module ``streams.cli.<name>``, in help order."""


def _module(name: str) -> ModuleType:
    return importlib.import_module(f"streams.cli.{name}")


def build_parser(commands: Sequence[str] = COMMANDS) -> argparse.ArgumentParser:
    """The whole command line, every subcommand's parser included (or only
    those of ``commands``: ``main`` builds the one it runs, as building
    ``bench``'s imports every benchmark)."""
    parser = argparse.ArgumentParser(
        prog="laneway",
        description="laneway: Kafka-driven hybrid LLM inference. Commands find a running "
        "`laneway up` through its current-stack file (`laneway status` shows it); "
        "LANEWAY_* variables and flags override it.",
    )
    parser.add_argument("--bootstrap", help="Kafka bootstrap (overrides LANEWAY_KAFKA_BOOTSTRAP)")
    subparsers = parser.add_subparsers(dest="command", required=True, metavar="COMMAND")
    for name in commands:
        sub = _module(name).subparser_init(subparsers)
        sub.set_defaults(_command=name)
    return parser


def load_settings(args: argparse.Namespace, *, uses_stack: bool = True) -> argparse.Namespace:
    """The one place a ``laneway`` process builds its settings: the
    environment, then the current stack's addresses where the environment
    is silent (``uses_stack``: not for a command that starts a stack of its
    own), then ``--bootstrap``. Sets ``args.settings`` and
    ``args.current_stack`` (the ``FoundStack``) and returns ``args``."""
    from schemas.settings import Settings
    from streams.devstack.stackfile import apply_stack, find_stack, stack_file_path

    settings = Settings()
    found = find_stack(stack_file_path())
    if uses_stack:
        if found.note:
            print(f"laneway: {found.note}", file=sys.stderr)
        settings = apply_stack(settings, found.stack)
    if args.bootstrap:
        settings = settings.model_copy(
            update={"kafka": settings.kafka.model_copy(update={"bootstrap": args.bootstrap})}
        )
    args.settings = settings
    args.found_stack = found
    args.current_stack = found.stack if uses_stack else None
    return args


def _uses_stack(module: ModuleType, args: argparse.Namespace) -> bool:
    """Whether the command reaches a running stack (``USES_STACK``, a bool
    or a function of the arguments; default true)."""
    uses = getattr(module, "USES_STACK", True)
    return bool(uses(args) if callable(uses) else uses)


def _command_word(words: Sequence[str]) -> str | None:
    """The subcommand named on the command line, if it names one."""
    rest = iter(words)
    for word in rest:
        if word == "--bootstrap":
            next(rest, None)
        elif not word.startswith("-"):
            return word if word in COMMANDS else None
    return None


def main(argv: Sequence[str] | None = None) -> int:
    from streams.devstack.logs import configure_logging

    words = list(sys.argv[1:] if argv is None else argv)
    named = _command_word(words)
    args = build_parser([named] if named else COMMANDS).parse_args(words)
    args.argv = words
    module = _module(args._command)
    load_settings(args, uses_stack=_uses_stack(module, args))
    configure_logging(args.settings.log_level, args.settings.log_format, args.command)
    return int(module.cmd(args) or 0)


if __name__ == "__main__":
    sys.exit(main())
