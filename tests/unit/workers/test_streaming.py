"""A streamed request's chunks as a lane worker sends them
(``workers.streaming.AnswerStream``), without a broker: what it would
produce is collected in order."""

from __future__ import annotations

import asyncio
import json
import time
from collections.abc import Awaitable

import pytest

from schemas.errors import DeadlineExceeded
from schemas.messages import (
    AnswerPath,
    InferenceRequest,
    InferenceResult,
    Lane,
    ResultChunk,
    RoutedRequest,
    Usage,
)
from schemas.settings import StreamSettings
from streams.kafka.envelopes import Outbound
from workers.streaming import AnswerStream, StreamAttempts


class Produced:
    """What the stream queued on the producer, acknowledged at once."""

    def __init__(self) -> None:
        self.records: list[Outbound] = []

    async def send(self, record: Outbound) -> Awaitable[object]:
        self.records.append(record)
        done: asyncio.Future[object] = asyncio.get_running_loop().create_future()
        done.set_result(None)
        return done

    @property
    def chunks(self) -> list[ResultChunk]:
        return [ResultChunk.model_validate_json(r.value) for r in self.records]


def routed() -> RoutedRequest:
    now = int(time.time() * 1000)
    return RoutedRequest(
        request=InferenceRequest(id="r-1", prompt="hi", stream=True),
        lane=Lane.MEDIUM,
        path=AnswerPath.LIGHT,
        reply_to="laneway.replies.t",
        produced_at_ms=now,
        routed_at_ms=now,
    )


def ok(output: str, path: AnswerPath = AnswerPath.LIGHT) -> InferenceResult:
    return InferenceResult(
        id="r-1",
        status="ok",
        output=output,
        path=path,
        finish_reason="length",
        usage=Usage(prompt_tokens=4, completion_tokens=9),
    )


def stream(
    produced: Produced, attempts: StreamAttempts | None = None, **settings: float
) -> AnswerStream:
    return AnswerStream(
        routed(),
        Lane.MEDIUM,
        produced.send,
        attempts or StreamAttempts(None, prefix="t", ttl_s=60),
        StreamSettings(**settings),  # type: ignore[arg-type]
    )


async def test_the_first_piece_goes_at_once_and_later_ones_are_coalesced() -> None:
    produced = Produced()
    answer = stream(produced, flush_ms=1000, max_pieces=100)
    answer.begin(AnswerPath.LIGHT, "llamacpp:smollm2-135m")
    answer.text("Hello")
    await asyncio.sleep(0.01)
    assert [c.delta for c in produced.chunks] == ["Hello"]
    for piece in (",", " wor", "ld"):
        answer.text(piece)
    await asyncio.sleep(0.01)
    assert len(produced.records) == 1, "within the flush interval: held"
    await answer.finish(ok("Hello, world!"))
    chunks = produced.chunks
    assert [c.delta for c in chunks] == ["Hello", ", world!"]
    assert [c.seq for c in chunks] == [0, 1] and {c.attempt for c in chunks} == {1}
    assert chunks[-1].finish_reason == "length" and chunks[-1].usage == ok("").usage
    assert chunks[0].model == "llamacpp:smollm2-135m" and chunks[0].lane == Lane.MEDIUM
    assert all(r.topic == "laneway.replies.t" and r.key == b"r-1" for r in produced.records)


async def test_a_chunk_goes_early_once_max_pieces_wait() -> None:
    produced = Produced()
    answer = stream(produced, flush_ms=10_000, max_pieces=3)
    answer.begin(AnswerPath.LIGHT, None)
    answer.text("a")
    await asyncio.sleep(0.01)
    for piece in "bcd":
        answer.text(piece)
    await asyncio.sleep(0.01)
    assert [c.delta for c in produced.chunks] == ["a", "bcd"]
    await answer.finish(ok("abcd"))
    assert [c.delta for c in produced.chunks] == ["a", "bcd", ""]


