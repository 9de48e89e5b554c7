"""In-process vLLM engine for GPUs (``pip install laneway[gpu]``).

vLLM is imported only when this backend is chosen. A batch goes to the
engine in one ``LLM.chat`` call, so vLLM's continuous batching does the work.
CUDA and out-of-memory errors map to ``CUDA-ERR`` and ``MEM-ERR``.
"""

from __future__ import annotations

import asyncio
import threading
from collections.abc import Sequence
from typing import Any

from schemas.errors import BackendUnavailable
from schemas.settings import BackendSettings
from workers.backends.base import Generation, GenerationInput, Outcome, map_backend_exception

__all__ = ["VLLMBackend"]


class VLLMBackend:
    kind = "vllm"

    def __init__(self, model: str, settings: BackendSettings) -> None:
        self.model = model
        self._settings = settings
        self._llm: Any = None
        self._lock = threading.Lock()

    async def load(self) -> None:
        await asyncio.to_thread(self._load_sync)

    def _load_sync(self) -> None:
        try:
            from vllm import LLM
        except ImportError as exc:
            raise BackendUnavailable(f"vllm is not installed (laneway[gpu]): {exc}") from exc
        try:
            self._llm = LLM(
                model=self.model,
                gpu_memory_utilization=self._settings.vllm_gpu_memory_utilization,
            )
        except Exception as exc:
            raise map_backend_exception(exc) from exc

    async def infer_batch(self, inputs: Sequence[GenerationInput]) -> list[Outcome]:
        if self._llm is None:
            raise BackendUnavailable(f"vLLM model {self.model} is not loaded")
        return await asyncio.to_thread(self._infer_sync, inputs)

    def _infer_sync(self, inputs: Sequence[GenerationInput]) -> list[Outcome]:
        from vllm import SamplingParams

        params = [
            SamplingParams(max_tokens=i.max_tokens, temperature=i.temperature, seed=0)
            for i in inputs
        ]
        conversations = [[m.model_dump() for m in i.messages] for i in inputs]
        with self._lock:
            outputs = self._llm.chat(conversations, params, use_tqdm=False)
        return [
            Generation(
                text=out.outputs[0].text,
                prompt_tokens=len(out.prompt_token_ids or ()),
                completion_tokens=len(out.outputs[0].token_ids),
            )
            for out in outputs
        ]

    async def check_health(self) -> bool:
        return self._llm is not None

    async def close(self) -> None:
        self._llm = None
