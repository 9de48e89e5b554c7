"""``laneway up``: the embedded broker, Valkey, the classifier, the lane
workers, the router, the batch tracker and the gateway, supervised; the
stack's addresses go to the current-stack file while it runs."""

from __future__ import annotations

import argparse
import signal
import sys
from typing import Any

from streams.cli.common import add_log_arguments, quiet, settings_of

__all__ = ["USES_STACK", "cmd", "subparser_init"]

USES_STACK = False
"""It starts a stack: a running stack's addresses are not its own."""


def subparser_init(subparsers: Any) -> argparse.ArgumentParser:
    parser: argparse.ArgumentParser = subparsers.add_parser(
        "up", help="embedded broker + Redis + classifier + workers, supervised"
    )
    parser.add_argument(
        "--kafka-port", type=int, default=None, help="embedded broker port (default: free)"
    )
    parser.add_argument(
        "--redis-port", type=int, default=None, help="embedded Valkey port (default: free)"
    )
    parser.add_argument(
        "--http-port-base", type=int, default=9400, help="classifier port; workers follow"
    )
    parser.add_argument(
        "--gateway-port",
        type=int,
        default=None,
        help="the OpenAI-compatible API's port (default: LANEWAY_GATEWAY_PORT, 8080; 0: free)",
    )
    parser.add_argument("--no-gateway", action="store_true", help="start no HTTP gateway")
    add_log_arguments(parser)
    return parser


def cmd(args: argparse.Namespace) -> int:
    from streams.devstack.stackfile import find_stack, stack_file_path
    from streams.devstack.supervisor import Stack, recorded

    settings = settings_of(args)
    running = find_stack(stack_file_path()).stack
    if running is not None:
        print(
            f"laneway up: the stack of pid {running.pid} is recorded in {stack_file_path()}; "
            "this one takes its place there (commands will reach this one)",
            file=sys.stderr,
        )
    stack = Stack(
        settings,
        kafka_port=args.kafka_port,
        redis_port=args.redis_port,
        use_external_redis="url" in settings.redis.model_fields_set,
        http_port_base=args.http_port_base,
        log_path=quiet(settings, args),
        gateway_port=None
        if args.no_gateway
        else (settings.gateway.port if args.gateway_port is None else args.gateway_port),
    )
    # Until run() takes over signals, SIGTERM unwinds through start()'s cleanup.
    signal.signal(signal.SIGTERM, _exit_on_sigterm)
    with recorded(stack, stack_file_path()) as path:
        print(f"laneway is up (its addresses: {path}); Ctrl-C stops it", flush=True)
        stack.run()
    return 0


def _exit_on_sigterm(signum: int, frame: object) -> None:
    raise SystemExit(128 + signum)
