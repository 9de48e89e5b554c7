"""OpenAI's chat fields through the real stack: a request naming its model
(with top_p, max_completion_tokens, user and n=1) is answered by that model;
n=2, response_format and an unknown model are INF-400 naming what is wrong;
a rule answer counts its tokens."""

from __future__ import annotations

import asyncio
import json
import uuid

from streams.client import LanewayClient


async def test_a_named_model_answers_with_the_openai_fields(client: LanewayClient) -> None:
    result = await client.ask(
        "What is the capital of France?",
        model="heavy",
        temperature=0.7,
        top_p=0.9,
        seed=5,
        max_completion_tokens=8,
        user="end-user-42",
        n=1,
        timeout_s=120,
    )
    assert result.status == "ok" and result.output, result
    assert (result.path, result.model) == ("heavy", "llamacpp:gemma3-270m")
    assert result.lane == "medium"  # realtime workers load only light
    assert not result.degraded
    assert 0 < result.usage.completion_tokens <= 8 and result.usage.prompt_tokens > 0


async def test_a_named_model_answers_what_a_rule_would_have(client: LanewayClient) -> None:
    rule = await client.ask("Hello!", timeout_s=60)
    assert (rule.path, rule.model) == ("rules", "rules:greeting")
    assert rule.usage.completion_tokens > 5 and rule.usage.prompt_tokens > 0  # counted
    named = await client.ask(
        "Hello!",
        model="llamacpp:smollm2-135m",
        max_tokens=8,
        metadata={"cache": "bypass"},
        timeout_s=120,
    )
    assert named.status == "ok", named
    assert (named.path, named.model, named.version) == ("light", "llamacpp:smollm2-135m", "q4_1")


async def test_what_laneway_does_not_do_is_inf_400_naming_it(client: LanewayClient) -> None:
    tag = uuid.uuid4().hex[:6]
    asks = {
        f"n2-{tag}": ({"n": 2}, "n=2: laneway answers n=1 only"),
        f"format-{tag}": (
            {"response_format": {"type": "json_object"}},
            "response_format is not supported by laneway",
        ),
        f"model-{tag}": (
            {"model": "gpt-4o"},
            "model 'gpt-4o' is not served here: name one of auto, light, heavy",
        ),
    }
    futures = {}
    for request_id, (fields, _) in asks.items():
        value = {"id": request_id, "prompt": "hi", "reply_to": client.reply_to, **fields}
        futures[request_id] = await client.submit_raw(json.dumps(value).encode(), request_id)
    for request_id, (_, needle) in asks.items():
        result = await asyncio.wait_for(futures[request_id], 60)
        assert result.status == "error" and result.error is not None
        assert result.error.code == "INF-400" and not result.error.retryable
        assert needle in result.error.message, result.error.message
