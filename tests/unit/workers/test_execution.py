import time
from collections.abc import Callable, Sequence

import httpx
import pytest

from schemas.errors import (
    BackendUnavailable,
    CudaFailure,
    DeadlineExceeded,
    ErrorCode,
    LanewayError,
    OutOfMemory,
)
from schemas.messages import AnswerPath, InferenceRequest, Lane, RoutedRequest
from schemas.settings import BackendSettings
from streams.routing.registry import ModelRegistry, builtin_registry
from workers.backends.base import (
    COMMON_ERRORS,
    Backend,
    ErrorMap,
    Generation,
    GenerationInput,
    Outcome,
    create_backend,
    errors_of,
    map_backend_exception,
)
from workers.backends.llama_batch import LLAMA_CPP_ERRORS
from workers.backends.llamacpp import as_transcript
from workers.backends.openai import OPENAI_ERRORS, OpenAIBackend
from workers.execution import BackendSlot, Executor, backend_slots, version_slots


def routed(
    prompt: str, path: AnswerPath, deadline_in_ms: int | None = None, rid: str = "r"
) -> RoutedRequest:
    now = int(time.time() * 1000)
    return RoutedRequest(
        request=InferenceRequest(id=rid, prompt=prompt),
        lane=Lane.REALTIME,
        path=path,
        reply_to="laneway.replies",
        produced_at_ms=now - 3,
        routed_at_ms=now,
        deadline_at_ms=None if deadline_in_ms is None else now + deadline_in_ms,
    )


def _vllm_errors() -> ErrorMap:
    from workers.backends.vllm import vllm_errors

    return vllm_errors()


def _torch_error(name: str, message: str) -> Exception:
    import torch

    error: Exception = getattr(torch, name)(message)
    return error


class Exploding:
    """A backend whose inference raises: the error must reach every request,
    mapped by the backend's ``errors``."""

    kind = "exploding"
    model = "x"

    def __init__(self, exc: Exception, errors: ErrorMap = COMMON_ERRORS) -> None:
        self.exc = exc
        self.errors = errors
        self.seen: list[GenerationInput] = []

    async def load(self) -> None: ...

    async def infer_batch(self, inputs: Sequence[GenerationInput]) -> list[Outcome]:
        self.seen.extend(inputs)
        raise self.exc

    async def check_health(self) -> bool:
        return True

    async def close(self) -> None: ...


def slot_of(backend: Backend) -> BackendSlot:
    return BackendSlot(lambda: backend, retry_s=60, label=backend.kind)


async def test_rules_backend_answers_and_times_results() -> None:
    executor = Executor(Lane.REALTIME, backend_slots(BackendSettings()))
    (done,) = await executor.execute([routed("ping", AnswerPath.RULES)])
    result = done.result
    assert result.status == "ok" and result.output == "pong" and result.model == "rules:rules"
    assert result.timings.batch_size == 1 and result.timings.total_ms >= result.timings.queue_ms


async def test_expired_requests_never_reach_the_model() -> None:
    boom = Exploding(RuntimeError("must not run"))
    executor = Executor(Lane.MEDIUM, {AnswerPath.LIGHT: slot_of(boom)})
    (done,) = await executor.execute([routed("q", AnswerPath.LIGHT, deadline_in_ms=-10)])
    assert done.result.error is not None and done.result.error.code == "INF-503"
    assert boom.seen == []


async def test_inference_errors_are_spread_and_mapped() -> None:
    cuda = Exploding(
        _torch_error("AcceleratorError", "CUDA error: device-side assert triggered"),
        _vllm_errors(),
    )
    executor = Executor(Lane.BULK, {AnswerPath.HEAVY: slot_of(cuda)})
    batch = [routed(f"q{i}", AnswerPath.HEAVY, rid=f"r{i}") for i in range(3)]
    finished = await executor.execute(batch)
    assert [f.result.id for f in finished] == ["r0", "r1", "r2"]
    assert {f.result.error.code for f in finished if f.result.error} == {"CUDA-ERR"}
    assert all(f.result.timings.batch_size == 3 for f in finished)


async def test_remaining_deadline_bounds_inference_and_system_prompt_is_added() -> None:
    spy = Exploding(RuntimeError("x"))
    executor = Executor(Lane.REALTIME, {AnswerPath.LIGHT: slot_of(spy)}, system_prompt="be brief")
    await executor.execute([routed("q", AnswerPath.LIGHT, deadline_in_ms=2000)])
    (seen,) = spy.seen
    remaining = seen.remaining_s()
    assert remaining is not None and 0 < remaining <= 2
    assert [m.role for m in seen.messages] == ["system", "user"]


