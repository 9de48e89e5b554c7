"""Any OpenAI-compatible HTTP server: this is how a vLLM server (``vllm
serve``) is used, and how the tests reach ``llama_cpp.server``. A batch is
sent as concurrent requests; the server does the batching."""

from __future__ import annotations

import asyncio
import json
from collections.abc import Callable, Sequence
from typing import Any, ClassVar, Literal

import httpx

from schemas.errors import BackendUnavailable, DeadlineExceeded, InvalidRequest, LanewayError
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

__all__ = ["OPENAI_ERRORS", "OpenAIBackend"]

OPENAI_ERRORS: ErrorMap = {
    **COMMON_ERRORS,
    httpx.TimeoutException: DeadlineExceeded,
    httpx.HTTPError: BackendUnavailable,
    ValueError: BackendUnavailable,  # a reply that is not the JSON it should be
    LookupError: BackendUnavailable,
    TypeError: BackendUnavailable,
    AttributeError: BackendUnavailable,
}
"""httpx's errors and a malformed reply's, as an OpenAI-compatible server gives them."""


class OpenAIBackend:
    kind = "openai"
    errors: ClassVar[ErrorMap] = OPENAI_ERRORS

    def __init__(self, model: str, settings: BackendSettings) -> None:
        self.model = model
        self._settings = settings
        self._client: httpx.AsyncClient | None = None

    async def load(self) -> None:
        self._client = httpx.AsyncClient(
            base_url=self._settings.openai_base_url.rstrip("/") + "/",
            headers={"Authorization": f"Bearer {self._settings.openai_api_key.get_secret_value()}"},
            timeout=self._settings.openai_timeout_s,
        )
        if not await self.check_health():
            raise BackendUnavailable(
                f"no OpenAI-compatible server answers at {self._settings.openai_base_url}"
            )

    async def infer_batch(self, inputs: Sequence[GenerationInput]) -> list[Outcome]:
        if self._client is None:
            raise BackendUnavailable("openai backend is not loaded")
        client = self._client
        return list(
            await asyncio.gather(
                *(until_unwanted(self._one(client, item), item.unwanted) for item in inputs)
            )
        )

    async def _one(self, client: httpx.AsyncClient, item: GenerationInput) -> Outcome:
        body: dict[str, Any] = {
            "model": self.model,
            "messages": [m.model_dump() for m in item.messages],
            "max_tokens": item.max_tokens,
            "temperature": item.temperature,
        }
        if item.stop:
            body["stop"] = list(item.stop)
        if item.seed is not None:
            body["seed"] = item.seed
        if item.top_p is not None:
            body["top_p"] = item.top_p
        timeout = self._settings.openai_timeout_s
        remaining = item.remaining_s()
        if remaining is not None:
            if remaining <= 0:
                return DeadlineExceeded("deadline passed before the request was sent")
            timeout = min(timeout, remaining)
        if item.on_text is not None:
            body["stream"] = True
            body["stream_options"] = {"include_usage": True}
            return await self._streamed(client, body, timeout, item.on_text)
        try:
            response = await client.post("chat/completions", json=body, timeout=timeout)
        except httpx.TimeoutException as exc:
            return DeadlineExceeded(
                f"OpenAI-compatible server timed out after {timeout:.3f}s: {exc}"
            )
        except httpx.HTTPError as exc:
            return BackendUnavailable(f"OpenAI-compatible server unreachable: {exc}")
        if response.status_code != 200:
            return _http_error(response)
        try:
            data = response.json()
            usage = data.get("usage") or {}
            choice = data["choices"][0]
            return Generation(
                text=choice["message"]["content"] or "",
                prompt_tokens=int(usage.get("prompt_tokens", 0)),
                completion_tokens=int(usage.get("completion_tokens", 0)),
                finish=_finish(choice.get("finish_reason")),
            )
        except (ValueError, KeyError, IndexError, TypeError) as exc:
            return map_backend_exception(exc, OPENAI_ERRORS)

    async def _streamed(
        self,
        client: httpx.AsyncClient,
        body: dict[str, Any],
        limit_s: float,
        on_text: Callable[[str], None],
    ) -> Outcome:
        """The answer read from the server's SSE stream, each content delta
        handed to ``on_text`` as it comes."""
        pieces: list[str] = []
        finish: str | None = None
        usage: dict[str, Any] = {}
        deltas = 0
        try:
            async with asyncio.timeout(limit_s):
                async with client.stream(
                    "POST", "chat/completions", json=body, timeout=limit_s
                ) as response:
                    if response.status_code != 200:
                        await response.aread()
                        return _http_error(response)
                    async for line in response.aiter_lines():
                        if not line.startswith("data:"):
                            continue
                        data = line[5:].strip()
                        if data == "[DONE]":
                            break
                        event = json.loads(data)
                        if event.get("error"):
                            return BackendUnavailable(f"server stream failed: {event['error']}")
                        usage = event.get("usage") or usage
                        for choice in event.get("choices") or ():
                            text = (choice.get("delta") or {}).get("content")
                            if text:
                                pieces.append(text)
                                deltas += 1
                                on_text(text)
                            finish = choice.get("finish_reason") or finish
        except (TimeoutError, httpx.TimeoutException) as exc:
            return DeadlineExceeded(
                f"OpenAI-compatible server timed out after {limit_s:.3f}s: {exc!r}"
            )
        except httpx.HTTPError as exc:
            return BackendUnavailable(f"OpenAI-compatible server unreachable: {exc}")
        except (ValueError, KeyError, TypeError, AttributeError) as exc:
            return map_backend_exception(exc, OPENAI_ERRORS)
        return Generation(
            text="".join(pieces),
            prompt_tokens=int(usage.get("prompt_tokens", 0)),
            # A server that sends no usage in a stream: one delta is one token.
            completion_tokens=int(usage.get("completion_tokens", deltas)),
            finish=_finish(finish),
        )

    async def check_health(self) -> bool:
        if self._client is None:
            return False
        try:
            response = await self._client.get("models", timeout=5.0)
        except httpx.HTTPError:
            return False
        return response.status_code == 200

    async def close(self) -> None:
        client, self._client = self._client, None
        if client is not None:
            await client.aclose()


def _finish(reason: object) -> Literal["stop", "length"]:
    """OpenAI's ``finish_reason`` as laneway's: ``length`` stays, every
    other end (``stop``, a tool call, a filter) is ``stop``."""
    return "length" if reason == "length" else "stop"


def _http_error(response: httpx.Response) -> LanewayError:
    detail = response.text[:300]
    if response.status_code in (400, 413, 422):
        return InvalidRequest(f"server refused the request ({response.status_code}): {detail}")
    return BackendUnavailable(f"server answered {response.status_code}: {detail}")
