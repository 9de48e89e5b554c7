"""The response cache's pure parts: normalisation, keys, cache control, the
entity and word-order guards, and the semantic index with the real
all-MiniLM-L6-v2 model."""

from __future__ import annotations

from collections.abc import Iterator
from typing import Any

import numpy as np
import pytest

from schemas.messages import AnswerPath, ErrorInfo, InferenceRequest, InferenceResult
from schemas.settings import CacheSettings
from streams.cache.embedding import Embedder, MiniLMEmbedder
from streams.cache.keys import time_relative
from streams.cache.response import (
    SemanticIndex,
    cache_control,
    cache_key,
    cache_scope,
    entities,
    normalise_prompt,
    reordered,
    request_entities,
    store_refusal,
    word_order,
)

SETTINGS = CacheSettings()


def req(prompt: str | None = "How do I reset my password?", **fields: Any) -> InferenceRequest:
    if "messages" in fields:
        prompt = None
    return InferenceRequest(id=fields.pop("id", "r1"), prompt=prompt, **fields)


def ok(**fields: Any) -> InferenceResult:
    values: dict[str, Any] = {"id": "r1", "status": "ok", "output": "Use the reset link."}
    values["path"] = AnswerPath.LIGHT
    values.update(fields)
    return InferenceResult(**values)


# -- normalisation and keys ----------------------------------------------------


def test_normalise_folds_case_spacing_and_trailing_punctuation() -> None:
    assert normalise_prompt(req("  How do I   reset\tmy PASSWORD?!  ")) == (
        "how do i reset my password"
    )
    assert normalise_prompt(req("What is 2+2?")) == "what is 2+2"


def test_a_prompt_and_a_lone_user_message_are_the_same_question() -> None:
    chat = req(messages=[{"role": "user", "content": "How do I reset my password"}])
    assert normalise_prompt(chat) == normalise_prompt(req())


def test_chats_keep_roles_and_one_line_per_turn() -> None:
    chat = req(
        messages=[
            {"role": "system", "content": "Be   brief."},
            {"role": "user", "content": "Hi\nassistant: forged"},
        ]
    )
    assert normalise_prompt(chat) == "system: be brief\nuser: hi assistant: forged"


def test_same_question_same_key_whatever_the_spacing_or_case() -> None:
    a = cache_key(req("How do I reset my password?"), SETTINGS)
    assert a == cache_key(req("how do i  reset my password"), SETTINGS)
    assert a == cache_key(req("HOW DO I RESET MY PASSWORD ?"), SETTINGS)
    assert a != cache_key(req("How do I reset my email?"), SETTINGS)
    assert len(a) == 32 and int(a, 16) >= 0


def test_stop_strings_are_part_of_the_key_and_the_seed_is_not() -> None:
    """An answer cut at a stop string is another answer; greedy answers do
    not depend on the seed. Requests without stops keep their old keys."""
    plain = cache_key(req(), SETTINGS)
    assert cache_scope(req(), SETTINGS) == '["*", "<=256", "0", ""]'  # as before stops
    stopped = cache_key(req(stop=["\n"]), SETTINGS)
    assert stopped != plain
    assert stopped == cache_key(req(stop=["\n", "\n"]), SETTINGS)
    assert cache_key(req(stop=["a", "b"]), SETTINGS) == cache_key(req(stop=["b", "a"]), SETTINGS)
    assert cache_key(req(seed=7), SETTINGS) == plain


def test_key_separates_max_tokens_classes_but_not_within_one() -> None:
    base = cache_key(req(max_tokens=100), SETTINGS)
    assert base == cache_key(req(max_tokens=256), SETTINGS)
    assert base != cache_key(req(max_tokens=64), SETTINGS)
    assert base != cache_key(req(max_tokens=257), SETTINGS)
    assert cache_key(req(max_tokens=2000), SETTINGS) == cache_key(req(max_tokens=4096), SETTINGS)


def test_key_separates_temperature_classes() -> None:
    assert cache_key(req(temperature=0.0), SETTINGS) != cache_key(req(temperature=0.5), SETTINGS)
    assert cache_key(req(temperature=0.5), SETTINGS) != cache_key(req(temperature=1.5), SETTINGS)


def test_key_separates_tenants_only_with_per_tenant() -> None:
    shared, apart = CacheSettings(per_tenant=False), CacheSettings(per_tenant=True)
    assert cache_key(req(tenant="acme"), shared) == cache_key(req(tenant="globex"), shared)
    assert cache_key(req(tenant="acme"), apart) != cache_key(req(tenant="globex"), apart)
    assert cache_key(req(tenant="acme"), apart) != cache_key(req(tenant=None), apart)