async def test_missing_model_gives_inf_502_and_is_not_retried_at_once() -> None:
    settings = BackendSettings(
        light_model="/nonexistent/light.gguf",
        heavy_model="/nonexistent/heavy.gguf",
        load_retry_s=60,
    )
    slots = backend_slots(settings)
    executor = Executor(Lane.REALTIME, slots)
    for _ in range(2):
        (done,) = await executor.execute([routed("q", AnswerPath.LIGHT)])
        assert done.result.error is not None
        assert done.result.error.code == "INF-502"
        assert "does not exist" in done.result.error.message
    assert slots[AnswerPath.LIGHT].backend is None


async def test_path_without_backend_is_inf_502() -> None:
    executor = Executor(Lane.REALTIME, {})
    (done,) = await executor.execute([routed("q", AnswerPath.HEAVY)])
    assert done.result.error is not None and done.result.error.code == "INF-502"


def test_unknown_backend_and_missing_vllm_are_clear() -> None:
    with pytest.raises(BackendUnavailable, match="unknown backend 'tpu'"):
        create_backend("tpu", "m", BackendSettings())


@pytest.mark.parametrize(
    ("errors", "exc", "kind"),
    [
        (lambda: COMMON_ERRORS, lambda: MemoryError(), OutOfMemory),
        (
            _vllm_errors,
            lambda: _torch_error("OutOfMemoryError", "CUDA out of memory. Tried to allocate"),
            OutOfMemory,
        ),
        (
            _vllm_errors,
            lambda: _torch_error("AcceleratorError", "CUDA driver version is insufficient"),
            CudaFailure,
        ),
        (lambda: COMMON_ERRORS, lambda: TimeoutError("slow"), DeadlineExceeded),
        (lambda: COMMON_ERRORS, lambda: ValueError("weird"), BackendUnavailable),
    ],
)
def test_map_backend_exception(
    errors: Callable[[], ErrorMap],
    exc: Callable[[], Exception],
    kind: type[LanewayError],
) -> None:
    raised = exc()
    error = map_backend_exception(raised, errors())
    assert isinstance(error, kind)
    assert type(raised).__name__ in error.message
    same = BackendUnavailable("kept")
    assert map_backend_exception(same) is same


def test_errors_map_by_their_most_specific_class_and_never_by_message() -> None:
    timed_out = httpx.ConnectTimeout("no answer")  # a TimeoutException and an HTTPError
    assert isinstance(map_backend_exception(timed_out, OPENAI_ERRORS), DeadlineExceeded)
    assert isinstance(
        map_backend_exception(httpx.ConnectError("refused"), OPENAI_ERRORS), BackendUnavailable
    )
    worded = RuntimeError("CUDA out of memory")  # a plain RuntimeError: its words do not count
    assert isinstance(map_backend_exception(worded), BackendUnavailable)
    assert isinstance(map_backend_exception(worded, LLAMA_CPP_ERRORS), BackendUnavailable)
    assert isinstance(map_backend_exception(MemoryError(), LLAMA_CPP_ERRORS), OutOfMemory)
    assert errors_of(object()) is COMMON_ERRORS
    assert errors_of(OpenAIBackend("m", BackendSettings())) is OPENAI_ERRORS


def test_error_tree_codes() -> None:
    assert [c.value for c in ErrorCode] == [
        "INF-400",
        "INF-429",
        "INF-502",
        "INF-503",
        "MEM-ERR",
        "CUDA-ERR",
    ]


def test_transcript_for_base_models() -> None:
    request = InferenceRequest(
        id="r",
        messages=[
            {"role": "system", "content": "Be brief."},
            {"role": "user", "content": "Hi?"},
            {"role": "assistant", "content": "Hello."},
            {"role": "user", "content": "Capital of France?"},
        ],
    )
    assert as_transcript(request.chat()) == (
        "Be brief.\nQuestion: Hi?\nAnswer: Hello.\nQuestion: Capital of France?\nAnswer:"
    )


def rules_slot() -> BackendSlot:
    return backend_slots(BackendSettings())[AnswerPath.RULES]


