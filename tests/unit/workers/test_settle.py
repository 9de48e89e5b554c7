"""What a worker produces for failures, poison records and unreadable lane
records: which topics, which headers, which result for the client."""

import json
import time

from aiokafka import ConsumerRecord
from pydantic import ValidationError

from schemas.errors import BackendUnavailable, ErrorCode, InvalidRequest
from schemas.messages import (
    AnswerPath,
    InferenceRequest,
    InferenceResult,
    Lane,
    QualityEvent,
    RoutedRequest,
)
from schemas.settings import Settings
from streams.kafka.tracing import TRACEPARENT, TRACESTATE, TraceHeaders
from workers.retry import ATTEMPT_HEADER, read_mark
from workers.settle import answer_cache_key, give_up, reject_unreadable, settle_failures

SETTINGS = Settings(max_attempts=3, retry_backoff_ms=500, retry_max_backoff_ms=2_000)
LANE_TOPIC = SETTINGS.lane_topic(Lane.MEDIUM)


def routed(rid: str, deadline_in_ms: int | None = None) -> RoutedRequest:
    now = int(time.time() * 1000)
    return RoutedRequest(
        request=InferenceRequest(id=rid, prompt="hi", tenant="acme"),
        lane=Lane.MEDIUM,
        path=AnswerPath.HEAVY,
        reply_to="laneway.replies.acme",
        produced_at_ms=now,
        routed_at_ms=now,
        deadline_at_ms=None if deadline_in_ms is None else now + deadline_in_ms,
    )


def record(offset: int, value: bytes, attempt: int | None = None) -> ConsumerRecord:
    headers = () if attempt is None else ((ATTEMPT_HEADER, str(attempt).encode()),)
    return ConsumerRecord(
        topic=LANE_TOPIC,
        partition=0,
        offset=offset,
        timestamp=0,
        timestamp_type=0,
        key=b"k",
        value=value,
        checksum=None,
        serialized_key_size=1,
        serialized_value_size=len(value),
        headers=headers,
    )


def failed(rid: str, error: Exception) -> InferenceResult:
    assert isinstance(error, BackendUnavailable | InvalidRequest)
    return InferenceResult.failure(rid, error, lane=Lane.MEDIUM, path=AnswerPath.HEAVY)


def test_failures_are_parked_given_up_or_left_as_they_are() -> None:
    down = BackendUnavailable("no path can serve heavy")
    cases = {
        "park": (routed("park"), 1, down),
        "last": (routed("last"), 3, down),
        "hurry": (routed("hurry", deadline_in_ms=100), 1, down),
        "bad": (routed("bad"), 1, InvalidRequest("no")),
    }
    records = [
        record(i, r.model_dump_json().encode(), attempt)
        for i, (r, attempt, _) in enumerate(cases.values())
    ]
    answers = [
        ((LANE_TOPIC, 0, i, rid), r, failed(rid, error))
        for i, (rid, (r, _, error)) in enumerate(cases.items())
    ]
    left, parked, out = settle_failures(answers, records, SETTINGS, Lane.MEDIUM)

    assert parked == [(LANE_TOPIC, 0, 0, "park")]
    by_topic: dict[str, list[bytes]] = {}
    for o in out:
        by_topic.setdefault(o.topic, []).append(o.value)
    (retried,) = [o for o in out if o.topic == "laneway.retry.medium"]
    assert read_mark(retried.headers).attempt == 2
    # The router hears of the parked failure at once.
    (event,) = [QualityEvent.model_validate_json(v) for v in by_topic["laneway.quality"]]
    assert event.kind == "attempt" and event.path == "heavy" and event.id == "park"
    assert event.error_code == ErrorCode.BACKEND_UNAVAILABLE and not event.success
    # The last attempt goes to the DLQ with its attempt count; the client is answered.
    (dead,) = [o for o in out if o.topic == "laneway.dlq"]
    assert dict(dead.headers)[ATTEMPT_HEADER] == b"3"
    results = {rid: result for (_, _, _, rid), _, result in left}
    assert set(results) == {"last", "hurry", "bad"}
    last = results["last"].error
    assert last is not None and "attempt 3 of 3; moved to the DLQ" in last.message
    hurry = results["hurry"].error
    assert hurry is not None and "no time before the deadline" in hurry.message
    assert results["bad"].error is not None and results["bad"].error.code == "INF-400"


def test_poison_records_go_to_the_dlq_and_their_clients_hear_inf_502() -> None:
    poison = routed("poison")
    lane_record = record(7, poison.model_dump_json().encode())
    out = give_up([((LANE_TOPIC, 0, 7, "poison"), poison)], [lane_record], SETTINGS, Lane.MEDIUM)
    topics = [o.topic for o in out]
    assert topics == ["laneway.dlq", "laneway.replies.acme", "laneway.results", "laneway.quality"]
    reply = InferenceResult.model_validate_json(out[1].value)
    assert reply.error is not None and reply.error.code == "INF-502"
    assert "failed 3 times" in reply.error.message


