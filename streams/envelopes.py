"""Records laneway writes, built as plain values so the decisions that make
them are testable without a broker. ``Outbound`` is one record to produce."""

from __future__ import annotations

from dataclasses import dataclass, field

from schemas.errors import LanewayError
from schemas.messages import InferenceResult, QualityEvent
from schemas.settings import Settings

__all__ = ["DLQ_HEADERS", "Outbound", "dlq_record", "terminal_records"]

DLQ_HEADERS = (
    "laneway-error-code",
    "laneway-error",
    "laneway-source-topic",
    "laneway-source-offset",
)


@dataclass(frozen=True, slots=True)
class Outbound:
    topic: str
    key: bytes | None
    value: bytes
    headers: tuple[tuple[str, bytes], ...] = field(default=())


def terminal_records(
    result: InferenceResult,
    *,
    reply_to: str,
    tenant: str | None,
    now_ms: int,
    settings: Settings,
) -> list[Outbound]:
    """A terminal result: to the client's reply topic, to ``results``, and
    its quality event to ``quality`` (keyed by path)."""
    key = result.id.encode()
    value = result.model_dump_json().encode()
    event = QualityEvent.of(result, tenant=tenant, ts_ms=now_ms)
    return [
        Outbound(reply_to, key, value),
        Outbound(settings.topic("results"), key, value),
        Outbound(
            settings.topic("quality"),
            (result.path or "none").encode(),
            event.model_dump_json().encode(),
        ),
    ]


def dlq_record(
    raw: bytes,
    key: bytes | None,
    error: LanewayError,
    *,
    source_topic: str,
    source_offset: int,
    settings: Settings,
) -> Outbound:
    """The original bytes, with headers that say why and where from."""
    headers = (
        ("laneway-error-code", str(error.code).encode()),
        ("laneway-error", error.message.encode()[:1000]),
        ("laneway-source-topic", source_topic.encode()),
        ("laneway-source-offset", str(source_offset).encode()),
    )
    return Outbound(settings.topic("dlq"), key, raw, headers)
