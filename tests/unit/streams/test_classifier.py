import json

from schemas.messages import InferenceResult, QualityEvent, ResultChunk, RoutedRequest
from schemas.settings import RoutingSettings, Settings
from streams.classify.classifier import (
    Admitted,
    SourceRecord,
    admit,
    classify_record,
    refuse_over_limit,
)
from streams.rules.engine import RuleBook

SETTINGS = Settings(routing=RoutingSettings(exploration=0.0))  # no random exploration
NOW = 1_700_000_000_000


def record(value: bytes, *, age_ms: int = 5, key: bytes | None = b"k") -> SourceRecord:
    return SourceRecord(
        value=value,
        key=key,
        timestamp_ms=NOW - age_ms,
        topic="laneway.requests",
        partition=2,
        offset=41,
    )


def classify(value: bytes, **kw: int):  # type: ignore[no-untyped-def]
    return classify_record(record(value, **kw), now_ms=NOW, settings=SETTINGS, rules=RuleBook())


def body(**fields: object) -> bytes:
    return json.dumps(
        {"id": "req-1", "prompt": "What is the capital of France?", **fields}
    ).encode()


def test_routes_to_lane_topic() -> None:
    out = classify(body(deadline_ms=1000, reply_to="laneway.replies.acme"))
    assert out.outcome == "routed"
    (sent,) = out.records
    assert sent.topic == "laneway.lane.realtime" and sent.key == b"req-1"
    routed = RoutedRequest.model_validate_json(sent.value)
    assert routed.reply_to == "laneway.replies.acme"
    assert routed.produced_at_ms == NOW - 5 and routed.routed_at_ms == NOW
    assert routed.deadline_at_ms == NOW - 5 + 1000
    assert routed.path == "light"


def test_rule_answer_goes_to_client_results_and_quality() -> None:
    out = classify(body(prompt="hello"))
    assert out.outcome == "answered"
    reply, results, quality = out.records
    assert reply.topic == "laneway.replies" and results.topic == "laneway.results"
    result = InferenceResult.model_validate_json(reply.value)
    assert result.status == "ok" and result.path == "rules" and result.model == "rules:greeting"
    assert reply.value == results.value
    assert quality.topic == "laneway.quality" and quality.key == b"req-1"  # spread by id
    assert QualityEvent.model_validate_json(quality.value).success


def test_a_streamed_rule_answer_is_one_chunk_of_attempt_0_before_its_result() -> None:
    out = classify(body(prompt="hello", stream=True, reply_to="laneway.replies.app"))
    chunk, reply, results, _quality = out.records
    assert chunk.topic == reply.topic == "laneway.replies.app" and chunk.key == reply.key
    piece = ResultChunk.model_validate_json(chunk.value)
    result = InferenceResult.model_validate_json(reply.value)
    assert (piece.attempt, piece.seq, piece.finish_reason) == (0, 0, "stop")
    assert piece.delta == result.output and result.finish_reason == "stop"
    assert results.topic == "laneway.results"


def test_a_streamed_request_refused_at_its_deadline_ends_its_stream_with_error() -> None:
    out = classify(body(deadline_ms=100, stream=True), age_ms=150)
    chunk, reply, *_ = out.records
    piece = ResultChunk.model_validate_json(chunk.value)
    assert piece.finish_reason == "error" and piece.delta == ""
    assert InferenceResult.model_validate_json(reply.value).finish_reason == "error"


def test_expired_deadline_gets_inf_503() -> None:
    out = classify(body(deadline_ms=100), age_ms=150)
    assert out.outcome == "expired"
    result = InferenceResult.model_validate_json(out.records[0].value)
    assert result.error is not None and result.error.code == "INF-503" and result.error.retryable
    assert "passed 50 ms" in result.error.message


def test_invalid_record_goes_to_dlq_and_client_hears_why() -> None:
    raw = body(max_tokens=0, reply_to="laneway.replies.acme")
    out = classify(raw)
    assert out.outcome == "rejected"
    dlq, reply, results, quality = out.records
    assert [results.topic, quality.topic] == ["laneway.results", "laneway.quality"]
    assert dlq.topic == "laneway.dlq" and dlq.value == raw and dlq.key == b"k"
    headers = dict(dlq.headers)
    assert headers["laneway-error-code"] == b"INF-400"
    assert b"max_tokens=0" in headers["laneway-error"]
    assert headers["laneway-source-topic"] == b"laneway.requests"
    assert headers["laneway-source-offset"] == b"41"
    assert headers["laneway-source-partition"] == b"2"
    assert reply.topic == "laneway.replies.acme"
    result = InferenceResult.model_validate_json(reply.value)
    assert result.id == "req-1" and result.error is not None and result.error.code == "INF-400"


