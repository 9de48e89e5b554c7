"""The vLLM API that ``workers/backends/vllm.py`` calls, checked against
the installed vllm, on the CPU: the engine's arguments take what
``engine_options`` gives, ``SamplingParams`` what ``sampling_options``
gives, a token prompt is built as the backend builds it, the engine has the
methods the backend calls (async where it awaits them), vLLM's own outputs
and errors read as ``generation_from`` and ``map_vllm_exception`` expect,
and vLLM's platform without a device is told apart (``platform_problem``).

No engine is built (that needs a GPU: tests/integration/test_vllm.py).
Skipped without ``laneway[gpu]``; ``compose/gpu-check.sh`` runs it. Checked
by hand with vllm 0.27.1 in a venv beside CPU torch 2.13.0, with PyPI's
torchvision and torchcodec removed (CUDA builds, which do not load beside
a CPU torch)."""

from __future__ import annotations

import importlib.util
import inspect
from pathlib import Path
from types import ModuleType
from typing import Any

import pytest

from schemas.errors import BackendUnavailable, CudaFailure, OutOfMemory
from schemas.settings import BackendSettings
from tests.unit.workers.test_vllm import ask
from workers.backends.base import Generation, GenerationInput
from workers.backends.llamacpp import TRANSCRIPT_STOPS
from workers.backends.vllm import (
    engine_options,
    generation_from,
    lora_options,
    map_vllm_exception,
    platform_problem,
    sampling_options,
)

pytestmark = [
    pytest.mark.skipif(
        importlib.util.find_spec("vllm") is None,
        reason="needs laneway[gpu]: vllm is not installed",
    ),
    # vLLM, torch and transformers warn as they load; the suite's "error"
    # would fail the import on it. (Imported in a fixture, not at module
    # level, so that this applies: collection knows only the suite's filters.)
    # Resource warnings stay ignored, as in the suite: files that other
    # tests left to the garbage collector would otherwise show up here.
    pytest.mark.filterwarnings("default", "ignore::ResourceWarning"),
]


@pytest.fixture(scope="module")
def vllm() -> ModuleType:
    import vllm

    return vllm


def test_the_engine_arguments_take_the_backends_options(vllm: ModuleType) -> None:
    settings = BackendSettings(
        vllm_max_model_len=2048,
        vllm_gpu_memory_utilization=0.5,
        vllm_enforce_eager=True,
        vllm_max_num_seqs=8,
    )
    args = vllm.AsyncEngineArgs(**engine_options("heavy", "/models/heavy", settings))
    assert args.model == "/models/heavy"
    assert args.max_model_len == 2048 and args.max_num_seqs == 8
    assert args.gpu_memory_utilization == 0.5 and args.enforce_eager is True
    unset = vllm.AsyncEngineArgs(**engine_options("heavy", "heavy", BackendSettings()))
    assert unset.max_num_seqs is None  # vLLM's own default, chosen when the engine starts


@pytest.mark.parametrize(
    ("item", "stops"),
    [
        (ask(), ()),
        (ask(0.7), TRANSCRIPT_STOPS),
        (ask(0.7, stop=["END"], seed=42), TRANSCRIPT_STOPS),
    ],
    ids=["greedy", "sampled, transcript stops", "own seed and stop"],
)
def test_sampling_params_take_the_backends_options(
    item: GenerationInput, stops: tuple[str, ...], vllm: ModuleType
) -> None:
    from vllm.sampling_params import RequestOutputKind

    options = sampling_options(item, stops)
    params = vllm.SamplingParams(**options, output_kind=RequestOutputKind.FINAL_ONLY)
    assert params.max_tokens == options["max_tokens"]
    assert params.temperature == options["temperature"]
    assert params.seed == options["seed"]
    assert list(params.stop or []) == list(options["stop"] or [])
    assert params.output_kind == RequestOutputKind.FINAL_ONLY
    streamed = vllm.SamplingParams(**options, output_kind=RequestOutputKind.DELTA)
    assert streamed.output_kind == RequestOutputKind.DELTA  # a streamed request's deltas


