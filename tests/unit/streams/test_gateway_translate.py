"""OpenAI chat completion bodies <-> laneway requests and results."""

from __future__ import annotations

from typing import Any

import pytest

from schemas.messages import AnswerPath, InferenceResult, Lane, Usage
from streams.gateway.errors import GatewayError
from streams.gateway.translate import (
    Knobs,
    chunk,
    completion,
    knobs_from_headers,
    laneway_headers,
    parse_request,
    to_request,
)

REPLY = "laneway.replies.gateway-test"


def translate(body: dict[str, Any], **kwargs: Any) -> dict[str, Any]:
    return to_request(
        body, request_id="gw-1", tenant=kwargs.pop("tenant", None), reply_to=REPLY, **kwargs
    )


def test_a_plain_body_becomes_a_request_the_wire_accepts() -> None:
    body = {
        "model": "auto",
        "messages": [
            {"role": "developer", "content": "Be brief."},
            {
                "role": "user",
                "content": [{"type": "text", "text": "Hi"}, {"type": "text", "text": "there"}],
            },
        ],
        "max_tokens": 16,
        "temperature": 0.5,
        "stop": "\n",
        "seed": 7,
        "stream": True,
        "stream_options": {"include_usage": True},
        "presence_penalty": 0.0,
    }
    fields = translate(body, tenant="acme")
    assert fields == {
        "id": "gw-1",
        "reply_to": REPLY,
        "messages": [
            {"role": "system", "content": "Be brief."},
            {"role": "user", "content": "Hi\nthere"},
        ],
        "max_tokens": 16,
        "temperature": 0.5,
        "stop": ["\n"],
        "seed": 7,
        "stream": True,
        "stream_options": {"include_usage": True},
        "tenant": "acme",
    }
    request = parse_request(fields)
    assert request.stop == ["\n"] and request.stream_options is not None


def test_model_auto_or_none_is_no_field_and_another_model_is_passed_on() -> None:
    messages = [{"role": "user", "content": "Hi"}]
    assert "model" not in translate({"messages": messages})
    assert "model" not in translate({"messages": messages, "model": "auto"})
    assert translate({"messages": messages, "model": "heavy"})["model"] == "heavy"


def test_new_wire_fields_are_passed_on_only_when_sent() -> None:
    messages = [{"role": "user", "content": "Hi"}]
    plain = translate({"messages": messages, "max_tokens": None, "temperature": None})
    assert set(plain) == {"id", "reply_to", "messages"}
    sent = translate(
        {"messages": messages, "top_p": 0.9, "user": "u1", "n": 1, "max_completion_tokens": 9}
    )
    assert (sent["top_p"], sent["user"], sent["n"], sent["max_completion_tokens"]) == (
        0.9,
        "u1",
        1,
        9,
    )


def test_a_clients_own_tenant_cannot_be_sent() -> None:
    with pytest.raises(GatewayError, match="unrecognized request argument supplied: tenant"):
        translate({"messages": [{"role": "user", "content": "Hi"}], "tenant": "other"})


def test_knobs_come_from_headers() -> None:
    knobs = knobs_from_headers(
        {
            "X-Laneway-Lane": "bulk",
            "X-Laneway-Deadline-Ms": "1500",
            "X-Laneway-Session": "s-1",
            "X-Laneway-Cache": "bypass",
        }
    )
    assert knobs == Knobs(lane=Lane.BULK, deadline_ms=1500, session_id="s-1", cache="bypass")
    fields = translate({"messages": [{"role": "user", "content": "Hi"}]}, knobs=knobs)
    assert (fields["lane"], fields["deadline_ms"], fields["session_id"]) == ("bulk", 1500, "s-1")
    assert fields["metadata"] == {"cache": "bypass"}
    assert knobs_from_headers({}) == Knobs()


def test_both_cache_directives_are_one_header_as_on_the_wire() -> None:
    knobs = knobs_from_headers({"X-Laneway-Cache": "bypass, no-store"})
    fields = translate({"messages": [{"role": "user", "content": "Hi"}]}, knobs=knobs)
    assert fields["metadata"] == {"cache": "bypass, no-store"}


