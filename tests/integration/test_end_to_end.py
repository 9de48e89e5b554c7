"""Requests through the real broker, classifier, workers and models."""

from __future__ import annotations

import asyncio
import json
import os
import signal
import subprocess
import sys
import time
import uuid
from collections import Counter

import pytest

from schemas.messages import InferenceResult
from schemas.settings import Settings
from streams.bench.plain_client import PlainClient
from streams.client import LanewayClient
from streams.devstack.supervisor import Stack
from tests.integration.conftest import read_topic


async def test_every_lane_answers_exactly_once(client: LanewayClient, settings: Settings) -> None:
    asks = {
        "rules": ("Hello!", {}),
        "realtime": ("What is the capital of France?", {"lane": "realtime"}),
        "medium": ("Explain why the sky is blue.", {}),
        "bulk": ("Name a colour.", {"batch_id": "b-1"}),
    }
    results = await asyncio.gather(
        *(
            client.ask(
                prompt, id=f"{name}-{uuid.uuid4().hex[:6]}", max_tokens=8, timeout_s=120, **kw
            )
            for name, (prompt, kw) in asks.items()
        )
    )
    by_name = dict(zip(asks, results, strict=True))
    for result in results:
        assert result.status == "ok", result
        assert result.output
    assert (by_name["rules"].lane, by_name["rules"].path) == ("realtime", "rules")
    assert (by_name["realtime"].lane, by_name["realtime"].path) == ("realtime", "light")
    assert by_name["realtime"].model == "llamacpp:smollm2-135m"
    assert (by_name["medium"].lane, by_name["medium"].path) == ("medium", "heavy")
    assert by_name["medium"].model == "llamacpp:gemma3-270m"
    assert by_name["bulk"].lane == "bulk" and by_name["bulk"].batch_id == "b-1"
    # A model stops at max_tokens; a rule's answer is given whole, and counted.
    assert all(r.usage.completion_tokens <= 8 for r in results if r.path != "rules")
    assert by_name["rules"].usage.completion_tokens > 0

    await asyncio.sleep(1.0)
    replies = await read_topic(settings, client.reply_to)
    counts = Counter(InferenceResult.model_validate_json(r.value).id for r in replies)
    assert counts == Counter({r.id: 1 for r in results})
    assert client.duplicates == 0


async def test_a_client_without_the_sdk_gets_answers_and_clear_errors(settings: Settings) -> None:
    """Plain aiokafka at its default settings, JSON written by hand: the
    wire contract alone is enough for a rule, a model and a bad request."""
    async with PlainClient(settings.kafka, name="e2e-plain") as plain:
        asks = [
            {"prompt": "Hello!"},
            {
                "prompt": "What is the capital of France?",
                "lane": "realtime",
                "max_tokens": 8,
                "metadata": {"cache": "bypass"},  # an earlier test's answer may be cached
            },
            {"prompt": "Hello!", "max_tokens": 0},
        ]
        futures = [
            await plain.submit({"id": f"plain-{i}-{uuid.uuid4().hex[:6]}", **ask})
            for i, ask in enumerate(asks)
        ]
        rule, model, bad = await asyncio.wait_for(asyncio.gather(*futures), 120)
    assert (rule.status, rule.path) == ("ok", "rules") and rule.output
    assert (model.status, model.lane, model.path) == ("ok", "realtime", "light") and model.output
    assert bad.status == "error" and bad.error is not None and bad.error.code == "INF-400"
    assert "max_tokens" in bad.error.message


async def test_results_and_quality_topics_see_every_terminal_result(
    client: LanewayClient, settings: Settings
) -> None:
    result = await client.ask("ping", timeout_s=60)
    assert result.output == "pong"
    results = await read_topic(settings, settings.topic("results"))
    assert any(r.key == result.id.encode() for r in results)
    quality = [json.loads(r.value) for r in await read_topic(settings, settings.topic("quality"))]
    event = next(e for e in quality if e["id"] == result.id)
    assert event["path"] == "rules" and event["success"] is True


