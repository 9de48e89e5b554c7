"""Each backend against the real thing: llama.cpp with the wheel-shipped
GGUF models, the openai backend against ``llama_cpp.server`` (a real
OpenAI-compatible server, as vLLM's would be). vLLM on a GPU: test_vllm.py."""

from __future__ import annotations

import asyncio
import dataclasses
import importlib.util
import time
from collections.abc import AsyncIterator, Iterator
from pathlib import Path

import pytest

from schemas.errors import BackendUnavailable, DeadlineExceeded
from schemas.messages import AnswerPath, ChatMessage, InferenceRequest, Lane, RoutedRequest
from schemas.settings import BackendSettings
from streams.devstack.embedded import free_port
from workers.backends.base import (
    STOPPED,
    Backend,
    Generation,
    GenerationInput,
    create_backend,
)
from workers.execution import Executor, backend_slots
from workers.models import resolve_gguf

from .conftest import routed_now
from .servers import llama_cpp_server


def ask(text: str, max_tokens: int = 12, timeout_s: float | None = None) -> GenerationInput:
    deadline = None if timeout_s is None else time.monotonic() + timeout_s
    return GenerationInput(
        [ChatMessage(role="user", content=text)], max_tokens, 0.0, deadline=deadline
    )


@pytest.fixture
async def smollm2() -> AsyncIterator[Backend]:
    backend = create_backend("llamacpp", "smollm2-135m", BackendSettings())
    await backend.load()
    yield backend
    await backend.close()


async def test_llamacpp_batch_is_deterministic_at_temperature_zero(smollm2: Backend) -> None:
    first = await smollm2.infer_batch([ask("What is the capital of France?"), ask("Say hi.")])
    again = await smollm2.infer_batch([ask("What is the capital of France?")])
    assert all(isinstance(o, Generation) and o.text for o in first)
    assert isinstance(first[0], Generation) and first[0] == again[0]
    assert 0 < first[0].completion_tokens <= 12 and first[0].prompt_tokens > 0
    assert await smollm2.check_health()


async def test_llamacpp_deadline_bounds_generation(smollm2: Backend) -> None:
    (outcome,) = await smollm2.infer_batch([ask("Write a long story.", 400, timeout_s=0.05)])
    assert isinstance(outcome, DeadlineExceeded)


async def test_a_deadline_counts_from_before_the_batch_not_from_each_item(
    smollm2: Backend,
) -> None:
    # Three items share one 0.3 s budget and are decoded together: all are
    # cut off at that deadline, none gets 0.3 s of its own after another.
    batch = [ask("Write a long story.", 400, timeout_s=0.3) for _ in range(3)]
    started = time.monotonic()
    outcomes = await smollm2.infer_batch(batch)
    assert all(isinstance(o, DeadlineExceeded) for o in outcomes)
    assert all("cut off" in o.message for o in outcomes)  # type: ignore[union-attr]
    assert time.monotonic() - started < 5


async def test_gemma_is_assembled_once_and_answers(tmp_path: Path) -> None:
    settings = BackendSettings(model_dir=tmp_path)
    path = resolve_gguf("gemma3-270m", tmp_path)
    assert path.stat().st_mtime == resolve_gguf("gemma3-270m", tmp_path).stat().st_mtime
    backend = create_backend("llamacpp", "gemma3-270m", settings)
    await backend.load()
    try:
        (outcome,) = await backend.infer_batch([ask("What is the capital of France?", 8)])
    finally:
        await backend.close()
    assert isinstance(outcome, Generation) and "Paris" in outcome.text


@pytest.fixture(scope="module")
def openai_server() -> Iterator[str]:
    with llama_cpp_server(free_port()) as url:
        yield url


async def test_openai_backend_against_a_real_server(openai_server: str) -> None:
    backend = create_backend("openai", "smollm2", BackendSettings(openai_base_url=openai_server))
    await backend.load()
    try:
        outcomes = await backend.infer_batch([ask("What is 2+2?"), ask("Name a fruit.")])
    finally:
        await backend.close()
    assert all(isinstance(o, Generation) and o.text and o.completion_tokens > 0 for o in outcomes)


async def test_openai_backend_stops_a_request_no_longer_wanted(openai_server: str) -> None:
    backend = create_backend("openai", "smollm2", BackendSettings(openai_base_url=openai_server))
    await backend.load()
    unwanted = asyncio.Event()
    story = ask("Write a long story about a dragon.", max_tokens=400)
    story = dataclasses.replace(story, unwanted=unwanted)
    setting = asyncio.get_running_loop().call_later(0.5, unwanted.set)
    began = time.monotonic()
    try:
        (outcome,) = await backend.infer_batch([story])
    finally:
        setting.cancel()
        await backend.close()
    assert isinstance(outcome, DeadlineExceeded) and outcome.message == STOPPED
    assert time.monotonic() - began < 5, "the HTTP request was dropped at once"


