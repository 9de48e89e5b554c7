"""``laneway bench --compare``: the hybrid engine against a single heavy
path, side by side in one run.

The same workload goes through two embedded stacks, one after the other
on the same machine: the hybrid engine (cache -> rules -> smart router)
and one whose every request is forced to the heavy model
(``LANEWAY_ROUTING_FORCE_PATH=heavy``: no cache, no rules, no router).
Default mix: 50% rule-able or repeated questions, 30% simple ones, 20%
hard ones. Simple and hard questions differ in a named entity or a
number, so neither exact nor semantic cache can answer them; only the
repeated FAQ questions come back.
"""

from __future__ import annotations

import argparse
import asyncio
import os
from collections import Counter
from dataclasses import dataclass
from typing import Any

from schemas.settings import Settings
from streams.bench import RULE_PROMPTS, Sample, _percentile, drive

__all__ = ["CompareRow", "compare", "hybrid_workload"]

FAQ_PROMPTS = [
    "How do I reset my password?",
    "What are your opening hours?",
    "How can I change my delivery address?",
    "Do you ship internationally?",
    "How do I cancel my subscription?",
]
PLACES = [
    "France", "Spain", "Italy", "Japan", "Kenya", "Peru", "Canada", "Norway", "Egypt", "India",
    "Chile", "Ghana", "Nepal", "Cuba", "Iran", "Laos", "Mali", "Oman", "Chad", "Fiji",
]  # fmt: skip
TOPICS = [
    "the sky is blue", "leaves change colour in autumn", "bread rises", "ice floats on water",
    "the moon has phases", "metal feels cold", "cats purr", "the sea is salty",
    "planes can fly", "onions make you cry",
]  # fmt: skip


def hybrid_workload(n: int, max_tokens: int) -> list[dict[str, Any]]:
    """Deterministic: per 10 requests, 3 rule-able, 2 repeated FAQ, 3 simple
    (one country each), 2 hard (one topic each)."""
    requests: list[dict[str, Any]] = []
    for i in range(n):
        slot, round_ = i % 10, i // 10
        if slot < 3:
            prompt = RULE_PROMPTS[(i + round_) % len(RULE_PROMPTS)]
        elif slot < 5:
            prompt = FAQ_PROMPTS[(2 * round_ + slot) % len(FAQ_PROMPTS)]
        elif slot < 8:
            place = PLACES[(3 * round_ + slot - 5) % len(PLACES)]
            prompt = f"What is the capital of {place}?"
        else:
            topic = TOPICS[(2 * round_ + slot - 8) % len(TOPICS)]
            prompt = f"Explain why {topic}."
        requests.append({"prompt": prompt, "max_tokens": max_tokens, "temperature": 0.0})
    return requests


@dataclass(frozen=True, slots=True)
class CompareRow:
    engine: str
    count: int
    errors: int
    lost: int
    seconds: float
    throughput_rps: float
    p50_ms: float
    p99_ms: float
    paths: dict[str, int]


def _row(engine: str, samples: list[Sample], started: float, lost: int) -> CompareRow:
    latencies = sorted(s.latency_ms for s in samples)
    seconds = max((s.finished_at for s in samples), default=started) - started
    return CompareRow(
        engine=engine,
        count=len(samples),
        errors=sum(s.status != "ok" for s in samples),
        lost=lost,
        seconds=seconds,
        throughput_rps=len(samples) / max(seconds, 1e-9),
        p50_ms=_percentile(latencies, 0.50),
        p99_ms=_percentile(latencies, 0.99),
        paths=dict(Counter(s.path for s in samples)),
    )


def _run_once(
    settings: Settings, engine: str, env: dict[str, str], args: argparse.Namespace
) -> CompareRow:
    from streams.supervisor import Stack

    stack = Stack(
        settings,
        http_port_base=None,
        use_external_redis="url" in settings.redis.model_fields_set,
        child_env={"LANEWAY_REDIS_KEY_PREFIX": f"bench-{engine}-{os.getpid()}", **env},
    )
    stack.start(ready_timeout_s=300)
    try:
        requests = hybrid_workload(args.requests, args.max_tokens)
        samples, started, lost = asyncio.run(
            drive(stack.settings, requests, args.concurrency, timeout_s=600)
        )
    finally:
        stack.stop()
    return _row(engine, samples, started, lost)


def format_compare(rows: list[CompareRow]) -> str:
    head = (
        f"{'engine':8} {'n':>4} {'err':>4} {'lost':>4} {'s':>7} {'req/s':>7} "
        f"{'p50 ms':>9} {'p99 ms':>9}  paths"
    )
    lines = [head, "-" * len(head)]
    for r in rows:
        paths = " ".join(f"{k}={v}" for k, v in sorted(r.paths.items()))
        lines.append(
            f"{r.engine:8} {r.count:4d} {r.errors:4d} {r.lost:4d} {r.seconds:7.1f} "
            f"{r.throughput_rps:7.2f} {r.p50_ms:9.1f} {r.p99_ms:9.1f}  {paths}"
        )
    return "\n".join(lines)


def compare(settings: Settings, args: argparse.Namespace) -> int:
    """Run both engines on one workload and print the table and the ratios."""
    hybrid = _run_once(settings, "hybrid", {}, args)
    heavy = _run_once(settings, "heavy", {"LANEWAY_ROUTING_FORCE_PATH": "heavy"}, args)
    print(
        f"\nlaneway bench --compare: {args.requests} requests "
        f"(50% rule-able or repeated, 30% simple, 20% hard), "
        f"concurrency {args.concurrency}, max_tokens {args.max_tokens}"
    )
    print(format_compare([hybrid, heavy]))
    speedup = hybrid.throughput_rps / max(heavy.throughput_rps, 1e-9)
    p99 = heavy.p99_ms / max(hybrid.p99_ms, 1e-9)
    print(
        f"\nhybrid / heavy-only throughput: {speedup:.2f}x "
        f"(+{(speedup - 1) * 100:.0f}%); heavy-only p99 / hybrid p99: {p99:.2f}x"
    )
    return 1 if hybrid.lost or heavy.lost else 0
