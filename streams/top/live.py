"""``laneway top``: a live terminal view of a running stack.

It reads every process's ``/metrics`` (by default the addresses ``laneway
up`` serves: classifier 9400, workers 9401-9403, router 9404, batch tracker
9405; ``--metrics URL`` names others) and the Redis boards (live workers,
route statistics, lane backlog), and shows per lane the workers, backlog,
requests in flight, mean batch size, p50/p95 latency and results/s; per
path its share of the results, success rate, feedback quality, EWMA latency
and circuit-breaker state; and the cache hit ratio, the flow-control level
and the workers alive.

Rates and percentiles cover the last ``--window`` seconds; ``--once``
prints one snapshot (rates over ``--interval``, percentiles since the
processes started) and exits, ``--json`` as JSON, for scripts.
"""

from __future__ import annotations

import asyncio
import contextlib
import dataclasses
import json
import logging
import time
from collections import deque
from collections.abc import Sequence
from typing import Any

import httpx
from redis.exceptions import RedisError
from rich.console import Console, Group
from rich.live import Live
from rich.table import Table
from rich.text import Text

from schemas.settings import Settings
from streams.classify.router import RouteBoard
from streams.stores.backlog import BacklogBoard
from streams.stores.workerboard import WorkerBoard
from streams.top.view import Scrape, Snapshot, snapshot

__all__ = ["default_urls", "render", "run_top"]

PROCESSES = 6
"""Processes ``laneway up`` runs: classifier, three lane workers, router, batch tracker."""


def default_urls(http_port_base: int) -> list[str]:
    return [f"http://127.0.0.1:{http_port_base + i}/metrics" for i in range(PROCESSES)]


async def scrape(client: httpx.AsyncClient, urls: Sequence[str]) -> Scrape:
    """Every process's metrics now; a process that does not answer is left out."""

    async def one(url: str) -> str | None:
        try:
            response = await client.get(url)
        except httpx.HTTPError:
            return None
        return response.text if response.status_code == 200 else None

    texts = await asyncio.gather(*(one(url) for url in urls))
    return Scrape.parse((t for t in texts if t is not None), time.monotonic())


class Boards:
    """The Redis side of the view."""

    def __init__(self, settings: Settings) -> None:
        self.redis = settings.redis.client()
        prefix = settings.redis.key_prefix
        self.workers = WorkerBoard(self.redis, prefix, stale_s=3 * settings.worker_heartbeat_s)
        self.routes = RouteBoard(self.redis, prefix)
        self.backlog = BacklogBoard(self.redis, prefix)

    async def read(self) -> dict[str, Any]:
        workers = await self.workers.live()
        stats = await self.routes.refresh()
        try:
            backlog = await self.backlog.read()
        except (RedisError, OSError, ValueError):
            backlog = None
        return {"workers": workers, "stats": stats, "backlog": backlog}

    async def close(self) -> None:
        with contextlib.suppress(RedisError, OSError):
            await self.redis.aclose()


def _ms(value: float | None) -> str:
    if value is None:
        return "-"
    return f"{value / 1000:.2f} s" if value >= 1000 else f"{value:.0f} ms"


def _num(value: float | int | None, fmt: str = "{:.0f}") -> str:
    return "-" if value is None else fmt.format(value)


def _pct(value: float | None) -> str:
    return "-" if value is None else f"{100 * value:.0f}%"


def render(view: Snapshot) -> Group:
    window = f"rates over {view.window_s:.0f} s" if view.window_s else "no rates yet"
    if view.latency_since_start:
        window += ", latency since start"
    head = Text(
        f"cache hit {_pct(view.cache_hit_ratio)} · flow level {_num(view.flow_level)} · "
        f"workers alive {_num(view.workers_alive)} · classifier "
        f"{_num(view.classifier_per_s, '{:.1f}')} req/s · {view.sources} processes · {window}"
    )
    lanes = Table(title="lanes", title_justify="left")
    for name in ("lane", "workers", "backlog", "in flight", "batch", "p50", "p95", "results/s"):
        lanes.add_column(name, justify="left" if name == "lane" else "right")
    for row in view.lanes:
        lanes.add_row(
            row.lane.value,
            str(row.workers),
            _num(row.backlog),
            _num(row.in_flight),
            _num(row.batch_mean, "{:.1f}"),
            _ms(row.p50_ms),
            _ms(row.p95_ms),
            _num(row.per_s, "{:.1f}"),
        )
    paths = Table(title="paths", title_justify="left")
    for name in ("path", "share", "success", "quality", "latency (EWMA)", "results", "breaker"):
        paths.add_column(name, justify="left" if name in ("path", "breaker") else "right")
    for path in view.paths:
        paths.add_row(
            path.path.value,
            _pct(path.share),
            _pct(path.success),
            _pct(path.quality),
            _ms(path.latency_ms),
            str(path.n),
            path.breaker,
        )
    notes = [Text(f"note: {note}", style="yellow") for note in view.notes]
    return Group(head, lanes, paths, *notes)


def as_json(view: Snapshot) -> str:
    return json.dumps(dataclasses.asdict(view), default=str, indent=2)


async def _view(boards: Boards, older: Scrape | None, newer: Scrape) -> Snapshot:
    read = await boards.read()
    return snapshot(
        older, newer, workers=read["workers"], stats=read["stats"], backlog=read["backlog"]
    )


async def run_top(
    settings: Settings,
    urls: Sequence[str],
    *,
    once: bool,
    as_json_output: bool = False,
    interval_s: float = 1.0,
    window_s: float = 30.0,
    console: Console | None = None,
) -> int:
    console = console or Console()
    logging.getLogger("httpx").setLevel(logging.WARNING)  # a line per read would scroll the view
    boards = Boards(settings)
    try:
        async with httpx.AsyncClient(timeout=min(2.0, interval_s * 2)) as client:
            if once:
                first = await scrape(client, urls)
                await asyncio.sleep(interval_s)
                second = await scrape(client, urls)
                recent = await _view(boards, first, second)
                # Percentiles and batch sizes since start: one interval holds too few results.
                whole = await _view(boards, None, second)
                view = dataclasses.replace(
                    recent, lanes=_merge(recent, whole), latency_since_start=True
                )
                if as_json_output:
                    console.print_json(as_json(view))
                else:
                    console.print(render(view))
                return 0 if second.sources else 1
            history: deque[Scrape] = deque()
            with Live(console=console, auto_refresh=False) as live:
                while True:
                    now = await scrape(client, urls)
                    history.append(now)
                    while len(history) > 2 and now.at_s - history[0].at_s > window_s:
                        history.popleft()
                    older = history[0] if len(history) > 1 else None
                    live.update(render(await _view(boards, older, now)), refresh=True)
                    await asyncio.sleep(interval_s)
    finally:
        await boards.close()


def _merge(recent: Snapshot, cumulative: Snapshot) -> list[Any]:
    """Rates from the interval, percentiles and batch sizes since start."""
    return [
        dataclasses.replace(
            row, p50_ms=whole.p50_ms, p95_ms=whole.p95_ms, batch_mean=whole.batch_mean
        )
        for row, whole in zip(recent.lanes, cumulative.lanes, strict=True)
    ]
