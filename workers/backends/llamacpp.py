"""In-process llama.cpp (llama-cpp-python) backend for the CPU.

llama-cpp-python exposes no batched decoding through its chat API, so a
batch runs its requests one after another in a worker thread, holding the
model for the whole batch; batching still saves the per-request hand-offs
and keeps each lane's latency/throughput trade-off in one place. A request's
remaining deadline bounds its generation: past it, a logits processor
leaves only end-of-sequence to sample.
"""

from __future__ import annotations

import asyncio
import threading
import time
from collections.abc import Sequence
from typing import Any

from schemas.errors import BackendUnavailable, DeadlineExceeded
from schemas.messages import ChatMessage
from schemas.settings import BackendSettings
from workers.backends.base import Generation, GenerationInput, Outcome, map_backend_exception
from workers.models import prompt_style, resolve_gguf

__all__ = ["LlamaCppBackend"]


class LlamaCppBackend:
    kind = "llamacpp"

    def __init__(self, model: str, settings: BackendSettings) -> None:
        self.model = model
        self._settings = settings
        self._llama: Any = None
        self._lock = threading.Lock()
        self._style = prompt_style(model)

    async def load(self) -> None:
        await asyncio.to_thread(self._load_sync)

    def _load_sync(self) -> None:
        path = resolve_gguf(self.model, self._settings.model_dir)
        try:
            from llama_cpp import Llama

            self._llama = Llama(
                model_path=str(path),
                n_ctx=self._settings.n_ctx,
                n_threads=self._settings.n_threads,
                verbose=False,
            )
        except Exception as exc:
            raise BackendUnavailable(f"llama.cpp could not load {path}: {exc}") from exc

    async def infer_batch(self, inputs: Sequence[GenerationInput]) -> list[Outcome]:
        if self._llama is None:
            raise BackendUnavailable(f"model {self.model} is not loaded")
        return await asyncio.to_thread(self._infer_sync, inputs)

    def _infer_sync(self, inputs: Sequence[GenerationInput]) -> list[Outcome]:
        with self._lock:
            return [self._one(item) for item in inputs]

    def _one(self, item: GenerationInput) -> Outcome:
        remaining = item.remaining_s()
        if remaining is not None and remaining <= 0:
            return DeadlineExceeded(
                f"deadline passed {-remaining * 1000:.0f} ms before generation started"
            )
        timed_out = False
        eos = self._llama.token_eos()

        def end_at_deadline(_input_ids: Any, scores: Any) -> Any:
            """Past the deadline, only end-of-sequence may be sampled."""
            nonlocal timed_out
            if item.deadline is not None and time.monotonic() > item.deadline:
                timed_out = True
                scores[:] = -float("inf")
                scores[eos] = 0.0
            return scores

        options: dict[str, Any] = {
            "max_tokens": item.max_tokens,
            "temperature": item.temperature,
            "seed": 0,
            "repeat_penalty": self._settings.repeat_penalty,
            "logits_processor": [end_at_deadline],
        }
        try:
            if self._style == "chat":
                response = self._llama.create_chat_completion(
                    messages=[m.model_dump() for m in item.messages], **options
                )
                text = response["choices"][0]["message"]["content"] or ""
            else:
                response = self._llama.create_completion(
                    as_transcript(item.messages), stop=["\nQuestion:", "\n\n"], **options
                )
                text = response["choices"][0]["text"].strip()
        except Exception as exc:
            return map_backend_exception(exc)
        if timed_out:
            return DeadlineExceeded("generation was cut off at the request's deadline")
        usage = response.get("usage") or {}
        return Generation(
            text=text,
            prompt_tokens=int(usage.get("prompt_tokens", 0)),
            completion_tokens=int(usage.get("completion_tokens", 0)),
        )

    async def check_health(self) -> bool:
        return self._llama is not None

    async def close(self) -> None:
        await asyncio.to_thread(self._close_sync)

    def _close_sync(self) -> None:
        with self._lock:  # never free the model under a generation still running
            llama, self._llama = self._llama, None
            if llama is not None:
                llama.close()


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
