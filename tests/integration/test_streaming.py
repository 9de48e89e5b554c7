"""Token streaming through the real stack (CONTRACT.md, Streaming): chunks
on the reply topic before the result, joined into the answer, per path and
per sequence of a batch; the SDK's ``stream``; a plain aiokafka client;
rule answers in one chunk; cancelling; ``finish_reason`` and usage."""

from __future__ import annotations

import asyncio
import json
import time
import uuid
from typing import Any

from aiokafka import AIOKafkaConsumer, AIOKafkaProducer, TopicPartition

from schemas.messages import AnswerPath, InferenceRequest, InferenceResult, Lane, ResultChunk
from schemas.settings import Settings
from streams.chunks import StreamAssembler
from streams.client import LanewayClient

from .conftest import produce_to_lane, routed_now

NO_CACHE = {"cache": "bypass"}


class ReplyReader:
    """Every record of a reply topic of its own, from its start: the chunks
    and results of the requests sent to it, as a black-box reader sees them."""

    def __init__(self, settings: Settings) -> None:
        self.settings = settings
        self.topic = f"{settings.kafka.topic_prefix}.replies.stream-{uuid.uuid4().hex[:8]}"
        self.chunks: dict[str, list[ResultChunk]] = {}
        self.results: dict[str, InferenceResult] = {}
        self._consumer: AIOKafkaConsumer | None = None
        self._reader: asyncio.Task[None] | None = None

    async def __aenter__(self) -> ReplyReader:
        from aiokafka.admin import AIOKafkaAdminClient, NewTopic

        options = self.settings.kafka.client_options()
        admin = AIOKafkaAdminClient(**options)
        await admin.start()
        try:
            await admin.create_topics([NewTopic(self.topic, 1, 1)])
        finally:
            await admin.close()
        self._consumer = AIOKafkaConsumer(enable_auto_commit=False, fetch_max_wait_ms=20, **options)
        await self._consumer.start()
        self._consumer.assign([TopicPartition(self.topic, 0)])
        await self._consumer.seek_to_beginning(TopicPartition(self.topic, 0))
        self._reader = asyncio.create_task(self._read())
        return self

    async def _read(self) -> None:
        assert self._consumer is not None
        async for record in self._consumer:
            data = json.loads(record.value)
            if data.get("object") == "result_chunk":
                chunk = ResultChunk.model_validate(data)
                self.chunks.setdefault(chunk.id, []).append(chunk)
            else:
                self.results.setdefault(data["id"], InferenceResult.model_validate(data))

    async def result(self, request_id: str, timeout_s: float = 120.0) -> InferenceResult:
        give_up = time.monotonic() + timeout_s
        while request_id not in self.results:
            assert time.monotonic() < give_up, f"no result for {request_id} in {timeout_s} s"
            await asyncio.sleep(0.05)
        return self.results[request_id]

    async def __aexit__(self, *exc: object) -> None:
        assert self._reader is not None and self._consumer is not None
        self._reader.cancel()
        await asyncio.gather(self._reader, return_exceptions=True)
        await self._consumer.stop()


def joined(chunks: list[ResultChunk]) -> str:
    """The text of the last attempt's chunks, in ``seq`` order, each once."""
    last = max(c.attempt for c in chunks)
    own = {c.seq: c for c in chunks if c.attempt == last}
    assert sorted(own) == list(range(len(own))), "no seq is missing"
    return "".join(own[seq].delta for seq in sorted(own))


def request(prompt: str, max_tokens: int, stream: bool = True, **fields: Any) -> InferenceRequest:
    return InferenceRequest(
        id=f"st-{uuid.uuid4().hex[:10]}",
        prompt=prompt,
        max_tokens=max_tokens,
        stream=stream,
        metadata=NO_CACHE,
        **fields,
    )


async def test_a_streamed_answer_joins_into_the_greedy_answer_on_each_model_path(
    settings: Settings,
) -> None:
    prompt = "Explain why the sky is blue."
    async with ReplyReader(settings) as reader:
        asked: list[tuple[AnswerPath, InferenceRequest, InferenceRequest]] = []
        for path in (AnswerPath.LIGHT, AnswerPath.HEAVY):
            streamed, plain = request(prompt, 40), request(prompt, 40, stream=False)
            for r in (streamed, plain):
                await produce_to_lane(
                    settings, routed_now(r, reader.topic, path=path, lane=Lane.MEDIUM)
                )
            asked.append((path, streamed, plain))
        for path, streamed, plain in asked:
            result, alone = await reader.result(streamed.id), await reader.result(plain.id)
            assert result.status == "ok" and result.path == path, result
            assert result.output == alone.output, "the same greedy answer, streamed or not"
            chunks = reader.chunks[streamed.id]
            assert joined(chunks) == result.output
            assert len(chunks) > 2, "more than one piece before the last chunk"
            assert {c.attempt for c in chunks} == {chunks[0].attempt} and chunks[0].attempt >= 1
            last = max(chunks, key=lambda c: c.seq)
            assert last.finish_reason == result.finish_reason
            assert result.finish_reason == (
                "length" if result.usage.completion_tokens == 40 else "stop"
            )
            assert last.usage == result.usage
            assert result.usage.total_tokens == sum(
                (result.usage.prompt_tokens, result.usage.completion_tokens)
            )
            assert all(c.finish_reason is None for c in chunks if c is not last)
            assert chunks[0].lane == Lane.MEDIUM and chunks[0].path == path
            assert plain.id not in reader.chunks, "no chunks for a request without stream"