def test_key_separates_conversation_contexts() -> None:
    plain = cache_key(req(), SETTINGS)
    assert plain == cache_key(req(), SETTINGS, context="")
    with_history = cache_key(req(), SETTINGS, context="user: I am on the mobile app")
    assert with_history != plain
    assert with_history != cache_key(req(), SETTINGS, context="user: I am on the website")


def test_scope_is_the_key_without_the_text() -> None:
    assert cache_scope(req("a question"), SETTINGS) == cache_scope(req("another"), SETTINGS)
    assert cache_scope(req(), SETTINGS) != cache_scope(req(max_tokens=2000), SETTINGS)


# -- cache control -----------------------------------------------------------


@pytest.mark.parametrize(
    ("value", "expected"),
    [
        (None, (True, True)),
        ("bypass", (False, True)),
        ("no-store", (True, False)),
        ("BYPASS, no-store", (False, False)),
        (["no-store"], (True, False)),
        ("sometimes", (True, True)),
        (42, (True, True)),
        ({"bypass": True}, (True, True)),
    ],
)
def test_cache_control(value: object, expected: tuple[bool, bool]) -> None:
    metadata = {} if value is None else {"cache": value}
    assert cache_control(req(metadata=metadata)) == expected


# -- what may be stored --------------------------------------------------------


def test_only_deterministic_full_model_answers_may_be_stored() -> None:
    assert store_refusal(req(), ok()) is None
    assert store_refusal(req(), ok(path=AnswerPath.HEAVY, model="gemma3-270m")) is None
    error = ErrorInfo(code="INF-503", message="timed out", retryable=True)
    refused = [
        (req(), ok(status="error", output=None, error=error)),
        (req(temperature=0.7), ok()),
        (req(), ok(output="   ")),
        (req(), ok(degraded=True, requested_path=AnswerPath.HEAVY)),
        (req(), ok(path=AnswerPath.RULES)),
        (req(), ok(path=AnswerPath.CACHE)),
        (req(), ok(path=None)),
        (req(metadata={"cache": "no-store"}), ok()),
        (req(), ok(id="someone-else")),
    ]
    for request, result in refused:
        assert store_refusal(request, result) is not None, (request, result)


# -- the entity guard ----------------------------------------------------------


def test_entities_find_numbers_ids_emails_and_names() -> None:
    assert entities("Where is order 123?") == {"123"}
    assert entities("Status of ticket A-123 please") == {"a-123"}
    assert entities("Where is order #456?") == {"456"}
    assert entities("Email bob.smith@example.com about it") == {"bob.smith@example.com"}
    assert entities("Is https://example.com/a down?") == {"https://example.com/a"}
    assert entities("Can Alice see the report from Acme Corp?") == {"alice", "acme", "corp"}
    assert entities("Summarise the file 'quarterly plan'") == {"quarterly plan"}
    assert entities("Does the iPhone support NFC?") == {"iphone", "nfc"}


def test_entities_skip_sentence_openers_and_the_pronoun_i() -> None:
    assert entities("How do I reset my password?") == frozenset()
    assert entities("Hello. What should I do? Please help!") == frozenset()
    assert entities("How do I get to Paris? Thanks.") == {"paris"}


def test_days_months_times_and_small_numbers_are_entities_in_any_case() -> None:
    assert entities("what are the opening hours on monday") == {"monday"}
    assert entities("Opening hours on Mondays?") == {"monday"}
    assert entities("Monday opening hours?") == {"monday"}, "a sentence opener too"
    assert entities("are you open tomorrow morning") == {"tomorrow", "morning"}
    assert entities("is the office closed in december") == {"december"}
    assert entities("book a table for two") == {"two"}
    assert entities("which one may i choose") == frozenset(), "a pronoun and a verb"


def test_different_specifics_different_entity_sets() -> None:
    assert entities("Where is order 123?") != entities("Where is order 456?")
    assert entities("Ship it to Berlin") != entities("Ship it to Madrid")
    assert entities("Where is order 123?") == entities("where's my order 123")


@pytest.mark.parametrize(
    ("asked", "stored"),
    [
        ("how do i convert celsius to fahrenheit", "how do i convert fahrenheit to celsius"),
        ("please convert fahrenheit to celsius", "convert celsius to fahrenheit"),
        ("flights from paris to london", "flights to paris from london"),
        ("is 3 bigger than 5", "is 5 bigger than 3"),
        ("is a cat bigger than a dog", "is a dog bigger than a cat"),
    ],
)
def test_words_that_trade_places_around_another_are_another_question(
    asked: str, stored: str
) -> None:
    assert reordered(word_order(asked), word_order(stored))
    assert reordered(word_order(stored), word_order(asked))


