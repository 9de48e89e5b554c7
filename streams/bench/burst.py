"""``laneway bench burst``: a burst of repeated questions, with the
decode marks (``workers.claims``) and without, side by side in one run.

Four questions none of the caches has seen are each asked ``N`` times at
once, the first copy of each with a deadline that asks for realtime (more
would be refused: the realtime lane holds a batch of two), the rest left
to the router, through an embedded stack with two medium workers (so that
copies reach several workers: realtime, both medium ones, bulk). The same
burst then goes through a stack whose workers set no marks
(``LANEWAY_CACHE_CLAIM_TTL_S=0``), each decoding its own copy. Counted:
how many answers a model decoded, how many came from the cache, how many
decodes were stopped part-way because another worker's answer came first
(``laneway_decodes_stopped_total``), and the burst's latency.
"""

from __future__ import annotations

import argparse
from typing import Any

from schemas.messages import Lane
from schemas.settings import Settings
from streams.bench.compare import CompareRow, format_compare, run_once
from streams.bench.drive import CLIENTS
from streams.bench.results import BenchRun, Figure

__all__ = ["HELP", "QUESTIONS", "STARTS_STACK", "add_arguments", "burst_workload", "run"]

HELP = "four questions N times each at once, with and without decode marks, two embedded stacks"
STARTS_STACK = True


def add_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("copies", type=int, metavar="N", help="copies of each question")
    parser.add_argument("--max-tokens", type=int, default=16)
    parser.add_argument(
        "--client",
        choices=CLIENTS,
        default="sdk",
        help="the SDK, or plain aiokafka at default settings",
    )


QUESTIONS = [
    "What is the capital of Norway?",
    "What language is spoken in Peru?",
    "Which continent is Kenya in?",
    "What is the capital of Japan?",
]
LANES = (Lane.REALTIME, Lane.MEDIUM, Lane.MEDIUM, Lane.BULK)
"""Two medium workers in one group: copies keyed to either partition."""


def burst_workload(copies: int, max_tokens: int, realtime_deadline_ms: int) -> list[dict[str, Any]]:
    """``copies`` of each question, interleaved; the first copy of each
    asks for realtime by its deadline."""
    requests: list[dict[str, Any]] = []
    for copy in range(copies):
        for prompt in QUESTIONS:
            request: dict[str, Any] = {
                "prompt": prompt,
                "max_tokens": max_tokens,
                "temperature": 0.0,
            }
            if copy == 0:
                request["deadline_ms"] = realtime_deadline_ms
            requests.append(request)
    return requests


def _decoded(row: CompareRow) -> int:
    """Answers a model decoded, on every lane (a failed request has no path)."""
    return sum(row.decoded_by_lane.values())


def _by_lane(row: CompareRow) -> str:
    """Each lane's model decodes, fastest lane first."""
    return ", ".join(f"{lane} {row.decoded_by_lane.get(lane, 0)}" for lane in Lane)


def run(settings: Settings, args: argparse.Namespace) -> BenchRun:
    """Run the burst with marks and without; print the table and the ratio
    of model decodes."""
    partitions = max(2, settings.kafka.partitions)
    kafka = settings.kafka.model_copy(update={"partitions": partitions})
    settings = settings.model_copy(update={"kafka": kafka})
    requests = burst_workload(
        args.copies, args.max_tokens, settings.routing.realtime_max_deadline_ms
    )
    env = {"LANEWAY_KAFKA_PARTITIONS": str(partitions)}
    at_once = len(requests)
    marked = run_once(settings, "marks", env, args, requests, LANES, at_once)
    no_marks = {**env, "LANEWAY_CACHE_CLAIM_TTL_S": "0"}
    unmarked = run_once(settings, "no-marks", no_marks, args, requests, LANES, at_once)
    print(
        f"\nlaneway bench burst --copies {args.copies}: {len(QUESTIONS)} questions "
        f"x {args.copies} copies "
        f"at once (the first of each asks for realtime), max_tokens {args.max_tokens}, "
        f"workers {', '.join(LANES)}, {partitions} partitions"
    )
    print(format_compare([marked, unmarked]))
    with_marks, without = _decoded(marked), _decoded(unmarked)
    print(
        f"\nmodel decodes: {with_marks} with marks, {without} without "
        f"({without / max(with_marks, 1):.2f}x); p50 {marked.p50_ms:.0f} ms against "
        f"{unmarked.p50_ms:.0f} ms, p99 {marked.p99_ms:.0f} ms against {unmarked.p99_ms:.0f} ms"
    )
    for row in (marked, unmarked):
        print(
            f"decoded by lane, {row.engine}: {_by_lane(row)}; "
            f"stopped part-way, answered from the cache: {row.stopped}"
        )
    figures = {
        "decodes_with_marks": Figure(with_marks, "decodes", "model decodes with decode marks"),
        "decodes_without_marks": Figure(without, "decodes", "model decodes without marks"),
        "decode_ratio": Figure(
            without / max(with_marks, 1), "x", "decodes without marks / with marks"
        ),
        "marks_p50_ms": Figure(marked.p50_ms, "ms", "p50 with marks"),
        "marks_p99_ms": Figure(marked.p99_ms, "ms", "p99 with marks"),
        "no_marks_p50_ms": Figure(unmarked.p50_ms, "ms", "p50 without marks"),
        "no_marks_p99_ms": Figure(unmarked.p99_ms, "ms", "p99 without marks"),
    }
    return BenchRun(1 if marked.lost or unmarked.lost else 0, figures)
