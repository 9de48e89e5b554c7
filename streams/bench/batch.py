"""``laneway bench batch N``: an offline batch job's throughput, and what
it costs interactive traffic.

One run, two phases on the same stack (``--embedded`` starts one):

1. **alone**: realtime requests (light model, cache bypassed) offered open
   loop at ``--rt-rps`` for ``--window-s`` seconds;
2. **with the batch**: an N-line batch job (model prompts, cache bypassed)
   is submitted, and the same realtime load is offered again while it runs.

It prints the batch's requests/s and completion tokens/s (submit to
completed, as counted by the batch tracker) and the realtime p50/p95/p99
of both phases side by side; the target is a realtime p99 no more than
25% higher with the batch.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import time
import uuid
from dataclasses import dataclass

from schemas.jobs import BatchJob
from schemas.messages import InferenceResult
from schemas.settings import Settings
from streams.bench.drive import NO_CACHE, _percentile, stack_for, warm_up
from streams.bench.results import BenchRun, Figure
from streams.client import LanewayClient
from streams.jobs.jsonl import request_id
from streams.jobs.progress import get_job
from streams.jobs.store import JobStore
from streams.jobs.submit import submit_file

__all__ = ["DRIVES_STACK", "HELP", "add_arguments", "batch_file", "run"]

HELP = "an N-line batch job: its throughput, and realtime p99 without and with it"
DRIVES_STACK = True


def add_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("lines", type=int, metavar="N", help="lines of the batch job")
    parser.add_argument("--max-tokens", type=int, default=16)
    parser.add_argument("--rt-rps", type=float, default=2.0, help="realtime requests per second")
    parser.add_argument(
        "--window-s", type=float, default=15.0, help="seconds of realtime load per phase"
    )
    parser.add_argument(
        "--embedded", action="store_true", help="start an embedded stack for the run"
    )


TARGET_RISE = 0.25
BATCH_WAIT_S = 900.0
"""The figures are printed for what finished by then (a batch held back by
flow control, say)."""
COLOURS = ["red", "green", "blue", "yellow", "purple", "orange", "black", "white"]


def batch_file(n: int, max_tokens: int, tag: str) -> bytes:
    """N different model prompts (no two alike, so none is answered twice)."""
    rows = [
        {
            "custom_id": f"line-{i}",
            "body": {
                "prompt": f"Write one sentence about a {COLOURS[i % 8]} kite, no. {i} ({tag}).",
                "max_tokens": max_tokens,
                "metadata": NO_CACHE,
            },
        }
        for i in range(n)
    ]
    return "".join(json.dumps(r) + "\n" for r in rows).encode()


@dataclass(slots=True)
class Phase:
    name: str
    latencies_ms: list[float]
    errors: int
    lost: int

    def p(self, q: float) -> float:
        return _percentile(sorted(self.latencies_ms), q)


async def realtime_load(
    client: LanewayClient, name: str, rps: float, window_s: float, max_tokens: int
) -> Phase:
    """Open-loop realtime requests at ``rps`` for ``window_s``."""
    latencies: list[float] = []
    errors = lost = 0

    async def one(i: int) -> None:
        nonlocal errors, lost
        sent = time.perf_counter()
        future = await client.submit(
            {
                "id": f"rt-{name}-{i}-{uuid.uuid4().hex[:6]}",
                "prompt": f"Name a {COLOURS[i % 8]} fruit ({i}).",
                "lane": "realtime",
                "max_tokens": max_tokens,
                "metadata": NO_CACHE,
            }
        )
        try:
            result: InferenceResult = await asyncio.wait_for(future, 120)
        except TimeoutError:
            lost += 1
            return
        if result.status != "ok":
            errors += 1
            return
        latencies.append((time.perf_counter() - sent) * 1000)

    tasks = []
    started = time.perf_counter()
    for i in range(max(1, int(rps * window_s))):
        await asyncio.sleep(max(0.0, started + i / rps - time.perf_counter()))
        tasks.append(asyncio.create_task(one(i)))
    await asyncio.gather(*tasks)
    return Phase(name, latencies, errors, lost)


async def _tokens(settings: Settings, job: BatchJob, n: int) -> int:
    redis = settings.redis.client()
    try:
        store = JobStore(redis, settings.redis.key_prefix)
        raw = await store.results(job.id, [request_id(job.id, f"line-{i}") for i in range(n)])
        return sum(InferenceResult.model_validate_json(r).usage.completion_tokens for r in raw if r)
    finally:
        await redis.aclose()


async def bench(
    settings: Settings, args: argparse.Namespace
) -> tuple[Phase, Phase, dict[str, float]]:
    n, rps, window_s = args.lines, args.rt_rps, args.window_s
    async with LanewayClient(settings.kafka, client_id=f"bench-{uuid.uuid4().hex[:6]}") as client:
        await warm_up(client, 300)
        alone = await realtime_load(client, "alone", rps, window_s, args.max_tokens)
        data = batch_file(n, args.max_tokens, uuid.uuid4().hex[:6])
        started = time.perf_counter()
        submitting = asyncio.create_task(
            submit_file(settings, data, tenant=f"bench-{uuid.uuid4().hex[:6]}")
        )
        await asyncio.sleep(2.0)  # the batch is on the bulk lane before the clock starts
        loaded = await realtime_load(client, "with batch", rps, window_s, args.max_tokens)
        job = await submitting
        give_up = time.perf_counter() + BATCH_WAIT_S
        while not job.final and time.perf_counter() < give_up:
            await asyncio.sleep(0.5)
            job = await get_job(settings, job.id) or job
        seconds = time.perf_counter() - started
    tokens = await _tokens(settings, job, n)
    figures = {
        "finished": 1.0 if job.final else 0.0,
        "seconds": seconds,
        "req_s": (job.counts.done + job.counts.failed) / seconds,
        "tok_s": tokens / seconds,
        "done": job.counts.done,
        "failed": job.counts.failed,
        "tokens": tokens,
    }
    return alone, loaded, figures


def format_batch_bench(
    alone: Phase, loaded: Phase, f: dict[str, float], args: argparse.Namespace
) -> str:
    lines = [
        f"laneway bench batch {args.lines}: max_tokens {args.max_tokens}; realtime "
        f"{args.rt_rps:g} req/s for {args.window_s:g} s alone, then again during the batch",
        f"batch: {f['done'] + f['failed']:.0f} requests ({f['done']:.0f} ok, {f['failed']:.0f} "
        f"failed) in {f['seconds']:.1f} s: {f['req_s']:.2f} req/s, {f['tok_s']:.1f} "
        f"completion tokens/s ({f['tokens']:.0f} tokens)"
        + ("" if f["finished"] else f"; NOT FINISHED after {BATCH_WAIT_S:.0f} s"),
        "",
        "{:12} {:>4} {:>4} {:>4} {:>9} {:>9} {:>9}".format(
            "realtime", "n", "err", "lost", "p50 ms", "p95 ms", "p99 ms"
        ),
        "-" * 57,
    ]
    for phase in (alone, loaded):
        lines.append(
            f"{phase.name:12} {len(phase.latencies_ms):4} {phase.errors:4} {phase.lost:4} "
            f"{phase.p(0.5):9.1f} {phase.p(0.95):9.1f} {phase.p(0.99):9.1f}"
        )
    base = alone.p(0.99)
    rise = loaded.p(0.99) / base - 1 if base else 0.0
    verdict = "met" if rise <= TARGET_RISE else "MISSED"
    lines.append(
        f"\nrealtime p99 with the batch / alone: {1 + rise:.2f}x ({rise:+.0%}); "
        f"target <= +{TARGET_RISE:.0%}: {verdict}"
    )
    return "\n".join(lines)


def run(settings: Settings, args: argparse.Namespace) -> BenchRun:
    with stack_for(settings, args.embedded, log_path=args.log_file) as running:
        alone, loaded, measured = asyncio.run(bench(running, args))
    print()
    print(format_batch_bench(alone, loaded, measured, args))
    figures = {
        "batch_rps": Figure(measured["req_s"], "req/s", "batch job requests/s, submit to done"),
        "batch_tokens_per_s": Figure(measured["tok_s"], "tokens/s", "batch job tokens/s"),
        "batch_seconds": Figure(measured["seconds"], "s", "batch job submit to completed"),
        "batch_finished": Figure(measured["finished"], "bool", "the job finished in time"),
        "realtime_p99_alone_ms": Figure(alone.p(0.99), "ms", "realtime p99 alone"),
        "realtime_p99_with_batch_ms": Figure(loaded.p(0.99), "ms", "realtime p99 with the batch"),
    }
    return BenchRun(1 if alone.lost or loaded.lost else 0, figures)
