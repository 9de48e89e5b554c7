"""Choosing each sequence's next token, and finding its stop strings: pure
numpy and bytes, called by the decode thread of ``workers.backends.llama_batch``.

Sampling follows llama.cpp's own chain as llama-cpp-python builds it, less
what laneway does not use: the repeat penalty over the last
``REPEAT_LAST_N`` generated tokens (a logit above 0 is divided by the
penalty, one at or below 0 multiplied), then the argmax at temperature 0,
else a draw from the temperature softmax with the sequence's own RNG, so a
seeded request samples the same tokens whatever it is batched with. With
``top_p`` below 1 the draw is among the nucleus only: the most likely
tokens whose probabilities first add up to ``top_p`` (at least one), the
probabilities taken before the temperature, as llama.cpp's top-p sampler
runs before its temperature one.
"""

from __future__ import annotations

from collections import deque
from collections.abc import Sequence

import numpy as np
import numpy.typing as npt

__all__ = [
    "REPEAT_LAST_N",
    "Sampler",
    "StopScanner",
    "choose_token",
    "nucleus",
    "penalize",
    "stop_prefix_len",
]

REPEAT_LAST_N = 64
"""Generated tokens the repeat penalty looks back over (llama-cpp-python's
``last_n_tokens_size``; prompt tokens are not counted, as there)."""

Logits = npt.NDArray[np.float32]


def penalize(logits: Logits, recent: Sequence[int], penalty: float) -> Logits:
    """``logits`` with llama.cpp's repeat penalty applied to every token in
    ``recent`` (once per distinct token, however often it occurs)."""
    if penalty == 1.0 or not recent:
        return logits
    out = np.array(logits, dtype=np.float32, copy=True)
    seen = np.unique(np.asarray(recent, dtype=np.int64))
    values = out[seen]
    out[seen] = np.where(values > 0, values / penalty, values * penalty)
    return out


_NUCLEUS_FIRST = 32
"""Candidates the nucleus is first looked for among (then eight times as
many, and so on): a sort of the whole vocabulary (49,152 tokens for
SmolLM2) for every token would cost more than the decode step."""


def nucleus(logits: Logits, top_p: float) -> npt.NDArray[np.intp]:
    """The token ids of ``softmax(logits)``'s nucleus, most likely first: the
    fewest whose probabilities add up to ``top_p`` or more (at least one)."""
    weights = np.exp(logits.astype(np.float64) - float(np.max(logits)))
    target = top_p * float(np.sum(weights))
    size = len(weights)
    k = min(size, _NUCLEUS_FIRST)
    while True:
        top = np.argpartition(weights, size - k)[size - k :]
        top = top[np.argsort(-weights[top], kind="stable")]
        cumulative = np.cumsum(weights[top])
        if cumulative[-1] >= target or k == size:
            break
        k = min(size, k * 8)
    n = int(np.searchsorted(cumulative, target, side="left")) + 1
    return top[: min(n, k)]


def choose_token(
    logits: Logits, temperature: float, rng: np.random.Generator, top_p: float = 1.0
) -> int:
    """The argmax at temperature 0, else a draw from ``softmax(logits /
    temperature)``; with ``top_p`` below 1, from the ``nucleus`` only."""
    if temperature <= 0:
        return int(np.argmax(logits))
    if top_p < 1.0:
        keep = nucleus(logits, top_p)
        scaled = (logits[keep].astype(np.float64) - float(logits[keep[0]])) / temperature
        weights = np.exp(scaled)
        cumulative = np.cumsum(weights)
        draw = rng.random() * cumulative[-1]
        at = min(int(np.searchsorted(cumulative, draw, side="right")), len(keep) - 1)
        return int(keep[at])
    scaled = (logits.astype(np.float64) - float(np.max(logits))) / temperature
    weights = np.exp(scaled)
    cumulative = np.cumsum(weights)
    draw = rng.random() * cumulative[-1]
    return int(min(np.searchsorted(cumulative, draw, side="right"), len(cumulative) - 1))


class Sampler:
    """One sequence's sampling state: its RNG and the tokens it generated lately."""

    def __init__(
        self, temperature: float, seed: int, repeat_penalty: float, top_p: float = 1.0
    ) -> None:
        self.temperature = temperature
        self.repeat_penalty = repeat_penalty
        self.top_p = top_p
        self._rng = np.random.default_rng(seed)
        self._recent: deque[int] = deque(maxlen=REPEAT_LAST_N)

    def sample(self, logits: Logits) -> int:
        """The next token; ``accept`` it once it is kept."""
        return choose_token(
            penalize(logits, self._recent, self.repeat_penalty),
            self.temperature,
            self._rng,
            self.top_p,
        )

    def accept(self, token: int) -> None:
        self._recent.append(token)


def stop_prefix_len(text: bytes, stops: Sequence[bytes]) -> int:
    """Length of the longest tail of ``text`` that is the start of a stop
    string (but not a whole one): text that must be held back, since the
    next token could complete the stop."""
    longest = 0
    for stop in stops:
        for n in range(min(len(stop) - 1, len(text)), longest, -1):
            if text.endswith(stop[:n]):
                longest = n
                break
    return longest


class StopScanner:
    """A sequence's generated bytes, cut at the first stop string.

    ``feed`` each token's bytes; it answers True once a stop string is
    complete. ``released`` is the text that can no longer turn into a stop
    string; ``text()`` the answer: up to the stop, or all of it when the
    sequence ended for another reason. Matching is on UTF-8 bytes, so a
    character split over two tokens is never a problem.
    """

    def __init__(self, stops: Sequence[str]) -> None:
        self._stops = [s.encode() for s in stops if s]
        self._longest = max((len(s) for s in self._stops), default=0)
        self._buffer = bytearray()
        self._stop_at: int | None = None
        self._held = 0
        self._taken = 0

    @property
    def stopped(self) -> bool:
        return self._stop_at is not None

    def feed(self, piece: bytes) -> bool:
        if self._stop_at is not None:
            return True
        start = max(0, len(self._buffer) - self._longest + 1)
        self._buffer += piece
        found = [i for i in (self._buffer.find(s, start) for s in self._stops) if i >= 0]
        if found:
            self._stop_at = min(found)
            self._held = 0
            return True
        window = bytes(self._buffer[-self._longest :]) if self._longest else b""
        self._held = stop_prefix_len(window, self._stops)
        return False

    @property
    def released(self) -> bytes:
        if self._stop_at is not None:
            return bytes(self._buffer[: self._stop_at])
        return bytes(self._buffer[: len(self._buffer) - self._held])

    def take(self, *, last: bool = False) -> bytes:
        """The released bytes not taken before (for a stream); ``last``: the
        sequence ended, so what was held back for a stop string is released."""
        end = self._stop_at if self._stop_at is not None else len(self._buffer)
        if not last and self._stop_at is None:
            end -= self._held
        new = bytes(self._buffer[self._taken : end]) if end > self._taken else b""
        self._taken = max(self._taken, end)
        return new

    def text(self) -> str:
        end = len(self._buffer) if self._stop_at is None else self._stop_at
        return bytes(self._buffer[:end]).decode("utf-8", errors="ignore")
