"""``laneway gateway``: serve the OpenAI-compatible HTTP API."""

from __future__ import annotations

import argparse
import asyncio
from pathlib import Path
from typing import Any

from schemas.settings import Settings
from streams.cli.common import ops_endpoints, settings_of

__all__ = ["cmd", "gateway_settings", "subparser_init"]


def subparser_init(subparsers: Any) -> argparse.ArgumentParser:
    parser: argparse.ArgumentParser = subparsers.add_parser(
        "gateway", help="serve the OpenAI-compatible HTTP API in front of the request topic"
    )
    parser.add_argument("--host", help="listen address (LANEWAY_GATEWAY_HOST)")
    parser.add_argument("--port", type=int, help="listen port (LANEWAY_GATEWAY_PORT)")
    parser.add_argument("--keys-file", type=Path, help="API keys (LANEWAY_GATEWAY_KEYS_FILE)")
    return parser


def gateway_settings(settings: Settings, args: argparse.Namespace) -> Settings:
    """``settings`` with the command's flags over ``LANEWAY_GATEWAY_*``."""
    flags = {"host": args.host, "port": args.port, "keys_file": args.keys_file}
    chosen = {name: value for name, value in flags.items() if value is not None}
    return settings.model_copy(update={"gateway": settings.gateway.model_copy(update=chosen)})


def cmd(args: argparse.Namespace) -> int:
    from streams.gateway.server import serve_gateway

    settings = gateway_settings(settings_of(args), args)
    with ops_endpoints(settings) as state:
        asyncio.run(serve_gateway(settings, state))
    return 0