def unreadable(raw: bytes) -> ValidationError:
    try:
        RoutedRequest.model_validate_json(raw)
    except ValidationError as exc:
        return exc
    raise AssertionError("it was readable")


def test_an_unreadable_lane_record_answers_its_client_when_it_names_one() -> None:
    newer = json.dumps(
        {
            "schema_version": 2,
            "request": {"id": "req-9", "prompt": "my secret prompt"},
            "reply_to": "laneway.replies.acme",
        }
    ).encode()
    out = reject_unreadable(record(3, newer), unreadable(newer), SETTINGS, Lane.MEDIUM)
    assert [o.topic for o in out] == [
        "laneway.dlq",
        "laneway.replies.acme",
        "laneway.results",
        "laneway.quality",
    ]
    assert out[0].value == newer and dict(out[0].headers)["laneway-error-code"] == b"INF-502"
    reply = InferenceResult.model_validate_json(out[1].value)
    assert reply.id == "req-9" and reply.error is not None and reply.error.retryable
    assert "schema_version" in reply.error.message and "secret" not in reply.error.message

    garbage = b"\x00 not json"
    (dead,) = reject_unreadable(record(4, garbage), unreadable(garbage), SETTINGS, Lane.MEDIUM)
    assert dead.topic == "laneway.dlq" and dead.value == garbage


def test_an_answer_names_the_cache_entry_it_came_from_or_is_stored_under() -> None:
    from schemas.messages import ChatMessage
    from streams.cache.keys import cache_key
    from streams.stores.sessions import context_digest

    asked = routed("answer")
    model = InferenceResult(id="answer", status="ok", output="4", path=AnswerPath.HEAVY)
    key = cache_key(asked.request, SETTINGS.cache)
    assert answer_cache_key(asked, model, SETTINGS) == key
    late_hit = model.model_copy(update={"path": AnswerPath.CACHE, "model": "cache:exact:x"})
    assert answer_cache_key(asked, late_hit, SETTINGS) == key
    # Not stored, so no entry to name: a degraded answer, an error, a rule.
    for result in (
        model.model_copy(update={"degraded": True}),
        failed("answer", BackendUnavailable("down")),
        model.model_copy(update={"path": AnswerPath.RULES}),
    ):
        assert answer_cache_key(asked, result, SETTINGS) is None
    turns = [ChatMessage(role="user", content="hi"), ChatMessage(role="assistant", content="yo")]
    talk = asked.model_copy(update={"history": turns})
    assert answer_cache_key(talk, model, SETTINGS) == cache_key(
        talk.request, SETTINGS.cache, context_digest(turns)
    )
    forced = SETTINGS.model_copy(
        update={"routing": SETTINGS.routing.model_copy(update={"force_path": "heavy"})}
    )
    assert answer_cache_key(asked, model, forced) is None


def test_a_shadow_copy_is_never_parked_and_never_answers_a_client() -> None:
    from workers.result_store import record_id
    from workers.settle import terminal_for

    shadow = routed("s1").model_copy(update={"version": "smol", "shadow": True})
    value = shadow.model_dump_json().encode()
    key = (LANE_TOPIC, 0, 7, record_id("s1", "smol", shadow=True))
    assert key[3] != "s1"  # its result-store entry is not the live request's
    result = failed("s1", BackendUnavailable("down")).model_copy(update={"version": "smol"})
    left, parked, out = settle_failures(
        [(key, shadow, result)], [record(7, value)], SETTINGS, Lane.BULK
    )
    assert left == [(key, shadow, result)] and parked == [] and out == []
    (only,) = terminal_for(result, shadow, int(time.time() * 1000), SETTINGS)
    assert only.topic == SETTINGS.topic("shadow")
    assert InferenceResult.model_validate_json(only.value).version == "smol"


def test_parked_and_given_up_records_carry_their_lane_records_traceparent() -> None:
    down = BackendUnavailable("no path can serve heavy")
    records = [
        record(0, routed("park").model_dump_json().encode(), 1),
        record(1, routed("last").model_dump_json().encode(), 3),
    ]
    answers = [
        ((LANE_TOPIC, 0, 0, "park"), routed("park"), failed("park", down)),
        ((LANE_TOPIC, 0, 1, "last"), routed("last"), failed("last", down)),
    ]
    traces: dict[tuple[str, int, int], TraceHeaders] = {
        (LANE_TOPIC, 0, i): (
            (TRACEPARENT, f"00-{'4b' * 16}-{i + 1:016x}-01".encode()),
            (TRACESTATE, f"lane=r{i}".encode()),
        )
        for i in range(len(records))
    }
    _, _, out = settle_failures(answers, records, SETTINGS, Lane.MEDIUM, traces=traces)

    retried, event, dead = out
    assert (retried.topic, event.topic, dead.topic) == (
        "laneway.retry.medium",
        "laneway.quality",
        "laneway.dlq",
    )
    for produced, offset in ((retried, 0), (event, 0), (dead, 1)):
        trace = dict(traces[LANE_TOPIC, 0, offset])
        assert {k: v for k, v in produced.headers if k in trace} == trace
    assert read_mark(retried.headers).attempt == 2  # the retry mark is kept beside it
