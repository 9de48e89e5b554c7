"""What the benches that drive a stack share: the workloads, the clients,
``drive`` (requests with a bounded number in flight, timed end to end as the
client sees them), the per lane and path summary, and ``stack_for`` (the
running stack, or an embedded one for the run).

Latency is end to end as the client sees it: from just before the request is
produced to the moment its reply is read.
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import statistics
import time
import timeit
import uuid
from collections import defaultdict
from collections.abc import Callable, Iterator, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Protocol

from schemas.messages import InferenceResult, Lane
from schemas.settings import Settings
from streams.bench.plain_client import PlainClient
from streams.classify.classifier import SourceRecord, classify_record
from streams.client import LanewayClient
from streams.rules.engine import RuleBook

__all__ = [
    "CLIENTS",
    "HARD_PROMPTS",
    "NO_CACHE",
    "RULE_PROMPTS",
    "SIMPLE_PROMPTS",
    "BenchClient",
    "Row",
    "Sample",
    "add_client_arguments",
    "direct_rule_ms",
    "drive",
    "format_table",
    "mixed_workload",
    "open_client",
    "overload_workload",
    "stack_for",
    "summarize",
    "warm_up",
]

RULE_PROMPTS = ["Hello!", "thanks", "ping", "help"]
SIMPLE_PROMPTS = [
    "What is the capital of France?",
    "Name a colour.",
    "What colour is the sky?",
    "Name a fruit.",
]
HARD_PROMPTS = [
    "Explain why the sky is blue.",
    "Compare cats and dogs as pets.",
    "Explain how a bicycle stays upright.",
]


@dataclass(frozen=True, slots=True)
class Sample:
    lane: str
    path: str
    status: str
    latency_ms: float
    batch_size: int
    finished_at: float
    inference_ms: float = 0.0
    """Model time of the batch that answered it (0 for cache and rules)."""
    code: str = ""
    """The error code of a failed one."""
    ttft_ms: float | None = None
    """A streamed request's time to its first chunk with text (``None``: not streamed)."""
    completion_tokens: int = 0
    chunks: int = 0
    """``result_chunk`` records read for it (a streamed request)."""


@dataclass(frozen=True, slots=True)
class Row:
    lane: str
    path: str
    count: int
    errors: int
    throughput_rps: float
    p50_ms: float
    p95_ms: float
    p99_ms: float
    mean_batch: float
    ttft_p50_ms: float | None = None
    """Of the streamed requests' time to first token (``None``: none streamed)."""
    ttft_p99_ms: float | None = None


def mixed_workload(n: int, max_tokens: int) -> list[dict[str, Any]]:
    """Deterministic mix: 40% rule-able, 35% simple, 25% hard; one in five
    model requests is a bulk batch job."""
    requests: list[dict[str, Any]] = []
    for i in range(n):
        slot = i % 20
        if slot < 8:
            prompt = RULE_PROMPTS[i % len(RULE_PROMPTS)]
        elif slot < 15:
            prompt = SIMPLE_PROMPTS[i % len(SIMPLE_PROMPTS)]
        else:
            prompt = HARD_PROMPTS[i % len(HARD_PROMPTS)]
        request: dict[str, Any] = {"prompt": prompt, "max_tokens": max_tokens}
        if slot in (10, 14, 17, 19):
            request["batch_id"] = "bench"
        requests.append(request)
    return requests


def _percentile(sorted_values: Sequence[float], q: float) -> float:
    if not sorted_values:
        return 0.0
    index = min(len(sorted_values) - 1, max(0, round(q * (len(sorted_values) - 1))))
    return sorted_values[index]


def summarize(samples: Sequence[Sample], started_at: float) -> list[Row]:
    groups: dict[tuple[str, str], list[Sample]] = defaultdict(list)
    for sample in samples:
        groups[(sample.lane, sample.path)].append(sample)
    groups[("all", "all")] = list(samples)
    rows = []
    for (lane, path), group in sorted(groups.items(), key=lambda kv: (kv[0][0] == "all", kv[0])):
        latencies = sorted(s.latency_ms for s in group)
        firsts = sorted(s.ttft_ms for s in group if s.ttft_ms is not None)
        window = max(max(s.finished_at for s in group) - started_at, 1e-9)
        rows.append(
            Row(
                lane=lane,
                path=path,
                count=len(group),
                errors=sum(s.status != "ok" for s in group),
                throughput_rps=len(group) / window,
                p50_ms=_percentile(latencies, 0.50),
                p95_ms=_percentile(latencies, 0.95),
                p99_ms=_percentile(latencies, 0.99),
                mean_batch=statistics.fmean(s.batch_size for s in group),
                ttft_p50_ms=_percentile(firsts, 0.50) if firsts else None,
                ttft_p99_ms=_percentile(firsts, 0.99) if firsts else None,
            )
        )
    return rows


