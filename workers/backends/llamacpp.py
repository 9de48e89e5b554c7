"""In-process llama.cpp backend for the CPU, batching continuously.

The requests of a batch are decoded together on one llama.cpp context
(``workers.backends.llama_batch``), and ``infer_batch`` may be called again
while earlier batches still run: their requests join the running decode at
the next step, and each call returns once all of its own requests are done.

Prompts follow ``workers.models.prompt_style``: a chat model gets its own
chat template from the GGUF (``tokenizer.chat_template``); the Gemma-3-270M
base model (or a GGUF without a template) gets a Question/Answer transcript
that ends at the next question or blank line, its answer stripped. A
request's deadline bounds its generation: past it, that sequence ends with
INF-503 while the others go on.

A version with a LoRA ``adapter`` (``ModelEntry.adapter``) has it loaded
with the model and applied to every sequence; an adapter that is missing
or that llama.cpp refuses fails ``load`` with INF-502 naming the file.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any, ClassVar

from schemas.errors import BackendUnavailable, DeadlineExceeded, InvalidRequest, LanewayError
from schemas.messages import ChatMessage
from schemas.settings import BackendSettings
from workers.backends.base import ErrorMap, Generation, GenerationInput, Outcome, until_unwanted
from workers.backends.llama_batch import LLAMA_CPP_ERRORS, BatchDecoder, Decoded, SequenceRequest
from workers.backends.pieces import AnswerPieces, PieceRelay, Utf8Pieces
from workers.models import prompt_style, resolve_adapter, resolve_gguf

__all__ = ["TRANSCRIPT_STOPS", "LlamaCppBackend", "Prompt", "as_transcript"]

log = logging.getLogger(__name__)

TRANSCRIPT_STOPS = ("\nQuestion:", "\n\n")
"""Where a transcript answer ends: the model starting the next question."""


@dataclass(frozen=True, slots=True)
class Prompt:
    text: str
    stops: tuple[str, ...]
    strip: bool


class LlamaCppBackend:
    kind = "llamacpp"
    errors: ClassVar[ErrorMap] = LLAMA_CPP_ERRORS

    def __init__(self, model: str, settings: BackendSettings, adapter: Path | None = None) -> None:
        self.model = model
        self._settings = settings
        self.adapter = adapter
        """The version's LoRA adapter (``workers.models.resolve_adapter``), or ``None``."""
        self._style = prompt_style(model)
        self._decoder: BatchDecoder | None = None
        self._template: Any = None
        """A ``Jinja2ChatFormatter`` of the GGUF's chat template, for chat models."""
        self._pieces: PieceRelay | None = None
        """Hands streamed pieces from the decode thread to the event loop."""

    async def load(self) -> None:
        path = await asyncio.to_thread(resolve_gguf, self.model, self._settings.model_dir)
        adapter = None if self.adapter is None else resolve_adapter(self.kind, self.adapter)
        decoder = BatchDecoder(
            str(path),
            n_ctx=self._settings.n_ctx,
            max_sequences=self._settings.llamacpp_max_sequences,
            max_batch_tokens=self._settings.llamacpp_max_batch_tokens,
            n_threads=self._settings.n_threads,
            repeat_penalty=self._settings.repeat_penalty,
            batch_invariant=self._settings.llamacpp_batch_invariant,
            adapter=None if adapter is None else str(adapter),
        )
        try:
            await asyncio.wrap_future(decoder.start())
        except LanewayError:
            raise  # it names the file (the adapter's, when that failed)
        except Exception as exc:
            raise BackendUnavailable(f"llama.cpp could not load {path}: {exc}") from exc
        template = decoder.metadata.get("tokenizer.chat_template")
        if self._style == "chat" and template:
            from llama_cpp.llama_chat_format import Jinja2ChatFormatter

            try:
                self._template = Jinja2ChatFormatter(
                    template, eos_token=decoder.eos_text, bos_token=decoder.bos_text
                )
            except Exception as exc:
                await asyncio.to_thread(decoder.close)
                raise BackendUnavailable(
                    f"{path} has a chat template jinja2 cannot read: {exc}"
                ) from exc
        self._decoder = decoder

    def prompt(self, item: GenerationInput) -> Prompt:
        """The text the model reads, the stop strings that end its answer."""
        own = tuple(item.stop or ())
        if self._template is None:
            return Prompt(as_transcript(item.messages), own + TRANSCRIPT_STOPS, strip=True)
        rendered = self._template(messages=[m.model_dump() for m in item.messages])
        style_stops = rendered.stop if isinstance(rendered.stop, list) else [rendered.stop or ""]
        return Prompt(rendered.prompt, own + tuple(s for s in style_stops if s), strip=False)

    async def infer_batch(self, inputs: Sequence[GenerationInput]) -> list[Outcome]:
        decoder = self._decoder
        if decoder is None:
            raise BackendUnavailable(f"model {self.model} is not loaded")
        if not decoder.alive:  # its thread failed (and failed what it held): start afresh
            log.error("the llama.cpp decoder of %s stopped; loading it again", self.model)
            self._decoder = None
            await asyncio.to_thread(decoder.close)
            await self.load()
            decoder = self._decoder
            assert decoder is not None
        outcomes: dict[int, Outcome] = {}
        requests: list[tuple[int, Prompt, SequenceRequest]] = []
        for i, item in enumerate(inputs):
            remaining = item.remaining_s()
            if remaining is not None and remaining <= 0:
                outcomes[i] = DeadlineExceeded(
                    f"deadline passed {-remaining * 1000:.0f} ms before generation started"
                )
                continue
            try:
                prompt = self.prompt(item)
            except Exception as exc:  # the template refused the chat (e.g. its roles)
                outcomes[i] = InvalidRequest(f"the model's chat template refused the chat: {exc}")
                continue
            request = SequenceRequest(
                prompt=prompt.text,
                max_tokens=item.max_tokens,
                temperature=item.temperature,
                seed=item.seed or 0,
                stops=prompt.stops,
                deadline=item.deadline,
                on_piece=self._relay().handler(
                    Utf8Pieces(AnswerPieces(item.on_text, strip=prompt.strip))
                )
                if item.on_text is not None
                else None,
                top_p=1.0 if item.top_p is None else item.top_p,
            )
            requests.append((i, prompt, request))
        futures = decoder.submit([request for _, _, request in requests])
        waiting = [asyncio.wrap_future(f) for f in futures]
        try:
            results = await asyncio.gather(
                *(
                    until_unwanted(future, inputs[i].unwanted)
                    for (i, _, _), future in zip(requests, waiting, strict=True)
                )
            )
        finally:
            for future in waiting:  # when cancelled: the decoder drops the sequences
                future.cancel()
        for (i, prompt, _), result in zip(requests, results, strict=True):
            outcomes[i] = _outcome(result, prompt)
        return [outcomes[i] for i in range(len(inputs))]

    def _relay(self) -> PieceRelay:
        """The relay of the running event loop (made on first use)."""
        loop = asyncio.get_running_loop()
        if self._pieces is None or self._pieces.loop is not loop:
            self._pieces = PieceRelay(loop)
        return self._pieces

    async def check_health(self) -> bool:
        return self._decoder is not None and self._decoder.alive

    async def close(self) -> None:
        decoder, self._decoder = self._decoder, None
        if decoder is not None:
            with contextlib.suppress(Exception):
                await asyncio.to_thread(decoder.close)


def _outcome(result: Decoded | LanewayError, prompt: Prompt) -> Outcome:
    if isinstance(result, LanewayError):
        return result
    text = result.text.strip() if prompt.strip else result.text
    return Generation(
        text,
        result.prompt_tokens,
        result.completion_tokens,
        "length" if result.finish == "length" else "stop",
    )


def as_transcript(messages: Sequence[ChatMessage]) -> str:
    """A chat as a Question/Answer transcript for a base (non-chat) model."""
    lines = []
    for message in messages:
        if message.role == "system":
            lines.append(message.content)
        elif message.role == "user":
            lines.append(f"Question: {message.content}")
        else:
            lines.append(f"Answer: {message.content}")
    lines.append("Answer:")
    return "\n".join(lines)
