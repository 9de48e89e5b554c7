"""In-process vLLM engine for GPUs (``pip install laneway[gpu]``).

vLLM is imported only when this backend is chosen. The engine is vLLM's
asynchronous one (``AsyncLLMEngine``, v1's ``AsyncLLM``), built on the
event loop's own (main) thread. Every input of ``infer_batch`` becomes its
own ``generate`` request the moment it arrives, and concurrent
``infer_batch`` calls simply add more: vLLM's scheduler batches whatever is
running, continuously, so a request never waits for another batch to end.

A request's deadline bounds it: past it the request is aborted in the engine
and answers ``INF-503``, as llama.cpp's do. CUDA and out-of-memory errors,
also where vLLM wraps them in its own, map to ``CUDA-ERR`` and ``MEM-ERR``
(where the error reaches this process). vLLM v1 runs the model in an
engine-core process of its own: an error there kills that engine, and this
process sees only ``EngineDeadError``, so an out-of-memory while serving
answers ``CUDA-ERR`` too; execution then drops the engine and the probe
after the breaker's cooldown loads a fresh one.

The decisions are plain functions, tested without vLLM or a GPU
(``tests/unit/workers/test_vllm.py``): ``platform_problem``, ``model_source``,
``engine_options``, ``sampling_options``, ``time_left``, ``last_before_deadline``,
``map_vllm_exception`` and ``generation_from``; that vLLM takes what they
make is checked against the installed vllm, on the CPU
(``tests/unit/workers/test_vllm_api.py``, skipped without ``laneway[gpu]``).

A version with a LoRA ``adapter`` (``ModelEntry.adapter``: a PEFT
directory, ``workers.models.resolve_adapter``) gets an engine with LoRA
enabled for one adapter of its rank (``engine_options``), and each of its
requests carries the adapter as a ``LoRARequest`` (``lora_options``). One
engine per version: the base model and the student do not share one.
"""

from __future__ import annotations

import asyncio
import contextlib
import functools
import inspect
import itertools
import json
import time
from collections.abc import AsyncGenerator, Awaitable, Callable, Iterator, Sequence
from pathlib import Path
from types import SimpleNamespace
from typing import Any, TypeVar

from schemas.errors import (
    BackendUnavailable,
    CudaFailure,
    DeadlineExceeded,
    InvalidRequest,
    LanewayError,
    OutOfMemory,
)
from schemas.messages import ChatMessage
from schemas.settings import BackendSettings
from workers.backends.base import (
    COMMON_ERRORS,
    ErrorMap,
    Generation,
    GenerationInput,
    Outcome,
    map_backend_exception,
    until_unwanted,
)
from workers.backends.pieces import AnswerPieces
from workers.backends.vllm_headroom import SequenceGate, concurrency_limit
from workers.models import resolve_adapter

__all__ = [
    "DeltaJoin",
    "VLLMBackend",
    "engine_options",
    "generation_from",
    "last_before_deadline",
    "lora_options",
    "lora_rank",
    "map_vllm_exception",
    "model_source",
    "platform_problem",
    "sampling_options",
    "time_left",
    "vllm_errors",
]

T = TypeVar("T")


def model_source(model: str, model_dir: Path | None) -> str:
    """What vLLM loads for ``model``: ``<model_dir>/<model>`` or ``model_dir``
    itself, whichever is a Hugging Face model directory (has ``config.json``);
    without ``model_dir``, ``model`` as it is (a local path or a Hub id)."""
    if model_dir is None:
        return model
    candidates = (model_dir / model, model_dir)
    for candidate in candidates:
        if (candidate / "config.json").is_file():
            return str(candidate)
    raise BackendUnavailable(
        f"no Hugging Face model directory (with config.json) for {model!r} at "
        f"{' or '.join(str(c) for c in candidates)} (LANEWAY_BACKEND_VLLM_MODEL_DIR)"
    )


