"""``laneway bench gateway``: what the OpenAI-compatible gateway costs,
measured beside the Kafka SDK in the same run on the same stack.

Three legs:

- **Added latency.** The same rule-answered questions one at a time,
  round-robin over the official ``openai`` SDK and a bare HTTP POST through
  the gateway, and ``LanewayClient`` on Kafka (so drift in the machine's
  load hits all alike). The gateway's cost is the bare POST's p50 and p99
  less Kafka's: HTTP, the translation both ways and its own hop through its
  client. The SDK's own cost (building and parsing its models) is shown
  apart.
- **Rule answers per second.** Rule answers with ``--concurrency`` in
  flight for ``--seconds``, through the gateway (a plain aiohttp client,
  so the SDK's own CPU does not crowd the measurement on a small machine)
  and through the Kafka SDK. With ``--embedded`` the gateway process's CPU
  seconds over the leg are read from ``/proc``, which gives the rule answers
  one gateway process sustains per core of its own: the figure that does
  not depend on what else shares the machine.
- **Time to first token.** A light-model question streamed through the
  gateway's SSE (the ``openai`` SDK with ``stream=True``) and on Kafka
  (``stream: true``), alternating; both past the response cache.
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import os
import time
import uuid
from collections import Counter
from collections.abc import Iterator, Sequence
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

import aiohttp

from schemas.messages import Lane
from schemas.settings import Settings
from streams.bench.drive import NO_CACHE, RULE_PROMPTS, SIMPLE_PROMPTS, _percentile, chunk_text
from streams.bench.results import BenchRun, Figure
from streams.client import LanewayClient

if TYPE_CHECKING:
    from openai.types.chat import ChatCompletionUserMessageParam

__all__ = ["DRIVES_STACK", "HELP", "Leg", "add_arguments", "run"]

HELP = "the gateway beside the Kafka SDK: added latency, rule answers/s, time to first token"
DRIVES_STACK = True

API_KEY = "bench"
"""Any key: the embedded stack's gateway has no keys file and admits all."""

TIMEOUT_S = 60.0


def add_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument(
        "-n", "--requests", type=int, default=300, help="rule questions per client, one at a time"
    )
    parser.add_argument(
        "--concurrency", type=int, default=64, help="rule answers in flight in the throughput leg"
    )
    parser.add_argument("--seconds", type=float, default=10.0, help="each throughput leg's length")
    parser.add_argument(
        "--streams", type=int, default=12, help="streamed light-model questions per client"
    )
    parser.add_argument(
        "--url",
        default=None,
        help="the gateway's base URL (default: the running stack's, "
        "http://<LANEWAY_GATEWAY_HOST>:<LANEWAY_GATEWAY_PORT>/v1)",
    )
    parser.add_argument(
        "--embedded",
        action="store_true",
        help="start an embedded stack with a gateway for the run (default: the running stack)",
    )


@dataclass(frozen=True, slots=True)
class Leg:
    """One client's latencies (ms) in a leg."""

    name: str
    latencies_ms: Sequence[float]

    def p(self, q: float) -> float:
        """The ``q`` quantile (0.5: the median)."""
        return _percentile(sorted(self.latencies_ms), q)


@dataclass
class _Target:
    settings: Settings
    url: str
    gateway_pid: int | None


@contextlib.contextmanager
def _target(settings: Settings, args: argparse.Namespace) -> Iterator[_Target]:
    if not args.embedded:
        host = settings.gateway.host
        shown = "127.0.0.1" if host in ("0.0.0.0", "") else host
        yield _Target(settings, args.url or f"http://{shown}:{settings.gateway.port}/v1", None)
        return
    from streams.devstack.supervisor import Stack

    stack = Stack(
        settings,
        http_port_base=None,
        use_external_redis="url" in settings.redis.model_fields_set,
        gateway_port=0,
        log_path=args.log_file,
        # One tenant sends everything here: its token bucket (50 requests/s by
        # default) would be the figure, not the gateway.
        child_env={"LANEWAY_RATELIMIT_ENABLED": "false"},
    )
    stack.start()
    try:
        proc = stack.child("gateway").proc
        assert stack.gateway_url is not None
        yield _Target(stack.settings, stack.gateway_url, proc.pid if proc else None)
    finally:
        stack.stop()


