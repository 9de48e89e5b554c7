"""The vLLM backend's decisions, without vLLM or a GPU: which model directory
it loads, each request's sampling parameters, the deadline that aborts a
request, and how vLLM's errors map onto laneway's. The engine itself is
exercised only on a GPU (tests/integration/test_vllm.py)."""

from __future__ import annotations

import asyncio
import time
from collections.abc import AsyncGenerator
from pathlib import Path
from types import SimpleNamespace

import pytest
import torch

from schemas.errors import (
    BackendUnavailable,
    CudaFailure,
    DeadlineExceeded,
    OutOfMemory,
)
from schemas.messages import ChatMessage
from schemas.settings import BackendSettings
from workers.backends.base import STOPPED, Generation, GenerationInput, until_unwanted
from workers.backends.vllm import (
    DeltaJoin,
    VLLMBackend,
    engine_options,
    generation_from,
    last_before_deadline,
    lora_options,
    lora_rank,
    map_vllm_exception,
    model_source,
    platform_problem,
    sampling_options,
    time_left,
)


def ask(
    temperature: float = 0.0,
    max_tokens: int = 12,
    stop: list[str] | None = None,
    seed: int | None = None,
    top_p: float | None = None,
) -> GenerationInput:
    messages = [ChatMessage(role="user", content="hi")]
    return GenerationInput(messages, max_tokens, temperature, stop=stop, seed=seed, top_p=top_p)


# -- the device ------------------------------------------------------------------


def test_without_a_device_platform_the_backend_says_why_it_cannot_load() -> None:
    problem = platform_problem(SimpleNamespace(is_unspecified=lambda: True))
    assert problem is not None and "no NVIDIA GPU is visible" in problem
    assert platform_problem(SimpleNamespace(is_unspecified=lambda: False)) is None


# -- the model directory -------------------------------------------------------


def hf_dir(path: Path) -> Path:
    path.mkdir(parents=True)
    (path / "config.json").write_text("{}")
    return path


def test_without_a_model_dir_the_model_name_goes_to_vllm_as_it_is() -> None:
    assert model_source("Qwen/Qwen3-0.6B", None) == "Qwen/Qwen3-0.6B"


def test_a_model_dir_holding_the_model_by_name(tmp_path: Path) -> None:
    hf_dir(tmp_path / "heavy")
    assert model_source("heavy", tmp_path) == str(tmp_path / "heavy")


def test_a_model_dir_that_is_the_model_itself(tmp_path: Path) -> None:
    hf_dir(tmp_path / "smollm2")
    assert model_source("anything", tmp_path / "smollm2") == str(tmp_path / "smollm2")


def test_a_model_dir_without_a_model_is_a_clear_inf_502(tmp_path: Path) -> None:
    with pytest.raises(BackendUnavailable, match="LANEWAY_BACKEND_VLLM_MODEL_DIR") as caught:
        model_source("heavy", tmp_path)
    assert str(tmp_path / "heavy") in caught.value.message


# -- the engine ----------------------------------------------------------------


def test_the_engine_takes_the_settings_length_memory_share_and_eager_mode() -> None:
    settings = BackendSettings(
        vllm_max_model_len=2048, vllm_gpu_memory_utilization=0.5, vllm_enforce_eager=True
    )
    assert engine_options("heavy", "/models/heavy", settings) == {
        "model": "/models/heavy",
        "served_model_name": "heavy",
        "max_model_len": 2048,
        "gpu_memory_utilization": 0.5,
        "enforce_eager": True,
        "disable_log_stats": True,
    }


def test_max_num_seqs_goes_to_the_engine_only_when_set() -> None:
    unset = engine_options("heavy", "heavy", BackendSettings(vllm_max_num_seqs=None))
    assert "max_num_seqs" not in unset
    assert (
        engine_options("heavy", "heavy", BackendSettings(vllm_max_num_seqs=8))["max_num_seqs"] == 8
    )


def test_a_version_with_an_adapter_gets_an_engine_with_lora_for_its_rank(tmp_path: Path) -> None:
    (tmp_path / "adapter_config.json").write_text('{"r": 12, "lora_alpha": 24}')
    assert lora_rank(tmp_path) == 16  # vLLM's ranks: 8, 16, 32, ...
    options = engine_options("light", "/models/light", BackendSettings(), lora_rank(tmp_path))
    assert (options["enable_lora"], options["max_loras"], options["max_lora_rank"]) == (
        True,
        1,
        16,
    )
    assert "enable_lora" not in engine_options("light", "/models/light", BackendSettings())
    assert lora_options("light", tmp_path) == {
        "lora_name": f"light+{tmp_path.name}",
        "lora_int_id": 1,
        "lora_path": str(tmp_path),
    }
    (tmp_path / "adapter_config.json").write_text('{"r": 1024}')
    with pytest.raises(BackendUnavailable, match="rank 1024"):
        lora_rank(tmp_path)
    (tmp_path / "adapter_config.json").unlink()
    with pytest.raises(BackendUnavailable, match=r"adapter_config\.json"):
        lora_rank(tmp_path)


