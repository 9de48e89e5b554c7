"""A version's LoRA adapter on llama.cpp, with the real SmolLM2-135M and a
real GGUF LoRA adapter written for it (``tests.adapters``): the adapter
changes what the model says, alike on one sequence and on many, a
student directory's adapter is loaded by the backend, and a missing or
foreign adapter fails the load naming the file. Where a backend looks for
a student directory's adapter (``resolve_adapter``) is checked on plain
files."""

from __future__ import annotations

from pathlib import Path

import pytest

from schemas.errors import BackendUnavailable
from schemas.messages import ChatMessage
from schemas.settings import BackendSettings
from tests.adapters import write_lora_adapter
from workers.backends.base import Generation, GenerationInput, create_backend
from workers.backends.llama_batch import BatchDecoder, Decoded, SequenceRequest
from workers.models import STUDENT_GGUF, STUDENT_PEFT, resolve_adapter, resolve_gguf

SETTINGS = BackendSettings(n_ctx=512, llamacpp_max_sequences=2)


@pytest.fixture(scope="module")
def base() -> Path:
    return resolve_gguf("smollm2-135m", SETTINGS.model_dir)


@pytest.fixture(scope="module")
def strong(base: Path, tmp_path_factory: pytest.TempPathFactory) -> Path:
    """An adapter whose weights move the model's answers (every block's q and v)."""
    return write_lora_adapter(
        tmp_path_factory.mktemp("lora") / "strong.gguf", base, rank=4, scale=0.5
    )


def chat(question: str) -> str:
    return f"<|im_start|>user\n{question}<|im_end|>\n<|im_start|>assistant\n"


def answers(base: Path, adapter: Path | None, sequences: int) -> list[str]:
    """Greedy answers of the decoder with ``sequences`` slots, both prompts at once."""
    decoder = BatchDecoder(
        str(base),
        n_ctx=256,
        max_sequences=sequences,
        max_batch_tokens=1024,
        n_threads=1,
        repeat_penalty=1.0,
        adapter=None if adapter is None else str(adapter),
    )
    decoder.start().result(timeout=60)
    try:
        futures = decoder.submit(
            [
                SequenceRequest(chat("What is the capital of France?"), max_tokens=8),
                SequenceRequest(chat("Name a colour."), max_tokens=8),
            ]
        )
        results = [f.result(timeout=120) for f in futures]
    finally:
        decoder.close()
    assert all(isinstance(r, Decoded) for r in results), results
    return [r.text for r in results if isinstance(r, Decoded)]


@pytest.fixture(scope="module")
def plain(base: Path) -> list[str]:
    return answers(base, None, 2)


def test_the_adapter_is_applied_alike_on_one_sequence_and_on_many(
    base: Path, strong: Path, plain: list[str]
) -> None:
    alone, batched = answers(base, strong, 1), answers(base, strong, 2)
    assert alone != plain, (alone, plain)
    assert batched == alone  # greedy SmolLM2 answers do not depend on their batch-mates


async def test_the_backend_loads_a_student_directorys_adapter(base: Path, tmp_path: Path) -> None:
    write_lora_adapter(tmp_path / STUDENT_GGUF, base, scale=0.001, layers=2)
    backend = create_backend("llamacpp", "smollm2-135m", SETTINGS, tmp_path)
    await backend.load()
    try:
        (out,) = await backend.infer_batch(
            [GenerationInput([ChatMessage(role="user", content="Hi")], 4, 0.0)]
        )
    finally:
        await backend.close()
    assert isinstance(out, Generation) and out.completion_tokens > 0, out


async def test_a_missing_adapter_fails_the_load_naming_it(tmp_path: Path) -> None:
    backend = create_backend("llamacpp", "smollm2-135m", SETTINGS, tmp_path / "gone.gguf")
    with pytest.raises(BackendUnavailable, match=r"gone\.gguf"):
        await backend.load()


async def test_an_adapter_llama_cpp_refuses_fails_the_load_naming_it(
    base: Path, tmp_path: Path
) -> None:
    """An adapter made for another architecture (its GGUF says gemma3), and
    a file that is no GGUF at all."""
    foreign = write_lora_adapter(tmp_path / "gemma.gguf", base, layers=1, arch="gemma3")
    backend = create_backend("llamacpp", "smollm2-135m", SETTINGS, foreign)
    with pytest.raises(BackendUnavailable, match=r"LoRA adapter .*gemma\.gguf"):
        await backend.load()
    not_an_adapter = tmp_path / "junk.gguf"
    not_an_adapter.write_bytes(b"GGUF but not really")
    backend = create_backend("llamacpp", "smollm2-135m", SETTINGS, not_an_adapter)
    with pytest.raises(BackendUnavailable, match=r"junk\.gguf"):
        await backend.load()


def test_a_backend_finds_its_part_of_a_student_directory(tmp_path: Path) -> None:
    (tmp_path / STUDENT_GGUF).write_bytes(b"x")
    (tmp_path / STUDENT_PEFT).mkdir()
    (tmp_path / STUDENT_PEFT / "adapter_config.json").write_text('{"r": 8}')
    assert resolve_adapter("llamacpp", tmp_path) == tmp_path / STUDENT_GGUF
    assert resolve_adapter("llamacpp", tmp_path / STUDENT_GGUF) == tmp_path / STUDENT_GGUF
    assert resolve_adapter("vllm", tmp_path) == tmp_path / STUDENT_PEFT
    assert resolve_adapter("vllm", tmp_path / STUDENT_PEFT) == tmp_path / STUDENT_PEFT
    with pytest.raises(BackendUnavailable, match="peft"):
        resolve_adapter("vllm", tmp_path / STUDENT_GGUF)
    with pytest.raises(BackendUnavailable, match="takes no LoRA adapter"):
        resolve_adapter("openai", tmp_path)


def test_a_backend_that_takes_no_adapter_refuses_one(tmp_path: Path) -> None:
    with pytest.raises(BackendUnavailable, match="takes no LoRA adapter"):
        create_backend("openai", "gpt", SETTINGS, tmp_path)
