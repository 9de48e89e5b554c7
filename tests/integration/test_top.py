"""``laneway top --once`` against the running stack."""

from __future__ import annotations

import asyncio
import json
import os
import sys

from schemas.messages import Lane
from schemas.settings import Settings
from streams.client import LanewayClient
from streams.devstack.supervisor import Stack


async def _top(stack: Stack, settings: Settings, *flags: str) -> tuple[int, str]:
    urls = [f"--metrics=http://127.0.0.1:{c.http_port}/metrics" for c in stack.children]
    env = {
        **os.environ,
        "LANEWAY_REDIS_URL": settings.redis.url,
        "LANEWAY_REDIS_KEY_PREFIX": settings.redis.key_prefix,
        "COLUMNS": "160",
    }
    proc = await asyncio.create_subprocess_exec(
        sys.executable,
        "-m",
        "streams.cli.main",
        "top",
        "--once",
        *urls,
        *flags,
        env=env,
        stdout=asyncio.subprocess.PIPE,
        stderr=asyncio.subprocess.PIPE,
    )
    out, err = await asyncio.wait_for(proc.communicate(), 60)
    assert not err, err.decode()  # nothing logged on an ordinary read
    return proc.returncode or 0, out.decode()


async def test_top_once_shows_every_lane_and_path(
    stack: Stack, settings: Settings, client: LanewayClient
) -> None:
    answer = await client.ask("Hello!", timeout_s=60)  # a rule answers: one result at least
    assert answer.status == "ok"
    code, text = await _top(stack, settings)
    assert code == 0, text
    for lane in Lane:
        assert lane.value in text
    for column in ("backlog", "p95", "results/s", "breaker", "cache hit", "workers alive"):
        assert column in text, text

    code, raw = await _top(stack, settings, "--json")
    assert code == 0, raw
    view = json.loads(raw)
    assert view["sources"] == len(stack.children)
    assert view["workers_alive"] >= 3  # one worker per lane at least
    lanes = {row["lane"]: row for row in view["lanes"]}
    assert set(lanes) == {lane.value for lane in Lane}
    assert all(row["workers"] >= 1 for row in lanes.values())
    assert all(row["in_flight"] is not None for row in lanes.values())  # every worker says
    assert sum(row["path"] == "rules" and row["share"] > 0 for row in view["paths"]) == 1