def test_foreign_reply_to_is_answered_on_the_default_topic() -> None:
    out = classify(body(reply_to="laneway.requests"))
    assert [r.topic for r in out.records[:2]] == ["laneway.dlq", "laneway.replies"]


def test_unreadable_record_only_goes_to_dlq() -> None:
    for raw in (b"\x00\x01garbage", b"", b'{"prompt": "no id"}'):
        out = classify(raw)
        assert out.outcome == "rejected"
        assert [r.topic for r in out.records] == ["laneway.dlq"]


def test_oversized_record_is_refused_before_decoding() -> None:
    raw = b"{" + b" " * SETTINGS.limits.max_record_bytes + b"}"
    out = classify(raw)
    assert out.outcome == "rejected"
    assert b"limit" in dict(out.records[0].headers)["laneway-error"]


def test_over_limit_turns_an_accepted_request_into_inf_429() -> None:
    accepted = admit(
        record(body(tenant="acme", reply_to="laneway.replies.acme")), now_ms=NOW, settings=SETTINGS
    )
    assert isinstance(accepted, Admitted)
    limited = refuse_over_limit(accepted, 750, now_ms=NOW, settings=SETTINGS)
    assert limited.outcome == "limited"
    reply, results, quality = limited.records
    assert reply.topic == "laneway.replies.acme" and results.topic == "laneway.results"
    result = InferenceResult.model_validate_json(reply.value)
    assert result.error is not None and result.error.code == "INF-429"
    assert result.error.retry_after_ms == 750 and result.error.retryable
    assert "'acme'" in result.error.message
    assert QualityEvent.model_validate_json(quality.value).error_code == "INF-429"


def test_accepted_requests_carry_their_request_for_the_limiter() -> None:
    for prompt in ("hello", "What is the capital of France?"):
        accepted = classify(body(prompt=prompt, tenant="acme"))
        assert accepted.outcome in ("answered", "routed")
        assert accepted.request is not None and accepted.request.tenant == "acme"
        assert accepted.reply_to == "laneway.replies"


def test_a_cache_hit_is_answered_by_the_classifier() -> None:
    from schemas.messages import AnswerPath, ChatMessage
    from streams.cache.response import CacheHit
    from streams.classify.classifier import route
    from streams.classify.policy import Found
    from streams.classify.router import SmartRouter
    from streams.routing.registry import builtin_registry

    admitted = admit(record(body()), now_ms=NOW, settings=SETTINGS)
    assert isinstance(admitted, Admitted)
    router = SmartRouter(builtin_registry(SETTINGS.backend), SETTINGS.routing)
    hit = CacheHit("Paris.", "semantic", 0.97, "llamacpp:smollm2-135m", AnswerPath.LIGHT, "k")
    out = route(admitted, Found(hit=hit), now_ms=NOW, settings=SETTINGS, router=router)
    assert out.outcome == "answered" and out.result is not None
    assert out.result.path == "cache" and out.result.output == "Paris."
    assert out.result.model == "cache:semantic:llamacpp:smollm2-135m"
    event = QualityEvent.model_validate_json(out.records[2].value)
    assert event.cache_hit and event.success
    assert event.cache_key == "k"  # bad feedback on the answer evicts that entry

    history = [ChatMessage(role="user", content="hi"), ChatMessage(role="assistant", content="yo")]
    routed_out = route(
        admitted,
        Found(history_turns=2),
        now_ms=NOW,
        settings=SETTINGS,
        router=router,
        history=history,
    )
    assert routed_out.outcome == "routed"
    routed = RoutedRequest.model_validate_json(routed_out.records[0].value)
    assert routed.history == history


def test_a_route_chosen_to_explore_is_marked_on_the_lane_record() -> None:
    import random

    from streams.classify.app import _choice
    from streams.classify.classifier import route
    from streams.classify.policy import Found
    from streams.classify.router import SmartRouter
    from streams.routing.registry import builtin_registry

    admitted = admit(record(body(prompt="Name a colour.")), now_ms=NOW, settings=SETTINGS)
    assert isinstance(admitted, Admitted)
    registry = builtin_registry(SETTINGS.backend)
    always = SmartRouter(registry, RoutingSettings(exploration=1.0), rng=random.Random(0))
    never = SmartRouter(registry, SETTINGS.routing)
    outs = {
        name: route(admitted, Found(), now_ms=NOW, settings=SETTINGS, router=router)
        for name, router in (("explored", always), ("scored", never))
    }
    for name, out in outs.items():
        routed = RoutedRequest.model_validate_json(out.records[0].value)
        assert routed.explored is (name == "explored")
        assert out.decision is not None and _choice(out.decision) == name
    assert RoutedRequest.model_validate_json(outs["explored"].records[0].value).path == "heavy"