def _cpu_s(pid: int | None) -> float | None:
    """User + system CPU seconds of process ``pid`` (``None``: unknown)."""
    if pid is None:
        return None
    try:
        with open(f"/proc/{pid}/stat") as stat:
            fields = stat.read().rsplit(")", 1)[1].split()
    except OSError:
        return None
    return (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")


def _rule(i: int) -> ChatCompletionUserMessageParam:
    return {"role": "user", "content": RULE_PROMPTS[i % len(RULE_PROMPTS)]}


async def _added_latency(target: _Target, n: int) -> tuple[Leg, Leg, Leg]:
    """The same rule questions one at a time, round-robin over three clients:
    the ``openai`` SDK and a bare HTTP POST (aiohttp) through the gateway, and
    the laneway SDK on Kafka. The bare POST leaves the SDK's own cost out."""
    from openai import AsyncOpenAI

    sdk_http: list[float] = []
    bare_http: list[float] = []
    kafka: list[float] = []
    headers = {"Authorization": f"Bearer {API_KEY}"}
    async with (
        LanewayClient(target.settings.kafka, client_id=f"bench-gw-{uuid.uuid4().hex[:6]}") as sdk,
        AsyncOpenAI(base_url=target.url, api_key=API_KEY, max_retries=0) as openai,
        aiohttp.ClientSession(headers=headers) as http,
    ):
        for i in range(-4, n):  # four of each first, not timed: connections and metadata
            message = _rule(i)
            began = time.perf_counter()
            await openai.chat.completions.create(
                model="auto", messages=[message], timeout=TIMEOUT_S
            )
            sdk_done = time.perf_counter()
            body = {"model": "auto", "messages": [message]}
            async with http.post(f"{target.url}/chat/completions", json=body) as response:
                await response.read()
                response.raise_for_status()
            bare_done = time.perf_counter()
            future = await sdk.submit({"id": f"gw-{uuid.uuid4().hex}", "messages": [message]})
            await asyncio.wait_for(future, TIMEOUT_S)
            kafka_done = time.perf_counter()
            if i >= 0:
                sdk_http.append((sdk_done - began) * 1000)
                bare_http.append((bare_done - sdk_done) * 1000)
                kafka.append((kafka_done - bare_done) * 1000)
    return (
        Leg("gateway (openai SDK)", sdk_http),
        Leg("gateway (bare HTTP POST)", bare_http),
        Leg("Kafka (laneway SDK)", kafka),
    )


async def _gateway_rps(
    target: _Target, concurrency: int, seconds: float, codes: Counter[str]
) -> tuple[int, float, int]:
    """Rule answers through the gateway: (answered, wall s, failed); the
    failures' HTTP statuses are counted in ``codes``."""
    answered = failed = 0
    stop = time.perf_counter() + seconds
    headers = {"Authorization": f"Bearer {API_KEY}"}
    connector = aiohttp.TCPConnector(limit=concurrency)
    timeout = aiohttp.ClientTimeout(total=TIMEOUT_S)
    async with aiohttp.ClientSession(connector=connector, headers=headers, timeout=timeout) as http:

        async def worker(w: int) -> None:
            nonlocal answered, failed
            i = w
            while time.perf_counter() < stop:
                body = {"model": "auto", "messages": [_rule(i)]}
                i += concurrency
                async with http.post(f"{target.url}/chat/completions", json=body) as response:
                    await response.read()
                    if response.status == 200:
                        answered += 1
                    else:
                        failed += 1
                        codes[f"HTTP {response.status}"] += 1

        begun = time.perf_counter()
        await asyncio.gather(*(worker(w) for w in range(concurrency)))
        return answered, time.perf_counter() - begun, failed


async def _kafka_rps(
    target: _Target, concurrency: int, seconds: float, codes: Counter[str]
) -> tuple[int, float, int]:
    """Rule answers through the Kafka SDK: (answered, wall s, failed); the
    failures' error codes are counted in ``codes``."""
    answered = failed = 0
    stop = time.perf_counter() + seconds
    async with LanewayClient(
        target.settings.kafka, client_id=f"bench-gw-{uuid.uuid4().hex[:6]}"
    ) as sdk:

        async def worker(w: int) -> None:
            nonlocal answered, failed
            i = w
            while time.perf_counter() < stop:
                future = await sdk.submit({"id": f"gw-{uuid.uuid4().hex}", "messages": [_rule(i)]})
                i += concurrency
                result = await asyncio.wait_for(future, TIMEOUT_S)
                if result.status == "ok":
                    answered += 1
                else:
                    failed += 1
                    codes[result.error.code if result.error else "error"] += 1

        begun = time.perf_counter()
        await asyncio.gather(*(worker(w) for w in range(concurrency)))
        return answered, time.perf_counter() - begun, failed


async def _ttft(target: _Target, n: int) -> tuple[Leg, Leg]:
    from openai import AsyncOpenAI

    gateway: list[float] = []
    kafka: list[float] = []
    headers = {"X-Laneway-Lane": Lane.REALTIME.value, "X-Laneway-Cache": "bypass, no-store"}
    async with (
        LanewayClient(target.settings.kafka, client_id=f"bench-gw-{uuid.uuid4().hex[:6]}") as sdk,
        AsyncOpenAI(
            base_url=target.url, api_key=API_KEY, max_retries=0, default_headers=headers
        ) as openai,
    ):
        for i in range(-1, n):  # one of each first, not timed: the lane's first record
            prompt = SIMPLE_PROMPTS[i % len(SIMPLE_PROMPTS)]
            message: ChatCompletionUserMessageParam = {"role": "user", "content": prompt}
            sent = time.perf_counter()
            first: float | None = None
            stream = await openai.chat.completions.create(
                model="light", messages=[message], max_tokens=16, stream=True, timeout=TIMEOUT_S
            )
            async for chunk in stream:
                if first is None and chunk.choices and chunk.choices[0].delta.content:
                    first = time.perf_counter()
            kafka_first: list[float] = []
            kafka_sent = time.perf_counter()

            def on_chunk(chunk: Any, seen: list[float] = kafka_first) -> None:
                if not seen and chunk_text(chunk):
                    seen.append(time.perf_counter())

            future = await sdk.submit(
                {
                    "id": f"gw-{uuid.uuid4().hex}",
                    "messages": [message],
                    "model": "light",
                    "lane": Lane.REALTIME.value,
                    "max_tokens": 16,
                    "metadata": NO_CACHE,
                    "stream": True,
                },
                on_chunk=on_chunk,
            )
            await asyncio.wait_for(future, TIMEOUT_S)
            if i >= 0 and first is not None and kafka_first:
                gateway.append((first - sent) * 1000)
                kafka.append((kafka_first[0] - kafka_sent) * 1000)
    return Leg("gateway SSE (openai SDK)", gateway), Leg("Kafka stream (laneway SDK)", kafka)


def _ms(value: float) -> float:
    """A latency as reported: to the hundredth of a millisecond."""
    return round(value, 2)


def _why(codes: Counter[str]) -> str:
    return (": " + ", ".join(f"{n} {code}" for code, n in codes.most_common())) if codes else ""


def run(settings: Settings, args: argparse.Namespace) -> BenchRun:
    try:
        import openai  # noqa: F401
    except ImportError:
        print("laneway bench gateway measures with the official openai SDK: pip install openai")
        return BenchRun(2)
    figures: dict[str, Figure] = {}
    with _target(settings, args) as target:
        print(f"laneway bench gateway: {target.url}, Kafka {target.settings.kafka.bootstrap}")
        via_sdk, via_gateway, via_kafka = asyncio.run(_added_latency(target, args.requests))
        cpu_before = _cpu_s(target.gateway_pid)
        gw_codes: Counter[str] = Counter()
        gw_answered, gw_wall, gw_failed = asyncio.run(
            _gateway_rps(target, args.concurrency, args.seconds, gw_codes)
        )
        cpu_after = _cpu_s(target.gateway_pid)
        kafka_codes: Counter[str] = Counter()
        kafka_answered, kafka_wall, kafka_failed = asyncio.run(
            _kafka_rps(target, args.concurrency, args.seconds, kafka_codes)
        )
        sse, stream = asyncio.run(_ttft(target, args.streams))

    print(f"\nrule answers one at a time, {args.requests} per client, round-robin:")
    print(f"  {'':28} {'p50 ms':>8} {'p99 ms':>8}")
    for leg in (via_sdk, via_gateway, via_kafka):
        print(f"  {leg.name:28} {leg.p(0.5):8.2f} {leg.p(0.99):8.2f}")
    added_p50 = via_gateway.p(0.5) - via_kafka.p(0.5)
    added_p99 = via_gateway.p(0.99) - via_kafka.p(0.99)
    sdk_p50 = via_sdk.p(0.5) - via_gateway.p(0.5)
    print(
        f"  the gateway adds {added_p50:.2f} ms at p50 and {added_p99:.2f} ms at p99 "
        f"(bare POST against Kafka); the openai SDK itself another {sdk_p50:.2f} ms at p50"
    )
    for name, leg in (("gateway_sdk", via_sdk), ("gateway", via_gateway), ("kafka", via_kafka)):
        for q, label in ((0.5, "p50"), (0.99, "p99")):
            figures[f"{name}_rule_{label}_ms"] = Figure(
                _ms(leg.p(q)), "ms", f"rule answer {label}, {leg.name}"
            )
    figures["added_p50_ms"] = Figure(_ms(added_p50), "ms", "what the gateway adds at p50")
    figures["added_p99_ms"] = Figure(_ms(added_p99), "ms", "what the gateway adds at p99")
    figures["openai_sdk_p50_ms"] = Figure(_ms(sdk_p50), "ms", "what the openai SDK adds at p50")

    gw_rps = gw_answered / gw_wall
    kafka_rps = kafka_answered / kafka_wall
    print(f"\nrule answers with {args.concurrency} in flight for {args.seconds:.0f} s:")
    print(f"  gateway (aiohttp):    {gw_rps:8.0f} answers/s ({gw_failed} failed{_why(gw_codes)})")
    print(
        f"  Kafka (laneway SDK):  {kafka_rps:8.0f} answers/s "
        f"({kafka_failed} failed{_why(kafka_codes)})"
    )
    print(f"  gateway / Kafka: {gw_rps / max(kafka_rps, 1e-9):.2f}")
    figures["gateway_rule_rps"] = Figure(
        round(gw_rps), "req/s", "rule answers/s through the gateway"
    )
    figures["kafka_rule_rps"] = Figure(
        round(kafka_rps), "req/s", "rule answers/s through the Kafka SDK"
    )
    if cpu_before is not None and cpu_after is not None and cpu_after > cpu_before:
        per_core = gw_answered / (cpu_after - cpu_before)
        print(
            f"  the gateway process used {cpu_after - cpu_before:.1f} CPU s for "
            f"{gw_answered} answers: {per_core:.0f} answers per CPU second of its own"
        )
        figures["gateway_rps_per_core"] = Figure(
            round(per_core), "req/s", "rule answers per CPU second of the gateway process"
        )

    print(f"\ntime to first token, light model, {len(sse.latencies_ms)} streamed per client:")
    for leg in (sse, stream):
        if leg.latencies_ms:
            print(f"  {leg.name:28} p50 {leg.p(0.5):8.1f} ms")
    if sse.latencies_ms and stream.latencies_ms:
        ratio = sse.p(0.5) / max(stream.p(0.5), 1e-9)
        print(f"  SSE / Kafka: {ratio:.2f}")
        figures["gateway_ttft_p50_ms"] = Figure(_ms(sse.p(0.5)), "ms", "TTFT p50 through the SSE")
        figures["kafka_ttft_p50_ms"] = Figure(_ms(stream.p(0.5)), "ms", "TTFT p50 on Kafka")
        figures["ttft_ratio"] = Figure(round(ratio, 3), "x", "TTFT p50, gateway SSE / Kafka")
    failed = gw_failed + kafka_failed
    figures["failed"] = Figure(failed, "requests", "answers that were not ok")
    return BenchRun(1 if failed else 0, figures)
