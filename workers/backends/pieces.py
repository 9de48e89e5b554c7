"""A streamed answer's pieces as its listener (``GenerationInput.on_text``)
should see them: joined, they are always a beginning of the answer the
backend returns at the end, also where the backend strips that answer."""

from __future__ import annotations

import asyncio
import codecs
import contextlib
import functools
import threading
from collections.abc import Callable

__all__ = ["AnswerPieces", "PieceRelay", "Utf8Pieces"]


class AnswerPieces:
    """Hands text pieces on to ``on_text``. With ``strip`` (a Question/Answer
    transcript's answer, which the backend strips), leading white space is
    dropped and trailing white space held back until more text follows."""

    def __init__(self, on_text: Callable[[str], None], *, strip: bool) -> None:
        self._on_text = on_text
        self._strip = strip
        self._started = not strip
        self._held = ""

    def __call__(self, text: str) -> None:
        if self._strip:
            if not self._started:
                text = text.lstrip()
                self._started = bool(text)
            text = self._held + text
            body = text.rstrip()
            self._held = text[len(body) :]
            text = body
        if text:
            self._on_text(text)


class Utf8Pieces:
    """Bytes as they come off a decoder (a character may be split over two
    tokens) decoded into text for ``AnswerPieces``."""

    def __init__(self, pieces: Callable[[str], None]) -> None:
        self._pieces = pieces
        self._decoder = codecs.getincrementaldecoder("utf-8")(errors="ignore")

    def __call__(self, data: bytes) -> None:
        text = self._decoder.decode(data)
        if text:
            self._pieces(text)


class PieceRelay:
    """Pieces a decode thread hands over, given to their listeners on the
    event loop: everything that came since the loop last looked, in one
    wake-up, not one per token of each sequence (a step of 16 sequences
    would wake the loop 16 times, each a self-pipe write and a turn at the
    GIL the decode thread's sampling waits for). Order is kept, and pieces
    handed over before a sequence's future resolves reach their listener
    before the loop sees the future resolved (both go through the loop's
    queue, in that order)."""

    def __init__(self, loop: asyncio.AbstractEventLoop) -> None:
        self.loop = loop
        self._lock = threading.Lock()
        self._queue: list[tuple[Callable[[bytes], None], bytes]] = []
        self._scheduled = False

    def handler(self, listener: Callable[[bytes], None]) -> Callable[[bytes], None]:
        """What the decode thread calls with a sequence's bytes."""
        return functools.partial(self._put, listener)

    def _put(self, listener: Callable[[bytes], None], data: bytes) -> None:
        with self._lock:
            self._queue.append((listener, data))
            if self._scheduled:
                return
            self._scheduled = True
        with contextlib.suppress(RuntimeError):  # the loop closed: nobody listens
            self.loop.call_soon_threadsafe(self._drain)

    def _drain(self) -> None:
        with self._lock:
            queue, self._queue, self._scheduled = self._queue, [], False
        for listener, data in queue:
            listener(data)
