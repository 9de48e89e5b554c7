"""A streamed answer's pieces as its listener (``GenerationInput.on_text``)
should see them: joined, they are always a beginning of the answer the
backend returns at the end, also where the backend strips that answer."""

from __future__ import annotations

import codecs
from collections.abc import Callable

__all__ = ["AnswerPieces", "Utf8Pieces"]


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