def platform_problem(platform: Any) -> str | None:
    """Why vLLM cannot run here, from its ``current_platform``; ``None``
    where it found a platform to run on (CUDA, ROCm, a CPU build, ...).
    Without one, building the engine fails deep in vLLM with "Device
    string must not be empty"."""
    if platform.is_unspecified():
        return (
            "vLLM finds no device to run on: no NVIDIA GPU is visible to this process "
            "(nvidia-smi -L lists none, the driver is missing, or CUDA_VISIBLE_DEVICES "
            "hides it), and this vllm is not a CPU build"
        )
    return None


LORA_RANKS = (1, 8, 16, 32, 64, 128, 256, 320, 512)
"""The ``max_lora_rank`` values vLLM's engine accepts."""


def lora_rank(adapter: Path) -> int:
    """The ``max_lora_rank`` a PEFT adapter directory needs: its
    ``adapter_config.json``'s ``r``, rounded up to a rank vLLM takes."""
    config = adapter / "adapter_config.json"
    try:
        r = int(json.loads(config.read_text())["r"])
    except (OSError, ValueError, KeyError, TypeError) as exc:
        raise BackendUnavailable(f"LoRA adapter {config}: no rank r to read: {exc}") from exc
    fits = [rank for rank in LORA_RANKS if rank >= r]
    if r < 1 or not fits:
        raise BackendUnavailable(
            f"LoRA adapter {config}: rank {r} is not one vLLM serves (at most {LORA_RANKS[-1]})"
        )
    return fits[0]


def lora_options(model: str, adapter: Path) -> dict[str, Any]:
    """vLLM ``LoRARequest`` keywords for ``model``'s adapter directory
    (``resolve_adapter``'s): the engine serves this one adapter, id 1."""
    return {"lora_name": f"{model}+{adapter.name}", "lora_int_id": 1, "lora_path": str(adapter)}


def engine_options(
    model: str, source: str, settings: BackendSettings, lora_rank: int | None = None
) -> dict[str, Any]:
    """vLLM ``AsyncEngineArgs`` keywords for ``model`` loaded from ``source``
    (``model_source``): the settings' length, memory share and eager mode;
    ``max_num_seqs`` only where the settings give one (vLLM's own default
    otherwise); with ``lora_rank`` (a version with an adapter), LoRA on for
    one adapter of at most that rank."""
    options: dict[str, Any] = {
        "model": source,
        "served_model_name": model,
        "max_model_len": settings.vllm_max_model_len,
        "gpu_memory_utilization": settings.vllm_gpu_memory_utilization,
        "enforce_eager": settings.vllm_enforce_eager,
        "disable_log_stats": True,
    }
    if settings.vllm_max_num_seqs is not None:
        options["max_num_seqs"] = settings.vllm_max_num_seqs
    if lora_rank is not None:
        options.update(enable_lora=True, max_loras=1, max_lora_rank=lora_rank)
    return options


def sampling_options(item: GenerationInput, stops: Sequence[str] = ()) -> dict[str, Any]:
    """vLLM ``SamplingParams`` keywords for one request.

    ``seed``: the request's own; else 0 when sampling (``temperature > 0``),
    so the same request gives the same answer as on llama.cpp; none when
    greedy, which has nothing to seed. ``stop``: ``stops`` (the prompt
    style's) and the request's own, ``None`` when there are none. ``top_p``:
    the request's, when it gave one (vLLM's default, 1, otherwise).
    """
    seed = item.seed
    if seed is None and item.temperature > 0:
        seed = 0
    stop = [*stops, *(item.stop or ())]
    options: dict[str, Any] = {
        "max_tokens": item.max_tokens,
        "temperature": item.temperature,
        "seed": seed,
        "stop": stop or None,
    }
    if item.top_p is not None:
        options["top_p"] = item.top_p
    return options


def time_left(deadline: float | None, now: float) -> float | None:
    """Seconds from ``now`` to ``deadline`` (both ``time.monotonic()``), at
    most 0 once it has passed; ``None`` without a deadline."""
    return None if deadline is None else deadline - now