async def test_a_fallback_path_starts_a_new_attempt() -> None:
    produced = Produced()
    answer = stream(produced, flush_ms=0)
    answer.begin(AnswerPath.LIGHT, "light-model")
    answer.text("The ans")
    await asyncio.sleep(0.01)
    answer.begin(AnswerPath.HEAVY, "heavy-model")  # light failed: heavy decodes it again
    answer.text("An answer")
    await asyncio.sleep(0.01)
    await answer.finish(ok("An answer.", AnswerPath.HEAVY))
    chunks = produced.chunks
    assert [(c.attempt, c.seq, c.delta) for c in chunks] == [
        (1, 0, "The ans"),
        (2, 0, "An answer"),
        (2, 1, "."),
    ]
    assert chunks[1].model == "heavy-model"


async def test_text_that_the_answer_does_not_continue_is_replaced_by_a_new_attempt() -> None:
    produced = Produced()
    answer = stream(produced, flush_ms=0)
    answer.begin(AnswerPath.LIGHT, None)
    answer.text("Paris")
    await asyncio.sleep(0.01)
    await answer.finish(ok("It is Paris."))  # another worker's answer, from the cache
    assert [(c.attempt, c.delta) for c in produced.chunks] == [(1, "Paris"), (2, "It is Paris.")]


async def test_a_request_answered_without_a_decode_gets_one_chunk() -> None:
    produced = Produced()
    await stream(produced).finish(ok("cached"))
    (only,) = produced.chunks
    assert (only.attempt, only.seq, only.delta, only.finish_reason) == (1, 0, "cached", "length")


async def test_an_error_ends_the_attempt_it_interrupts() -> None:
    produced = Produced()
    answer = stream(produced, flush_ms=0)
    answer.begin(AnswerPath.LIGHT, None)
    answer.text("half")
    await asyncio.sleep(0.01)
    await answer.finish(InferenceResult.failure("r-1", DeadlineExceeded("cut off")))
    assert [(c.attempt, c.delta, c.finish_reason) for c in produced.chunks] == [
        (1, "half", None),
        (1, "", "error"),
    ]


async def test_an_abandoned_stream_sends_nothing_more() -> None:
    produced = Produced()
    answer = stream(produced, flush_ms=10_000)
    answer.begin(AnswerPath.LIGHT, None)
    answer.text("a")
    await asyncio.sleep(0.01)
    answer.text("b")
    await answer.abandon()
    answer.text("c")
    await asyncio.sleep(0.01)
    assert [c.delta for c in produced.chunks] == ["a"]


async def test_attempts_are_numbered_per_request_and_fail_open() -> None:
    local = StreamAttempts(None, prefix="t", ttl_s=60)
    assert [await local.next("a"), await local.next("a"), await local.next("b")] == [1, 2, 1]

    import redis.asyncio as aioredis
    from redis.asyncio.retry import Retry
    from redis.backoff import NoBackoff

    unreachable = aioredis.Redis(
        host="127.0.0.1", port=9, socket_connect_timeout=0.2, retry=Retry(NoBackoff(), 0)
    )
    attempts = StreamAttempts(unreachable, prefix="t", ttl_s=60)
    assert await attempts.next("a") is None
    produced = Produced()
    answer = stream(produced, attempts, flush_ms=0)
    answer.begin(AnswerPath.LIGHT, None)
    answer.text("lost")
    await asyncio.sleep(0.05)
    await answer.finish(ok("lost and found"))
    assert produced.records == [], "Redis cannot number it: the result alone carries the text"
    await unreachable.aclose()


@pytest.mark.parametrize("pieces", [["a"], ["a", "b", "c"]])
async def test_chunks_are_json_a_plain_client_tells_from_a_result(pieces: list[str]) -> None:
    produced = Produced()
    answer = stream(produced, flush_ms=0)
    answer.begin(AnswerPath.LIGHT, None)
    for piece in pieces:
        answer.text(piece)
        await asyncio.sleep(0.01)
    await answer.finish(ok("".join(pieces)))
    for record in produced.records:
        assert json.loads(record.value)["object"] == "result_chunk"
