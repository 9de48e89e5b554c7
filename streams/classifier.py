"""The classifier's decision for one request record, as a pure function.

The faust agent (``streams.app``) decodes nothing itself: it hands each raw
record to ``classify_record`` and produces the records it returns. Outcomes:

- invalid record       -> DLQ, plus an INF-400 result when id and reply topic can be read
- deadline passed      -> INF-503 result
- a rule owns it       -> the rule's answer, path ``rules``
- otherwise            -> a ``RoutedRequest`` on the chosen lane topic, as the
                          flow controller's load level allows (or INF-429 shed)

An accepted request whose tenant is over its rate limit is turned into an
INF-429 result by ``refuse_over_limit`` (the agent asks the limiter).
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Literal

from schemas.errors import DeadlineExceeded, InvalidRequest, LanewayError, RateLimited
from schemas.messages import (
    InferenceRequest,
    InferenceResult,
    Path,
    RoutedRequest,
    Timings,
    parse_request,
    peek_reply_address,
)
from schemas.settings import Settings
from streams.envelopes import Outbound, dlq_for, terminal_records
from streams.flow import Shed, apply_level
from streams.policy import decide
from streams.rules import RuleBook

__all__ = ["Classified", "SourceRecord", "classify_record", "refuse_over_limit"]


@dataclass(frozen=True, slots=True)
class SourceRecord:
    """One record as read from the request topic."""

    value: bytes | None
    key: bytes | None
    timestamp_ms: int
    topic: str
    partition: int
    offset: int


@dataclass(frozen=True, slots=True)
class Classified:
    outcome: Literal["routed", "answered", "rejected", "expired", "limited", "shed"]
    records: list[Outbound]
    result: InferenceResult | None = None
    """The terminal result the classifier gave, if it gave one."""
    request: InferenceRequest | None = None
    """The accepted request (routed or answered), for the rate limiter."""
    reply_to: str | None = None


def classify_record(
    record: SourceRecord, *, now_ms: int, settings: Settings, rules: RuleBook, level: int = 0
) -> Classified:
    """``level``: the flow controller's load level (``streams.flow``)."""
    raw = record.value or b""
    limits = settings.request_limits()
    try:
        if len(raw) > settings.limits.max_record_bytes:
            raise InvalidRequest(
                f"record is {len(raw)} bytes, limit {settings.limits.max_record_bytes}"
            )
        request = parse_request(raw, limits)
    except InvalidRequest as error:
        return _reject(record, raw, error, now_ms=now_ms, settings=settings)

    reply_to = request.reply_to or settings.replies_topic
    age_ms = max(0, now_ms - record.timestamp_ms)
    if request.deadline_ms is not None and age_ms >= request.deadline_ms:
        expired = DeadlineExceeded(
            f"deadline of {request.deadline_ms} ms passed {age_ms - request.deadline_ms} ms "
            "before classification"
        )
        result = InferenceResult.failure(
            request.id, expired, timings=_timings(age_ms), batch_id=request.batch_id
        )
        return Classified("expired", _terminal(result, request, reply_to, now_ms, settings), result)

    decision = decide(request, settings.routing, rules)
    if decision.rule is not None:
        result = InferenceResult(
            id=request.id,
            status="ok",
            output=decision.rule.text,
            lane=decision.lane,
            path=Path.RULES,
            model=f"rules:{decision.rule.rule}",
            timings=_timings(age_ms),
            batch_id=request.batch_id,
        )
        records = _terminal(result, request, reply_to, now_ms, settings)
        return Classified("answered", records, result, request, reply_to)

    adjusted = apply_level(decision, request, level, settings.flow.shed_retry_after_ms)
    if isinstance(adjusted, Shed):
        shed = RateLimited(adjusted.reason, retry_after_ms=adjusted.retry_after_ms)
        result = InferenceResult.failure(
            request.id,
            shed,
            lane=decision.lane,
            timings=_timings(age_ms),
            batch_id=request.batch_id,
        )
        records = _terminal(result, request, reply_to, now_ms, settings)
        return Classified("shed", records, result, request, reply_to)
    decision = adjusted
    routed = RoutedRequest(
        request=request,
        lane=decision.lane,
        path=decision.path,
        requested_path=decision.requested_path,
        reply_to=reply_to,
        produced_at_ms=record.timestamp_ms,
        routed_at_ms=now_ms,
        deadline_at_ms=(
            record.timestamp_ms + request.deadline_ms if request.deadline_ms is not None else None
        ),
    )
    out = Outbound(
        settings.lane_topic(decision.lane), request.id.encode(), routed.model_dump_json().encode()
    )
    return Classified("routed", [out], None, request, reply_to)


def refuse_over_limit(
    classified: Classified, retry_after_ms: int, *, age_ms: int, now_ms: int, settings: Settings
) -> Classified:
    """An accepted request whose tenant is over its rate limit: instead of
    its route or answer, an INF-429 result that says when to retry."""
    request, reply_to = classified.request, classified.reply_to
    if request is None or reply_to is None:
        return classified
    error = RateLimited(
        f"tenant {request.tenant or '-'!r} is over its rate limit; retry in {retry_after_ms} ms",
        retry_after_ms=retry_after_ms,
    )
    result = InferenceResult.failure(
        request.id, error, timings=_timings(age_ms), batch_id=request.batch_id
    )
    records = _terminal(result, request, reply_to, now_ms, settings)
    return Classified("limited", records, result, request, reply_to)


def _timings(age_ms: float) -> Timings:
    return Timings(queue_ms=age_ms, total_ms=age_ms)


def _terminal(
    result: InferenceResult,
    request: InferenceRequest,
    reply_to: str,
    now_ms: int,
    settings: Settings,
) -> list[Outbound]:
    return terminal_records(
        result, reply_to=reply_to, tenant=request.tenant, now_ms=now_ms, settings=settings
    )


def _reject(
    record: SourceRecord, raw: bytes, error: LanewayError, *, now_ms: int, settings: Settings
) -> Classified:
    records = [dlq_for(record, error, settings)]
    address = peek_reply_address(raw, settings.request_limits())
    result = None
    if address is not None:
        request_id, reply_to = address
        result = InferenceResult.failure(
            request_id, error, timings=_timings(max(0, now_ms - record.timestamp_ms))
        )
        records += terminal_records(
            result, reply_to=reply_to, tenant=None, now_ms=now_ms, settings=settings
        )
    return Classified("rejected", records, result)
