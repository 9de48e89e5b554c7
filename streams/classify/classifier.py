"""The classifier's decision for one request record, as pure functions.

The request loop (``streams.classify.app``, a plain aiokafka intake) decodes
nothing itself. ``admit`` turns a raw record into an accepted request or a
refusal; the batch pipeline
(``streams.classify.batch``) then asks Redis what a whole batch needs (rate
limits, session histories, cache, rule lookups) in one round trip, and
``route`` turns each request and what was found into the records to
produce. Outcomes:

- invalid record       -> DLQ, plus an INF-400 result when id and reply topic can be read
                          (a ``model`` the registry does not name is invalid too)
- deadline passed      -> INF-503 result
- a cached answer      -> that answer, path ``cache``
- a rule owns it       -> the rule's answer, path ``rules`` (not for a request
                          that named its ``model``: that model answers it)
- otherwise            -> a ``RoutedRequest`` on the chosen lane topic, down
                          the path the smart router picked, as the flow
                          controller's load level allows (or INF-429 shed),
                          to the path's version the roll-out assigns
                          (``streams.rollout``), plus a copy for each shadow
                          version sampled (lowest-priority lane; none under load),
                          decided by the router version the roll-out assigns
                          (``streams.rollout.routers``); each shadow router
                          version sampled decides too, and only its path is
                          kept (``Classified.router_shadows``), never acted on

Which of these it is, and the lane, path and realtime partition, is decided
once, a step at a time, by ``streams.classify.lanes.decide_route``
(``Classified.routing`` keeps each step); ``route`` builds the records from
that decision and nothing changes them afterwards.

An accepted request whose tenant is over its rate limit is turned into an
INF-429 result by ``refuse_over_limit``. ``classify_record`` chains the
steps with no I/O (built-in rules, no cache), for tests and tools.

The answers given here count their tokens (``usage``) with the classifier's
``TokenCounter`` (``streams.classify.tokens``) when it has one: a cache
answer's completion tokens are those its model counted when it was stored.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field
from typing import Literal

from schemas.errors import DeadlineExceeded, InvalidRequest, LanewayError, RateLimited
from schemas.messages import (
    AnswerPath,
    ChatMessage,
    InferenceRequest,
    InferenceResult,
    RequestLimits,
    RoutedRequest,
    Timings,
    Usage,
    parse_request,
    peek_reply_address,
)
from schemas.settings import Settings
from streams.classify.flow import LaneFull, Shed
from streams.classify.lanes import Routing, decide_route
from streams.classify.policy import Decision, Found
from streams.classify.router import SmartRouter
from streams.classify.tokens import TokenCounter
from streams.kafka.envelopes import (
    Outbound,
    chunk_record,
    closing_chunk,
    dlq_for,
    terminal_records,
)
from streams.rollout.assign import RolloutView
from streams.rollout.routers import RouterView
from streams.routing.registry import ModelRegistry, builtin_registry, lanes_serving
from streams.routing.stats import PathStats
from streams.rules.engine import RuleBook
from streams.stores.workerboard import Serving

__all__ = [
    "Admitted",
    "Classified",
    "SourceRecord",
    "admit",
    "classify_record",
    "refuse_over_limit",
    "route",
    "shadow_copies",
    "shadow_router_paths",
]


@dataclass(frozen=True, slots=True)
class SourceRecord:
    """One record as read from the request topic."""

    value: bytes | None
    key: bytes | None
    timestamp_ms: int
    topic: str
    partition: int
    offset: int
    headers: tuple[tuple[str, bytes], ...] = ()
    """The record's headers (its ``traceparent``: ``streams.kafka.tracing``)."""


@dataclass(frozen=True, slots=True)
class Admitted:
    """A valid request within its deadline, and where its answer goes."""

    request: InferenceRequest
    reply_to: str
    record: SourceRecord

    def age_ms(self, now_ms: int) -> int:
        return max(0, now_ms - self.record.timestamp_ms)


