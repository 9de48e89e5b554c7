"""Counting the tokens of the answers the classifier gives itself.

A rule's answer and a cache answer ran no model, but a client that bills or
budgets by ``usage`` wants their tokens all the same. They are counted with
a real tokenizer: the vocabulary of the registry's cheapest llama.cpp model
(the built-in registry's light path, SmolLM2-135M), loaded vocabulary-only
through llama.cpp (no weights: a few MB, well under a second), once per
classifier process, in a thread at start-up (``load``); until it is loaded
usage says 0, as before.

- ``answer(text)``: the tokens of an answer (a rule's answers are few fixed
  sentences; a cache entry's own count, its model's, is used instead when
  it has one).
- ``prompt(request)``: the tokens of the request's text (its prompt, or
  each message's content), without a chat template's tokens or the
  session's history: what the client sent, as the tokenizer splits it.

Every count is kept per text (``MAX_KEPT_CHARS`` of text at most). llama.cpp's
tokenizer is not cheap: about 45 us for "Hello!" and 220 us for a 310-character
question on the development machine (its pre-tokenizer's regular expressions),
against ~250-370 us of classifier CPU per rule answer, and ~2 us a character
on a long prompt (120 ms for the largest, 64 KiB). So the batch classifier
does not count on its event loop: before it routes a wave, ``learn`` counts
the texts its answers need and nobody counted yet, in a thread, in one call
(llama.cpp runs without the GIL); ``prompt`` and ``answer`` then read what
was kept. A repeated question or answer is counted once.
"""

from __future__ import annotations

import logging
import threading
from collections.abc import Callable, Iterable, Sequence
from pathlib import Path
from typing import Any

from schemas.messages import InferenceRequest, Lane
from schemas.settings import Settings
from streams.routing.registry import ModelEntry, ModelRegistry

__all__ = ["MAX_KEPT_CHARS", "TokenCounter", "counting_model", "texts_of"]

log = logging.getLogger(__name__)

MAX_KEPT_CHARS = 4_000_000
"""Text whose counts are kept, in characters; past it the table starts again."""


def counting_model(registry: ModelRegistry) -> ModelEntry | None:
    """The model whose vocabulary counts: the cheapest active llama.cpp
    model serving realtime (light in the built-in registry), else any active
    llama.cpp model; ``None`` when the registry has none."""
    llamacpp = [m for m in registry.active_models if m.backend == "llamacpp"]
    if not llamacpp:
        return None
    serving = [m for m in llamacpp if Lane.REALTIME in m.lanes] or llamacpp
    return min(serving, key=lambda m: (m.cost_per_1k_tokens, m.capability))


class TokenCounter:
    """Token counts with one GGUF model's vocabulary.

    ``locate`` finds the GGUF file (``workers.models.resolve_gguf``); it
    runs in ``load``, in the caller's thread. Counting before ``load`` (or
    after it failed) is an error: check ``ready``."""

    def __init__(self, name: str, locate: Callable[[], Path]) -> None:
        self.name = name
        """The model whose vocabulary counts (its registry name)."""
        self._locate = locate
        self._llama: Any = None
        """The vocabulary-only ``Llama``: it owns the model ``_vocab`` points into."""
        self._vocab: Any = None
        self._tokenize: Any = None
        self._none: Any = None
        self._kept: dict[str, int] = {}
        self._kept_chars = 0
        self._lock = threading.Lock()

    @classmethod
    def for_registry(cls, settings: Settings, registry: ModelRegistry) -> TokenCounter | None:
        """The counter of ``counting_model``, not loaded; ``None`` (usage
        stays 0) when the registry has no llama.cpp model."""
        entry = counting_model(registry)
        if entry is None:
            return None
        from workers.models import resolve_gguf

        model_dir = settings.backend.model_dir
        return cls(entry.name, lambda: resolve_gguf(entry.name, model_dir))

    @property
    def ready(self) -> bool:
        return self._llama is not None

    def load(self) -> bool:
        """Load the vocabulary (blocking: call it in a thread). Never raises:
        a model that cannot be found or read leaves usage at 0, and says so
        once in the log. Returns whether it is ready."""
        with self._lock:
            if self._llama is not None:
                return True
            try:
                import llama_cpp
                from llama_cpp._utils import suppress_stdout_stderr

                path = self._locate()
                with suppress_stdout_stderr(disable=False):  # llama.cpp's load report
                    llama = llama_cpp.Llama(model_path=str(path), vocab_only=True, verbose=False)
                self._vocab = llama._model.vocab
                self._tokenize = llama_cpp.llama_tokenize
                self._none = (llama_cpp.llama_token * 1)()
                self._llama = llama
            except Exception as exc:
                log.warning(
                    "token counts of rule and cache answers stay 0: the vocabulary of %s "
                    "did not load: %s: %s",
                    self.name,
                    type(exc).__name__,
                    exc,
                )
                return False
            log.info("rule and cache answers count tokens with %s's vocabulary", self.name)
            return True

    def count(self, text: str) -> int:
        """The tokens of ``text`` (no BOS; special tokens are text).

        Asked with room for no token, llama.cpp answers minus the count
        without copying any: ``Llama.tokenize`` allocates a buffer of the
        model's whole training context per call (8,192 tokens for SmolLM2),
        about 190 us for a six-character prompt against a few here."""
        if not text:
            return 0
        raw = text.encode()
        return abs(int(self._tokenize(self._vocab, raw, len(raw), self._none, 0, False, False)))

    def tokens(self, text: str) -> int:
        """``count(text)``, kept per text."""
        known = self._kept.get(text)
        if known is None:
            known = self._keep(text, self.count(text))
        return known

    def _keep(self, text: str, n: int) -> int:
        if self._kept_chars + len(text) > MAX_KEPT_CHARS:
            self._kept.clear()
            self._kept_chars = 0
        self._kept[text] = n
        self._kept_chars += len(text)
        return n

    def answer(self, text: str) -> int:
        """The tokens of an answer's text."""
        return self.tokens(text)

    def prompt(self, request: InferenceRequest) -> int:
        """The tokens of the request's text: its prompt, or the sum over
        its messages' contents."""
        return sum(self.tokens(text) for text in texts_of(request))

    def unknown(self, texts: Iterable[str]) -> list[str]:
        """Of ``texts``, those not counted yet (each once)."""
        return [t for t in dict.fromkeys(texts) if t not in self._kept]

    def learn(self, texts: Sequence[str]) -> None:
        """Count ``texts`` and keep the counts (blocking: call it in a thread,
        so the event loop goes on meanwhile). Never raises."""
        try:
            for text in texts:
                self._keep(text, self.count(text))
        except Exception:
            log.exception("counting tokens failed; the texts are counted when asked")


def texts_of(request: InferenceRequest) -> list[str]:
    """The texts a request's prompt tokens are counted over."""
    if request.prompt is not None:
        return [request.prompt]
    return [m.content for m in request.messages or ()]
