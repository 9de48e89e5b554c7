"""``laneway bench overload``: capacity measured closed loop, then 1x, 2x
and 3x of it offered open loop for a fixed window each, with deadlines (one
request in ten asks for realtime): what the lanes refuse, expire and still
answer, and the realtime p99 at each load.
"""

from __future__ import annotations

import argparse
import asyncio
import time
import uuid
from collections import Counter
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

from schemas.messages import InferenceResult, Lane
from schemas.settings import Settings
from streams.bench.drive import (
    NO_CACHE,
    BenchClient,
    _percentile,
    add_client_arguments,
    drive,
    mixed_workload,
    open_client,
    overload_workload,
    stack_for,
)
from streams.bench.results import BenchRun, Figure, Series

__all__ = [
    "DRIVES_STACK",
    "HELP",
    "StepRow",
    "add_arguments",
    "format_steps",
    "overload",
    "overload_step",
    "run",
    "step_row",
]

HELP = "offer 1x/2x/3x of the measured capacity, open loop: refusals, expiries, realtime p99"
DRIVES_STACK = True


def add_arguments(parser: argparse.ArgumentParser) -> None:
    add_client_arguments(parser)
    parser.add_argument("--window-s", type=float, default=15.0, help="seconds per step")
    parser.add_argument("--deadline-ms", type=int, default=20_000, help="request deadline")
    parser.add_argument("--settle-s", type=float, default=5.0, help="pause between steps")


@dataclass(frozen=True, slots=True)
class StepRow:
    load: float
    offered_rps: float
    sent: int
    ok: int
    degraded: int
    limited: int
    expired: int
    other_errors: int
    lost: int
    realtime_p99_ms: float
    """Of every realtime result, refusals (INF-429, fast by design) included."""
    realtime_served_p99_ms: float = 0.0
    """Of the realtime results that were not refused: answers, and deadlines
    that passed (INF-503)."""
    realtime_limited: int = 0
    """Of ``limited``, the realtime lane's."""
    realtime_expired: int = 0
    """Of ``expired``, the realtime lane's."""
    realtime_queue_p99_ms: float = 0.0
    """Of the realtime answers a model gave: p99 of the time they waited in
    the lane, and of their inference (the result's own timings)."""
    realtime_inference_p99_ms: float = 0.0
    model_answers: tuple[int, int, int] = (0, 0, 0)
    """Answers a model gave (not the cache or a rule), on realtime, medium
    and bulk: where the lanes' capacity went."""


async def overload_step(
    client: BenchClient,
    requests: Sequence[dict[str, Any]],
    rate_rps: float,
    timeout_s: float,
) -> tuple[list[tuple[InferenceResult, float]], int]:
    """Open loop: send at ``rate_rps`` whatever happens to the answers."""
    loop = asyncio.get_running_loop()
    started = loop.time()
    pending: list[tuple[asyncio.Future[InferenceResult], float]] = []
    finished_at: dict[int, float] = {}  # when each answer arrived, not when it was looked at
    for i, request in enumerate(requests):
        await asyncio.sleep(max(0.0, started + i / rate_rps - loop.time()))
        sent = time.perf_counter()
        rid = f"ov-{i}-{uuid.uuid4().hex[:6]}"
        future = await client.submit({"id": rid, **request})
        future.add_done_callback(lambda f: finished_at.setdefault(id(f), time.perf_counter()))
        pending.append((future, sent))
    answered: list[tuple[InferenceResult, float]] = []
    done = await asyncio.wait([f for f, _ in pending], timeout=timeout_s)
    lost = len(done[1])
    for future, sent in pending:
        if future in done[0]:
            answered.append((future.result(), (finished_at[id(future)] - sent) * 1000))
    return answered, lost


def step_row(
    load: float, rate: float, answered: list[tuple[InferenceResult, float]], lost: int
) -> StepRow:
    def code(r: InferenceResult) -> str | None:
        return r.error.code if r.error else None

    realtime = sorted(ms for r, ms in answered if r.lane == "realtime")
    served = sorted(ms for r, ms in answered if r.lane == "realtime" and code(r) != "INF-429")
    modelled = [r.timings for r, _ in answered if r.lane == "realtime" and r.timings.inference_ms]
    by_model = Counter(r.lane for r, _ in answered if r.status == "ok" and _by_model(r))
    return StepRow(
        load=load,
        offered_rps=rate,
        sent=len(answered) + lost,
        ok=sum(r.status == "ok" and not r.degraded for r, _ in answered),
        degraded=sum(r.status == "ok" and r.degraded for r, _ in answered),
        limited=sum(code(r) == "INF-429" for r, _ in answered),
        expired=sum(code(r) == "INF-503" for r, _ in answered),
        other_errors=sum(code(r) not in (None, "INF-429", "INF-503") for r, _ in answered),
        lost=lost,
        realtime_p99_ms=_percentile(realtime, 0.99),
        realtime_served_p99_ms=_percentile(served, 0.99),
        realtime_limited=sum(code(r) == "INF-429" for r, _ in answered if r.lane == "realtime"),
        realtime_expired=sum(code(r) == "INF-503" for r, _ in answered if r.lane == "realtime"),
        realtime_queue_p99_ms=_percentile(sorted(t.queue_ms for t in modelled), 0.99),
        realtime_inference_p99_ms=_percentile(sorted(t.inference_ms for t in modelled), 0.99),
        model_answers=(by_model[Lane.REALTIME], by_model[Lane.MEDIUM], by_model[Lane.BULK]),
    )


