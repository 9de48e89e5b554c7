"""What a lane worker produces for the requests a model did not simply
answer: failures parked on the retry topic or given up (INF-502 and the
DLQ), poison records, and lane records it cannot read. Pure functions of a
batch; the worker produces what they return and commits after.
"""

from __future__ import annotations

import dataclasses
import logging
import time
from collections.abc import Sequence

from aiokafka import ConsumerRecord
from prometheus_client import Counter
from pydantic import ValidationError

from schemas.errors import BackendUnavailable
from schemas.messages import (
    AnswerPath,
    ErrorInfo,
    InferenceResult,
    Lane,
    RoutedRequest,
    describe_errors,
    peek_routed_address,
)
from schemas.settings import Settings
from streams.cache.keys import cache_key, store_refusal
from streams.kafka.envelopes import Outbound, dlq_for, terminal_records
from streams.kafka.tracing import Traces, traced
from streams.ops import RECORDS
from streams.stores.sessions import context_digest
from workers.answered import attempt_event
from workers.result_store import RecordKey
from workers.retry import (
    ATTEMPT_HEADER,
    Exhausted,
    Park,
    is_retryable,
    plan_retry,
    read_mark,
    retry_record,
)

__all__ = [
    "Answer",
    "answer_cache_key",
    "give_up",
    "reject_unreadable",
    "settle_failures",
    "shadow_record",
    "terminal_for",
]

log = logging.getLogger(__name__)

Answer = tuple[RecordKey, RoutedRequest, InferenceResult]

RETRIES = Counter(
    "laneway_retries_total",
    "Requests no backend could serve: parked for another attempt, or given up",
    ["lane", "outcome"],
)


def settle_failures(
    answers: list[Answer],
    records: Sequence[ConsumerRecord],
    settings: Settings,
    lane: Lane,
    *,
    traces: Traces | None = None,
) -> tuple[list[Answer], list[RecordKey], list[Outbound]]:
    """Take the failures no backend could serve out of ``answers``: each
    is parked on the retry topic while attempts and deadline allow.
    The last attempt's failure stays the client's answer and its record
    goes to the DLQ. Returns the answers left, the parked records and
    the records to produce for them, each with its record's ``traceparent``
    from ``traces`` (by topic, partition, offset) when given."""
    by_offset = {(r.topic, r.partition, r.offset): r for r in records}
    now_ms = int(time.time() * 1000)
    left: list[Answer] = []
    parked: list[RecordKey] = []
    outbound: list[Outbound] = []
    for key, routed, result in answers:
        if routed.shadow or not is_retryable(result) or result.error is None:
            left.append((key, routed, result))  # a shadow copy's failure is only recorded
            continue
        record = by_offset[key[:3]]
        attempt = read_mark(record.headers).attempt
        plan = plan_retry(
            attempt,
            now_ms=now_ms,
            deadline_at_ms=routed.deadline_at_ms,
            max_attempts=settings.max_attempts,
            base_ms=settings.retry_backoff_ms,
            max_backoff_ms=settings.retry_max_backoff_ms,
        )
        if isinstance(plan, Park):
            RETRIES.labels(lane, "parked").inc()
            log.info(
                "%s: %s parked for attempt %d in %d ms: %s",
                lane,
                routed.request.id,
                plan.mark.attempt,
                plan.mark.not_before_ms - now_ms,
                result.error.message,
            )
            # The router hears of the failure now, not when the last attempt ends.
            path = result.path or routed.path
            parking = [
                retry_record(record, plan.mark, result, settings, lane),
                attempt_event(
                    routed, result, path, result.error.code, settings, version=result.version
                ),
            ]
            outbound += _traced(parking, key, traces)
            parked.append(key)
            continue
        if isinstance(plan, Exhausted):
            RETRIES.labels(lane, "exhausted").inc()
            note = f"attempt {attempt} of {settings.max_attempts}; moved to the DLQ"
        else:
            RETRIES.labels(lane, "out_of_time").inc()
            note = f"attempt {attempt}; no time before the deadline for another"
        error = BackendUnavailable(f"{result.error.message} ({note})")
        result = result.model_copy(update={"error": ErrorInfo.from_error(error)})
        if isinstance(plan, Exhausted):
            dead = dlq_for(record, error, settings)
            attempts = ((ATTEMPT_HEADER, str(attempt).encode()),)
            dead = dataclasses.replace(dead, headers=dead.headers + attempts)
            outbound += _traced([dead], key, traces)
        left.append((key, routed, result))
    return left, parked, outbound


