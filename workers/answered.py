"""What a lane worker remembers of each answer once it is acknowledged:
the session's new turn (the response cache entry is stored as soon as the
answer is decoded: ``BatchRunner._keep``). Both stores are idempotent
(cache keys are the normalised request, session turns carry the request
id), so a redelivered batch writes nothing twice; both fail open, so a
missing Redis costs answers nothing."""

from __future__ import annotations

import time
from collections.abc import Sequence

from schemas.errors import DeadlineExceeded, ErrorCode
from schemas.messages import (
    AnswerPath,
    FinishReason,
    InferenceResult,
    Lane,
    QualityEvent,
    RoutedRequest,
    Timings,
    Usage,
)
from schemas.settings import Settings
from streams.cache.response import CacheHit
from streams.kafka.envelopes import Outbound
from streams.stores.sessions import SessionStore
from workers.execution import Finished

__all__ = [
    "CANCELLED",
    "Remember",
    "answer_from_cache",
    "attempt_event",
    "attempt_events",
    "cached_result",
    "cancelled_result",
]

CANCELLED = "cancelled by the client"


class Remember:
    """The ``on_answered`` hook of a lane worker: the session turns."""

    def __init__(self, sessions: SessionStore | None) -> None:
        self.sessions = sessions

    async def __call__(self, answers: Sequence[tuple[RoutedRequest, InferenceResult]]) -> None:
        for routed, result in answers:
            if result.status != "ok" or not result.output:
                continue
            request = routed.request
            if self.sessions is not None and request.session_id:
                await self.sessions.append(
                    request.session_id, request.id, request.user_text(), result.output
                )


def attempt_events(finished: Finished, settings: Settings) -> list[Outbound]:
    """A quality event per path that failed this request before another
    served it (or before it failed for good): the router must learn of a
    failing path even when the fallback hides it from the client."""
    return [
        attempt_event(
            finished.routed,
            finished.result,
            AnswerPath(path),
            error.code,
            settings,
            version=version,
        )
        for path, version, error in finished.failed
    ]


def attempt_event(
    routed: RoutedRequest,
    result: InferenceResult,
    path: AnswerPath,
    error_code: ErrorCode,
    settings: Settings,
    *,
    version: str | None = None,
) -> Outbound:
    """One failed attempt on ``path`` (and ``version``), for the quality loop."""
    event = QualityEvent(
        kind="attempt",
        id=result.id,
        tenant=routed.request.tenant,
        lane=result.lane,
        path=path,
        success=False,
        error_code=error_code,
        latency_ms=result.timings.total_ms,
        ts_ms=int(time.time() * 1000),
        version=version,
    )
    # Keyed by request id, as every quality event: spread over the partitions.
    return Outbound(settings.topic("quality"), result.id.encode(), event.model_dump_json().encode())


def cancelled_result(routed: RoutedRequest, lane: Lane, now_ms: int) -> InferenceResult:
    """The terminal result of a request its client cancelled
    (``workers.cancels``): INF-503, ``finish_reason: cancelled``."""
    waited = max(0.0, now_ms - routed.produced_at_ms)
    return InferenceResult.failure(
        routed.request.id,
        DeadlineExceeded(CANCELLED),
        lane=lane,
        path=routed.path,
        timings=Timings(queue_ms=waited, total_ms=waited),
        batch_id=routed.request.batch_id,
        explored=routed.explored,
    ).model_copy(
        update={
            "finish_reason": "cancelled",
            "version": routed.version,
            "router_version": routed.router_version,
        }
    )


def cached_result(routed: RoutedRequest, hit: CacheHit, lane: Lane, now_ms: int) -> InferenceResult:
    """The answer a worker found in the cache instead of running a model,
    with the completion tokens its model counted (the worker counts no
    prompt tokens)."""
    usage = Usage(completion_tokens=hit.completion_tokens or 0)
    return answer_from_cache(
        routed, hit.output, hit.label, lane, now_ms, usage=usage, finish=hit.finish_reason
    )


def answer_from_cache(
    routed: RoutedRequest,
    output: str,
    model: str,
    lane: Lane,
    now_ms: int,
    batch_size: int = 1,
    usage: Usage | None = None,
    finish: FinishReason | None = "stop",
) -> InferenceResult:
    """An answer given to ``routed`` without running a model for it:
    path ``cache``, ``model`` naming where the text came from, ``usage``
    the tokens counted where it came from (``None``: 0), ``finish`` why
    that answer ended."""
    waited = max(0.0, now_ms - routed.produced_at_ms)
    return InferenceResult(
        id=routed.request.id,
        status="ok",
        output=output,
        lane=lane,
        path=AnswerPath.CACHE,
        model=model,
        finish_reason=finish,
        usage=usage or Usage(),
        timings=Timings(queue_ms=waited, total_ms=waited, batch_size=batch_size),
        batch_id=routed.request.batch_id,
        router_version=routed.router_version,
    )
