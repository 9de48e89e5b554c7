"""Async client SDK: submit requests, get their results.

    async with LanewayClient(kafka_settings) as client:
        result = await client.ask("Where is my order?", deadline_ms=2000)

Each client reads its reply topic (``laneway.replies.<client id>`` by
default) from the end, by manual assignment (no consumer group), and matches
replies to requests by id. A duplicate reply, which at-least-once delivery
can produce after a redelivery, is dropped and counted.

The client id is ``client_id=``, else ``LANEWAY_KAFKA_CLIENT_ID``, else
``client-<host>-<program>`` (``default_client_id``): stable across restarts,
so a program leaves one reply topic behind, not one per run. Clients that
share a reply topic each see all its replies and keep only their own ids.
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import logging
import re
import socket
import sys
import uuid
from collections import OrderedDict
from collections.abc import AsyncGenerator, Callable, Mapping, Sequence
from pathlib import Path
from typing import TYPE_CHECKING, Any

from aiokafka import AIOKafkaConsumer, AIOKafkaProducer, TopicPartition
from aiokafka.admin import AIOKafkaAdminClient, NewTopic
from aiokafka.errors import TopicAlreadyExistsError

from schemas.messages import (
    CancelRequest,
    ChatMessage,
    Feedback,
    InferenceRequest,
    InferenceResult,
    ResultChunk,
)
from schemas.settings import KafkaSettings
from streams.chunks import StreamAssembler, StreamDelta

if TYPE_CHECKING:
    from schemas.jobs import BatchJob
    from schemas.settings import Settings

__all__ = ["LanewayClient", "default_client_id"]

log = logging.getLogger(__name__)

RecordHeaders = Sequence[tuple[str, bytes]]
"""Headers to put on a request record, as Kafka takes them."""


def default_client_id() -> str:
    """``client-<host>-<program>``, in the characters a topic name allows."""
    host = socket.gethostname().split(".")[0] or "host"
    program = Path(sys.argv[0]).stem if sys.argv and sys.argv[0] else ""
    name = f"client-{host}-{program or 'python'}"
    return re.sub(r"[^A-Za-z0-9._-]+", "-", name)[:200]


class LanewayClient:
    def __init__(
        self,
        kafka: KafkaSettings,
        *,
        client_id: str | None = None,
        reply_to: str | None = None,
        remember: int = 100_000,
    ) -> None:
        self.kafka = kafka
        self.client_id = client_id or kafka.client_id or default_client_id()
        self.reply_to = reply_to or f"{kafka.topic_prefix}.replies.{self.client_id}"
        self.duplicates = 0
        self._requests_topic = f"{kafka.topic_prefix}.requests"
        self._feedback_topic = f"{kafka.topic_prefix}.feedback"
        self._cancels_topic = f"{kafka.topic_prefix}.cancels"
        self._pending: dict[str, asyncio.Future[InferenceResult]] = {}
        self._listeners: dict[str, Callable[[ResultChunk], None]] = {}
        """Streamed requests in flight: who is handed their chunks."""
        self._done: OrderedDict[str, None] = OrderedDict()
        self._remember = remember
        self._producer: AIOKafkaProducer | None = None
        self._consumer: AIOKafkaConsumer | None = None
        self._reader: asyncio.Task[None] | None = None

    async def __aenter__(self) -> LanewayClient:
        await self.start()
        return self

    async def __aexit__(self, *exc: object) -> None:
        await self.close()

    async def start(self) -> None:
        options = self.kafka.client_options()
        await self._ensure_reply_topic(options)
        self._producer = AIOKafkaProducer(
            acks="all",
            enable_idempotence=self.kafka.enable_idempotence,
            **options,
        )
        await self._producer.start()
        self._consumer = AIOKafkaConsumer(
            enable_auto_commit=False, fetch_max_wait_ms=self.kafka.fetch_max_wait_ms, **options
        )
        await self._consumer.start()
        partitions = await self._partitions(self.reply_to)
        self._consumer.assign(partitions)
        await self._consumer.seek_to_end(*partitions)
        for tp in partitions:  # resolve positions now, so no reply is missed
            await self._consumer.position(tp)
        self._reader = asyncio.create_task(self._read_replies())

    async def _ensure_reply_topic(self, options: dict[str, Any]) -> None:
        admin = AIOKafkaAdminClient(**options)
        await admin.start()
        try:
            if self.reply_to not in await admin.list_topics():
                with contextlib.suppress(TopicAlreadyExistsError):
                    await admin.create_topics(
                        [
                            NewTopic(
                                self.reply_to,
                                num_partitions=self.kafka.partitions,
                                replication_factor=self.kafka.replication_factor,
                            )
                        ]
                    )
        finally:
            await admin.close()

    async def _partitions(self, topic: str) -> list[TopicPartition]:
        assert self._consumer is not None
        for _ in range(100):
            found = self._consumer.partitions_for_topic(topic)
            if found:
                return [TopicPartition(topic, p) for p in sorted(found)]
            await self._consumer._client.force_metadata_update()
            await asyncio.sleep(0.1)
        raise RuntimeError(f"reply topic {topic} has no partitions")

    async def submit(
        self,
        request: InferenceRequest | dict[str, Any],
        *,
        timestamp_ms: int | None = None,
        on_chunk: Callable[[ResultChunk], None] | None = None,
        headers: RecordHeaders | None = None,
    ) -> asyncio.Future[InferenceResult]:
        """Produce a request; the future resolves with its result.

        ``timestamp_ms`` backdates the record to when the request was created
        (a client that queued it locally): its deadline counts from then.
        ``on_chunk`` is handed each ``result_chunk`` of a streamed request as
        it arrives, duplicates and all (``streams.chunks`` puts them together;
        ``stream`` does it for you). ``headers`` go on the record as they are:
        a W3C ``traceparent`` (and ``tracestate``) makes laneway's spans of
        the request children of the caller's (CONTRACT.md, Headers)."""
        if isinstance(request, dict):
            request = InferenceRequest.model_validate({"reply_to": self.reply_to, **request})
        return await self.submit_raw(
            request.model_dump_json().encode(),
            request.id,
            key=request.partition_key(),
            timestamp_ms=timestamp_ms,
            on_chunk=on_chunk,
            headers=headers,
        )

    async def submit_raw(
        self,
        value: bytes,
        request_id: str,
        *,
        key: bytes | None = None,
        timestamp_ms: int | None = None,
        on_chunk: Callable[[ResultChunk], None] | None = None,
        headers: RecordHeaders | None = None,
    ) -> asyncio.Future[InferenceResult]:
        """Produce a record as it is (replays, malformed-input tests); the
        future resolves if a reply with ``request_id`` comes back."""
        if self._producer is None:
            raise RuntimeError("client not started")
        if request_id in self._pending:
            raise ValueError(f"request id {request_id!r} is already in flight")
        # A reused id (a retry after INF-429, say) is a new request: forget
        # the old answer so the new one is not taken for its duplicate.
        self._done.pop(request_id, None)
        future: asyncio.Future[InferenceResult] = asyncio.get_running_loop().create_future()
        self._pending[request_id] = future
        if on_chunk is not None:
            self._listeners[request_id] = on_chunk
        try:
            await self._producer.send_and_wait(
                self._requests_topic,
                value,
                key=key,
                timestamp_ms=timestamp_ms,
                headers=list(headers) if headers else None,
            )
        except BaseException:
            self._pending.pop(request_id, None)
            self._listeners.pop(request_id, None)
            raise
        return future

    async def ask(
        self,
        prompt: str | None = None,
        *,
        messages: Sequence[ChatMessage | Mapping[str, str]] | None = None,
        timeout_s: float = 60.0,
        **fields: Any,
    ) -> InferenceResult:
        """Submit one prompt (or chat ``messages``) and wait for its result."""
        request = self._request(prompt, messages, fields)
        future = await self.submit(request)
        try:
            return await asyncio.wait_for(future, timeout_s)
        finally:
            self._pending.pop(request["id"], None)

    async def stream(
        self,
        prompt: str | None = None,
        *,
        messages: Sequence[ChatMessage | Mapping[str, str]] | None = None,
        timeout_s: float = 60.0,
        headers: RecordHeaders | None = None,
        **fields: Any,
    ) -> AsyncGenerator[StreamDelta, None]:
        """Submit one prompt (or chat ``messages``) with ``stream: true`` and
        yield its answer's text as it is generated::

            async for delta in client.stream("Tell me a story"):
                if delta.restart:  # another attempt replaced the text shown
                    screen.clear()
                screen.write(delta.text)

        The last delta has ``finish_reason`` (``error`` when it failed:
        ``delta.result.error`` says why), ``usage`` and the ``result``; the
        deltas since the last ``restart`` join into its output. Leaving the
        loop early cancels the request (``cancel``): its decode stops.
        ``timeout_s`` bounds the whole answer (``TimeoutError``); ``headers``
        go on the request record (``submit``)."""
        request = self._request(prompt, messages, {**fields, "stream": True})
        request_id = request["id"]
        queue: asyncio.Queue[ResultChunk | InferenceResult] = asyncio.Queue()
        assembler = StreamAssembler()
        try:
            future = await self.submit(request, on_chunk=queue.put_nowait, headers=headers)
            future.add_done_callback(
                lambda done: None if done.cancelled() else queue.put_nowait(done.result())
            )
            async with asyncio.timeout(timeout_s):
                while not assembler.done:
                    item = await queue.get()
                    deltas = (
                        assembler.chunk(item)
                        if isinstance(item, ResultChunk)
                        else assembler.result(item)
                    )
                    for delta in deltas:
                        yield delta
        except TimeoutError:
            raise TimeoutError(
                f"no complete answer to {request_id} within {timeout_s:.0f}s"
            ) from None
        finally:
            self._listeners.pop(request_id, None)
            self._pending.pop(request_id, None)
            self.duplicates += assembler.duplicates
            if not assembler.done and self._producer is not None:
                with contextlib.suppress(Exception):
                    await asyncio.shield(self.cancel(request_id))

    def forget(self, request_id: str) -> None:
        """Stop waiting for ``request_id`` (a caller that gave up on it): its
        future and chunk listener are dropped; a late reply is ignored."""
        self._pending.pop(request_id, None)
        self._listeners.pop(request_id, None)

    async def cancel(self, request_id: str) -> None:
        """Say that the answer to ``request_id`` is no longer wanted: a
        worker decoding it stops, and its result says it was cancelled."""
        if self._producer is None:
            raise RuntimeError("client not started")
        cancel = CancelRequest(id=request_id)
        await self._producer.send_and_wait(
            self._cancels_topic, cancel.model_dump_json().encode(), key=request_id.encode()
        )

    def _request(
        self,
        prompt: str | None,
        messages: Sequence[ChatMessage | Mapping[str, str]] | None,
        fields: Mapping[str, Any],
    ) -> dict[str, Any]:
        """A request's fields: the prompt or the messages, a fresh id unless given."""
        request = {"id": f"{self.client_id}-{uuid.uuid4().hex[:12]}", **fields}
        if prompt is not None:
            request["prompt"] = prompt
        if messages is not None:
            request["messages"] = [
                m.model_dump() if isinstance(m, ChatMessage) else dict(m) for m in messages
            ]
        return request

    async def feedback(self, request_id: str, score: float, comment: str | None = None) -> None:
        """Tell the quality loop how good an answer was (-1 bad .. +1 good);
        a bad score lowers the quality of the path that answered it."""
        if self._producer is None:
            raise RuntimeError("client not started")
        verdict = Feedback(request_id=request_id, score=score, comment=comment)
        await self._producer.send_and_wait(
            self._feedback_topic, verdict.model_dump_json().encode(), key=request_id.encode()
        )

    async def submit_batch(
        self,
        source: Path | str | bytes | Sequence[Mapping[str, Any]],
        *,
        settings: Settings,
        tenant: str | None = None,
        window_s: int | None = None,
        skip_invalid: bool = False,
        job_id: str | None = None,
    ) -> BatchJob:
        """Submit a batch job (``laneway batch submit``): a JSONL file's path
        or bytes, or its lines as objects. Returns once every line is
        produced, with this client's producer; ``settings`` names the Redis
        that keeps the job. The same input under the same tenant is the same
        job, resumed where it stopped, unless ``job_id`` names the job (then
        that job is created or resumed). ``InvalidBatchFile`` lists every bad
        line unless ``skip_invalid``."""
        from streams.jobs.submit import submit_file

        if isinstance(source, bytes):
            data = source
        elif isinstance(source, Path | str):
            data = await asyncio.to_thread(Path(source).read_bytes)
        else:
            data = b"".join(json.dumps(dict(line)).encode() + b"\n" for line in source)
        return await submit_file(
            settings,
            data,
            tenant=tenant,
            window_s=window_s,
            skip_invalid=skip_invalid,
            producer=self._producer,
            job_id=job_id,
        )

    async def cancel_batch(self, job_id: str, *, settings: Settings) -> tuple[bool, BatchJob]:
        """Cancel a batch job that is not final (``laneway batch cancel``),
        its move published with this client's producer: ``(cancelled now,
        job)``. ``KeyError`` when there is no such job."""
        from streams.jobs.progress import cancel_job

        if self._producer is None:
            raise RuntimeError("client not started")
        return await cancel_job(settings, job_id, self._producer)

    async def batch_status(self, job_id: str, *, settings: Settings) -> BatchJob | None:
        """The job's status and counts, ``None`` when there is no such job."""
        from streams.jobs.progress import get_job

        return await get_job(settings, job_id)

    async def _read_replies(self) -> None:
        assert self._consumer is not None
        async for record in self._consumer:
            value = record.value or b""
            try:
                chunk = _chunk_of(value)
                if chunk is not None:
                    listener = self._listeners.get(chunk.id)
                    if listener is not None:
                        listener(chunk)
                    continue
                result = InferenceResult.model_validate_json(value)
            except ValueError:
                log.warning("undecodable reply on %s: %.200r", record.topic, record.value)
                continue
            self._deliver(result)

    def _deliver(self, result: InferenceResult) -> None:
        if result.id in self._done:
            self.duplicates += 1
            return
        future = self._pending.pop(result.id, None)
        if future is None:
            return  # someone else's reply on a shared topic, or a late one
        self._listeners.pop(result.id, None)
        self._done[result.id] = None
        if len(self._done) > self._remember:
            self._done.popitem(last=False)
        if not future.done():
            future.set_result(result)

    async def close(self) -> None:
        if self._reader is not None:
            self._reader.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await self._reader
        if self._consumer is not None:
            await self._consumer.stop()
        if self._producer is not None:
            await self._producer.stop()
        for future in self._pending.values():
            if not future.done():
                future.cancel()
        self._pending.clear()


def _chunk_of(value: bytes) -> ResultChunk | None:
    """The ``result_chunk`` a reply holds (its ``object`` field), parsed once;
    ``None`` for anything else (a ``result``). Raises ``ValueError`` for a
    chunk that does not read."""
    if b'"result_chunk"' not in value:  # a result: no JSON parsed twice
        return None
    data = json.loads(value)
    if not isinstance(data, dict) or data.get("object") != "result_chunk":
        return None
    return ResultChunk.model_validate(data)


def result_summary(result: InferenceResult) -> str:
    """One readable block for a result (used by ``laneway ask``)."""
    t = result.timings
    head = (
        f"[{result.status}] lane={result.lane} path={result.path} model={result.model} "
        f"total={t.total_ms:.1f}ms queue={t.queue_ms:.1f}ms inference={t.inference_ms:.1f}ms "
        f"batch={t.batch_size}"
    )
    body = (
        result.output
        if result.status == "ok"
        else json.dumps(result.error.model_dump() if result.error else None)
    )
    return f"{head}\n{body}"
