"""``laneway prewarm``: the nightly cache pre-warm.

Ranks the questions the classifier counted over the last ``days``
(``streams.cache.hot_questions``), keeps those asked at least ``min_count`` times,
and asks each of the ``top`` again whose cache entry is missing or has less
than ``refresh_below_s`` to live. The questions go through the running
stack like any client's, on the bulk lane, with ``metadata.cache="bypass"``
(so the entry about to expire does not answer them) under the batch id
``prewarm-<day>``; the worker that answers stores the fresh answer in the
cache. Run it when traffic is low (the Kubernetes CronJob in compose/k8s
runs it at 03:30): bulk yields to realtime and medium under flow control,
and a shed pre-warm request is reported, not retried.

The report says how many hot questions were fresh already, warmed, answered
by a rule (rules are never cached: they answer at once anyway) or failed,
and the cache coverage of the hot questions' traffic before and after: the
share of their asks whose entry is fresh. Questions about a time that moves
on ("what is on today") are not warmed, only counted: the cache keeps their
answers an hour, and an answer made at night about "today" may no longer
hold when it is asked.
"""

from __future__ import annotations

import asyncio
import time
import uuid
from collections import Counter
from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import Any

from pydantic import ValidationError

from schemas.messages import InferenceResult, Lane
from schemas.settings import Settings
from streams.cache.hot_questions import HotQuestion, day_of, rank, read_days
from streams.cache.keys import normalise_prompt, time_relative
from streams.client import LanewayClient
from streams.stores.keyspace import CACHE, tagged

__all__ = ["PrewarmReport", "format_report", "prewarm"]

STORE_WAIT_S = 10.0
"""How long after its answer a warmed entry may take to appear (the worker
stores it once the answer is acknowledged)."""


@dataclass(slots=True)
class PrewarmReport:
    day: str
    hot: int = 0
    fresh: int = 0
    warmed: int = 0
    by_rules: int = 0
    not_stored: int = 0
    """Answered by a model, but the cache kept no entry (a degraded answer, say)."""
    time_relative: int = 0
    """Hot questions about a time that moves on ("today", "now": the cache's
    ``time_relative``), left to the day's traffic: warmed at night, their
    answer would live an hour (``relative_time_ttl_s``) and might no
    longer hold by morning."""
    failed: Counter[str] = field(default_factory=Counter)
    """Error code -> count."""
    coverage_before: float = 0.0
    coverage_after: float = 0.0
    seconds: float = 0.0

    def as_dict(self) -> dict[str, Any]:
        return {
            "day": self.day,
            "hot": self.hot,
            "fresh": self.fresh,
            "warmed": self.warmed,
            "by_rules": self.by_rules,
            "not_stored": self.not_stored,
            "time_relative": self.time_relative,
            "failed": dict(self.failed),
            "coverage_before": round(self.coverage_before, 4),
            "coverage_after": round(self.coverage_after, 4),
            "seconds": round(self.seconds, 1),
        }


def coverage(hot: Sequence[HotQuestion], fresh_keys: set[str]) -> float:
    """The share of the hot questions' asks whose entry is fresh."""
    asked = sum(h.count for h in hot)
    return sum(h.count for h in hot if h.key in fresh_keys) / asked if asked else 1.0


async def _fresh_keys(redis: Any, settings: Settings, hot: Sequence[HotQuestion]) -> set[str]:
    """The keys among ``hot`` whose entry lives longer than ``refresh_below_s``
    (an entry without expiry counts as fresh)."""
    if not hot:
        return set()
    pipe = redis.pipeline(transaction=False)
    for h in hot:
        pipe.ttl(tagged(settings.redis.key_prefix, CACHE, "e", h.key))
    ttls = await pipe.execute()
    floor = settings.prewarm.refresh_below_s
    return {h.key for h, ttl in zip(hot, ttls, strict=True) if ttl == -1 or ttl > floor}


