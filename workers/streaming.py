"""Token streaming: a request with ``stream: true`` gets its answer as
``result_chunk`` records on its ``reply_to`` while a model generates it,
then its terminal ``result`` as every request does (CONTRACT.md, Streaming).

One ``AnswerStream`` per streamed request in a batch. The backend hands it
the answer's pieces as they come (``GenerationInput.on_text``); it
coalesces them: the first piece of an answer goes out at once (the time to
first token is what a person waiting on a chat sees), later ones every
``LANEWAY_STREAM_FLUSH_MS`` or every ``LANEWAY_STREAM_MAX_PIECES`` pieces,
so a batch of 16 answers does not flood the broker with a record a token.

Each decode of a request is an ``attempt``, numbered by a Redis counter per
request (``StreamAttempts``): a decode on another path after this one
failed, a retry from the retry topic, a redelivery after a worker died
mid-stream, each gets a higher number than any before it, on whichever
worker it runs. A client that sees a higher attempt drops the text it has.
The last chunk (``finish``) carries why the answer ended and its usage; its
text is the rest of the terminal result's output, so the chunks of the
last attempt always join into the output. Where the text sent so far does
not begin that output (another worker's answer reached the cache first),
the last chunk opens a new attempt with the whole output.

Chunks are produced without waiting for their acknowledgement; the
terminal result, produced after them by the same producer to the same
partition (both keyed by request id), is the one that counts and is
delivered at least once as ever. Where Redis cannot number an attempt,
that attempt sends no chunks: its text arrives in the last chunk and the
result.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import time
from collections.abc import Awaitable, Callable

import redis.asyncio as aioredis
from prometheus_client import Counter
from redis.exceptions import RedisError

from schemas.messages import AnswerPath, InferenceResult, Lane, ResultChunk, RoutedRequest
from schemas.settings import StreamSettings
from streams.kafka.envelopes import Outbound, chunk_record, closing_chunk
from streams.ops import REDIS_ERRORS, TIME_PER_TOKEN, TIME_TO_FIRST_TOKEN

__all__ = ["CHUNKS", "AnswerStream", "ChunkSend", "StreamAttempts"]

log = logging.getLogger(__name__)

CHUNKS = Counter(
    "laneway_stream_chunks_total",
    "result_chunk records a worker produced, by lane and outcome (sent, failed)",
    ["lane", "outcome"],
)

ChunkSend = Callable[[Outbound], Awaitable[Awaitable[object]]]
"""Queues a record on the producer; what it returns is awaited for the ack."""


class StreamAttempts:
    """Numbers the decodes of a request across workers: ``INCR
    <prefix>:stream:<id>``, kept ``ttl_s``. Without a Redis client (a
    worker built for a test) the numbers are this process's own."""

    def __init__(self, redis: aioredis.Redis | None, *, prefix: str, ttl_s: int) -> None:
        self._redis = redis
        self._prefix = prefix
        self._ttl_s = ttl_s
        self._local: dict[str, int] = {}

    async def next(self, request_id: str) -> int | None:
        """The next attempt's number (1, 2, ...); ``None`` where Redis fails."""
        if self._redis is None:
            self._local[request_id] = self._local.get(request_id, 0) + 1
            return self._local[request_id]
        key = f"{self._prefix}:stream:{request_id}"
        try:
            async with self._redis.pipeline(transaction=False) as pipe:
                pipe.incr(key)
                pipe.expire(key, self._ttl_s)
                count, _ = await pipe.execute()
        except (RedisError, OSError) as exc:
            REDIS_ERRORS.labels("stream").inc()
            log.warning(
                "cannot number a streamed attempt of %s, not streaming it: %s", request_id, exc
            )
            return None
        return int(count)


