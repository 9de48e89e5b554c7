"""What a streamed answer sends over SSE when laneway restarts it.

An SSE stream cannot take back text it sent, and a laneway stream may
replace its text (``StreamDelta.restart``: a retry, a fallback path, another
worker's answer reached the cache first). The gateway holds nothing back:
text goes out as it comes. When a restart comes:

- its text continues what was sent (a greedy decode of the same question
  says the same words again): the part already sent is skipped and the
  stream goes on, the client sees nothing odd;
- it is behind what was sent but agrees with it so far: nothing is sent
  until it gets past what was sent;
- it contradicts what was sent: the stream ends with an error event
  (``AnswerRestarted``), since the client holds text that is not the
  answer, and the request is cancelled: the client has to ask again.

Buffering the whole answer would avoid the error but give up streaming's
point (the first words at once); restarts are rare (a failure or a race),
and a greedy decode repeats itself, so the first case is the common one.
"""

from __future__ import annotations

import json

from streams.chunks import StreamDelta
from streams.gateway.errors import GatewayError, from_error_info
from streams.gateway.translate import chunk, finish_reason, usage_of

__all__ = ["AnswerRestarted", "ChunkEvents", "Stitch"]


class AnswerRestarted(Exception):
    """laneway replaced an answer with one that contradicts the text sent."""


class Stitch:
    """The text of a stream sent so far, and what each delta adds to it."""

    def __init__(self) -> None:
        self.sent = ""
        self.current = ""
        """The text of the attempt shown (since the last restart)."""

    def feed(self, text: str, *, restart: bool = False) -> str:
        """The text to send for a delta (maybe ``""``); ``AnswerRestarted``
        when the answer now contradicts what was sent."""
        self.current = text if restart else self.current + text
        if self.current.startswith(self.sent):
            new, self.sent = self.current[len(self.sent) :], self.current
            return new
        if self.sent.startswith(self.current):
            return ""  # a new attempt, not yet past what was sent
        raise AnswerRestarted(
            f"laneway restarted the answer after {len(self.sent)} characters were sent, "
            "and the new answer differs from them; send the request again"
        )

    def finish(self) -> None:
        """At the end: ``AnswerRestarted`` when the answer is shorter than
        what was sent (its last attempt stopped before the text sent)."""
        if self.current != self.sent:
            raise AnswerRestarted(
                f"laneway's final answer ({len(self.current)} characters) is not the "
                f"{len(self.sent)} characters sent; send the request again"
            )


class ChunkEvents:
    """The SSE events of one streamed answer, as the ``data`` of each
    (OpenAI's ``chat.completion.chunk`` objects as JSON, an error object,
    ``[DONE]``): a role delta first (``start``), then per ``StreamDelta``
    its text; after the last, a chunk with ``finish_reason``, the usage
    chunk when asked for and ``[DONE]``. A failure ends the stream with an
    error event and no ``[DONE]``. ``ended`` once the stream is over."""

    def __init__(self, request_id: str, *, model: str, created: int, include_usage: bool) -> None:
        self.request_id = request_id
        self.model = model
        self.created = created
        self.include_usage = include_usage
        self.stitch = Stitch()
        self.ended = False
        self.error: GatewayError | None = None
        """The error the stream ended with, if it did."""

    def _chunk(
        self,
        *,
        delta: dict[str, str] | None = None,
        finish: str | None = None,
        usage: dict[str, int] | None = None,
    ) -> str:
        event = chunk(
            self.request_id,
            created=self.created,
            model=self.model,
            delta=delta,
            finish=finish,
            usage=usage,
        )
        return json.dumps(event)

    def start(self) -> list[str]:
        return [self._chunk(delta={"role": "assistant", "content": ""})]

    def fail(self, error: GatewayError) -> list[str]:
        """End the stream with ``error``."""
        self.ended, self.error = True, error
        return [json.dumps(error.body())]

    def delta(self, delta: StreamDelta) -> list[str]:
        """The events a delta makes (see the class docstring)."""
        if self.ended:
            return []
        try:
            text = self.stitch.feed(delta.text, restart=delta.restart)
        except AnswerRestarted as exc:
            return self.fail(GatewayError(502, str(exc), "answer_restarted"))
        events = [self._chunk(delta={"content": text})] if text else []
        result = delta.result
        if result is None:
            return events
        if result.error is not None:
            return events + self.fail(from_error_info(result.error))
        try:
            self.stitch.finish()
        except AnswerRestarted as exc:
            return events + self.fail(GatewayError(502, str(exc), "answer_restarted"))
        events.append(self._chunk(delta={}, finish=finish_reason(result.finish_reason)))
        if self.include_usage:
            events.append(self._chunk(usage=usage_of(result)))
        self.ended = True
        return [*events, "[DONE]"]