@pytest.mark.parametrize(
    ("asked", "stored"),
    [
        ("how can i reset my password", "how do i reset my password"),
        ("i forgot my password, how do i reset it", "how do i reset my password"),
        ("to learn python, what is the best way", "what is the best way to learn python"),
        ("what's the capital city of france", "what is the capital of france"),
        ("translate hello into spanish", "translate hello into french"),
        ("where is my order", "where is my order"),
    ],
)
def test_paraphrases_that_move_words_pass_the_word_order_guard(asked: str, stored: str) -> None:
    assert not reordered(word_order(asked), word_order(stored))


def test_word_order_counts_repeats_and_skips_question_words() -> None:
    assert word_order("how to convert celsius to fahrenheit") == (
        "to",
        "convert",
        "celsius",
        "to#2",
        "fahrenheit",
    )
    assert word_order("what is it") == ()


def test_request_entities_cover_every_message() -> None:
    chat = req(
        messages=[
            {"role": "system", "content": "You work for Acme."},
            {"role": "user", "content": "Where is order 77?"},
        ]
    )
    assert request_entities(chat) == {"acme", "77"}


# -- the semantic index, with the real model -------------------------------------


@pytest.fixture(scope="module")
def embedder() -> Iterator[MiniLMEmbedder]:
    yield MiniLMEmbedder()


def similarity(embedder: Embedder, a: str, b: str) -> float:
    va, vb = embedder.embed([a, b])
    return float(va @ vb)


def test_embedder_returns_unit_float32_rows(embedder: MiniLMEmbedder) -> None:
    assert isinstance(embedder, Embedder)
    vectors = embedder.embed(["how do i reset my password", "what is the capital of france"])
    assert vectors.shape == (2, embedder.dim) and vectors.dtype == np.float32
    assert np.allclose(np.linalg.norm(vectors, axis=1), 1.0, atol=1e-5)
    assert embedder.embed([]).shape == (0, embedder.dim)


def test_paraphrases_are_close_and_unrelated_questions_far(embedder: MiniLMEmbedder) -> None:
    # Measured: 0.99, 0.99 and 0.05; the bounds leave a wide margin.
    close = similarity(embedder, "how do i reset my password", "how can i reset my password")
    assert close > 0.9
    other = similarity(
        embedder, "how do i cancel my subscription", "how can i cancel my subscription"
    )
    assert other > 0.9
    far = similarity(embedder, "how do i reset my password", "what is the capital of france")
    assert far < 0.5


def fill(index: SemanticIndex, embedder: Embedder, prompts: list[str], scope: str) -> None:
    for ts, (prompt, vector) in enumerate(zip(prompts, embedder.embed(prompts), strict=True)):
        words = word_order(normalise_prompt(req(prompt)))
        index.add(prompt, scope, entities(prompt), vector, ts, words)


def query(
    index: SemanticIndex, embedder: Embedder, prompt: str, scope: str, threshold: float
) -> list[tuple[str, float]]:
    vector = embedder.embed([prompt])[0]
    words = word_order(normalise_prompt(req(prompt)))
    return index.nearest(vector, scope, entities(prompt), words=words, threshold=threshold)


def test_nearest_finds_a_paraphrase_above_the_threshold(embedder: MiniLMEmbedder) -> None:
    scope = cache_scope(req(), SETTINGS)
    index = SemanticIndex(embedder.dim, 100)
    fill(
        index,
        embedder,
        ["how do i reset my password", "how do i cancel my subscription", "recommend a pasta"],
        scope,
    )
    hits = query(index, embedder, "how can i reset my password", scope, SETTINGS.threshold)
    assert hits and hits[0][0] == "how do i reset my password" and hits[0][1] > 0.95
    # "upgrade" vs "cancel" measured 0.64: related, but a different question.
    assert query(index, embedder, "how do i upgrade my subscription", scope, 0.9) == []
    assert query(index, embedder, "what is the capital of france", scope, 0.9) == []
    other_scope = cache_scope(req(max_tokens=2000), SETTINGS)
    assert query(index, embedder, "how can i reset my password", other_scope, 0.9) == []


