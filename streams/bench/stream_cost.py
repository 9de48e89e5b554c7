"""``laneway bench stream-cost``: what streaming costs in throughput.

The same model-only workload (simple and hard prompts past the response
cache, so every answer is decoded) is sent in legs that alternate: not
streamed, streamed, then streamed, not streamed (ABBA: a stack whose pace
drifts over the run moves both kinds alike) ... on one stack, through one
kind of client. Each leg's throughput is the tokens its answers hold over
its wall time; the figure is the streamed legs' tokens/s over the others',
from the same run. The streamed legs also give the time to first token
against the total latency: its share of the total depends on how long the
answers run, so ``--prompts explain`` asks questions whose answers run to
``max_tokens`` (the issue's "realtime light answers at max_tokens 64"), and
every leg says how many tokens its answers averaged.
"""

from __future__ import annotations

import argparse
import asyncio
import statistics
from collections import Counter
from dataclasses import dataclass
from typing import Any

from schemas.messages import Lane
from schemas.settings import Settings
from streams.bench.drive import (
    HARD_PROMPTS,
    NO_CACHE,
    SIMPLE_PROMPTS,
    Sample,
    _percentile,
    add_client_arguments,
    drive,
    stack_for,
)
from streams.bench.results import BenchRun, Figure

__all__ = [
    "DRIVES_STACK",
    "HELP",
    "Leg",
    "add_arguments",
    "format_legs",
    "leg_order",
    "model_workload",
    "rounds_of",
    "run",
]

HELP = "model answers' tokens/s streamed against not streamed, alternated on one stack"
DRIVES_STACK = True


def add_arguments(parser: argparse.ArgumentParser) -> None:
    add_client_arguments(parser)
    parser.add_argument("--rounds", type=int, default=2, help="legs of each kind, alternated")
    parser.add_argument(
        "--lane",
        choices=[lane.value for lane in Lane],
        default="medium",
        help="the lane its requests ask for",
    )
    parser.add_argument(
        "--path", choices=["light", "heavy"], default="heavy", help="which model answers"
    )
    parser.add_argument(
        "--prompts",
        choices=sorted(PROMPT_SETS),
        default="mixed",
        help="mixed: two short questions to one that asks for an explanation; "
        "explain: only questions whose answers run to max_tokens",
    )


EXPLAIN_PROMPTS = [
    *HARD_PROMPTS,
    "Explain how a rainbow forms.",
    "Describe how bread rises when it is baked.",
    "Explain how vaccines train the immune system.",
    "Describe what causes the tides.",
]

PROMPT_SETS = {
    "mixed": [*SIMPLE_PROMPTS, *HARD_PROMPTS[:2]],
    "explain": EXPLAIN_PROMPTS,
}
"""The questions a leg asks, by ``--prompts``."""


@dataclass(frozen=True, slots=True)
class Leg:
    streamed: bool
    answered: int
    errors: int
    lost: int
    tokens: int
    seconds: float
    p50_ms: float
    ttft_p50_ms: float | None
    chunks: int = 0
    """``result_chunk`` records its answers came in (0: not streamed)."""
    codes: tuple[tuple[str, int], ...] = ()
    """The failed requests' error codes, with how many had each."""

    @property
    def tokens_per_s(self) -> float:
        return self.tokens / max(self.seconds, 1e-9)

    @property
    def tokens_per_answer(self) -> float:
        return self.tokens / max(self.answered, 1)

    @property
    def ttft_share(self) -> float | None:
        """The time to first token's p50 over the total's p50."""
        if self.ttft_p50_ms is None or self.p50_ms <= 0:
            return None
        return self.ttft_p50_ms / self.p50_ms


def model_workload(
    n: int, max_tokens: int, model: str = "heavy", lane: str = "medium", prompts: str = "mixed"
) -> list[dict[str, Any]]:
    """``n`` requests for ``model`` (a path the registry names) on ``lane``,
    from the ``prompts`` set (``PROMPT_SETS``), each asked once (numbered):
    no copy shares another's decode, and the router's changing view of the
    paths moves nothing between legs."""
    questions = PROMPT_SETS[prompts]
    return [
        {
            "prompt": f"{questions[i % len(questions)]} (question {i + 1})",
            "max_tokens": max_tokens,
            "metadata": NO_CACHE,
            "model": model,
            "lane": lane,
        }
        for i in range(n)
    ]


def leg_of(samples: list[Sample], started: float, lost: int, streamed: bool) -> Leg:
    ok = [s for s in samples if s.status == "ok"]
    firsts = sorted(s.ttft_ms for s in ok if s.ttft_ms is not None)
    return Leg(
        streamed=streamed,
        answered=len(ok),
        errors=len(samples) - len(ok),
        lost=lost,
        tokens=sum(s.completion_tokens for s in ok),
        seconds=max((s.finished_at for s in samples), default=started) - started,
        p50_ms=_percentile(sorted(s.latency_ms for s in ok), 0.5),
        ttft_p50_ms=_percentile(firsts, 0.5) if firsts else None,
        chunks=sum(s.chunks for s in ok),
        codes=tuple(sorted(Counter(s.code or "?" for s in samples if s.status != "ok").items())),
    )


def leg_order(round_: int) -> tuple[bool, bool]:
    """Whether each leg of a round is streamed: not first in even rounds,
    first in odd ones (ABBA), so a stack that slows or speeds up over the
    run (a load level entered, caches warming) moves both kinds alike."""
    return (False, True) if round_ % 2 == 0 else (True, False)


