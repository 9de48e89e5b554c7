"""A black-box client for the benchmarks: what a team writes without the SDK.

One plain aiokafka producer and one plain aiokafka consumer at their default
settings (only where the brokers are and how to reach them: bootstrap,
security), requests written as JSON objects, replies read from a reply topic
of its own and matched by ``id``. It shares nothing with ``LanewayClient``,
so what the benchmarks measure through it is the wire contract alone.

Its default consumer asks the broker to hold each fetch up to 500 ms
(aiokafka's ``fetch_max_wait_ms``). A broker that answers a held fetch as
soon as a record arrives (Apache Kafka with ``fetch.min.bytes`` 1) costs
nothing for it; the embedded Tansu broker holds it regardless, so a reply
comes about half that wait late (see CONTRACT.md, Delivery).
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import uuid
from collections.abc import Callable
from typing import Any

from aiokafka import AIOKafkaConsumer, AIOKafkaProducer, TopicPartition
from aiokafka.admin import AIOKafkaAdminClient, NewTopic
from aiokafka.errors import TopicAlreadyExistsError

from schemas.messages import InferenceResult
from schemas.settings import KafkaSettings

__all__ = ["PlainClient"]


class PlainClient:
    def __init__(self, kafka: KafkaSettings, *, name: str = "plain") -> None:
        self.kafka = kafka
        self.reply_to = f"{kafka.topic_prefix}.replies.{name}-{uuid.uuid4().hex[:8]}"
        self._requests_topic = f"{kafka.topic_prefix}.requests"
        connection = {k: v for k, v in kafka.client_options().items() if k != "request_timeout_ms"}
        self._connection = connection
        self._producer = AIOKafkaProducer(**connection)
        self._consumer = AIOKafkaConsumer(**connection)
        self._pending: dict[str, asyncio.Future[InferenceResult]] = {}
        self._listeners: dict[str, Callable[[dict[str, Any]], None]] = {}
        self._reader: asyncio.Task[None] | None = None

    async def __aenter__(self) -> PlainClient:
        admin = AIOKafkaAdminClient(**self._connection)
        await admin.start()
        try:
            with contextlib.suppress(TopicAlreadyExistsError):
                await admin.create_topics(
                    [NewTopic(self.reply_to, 1, self.kafka.replication_factor)]
                )
        finally:
            await admin.close()
        await self._producer.start()
        await self._consumer.start()
        # Its one partition, read from the end, found before the first request
        # goes out: no reply lands before the consumer looks.
        partition = TopicPartition(self.reply_to, 0)
        self._consumer.assign([partition])
        await self._consumer.position(partition)
        self._reader = asyncio.create_task(self._read())
        return self

    async def __aexit__(self, *exc: object) -> None:
        if self._reader is not None:
            self._reader.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await self._reader
        await self._consumer.stop()
        await self._producer.stop()
        for future in self._pending.values():
            future.cancel()

    async def submit(
        self,
        request: dict[str, Any],
        *,
        on_chunk: Callable[[dict[str, Any]], None] | None = None,
    ) -> asyncio.Future[InferenceResult]:
        """Produce ``request`` (it must carry an ``id``) keyed by its id,
        replies to this client; the future resolves with the first reply.
        ``on_chunk`` gets each ``result_chunk`` of a streamed request, as JSON."""
        rid = str(request["id"])
        if on_chunk is not None:
            self._listeners[rid] = on_chunk
        future: asyncio.Future[InferenceResult] = asyncio.get_running_loop().create_future()
        self._pending[rid] = future
        body = json.dumps({"reply_to": self.reply_to, **request}).encode()
        await self._producer.send_and_wait(self._requests_topic, body, key=rid.encode())
        return future

    async def _read(self) -> None:
        async for record in self._consumer:
            try:
                message = json.loads(record.value or b"")
                if isinstance(message, dict) and message.get("object") == "result_chunk":
                    listener = self._listeners.get(str(message.get("id")))
                    if listener is not None:
                        listener(message)
                    continue
                result = InferenceResult.model_validate(message)
            except ValueError:
                continue  # not a result: nobody's answer, and no reason to stop reading
            self._listeners.pop(result.id, None)
            future = self._pending.pop(result.id, None)  # a second reply is a duplicate
            if future is not None and not future.done():
                future.set_result(result)
