"""``laneway bench mix``: a mixed workload (rules, simple and hard
questions, some of them batch jobs) through the running stack, or an
embedded one with ``--embedded``, reported per lane and path.

Alongside, the same rule is timed as a direct in-process call of the
classifier's decision, so the cost of the trip through Kafka is a ratio
measured in the same run on the same machine. ``--stream`` sends every
request with ``stream: true`` and puts the time to first token beside the
total. The stack's Redis is read before and after (``INFO commandstats``):
the commands per request every process spent, background timers included,
what a Redis capacity plan starts from.
"""

from __future__ import annotations

import argparse
import asyncio
import time
from collections import Counter

from schemas.settings import Settings
from streams.bench.drive import (
    add_client_arguments,
    direct_rule_ms,
    drive,
    format_table,
    mixed_workload,
    stack_for,
    summarize,
)
from streams.bench.results import BenchRun, Figure

__all__ = ["DRIVES_STACK", "HELP", "add_arguments", "run"]

HELP = "a mixed workload through the stack: latency and throughput per lane and path"
DRIVES_STACK = True


def add_arguments(parser: argparse.ArgumentParser) -> None:
    add_client_arguments(parser)
    parser.add_argument(
        "--stream",
        action="store_true",
        help="every request with stream: true: time to first token beside the total",
    )


IDLE_S = 3.0
"""How long the stack's Redis is watched with no traffic, for its own pace."""

SETTLE_S = 3.0
"""How long after the last answer the Redis count waits for the writes
that follow an answer (quality events folded, cache entries)."""


def redis_commands(settings: Settings) -> dict[str, int] | None:
    """Calls per command on the stack's Redis so far (``INFO commandstats``),
    or ``None`` where it cannot be read (a cluster, or Redis away)."""
    if settings.redis.cluster:
        return None
    import redis

    client = redis.Redis.from_url(settings.redis.url, socket_timeout=5)
    try:
        stats = client.info("commandstats")
    except redis.RedisError:
        return None
    finally:
        client.close()
    return {name.removeprefix("cmdstat_"): int(row["calls"]) for name, row in stats.items()}


def run(settings: Settings, args: argparse.Namespace) -> BenchRun:
    with stack_for(settings, args.embedded, args.realtime_workers, args.log_file) as running:
        requests = mixed_workload(args.requests, args.max_tokens)
        idle_from = redis_commands(running)
        time.sleep(IDLE_S)  # the stack's own pace (heartbeats, boards, timers), no traffic
        before = redis_commands(running)
        begun = time.monotonic()
        samples, started, lost = asyncio.run(
            drive(
                running,
                requests,
                args.concurrency,
                timeout_s=300,
                client_kind=args.client,
                stream=args.stream,
            )
        )
        time.sleep(SETTLE_S)  # the quality loop's and the workers' writes after the answers
        after = redis_commands(running)
        elapsed = time.monotonic() - begun
    rows = summarize(samples, started)
    print(
        f"\nlaneway bench mix: {len(requests)} requests, concurrency {args.concurrency}, "
        f"max_tokens {args.max_tokens}"
        + (", streamed (ttft: time to first token)" if args.stream else "")
    )
    print(format_table(rows))
    figures: dict[str, Figure] = {}
    for row in rows:
        # A request refused before it had a lane or a path is shown as "-": "none".
        lane, path = (part if part != "-" else "none" for part in (row.lane, row.path))
        name = f"{lane}_{path}" if row.lane != "all" else "all"
        figures[f"{name}_p50_ms"] = Figure(row.p50_ms, "ms", f"{row.lane} {row.path} p50")
        figures[f"{name}_p99_ms"] = Figure(row.p99_ms, "ms", f"{row.lane} {row.path} p99")
        figures[f"{name}_rps"] = Figure(
            row.throughput_rps, "req/s", f"{row.lane} {row.path} throughput"
        )
        if row.ttft_p50_ms is not None:
            figures[f"{name}_ttft_p50_ms"] = Figure(
                row.ttft_p50_ms, "ms", f"{row.lane} {row.path} time to first token p50"
            )
        if row.lane == "realtime" and row.path == "light" and row.ttft_p50_ms is not None:
            share = row.ttft_p50_ms / max(row.p50_ms, 1e-9)
            print(
                f"realtime light: ttft p50 {row.ttft_p50_ms:.1f} ms is {share:.0%} "
                f"of the total's p50 {row.p50_ms:.1f} ms"
            )
    rules_rows = [r for r in rows if r.path == "rules"]
    direct = direct_rule_ms(settings)
    figures["rules_direct_ms"] = Figure(direct, "ms", "the same rule called in-process")
    if rules_rows:
        through_kafka = rules_rows[0].p50_ms
        ratio = through_kafka / direct
        print(
            f"\nrules path p50 through Kafka: {through_kafka:.2f} ms; direct in-process call of "
            f"the same rule: {direct:.4f} ms; ratio {ratio:,.0f}x"
        )
        figures["rules_kafka_ratio"] = Figure(ratio, "x", "rules p50 through Kafka / direct")
    if idle_from is not None and before is not None and after is not None:
        idle_rate = (sum(before.values()) - sum(idle_from.values())) / IDLE_S
        spent = Counter(after)
        spent.subtract(before)
        traffic = sum(spent.values()) - idle_rate * elapsed
        per_request = traffic / max(len(requests), 1)
        top = ", ".join(f"{name} {n / len(requests):.1f}" for name, n in spent.most_common(6))
        print(
            f"Redis commands per request: {per_request:.1f} (every process, less the "
            f"{idle_rate:.0f} commands/s the idle stack spends; most: {top})"
        )
        figures["redis_commands_per_request"] = Figure(
            round(per_request, 1), "commands", "Redis commands per request, every process"
        )
        figures["redis_idle_commands_per_s"] = Figure(
            round(idle_rate), "commands/s", "Redis commands per second of the idle stack"
        )
    print(f"lost requests: {lost}")
    figures["lost"] = Figure(lost, "requests", "requests that got no answer")
    return BenchRun(1 if lost else 0, figures)
