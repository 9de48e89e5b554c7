"""Identical requests in one batch run once.

A burst of one popular question reaches a worker before its first answer is
in the cache: the classifier routed every copy, and the worker's second
cache look (``LaneWorker._answered_meanwhile``) finds nothing yet. Within a
batch, requests the cache would answer alike (the same exact cache key:
same normalised text, budget class, tenant scope and conversation context;
temperature 0; neither ``bypass`` nor ``no-store``) are run once; the others
get the leader's answer as a cache answer (``cache:batch:<model>``). A
leader that fails hands nothing on: its followers run on their own.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

from schemas.messages import InferenceResult, Lane, RoutedRequest
from schemas.settings import Settings
from streams.cache.keys import cache_control, cache_key
from streams.stores.sessions import context_digest
from workers.answered import answer_from_cache
from workers.result_store import RecordKey

__all__ = ["Follower", "shared_result", "split_duplicates"]

Item = tuple[RecordKey, RoutedRequest]


@dataclass(frozen=True, slots=True)
class Follower:
    key: RecordKey
    routed: RoutedRequest
    leader: int
    """Index of the request that runs for it, in the leaders list."""


def split_duplicates(
    items: Sequence[Item], settings: Settings
) -> tuple[list[Item], list[Follower]]:
    """The requests to run, and the ones an identical earlier one answers."""
    leaders: list[Item] = []
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
    return leaders, followers


def _shareable_key(routed: RoutedRequest, settings: Settings) -> str | None:
    request = routed.request
    if routed.shadow or not settings.cache_in_use or request.temperature != 0:
        return None  # a shadow copy's answer is its version's own
    if cache_control(request) != (True, True):
        return None
    return cache_key(request, settings.cache, context_digest(routed.history))


def shared_result(
    routed: RoutedRequest, answer: InferenceResult, lane: Lane, now_ms: int
) -> InferenceResult:
    """``answer``, computed for an identical request of the same batch, as
    the answer to ``routed``."""
    model = f"cache:batch:{answer.model or '-'}"
    size = answer.timings.batch_size
    return answer_from_cache(routed, answer.output or "", model, lane, now_ms, size)