def format_table(rows: Sequence[Row]) -> str:
    """One line per lane and path; with the time to first token (p50, p99)
    beside the total when any request was streamed."""
    streamed = any(r.ttft_p50_ms is not None for r in rows)
    head = (
        f"{'lane':9} {'path':6} {'n':>5} {'err':>4} {'req/s':>8} "
        f"{'p50 ms':>9} {'p95 ms':>9} {'p99 ms':>9} {'batch':>6}"
    )
    if streamed:
        head += f" {'ttft p50':>9} {'ttft p99':>9}"
    lines = [head, "-" * len(head)]
    for r in rows:
        line = (
            f"{r.lane:9} {r.path:6} {r.count:5d} {r.errors:4d} {r.throughput_rps:8.2f} "
            f"{r.p50_ms:9.1f} {r.p95_ms:9.1f} {r.p99_ms:9.1f} {r.mean_batch:6.2f}"
        )
        if streamed:
            p50, p99 = r.ttft_p50_ms, r.ttft_p99_ms
            line += f" {p50:9.1f} {p99:9.1f}" if p50 is not None and p99 is not None else ""
        lines.append(line)
    return "\n".join(lines)


def direct_rule_ms(settings: Settings, repeat: int = 2000) -> float:
    """The same rule decision called in-process, no broker: ms per call."""
    rules = RuleBook()
    raw = b'{"id": "direct", "prompt": "Hello!"}'

    def once() -> None:
        now = int(time.time() * 1000)
        record = SourceRecord(raw, None, now, "bench", 0, 0)
        classify_record(record, now_ms=now, settings=settings, rules=rules)

    return timeit.timeit(once, number=repeat) * 1000 / repeat


NO_CACHE = {"cache": "bypass, no-store"}
"""Request metadata that keeps a request away from the response cache both
ways: what is measured is the models, not earlier answers."""


URGENT_SLOTS = (9, 13)
"""Of every 20 requests of ``mixed_workload``, the simple ones that
``overload_workload`` sends with a deadline that asks for realtime."""


def overload_workload(
    n: int, max_tokens: int, deadline_ms: int, urgent_deadline_ms: int
) -> list[dict[str, Any]]:
    """``mixed_workload`` past the response cache, every request with
    ``deadline_ms`` but one in ten (simple, ``URGENT_SLOTS``) with
    ``urgent_deadline_ms``: a client that asks for the realtime lane (a
    deadline of at most ``LANEWAY_ROUTING_REALTIME_MAX_DEADLINE_MS``)."""
    return [
        {
            **r,
            "metadata": NO_CACHE,
            "deadline_ms": urgent_deadline_ms if i % 20 in URGENT_SLOTS else deadline_ms,
        }
        for i, r in enumerate(mixed_workload(n, max_tokens))
    ]


class BenchClient(Protocol):
    async def submit(
        self, request: dict[str, Any], *, on_chunk: Callable[[Any], None] | None = None
    ) -> asyncio.Future[InferenceResult]: ...


def chunk_text(chunk: Any) -> str:
    """The text of a chunk as either client hands it over (model or dict)."""
    return str(chunk.get("delta", "") if isinstance(chunk, dict) else chunk.delta)


CLIENTS = ("sdk", "plain")
"""``sdk``: ``LanewayClient``. ``plain``: ``PlainClient``, a plain aiokafka
producer and consumer at their default settings, as a user without the SDK."""


def open_client(
    settings: Settings, kind: str, name: str
) -> contextlib.AbstractAsyncContextManager[BenchClient]:
    """A client of ``kind`` (one of ``CLIENTS``) on its own reply topic."""
    if kind == "plain":
        return PlainClient(settings.kafka, name=name)
    if kind == "sdk":
        return LanewayClient(settings.kafka, client_id=f"{name}-{uuid.uuid4().hex[:6]}")
    raise ValueError(f"unknown client {kind!r}; one of {', '.join(CLIENTS)}")