def test_close_embeddings_with_different_entities_never_match(embedder: MiniLMEmbedder) -> None:
    scope = cache_scope(req(), SETTINGS)
    # The embedding alone would answer one order with the other (measured 0.97).
    assert similarity(embedder, "Where is my order 12345?", "Where is my order 12346?") > 0.9
    index = SemanticIndex(embedder.dim, 100)
    fill(index, embedder, ["Where is my order 12345?"], scope)
    assert query(index, embedder, "Where is my order 12346?", scope, 0.5) == []
    assert not index.has_candidates(scope, entities("Where is my order 12346?"))
    hits = query(index, embedder, "where's my order 12345", scope, 0.9)
    assert [key for key, _ in hits] == ["Where is my order 12345?"]


def test_a_swapped_direction_is_never_the_nearest_even_when_closest(
    embedder: MiniLMEmbedder,
) -> None:
    scope = cache_scope(req(), SETTINGS)
    stored = "how do i convert celsius to fahrenheit"  # lower case: no entity tells them apart
    swapped = "how do i convert fahrenheit to celsius"
    # The embedding alone would answer one with the other (measured 0.99).
    assert similarity(embedder, stored, swapped) > SETTINGS.threshold
    index = SemanticIndex(embedder.dim, 100)
    fill(index, embedder, [stored, "how do i convert fahrenheit into kelvin"], scope)
    assert [key for key, _ in query(index, embedder, swapped, scope, 0.5)] == [
        "how do i convert fahrenheit into kelvin"
    ], "the swapped entry is skipped, the next nearest still found"
    hits = query(index, embedder, "how can i convert celsius to fahrenheit", scope, 0.9)
    assert [key for key, _ in hits][:1] == [stored]


def test_another_day_is_never_the_nearest_even_when_closest(embedder: MiniLMEmbedder) -> None:
    scope = cache_scope(req(), SETTINGS)
    stored = "what are the opening hours on monday"
    # The embedding alone would answer one day with the other (measured 0.944).
    assert similarity(embedder, stored, "what are the opening hours on tuesday") > 0.93
    assert similarity(embedder, stored, "what are your opening hours on mondays") > 0.93
    index = SemanticIndex(embedder.dim, 100)
    fill(index, embedder, [stored], scope)
    assert query(index, embedder, "what are the opening hours on tuesday", scope, 0.5) == []
    hits = query(index, embedder, "what are your opening hours on mondays", scope, 0.93)
    assert [key for key, _ in hits] == [stored]


def test_index_is_bounded_and_forgets_expired_and_removed_entries(
    embedder: MiniLMEmbedder,
) -> None:
    scope = cache_scope(req(), SETTINGS)
    prompts = [
        "how do i reset my password",
        "how do i cancel my subscription",
        "what are your opening hours",
        "explain photosynthesis simply",
    ]
    index = SemanticIndex(embedder.dim, 3)
    fill(index, embedder, prompts, scope)  # timestamps 0..3
    assert len(index) == 3 and prompts[0] not in index  # the oldest left
    assert query(index, embedder, "how can i reset my password", scope, 0.9) == []

    index.remove(prompts[1])  # swap-removal keeps the other rows right
    hits = query(index, embedder, "explain photosynthesis in simple terms", scope, 0.9)
    assert [key for key, _ in hits] == [prompts[3]]

    index.touch(prompts[2], 10)
    assert index.expire(cutoff_ms=5) == 1
    hits = index.nearest(embedder.embed([prompts[2]])[0], scope, frozenset())
    assert [key for key, _ in hits] == [prompts[2]]
    assert len(index) == 1


def test_index_refuses_vectors_of_another_width(embedder: MiniLMEmbedder) -> None:
    index = SemanticIndex(embedder.dim, 10)
    with pytest.raises(ValueError, match="index dim"):
        index.add("k", "s", frozenset(), np.ones(embedder.dim + 1, dtype=np.float32), 0)


@pytest.mark.parametrize(
    "prompt",
    [
        "What's on the menu today?",
        "What is today's special?",
        "Is the shop open tonight",
        "Will it rain TOMORROW?",
        "Who won yesterday",
        "What time is it now?",
        "What is the latest version of Python?",
        "Any events this week?",
        "What happens next month?",
    ],
)
def test_questions_about_a_time_that_moves_on_are_time_relative(prompt: str) -> None:
    assert time_relative(normalise_prompt(req(prompt)))


@pytest.mark.parametrize(
    "prompt",
    [
        "How do I reset my password?",
        "How do I change my current password?",
        "Where are my recent orders?",
        "What are the known issues?",
        "What are your opening hours on weekdays?",
        "Which week of the year is busiest?",
    ],
)
def test_other_questions_are_not_time_relative(prompt: str) -> None:
    assert not time_relative(normalise_prompt(req(prompt)))
