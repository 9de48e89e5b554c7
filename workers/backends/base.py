"""The backend interface, the error mapping at its boundary, and a lazy
factory: a backend's module (and its heavy imports, e.g. vLLM) is imported
only when that backend is chosen."""

from __future__ import annotations

import importlib
import time
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Protocol

from schemas.errors import (
    BackendUnavailable,
    CudaFailure,
    DeadlineExceeded,
    LanewayError,
    OutOfMemory,
)
from schemas.messages import ChatMessage
from schemas.settings import BackendSettings

__all__ = [
    "Backend",
    "Generation",
    "GenerationInput",
    "Outcome",
    "create_backend",
    "map_backend_exception",
]


@dataclass(frozen=True, slots=True)
class GenerationInput:
    messages: Sequence[ChatMessage]
    max_tokens: int
    temperature: float
    deadline: float | None = None
    """The request's deadline on the ``time.monotonic()`` clock; ``None`` = none.
    Absolute, so a request that waits behind others in its batch keeps its
    real budget, not a fresh one."""
    stop: Sequence[str] | None = None
    """The request's own stop strings: the answer ends before the first one."""
    seed: int | None = None
    """Seed of the request's sampling RNG at ``temperature > 0`` (``None`` = 0)."""

    def remaining_s(self) -> float | None:
        return None if self.deadline is None else self.deadline - time.monotonic()


@dataclass(frozen=True, slots=True)
class Generation:
    text: str
    prompt_tokens: int
    completion_tokens: int


Outcome = Generation | LanewayError


class Backend(Protocol):
    kind: str
    model: str

    async def load(self) -> None:
        """Load the model or connect; raises ``LanewayError`` on failure."""

    async def infer_batch(self, inputs: Sequence[GenerationInput]) -> list[Outcome]:
        """One outcome per input, in order."""

    async def check_health(self) -> bool: ...

    async def close(self) -> None: ...


_BACKENDS = {
    "llamacpp": "workers.backends.llamacpp:LlamaCppBackend",
    "openai": "workers.backends.openai:OpenAIBackend",
    "vllm": "workers.backends.vllm:VLLMBackend",
    "rules": "workers.backends.rules:RulesBackend",
}


def create_backend(kind: str, model: str, settings: BackendSettings) -> Backend:
    try:
        module_name, class_name = _BACKENDS[kind].split(":")
    except KeyError:
        raise BackendUnavailable(
            f"unknown backend {kind!r}; choose one of {sorted(_BACKENDS)}"
        ) from None
    try:
        module = importlib.import_module(module_name)
    except ImportError as exc:
        hint = " (install laneway[gpu])" if kind == "vllm" else ""
        raise BackendUnavailable(f"backend {kind!r} cannot be imported{hint}: {exc}") from exc
    backend: Backend = getattr(module, class_name)(model, settings)
    return backend


def map_backend_exception(exc: BaseException) -> LanewayError:
    """Translate a foreign error from a backend into laneway's tree."""
    if isinstance(exc, LanewayError):
        return exc
    text = f"{type(exc).__name__}: {exc}"
    if isinstance(exc, MemoryError) or "out of memory" in text.lower():
        return OutOfMemory(text)
    if "cuda" in text.lower():
        return CudaFailure(text)
    if isinstance(exc, TimeoutError):
        return DeadlineExceeded(f"inference timed out: {text}")
    return BackendUnavailable(f"backend failed: {text}")
