"""What laneway says of a trace span: one per consumed record a process
settles (started and exported by ``streams.kafka.otlp``), named and
described as OpenTelemetry's messaging conventions have it (``process
<topic>``, kind CONSUMER, ``messaging.*`` attributes: ``record_attributes``)
plus laneway's own (``laneway.request.id``, ``.lane``, ``.path``,
``.status``, ``.error_code``) and, for a terminal result, the GenAI
conventions' (``gen_ai.*``: ``gen_ai_attributes``), both from the record's
``Outcome`` (``outcome_attributes``). Pure functions, no broker.
"""

from __future__ import annotations

from collections.abc import Iterable
from dataclasses import dataclass, field
from typing import Any, Protocol

from schemas.messages import InferenceRequest, InferenceResult, RoutedRequest

__all__ = [
    "UNREADABLE",
    "Attribute",
    "Outcome",
    "classified_outcome",
    "gen_ai_attributes",
    "gen_ai_request_attributes",
    "lane_outcomes",
    "outcome_attributes",
    "record_attributes",
    "span_name",
]

Coords = tuple[str, int, int]
"""A consumed record's topic, partition and offset."""

Attribute = str | int | bool | float | tuple[str, ...]
"""An attribute's value; a tuple is an array (``gen_ai.response.finish_reasons``)."""


@dataclass(frozen=True, slots=True)
class Outcome:
    """What a process made of one consumed record: a span's ``laneway.*``
    attributes."""

    request_id: str | None
    lane: str | None
    path: str | None
    status: str
    """``ok`` or ``error`` (a terminal result), ``routed`` (the classifier put
    it on a lane), ``retry`` (parked on a retry topic); an ``error`` span has
    status ERROR."""
    error_code: str | None = None
    gen_ai: tuple[tuple[str, Attribute], ...] = field(default=(), compare=False)
    """OpenTelemetry's GenAI attributes of the answer (``gen_ai_attributes``)."""

    @classmethod
    def of_result(cls, result: InferenceResult, request: InferenceRequest | None = None) -> Outcome:
        return cls(
            result.id,
            _text(result.lane),
            _text(result.path),
            result.status,
            _text(result.error.code) if result.error else None,
            gen_ai_attributes(result, request),
        )


def gen_ai_attributes(
    result: InferenceResult, request: InferenceRequest | None = None
) -> tuple[tuple[str, Attribute], ...]:
    """The answer as OpenTelemetry's GenAI semantic conventions name it: a
    ``chat`` operation, the model that answered, its token usage and why it
    ended; with ``request``, what was asked of it."""
    out: list[tuple[str, Attribute]] = [
        ("gen_ai.operation.name", "chat"),
        ("gen_ai.response.id", result.id),
    ]
    if result.model is not None:
        out.append(("gen_ai.response.model", result.model))
    if result.finish_reason is not None:
        out.append(("gen_ai.response.finish_reasons", (result.finish_reason,)))
    if result.status == "ok":
        out.append(("gen_ai.usage.input_tokens", result.usage.prompt_tokens))
        out.append(("gen_ai.usage.output_tokens", result.usage.completion_tokens))
    if request is not None:
        out.extend(gen_ai_request_attributes(request))
    if result.error is not None:
        out.append(("error.type", str(result.error.code)))
    return tuple(out)


def gen_ai_request_attributes(request: InferenceRequest) -> tuple[tuple[str, Attribute], ...]:
    """What was asked of the model, as the GenAI conventions name it."""
    out: list[tuple[str, Attribute]] = [
        ("gen_ai.request.max_tokens", request.max_tokens),
        ("gen_ai.request.temperature", request.temperature),
    ]
    if request.top_p is not None:
        out.append(("gen_ai.request.top_p", request.top_p))
    if request.seed is not None:
        out.append(("gen_ai.request.seed", request.seed))
    if request.stop:
        out.append(("gen_ai.request.stop_sequences", tuple(request.stop)))
    return tuple(out)


