import json

import pytest
from pydantic import ValidationError

from schemas.errors import ErrorCode, InvalidRequest
from schemas.messages import (
    InferenceRequest,
    InferenceResult,
    QualityEvent,
    RequestLimits,
    describe_errors,
    parse_request,
    peek_reply_address,
    peek_routed_address,
)

LIMITS = RequestLimits()


def raw(**fields: object) -> bytes:
    return json.dumps({"id": "req-1", "prompt": "hi", **fields}).encode()


def test_design_example_parses() -> None:
    example = (
        b'{"schema_version": 1, "id": "req-42", "tenant": "acme", "session_id": "s1",'
        b' "prompt": "Where is my order 12345?", "messages": null, "max_tokens": 128,'
        b' "temperature": 0.0, "deadline_ms": 2000, "lane": null,'
        b' "reply_to": "laneway.replies.acme", "batch_id": null, "metadata": {}}'
    )
    request = parse_request(example, LIMITS)
    assert request.id == "req-42"
    assert request.partition_key() == b"s1"
    assert request.chat()[0].content == "Where is my order 12345?"


def test_messages_request_uses_last_user_turn() -> None:
    request = parse_request(
        raw(
            prompt=None,
            messages=[
                {"role": "system", "content": "be brief"},
                {"role": "user", "content": "first"},
                {"role": "assistant", "content": "ok"},
                {"role": "user", "content": "second"},
            ],
        ),
        LIMITS,
    )
    assert request.user_text() == "second"
    assert request.text_bytes() == len("be brieffirstoksecond")
    assert request.partition_key() == b"req-1"


@pytest.mark.parametrize(
    ("record", "expected"),
    [
        (b"not json", "invalid request"),
        (b"[1, 2]", "invalid request"),
        (raw(prompt=None), "exactly one of 'prompt' or 'messages'"),
        (raw(messages=[{"role": "user", "content": "x"}]), "exactly one of"),
        (raw(prompt=None, messages=[]), "must not be empty"),
        (raw(schema_version=2), "schema_version"),
        (raw(unknown_field=1), "unknown_field"),
        (raw(temperature=5), "temperature"),
        (raw(id=""), "id"),
        (raw(id="x" * 129), "limit 128"),
        (raw(prompt="x" * (64 * 1024 + 1)), "limit 65536"),
        (raw(max_tokens=0), "max_tokens=0 outside 1..4096"),
        (raw(max_tokens=4097), "max_tokens=4097"),
        (raw(reply_to="laneway.requests"), "reply_to='laneway.requests'"),
        (raw(reply_to="laneway.repliesX"), "reply_to"),
        (raw(reply_to="laneway.replies."), "reply_to"),
        (raw(reply_to="laneway.replies.a/b"), "reply_to"),
        (raw(lane="express"), "lane"),
    ],
)
def test_bad_requests_are_refused_with_a_reason(record: bytes, expected: str) -> None:
    with pytest.raises(InvalidRequest) as caught:
        parse_request(record, LIMITS)
    assert expected in caught.value.message
    assert caught.value.code is ErrorCode.INVALID_REQUEST
    assert caught.value.to_dlq and not caught.value.retryable


def test_limits_come_from_settings() -> None:
    small = RequestLimits(max_text_bytes=3, max_tokens_max=10, reply_prefix="x.replies")
    with pytest.raises(InvalidRequest, match="limit 3"):
        parse_request(raw(prompt="four"), small)
    with pytest.raises(InvalidRequest, match=r"1\.\.10"):
        parse_request(raw(max_tokens=11), small)
    assert (
        parse_request(raw(reply_to="x.replies.team-a", max_tokens=5), small).reply_to
        == "x.replies.team-a"
    )


def test_multibyte_text_is_measured_in_bytes() -> None:
    small = RequestLimits(max_text_bytes=5)
    with pytest.raises(InvalidRequest, match="6 bytes"):
        parse_request(raw(prompt="订单"), small)


@pytest.mark.parametrize(
    ("record", "address"),
    [
        (raw(reply_to="laneway.replies.acme", max_tokens=0), ("req-1", "laneway.replies.acme")),
        (raw(reply_to="evil.topic"), ("req-1", "laneway.replies")),
        (raw(reply_to=7), ("req-1", "laneway.replies")),
        (b'{"prompt": "no id"}', None),
        (b'{"id": 5}', None),
        (b"\xff\xfe", None),
        (b"[]", None),
        (json.dumps({"id": "x" * 500}).encode(), None),
    ],
)
def test_peek_reply_address_never_uses_a_foreign_topic(
    record: bytes, address: tuple[str, str] | None
) -> None:
    assert peek_reply_address(record, LIMITS) == address


