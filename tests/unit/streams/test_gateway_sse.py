"""What an SSE stream sends (streams.gateway.sse): its events, and what it
does when laneway restarts an answer."""

from __future__ import annotations

import json
from typing import Any

import pytest

from schemas.errors import BackendUnavailable
from schemas.messages import InferenceResult, Usage
from streams.chunks import StreamDelta
from streams.gateway.sse import AnswerRestarted, ChunkEvents, Stitch


def test_deltas_go_out_as_they_come() -> None:
    stitch = Stitch()
    assert [stitch.feed(t) for t in ("The ", "sky ", "is blue.")] == ["The ", "sky ", "is blue."]
    stitch.finish()


def test_a_restart_that_repeats_the_text_sent_continues_after_it() -> None:
    stitch = Stitch()
    assert stitch.feed("The sky ") == "The sky "
    assert stitch.feed("The ", restart=True) == "", "behind what was sent: nothing yet"
    assert stitch.feed("sky is") == "is"
    assert stitch.feed(" blue.") == " blue."
    stitch.finish()
    assert stitch.sent == "The sky is blue."


def test_a_restart_that_contradicts_the_text_sent_ends_the_stream() -> None:
    stitch = Stitch()
    stitch.feed("The sky is green")
    with pytest.raises(AnswerRestarted, match="16 characters were sent"):
        stitch.feed("The sky is blue", restart=True)


def test_an_answer_that_ends_short_of_the_text_sent_is_an_error() -> None:
    stitch = Stitch()
    stitch.feed("The sky is blue.")
    stitch.feed("The sky", restart=True)
    with pytest.raises(AnswerRestarted):
        stitch.finish()


def test_a_restart_before_anything_was_sent_is_free() -> None:
    stitch = Stitch()
    assert stitch.feed("") == ""
    assert stitch.feed("Other", restart=True) == "Other"
    stitch.finish()


def events(*deltas: StreamDelta, include_usage: bool = False) -> tuple[list[Any], ChunkEvents]:
    """Every event's data (JSON decoded, ``[DONE]`` as it is)."""
    sse = ChunkEvents("gw-1", model="m", created=1, include_usage=include_usage)
    out = [*sse.start()]
    for delta in deltas:
        out.extend(sse.delta(delta))
    return [d if d == "[DONE]" else json.loads(d) for d in out], sse


def result(output: str | None = "Blue sky", **fields: Any) -> InferenceResult:
    return InferenceResult(
        id="gw-1",
        status="ok" if output is not None else "error",
        output=output,
        usage=Usage(prompt_tokens=3, completion_tokens=2),
        finish_reason="stop",
        **fields,
    )


def test_a_stream_is_a_role_delta_its_text_a_finish_the_usage_and_done() -> None:
    out, sse = events(
        StreamDelta("Blue"),
        StreamDelta(" sky"),
        StreamDelta("", finish_reason="stop", result=result()),
        include_usage=True,
    )
    assert out[0]["choices"][0]["delta"] == {"role": "assistant", "content": ""}
    assert [c["choices"][0]["delta"]["content"] for c in out[1:3]] == ["Blue", " sky"]
    assert out[3]["choices"][0] == {
        "index": 0,
        "delta": {},
        "logprobs": None,
        "finish_reason": "stop",
    }
    assert out[4]["choices"] == [] and out[4]["usage"]["total_tokens"] == 5
    assert out[5] == "[DONE]" and sse.ended and sse.error is None
    no_usage, _ = events(StreamDelta("Blue sky", result=result()))
    assert [e if e == "[DONE]" else e["choices"][0]["finish_reason"] for e in no_usage] == [
        None,
        None,
        "stop",
        "[DONE]",
    ]


def test_an_error_result_mid_stream_ends_it_with_an_error_event_and_no_done() -> None:
    failed = InferenceResult.failure("gw-1", BackendUnavailable("every path failed"))
    out, sse = events(StreamDelta("Blue"), StreamDelta("", restart=True, result=failed))
    assert out[-1] == {
        "error": {
            "message": "every path failed",
            "type": "server_error",
            "param": None,
            "code": "INF-502",
        }
    }
    assert "[DONE]" not in out and sse.ended and sse.error is not None
    assert sse.delta(StreamDelta("more")) == [], "nothing after the end"


def test_a_restart_that_contradicts_the_text_sent_ends_with_answer_restarted() -> None:
    out, sse = events(StreamDelta("Blue sky"), StreamDelta("Green", restart=True))
    assert out[-1]["error"]["code"] == "answer_restarted" and sse.ended
    out, sse = events(
        StreamDelta("Blue sky"),
        StreamDelta("Blue", restart=True),
        StreamDelta(" sky", result=result()),
    )
    assert out[-1] == "[DONE]" and sse.error is None, "a repeat of the text sent goes on"
    assert "".join(e["choices"][0]["delta"].get("content", "") for e in out[:-1]) == "Blue sky"