def _by_model(result: InferenceResult) -> bool:
    return result.path is not None and result.path not in ("cache", "rules")


def format_steps(rows: Sequence[StepRow]) -> str:
    """One line per step. ``429`` and ``503`` give the realtime lane's share
    after a slash; the realtime p99s: of every realtime result, of those
    not refused, and of the model answers' wait in the lane and inference;
    then the model answers on realtime, medium and bulk."""
    head = (
        f"{'load':>5} {'req/s':>6} {'sent':>5} {'ok':>5} {'degr':>5} {'429/rt':>8} "
        f"{'503/rt':>7} {'err':>4} {'lost':>4}  realtime p99 ms: {'all':>7} {'served':>7} "
        f"{'queue':>7} {'infer':>7}  {'model rt/md/bk':>14}"
    )
    lines = [head, "-" * len(head)]
    for r in rows:
        lines.append(
            f"{r.load:4.0f}x {r.offered_rps:6.2f} {r.sent:5d} {r.ok:5d} {r.degraded:5d} "
            f"{f'{r.limited}/{r.realtime_limited}':>8} {f'{r.expired}/{r.realtime_expired}':>7} "
            f"{r.other_errors:4d} {r.lost:4d} {'':17}{r.realtime_p99_ms:7.0f} "
            f"{r.realtime_served_p99_ms:7.0f} {r.realtime_queue_p99_ms:7.0f} "
            f"{r.realtime_inference_p99_ms:7.0f}  {'/'.join(map(str, r.model_answers)):>14}"
        )
    return "\n".join(lines)


async def overload(settings: Settings, args: argparse.Namespace) -> list[StepRow]:
    """Measure capacity closed-loop, then offer 1x, 2x, 3x of it for a fixed window."""
    # Lane capacity is the question: the repeated prompts must reach the
    # models, not the response cache.
    calibration = [
        {**r, "metadata": NO_CACHE}
        for r in mixed_workload(max(16, args.requests // 4), args.max_tokens)
    ]
    samples, started, _ = await drive(
        settings, calibration, args.concurrency, timeout_s=300, client_kind=args.client
    )
    capacity = len(samples) / max(1e-9, max(s.finished_at for s in samples) - started)
    rows = []
    async with open_client(settings, args.client, "overload") as client:
        for load in (1.0, 2.0, 3.0):
            rate = capacity * load
            n = max(1, round(rate * args.window_s))
            workload = overload_workload(
                n, args.max_tokens, args.deadline_ms, settings.routing.realtime_max_deadline_ms
            )
            answered, lost = await overload_step(client, workload, rate, timeout_s=300)
            rows.append(step_row(load, rate, answered, lost))
            await asyncio.sleep(args.settle_s)  # let the lanes drain between steps
    return rows


def run(settings: Settings, args: argparse.Namespace) -> BenchRun:
    with stack_for(settings, args.embedded, args.realtime_workers, args.log_file) as running:
        steps = asyncio.run(overload(running, args))
    print(
        f"\nlaneway bench overload: {args.window_s:.0f} s per step, "
        f"deadline {args.deadline_ms} ms ({running.routing.realtime_max_deadline_ms} ms "
        f"for one in ten, which asks for realtime), max_tokens {args.max_tokens}"
    )
    if args.realtime_workers > 1:
        print(
            f"{args.realtime_workers} realtime workers over {running.kafka.partitions} "
            f"partitions; steered to the worker with room: {running.flow.realtime_steer}"
        )
    print(format_steps(steps))
    figures: dict[str, Figure] = {}
    for step in steps:
        at = f"at_{step.load:.0f}x"
        figures[f"offered_rps_{at}"] = Figure(step.offered_rps, "req/s", f"offered load {at}")
        figures[f"realtime_p99_ms_{at}"] = Figure(
            step.realtime_p99_ms, "ms", f"realtime p99, refusals included, {at}"
        )
        figures[f"realtime_served_p99_ms_{at}"] = Figure(
            step.realtime_served_p99_ms, "ms", f"realtime p99 of those not refused, {at}"
        )
        figures[f"limited_{at}"] = Figure(step.limited, "requests", f"refused (INF-429) {at}")
        figures[f"expired_{at}"] = Figure(step.expired, "requests", f"expired (INF-503) {at}")
        figures[f"lost_{at}"] = Figure(step.lost, "requests", f"no answer {at}")
    series = {
        "latency_vs_load": Series(
            "offered load",
            "req/s",
            "realtime p99 latency",
            "ms",
            [(s.offered_rps, s.realtime_served_p99_ms) for s in steps],
        )
    }
    return BenchRun(1 if any(s.lost for s in steps) else 0, figures, series)
