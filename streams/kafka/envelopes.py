"""Records laneway writes, built as plain values so the decisions that make
them are testable without a broker. ``Outbound`` is one record to produce."""

from __future__ import annotations

import asyncio
import itertools
import logging
import time
from collections.abc import Awaitable, Callable, Sequence
from dataclasses import dataclass, field
from typing import Protocol

from aiokafka.errors import (
    ClusterAuthorizationFailedError,
    InvalidTopicError,
    MessageSizeTooLargeError,
    RecordListTooLargeError,
    RecordTooLargeError,
    TopicAuthorizationFailedError,
    UnsupportedForMessageFormatError,
)
from pydantic import ValidationError

from schemas.errors import BackendUnavailable, InvalidRequest, LanewayError
from schemas.messages import InferenceResult, QualityEvent, ResultChunk, RoutedRequest
from schemas.settings import Settings

__all__ = [
    "DLQ_HEADERS",
    "PERMANENT",
    "ConsumedRecord",
    "Outbound",
    "Send",
    "chunk_record",
    "closing_chunk",
    "deliver",
    "dlq_for",
    "dlq_record",
    "refused_for_good",
    "terminal_records",
]

log = logging.getLogger(__name__)

DLQ_HEADERS = (
    "laneway-error-code",
    "laneway-error",
    "laneway-source-topic",
    "laneway-source-partition",
    "laneway-source-offset",
)


TOO_LARGE = (MessageSizeTooLargeError, RecordListTooLargeError, RecordTooLargeError)
PERMANENT = (
    *TOO_LARGE,
    TopicAuthorizationFailedError,
    ClusterAuthorizationFailedError,
    InvalidTopicError,
    UnsupportedForMessageFormatError,
)
"""Produce errors that no retry can cure: the record or the topic is wrong."""


@dataclass(frozen=True, slots=True)
class Outbound:
    topic: str
    key: bytes | None
    value: bytes
    headers: tuple[tuple[str, bytes], ...] = field(default=())
    partition: int | None = None
    """The partition to write to; ``None``: the key's, as the producer's
    default partitioner picks it (the classifier steers realtime requests
    to a worker with room: ``streams.classify.gate.RealtimeGate``)."""


def terminal_records(
    result: InferenceResult,
    *,
    reply_to: str,
    tenant: str | None,
    now_ms: int,
    settings: Settings,
    cache_key: str | None = None,
) -> list[Outbound]:
    """A terminal result: to the client's reply topic, to ``results``, and
    its quality event to ``quality`` (keyed by the result id, so the events
    spread over every partition and the quality loop can scale out; see
    ``streams.quality.loop``). ``cache_key``: the cache entry the answer
    came from or is stored under. A request its client cancelled has no
    quality event: it says nothing of its path."""
    key = result.id.encode()
    value = result.model_dump_json().encode()
    records = [Outbound(reply_to, key, value), Outbound(settings.topic("results"), key, value)]
    if result.finish_reason != "cancelled":
        event = QualityEvent.of(result, tenant=tenant, ts_ms=now_ms, cache_key=cache_key)
        records.append(Outbound(settings.topic("quality"), key, event.model_dump_json().encode()))
    return records


def closing_chunk(result: InferenceResult, *, attempt: int, seq: int, delta: str) -> ResultChunk:
    """The last chunk of a streamed answer: ``delta`` (the text not sent
    yet), why it ended and its usage, as the terminal ``result`` says."""
    return ResultChunk(
        id=result.id,
        attempt=attempt,
        seq=seq,
        delta=delta,
        finish_reason=result.finish_reason or ("error" if result.status == "error" else "stop"),
        usage=result.usage,
        lane=result.lane,
        path=result.path,
        model=result.model,
    )


def chunk_record(chunk: ResultChunk, reply_to: str) -> Outbound:
    """A chunk on the client's reply topic, keyed by request id like its
    result: one partition holds both, in the order they were produced."""
    return Outbound(reply_to, chunk.id.encode(), chunk.model_dump_json().encode())


class ConsumedRecord(Protocol):
    """What laneway needs of a consumed record (faust's or aiokafka's)."""

    @property
    def value(self) -> bytes | None: ...
    @property
    def key(self) -> bytes | None: ...
    @property
    def topic(self) -> str: ...
    @property
    def partition(self) -> int: ...
    @property
    def offset(self) -> int: ...


def dlq_for(record: ConsumedRecord, error: LanewayError, settings: Settings) -> Outbound:
    """A consumed record that could not be processed, as its DLQ record."""
    return dlq_record(
        record.value or b"",
        record.key,
        error,
        source_topic=record.topic,
        source_offset=record.offset,
        source_partition=record.partition,
        settings=settings,
    )


def dlq_record(
    raw: bytes,
    key: bytes | None,
    error: LanewayError,
    *,
    source_topic: str,
    source_offset: int,
    source_partition: int | None = None,
    settings: Settings,
) -> Outbound:
    """The original bytes, with headers that say why and where from."""
    headers: tuple[tuple[str, bytes], ...] = (
        ("laneway-error-code", str(error.code).encode()),
        ("laneway-error", error.message.encode()[:1000]),
        ("laneway-source-topic", source_topic.encode()),
        ("laneway-source-offset", str(source_offset).encode()),
    )
    if source_partition is not None:  # an offset means nothing without its partition
        headers += (("laneway-source-partition", str(source_partition).encode()),)
    return Outbound(settings.topic("dlq"), key, raw, headers)


