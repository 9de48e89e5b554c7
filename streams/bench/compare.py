"""``laneway bench compare``: the hybrid engine against a single heavy
path, side by side in one run.

The same workload goes through two embedded stacks, one after the other
on the same machine: the hybrid engine (cache -> rules -> smart router)
and one whose every request is forced to the heavy model
(``LANEWAY_ROUTING_FORCE_PATH=heavy``: no cache, no rules, no router).
Default mix: 50% rule-able or repeated questions, 30% simple ones, 20%
hard ones (``hybrid_workload``).
"""

from __future__ import annotations

import argparse
import asyncio
import os
from collections import Counter
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

from schemas.messages import Lane
from schemas.settings import Settings
from streams.bench.drive import RULE_PROMPTS, Sample, _percentile, add_client_arguments, drive
from streams.bench.results import BenchRun, Figure

__all__ = [
    "HELP",
    "STARTS_STACK",
    "CompareRow",
    "add_arguments",
    "compare_row",
    "format_compare",
    "hybrid_workload",
    "run",
    "run_once",
]

HELP = "the hybrid engine against every request on the heavy path, two embedded stacks"
STARTS_STACK = True


def add_arguments(parser: argparse.ArgumentParser) -> None:
    add_client_arguments(parser, embedded=False)


MODEL_PATHS = ("light", "heavy")
"""The paths whose answers a model decoded (not cache, not rules)."""

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
SIMPLE_TEMPLATES = [
    "What is the capital of {}?",
    "What language is spoken in {}?",
    "Which continent is {} in?",
]
TOPICS = [
    "the sky is blue", "leaves change colour in autumn", "bread rises", "ice floats on water",
    "the moon has phases", "metal feels cold", "cats purr", "the sea is salty",
    "planes can fly", "onions make you cry", "rainbows form", "we have seasons",
    "the sun sets in the west", "soap cleans", "yeast makes beer", "bees make honey",
    "stars twinkle", "rivers meander", "volcanoes erupt", "bicycles stay upright",
    "fish need water", "snow is white", "deserts are dry", "glass is transparent",
    "thunder follows lightning", "milk turns sour", "birds migrate", "wood floats",
    "coffee keeps us awake", "plants need light",
]  # fmt: skip


def hybrid_workload(n: int, max_tokens: int) -> list[dict[str, Any]]:
    """Deterministic: per 10 requests, 3 rule-able, 2 from a pool of five FAQ
    questions (repeated), 3 simple and 2 hard. Simple and hard questions
    are all different up to n = 150, so neither exact nor
    semantic cache answers them: the entity guard keeps "the capital of
    Peru" from answering "the capital of Chad"."""
    requests: list[dict[str, Any]] = []
    simple = (t.format(p) for t in SIMPLE_TEMPLATES for p in PLACES)
    hard = (f"Explain why {topic}." for topic in TOPICS)
    for i in range(n):
        slot, round_ = i % 10, i // 10
        if slot < 3:
            prompt = RULE_PROMPTS[(i + round_) % len(RULE_PROMPTS)]
        elif slot < 5:
            prompt = FAQ_PROMPTS[(2 * round_ + slot) % len(FAQ_PROMPTS)]
        elif slot < 8:
            prompt = next(simple, None) or f"What is the capital of {PLACES[i % len(PLACES)]}?"
        else:
            prompt = next(hard, None) or f"Explain why {TOPICS[i % len(TOPICS)]}."
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
    model_s: dict[str, float]
    """Per model path, the model time its answers took, in seconds. A batch's
    time is shared by its requests, so a batch of four counts once."""
    codes: dict[str, int]
    """The errors by code."""
    decoded_by_lane: dict[str, int]
    """Per lane, the answers a model decoded there (not cache, not rules)."""
    stopped: int = 0
    """Decodes the workers stopped part-way because another worker's answer
    reached the cache first (answered from there, so not in ``decoded_by_lane``)."""