@dataclass(frozen=True, slots=True)
class Classified:
    outcome: Literal["routed", "answered", "rejected", "expired", "limited", "shed"]
    records: list[Outbound]
    result: InferenceResult | None = None
    """The terminal result the classifier gave, if it gave one."""
    request: InferenceRequest | None = None
    reply_to: str | None = None
    decision: Decision | None = field(default=None)
    router_shadows: tuple[tuple[str, AnswerPath], ...] = ()
    """Per shadow router version sampled, the path it would have chosen
    (compare with ``decision.path``, the one taken)."""
    routing: Routing | None = None
    """What each step of the lane's decision decided (``lanes.decide_route``)."""


def admit(
    record: SourceRecord,
    *,
    now_ms: int,
    settings: Settings,
    limits: RequestLimits | None = None,
    registry: ModelRegistry | None = None,
) -> Admitted | Classified:
    """The accepted request, or the refusal (INF-400 + DLQ, INF-503) to
    produce. ``limits``: ``settings.request_limits()``, if the caller holds
    them (a batch builds them once); ``registry``: the models a request's
    ``model`` may name (``None``: not checked)."""
    raw = record.value or b""
    limits = limits or settings.request_limits()
    try:
        if len(raw) > settings.limits.max_record_bytes:
            raise InvalidRequest(
                f"record is {len(raw)} bytes, limit {settings.limits.max_record_bytes}"
            )
        request = parse_request(raw, limits)
        named = request.named_model()
        if registry is not None and named is not None and registry.named(named) is None:
            raise InvalidRequest(
                f"model {named!r} is not served here: name one of {', '.join(registry.model_names)}"
            )
    except InvalidRequest as error:
        return _reject(record, raw, error, now_ms=now_ms, settings=settings, limits=limits)

    admitted = Admitted(request, request.reply_to or settings.replies_topic, record)
    age_ms = admitted.age_ms(now_ms)
    if request.deadline_ms is not None and age_ms >= request.deadline_ms:
        expired = DeadlineExceeded(
            f"deadline of {request.deadline_ms} ms passed {age_ms - request.deadline_ms} ms "
            "before classification"
        )
        result = InferenceResult.failure(
            request.id, expired, timings=_timings(age_ms), batch_id=request.batch_id
        )
        records = _terminal(result, admitted, now_ms, settings)
        return Classified("expired", records, result, request, admitted.reply_to)
    return admitted


