"""``laneway keys add|list|remove``: the gateway's API keys."""

from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path
from typing import Any

from schemas.settings import Settings
from streams.cli.common import settings_of
from streams.gateway.keys import KeysFileError, add_key, load_keys, remove_keys

__all__ = ["cmd", "run_keys", "subparser_init"]


def subparser_init(subparsers: Any) -> argparse.ArgumentParser:
    keys: argparse.ArgumentParser = subparsers.add_parser(
        "keys", help="manage the gateway's API keys (tenants and their limits)"
    )
    keys.add_argument("--keys-file", type=Path, help="the keys file (LANEWAY_GATEWAY_KEYS_FILE)")
    action = keys.add_subparsers(dest="keys_command", required=True)
    add = action.add_parser("add", help="make a key for a tenant; prints the key once")
    add.add_argument("tenant")
    add.add_argument("--rpm", type=int, help="requests per minute at most (default: no limit)")
    add.add_argument("--tpm", type=int, help="tokens per minute at most (default: no limit)")
    listing = action.add_parser("list", help="the keys: id, tenant, limits (never the key)")
    listing.add_argument("--json", action="store_true")
    remove = action.add_parser("remove", help="remove a key by its id, or every key of a tenant")
    remove.add_argument("name", help="a key id (k-…) or a tenant")
    return keys


def cmd(args: argparse.Namespace) -> int:
    return run_keys(settings_of(args), args)


def run_keys(settings: Settings, args: argparse.Namespace) -> int:
    path: Path | None = args.keys_file or settings.gateway.keys_file
    if path is None:
        print("laneway keys: set LANEWAY_GATEWAY_KEYS_FILE or --keys-file", file=sys.stderr)
        return 2
    try:
        if args.keys_command == "add":
            for name, value in (("--rpm", args.rpm), ("--tpm", args.tpm)):
                if value is not None and value < 1:
                    print(f"laneway keys: {name} must be at least 1", file=sys.stderr)
                    return 2
            key, entry = add_key(path, args.tenant, rpm=args.rpm, tpm=args.tpm)
            print(key)
            print(
                f"{entry.id} for tenant {entry.tenant} (rpm={entry.rpm}, tpm={entry.tpm}) "
                f"in {path}; the key is shown only now",
                file=sys.stderr,
            )
            return 0
        if args.keys_command == "list":
            keys = load_keys(path).keys
            if args.json:
                rows = [k.model_dump(exclude={"sha256"}) for k in keys]
                print(json.dumps(rows, indent=2))
            else:
                for k in keys:
                    print(f"{k.id}  {k.tenant:20} rpm={k.rpm} tpm={k.tpm}  {k.created_at}")
            return 0
        gone = remove_keys(path, args.name)
        for k in gone:
            print(f"removed {k.id} ({k.tenant})")
        if not gone:
            print(f"laneway keys: no key or tenant {args.name!r} in {path}", file=sys.stderr)
            return 1
        return 0
    except (KeysFileError, ValueError) as exc:
        print(f"laneway keys: {exc}", file=sys.stderr)
        return 2