def compare_row(
    engine: str, samples: list[Sample], started: float, lost: int, stopped: int = 0
) -> CompareRow:
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
        model_s={
            path: sum(s.inference_ms / max(1, s.batch_size) for s in samples if s.path == path)
            / 1000
            for path in MODEL_PATHS
            if any(s.path == path for s in samples)
        },
        codes=dict(Counter(s.code for s in samples if s.status != "ok")),
        decoded_by_lane=dict(Counter(s.lane for s in samples if s.path in MODEL_PATHS)),
        stopped=stopped,
    )


def run_once(
    settings: Settings,
    engine: str,
    env: dict[str, str],
    args: argparse.Namespace,
    requests: Sequence[dict[str, Any]],
    lanes: tuple[Lane, ...] = tuple(Lane),
    concurrency: int | None = None,
) -> CompareRow:
    """``requests`` through an embedded stack of its own (``env`` added to
    its processes' environment, a worker per entry of ``lanes``, its logs
    in ``args.log_file``), at ``concurrency`` (default
    ``args.concurrency``) in flight through ``args.client``."""
    from streams.devstack.supervisor import Stack

    stack = Stack(
        settings,
        http_port_base=None,
        use_external_redis="url" in settings.redis.model_fields_set,
        lanes=lanes,
        log_path=args.log_file,
        child_env={"LANEWAY_REDIS_KEY_PREFIX": f"bench-{engine}-{os.getpid()}", **env},
    )
    stack.start(ready_timeout_s=300)
    try:
        samples, started, lost = asyncio.run(
            drive(
                stack.settings,
                requests,
                concurrency or args.concurrency,
                timeout_s=600,
                client_kind=args.client,
            )
        )
        stopped = int(stack.metric_total("laneway_decodes_stopped_total", "worker-"))
    finally:
        stack.stop()
    return compare_row(engine, samples, started, lost, stopped)


def format_compare(rows: list[CompareRow]) -> str:
    head = (
        f"{'engine':8} {'n':>4} {'err':>4} {'lost':>4} {'s':>7} {'req/s':>7} "
        f"{'p50 ms':>9} {'p99 ms':>9}  paths (model seconds)"
    )
    lines = [head, "-" * len(head)]
    for r in rows:
        paths = " ".join(
            f"{k}={v}" + (f" ({r.model_s[k]:.1f} s)" if k in r.model_s else "")
            for k, v in sorted(r.paths.items())
        )
        lines.append(
            f"{r.engine:8} {r.count:4d} {r.errors:4d} {r.lost:4d} {r.seconds:7.1f} "
            f"{r.throughput_rps:7.2f} {r.p50_ms:9.1f} {r.p99_ms:9.1f}  {paths}"
        )
    for r in rows:
        if r.codes:
            codes = ", ".join(f"{code or '-'} {n}" for code, n in sorted(r.codes.items()))
            lines.append(f"{r.engine} errors: {codes}")
    return "\n".join(lines)


def run(settings: Settings, args: argparse.Namespace) -> BenchRun:
    """Run both engines on one workload and print the table and the ratios."""
    requests = hybrid_workload(args.requests, args.max_tokens)
    hybrid = run_once(settings, "hybrid", {}, args, requests)
    forced = {"LANEWAY_ROUTING_FORCE_PATH": "heavy"}
    heavy = run_once(settings, "heavy", forced, args, requests)
    print(
        f"\nlaneway bench compare: {args.requests} requests "
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
    figures = {
        "hybrid_rps": Figure(hybrid.throughput_rps, "req/s", "hybrid engine throughput"),
        "heavy_rps": Figure(heavy.throughput_rps, "req/s", "heavy-only throughput"),
        "hybrid_p50_ms": Figure(hybrid.p50_ms, "ms", "hybrid engine p50"),
        "hybrid_p99_ms": Figure(hybrid.p99_ms, "ms", "hybrid engine p99"),
        "heavy_p50_ms": Figure(heavy.p50_ms, "ms", "heavy-only p50"),
        "heavy_p99_ms": Figure(heavy.p99_ms, "ms", "heavy-only p99"),
        "throughput_ratio": Figure(speedup, "x", "hybrid / heavy-only throughput"),
        "p99_ratio": Figure(p99, "x", "heavy-only p99 / hybrid p99"),
    }
    return BenchRun(1 if hybrid.lost or heavy.lost else 0, figures)