async def warm_up(client: BenchClient, timeout_s: float) -> None:
    """One request through the classifier and one through each lane worker
    before the clock starts: the first record a process produces to a new
    reply topic waits for its metadata (on the embedded broker once up to
    the 30 s request timeout), which is set-up, not throughput."""
    model: dict[str, Any] = {"prompt": "Name a colour.", "max_tokens": 2, "metadata": NO_CACHE}
    firsts = [{"prompt": "ping"}, *({**model, "lane": lane.value} for lane in Lane)]
    futures = [await client.submit({"id": f"warm-{uuid.uuid4().hex}", **r}) for r in firsts]
    await asyncio.wait_for(asyncio.gather(*futures), timeout_s)


async def drive(
    settings: Settings,
    requests: Sequence[dict[str, Any]],
    concurrency: int,
    timeout_s: float,
    client_kind: str = "sdk",
    stream: bool = False,
) -> tuple[list[Sample], float, int]:
    """Send every request with at most ``concurrency`` in flight, through a
    client of ``client_kind`` (``stream``: each with ``stream: true``, its
    time to first token measured when its first chunk with text is read).
    Returns samples, the start time and how many got no answer (lost)."""
    samples: list[Sample] = []
    lost = 0
    gate = asyncio.Semaphore(concurrency)
    async with open_client(settings, client_kind, "bench") as client:
        await warm_up(client, timeout_s)
        started = time.perf_counter()

        async def one(i: int, request: dict[str, Any]) -> None:
            nonlocal lost
            async with gate:
                first: list[float] = []
                chunks = 0

                def on_chunk(chunk: Any) -> None:
                    nonlocal chunks
                    chunks += 1
                    if not first and chunk_text(chunk):
                        first.append(time.perf_counter())

                sent = time.perf_counter()
                future = await client.submit(
                    {"id": f"bench-{i}-{uuid.uuid4().hex[:6]}", **request, "stream": stream},
                    on_chunk=on_chunk if stream else None,
                )
                try:
                    result: InferenceResult = await asyncio.wait_for(future, timeout_s)
                except TimeoutError:
                    lost += 1
                    return
                done = time.perf_counter()
                samples.append(
                    Sample(
                        lane=str(result.lane or "-"),
                        path=str(result.path or "-"),
                        status=result.status,
                        latency_ms=(done - sent) * 1000,
                        batch_size=result.timings.batch_size,
                        finished_at=done,
                        inference_ms=result.timings.inference_ms,
                        code=result.error.code if result.error else "",
                        ttft_ms=(first[0] - sent) * 1000 if first else None,
                        completion_tokens=result.usage.completion_tokens,
                        chunks=chunks,
                    )
                )

        await asyncio.gather(*(one(i, r) for i, r in enumerate(requests)))
    return samples, started, lost


@contextlib.contextmanager
def stack_for(
    settings: Settings,
    embedded: bool,
    realtime_workers: int = 1,
    log_path: Path | None = None,
) -> Iterator[Settings]:
    """The settings to bench against: ``settings`` as they are, or an
    embedded stack's (its own broker; LANEWAY_REDIS_URL's Redis when set,
    else its own Valkey) with ``realtime_workers`` realtime workers, its
    logs in ``log_path`` (``None``: on the console), stopped afterwards."""
    if not embedded:
        yield settings
        return
    from streams.devstack.supervisor import Stack

    stack = Stack(
        settings,
        http_port_base=None,
        use_external_redis="url" in settings.redis.model_fields_set,
        lanes=(Lane.REALTIME,) * realtime_workers + (Lane.MEDIUM, Lane.BULK),
        log_path=log_path,
    )
    stack.start()
    try:
        yield stack.settings
    finally:
        stack.stop()


def add_client_arguments(parser: argparse.ArgumentParser, *, embedded: bool = True) -> None:
    """The options of the modes that drive a stack: how many requests, how
    long their answers, how many in flight, which client, and (``embedded``)
    whether to start a stack of its own for the run."""
    parser.add_argument("-n", "--requests", type=int, default=120)
    parser.add_argument("--max-tokens", type=int, default=16)
    parser.add_argument("--concurrency", type=int, default=16, help="requests in flight at once")
    parser.add_argument(
        "--client",
        choices=CLIENTS,
        default="sdk",
        help="the SDK, or plain aiokafka at default settings",
    )
    if embedded:
        parser.add_argument(
            "--embedded",
            action="store_true",
            help="start an embedded stack for the run (default: the running stack)",
        )
        parser.add_argument(
            "--realtime-workers",
            type=int,
            default=1,
            metavar="N",
            help="--embedded: N realtime workers in one group "
            "(LANEWAY_KAFKA_PARTITIONS split them)",
        )