async def test_breaker_opens_on_a_dead_server_and_closes_when_it_is_back() -> None:
    port = free_port()
    settings = BackendSettings(
        heavy="openai",
        heavy_model="smollm2",
        openai_base_url=f"http://127.0.0.1:{port}/v1",
        light="rules",
        breaker_failures=2,
        breaker_cooldown_s=1.0,
        load_retry_s=0,
    )
    slots = backend_slots(settings)
    executor = Executor(Lane.MEDIUM, slots)

    def ping() -> RoutedRequest:
        request = InferenceRequest(id="p", prompt="ping", max_tokens=8)
        return routed_now(request, "laneway.replies", path=AnswerPath.HEAVY, lane=Lane.MEDIUM)

    try:
        for _ in range(2):  # the server is down: the light path answers, marked degraded
            (done,) = await executor.execute([ping()])
            assert done.result.status == "ok" and done.result.path == "light"
            assert done.result.degraded and done.result.requested_path == "heavy"
        assert slots[AnswerPath.HEAVY].breaker.state == "open"

        with llama_cpp_server(port):
            await asyncio.sleep(settings.breaker_cooldown_s)
            (done,) = await executor.execute([ping()])  # the half-open probe
            assert done.result.status == "ok", done.result.error
            assert done.result.path == "heavy" and not done.result.degraded
            assert done.result.model == "openai:smollm2"
            assert slots[AnswerPath.HEAVY].breaker.state == "closed"
    finally:
        await executor.close()


async def test_openai_backend_unreachable_is_inf_502() -> None:
    settings = BackendSettings(openai_base_url=f"http://127.0.0.1:{free_port()}/v1")
    backend = create_backend("openai", "m", settings)
    with pytest.raises(BackendUnavailable, match="no OpenAI-compatible server"):
        await backend.load()
    await backend.close()


async def test_vllm_backend_without_the_extra_is_a_clear_inf_502() -> None:
    if importlib.util.find_spec("vllm") is not None:
        pytest.skip("vllm is installed here")
    backend = create_backend("vllm", "m", BackendSettings())
    with pytest.raises(BackendUnavailable, match=r"laneway\[gpu\]"):
        await backend.load()


async def streamed(backend: Backend, item: GenerationInput) -> tuple[list[str], Generation]:
    """``item`` run with a listener: the pieces it was handed, and the answer."""
    pieces: list[str] = []
    (outcome,) = await backend.infer_batch([dataclasses.replace(item, on_text=pieces.append)])
    assert isinstance(outcome, Generation), outcome
    return pieces, outcome


@pytest.mark.parametrize("model", ["smollm2-135m", "gemma3-270m"])
async def test_llamacpp_streams_pieces_that_join_into_the_greedy_answer(
    model: str, tmp_path: Path
) -> None:
    # SmolLM2 answers through its chat template; Gemma-3 (a base model)
    # through a transcript whose answer is stripped, so its pieces hold back
    # white space at either end.
    backend = create_backend("llamacpp", model, BackendSettings(model_dir=tmp_path))
    await backend.load()
    try:
        story = ask("Write a short story about a dragon.", max_tokens=48)
        (plain,) = await backend.infer_batch([story])
        pieces, answer = await streamed(backend, story)
        short_pieces, short = await streamed(backend, ask("What is the capital of France?", 40))
    finally:
        await backend.close()
    assert answer == plain, "streaming changes nothing of the answer"
    assert "".join(pieces) == answer.text and len(pieces) > 5
    assert answer.finish == "length" and answer.completion_tokens == 48
    assert short.finish == "stop" and "".join(short_pieces) == short.text


async def test_llamacpp_streams_each_sequence_of_a_batch_apart(smollm2: Backend) -> None:
    prompts = ["Name a fruit.", "Count from one to ten.", "Say hi.", "Describe the sea."]
    pieces: list[list[str]] = [[] for _ in prompts]
    items = [
        dataclasses.replace(ask(p, 24), on_text=own.append)
        for p, own in zip(prompts, pieces, strict=True)
    ]
    outcomes = await smollm2.infer_batch(items)
    for own, outcome in zip(pieces, outcomes, strict=True):
        assert isinstance(outcome, Generation) and "".join(own) == outcome.text


async def test_openai_backend_streams_from_the_servers_sse(openai_server: str) -> None:
    backend = create_backend("openai", "smollm2", BackendSettings(openai_base_url=openai_server))
    await backend.load()
    try:
        question = ask("Write a short story about a dragon.", max_tokens=32)
        (plain,) = await backend.infer_batch([question])
        pieces, answer = await streamed(backend, question)
    finally:
        await backend.close()
    assert isinstance(plain, Generation)
    assert answer.text == plain.text and "".join(pieces) == answer.text and len(pieces) > 5
    assert answer.finish == plain.finish == "length"
    assert answer.completion_tokens == plain.completion_tokens == 32
