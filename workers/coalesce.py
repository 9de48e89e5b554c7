"""Identical requests run once: in one batch, and across the batches a
worker has in flight.

A burst of one popular question reaches a worker before its first answer is
in the cache: the classifier routed every copy, and the worker's second
cache look (``BatchRunner.answered_meanwhile``) finds nothing yet. Within a
batch, requests the cache would answer alike (the same exact cache key:
same normalised text, budget class, tenant scope and conversation context;
temperature 0; neither ``bypass`` nor ``no-store``) are run once; the others
get the leader's answer as a cache answer (``cache:batch:<model>``). A
batch that holds a request an earlier batch of the same worker is still
decoding waits for that answer instead (``InFlight``); one that another
worker is decoding waits for it too (``workers.claims``). A leader that
fails hands nothing on: its followers run on their own.
"""

from __future__ import annotations

import asyncio
from collections.abc import Sequence
from dataclasses import dataclass

from schemas.messages import AnswerPath, InferenceResult, Lane, RoutedRequest
from schemas.settings import Settings
from streams.cache.keys import cache_control, cache_key
from streams.stores.sessions import context_digest
from workers.answered import answer_from_cache
from workers.result_store import RecordKey

__all__ = ["Follower", "InFlight", "shared_result", "split_duplicates"]

Item = tuple[RecordKey, RoutedRequest]


@dataclass(frozen=True, slots=True)
class Follower:
    key: RecordKey
    routed: RoutedRequest
    leader: int
    """Index of the request that runs for it, in the leaders list."""


def split_duplicates(
    items: Sequence[Item], settings: Settings
) -> tuple[list[Item], list[str | None], list[Follower]]:
    """The requests to run, each one's answer key (``None``: its answer is
    its own), and the ones an identical earlier one answers."""
    leaders: list[Item] = []
    answer_keys: list[str | None] = []
    followers: list[Follower] = []
    seen: dict[str, int] = {}
    for key, routed in items:
        answer_key = _shareable_key(routed, settings)
        if answer_key is not None and answer_key in seen:
            followers.append(Follower(key, routed, seen[answer_key]))
            continue
        if answer_key is not None:
            seen[answer_key] = len(leaders)
        leaders.append((key, routed))
        answer_keys.append(answer_key)
    return leaders, answer_keys, followers


def _shareable_key(routed: RoutedRequest, settings: Settings) -> str | None:
    request = routed.request
    if routed.shadow or not settings.cache_in_use or request.temperature != 0:
        return None  # a shadow copy's answer is its version's own
    if cache_control(request) != (True, True):
        return None
    return cache_key(request, settings.cache, context_digest(routed.history))


class InFlight:
    """The shareable requests a worker's batches are decoding now, by answer
    key, so that a later batch holding an identical one (its burst split
    over two batches in flight) waits for that answer instead of decoding
    it again. A batch only waits on batches that claimed their keys before
    it looked, so no two wait on each other."""

    def __init__(self) -> None:
        self._running: dict[str, asyncio.Future[InferenceResult | None]] = {}

    def claim(
        self, answer_keys: Sequence[str | None]
    ) -> tuple[dict[int, str | None], dict[int, asyncio.Future[InferenceResult | None]]]:
        """Of a batch's leaders by their answer keys (``split_duplicates``),
        which this batch runs (index: its answer key) and which another
        batch already runs (index: the answer it will give; ``None`` there
        means run it)."""
        ours: dict[int, str | None] = {}
        elsewhere: dict[int, asyncio.Future[InferenceResult | None]] = {}
        for i, key in enumerate(answer_keys):
            running = self._running.get(key) if key is not None else None
            if running is not None:
                elsewhere[i] = running
                continue
            if key is not None:
                self._running[key] = asyncio.get_running_loop().create_future()
            ours[i] = key
        return ours, elsewhere

    def settle(
        self, keys: Sequence[str | None], results: Sequence[InferenceResult | None] | None
    ) -> None:
        """The answers to the claimed ``keys`` (``None``: the batch failed,
        or that one did): an ``ok`` one is handed to those waiting, anything
        else tells them to run their own."""
        for n, key in enumerate(keys):
            future = self._running.pop(key, None) if key is not None else None
            if future is None or future.done():
                continue
            result = results[n] if results is not None else None
            future.set_result(result if result is not None and result.status == "ok" else None)


def shared_result(
    routed: RoutedRequest, answer: InferenceResult, lane: Lane, now_ms: int
) -> InferenceResult:
    """``answer``, computed for an identical request of the same batch (or
    found in the cache for one), as the answer to ``routed``, with its
    usage: the same question as the cache compares it, and the same text."""
    model = f"cache:batch:{answer.model or '-'}"
    if answer.path is AnswerPath.CACHE and answer.model:
        model = answer.model  # already named after the cache entry it came from
    size = answer.timings.batch_size
    return answer_from_cache(
        routed,
        answer.output or "",
        model,
        lane,
        now_ms,
        size,
        usage=answer.usage,
        finish=answer.finish_reason,
    )