async def test_failing_path_falls_back_and_its_breaker_opens() -> None:
    heavy = Exploding(RuntimeError("connection refused"))
    slots = {AnswerPath.HEAVY: slot_of(heavy), AnswerPath.LIGHT: rules_slot()}
    executor = Executor(Lane.MEDIUM, slots)
    for _ in range(5):
        (done,) = await executor.execute([routed("ping", AnswerPath.HEAVY)])
        result = done.result
        assert result.status == "ok" and result.output == "pong"
        assert result.path == "light" and result.degraded and result.requested_path == "heavy"
    assert slots[AnswerPath.HEAVY].breaker.state == "open"
    calls = len(heavy.seen)
    (done,) = await executor.execute([routed("ping", AnswerPath.HEAVY)])
    assert done.result.degraded and len(heavy.seen) == calls  # the open circuit is skipped


async def test_a_cuda_error_opens_the_breaker_at_once_and_reloads_the_backend() -> None:
    from workers.breaker import CircuitBreaker
    from workers.execution import BREAKER_STATE

    class Clock:
        now = 0.0

        def __call__(self) -> float:
            return self.now

    clock = Clock()
    loads: list[Exploding] = []

    def load() -> Exploding:
        error = _torch_error("AcceleratorError", "CUDA error: an illegal memory access")
        loads.append(Exploding(error, _vllm_errors()))
        return loads[-1]

    breaker = CircuitBreaker(failures=5, window_s=30, cooldown_s=10, clock=clock)
    heavy = BackendSlot(load, retry_s=60, label="heavy=vllm:x", breaker=breaker)
    executor = Executor(Lane.MEDIUM, {AnswerPath.HEAVY: heavy, AnswerPath.LIGHT: rules_slot()})
    (done,) = await executor.execute([routed("ping", AnswerPath.HEAVY)])
    assert done.result.status == "ok" and done.result.path == "light" and done.result.degraded
    assert [e.code for _, _, e in done.failed] == ["CUDA-ERR"]
    assert breaker.state == "open" and heavy.backend is None  # one error was enough
    assert BREAKER_STATE.labels(Lane.MEDIUM, AnswerPath.HEAVY)._value.get() == 2
    (done,) = await executor.execute([routed("ping", AnswerPath.HEAVY)])
    assert done.result.degraded and len(loads) == 1 and len(loads[0].seen) == 1  # skipped
    clock.now = 10  # the half-open probe runs on a backend loaded afresh
    (done,) = await executor.execute([routed("ping", AnswerPath.HEAVY)])
    assert len(loads) == 2 and len(loads[1].seen) == 1 and breaker.state == "open"


async def test_no_path_left_is_inf_502_naming_why() -> None:
    heavy = Exploding(RuntimeError("connection refused"))
    slots = {AnswerPath.HEAVY: slot_of(heavy)}
    executor = Executor(Lane.MEDIUM, slots)
    (done,) = await executor.execute([routed("q", AnswerPath.HEAVY)])
    assert done.result.error is not None and done.result.error.code == "INF-502"
    assert "connection refused" in done.result.error.message
    for _ in range(4):
        await executor.execute([routed("q", AnswerPath.HEAVY)])
    (done,) = await executor.execute([routed("q", AnswerPath.HEAVY)])
    assert done.result.error is not None
    assert "heavy circuit open" in done.result.error.message
    assert "no backend serves light" in done.result.error.message


class RoomForOne:
    """Runs out of memory on any batch of more than one request."""

    kind = "roomforone"
    model = "m"

    def __init__(self) -> None:
        self.batch_sizes: list[int] = []

    async def load(self) -> None: ...

    async def infer_batch(self, inputs: Sequence[GenerationInput]) -> list[Outcome]:
        self.batch_sizes.append(len(inputs))
        if len(inputs) > 1:
            raise MemoryError("cannot allocate KV cache")
        return [Generation(text="ok", prompt_tokens=1, completion_tokens=1)]

    async def check_health(self) -> bool:
        return True

    async def close(self) -> None: ...


async def test_out_of_memory_splits_the_batch_before_mem_err() -> None:
    backend = RoomForOne()
    executor = Executor(Lane.BULK, {AnswerPath.HEAVY: slot_of(backend)})
    finished = await executor.execute(
        [routed(f"q{i}", AnswerPath.HEAVY, rid=f"r{i}") for i in range(4)]
    )
    assert [f.result.status for f in finished] == ["ok"] * 4
    assert not any(f.result.degraded for f in finished)
    assert backend.batch_sizes == [4, 2, 1, 1, 2, 1, 1]