async def test_malformed_records_get_inf_400_and_the_dlq(
    client: LanewayClient, settings: Settings
) -> None:
    tag = uuid.uuid4().hex[:6]
    not_json = f"not json {tag}".encode()
    wrong_schema = json.dumps({"id": f"schema-{tag}", "prompt": 5, "reply_to": client.reply_to})
    oversized = json.dumps(
        {"id": f"big-{tag}", "prompt": "x" * (64 * 1024 + 1), "reply_to": client.reply_to}
    )
    foreign = json.dumps({"id": f"foreign-{tag}", "prompt": "hi", "reply_to": "laneway.requests"})

    async with LanewayClient(settings.kafka, reply_to=settings.replies_topic) as default_topic:
        await client.submit_raw(not_json, request_id=f"nobody-{tag}")
        schema_reply = await client.submit_raw(wrong_schema.encode(), f"schema-{tag}")
        big_reply = await client.submit_raw(oversized.encode(), f"big-{tag}")
        foreign_reply = await default_topic.submit_raw(foreign.encode(), f"foreign-{tag}")
        good = await client.ask("ping", timeout_s=60)  # the agent is still alive

        for future, needle in (
            (schema_reply, "prompt"),
            (big_reply, "limit 65536"),
            (foreign_reply, "reply_to='laneway.requests'"),
        ):
            result = await asyncio.wait_for(future, 30)
            assert result.status == "error" and result.error is not None
            assert result.error.code == "INF-400" and not result.error.retryable
            assert needle in result.error.message
    assert good.status == "ok"

    dlq = await read_topic(settings, settings.topic("dlq"))
    by_value = {r.value: dict(r.headers) for r in dlq}
    for payload in (not_json, wrong_schema.encode(), oversized.encode(), foreign.encode()):
        headers = by_value[payload]
        assert headers["laneway-error-code"] == b"INF-400"
        assert headers["laneway-source-topic"] == settings.topic("requests").encode()
        assert int(headers["laneway-source-offset"]) >= 0
        assert headers["laneway-error"]


async def test_request_past_its_deadline_gets_inf_503(client: LanewayClient) -> None:
    request = {"id": f"late-{uuid.uuid4().hex[:6]}", "prompt": "Explain tides", "deadline_ms": 1000}
    five_seconds_ago = int(time.time() * 1000) - 5_000
    reply = await client.submit(request, timestamp_ms=five_seconds_ago)
    result = await asyncio.wait_for(reply, 30)
    assert result.error is not None and result.error.code == "INF-503" and result.error.retryable
    assert "before classification" in result.error.message


async def test_worker_killed_mid_batch_loses_no_request(
    stack: Stack, client: LanewayClient
) -> None:
    worker = stack.child("worker-bulk")
    restarts_before = worker.restarts
    ids = [f"kill-{i}-{uuid.uuid4().hex[:6]}" for i in range(12)]
    futures = {
        rid: await client.submit(
            {
                "id": rid,
                "prompt": f"Write one sentence about the number {i}.",
                "max_tokens": 24,
                "lane": "bulk",
            }
        )
        for i, rid in enumerate(ids)
    }
    # The first batch of four has been answered; the next is in flight.
    await asyncio.wait(futures.values(), return_when=asyncio.FIRST_COMPLETED, timeout=120)
    answered_before_kill = sum(f.done() for f in futures.values())
    assert answered_before_kill < len(ids), "the worker finished everything before the kill"
    assert worker.pid is not None
    os.kill(worker.pid, signal.SIGKILL)

    done, pending = await asyncio.wait(futures.values(), timeout=240)
    assert not pending, f"lost {len(pending)} of {len(ids)} requests"
    assert {f.result().id for f in done} == set(ids)
    assert all(f.result().status == "ok" for f in done)
    assert worker.restarts > restarts_before


def test_laneway_ask_cli(settings: Settings) -> None:
    run = subprocess.run(
        [
            sys.executable,
            "-m",
            "streams.cli.main",
            "--bootstrap",
            settings.kafka.bootstrap,
            "ask",
            "hello",
        ],
        capture_output=True,
        text=True,
        timeout=120,
        # The stack's Redis too: `ask` first checks that a worker of the
        # stack it reaches is alive (the machine may have a Redis of its own).
        env={
            **os.environ,
            "LANEWAY_LOG_LEVEL": "WARNING",
            "LANEWAY_REDIS_URL": settings.redis.url,
            "LANEWAY_REDIS_KEY_PREFIX": settings.redis.key_prefix,
        },
    )
    assert run.returncode == 0, run.stderr
    assert "lane=realtime path=rules" in run.stdout
    assert "Hello! How can I help you today?" in run.stdout


async def test_an_id_can_be_asked_again_after_its_answer(client: LanewayClient) -> None:
    request_id = f"again-{uuid.uuid4().hex[:6]}"
    first = await client.ask("ping", id=request_id, timeout_s=60)
    second = await client.ask("ping", id=request_id, timeout_s=60)
    assert first.status == second.status == "ok"
    future = await client.submit({"id": f"busy-{request_id}", "prompt": "ping"})
    with pytest.raises(ValueError, match="already in flight"):
        await client.submit({"id": f"busy-{request_id}", "prompt": "ping"})
    assert (await asyncio.wait_for(future, 60)).status == "ok"