async def prewarm(
    settings: Settings, *, client: LanewayClient | None = None, now_s: float | None = None
) -> PrewarmReport:
    """One pre-warm run against the stack ``settings`` names."""
    started = time.monotonic()
    now_s = time.time() if now_s is None else now_s
    options = settings.prewarm
    if options.refresh_below_s >= settings.cache.ttl_s:
        raise ValueError(
            f"LANEWAY_PREWARM_REFRESH_BELOW_S ({options.refresh_below_s}) must be below "
            f"LANEWAY_CACHE_TTL_S ({settings.cache.ttl_s}): no entry could ever be fresh"
        )
    report = PrewarmReport(day=day_of(now_s))
    redis = settings.redis.client()
    try:
        days = await read_days(redis, settings.redis.key_prefix, options.days, now_s)
        ranked = rank(days, min_count=options.min_count, top=options.top)
        hot = [h for h in ranked if not _moves_on(h)]
        report.hot, report.time_relative = len(hot), len(ranked) - len(hot)
        fresh = await _fresh_keys(redis, settings, hot)
        report.fresh = len(fresh)
        report.coverage_before = coverage(hot, fresh)
        due = [h for h in hot if h.key not in fresh]
        if due:
            results = await _ask_all(settings, due, report.day, client)
            answered = _tally(report, due, results)
            report.warmed = await _stored(redis, settings, answered)
            report.not_stored = len(answered) - report.warmed
        report.coverage_after = coverage(hot, await _fresh_keys(redis, settings, hot))
    finally:
        await redis.aclose()
    report.seconds = time.monotonic() - started
    return report


def _moves_on(hot: HotQuestion) -> bool:
    """Whether ``hot`` asks about a time that moves on (``time_relative``);
    a question its counter kept unreadable is not."""
    try:
        request = hot.request("prewarm-check")
    except ValidationError:
        return False
    return time_relative(normalise_prompt(request))


def _reply_topic(settings: Settings, hot: HotQuestion, default: str) -> str:
    """Where the answer to ``hot`` comes back: its tenant's own topic where
    tenants may only use theirs, else ``default``."""
    if settings.limits.tenant_reply_topics and hot.tenant:
        return f"{settings.replies_topic}.{hot.tenant}"
    return default


async def _ask_all(
    settings: Settings,
    due: Sequence[HotQuestion],
    day: str,
    client: LanewayClient | None,
) -> list[InferenceResult | BaseException]:
    options = settings.prewarm
    gate = asyncio.Semaphore(options.concurrency)
    default = client.reply_to if client else f"{settings.replies_topic}.prewarm"
    topics = [_reply_topic(settings, hot, default) for hot in due]
    clients = {client.reply_to: client} if client else {}
    started: list[LanewayClient] = []

    async def ask(hot: HotQuestion, topic: str) -> InferenceResult:
        request = hot.request(
            f"prewarm-{day}-{hot.key[:12]}-{uuid.uuid4().hex[:6]}",
            lane=Lane.BULK,
            batch_id=f"prewarm-{day}",
            metadata={"cache": "bypass"},
            reply_to=topic,
        )
        async with gate:
            future = await clients[topic].submit(request)
            return await asyncio.wait_for(future, options.timeout_s)

    try:
        for topic in sorted(set(topics) - set(clients)):
            started.append(LanewayClient(settings.kafka, client_id="prewarm", reply_to=topic))
            await started[-1].start()
            clients[topic] = started[-1]
        return await asyncio.gather(
            *(ask(hot, topic) for hot, topic in zip(due, topics, strict=True)),
            return_exceptions=True,
        )
    finally:
        for c in started:
            await c.close()


def _tally(
    report: PrewarmReport,
    due: Sequence[HotQuestion],
    results: Sequence[InferenceResult | BaseException],
) -> list[HotQuestion]:
    """Count what came back; returns the questions a model answered."""
    answered = []
    for hot, result in zip(due, results, strict=True):
        if isinstance(result, BaseException):
            report.failed["timeout" if isinstance(result, TimeoutError) else "client"] += 1
        elif result.error is not None:
            report.failed[result.error.code] += 1
        elif result.path is not None and result.path.is_model:
            answered.append(hot)
        else:
            report.by_rules += 1
    return answered


async def _stored(redis: Any, settings: Settings, answered: Sequence[HotQuestion]) -> int:
    """How many of ``answered`` have a fresh entry, waiting a moment for the
    workers to store the last ones."""
    give_up = time.monotonic() + STORE_WAIT_S
    while True:
        stored = await _fresh_keys(redis, settings, answered)
        if len(stored) == len(answered) or time.monotonic() > give_up:
            return len(stored)
        await asyncio.sleep(0.2)


def format_report(report: PrewarmReport) -> str:
    failed = ", ".join(f"{code} {n}" for code, n in sorted(report.failed.items())) or "none"
    return (
        f"prewarm {report.day}: {report.hot} hot questions; {report.fresh} fresh already, "
        f"{report.warmed} warmed, {report.by_rules} answered by rules, "
        f"{report.not_stored} answered but not stored, failed: {failed}; "
        f"{report.time_relative} about a time that moves on, left to traffic\n"
        f"cache coverage of hot traffic: {report.coverage_before:.0%} -> "
        f"{report.coverage_after:.0%} ({report.seconds:.1f} s)"
    )
