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
  answer. The request itself goes on; a retry may get its answer from the
  cache.

Buffering the whole answer would avoid the error but give up streaming's
point (the first words at once); restarts are rare (a failure or a race),
and a greedy decode repeats itself, so the first case is the common one.
"""

from __future__ import annotations

__all__ = ["AnswerRestarted", "Stitch"]


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