async def test_flow_control_moves_are_reported_as_degraded() -> None:
    moved = routed("ping", AnswerPath.RULES).model_copy(update={"requested_path": AnswerPath.HEAVY})
    executor = Executor(Lane.REALTIME, {AnswerPath.RULES: rules_slot()})
    (done,) = await executor.execute([moved])
    assert done.result.status == "ok" and done.result.path == "rules"
    assert done.result.degraded and done.result.requested_path == "heavy"


async def test_an_explored_route_says_so_in_its_result_ok_or_not() -> None:
    explored = routed("ping", AnswerPath.RULES).model_copy(update={"explored": True})
    executor = Executor(Lane.REALTIME, {AnswerPath.RULES: rules_slot()})
    (done,) = await executor.execute([explored])
    assert done.result.status == "ok" and done.result.explored
    failing = Executor(Lane.REALTIME, {})
    unserved = routed("q", AnswerPath.HEAVY).model_copy(update={"explored": True})
    (failed,) = await failing.execute([unserved])
    assert failed.result.status == "error" and failed.result.explored


async def test_paths_that_failed_before_a_fallback_are_reported_for_the_quality_loop() -> None:
    from schemas.messages import QualityEvent
    from schemas.settings import Settings
    from workers.answered import attempt_events

    heavy = Exploding(RuntimeError("connection refused"))
    executor = Executor(
        Lane.MEDIUM, {AnswerPath.HEAVY: slot_of(heavy), AnswerPath.LIGHT: rules_slot()}
    )
    (done,) = await executor.execute([routed("ping", AnswerPath.HEAVY)])
    assert done.result.path == "light"
    assert [(path, error.code) for path, _, error in done.failed] == [(AnswerPath.HEAVY, "INF-502")]
    (out,) = attempt_events(done, Settings())
    event = QualityEvent.model_validate_json(out.value)
    assert out.topic == "laneway.quality" and out.key == done.result.id.encode()  # by id
    assert (event.kind, event.path, event.success, event.error_code) == (
        "attempt",
        AnswerPath.HEAVY,
        False,
        "INF-502",
    )
    # A request no path could serve counts once, against its own path.
    alone = Executor(Lane.MEDIUM, {AnswerPath.HEAVY: slot_of(Exploding(RuntimeError("down")))})
    (failed,) = await alone.execute([routed("q", AnswerPath.HEAVY)])
    assert failed.result.status == "error" and failed.failed == ()


async def test_session_history_goes_before_the_request() -> None:
    from schemas.messages import ChatMessage

    seen = Exploding(RuntimeError("x"))
    executor = Executor(Lane.REALTIME, {AnswerPath.LIGHT: slot_of(seen)}, system_prompt="Be brief.")
    item = routed("and mine?", AnswerPath.LIGHT).model_copy(
        update={
            "history": [
                ChatMessage(role="user", content="my name is Ada"),
                ChatMessage(role="assistant", content="Hello Ada"),
            ]
        }
    )
    await executor.execute([item])
    (given,) = seen.seen
    assert [(m.role, m.content) for m in given.messages] == [
        ("system", "Be brief."),
        ("user", "my name is Ada"),
        ("assistant", "Hello Ada"),
        ("user", "and mine?"),
    ]


class Named:
    """A backend that answers with its own name: which version ran."""

    kind = "named"

    def __init__(self, model: str) -> None:
        self.model = model

    async def load(self) -> None: ...

    async def infer_batch(self, inputs: Sequence[GenerationInput]) -> list[Outcome]:
        return [Generation(text=self.model, prompt_tokens=1, completion_tokens=1) for _ in inputs]

    async def check_health(self) -> bool:
        return True

    async def close(self) -> None: ...


def versioned(backend: Backend, version: str) -> BackendSlot:
    return BackendSlot(lambda: backend, retry_s=60, label=backend.model, version=version)


def for_version(prompt: str, version: str | None, **update: object) -> RoutedRequest:
    return routed(prompt, AnswerPath.HEAVY).model_copy(update={"version": version, **update})


async def test_each_request_runs_on_its_version_and_says_which() -> None:
    slots = {AnswerPath.HEAVY: versioned(Named("gemma"), "v1"), AnswerPath.RULES: rules_slot()}
    executor = Executor(
        Lane.MEDIUM, slots, versions={(AnswerPath.HEAVY, "v2"): versioned(Named("smol"), "v2")}
    )
    batch = [for_version("a", "v2"), for_version("b", "v1"), for_version("c", None)]
    done = await executor.execute(batch)
    assert [(d.result.output, d.result.version) for d in done] == [
        ("smol", "v2"),
        ("gemma", "v1"),
        ("gemma", "v1"),
    ]


