"""Putting a streamed answer together as a client reads it (``streams.chunks``)."""

from __future__ import annotations

from schemas.errors import DeadlineExceeded
from schemas.messages import InferenceResult, ResultChunk, Usage
from streams.chunks import StreamAssembler


def chunk(attempt: int, seq: int, delta: str, **fields: object) -> ResultChunk:
    return ResultChunk(id="r", attempt=attempt, seq=seq, delta=delta, **fields)  # type: ignore[arg-type]


def ok(output: str, finish: str = "stop") -> InferenceResult:
    return InferenceResult(
        id="r",
        status="ok",
        output=output,
        finish_reason=finish,  # type: ignore[arg-type]
        usage=Usage(prompt_tokens=3, completion_tokens=2),
    )


def shown(deltas: list) -> str:  # type: ignore[type-arg]
    text = ""
    for delta in deltas:
        text = delta.text if delta.restart else text + delta.text
    return text


def test_chunks_in_order_then_the_result() -> None:
    a = StreamAssembler()
    deltas = a.chunk(chunk(1, 0, "Hel")) + a.chunk(chunk(1, 1, "lo"))
    deltas += a.result(ok("Hello!"))
    assert [d.text for d in deltas] == ["Hel", "lo", "!"]
    assert not any(d.restart for d in deltas)
    last = deltas[-1]
    assert last.finish_reason == "stop" and last.usage is not None
    assert last.usage.total_tokens == 5 and last.result is not None and a.done


def test_duplicates_are_dropped_and_early_chunks_wait_for_their_turn() -> None:
    a = StreamAssembler()
    assert a.chunk(chunk(1, 1, "b")) == []  # early: seq 0 is not here yet
    assert [d.text for d in a.chunk(chunk(1, 0, "a"))] == ["a", "b"]
    assert a.chunk(chunk(1, 0, "a")) == [] and a.chunk(chunk(1, 1, "b")) == []
    assert a.duplicates == 2
    assert a.result(ok("ab"))[0].text == ""
    assert a.result(ok("ab")) == [] and a.duplicates == 3


def test_a_higher_attempt_replaces_the_text_and_a_lower_one_is_stale() -> None:
    a = StreamAssembler()
    deltas = a.chunk(chunk(1, 0, "Once upon"))
    deltas += a.chunk(chunk(2, 1, " time"))  # the new attempt's second chunk comes first
    assert len(deltas) == 1
    deltas += a.chunk(chunk(2, 0, "Once upon a"))
    deltas += a.chunk(chunk(1, 1, " a time"))  # stale: attempt 1 was replaced
    deltas += a.result(ok("Once upon a time."))
    assert [(d.text, d.restart) for d in deltas] == [
        ("Once upon", False),
        ("Once upon a", True),
        (" time", False),
        (".", False),
    ]
    assert shown(deltas) == "Once upon a time." and deltas[-1].attempt == 2


def test_a_result_that_does_not_continue_the_text_shown_restarts_with_all_of_it() -> None:
    a = StreamAssembler()
    deltas = a.chunk(chunk(1, 0, "Paris is"))
    deltas += a.result(ok("The capital is Paris."))  # a chunk was lost, say
    assert deltas[-1].restart and shown(deltas) == "The capital is Paris."


def test_a_new_attempt_that_shows_nothing_before_the_result_still_restarts() -> None:
    a = StreamAssembler()
    deltas = a.chunk(chunk(1, 0, "abc")) + a.chunk(chunk(2, 1, "x"))
    deltas += a.result(ok("abc"))  # attempt 2's first chunk never came
    assert deltas[-1].restart and shown(deltas) == "abc"


def test_an_error_result_ends_the_stream_with_its_reason() -> None:
    a = StreamAssembler()
    a.chunk(chunk(1, 0, "partial"))
    (last,) = a.result(InferenceResult.failure("r", DeadlineExceeded("too late")))
    assert last.finish_reason == "error" and last.restart and last.text == ""
    assert last.result is not None and last.result.error is not None


def test_a_rule_answer_is_one_chunk_of_attempt_0() -> None:
    a = StreamAssembler()
    deltas = a.chunk(chunk(0, 0, "Hi there!", finish_reason="stop"))
    deltas += a.result(ok("Hi there!"))
    assert [d.text for d in deltas] == ["Hi there!", ""] and deltas[-1].attempt == 0


def test_the_sdk_tells_a_chunk_from_a_result_and_anything_else() -> None:
    import pytest

    from streams.client import _chunk_of

    piece = chunk(1, 0, "Hi")
    assert _chunk_of(piece.model_dump_json().encode()) == piece
    assert _chunk_of(ok('He said "result_chunk"').model_dump_json().encode()) is None
    assert _chunk_of(b'["result_chunk"]') is None  # JSON, but no message: not a crash
    with pytest.raises(ValueError):
        _chunk_of(b'{"object": "result_chunk", "id": "r"}')  # a chunk missing its fields