# -- sampling parameters -------------------------------------------------------

TRANSCRIPT_STOPS = ("\nQuestion:", "\n\n")


def test_greedy_requests_need_no_seed_and_have_no_stop() -> None:
    assert sampling_options(ask(0.0, 7)) == {
        "max_tokens": 7,
        "temperature": 0.0,
        "seed": None,
        "stop": None,
    }


def test_sampled_requests_are_seeded_so_a_request_repeats_its_answer() -> None:
    assert sampling_options(ask(0.7))["seed"] == 0


def test_the_prompt_styles_stops_come_first() -> None:
    assert sampling_options(ask(), TRANSCRIPT_STOPS)["stop"] == list(TRANSCRIPT_STOPS)


def test_top_p_is_passed_only_when_the_request_gave_one() -> None:
    assert sampling_options(ask(0.7, top_p=0.5))["top_p"] == 0.5
    assert "top_p" not in sampling_options(ask(0.7))  # vLLM's own default, 1


def test_the_requests_own_seed_and_stop_are_kept() -> None:
    options = sampling_options(ask(0.7, stop=["END"], seed=42), TRANSCRIPT_STOPS)
    assert options["seed"] == 42
    assert options["stop"] == [*TRANSCRIPT_STOPS, "END"]
    assert sampling_options(ask(0.0, seed=7))["seed"] == 7


# -- deadlines -----------------------------------------------------------------


def test_time_left() -> None:
    assert time_left(None, 100.0) is None
    assert time_left(100.5, 100.0) == pytest.approx(0.5)
    assert time_left(99.0, 100.0) == pytest.approx(-1.0)


class Stream:
    """An async generator of outputs and what became of it."""

    def __init__(self, items: int, every_s: float = 0.0, error: BaseException | None = None):
        self.items, self.every_s, self.error = items, every_s, error
        self.closed = False
        self.aborts = 0

    async def run(self) -> AsyncGenerator[int, None]:
        try:
            for i in range(self.items):
                await asyncio.sleep(self.every_s)
                yield i
            if self.error is not None:
                raise self.error
        finally:
            self.closed = True

    async def abort(self) -> None:
        self.aborts += 1


async def test_a_stream_that_ends_in_time_gives_its_last_output() -> None:
    stream = Stream(3)
    outcome = await last_before_deadline(stream.run(), time.monotonic() + 5, stream.abort)
    assert outcome == 2 and stream.closed and stream.aborts == 0


async def test_without_a_deadline_the_stream_runs_to_its_end() -> None:
    stream = Stream(2, every_s=0.01)
    assert await last_before_deadline(stream.run(), None, stream.abort) == 1


async def test_the_deadline_aborts_the_request_and_closes_its_stream() -> None:
    stream = Stream(100, every_s=10.0)
    started = time.monotonic()
    outcome = await last_before_deadline(stream.run(), started + 0.05, stream.abort)
    assert isinstance(outcome, DeadlineExceeded)
    assert "cut off at the request's deadline" in outcome.message
    assert stream.aborts == 1 and stream.closed
    assert time.monotonic() - started < 2


async def test_a_generation_no_longer_wanted_aborts_its_request() -> None:
    stream = Stream(100, every_s=10.0)
    unwanted = asyncio.Event()
    work = last_before_deadline(stream.run(), None, stream.abort)
    stopping = asyncio.get_running_loop().call_later(0.05, unwanted.set)
    outcome = await until_unwanted(work, unwanted)
    stopping.cancel()
    assert isinstance(outcome, DeadlineExceeded) and outcome.message == STOPPED
    assert stream.aborts == 1 and stream.closed


async def test_a_failing_abort_still_answers_inf_503() -> None:
    async def abort() -> None:
        raise RuntimeError("engine gone")

    stream = Stream(100, every_s=10.0)
    outcome = await last_before_deadline(stream.run(), time.monotonic() + 0.02, abort)
    assert isinstance(outcome, DeadlineExceeded) and stream.closed


async def test_a_stream_without_outputs_gives_none() -> None:
    stream = Stream(0)
    assert await last_before_deadline(stream.run(), time.monotonic() + 5, stream.abort) is None


async def test_the_streams_errors_propagate_and_its_own_timeouts_are_no_deadline() -> None:
    for error in (RuntimeError("boom"), TimeoutError("engine step timed out")):
        stream = Stream(1, error=error)
        with pytest.raises(type(error)):
            await last_before_deadline(stream.run(), time.monotonic() + 5, stream.abort)
        assert stream.aborts == 0 and stream.closed


# -- errors --------------------------------------------------------------------

# The mapping is by type: torch's own CUDA errors (torch is a base
# dependency), and vLLM's dead engine where vLLM is installed.


class EngineGenerateError(Exception):
    """A wrapper the map does not list (vLLM's is named so)."""


def raised(error: BaseException, cause: BaseException | None = None) -> BaseException:
    try:
        raise error from cause
    except BaseException as caught:
        return caught