Send = Callable[[Outbound], Awaitable[Awaitable[object]]]
"""Start producing one record; the returned awaitable resolves on the broker's ack."""


async def deliver(records: Sequence[Outbound], send: Send, settings: Settings) -> None:
    """Produce ``records`` and wait for every acknowledgement.

    Every produce is started first, in order (records of one partition keep
    their order), and only then are the acknowledgements awaited together: a
    batch of records costs one wait for the broker, not one per record.

    A record a client's reply topic refuses (a name the cluster rejects, a
    topic that does not exist where auto-creation is off) goes to the DLQ
    with the reason, so one bad address never blocks a partition. A record
    for laneway's own topics that can never be taken (``PERMANENT``: too
    large, no rights to the topic) goes to the DLQ too, and when it carried
    a request to a lane its client gets the error as its terminal result; a
    DLQ that refuses the record as well gets its headers with an empty value.
    Other failures on laneway's own topics are retried with backoff until
    the broker takes the records: giving up would lose the request.
    """
    replies = settings.replies_topic
    pending = list(records)
    for attempt in itertools.count():
        results = await _send_all(send, pending)
        failed = [(r, exc) for r, exc in zip(pending, results, strict=True) if exc is not None]
        if not failed:
            return
        pending, retrying = [], False
        for record, exc in failed:
            if isinstance(exc, PERMANENT) and not _is_reply(record.topic, replies):
                log.error("%s refused a record for good: %r", record.topic, exc)
                pending += refused_for_good(record, exc, settings)
            elif _is_reply(record.topic, replies):
                log.warning("reply topic %s refused a result: %s", record.topic, exc)
                error = BackendUnavailable(
                    f"reply topic {record.topic!r} refused the result: {exc}"
                )
                pending.append(_diverted(record, error, settings))
            else:
                pending.append(record)
                retrying = True
        if retrying:
            delay = min(5.0, 0.1 * 2**attempt)
            log.error(
                "broker refused %d records for %s (%s); retrying in %.1fs",
                len(pending),
                sorted({record.topic for record in pending}),
                failed[0][1],
                delay,
            )
            await asyncio.sleep(delay)


def _diverted(record: Outbound, error: LanewayError, settings: Settings) -> Outbound:
    """A record that was never produced, as its DLQ record (no source offset)."""
    return dlq_record(
        record.value,
        record.key,
        error,
        source_topic=record.topic,
        source_offset=-1,
        settings=settings,
    )


def _is_reply(topic: str, replies: str) -> bool:
    return topic == replies or topic.startswith(replies + ".")


def refused_for_good(record: Outbound, exc: BaseException, settings: Settings) -> list[Outbound]:
    """What replaces a record the broker will never take: the record on the
    DLQ with the reason and, for a request on its way to a lane, its
    client's error result. A record the DLQ refuses keeps its headers, with
    an empty value; one that is empty already is given up (logged)."""
    dlq = settings.topic("dlq")
    if record.topic == dlq:
        if not record.value:
            log.error("the DLQ refused an empty record too; dropped: %r", record.headers)
            return []
        note = ("laneway-dlq-value-dropped", repr(exc).encode()[:1000])
        return [Outbound(dlq, record.key, b"", (*record.headers, note))]
    error: LanewayError
    if isinstance(exc, TOO_LARGE):
        error = InvalidRequest(
            f"the request is {len(record.value)} bytes on {record.topic}, more than the "
            f"broker takes ({type(exc).__name__}); send a shorter prompt or session"
        )
    else:
        error = BackendUnavailable(f"laneway may not write to {record.topic}: {exc!r}")
    out = [_diverted(record, error, settings)]
    try:
        routed = RoutedRequest.model_validate_json(record.value)
    except ValidationError:
        return out  # not a request (a result or an event): the DLQ holds it
    result = InferenceResult.failure(
        routed.request.id,
        error,
        lane=routed.lane,
        path=routed.path,
        batch_id=routed.request.batch_id,
    ).model_copy(update={"version": routed.version, "router_version": routed.router_version})
    now_ms = int(time.time() * 1000)
    tenant = routed.request.tenant
    return out + terminal_records(
        result, reply_to=routed.reply_to, tenant=tenant, now_ms=now_ms, settings=settings
    )


async def _send_all(send: Send, records: Sequence[Outbound]) -> list[BaseException | None]:
    """Start every produce in order, then gather the acknowledgements; each
    record's error, or ``None``."""
    started: list[Awaitable[object] | BaseException] = []
    for record in records:
        try:
            started.append(await send(record))
        except asyncio.CancelledError:
            raise
        except Exception as exc:
            started.append(exc)
    waiting = [s for s in started if not isinstance(s, BaseException)]
    acks = iter(await asyncio.gather(*waiting, return_exceptions=True))
    out: list[BaseException | None] = []
    for s in started:
        if isinstance(s, BaseException):
            out.append(s)
            continue
        ack = next(acks)
        if isinstance(ack, asyncio.CancelledError):
            raise ack
        out.append(ack if isinstance(ack, BaseException) else None)
    return out
