"""Requests whose client no longer wants the answer (``CancelRequest`` on
``<p>.cancels``, e.g. ``LanewayClient.cancel`` or a stream left early).

Every lane worker reads every partition of ``<p>.cancels`` from its end
(no consumer group: each worker must see each cancel) and keeps the ids it
read in the last ``LANEWAY_STREAM_CANCEL_WINDOW_S``. A decode of a request
cancelled meanwhile stops as a decode whose answer is no longer wanted
(``GenerationInput.unwanted``); a request cancelled before its batch runs
is not decoded at all. Either way its terminal result is INF-503 with
``finish_reason: cancelled``, and no quality event (it says nothing of the
path).
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import time
from collections import OrderedDict
from collections.abc import Callable

from aiokafka import AIOKafkaConsumer, TopicPartition
from pydantic import ValidationError

from schemas.messages import CancelRequest
from schemas.settings import Settings

__all__ = ["CancelWatch", "Cancels"]

log = logging.getLogger(__name__)

MAX_REMEMBERED = 100_000
"""Most cancelled ids kept at once: the oldest are forgotten first."""


class Cancels:
    """The ids cancelled within ``window_s``, and the events of requests in
    flight that a cancel must set. Pure: ``CancelWatch`` feeds it."""

    def __init__(self, window_s: float, clock: Callable[[], float] = time.monotonic) -> None:
        self._window_s = window_s
        self._clock = clock
        self._seen: OrderedDict[str, float] = OrderedDict()
        self._waiting: dict[str, list[asyncio.Event]] = {}

    def add(self, request_id: str) -> None:
        """A cancel came for ``request_id``."""
        self._seen[request_id] = self._clock()
        self._seen.move_to_end(request_id)
        self._forget_old()
        for event in self._waiting.get(request_id, ()):
            event.set()

    def cancelled(self, request_id: str) -> bool:
        self._forget_old()
        return request_id in self._seen

    def watch(self, request_id: str, event: asyncio.Event) -> None:
        """Set ``event`` when ``request_id`` is cancelled (at once if it was)."""
        self._waiting.setdefault(request_id, []).append(event)
        if self.cancelled(request_id):
            event.set()

    def unwatch(self, request_id: str, event: asyncio.Event) -> None:
        events = self._waiting.get(request_id, [])
        with contextlib.suppress(ValueError):
            events.remove(event)
        if not events:
            self._waiting.pop(request_id, None)

    def _forget_old(self) -> None:
        oldest = self._clock() - self._window_s
        while self._seen and (
            len(self._seen) > MAX_REMEMBERED or next(iter(self._seen.values())) < oldest
        ):
            self._seen.popitem(last=False)


class CancelWatch:
    """Reads ``<p>.cancels`` into ``cancels`` (see the module docstring)."""

    def __init__(self, settings: Settings, cancels: Cancels | None = None) -> None:
        self.settings = settings
        self.topic = settings.topic("cancels")
        self.cancels = cancels or Cancels(settings.stream.cancel_window_s)
        self._consumer: AIOKafkaConsumer | None = None

    async def start(self) -> None:
        """Assign every partition of the topic, from its end (bounded: the
        topic must exist, as ``laneway topics create`` makes it)."""
        consumer = AIOKafkaConsumer(
            enable_auto_commit=False,
            fetch_max_wait_ms=self.settings.kafka.fetch_max_wait_ms,
            **self.settings.kafka.client_options(),
        )
        await consumer.start()
        try:
            partitions = await self._partitions(consumer)
            consumer.assign(partitions)
            await consumer.seek_to_end(*partitions)
            for tp in partitions:  # resolve now, so no cancel after start is missed
                await consumer.position(tp)
        except BaseException:
            await consumer.stop()
            raise
        self._consumer = consumer

    async def _partitions(self, consumer: AIOKafkaConsumer) -> list[TopicPartition]:
        for _ in range(50):
            found = consumer.partitions_for_topic(self.topic)
            if found:
                return [TopicPartition(self.topic, p) for p in sorted(found)]
            await consumer._client.force_metadata_update()
            await asyncio.sleep(0.1)
        raise RuntimeError(
            f"topic {self.topic} has no partitions after 5 s: run `laneway topics create`"
        )

    async def run(self, stopping: asyncio.Event) -> None:
        """Read cancels until ``stopping`` is set."""
        assert self._consumer is not None
        while not stopping.is_set():
            polled = await self._consumer.getmany(timeout_ms=500)
            for records in polled.values():
                for record in records:
                    try:
                        cancel = CancelRequest.model_validate_json(record.value or b"")
                    except ValidationError:
                        log.warning("unreadable cancel on %s: %.200r", self.topic, record.value)
                        continue
                    self.cancels.add(cancel.id)

    async def close(self) -> None:
        if self._consumer is not None:
            await self._consumer.stop()
            self._consumer = None