def _traced(records: list[Outbound], key: RecordKey, traces: Traces | None) -> list[Outbound]:
    return traced(records, traces[key[:3]]) if traces is not None else records


def give_up(
    poisoned: list[tuple[RecordKey, RoutedRequest]],
    records: Sequence[ConsumerRecord],
    settings: Settings,
    lane: Lane,
) -> list[Outbound]:
    """Records that crashed the worker ``max_attempts`` times: to the DLQ,
    and an INF-502 result to their clients."""
    by_key = {(r.topic, r.partition, r.offset): r for r in records}
    outbound: list[Outbound] = []
    now_ms = int(time.time() * 1000)
    for key, routed in poisoned:
        record = by_key[key[:3]]
        error = BackendUnavailable(
            f"processing this request failed {settings.max_attempts} times; it was moved to the DLQ"
        )
        log.error("%s: poison record %s:%s:%s moved to the DLQ", lane, *key[:3])
        RECORDS.labels(f"worker-{lane}", "poisoned").inc()
        outbound.append(dlq_for(record, error, settings))
        result = InferenceResult.failure(
            routed.request.id,
            error,
            lane=lane,
            path=routed.path,
            batch_id=routed.request.batch_id,
        )
        outbound += terminal_for(result, routed, now_ms, settings)
    return outbound


def reject_unreadable(
    record: ConsumerRecord, exc: ValidationError, settings: Settings, lane: Lane
) -> list[Outbound]:
    """A lane record the worker cannot read goes to the DLQ; when the
    request's id and reply topic can still be read (a classifier of a newer
    version wrote it, say), its client hears INF-502 too."""
    RECORDS.labels(f"worker-{lane}", "rejected").inc()
    error = BackendUnavailable(
        f"the {lane} worker cannot read this routed request, so no path can serve it "
        f"(the record is on the DLQ): {describe_errors(exc)}"
    )
    out = [dlq_for(record, error, settings)]
    address = peek_routed_address(record.value or b"", settings.request_limits())
    if address is not None:
        request_id, reply_to = address
        result = InferenceResult.failure(request_id, error, lane=lane)
        now_ms = int(time.time() * 1000)
        out += terminal_records(
            result, reply_to=reply_to, tenant=None, now_ms=now_ms, settings=settings
        )
    return out


def terminal_for(
    result: InferenceResult, routed: RoutedRequest, now_ms: int, settings: Settings
) -> list[Outbound]:
    """The records of ``result``, the answer to ``routed``: for a shadow
    copy only its record on the shadow topic, never a reply."""
    if routed.shadow:
        return [shadow_record(result, settings)]
    return terminal_records(
        result,
        reply_to=routed.reply_to,
        tenant=routed.request.tenant,
        now_ms=now_ms,
        settings=settings,
        cache_key=answer_cache_key(routed, result, settings),
    )


def shadow_record(result: InferenceResult, settings: Settings) -> Outbound:
    """A shadow version's answer on ``<p>.shadow``, keyed by request id
    (``laneway models report`` joins it to the live answer on ``<p>.results``)."""
    return Outbound(settings.topic("shadow"), result.id.encode(), result.model_dump_json().encode())


def answer_cache_key(
    routed: RoutedRequest, result: InferenceResult, settings: Settings
) -> str | None:
    """The cache entry ``result`` came from (a worker's late cache hit) or
    is stored under (``Remember``), so bad feedback on it can evict it."""
    if not settings.cache_in_use:
        return None
    if result.path != AnswerPath.CACHE and store_refusal(routed.request, result) is not None:
        return None
    return cache_key(routed.request, settings.cache, context_digest(routed.history))