@pytest.mark.parametrize(
    "headers",
    [
        {"X-Laneway-Lane": "fast"},
        {"X-Laneway-Deadline-Ms": "-5"},
        {"X-Laneway-Deadline-Ms": "soon"},
        {"X-Laneway-Cache": "off"},
        {"X-Laneway-Cache": "bypass, off"},
        {"X-Laneway-Session": ""},
    ],
)
def test_bad_knobs_are_400(headers: dict[str, str]) -> None:
    with pytest.raises(GatewayError) as caught:
        knobs_from_headers(headers)
    assert caught.value.status == 400 and caught.value.code == "INF-400"


@pytest.mark.parametrize(
    ("body", "param"),
    [
        ({}, "messages"),
        ({"messages": "Hi"}, "messages"),
        ({"messages": [{"role": "tool", "content": "x"}]}, "messages[0].role"),
        ({"messages": [{"role": "user", "content": 5}]}, "messages[0].content"),
        (
            {"messages": [{"role": "user", "content": [{"type": "image_url", "image_url": {}}]}]},
            "messages[0].content",
        ),
        ({"messages": [{"role": "user", "content": "Hi"}], "n": 2}, "n"),
        (
            {"messages": [{"role": "user", "content": "Hi"}], "tools": [{"type": "function"}]},
            "tools",
        ),
        ({"messages": [{"role": "user", "content": "Hi"}], "logprobs": True}, "logprobs"),
        (
            {
                "messages": [{"role": "user", "content": "Hi"}],
                "response_format": {"type": "json_object"},
            },
            "response_format",
        ),
        ({"messages": [{"role": "user", "content": "Hi"}], "frobnicate": 1}, "frobnicate"),
    ],
)
def test_what_cannot_be_translated_is_400_naming_the_param(
    body: dict[str, Any], param: str
) -> None:
    with pytest.raises(GatewayError) as caught:
        translate(body)
    assert (caught.value.status, caught.value.param) == (400, param)


def test_what_the_wire_refuses_is_400_before_any_produce() -> None:
    with pytest.raises(GatewayError, match="'messages' must not be empty"):
        parse_request(translate({"messages": []}))
    with pytest.raises(GatewayError, match="temperature") as caught:
        parse_request(
            translate({"messages": [{"role": "user", "content": "Hi"}], "temperature": 3})
        )
    assert caught.value.param == "temperature"


def test_a_result_becomes_a_chat_completion() -> None:
    result = InferenceResult(
        id="gw-1",
        status="ok",
        output="Blue.",
        lane=Lane.REALTIME,
        path=AnswerPath.LIGHT,
        model="smollm2-135m",
        version="q4_1",
        usage=Usage(prompt_tokens=5, completion_tokens=2),
        finish_reason="length",
    )
    body = completion(result, created=1, model="auto")
    assert body == {
        "id": "chatcmpl-gw-1",
        "object": "chat.completion",
        "created": 1,
        "model": "smollm2-135m",
        "system_fingerprint": "q4_1",
        "choices": [
            {
                "index": 0,
                "message": {"role": "assistant", "content": "Blue."},
                "logprobs": None,
                "finish_reason": "length",
            }
        ],
        "usage": {"prompt_tokens": 5, "completion_tokens": 2, "total_tokens": 7},
    }
    headers = laneway_headers(
        request_id="gw-1", lane=result.lane, path=result.path, model=result.model, version="q4_1"
    )
    assert headers == {
        "X-Laneway-Request-Id": "gw-1",
        "X-Laneway-Lane": "realtime",
        "X-Laneway-Path": "light",
        "X-Laneway-Cache-Hit": "false",
        "X-Laneway-Model": "smollm2-135m",
        "X-Laneway-Version": "q4_1",
    }
    rule = laneway_headers(request_id="r", lane=None, path=AnswerPath.RULES, model="rules:greeting")
    assert rule["X-Laneway-Rule"] == "greeting" and "X-Laneway-Lane" not in rule


def test_chunks_carry_one_choice_or_the_usage() -> None:
    piece = chunk("gw-1", created=1, model="m", delta={"content": "Hi"})
    assert piece["object"] == "chat.completion.chunk"
    assert piece["choices"] == [
        {"index": 0, "delta": {"content": "Hi"}, "logprobs": None, "finish_reason": None}
    ]
    last = chunk("gw-1", created=1, model="m", delta={}, finish="stop")
    assert last["choices"][0]["finish_reason"] == "stop"
    usage = chunk("gw-1", created=1, model="m", usage={"total_tokens": 3})
    assert usage["choices"] == [] and usage["usage"] == {"total_tokens": 3}