def test_a_cuda_error_is_cuda_err() -> None:
    mapped = map_vllm_exception(torch.AcceleratorError("CUDA error: an illegal memory access"))
    assert isinstance(mapped, CudaFailure)


def test_a_wrapped_out_of_memory_is_mem_err_and_names_both() -> None:
    error = raised(
        EngineGenerateError(), torch.OutOfMemoryError("CUDA out of memory. Tried to allocate 2 GiB")
    )
    mapped = map_vllm_exception(error)
    assert isinstance(mapped, OutOfMemory)
    assert "EngineGenerateError" in mapped.message and "Tried to allocate" in mapped.message


def test_an_error_raised_while_handling_another_is_read_through() -> None:
    try:
        try:
            raise torch.AcceleratorError("CUDA error: device-side assert triggered")
        except RuntimeError:
            raise ValueError("while cleaning up") from None
    except ValueError as first:
        suppressed = first
    assert isinstance(map_vllm_exception(suppressed), BackendUnavailable)
    try:
        try:
            raise torch.AcceleratorError("CUDA error: device-side assert triggered")
        except RuntimeError:
            raise ValueError("while cleaning up")  # noqa: B904
    except ValueError as second:
        assert isinstance(map_vllm_exception(second), CudaFailure)


def test_a_cuda_worded_error_of_another_type_is_not_guessed_from_its_message() -> None:
    mapped = map_vllm_exception(RuntimeError("CUDA error: an illegal memory access"))
    assert isinstance(mapped, BackendUnavailable)


def test_a_dead_engine_is_cuda_err_so_it_is_dropped_and_reloaded() -> None:
    exceptions = pytest.importorskip("vllm.v1.engine.exceptions", reason="needs laneway[gpu]")
    mapped = map_vllm_exception(exceptions.EngineDeadError("EngineCore encountered an issue."))
    assert isinstance(mapped, CudaFailure) and "engine died" in mapped.message


def test_other_errors_are_inf_502_and_laneway_errors_pass_through() -> None:
    mapped = map_vllm_exception(ValueError("bad sampling params"))
    assert isinstance(mapped, BackendUnavailable)
    assert mapped.message == "vLLM failed: ValueError: bad sampling params"
    deadline = DeadlineExceeded("late")
    assert map_vllm_exception(deadline) is deadline


# -- outputs -------------------------------------------------------------------


def output(text: str, finish_reason: str = "stop") -> SimpleNamespace:
    """The fields of a vLLM ``RequestOutput`` that ``generation_from`` reads."""
    completion = SimpleNamespace(text=text, token_ids=[5, 6, 7], finish_reason=finish_reason)
    return SimpleNamespace(prompt_token_ids=[1, 2], outputs=[completion])


def test_an_output_with_its_token_counts() -> None:
    assert generation_from(output(" Paris.")) == Generation(" Paris.", 2, 3)
    assert generation_from(output(" Paris.\n"), strip=True) == Generation("Paris.", 2, 3)


def test_an_output_the_engine_aborted_is_inf_502() -> None:
    assert isinstance(generation_from(output("", "abort")), BackendUnavailable)


def test_an_output_that_ended_in_the_engines_own_error_is_inf_502() -> None:
    """vLLM's ``finish_reason`` "error": its text is empty or cut short."""
    assert isinstance(generation_from(output(" Par", "error")), BackendUnavailable)


def test_an_output_cut_at_max_tokens_says_length() -> None:
    assert generation_from(output(" Par", "length")).finish == "length"  # type: ignore[union-attr]


def delta(
    text: str, ids: list[int], finish: str | None = None, prompt: bool = False
) -> SimpleNamespace:
    """A ``DELTA`` output: only what is new since the one before."""
    completion = SimpleNamespace(text=text, token_ids=ids, finish_reason=finish)
    return SimpleNamespace(prompt_token_ids=[1, 2, 3] if prompt else None, outputs=[completion])


def test_delta_outputs_are_handed_on_and_joined_into_the_answer() -> None:
    pieces: list[str] = []
    joined = DeltaJoin(pieces.append, strip=True)  # a transcript's answer: stripped
    outputs = [delta(" Pa", [7], prompt=True), delta("ris", [8]), delta(".\n", [9, 10], "length")]
    for out in outputs:
        joined.add(out)
    answer = joined.generation(outputs[-1])
    assert answer == Generation("Paris.", 3, 4, "length")
    assert "".join(pieces) == answer.text == "Paris."


def test_delta_outputs_the_engine_aborted_are_inf_502() -> None:
    joined = DeltaJoin(lambda _: None, strip=False)
    last = delta("", [], "abort")
    joined.add(last)
    assert isinstance(joined.generation(last), BackendUnavailable)


async def test_a_backend_not_loaded_is_inf_502() -> None:
    backend = VLLMBackend("m", BackendSettings())
    with pytest.raises(BackendUnavailable, match="not loaded"):
        await backend.infer_batch([ask()])
    assert not await backend.check_health()
    await backend.close()