def route(
    admitted: Admitted,
    found: Found,
    *,
    now_ms: int,
    settings: Settings,
    router: SmartRouter,
    stats: Mapping[AnswerPath, PathStats] | None = None,
    level: int = 0,
    history: Sequence[ChatMessage] = (),
    serving: Serving | None = None,
    full: Callable[[AnswerPath], LaneFull | None] | None = None,
    place: Callable[[AnswerPath], int | None] | None = None,
    rollout: RolloutView | None = None,
    tokens: TokenCounter | None = None,
) -> Classified:
    """``level``: the flow controller's load level (``streams.classify.flow``);
    ``serving``: per lane, the paths live workers serve (``None``: not known);
    ``full``: asked with the path of a model request put on the realtime
    lane, that lane when it is too full for it (``flow.LaneFull``; the
    realtime gate's ``full``); ``place``: asked with the path of a request
    routed to the realtime lane, the partition to write it to (the realtime
    gate's ``sent``; ``None``: the key's); ``rollout``: the model versions (``None``:
    no version is named); ``tokens``: counts the tokens of an answer given
    here (``None``: its usage says 0, but a cache entry's own count)."""
    request, reply_to = admitted.request, admitted.reply_to
    age_ms = admitted.age_ms(now_ms)
    named_model = request.named_model()
    named = router.registry.named(named_model) if named_model is not None else None
    configured = lanes_serving(settings, router.registry, named.path) if named else ()
    routers = rollout.routers if rollout is not None else None
    router_version = None
    chooser = router
    if routers is not None and settings.routing.force_path is None and named is None:
        router_version = routers.version_for(request)
        chooser = router.with_learned(routers.learned(router_version))
    routing = decide_route(
        request,
        found,
        settings=settings,
        router=chooser,
        registry=router.registry,
        stats=stats or {},
        serving=serving,
        named=named,
        configured=configured,
        level=level,
        full=full,
        place=place,
    )
    decision = routing.decision
    if routing.answered:
        answer = _answer(decision, admitted, age_ms, tokens)
        assert answer is not None  # a hit or a rule's answer
        hit_key = decision.hit.key if decision.hit is not None else None
        records = _terminal(answer, admitted, now_ms, settings, cache_key=hit_key)
        return Classified("answered", records, answer, request, reply_to, decision, routing=routing)
    adjusted = routing.taken
    if isinstance(adjusted, Shed):
        shed = RateLimited(adjusted.reason, retry_after_ms=adjusted.retry_after_ms)
        result = InferenceResult.failure(
            request.id,
            shed,
            lane=decision.lane,
            timings=_timings(age_ms),
            batch_id=request.batch_id,
        )
        records = _terminal(result, admitted, now_ms, settings)
        return Classified("shed", records, result, request, reply_to, decision, routing=routing)
    produced_ms = admitted.record.timestamp_ms
    version = None
    if named is not None and named.version is not None and adjusted.path == named.path:
        version = named.version  # the version the client named by its model's name
    elif rollout is not None:
        version = rollout.version_for(request, adjusted.path, adjusted.lane)
    routed = RoutedRequest(
        request=request,
        lane=adjusted.lane,
        path=adjusted.path,
        requested_path=adjusted.requested_path,
        reply_to=reply_to,
        produced_at_ms=produced_ms,
        routed_at_ms=now_ms,
        deadline_at_ms=(
            produced_ms + request.deadline_ms if request.deadline_ms is not None else None
        ),
        history=list(history),
        explored=adjusted.explored,
        version=version,
        router_version=router_version,
    )
    out = [
        Outbound(
            settings.lane_topic(adjusted.lane),
            request.id.encode(),
            routed.model_dump_json().encode(),
            partition=routing.partition,
        )
    ]
    judged: tuple[tuple[str, AnswerPath], ...] = ()
    if rollout is not None and level == 0:  # shadows never add to a loaded stack
        out += shadow_copies(routed, rollout, settings)
        if routers is not None and router_version is not None:
            judged = shadow_router_paths(
                request, decision, found, routers, router, stats or {}, serving
            )
    return Classified("routed", out, None, request, reply_to, adjusted, judged, routing)


def shadow_router_paths(
    request: InferenceRequest,
    decision: Decision,
    found: Found,
    routers: RouterView,
    router: SmartRouter,
    stats: Mapping[AnswerPath, PathStats],
    serving: Serving | None,
) -> tuple[tuple[str, AnswerPath], ...]:
    """The path each shadow router version sampled for ``request`` would
    choose, on the inputs of the decision taken (``decision``: its features,
    complexity and lane) and without exploring; nothing here changes what
    the request does."""
    out = []
    served = None if serving is None else serving.get(decision.lane, frozenset())
    for version in routers.shadows_for(request):
        twin = router.with_learned(routers.learned(version), explore=False)
        choice = twin.choose(
            decision.complexity,
            decision.lane,
            stats,
            served,
            features=decision.features,
            embedding=found.embedding,
        )
        out.append((version, choice.path))
    return tuple(out)


def shadow_copies(
    routed: RoutedRequest, rollout: RolloutView, settings: Settings
) -> list[Outbound]:
    """A copy of ``routed`` for each shadow version of its path sampled,
    on the lowest-priority lane serving it, with no deadline (it waits
    behind live work) and marked ``shadow``: its answer is only recorded."""
    out = []
    for version, lane in rollout.shadows_for(routed.request, routed.path):
        copy = routed.model_copy(
            update={"lane": lane, "version": version, "shadow": True, "deadline_at_ms": None}
        )
        out.append(
            Outbound(
                settings.lane_topic(lane),
                routed.request.id.encode(),
                copy.model_dump_json().encode(),
            )
        )
    return out