def test_a_version_with_an_adapter_is_served_as_the_engine_takes_it(
    vllm: ModuleType, tmp_path: Path
) -> None:
    """LoRA on in the engine's arguments, the adapter a ``LoRARequest``, and
    ``generate`` taking it as ``lora_request``."""
    from vllm.lora.request import LoRARequest

    args = vllm.AsyncEngineArgs(**engine_options("light", "/models/light", BackendSettings(), 16))
    assert args.enable_lora is True and args.max_loras == 1 and args.max_lora_rank == 16
    request = LoRARequest(**lora_options("light", tmp_path))
    assert request.lora_int_id == 1 and request.lora_path == str(tmp_path)
    assert "lora_request" in inspect.signature(vllm.AsyncLLMEngine.generate).parameters


def test_a_token_prompt_is_built_as_the_engine_takes_it(vllm: ModuleType) -> None:
    from vllm.inputs import tokens_input

    prompt = tokens_input([1, 2, 3])
    assert prompt["prompt_token_ids"] == [1, 2, 3]


def test_the_engine_has_the_methods_the_backend_calls(vllm: ModuleType) -> None:
    engine = vllm.AsyncLLMEngine
    assert isinstance(inspect.getattr_static(engine, "from_engine_args"), classmethod)
    # generate(prompt, params, request_id) streams outputs; the backend
    # awaits abort and check_health, and calls shutdown and get_tokenizer
    # (whose result it awaits only where it is awaitable).
    assert inspect.isasyncgenfunction(engine.generate)
    assert list(inspect.signature(engine.generate).parameters)[1:4] == [
        "prompt",
        "sampling_params",
        "request_id",
    ]
    assert inspect.iscoroutinefunction(engine.abort)
    assert inspect.iscoroutinefunction(engine.check_health)
    assert callable(engine.shutdown) and not inspect.iscoroutinefunction(engine.shutdown)
    assert callable(engine.get_tokenizer)


def output(text: str, finish_reason: str | None) -> Any:
    from vllm.outputs import CompletionOutput, RequestOutput

    completion = CompletionOutput(
        index=0,
        text=text,
        token_ids=[5, 6, 7],
        cumulative_logprob=None,
        logprobs=None,
        finish_reason=finish_reason,
    )
    return RequestOutput(
        request_id="laneway-0",
        prompt=None,
        prompt_token_ids=[1, 2],
        prompt_logprobs=None,
        outputs=[completion],
        finished=True,
    )


def test_a_finished_output_reads_as_a_generation(vllm: ModuleType) -> None:
    assert generation_from(output(" Paris.", "stop"), strip=True) == Generation(
        text="Paris.", prompt_tokens=2, completion_tokens=3
    )
    assert isinstance(generation_from(output("", "abort")), BackendUnavailable)


def test_vllms_own_errors_map_onto_laneways(vllm: ModuleType) -> None:
    import torch
    from vllm.v1.engine.exceptions import EngineDeadError, EngineGenerateError

    assert isinstance(map_vllm_exception(EngineDeadError()), CudaFailure)
    try:
        try:
            raise torch.cuda.OutOfMemoryError("CUDA out of memory. Tried to allocate 2.00 GiB")
        except torch.cuda.OutOfMemoryError as exc:
            raise EngineGenerateError() from exc
    except EngineGenerateError as wrapped:
        assert isinstance(map_vllm_exception(wrapped), OutOfMemory)


def test_vllms_platform_without_a_device_is_told_apart(vllm: ModuleType) -> None:
    from vllm.platforms import current_platform
    from vllm.platforms.interface import UnspecifiedPlatform

    assert platform_problem(UnspecifiedPlatform()) is not None
    assert isinstance(current_platform.is_unspecified(), bool)


def test_the_cache_config_names_what_the_headroom_reads(vllm: ModuleType) -> None:
    """``workers.backends.vllm_headroom.kv_cache_tokens`` reads
    ``vllm_config.cache_config.num_gpu_blocks`` and ``.block_size``."""
    import dataclasses

    from vllm.config import CacheConfig, VllmConfig

    names = {f.name for f in dataclasses.fields(CacheConfig)}
    assert {"num_gpu_blocks", "block_size"} <= names
    assert "cache_config" in {f.name for f in dataclasses.fields(VllmConfig)}