def rounds_of(legs: list[Leg]) -> list[tuple[Leg, Leg]]:
    """Each round's (not streamed, streamed) legs, whichever ran first."""
    pairs = zip(legs[::2], legs[1::2], strict=False)
    return [(a, b) if b.streamed else (b, a) for a, b in pairs]


def format_legs(legs: list[Leg]) -> str:
    head = (
        f"{'leg':>3} {'streamed':>8} {'ok':>4} {'err':>4} {'lost':>4} {'tokens':>7} "
        f"{'s':>7} {'tok/s':>7} {'tok/ans':>7} {'p50 ms':>8} {'ttft p50':>9} {'tok/chunk':>9}"
    )
    lines = [head, "-" * len(head)]
    for i, leg in enumerate(legs, 1):
        ttft = f"{leg.ttft_p50_ms:9.1f}" if leg.ttft_p50_ms is not None else f"{'-':>9}"
        per_chunk = f"{leg.tokens / leg.chunks:9.1f}" if leg.chunks else f"{'-':>9}"
        lines.append(
            f"{i:3d} {'yes' if leg.streamed else 'no':>8} {leg.answered:4d} {leg.errors:4d} "
            f"{leg.lost:4d} {leg.tokens:7d} {leg.seconds:7.1f} {leg.tokens_per_s:7.1f} "
            f"{leg.tokens_per_answer:7.1f} {leg.p50_ms:8.1f} {ttft} {per_chunk}"
        )
    for i, leg in enumerate(legs, 1):
        if leg.codes:
            said = ", ".join(f"{code} x{count}" for code, count in leg.codes)
            lines.append(f"leg {i} errors: {said}")
    return "\n".join(lines)


async def _legs(settings: Settings, args: argparse.Namespace) -> list[Leg]:
    legs = []
    workload = model_workload(args.requests, args.max_tokens, args.path, args.lane, args.prompts)
    for round_ in range(args.rounds):
        for streamed in leg_order(round_):
            samples, started, lost = await drive(
                settings,
                workload,
                args.concurrency,
                timeout_s=300,
                client_kind=args.client,
                stream=streamed,
            )
            legs.append(leg_of(samples, started, lost, streamed))
    return legs


def run(settings: Settings, args: argparse.Namespace) -> BenchRun:
    with stack_for(settings, args.embedded, args.realtime_workers, args.log_file) as running:
        legs = asyncio.run(_legs(running, args))
    print(
        f"\nlaneway bench stream-cost: {args.requests} requests for {args.path} on "
        f"{args.lane} a leg, "
        f"max_tokens {args.max_tokens}, prompts {args.prompts}, concurrency {args.concurrency}, "
        f"client {args.client}, {args.rounds} legs of each, alternated"
    )
    print(format_legs(legs))
    plain = statistics.fmean(leg.tokens_per_s for leg in legs if not leg.streamed)
    streamed = statistics.fmean(leg.tokens_per_s for leg in legs if leg.streamed)
    print(
        f"streamed: {streamed:.1f} tokens/s against {plain:.1f} not streamed: "
        f"{streamed / max(plain, 1e-9):.1%}"
    )
    ttfts = [leg.ttft_p50_ms for leg in legs if leg.ttft_p50_ms is not None]
    shares = [leg.ttft_share for leg in legs if leg.ttft_share is not None]
    totals = [leg.p50_ms for leg in legs if leg.streamed and leg.answered]
    ratios = [
        streamed_leg.tokens_per_s / max(plain_leg.tokens_per_s, 1e-9)
        for plain_leg, streamed_leg in rounds_of(legs)
    ]
    if shares:
        print(
            f"time to first token: {statistics.fmean(shares):.0%} of the total at p50 "
            f"(answers of {statistics.fmean(leg.tokens_per_answer for leg in legs):.1f} "
            "tokens on average)"
        )
    if len(ratios) > 1:
        print(f"streamed/not per round: {', '.join(f'{r:.1%}' for r in ratios)}")
    figures = {
        "streamed_tokens_per_s": Figure(streamed, "tokens/s", "streamed legs' tokens/s"),
        "plain_tokens_per_s": Figure(plain, "tokens/s", "not streamed legs' tokens/s"),
        "streamed_share": Figure(
            streamed / max(plain, 1e-9), "ratio", "streamed tokens/s over not streamed"
        ),
        "ttft_p50_ms": Figure(
            statistics.fmean(ttfts) if ttfts else None, "ms", "time to first token p50"
        ),
        "total_p50_ms": Figure(
            statistics.fmean(totals) if totals else None, "ms", "streamed answer p50"
        ),
        "ttft_share": Figure(
            statistics.fmean(shares) if shares else None,
            "ratio",
            "time to first token p50 over the streamed answer's p50",
        ),
        "streamed_share_lowest_round": Figure(
            min(ratios) if ratios else None, "ratio", "the lowest round's streamed/not"
        ),
        "streamed_share_highest_round": Figure(
            max(ratios) if ratios else None, "ratio", "the highest round's streamed/not"
        ),
        "tokens_per_answer": Figure(
            statistics.fmean(leg.tokens_per_answer for leg in legs),
            "tokens",
            "completion tokens per answer",
        ),
        "lost": Figure(sum(leg.lost for leg in legs), "requests", "requests with no answer"),
    }
    return BenchRun(1 if any(leg.lost for leg in legs) else 0, figures)