async def test_a_failing_canary_falls_back_to_the_active_version_and_is_counted() -> None:
    broken = Exploding(RuntimeError("model file not found"))
    slots = {AnswerPath.HEAVY: versioned(Named("gemma"), "v1"), AnswerPath.RULES: rules_slot()}
    executor = Executor(
        Lane.MEDIUM, slots, versions={(AnswerPath.HEAVY, "v2"): versioned(broken, "v2")}
    )
    (done,) = await executor.execute([for_version("a", "v2")])
    assert done.result.status == "ok" and done.result.version == "v1"
    assert done.result.path == "heavy" and not done.result.degraded
    assert [(p, v, e.code) for p, v, e in done.failed] == [(AnswerPath.HEAVY, "v2", "INF-502")]
    # A version no slot here loads is answered by the active one too.
    (other,) = await executor.execute([for_version("a", "v9")])
    assert other.result.version == "v1" and other.failed == ()


async def test_a_shadow_copy_runs_on_its_version_or_not_at_all() -> None:
    broken = Exploding(RuntimeError("model file not found"))
    slots = {AnswerPath.HEAVY: versioned(Named("gemma"), "v1"), AnswerPath.RULES: rules_slot()}
    executor = Executor(
        Lane.BULK, slots, versions={(AnswerPath.HEAVY, "v2"): versioned(broken, "v2")}
    )
    (done,) = await executor.execute([for_version("a", "v2", shadow=True)])
    assert done.result.status == "error" and done.result.error is not None
    assert done.result.error.code == "INF-502" and done.result.version == "v2"


def test_slots_come_from_the_registrys_versions_that_are_not_retired() -> None:
    base = builtin_registry(BackendSettings())
    extra = [
        {
            "name": "smollm2-135m",
            "version": "smol",
            "state": "canary",
            "backend": "llamacpp",
            "path": "heavy",
        },
        {
            "name": "old",
            "version": "old",
            "state": "retired",
            "backend": "llamacpp",
            "path": "heavy",
        },
    ]
    registry = ModelRegistry.model_validate(
        {"models": [m.model_dump() for m in base.models] + extra}
    )
    slots = backend_slots(BackendSettings(), (AnswerPath.HEAVY,), registry)
    assert {p: s.version for p, s in slots.items()} == {
        AnswerPath.HEAVY: "q4_k_m",
        AnswerPath.RULES: None,
    }
    assert list(version_slots(BackendSettings(), registry, (AnswerPath.HEAVY,))) == [
        (AnswerPath.HEAVY, "smol")
    ]
    assert version_slots(BackendSettings(), registry, (AnswerPath.LIGHT,)) == {}


async def test_a_shadow_of_the_workers_own_active_version_never_falls_back() -> None:
    broken = Exploding(RuntimeError("model file not found"))
    slots = {
        AnswerPath.HEAVY: versioned(broken, "v1"),
        AnswerPath.LIGHT: rules_slot(),
        AnswerPath.RULES: rules_slot(),
    }
    executor = Executor(Lane.BULK, slots)
    (done,) = await executor.execute([for_version("ping", "v1", shadow=True)])
    assert done.result.status == "error" and done.result.path == "heavy"


def test_a_versions_max_batch_sizes_its_backend_and_unset_leaves_the_setting() -> None:
    registry = ModelRegistry.model_validate(
        {
            "models": [
                {"name": "smollm2-135m", "backend": "llamacpp", "path": "light", "max_batch": 3},
                {"name": "gemma3-270m", "backend": "llamacpp", "path": "heavy"},
                {
                    "name": "g2",
                    "version": "2",
                    "state": "canary",
                    "backend": "vllm",
                    "path": "heavy",
                    "max_batch": 32,
                },
            ]
        }
    )
    settings = BackendSettings(llamacpp_max_sequences=12)
    slots = backend_slots(settings, (AnswerPath.LIGHT, AnswerPath.HEAVY), registry)
    light = slots[AnswerPath.LIGHT]._factory()
    heavy = slots[AnswerPath.HEAVY]._factory()
    assert light._settings.llamacpp_max_sequences == 3  # type: ignore[attr-defined]
    assert heavy._settings.llamacpp_max_sequences == 12  # type: ignore[attr-defined]
    canary = version_slots(settings, registry, (AnswerPath.HEAVY,))[
        (AnswerPath.HEAVY, "2")
    ]._factory()
    assert canary._settings.vllm_max_num_seqs == 32  # type: ignore[attr-defined]