UNREADABLE = Outcome(None, None, None, "error", "INF-400")
"""A lane record no worker could read (DLQ, INF-400)."""


class _Decided(Protocol):
    @property
    def lane(self) -> Any: ...
    @property
    def path(self) -> Any: ...


class _Classified(Protocol):
    """What ``classified_outcome`` reads of ``streams.classify.classifier.Classified``."""

    @property
    def outcome(self) -> str: ...
    @property
    def result(self) -> InferenceResult | None: ...
    @property
    def request(self) -> InferenceRequest | None: ...
    @property
    def decision(self) -> _Decided | None: ...


def classified_outcome(classified: _Classified) -> Outcome:
    """The classifier's outcome for one request: its terminal result (cache,
    rule or refusal), else the lane and path it was routed to; a record
    refused with no result (its id or reply topic unreadable) is INF-400."""
    if classified.result is not None:
        return Outcome.of_result(classified.result, classified.request)
    if classified.outcome == "rejected":
        return UNREADABLE
    decision = classified.decision
    return Outcome(
        classified.request.id if classified.request is not None else None,
        _text(decision.lane) if decision is not None else None,
        _text(decision.path) if decision is not None else None,
        classified.outcome,
    )


def lane_outcomes(
    readable: Iterable[tuple[tuple[Any, ...], RoutedRequest]],
    results: Iterable[tuple[tuple[Any, ...], InferenceResult]],
    retried: Iterable[tuple[Any, ...]],
) -> dict[Coords, Outcome]:
    """A lane worker's outcome for each readable record of a batch, by the
    first three fields of its key (topic, partition, offset): its terminal
    result; ``retry`` when it is parked on the retry topic (by this delivery
    or an earlier one); else it was given up (INF-502: it crashed its worker
    too often). A record missing here was unreadable (``UNREADABLE``)."""
    outcomes: dict[Coords, Outcome] = {}
    requests: dict[Coords, InferenceRequest] = {}
    for key, routed in readable:
        requests[_coords(key)] = routed.request
        outcomes[_coords(key)] = Outcome(
            routed.request.id, _text(routed.lane), _text(routed.path), "error", "INF-502"
        )
    for key in retried:
        was = outcomes.get(_coords(key))
        if was is not None:
            outcomes[_coords(key)] = Outcome(was.request_id, was.lane, was.path, "retry")
    for key, result in results:
        outcomes[_coords(key)] = Outcome.of_result(result, requests.get(_coords(key)))
    return outcomes


def span_name(topic: str) -> str:
    """The span of processing a record of ``topic`` (messaging conventions)."""
    return f"process {topic}"


def record_attributes(topic: str, partition: int, offset: int, group: str) -> dict[str, Attribute]:
    """The messaging conventions' attributes of processing one record, read
    by consumer ``group``."""
    return {
        "messaging.system": "kafka",
        "messaging.operation.type": "process",
        "messaging.operation.name": "process",
        "messaging.destination.name": topic,
        "messaging.destination.partition.id": str(partition),
        "messaging.kafka.offset": offset,
        "messaging.consumer.group.name": group,
    }


def outcome_attributes(outcome: Outcome) -> dict[str, Attribute]:
    """laneway's attributes of what became of a record (those it knows),
    then the GenAI ones of its answer."""
    attributes: dict[str, Attribute] = {}
    for name, value in (
        ("laneway.request.id", outcome.request_id),
        ("laneway.lane", outcome.lane),
        ("laneway.path", outcome.path),
        ("laneway.status", outcome.status),
        ("laneway.error_code", outcome.error_code),
    ):
        if value is not None:
            attributes[name] = value
    attributes.update(outcome.gen_ai)
    return attributes


def _coords(key: tuple[Any, ...]) -> Coords:
    return (str(key[0]), int(key[1]), int(key[2]))


def _text(value: object) -> str | None:
    return None if value is None else str(value)
