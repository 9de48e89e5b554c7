"""A streamed answer put together as a client reads it: ``result_chunk``
records and the terminal ``result``, in whatever order and as often as
at-least-once delivery hands them over, become the text deltas to show
(CONTRACT.md, Streaming). Pure: the SDK (``LanewayClient.stream``) feeds it
what its reply topic brings.

- A chunk already seen (same ``attempt`` and ``seq``) is dropped.
- Chunks of an attempt are shown in ``seq`` order; one that comes early
  waits for those before it.
- A chunk of a higher attempt replaces the text shown: its first delta is
  marked ``restart`` (drop what you showed). A lower attempt's are stale.
- The result ends the stream. Its output is the answer: where the text
  shown does not begin it (a chunk was lost, a decode's text was replaced
  by another's), the last delta restarts with the whole output, so the
  deltas since the last restart always join into the output.
"""

from __future__ import annotations

from dataclasses import dataclass

from schemas.messages import AnswerPath, FinishReason, InferenceResult, Lane, ResultChunk, Usage

__all__ = ["StreamAssembler", "StreamDelta"]


@dataclass(frozen=True, slots=True)
class StreamDelta:
    """Text to show after what was shown, or instead of it (``restart``)."""

    text: str
    restart: bool = False
    """Drop the text shown so far first: a new attempt replaced it."""
    attempt: int = 0
    lane: Lane | None = None
    """The lane, path and model of the decode the text comes from."""
    path: AnswerPath | None = None
    model: str | None = None
    finish_reason: FinishReason | None = None
    """Set on the last delta: ``stop``, ``length`` or ``error``."""
    usage: Usage | None = None
    result: InferenceResult | None = None
    """The terminal result, on the last delta (its ``error`` when it failed)."""

    def __str__(self) -> str:
        return self.text


class StreamAssembler:
    """The state of one streamed request (see the module docstring)."""

    def __init__(self) -> None:
        self.attempt = -1
        """The attempt whose text is shown (-1: none yet)."""
        self.text = ""
        """The text shown since the last restart."""
        self.done = False
        self.duplicates = 0
        self._next_seq = 0
        self._early: dict[int, ResultChunk] = {}
        self._shown_any = False
        self._restart = False
        """The next delta restarts: a new attempt began after text was shown."""

    def chunk(self, chunk: ResultChunk) -> list[StreamDelta]:
        """The deltas a chunk makes showable (none when stale or early)."""
        if self.done or chunk.attempt < self.attempt:
            return []
        if chunk.attempt > self.attempt:
            self._restart = self._restart or self._shown_any
            self.attempt, self.text, self._next_seq, self._early = chunk.attempt, "", 0, {}
        if chunk.seq < self._next_seq or chunk.seq in self._early:
            self.duplicates += 1
            return []
        self._early[chunk.seq] = chunk
        out: list[StreamDelta] = []
        while self._next_seq in self._early:
            ready = self._early.pop(self._next_seq)
            self._next_seq += 1
            if ready.delta:
                out.append(self._show(ready.delta, ready.lane, ready.path, ready.model))
        return out

    def result(self, result: InferenceResult) -> list[StreamDelta]:
        """The last delta, from the terminal result (none after the first)."""
        if self.done:
            self.duplicates += 1
            return []
        self.done = True
        output = result.output or "" if result.status == "ok" else ""
        if not output.startswith(self.text):  # not the text shown: all of it again
            self._restart, self.text = self._restart or self._shown_any, ""
        shown = self._show(output[len(self.text) :], result.lane, result.path, result.model)
        return [
            StreamDelta(
                shown.text,
                restart=shown.restart,
                attempt=self.attempt,
                lane=result.lane,
                path=result.path,
                model=result.model,
                finish_reason=result.finish_reason
                or ("error" if result.status == "error" else "stop"),
                usage=result.usage,
                result=result,
            )
        ]

    def _show(
        self, text: str, lane: Lane | None, path: AnswerPath | None, model: str | None
    ) -> StreamDelta:
        restart, self._restart = self._restart, False
        self.text += text
        self._shown_any = self._shown_any or bool(text)
        return StreamDelta(
            text, restart=restart, attempt=self.attempt, lane=lane, path=path, model=model
        )