def test_failure_result_and_quality_event() -> None:
    result = InferenceResult.failure("r", InvalidRequest("bad"))
    assert result.status == "error" and result.output is None
    assert result.error is not None and result.error.code == "INF-400"
    wire = json.loads(result.model_dump_json())
    assert wire["error"] == {
        "code": "INF-400",
        "message": "bad",
        "retryable": False,
        "retry_after_ms": None,
    }
    event = QualityEvent.of(result, tenant="acme", ts_ms=5)
    assert not event.success and event.error_code == "INF-400" and event.tenant == "acme"


def test_wire_models_are_frozen() -> None:
    request = InferenceRequest(id="a", prompt="b")
    with pytest.raises(ValueError):
        request.id = "c"  # type: ignore[misc]


@pytest.mark.parametrize(
    "reply_to",
    [
        "laneway.replies.é",
        "laneway.replies." + "a" * 240,
        "laneway.replies.a b",
        "laneway.replies.\u0661",
    ],
)
def test_reply_topics_must_be_valid_kafka_topic_names(reply_to: str) -> None:
    with pytest.raises(InvalidRequest, match="reply_to"):
        parse_request(raw(reply_to=reply_to), LIMITS)


def test_lone_surrogates_are_refused_not_crashed_on() -> None:
    record = b'{"id": "r", "prompt": "bad \\ud800 text"}'
    with pytest.raises(InvalidRequest, match="Invalid JSON"):  # pydantic refuses them
        parse_request(record, LIMITS)
    assert peek_reply_address(b'{"id": "\\ud800"}', LIMITS) is None
    assert peek_reply_address(record, LIMITS) == ("r", "laneway.replies")


def test_deeply_nested_json_is_refused_not_crashed_on() -> None:
    record = b"[" * 10_000 + b"]" * 10_000
    with pytest.raises(InvalidRequest):
        parse_request(record, LIMITS)
    assert peek_reply_address(record, LIMITS) is None


def test_tenants_can_be_confined_to_their_own_reply_topics() -> None:
    strict = RequestLimits(tenant_reply_topics=True)
    ok = ["laneway.replies.acme", "laneway.replies.acme.bot-1"]
    for reply_to in ok:
        assert parse_request(raw(tenant="acme", reply_to=reply_to), strict).reply_to == reply_to
    for reply_to in ["laneway.replies.globex", "laneway.replies.acmex", None]:
        with pytest.raises(InvalidRequest, match="tenant 'acme' may only reply to"):
            parse_request(raw(tenant="acme", reply_to=reply_to), strict)
    assert parse_request(raw(reply_to="laneway.replies.any"), strict)  # no tenant named
    assert parse_request(raw(tenant="acme", reply_to="laneway.replies.globex"), LIMITS)
    # The INF-400 for a refused one never goes to the other tenant's topic.
    refused = raw(tenant="acme", reply_to="laneway.replies.globex")
    assert peek_reply_address(refused, strict) == ("req-1", "laneway.replies")
    own = raw(tenant="acme", reply_to="laneway.replies.acme", max_tokens=0)
    assert peek_reply_address(own, strict) == ("req-1", "laneway.replies.acme")


def test_a_lane_record_a_worker_cannot_read_still_names_its_client() -> None:
    newer = {
        "schema_version": 2,
        "request": {"id": "req-7", "prompt": "hi", "tenant": "acme"},
        "reply_to": "laneway.replies.acme",
    }
    assert peek_routed_address(json.dumps(newer).encode(), LIMITS) == (
        "req-7",
        "laneway.replies.acme",
    )
    foreign = {**newer, "reply_to": "orders.created"}
    assert peek_routed_address(json.dumps(foreign).encode(), LIMITS) == (
        "req-7",
        "laneway.replies",
    )
    for unreadable in (b"\xff", b"[]", b'{"request": "req-7"}', b'{"request": {"id": 7}}'):
        assert peek_routed_address(unreadable, LIMITS) is None


def test_validation_problems_are_described_without_their_values() -> None:
    secret = "my card is 4111 1111 1111 1111"
    with pytest.raises(ValidationError) as caught:
        InferenceRequest.model_validate({"id": 5, "prompt": secret, "max_tokens": "x"})
    text = describe_errors(caught.value)
    assert "id: " in text and "max_tokens: " in text and "4111" not in text
    assert describe_errors(caught.value, limit=1).endswith("; and 1 more")