async def last_before_deadline(
    stream: AsyncGenerator[T, None],
    deadline: float | None,
    abort: Callable[[], Awaitable[object]],
    each: Callable[[T], None] | None = None,
) -> T | DeadlineExceeded | None:
    """The last item of ``stream``, or ``DeadlineExceeded`` once ``deadline``
    passes first, after ``abort()`` (which frees the request's slot in the
    engine at once). Cancelled (its answer no longer wanted), it aborts too.
    The stream is closed either way; errors it raises propagate. ``None``:
    the stream ended without an item. ``each`` sees every item as it comes."""
    timer = asyncio.timeout(time_left(deadline, time.monotonic()))
    last: T | None = None
    try:
        async with timer:
            async for item in stream:
                if each is not None:
                    each(item)
                last = item
    except asyncio.CancelledError:
        with contextlib.suppress(Exception):
            await abort()
        raise
    except TimeoutError:
        if not timer.expired():
            raise  # a timeout of the engine's own, not the deadline
        with contextlib.suppress(Exception):
            await abort()
        return DeadlineExceeded("generation was cut off at the request's deadline")
    finally:
        await stream.aclose()
    return last


def _chain(exc: BaseException) -> Iterator[BaseException]:
    """``exc`` and the exceptions it was raised from or during, outermost first."""
    seen: set[int] = set()
    current: BaseException | None = exc
    while current is not None and id(current) not in seen and len(seen) < 10:
        seen.add(id(current))
        yield current
        current = current.__cause__ or (
            None if current.__suppress_context__ else current.__context__
        )


@functools.cache
def vllm_errors() -> ErrorMap:
    """The vLLM backend's error map: torch's CUDA errors (torch is a base
    dependency) and, where vLLM is importable, its dead engine, which must
    be dropped and loaded afresh (execution does that for CUDA-ERR)."""
    import torch

    errors: dict[type[BaseException], type[LanewayError]] = {
        **COMMON_ERRORS,
        torch.OutOfMemoryError: OutOfMemory,
        torch.AcceleratorError: CudaFailure,  # "CUDA error: ..." from a kernel
        torch.cuda.CudaError: CudaFailure,
    }
    errors.update(dict.fromkeys(_engine_dead(), CudaFailure))
    return errors


@functools.cache
def _engine_dead() -> tuple[type[BaseException], ...]:
    try:
        from vllm.v1.engine.exceptions import EngineDeadError
    except ImportError:
        return ()
    return (EngineDeadError,)


def map_vllm_exception(exc: BaseException) -> LanewayError:
    """``vllm_errors`` over the whole cause chain: vLLM wraps the error of
    a failed request (``EngineGenerateError`` from the CUDA error) and says
    little in its own message. A dead engine (``EngineDeadError``) is
    ``CudaFailure`` unless the chain holds the CUDA or memory error that
    killed it."""
    errors, dead = vllm_errors(), _engine_dead()
    chain = list(_chain(exc))
    text = " <- ".join(f"{type(e).__name__}: {e}" for e in chain)[:1000]
    for error in chain:
        mapped = map_backend_exception(error, errors)
        if isinstance(mapped, OutOfMemory | CudaFailure) and not isinstance(error, dead):
            return type(mapped)(text)
    if any(isinstance(e, dead) for e in chain):
        return CudaFailure(f"the vLLM engine died: {text}")
    mapped = map_backend_exception(exc, errors)
    if isinstance(mapped, BackendUnavailable):
        return BackendUnavailable(f"vLLM failed: {text}")
    return mapped


def generation_from(output: Any, *, strip: bool = False) -> Outcome:
    """A finished vLLM ``RequestOutput`` as a ``Generation``, with its token
    counts; an output the engine aborted (not at our deadline) or ended in
    its own error (``finish_reason`` "error": text empty or cut) is INF-502."""
    completion = output.outputs[0]
    if completion.finish_reason in ("abort", "error"):
        return BackendUnavailable(f"vLLM ended the request: {completion.finish_reason}")
    text = completion.text.strip() if strip else completion.text
    return Generation(
        text=text,
        prompt_tokens=len(output.prompt_token_ids or ()),
        completion_tokens=len(completion.token_ids),
        finish="length" if completion.finish_reason == "length" else "stop",
    )


