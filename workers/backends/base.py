"""The backend interface, the error mapping at its boundary, and a lazy
factory: a backend's module (and its heavy imports, e.g. vLLM) is imported
only when that backend is chosen.

Foreign errors are mapped by type, as httpx's ``HTTPCORE_EXC_MAP`` does: an
``ErrorMap`` lists foreign exception classes and laneway's error for each,
and an exception maps by the most specific class of its own that the map
lists (``map_backend_exception``). ``COMMON_ERRORS`` holds what any backend
may raise; each backend declares its own map next to it (its class's
``errors``: ``workers.backends.llama_batch.LLAMA_CPP_ERRORS``,
``workers.backends.openai.OPENAI_ERRORS``, ``workers.backends.vllm.vllm_errors``),
read by ``errors_of``. A message's wording is never read."""

from __future__ import annotations

import asyncio
import importlib
import time
from collections.abc import Awaitable, Callable, Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Literal, Protocol, TypeVar

from schemas.backends import BACKEND_KINDS, backend_kind
from schemas.errors import (
    BackendUnavailable,
    DeadlineExceeded,
    LanewayError,
    OutOfMemory,
)
from schemas.messages import ChatMessage
from schemas.settings import BackendSettings

__all__ = [
    "COMMON_ERRORS",
    "STOPPED",
    "Backend",
    "ErrorMap",
    "Generation",
    "GenerationInput",
    "Outcome",
    "create_backend",
    "errors_of",
    "map_backend_exception",
    "until_unwanted",
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
    unwanted: asyncio.Event | None = None
    """Set when the answer is no longer wanted (another worker's reached the
    cache first): the backend stops generating it and answers ``STOPPED``
    (``until_unwanted``). A backend that cannot stop finishes it."""
    on_text: Callable[[str], None] | None = None
    """Called on the event loop with each piece of the answer as it is
    generated, in order, before ``infer_batch`` returns (``None``: nobody
    listens). The pieces of an answer join into its text; where they do not
    (a batch retried in halves after running out of memory, say), the
    answer ``infer_batch`` returns is what counts, and ``workers.streaming``
    mends the stream from it."""
    top_p: float | None = None
    """Nucleus sampling at ``temperature > 0`` (``None`` = 1: every token)."""

    def remaining_s(self) -> float | None:
        return None if self.deadline is None else self.deadline - time.monotonic()


@dataclass(frozen=True, slots=True)
class Generation:
    text: str
    prompt_tokens: int
    completion_tokens: int
    finish: Literal["stop", "length"] = "stop"
    """``stop``: the model ended the answer, or a stop string did;
    ``length``: cut at ``max_tokens`` (or at the room the context left)."""


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


def create_backend(
    kind: str, model: str, settings: BackendSettings, adapter: Path | None = None
) -> Backend:
    """A backend of ``kind`` (one of ``schemas.backends.BACKEND_KINDS``),
    its module imported now; ``adapter``: the version's LoRA adapter, for a
    kind that takes one (``BackendKind.adapter``)."""
    known = backend_kind(kind)
    if known is None:
        raise BackendUnavailable(f"unknown backend {kind!r}; choose one of {sorted(BACKEND_KINDS)}")
    if adapter is not None and known.adapter is None:
        raise BackendUnavailable(f"backend {kind!r} takes no LoRA adapter (adapter {adapter})")
    module_name, class_name = known.target.split(":")
    try:
        module = importlib.import_module(module_name)
    except ImportError as exc:
        hint = f" (install laneway[{known.extra}])" if known.extra else ""
        raise BackendUnavailable(f"backend {kind!r} cannot be imported{hint}: {exc}") from exc
    cls = getattr(module, class_name)
    backend: Backend = (
        cls(model, settings) if adapter is None else cls(model, settings, adapter=adapter)
    )
    return backend


T = TypeVar("T")

STOPPED = "stopped: its answer reached the cache from another worker"
"""The message of the ``DeadlineExceeded`` a stopped generation answers; the
lane worker answers such a request from the cache instead, so no client
sees it."""


async def until_unwanted(work: Awaitable[T], unwanted: asyncio.Event | None) -> T | LanewayError:
    """``work``'s result, or ``DeadlineExceeded(STOPPED)`` as soon as
    ``unwanted`` is set first; ``work`` is then cancelled (a decoder drops a
    sequence whose future is cancelled, vLLM aborts the request, an HTTP
    request is closed)."""
    if unwanted is None:
        return await work
    running = asyncio.ensure_future(work)
    waiter = asyncio.ensure_future(unwanted.wait())
    try:
        await asyncio.wait({running, waiter}, return_when=asyncio.FIRST_COMPLETED)
    finally:
        waiter.cancel()
        if not running.done():
            running.cancel()
            await asyncio.wait({running})  # its clean-up (an abort) done before the answer
    if not running.cancelled():
        return running.result()
    return DeadlineExceeded(STOPPED)


ErrorMap = Mapping[type[BaseException], type[LanewayError]]
"""Foreign exception classes, each to the laneway error it becomes (one
whose constructor takes only a message)."""

COMMON_ERRORS: ErrorMap = {
    MemoryError: OutOfMemory,
    TimeoutError: DeadlineExceeded,
}
"""What any backend may raise: Python's own out-of-memory and timeouts."""

_PREFIX: dict[type[LanewayError], str] = {
    DeadlineExceeded: "inference timed out: ",
    BackendUnavailable: "backend failed: ",
}


def map_backend_exception(exc: BaseException, errors: ErrorMap = COMMON_ERRORS) -> LanewayError:
    """Translate a foreign error from a backend into laneway's tree by its
    type: the most specific of its classes that ``errors`` lists wins, and
    one it does not list at all is ``BackendUnavailable``. A
    ``LanewayError`` is kept as it is."""
    if isinstance(exc, LanewayError):
        return exc
    text = f"{type(exc).__name__}: {exc}"
    mapped: type[LanewayError] = BackendUnavailable
    for cls in type(exc).__mro__:
        if cls in errors:
            mapped = errors[cls]
            break
    return mapped(_PREFIX.get(mapped, "") + text)


def errors_of(backend: object) -> ErrorMap:
    """The error map ``backend`` declares (its ``errors``), else ``COMMON_ERRORS``."""
    errors: ErrorMap = getattr(backend, "errors", COMMON_ERRORS)
    return errors