def classify_record(
    record: SourceRecord,
    *,
    now_ms: int,
    settings: Settings,
    rules: RuleBook,
    level: int = 0,
    router: SmartRouter | None = None,
    tokens: TokenCounter | None = None,
) -> Classified:
    """``admit`` then ``route`` with no I/O: rules that need no lookup, no
    cache, no session, the registry's prior statistics."""
    router = router or SmartRouter(builtin_registry(settings.backend), settings.routing)
    admitted = admit(record, now_ms=now_ms, settings=settings, registry=router.registry)
    if isinstance(admitted, Classified):
        return admitted
    text = admitted.request.user_text()
    intent, _ = rules.classify(text)
    rule = rules.answer(text) if settings.routing.rules_enabled else None
    found = Found(rule=rule, intent=intent)
    return route(
        admitted, found, now_ms=now_ms, settings=settings, router=router, level=level, tokens=tokens
    )


def refuse_over_limit(
    admitted: Admitted, retry_after_ms: int, *, now_ms: int, settings: Settings
) -> Classified:
    """An accepted request whose tenant is over its rate limit: an INF-429
    result that says when to retry."""
    request = admitted.request
    error = RateLimited(
        f"tenant {request.tenant or '-'!r} is over its rate limit; retry in {retry_after_ms} ms",
        retry_after_ms=retry_after_ms,
    )
    result = InferenceResult.failure(
        request.id, error, timings=_timings(admitted.age_ms(now_ms)), batch_id=request.batch_id
    )
    records = _terminal(result, admitted, now_ms, settings)
    return Classified("limited", records, result, request, admitted.reply_to)


def _answer(
    decision: Decision, admitted: Admitted, age_ms: int, tokens: TokenCounter | None = None
) -> InferenceResult | None:
    """The classifier's own answer (cache or rules), if it has one, with
    its tokens counted (``tokens``; a cache entry's completion tokens are
    its model's own count, when the entry has it)."""
    request = admitted.request
    completion: int | None = None
    finish: Literal["stop", "length"] = "stop"
    if decision.hit is not None:
        hit = decision.hit
        output, model, completion = hit.output, hit.label, hit.completion_tokens
        finish = hit.finish_reason
    elif decision.rule is not None:
        output, model = decision.rule.text, f"rules:{decision.rule.rule}"
    else:
        return None
    if tokens is not None and tokens.ready:
        if completion is None:
            completion = tokens.answer(output)
        usage = Usage(prompt_tokens=tokens.prompt(request), completion_tokens=completion)
    else:
        usage = Usage(completion_tokens=completion or 0)
    return InferenceResult(
        id=request.id,
        status="ok",
        output=output,
        lane=decision.lane,
        path=decision.path,
        model=model,
        finish_reason=finish,
        usage=usage,
        timings=_timings(age_ms),
        batch_id=request.batch_id,
    )


def _timings(age_ms: float) -> Timings:
    return Timings(queue_ms=age_ms, total_ms=age_ms)


def _terminal(
    result: InferenceResult,
    admitted: Admitted,
    now_ms: int,
    settings: Settings,
    cache_key: str | None = None,
) -> list[Outbound]:
    """``result``'s records; a streamed request's come after its one chunk
    (attempt 0: the classifier's answers are never decoded again)."""
    chunk = []
    if admitted.request.stream:
        whole = result.output or "" if result.status == "ok" else ""
        chunk = [
            chunk_record(closing_chunk(result, attempt=0, seq=0, delta=whole), admitted.reply_to)
        ]
    return chunk + terminal_records(
        result,
        reply_to=admitted.reply_to,
        tenant=admitted.request.tenant,
        now_ms=now_ms,
        settings=settings,
        cache_key=cache_key,
    )


def _reject(
    record: SourceRecord,
    raw: bytes,
    error: LanewayError,
    *,
    now_ms: int,
    settings: Settings,
    limits: RequestLimits,
) -> Classified:
    records = [dlq_for(record, error, settings)]
    address = peek_reply_address(raw, limits)
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
