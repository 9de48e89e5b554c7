"""The vllm backend on a real GPU: vLLM's async engine in process, with a
local model directory (nothing is downloaded).

Runs only where all three are present, and is skipped saying which is not:
``laneway[gpu]`` (vllm), an NVIDIA GPU (``nvidia-smi -L`` lists one), and
``LANEWAY_BACKEND_VLLM_MODEL_DIR``, a Hugging Face model directory
(``config.json``, tokenizer, ``*.safetensors``) of an instruct model with a
chat template, e.g. SmolLM2-135M-Instruct. ``compose/gpu-check.sh`` runs
these tests and the GPU batching bench. The engine loads once for the module;
``LANEWAY_BACKEND_VLLM_ENFORCE_EAGER=true`` makes that take seconds."""

from __future__ import annotations

import asyncio
import importlib.util
import shutil
import subprocess
import time
from collections.abc import AsyncIterator

import pytest
import pytest_asyncio

from schemas.errors import DeadlineExceeded
from schemas.messages import ChatMessage
from schemas.settings import BackendSettings
from workers.backends.base import Backend, Generation, GenerationInput, create_backend


def missing() -> str | None:
    """Why these tests cannot run here, or ``None``."""
    if importlib.util.find_spec("vllm") is None:
        return "needs laneway[gpu]: vllm is not installed"
    model_dir = BackendSettings().vllm_model_dir
    if model_dir is None:
        return (
            "needs LANEWAY_BACKEND_VLLM_MODEL_DIR, a local Hugging Face model directory "
            "(nothing is downloaded)"
        )
    if not (model_dir / "config.json").is_file():
        return f"LANEWAY_BACKEND_VLLM_MODEL_DIR={model_dir} has no config.json"
    # nvidia-smi rather than torch.cuda: CUDA initialised in this process
    # would force vLLM's engine process onto the slower spawn start method.
    smi = shutil.which("nvidia-smi")
    listed = smi and subprocess.run([smi, "-L"], capture_output=True, text=True, timeout=30)
    if not listed or listed.returncode != 0 or "GPU" not in listed.stdout:
        return "needs an NVIDIA GPU (nvidia-smi -L lists none)"
    return None


REASON = missing()

pytestmark = [
    pytest.mark.gpu,
    pytest.mark.skipif(REASON is not None, reason=REASON or ""),
    pytest.mark.asyncio(loop_scope="module"),
    # vLLM, torch and transformers warn as they load (a FutureWarning, a
    # UserWarning); the suite's "error" would fail the engine fixture on it.
    pytest.mark.filterwarnings("default"),
]


def ask(text: str, max_tokens: int = 24, timeout_s: float | None = None) -> GenerationInput:
    deadline = None if timeout_s is None else time.monotonic() + timeout_s
    return GenerationInput(
        [ChatMessage(role="user", content=text)], max_tokens, 0.0, deadline=deadline
    )


PROMPTS = [
    "What is the capital of France?",
    "Name a colour of the rainbow.",
    "What is 2 + 2?",
    "Say hello in Spanish.",
    "Name a planet of the solar system.",
    "What do bees make?",
    "What is the opposite of cold?",
    "Name a fruit that is yellow.",
]


@pytest_asyncio.fixture(scope="module", loop_scope="module")
async def vllm() -> AsyncIterator[Backend]:
    backend = create_backend("vllm", "gpu-test", BackendSettings())
    started = time.monotonic()
    await backend.load()
    print(f"\nvLLM engine loaded in {time.monotonic() - started:.1f} s")
    yield backend
    await backend.close()


async def test_a_batch_of_different_prompts_is_answered(vllm: Backend) -> None:
    outcomes = await vllm.infer_batch([ask(p) for p in PROMPTS])
    assert len(outcomes) == len(PROMPTS)
    for prompt, outcome in zip(PROMPTS, outcomes, strict=True):
        assert isinstance(outcome, Generation), (prompt, outcome)
        assert outcome.text.strip(), prompt
        assert 0 < outcome.completion_tokens <= 24 and outcome.prompt_tokens > 0
    assert len({o.text for o in outcomes if isinstance(o, Generation)}) > 1
    assert await vllm.check_health()


async def test_concurrent_batches_share_the_running_engine(vllm: Backend) -> None:
    """Four batches at once take far less than four batches in a row: each
    request joins vLLM's running batch instead of waiting for a turn."""

    def batch(tag: int) -> list[GenerationInput]:
        return [ask(f"Write a long story about a {p.lower()} ({tag})", 96) for p in PROMPTS[:4]]

    started = time.monotonic()
    alone = await vllm.infer_batch(batch(0))
    alone_s = time.monotonic() - started
    started = time.monotonic()
    together = await asyncio.gather(*(vllm.infer_batch(batch(tag)) for tag in range(1, 5)))
    together_s = time.monotonic() - started
    print(f"\none batch of 4: {alone_s:.2f} s; four concurrent batches of 4: {together_s:.2f} s")
    assert all(isinstance(o, Generation) for o in alone)
    assert all(isinstance(o, Generation) for outcomes in together for o in outcomes)
    assert together_s < 2.5 * alone_s


async def test_a_deadline_cuts_its_request_and_spares_the_others(vllm: Backend) -> None:
    started = time.monotonic()
    cut, answered, late = await vllm.infer_batch(
        [
            ask("Count from 1 to 5000, one number per line.", 3000, timeout_s=0.1),
            ask("What is the capital of France?"),
            ask("Say hi.", timeout_s=-1.0),
        ]
    )
    assert isinstance(cut, DeadlineExceeded), cut
    assert "cut off at the request's deadline" in cut.message
    assert isinstance(late, DeadlineExceeded) and "before generation started" in late.message
    assert isinstance(answered, Generation) and answered.text
    assert time.monotonic() - started < 10
    # The aborted request gave its slot back: the engine serves on.
    (after,) = await vllm.infer_batch([ask("Name a fruit.")])
    assert isinstance(after, Generation) and after.text


async def test_greedy_answers_are_the_same_alone_and_batched(vllm: Backend) -> None:
    """Batching must not mix requests up. Short answers to questions the
    model is sure of: vLLM's kernels are not bit-identical across batch
    sizes, so a long answer may part at a near tie. Should this fail,
    ``VLLM_BATCH_INVARIANT=1`` tells such a tie from a mix-up."""
    chosen = PROMPTS[:4]
    alone = [(await vllm.infer_batch([ask(p, 8)]))[0] for p in chosen]
    fillers = [ask(f"Tell me a fact about the number {n}.", 8) for n in range(12)]
    batched = (await vllm.infer_batch([ask(p, 8) for p in chosen] + fillers))[: len(chosen)]
    for prompt, one, many in zip(chosen, alone, batched, strict=True):
        assert isinstance(one, Generation) and isinstance(many, Generation)
        assert one.text == many.text, f"{prompt!r}: alone {one.text!r}, batched {many.text!r}"