class DeltaJoin:
    """A streamed request's ``DELTA`` outputs (each holds only what is new:
    text and token ids), each delta's text handed to ``on_text`` as it
    comes, joined into the finished output ``generation_from`` reads."""

    def __init__(self, on_text: Callable[[str], None], *, strip: bool) -> None:
        self._pieces = AnswerPieces(on_text, strip=strip)
        self._strip = strip
        self._text: list[str] = []
        self._tokens = 0
        self._prompt: Sequence[int] | None = None

    def add(self, output: Any) -> None:
        completion = output.outputs[0]
        if output.prompt_token_ids:
            self._prompt = output.prompt_token_ids
        self._tokens += len(completion.token_ids)
        if completion.text:
            self._text.append(completion.text)
            self._pieces(completion.text)

    def generation(self, last: Any) -> Outcome:
        """The whole answer, ``last`` being the final delta."""
        completion = last.outputs[0]
        joined = SimpleNamespace(
            text="".join(self._text),
            token_ids=range(self._tokens),
            finish_reason=completion.finish_reason,
        )
        whole = SimpleNamespace(prompt_token_ids=self._prompt, outputs=[joined])
        return generation_from(whole, strip=self._strip)


class VLLMBackend:
    kind = "vllm"

    @property
    def errors(self) -> ErrorMap:
        """``vllm_errors``, built when first asked for (it imports torch)."""
        return vllm_errors()

    def __init__(self, model: str, settings: BackendSettings, adapter: Path | None = None) -> None:
        self.model = model
        self._settings = settings
        self.adapter = adapter
        """The version's LoRA adapter (``workers.models.resolve_adapter``), or ``None``."""
        self._lora: Any = None
        """The ``LoRARequest`` every request carries (``None``: the base model)."""
        self._engine: Any = None
        self._tokenizer: Any = None
        self._vllm: dict[str, Any] = {}
        self._transcript: Callable[[Sequence[ChatMessage]], str] | None = None
        """A base model's prompt (no chat template): a Question/Answer transcript."""
        self._stops: tuple[str, ...] = ()
        self._max_model_len = 0
        self._ids = itertools.count()
        self._gate = SequenceGate(None)
        """The article's headroom: requests in the engine at once, at most
        ``vllm_kv_concurrency_share`` of what its KV cache holds."""

    async def load(self) -> None:
        """Build the engine here, on the event loop's (main) thread, as vLLM's
        own API server does: the engine starts its output handler on the
        running loop. The loop is blocked until the engine-core process has
        loaded the model (seconds to minutes): a GPU worker's
        ``LANEWAY_LOOP_STALL_S`` must outlast a cold load, or its /healthz
        fails during it."""
        if self._engine is not None:
            return
        try:
            from vllm import AsyncEngineArgs, AsyncLLMEngine, SamplingParams
            from vllm.inputs import tokens_input
            from vllm.lora.request import LoRARequest
            from vllm.platforms import current_platform
            from vllm.sampling_params import RequestOutputKind
        except ImportError as exc:
            raise BackendUnavailable(f"vllm is not installed (laneway[gpu]): {exc}") from exc
        problem = platform_problem(current_platform)
        if problem is not None:
            raise BackendUnavailable(f"vLLM cannot load {self.model}: {problem}")
        source = model_source(self.model, self._settings.vllm_model_dir)
        adapter = None if self.adapter is None else resolve_adapter(self.kind, self.adapter)
        rank = None if adapter is None else lora_rank(adapter)
        args = AsyncEngineArgs(**engine_options(self.model, source, self._settings, rank))
        try:
            engine = AsyncLLMEngine.from_engine_args(args)
        except Exception as exc:
            raise BackendUnavailable(
                f"vLLM could not load {source}: {map_vllm_exception(exc).message}"
            ) from exc
        try:
            tokenizer = engine.get_tokenizer()
            if inspect.isawaitable(tokenizer):  # a coroutine in older vLLM releases
                tokenizer = await tokenizer
        except Exception as exc:
            engine.shutdown()
            raise BackendUnavailable(f"vLLM has no tokenizer for {source}: {exc}") from exc
        self._engine, self._tokenizer = engine, tokenizer
        if adapter is not None:
            self._lora = LoRARequest(**lora_options(self.model, adapter))
        if not getattr(tokenizer, "chat_template", None):
            # As llama.cpp prompts base models (its module loads llama.cpp itself).
            from workers.backends.llamacpp import TRANSCRIPT_STOPS, as_transcript

            self._transcript, self._stops = as_transcript, TRANSCRIPT_STOPS
        self._max_model_len = int(engine.model_config.max_model_len)
        self._gate = SequenceGate(concurrency_limit(engine, self._settings, self._max_model_len))
        self._vllm = {
            "SamplingParams": SamplingParams,
            "tokens_input": tokens_input,
            "FINAL_ONLY": RequestOutputKind.FINAL_ONLY,
            "DELTA": RequestOutputKind.DELTA,
        }

    def _prompt_ids(self, messages: Sequence[ChatMessage]) -> list[int]:
        """The chat template's rendering of ``messages`` (a Question/Answer
        transcript for a model without one), as token ids."""
        if self._transcript is not None:
            return list(self._tokenizer.encode(self._transcript(messages)))
        text = self._tokenizer.apply_chat_template(
            [m.model_dump() for m in messages], tokenize=False, add_generation_prompt=True
        )
        # The template writes the special tokens (BOS) itself.
        return list(self._tokenizer.encode(text, add_special_tokens=False))

    async def infer_batch(self, inputs: Sequence[GenerationInput]) -> list[Outcome]:
        if self._engine is None:
            raise BackendUnavailable(f"vLLM model {self.model} is not loaded")
        return list(
            await asyncio.gather(
                *(until_unwanted(self._one(item), item.unwanted) for item in inputs)
            )
        )

    async def _one(self, item: GenerationInput) -> Outcome:
        engine = self._engine
        left = time_left(item.deadline, time.monotonic())
        if left is not None and left <= 0:
            return DeadlineExceeded(
                f"deadline passed {-left * 1000:.0f} ms before generation started"
            )
        try:
            ids = self._prompt_ids(item.messages)
        except Exception as exc:
            return map_vllm_exception(exc)
        if len(ids) >= self._max_model_len:
            return InvalidRequest(
                f"the prompt has {len(ids)} tokens; {self.model} takes fewer than "
                f"{self._max_model_len} (LANEWAY_BACKEND_VLLM_MAX_MODEL_LEN)"
            )
        options = sampling_options(item, self._stops)
        request_id = f"laneway-{next(self._ids)}"
        strip = self._transcript is not None
        joined = DeltaJoin(item.on_text, strip=strip) if item.on_text is not None else None
        kind = self._vllm["FINAL_ONLY"] if joined is None else self._vllm["DELTA"]
        async with self._gate.slot(item.deadline) as admitted:
            if not admitted:
                return DeadlineExceeded(
                    "deadline passed waiting for a vLLM sequence slot "
                    "(LANEWAY_BACKEND_VLLM_KV_CONCURRENCY_SHARE)"
                )
            try:
                params = self._vllm["SamplingParams"](**options, output_kind=kind)
                adapter = {} if self._lora is None else {"lora_request": self._lora}
                stream = engine.generate(
                    self._vllm["tokens_input"](ids), params, request_id, **adapter
                )
                final = await last_before_deadline(
                    stream,
                    item.deadline,
                    lambda: engine.abort(request_id),
                    joined.add if joined is not None else None,
                )
            except Exception as exc:
                return map_vllm_exception(exc)
        if final is None:
            return BackendUnavailable("vLLM ended the request without an output")
        if isinstance(final, DeadlineExceeded):
            return final
        if joined is not None:
            return joined.generation(final)
        return generation_from(final, strip=strip)

    async def check_health(self) -> bool:
        if self._engine is None:
            return False
        try:
            await self._engine.check_health()
        except Exception:
            return False
        return True

    async def close(self) -> None:
        engine, self._engine = self._engine, None
        if engine is not None:
            engine.shutdown()