async def test_a_batch_of_8_streams_decoded_together_each_get_their_own_chunks_in_order(
    settings: Settings,
) -> None:
    prompts = [f"Tell me one fact about the number {n}." for n in range(8)]
    async with ReplyReader(settings) as reader:
        asked = [request(p, 24) for p in prompts]
        producer = AIOKafkaProducer(**settings.kafka.client_options())
        await producer.start()
        try:
            for r in asked:  # all on the lane before the worker's next batch
                routed = routed_now(r, reader.topic, path=AnswerPath.LIGHT, lane=Lane.MEDIUM)
                await producer.send(
                    settings.lane_topic(Lane.MEDIUM),
                    routed.model_dump_json().encode(),
                    key=r.id.encode(),
                )
            await producer.flush()
        finally:
            await producer.stop()
        results = [await reader.result(r.id) for r in asked]
    assert max(r.timings.batch_size for r in results) > 1, "decoded together"
    for r, result in zip(asked, results, strict=True):
        chunks = reader.chunks[r.id]
        assert [c.seq for c in chunks] == list(range(len(chunks))), "in order, each once"
        assert joined(chunks) == result.output and result.status == "ok"
        assert all(c.id == r.id for c in chunks)


async def test_the_sdk_streams_a_model_answer_and_a_rule_answer(client: LanewayClient) -> None:
    deltas = [
        d
        async for d in client.stream(
            messages=[{"role": "user", "content": "Describe the sea in two sentences."}],
            max_tokens=32,
            metadata=NO_CACHE,
        )
    ]
    *pieces, last = deltas
    assert last.result is not None and last.result.status == "ok"
    assert "".join(d.text for d in deltas) == last.result.output
    assert len(pieces) >= 2 and not any(d.restart for d in deltas)
    assert last.finish_reason in ("stop", "length") and last.usage is not None
    assert last.usage.total_tokens == last.usage.prompt_tokens + last.usage.completion_tokens

    # A rule answer: one chunk (attempt 0) with all of it, then the result.
    text, rule = [d async for d in client.stream("Hello!")]
    assert rule.result is not None and rule.result.path == AnswerPath.RULES
    assert text.text == rule.result.output and rule.text == ""
    assert rule.finish_reason == "stop" and text.attempt == rule.attempt == 0


async def test_a_plain_aiokafka_client_receives_a_stream(settings: Settings) -> None:
    # CONTRACT.md's example client, at aiokafka's defaults, on a topic it made.
    async with ReplyReader(settings) as made:
        reply_to = made.topic
    bootstrap = settings.kafka.bootstrap
    consumer = AIOKafkaConsumer(reply_to, bootstrap_servers=bootstrap, auto_offset_reset="earliest")
    producer = AIOKafkaProducer(bootstrap_servers=bootstrap)
    await consumer.start()
    await producer.start()
    request_id = uuid.uuid4().hex
    message = {
        "id": request_id,
        "prompt": "Write a short poem about rain.",
        "max_tokens": 24,
        "stream": True,
        "reply_to": reply_to,
        "metadata": NO_CACHE,
    }
    attempt, seen, text, result = -1, set(), "", None
    try:
        await producer.send_and_wait(
            f"{settings.kafka.topic_prefix}.requests",
            json.dumps(message).encode(),
            key=request_id.encode(),
        )
        async with asyncio.timeout(120):
            async for record in consumer:
                data = json.loads(record.value)
                if data["id"] != request_id:
                    continue
                if data.get("object") != "result_chunk":
                    result = data
                    break
                if (data["attempt"], data["seq"]) in seen or data["attempt"] < attempt:
                    continue
                seen.add((data["attempt"], data["seq"]))
                if data["attempt"] > attempt:
                    attempt, text = data["attempt"], ""
                text += data["delta"]
    finally:
        await consumer.stop()
        await producer.stop()
    assert result is not None and result["status"] == "ok"
    assert text == result["output"] and len(seen) >= 2
    assert result["finish_reason"] == "length" and result["usage"]["completion_tokens"] == 24


async def test_a_cancelled_stream_stops_its_decode(client: LanewayClient) -> None:
    chunks: list[ResultChunk] = []
    first = asyncio.Event()

    def take(chunk: ResultChunk) -> None:
        chunks.append(chunk)
        first.set()

    request_id = f"cancel-{uuid.uuid4().hex[:8]}"
    future = await client.submit(
        {
            "id": request_id,
            "prompt": "Write a very long story about a dragon and a knight.",
            "max_tokens": 400,
            "stream": True,
            "metadata": NO_CACHE,
        },
        on_chunk=take,
    )
    await asyncio.wait_for(first.wait(), 60)
    await client.cancel(request_id)
    result = await asyncio.wait_for(future, 60)
    assert result.status == "error" and result.error is not None
    assert result.error.code == "INF-503" and "cancelled" in result.error.message
    assert result.finish_reason == "cancelled"
    last = chunks[-1]
    assert last.finish_reason == "cancelled"
    streamed = StreamAssembler()
    for chunk in chunks:
        streamed.chunk(chunk)
    assert len(streamed.text) > 0, "some text came before the cancel"


async def test_an_answer_cut_at_max_tokens_says_length(client: LanewayClient) -> None:
    cut = await client.ask("Write a long story about a dragon.", max_tokens=3, metadata=NO_CACHE)
    whole = await client.ask("Hello!")
    assert cut.status == "ok" and cut.finish_reason == "length"
    assert cut.usage.completion_tokens == 3
    assert whole.finish_reason == "stop"