class AnswerStream:
    """One streamed request's chunks (see the module docstring)."""

    def __init__(
        self,
        routed: RoutedRequest,
        lane: Lane,
        send: ChunkSend,
        attempts: StreamAttempts,
        settings: StreamSettings,
    ) -> None:
        self.routed = routed
        self.lane = lane
        self._send_record = send
        self._attempts = attempts
        self._flush_s = settings.flush_ms / 1000
        self._max_pieces = settings.max_pieces
        self._pending: list[str] = []
        self._sent: list[str] = []
        """Text of the current attempt's chunks sent so far."""
        self._attempt: int | None = None
        self._numbered = False
        """The current attempt has asked for its number (``_attempt`` may be ``None``)."""
        self._seq = 0
        self._epoch = 0
        """Counts ``begin`` calls: a send that began in an earlier epoch is stale."""
        self._path: AnswerPath | None = routed.path
        self._model: str | None = None
        self._first_at: float | None = None
        """``time.time()`` of the first chunk with text (TTFT)."""
        self._wake = asyncio.Event()
        self._full = asyncio.Event()
        self._closed = False
        self._flusher: asyncio.Task[None] | None = None

    @property
    def request_id(self) -> str:
        return self.routed.request.id

    def begin(self, path: AnswerPath, model: str | None) -> None:
        """A decode of the request starts on ``path``: a new attempt when the
        one before it sent (or has waiting) any text."""
        if self._sent or self._pending or self._numbered:
            self._epoch += 1
            self._pending.clear()
            self._sent.clear()
            self._attempt, self._numbered, self._seq = None, False, 0
        self._path, self._model = path, model

    def text(self, piece: str) -> None:
        """A piece of the answer (``GenerationInput.on_text``)."""
        if self._closed or not piece:
            return
        self._pending.append(piece)
        if len(self._pending) >= self._max_pieces:
            self._full.set()
        if self._flusher is None:
            self._flusher = asyncio.create_task(self._flush_until_closed())
        self._wake.set()

    async def finish(self, result: InferenceResult) -> None:
        """The last chunk, from the terminal ``result``, once the chunks
        before it are queued."""
        await self._stop_flushing()
        output = (result.output or "") if result.status == "ok" else ""
        sent = "".join(self._sent) if result.status == "ok" else ""
        if self._numbered and not output.startswith(sent):  # not the text it continues
            self.begin(result.path or self._path or self.routed.path, result.model)
            sent = ""
        if not self._numbered:
            await self._number()
        if self._attempt is None:
            return
        chunk = closing_chunk(
            result, attempt=self._attempt, seq=self._seq, delta=output[len(sent) :]
        )
        self._seq += 1
        await self._queue(chunk)
        if result.status == "ok":
            self._observe(result)

    async def abandon(self) -> None:
        """No terminal result now (the request was parked for a retry): send
        nothing more; the retry's decode is a new attempt."""
        await self._stop_flushing()

    # -- inside ---------------------------------------------------------------

    async def _flush_until_closed(self) -> None:
        while not self._closed:
            await self._wake.wait()
            self._wake.clear()
            await self._flush()
            if self._closed:
                return
            self._full.clear()
            with contextlib.suppress(TimeoutError):  # pieces coming meanwhile wait for the next
                await asyncio.wait_for(self._full.wait(), timeout=self._flush_s)

    async def _flush(self) -> None:
        if not self._pending:
            return
        epoch = self._epoch
        if not self._numbered:
            await self._number()
        if epoch != self._epoch or self._attempt is None:
            if self._attempt is None:
                self._pending.clear()  # not streamed: the text comes in the last chunk
            return
        delta = "".join(self._pending)
        self._pending.clear()
        chunk = ResultChunk(
            id=self.request_id,
            attempt=self._attempt,
            seq=self._seq,
            delta=delta,
            lane=self.lane,
            path=self._path,
            model=self._model,
        )
        self._seq += 1
        self._sent.append(delta)
        if self._first_at is None:
            self._first_at = time.time()
        await self._queue(chunk)

    async def _number(self) -> None:
        self._numbered = True
        epoch = self._epoch
        attempt = await self._attempts.next(self.request_id)
        if epoch == self._epoch:
            self._attempt = attempt

    async def _queue(self, chunk: ResultChunk) -> None:
        try:
            ack = await self._send_record(chunk_record(chunk, self.routed.reply_to))
        except Exception as exc:
            CHUNKS.labels(self.lane, "failed").inc()
            log.warning("a chunk of %s was not produced: %r", self.request_id, exc)
            return
        asyncio.ensure_future(ack).add_done_callback(self._counted)

    def _counted(self, future: asyncio.Future[object]) -> None:
        failed = future.cancelled() or future.exception() is not None
        CHUNKS.labels(self.lane, "failed" if failed else "sent").inc()

    async def _stop_flushing(self) -> None:
        self._closed = True
        self._wake.set()
        self._full.set()
        if self._flusher is not None:
            await asyncio.gather(self._flusher, return_exceptions=True)
            self._flusher = None
        self._pending.clear()  # what was not sent is in the last chunk's text

    def _observe(self, result: InferenceResult) -> None:
        """TTFT and time per output token of an answer that was streamed."""
        now = time.time()
        path = str(result.path or self._path or "")
        first = self._first_at if self._first_at is not None else now
        TIME_TO_FIRST_TOKEN.labels(self.lane, path).observe(
            max(0.0, first - self.routed.produced_at_ms / 1000)
        )
        tokens = result.usage.completion_tokens
        if self._first_at is not None and tokens > 1:
            TIME_PER_TOKEN.labels(self.lane, path).observe((now - self._first_at) / (tokens - 1))
