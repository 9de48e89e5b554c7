"""The fields OpenAI chat clients send, on a laneway request: the ones
laneway implements parse (old requests parse as before), the ones it does
not are refused with a message that names them."""

from __future__ import annotations

import json

import pytest

from schemas.errors import InvalidRequest
from schemas.messages import (
    UNSUPPORTED_FIELDS,
    InferenceRequest,
    RequestLimits,
    parse_request,
)

LIMITS = RequestLimits()


def raw(**fields: object) -> bytes:
    return json.dumps({"id": "r", "prompt": "hi", **fields}).encode()


def refused(**fields: object) -> str:
    with pytest.raises(InvalidRequest) as caught:
        parse_request(raw(**fields), LIMITS)
    return caught.value.message


def test_an_openai_shaped_request_parses() -> None:
    request = parse_request(
        json.dumps(
            {
                "id": "chatcmpl-1",
                "model": "heavy",
                "messages": [
                    {"role": "system", "content": "Be brief."},
                    {"role": "user", "content": "Why is the sky blue?"},
                ],
                "temperature": 0.7,
                "top_p": 0.9,
                "max_completion_tokens": 64,
                "stop": "\n\n",
                "seed": 3,
                "user": "user-1234",
                "n": 1,
            }
        ).encode(),
        LIMITS,
    )
    assert request.model == "heavy" and request.named_model() == "heavy"
    assert request.top_p == 0.9 and request.user == "user-1234" and request.n == 1
    assert request.max_tokens == 64 and request.max_completion_tokens == 64
    assert request.stop == ["\n\n"]
    assert request.schema_version == 1


def test_a_request_without_them_is_what_it_was() -> None:
    request = parse_request(raw(), LIMITS)
    assert request.model is None and request.named_model() is None
    assert request.top_p is None and request.user is None and request.n is None
    assert request.max_tokens == 128 and request.max_completion_tokens is None
    assert parse_request(raw(model="auto"), LIMITS).named_model() is None  # the router's choice


def test_stop_is_one_string_or_a_list() -> None:
    assert parse_request(raw(stop="END"), LIMITS).stop == ["END"]
    assert parse_request(raw(stop=["END", "\n"]), LIMITS).stop == ["END", "\n"]
    assert "stop" in refused(stop="")
    assert "stop" in refused(stop="x" * 65)


def test_a_normalised_request_round_trips() -> None:
    request = parse_request(raw(stop="END", max_completion_tokens=9, top_p=0.5), LIMITS)
    again = InferenceRequest.model_validate_json(request.model_dump_json())
    assert again == request and again.stop == ["END"] and again.max_tokens == 9


def test_max_completion_tokens_is_max_tokens_and_both_must_agree() -> None:
    assert parse_request(raw(max_tokens=9, max_completion_tokens=9), LIMITS).max_tokens == 9
    message = refused(max_tokens=100, max_completion_tokens=50)
    assert "max_tokens=100 and max_completion_tokens=50 disagree" in message
    assert "max_tokens=5000 outside 1..4096" in refused(max_completion_tokens=5000)


@pytest.mark.parametrize("n", [2, 0, -1, "1", True, 1.5])
def test_only_one_answer_is_given(n: object) -> None:
    assert f"n={json.dumps(n)}: laneway answers n=1 only" in refused(n=n)


@pytest.mark.parametrize("top_p", [0, -0.1, 1.01, "high"])
def test_top_p_is_above_0_and_at_most_1(top_p: object) -> None:
    assert "top_p:" in refused(top_p=top_p)


@pytest.mark.parametrize(("fields", "where"), [({"model": ""}, "model"), ({"user": ""}, "user")])
def test_model_and_user_are_not_empty(fields: dict[str, object], where: str) -> None:
    assert f"{where}:" in refused(**fields)


@pytest.mark.parametrize("name", sorted(UNSUPPORTED_FIELDS))
def test_an_openai_field_laneway_lacks_is_refused_by_name(name: str) -> None:
    message = refused(**{name: None})
    assert f"{name} is not supported by laneway" in message


def test_the_unsupported_field_is_named_plainly_among_other_problems() -> None:
    message = refused(response_format={"type": "json_object"}, temperature=5, foo=1)
    assert "response_format is not supported by laneway (structured output)" in message
    assert "temperature:" in message
    assert "foo: not a field of this message" in message
    assert "Extra inputs" not in message
