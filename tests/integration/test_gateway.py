"""The OpenAI-compatible gateway (streams.gateway) on the session stack,
driven by clients laneway did not write: OpenAI's Python SDK, curl and
aiohttp's client. The gateway runs in the test's process
(``GatewayServer``), and once as ``laneway gateway`` in a subprocess."""

from __future__ import annotations

import asyncio
import json
import logging
import os
import subprocess
import sys
import time
import urllib.request
from collections.abc import AsyncIterator, Callable
from contextlib import AbstractAsyncContextManager, asynccontextmanager
from pathlib import Path
from typing import Any

import aiohttp
import openai
import pytest
from openai import AsyncOpenAI

from schemas.settings import Settings
from streams.devstack.embedded import free_port
from streams.gateway.keys import add_key
from streams.gateway.server import GatewayServer

from .conftest import read_topic

NO_CACHE = {"X-Laneway-Cache": "bypass"}
SEA = [{"role": "user", "content": "Describe the sea in one sentence."}]

Started = Callable[..., AbstractAsyncContextManager[GatewayServer]]


@pytest.fixture
def gateway(settings: Settings, tmp_path: Path) -> Started:
    """Start a gateway on the session stack: ``gateway()`` open to any key,
    ``gateway(keys_file=...)`` with keys."""

    @asynccontextmanager
    async def start(keys_file: Path | None = None) -> AsyncIterator[GatewayServer]:
        # A generous grace after a deadline: the loaded test machine's
        # classifier may take seconds to answer INF-503.
        options = settings.gateway.model_copy(
            update={"port": 0, "keys_file": keys_file, "deadline_grace_s": 60.0}
        )
        async with GatewayServer(settings.model_copy(update={"gateway": options})) as server:
            yield server

    return start


def sdk(server: GatewayServer, key: str = "anything") -> AsyncOpenAI:
    return AsyncOpenAI(base_url=server.base_url, api_key=key, max_retries=0, timeout=120)


async def test_the_openai_sdk_gets_completions_and_the_laneway_headers(
    gateway: Started, caplog: pytest.LogCaptureFixture
) -> None:
    with caplog.at_level(logging.WARNING, logger="streams.gateway.server"):
        async with gateway() as server:
            assert "no API keys configured" in caplog.text, "an open gateway says so"
            client = sdk(server)
            raw = await client.chat.completions.with_raw_response.create(
                model="auto", messages=SEA, max_tokens=8, extra_headers=NO_CACHE
            )
            answer = raw.parse()
            choice = answer.choices[0]
            assert answer.object == "chat.completion" and answer.id.startswith("chatcmpl-gw-")
            assert choice.message.role == "assistant" and choice.message.content
            assert choice.finish_reason in ("stop", "length")
            assert answer.usage is not None and answer.usage.completion_tokens > 0
            assert answer.usage.total_tokens == (
                answer.usage.prompt_tokens + answer.usage.completion_tokens
            )
            assert raw.headers["x-laneway-path"] in ("light", "heavy")
            assert raw.headers["x-laneway-model"] == answer.model
            assert raw.headers["x-laneway-lane"] in ("realtime", "medium", "bulk")
            assert raw.headers["x-laneway-cache-hit"] == "false"
            assert raw.headers["x-laneway-version"]

            rule = await client.chat.completions.with_raw_response.create(
                model="auto", messages=[{"role": "user", "content": "Hello!"}]
            )
            assert rule.headers["x-laneway-path"] == "rules"
            assert rule.headers["x-laneway-rule"] == "greeting"
            assert rule.parse().choices[0].message.content == "Hello! How can I help you today?"

            named = await client.chat.completions.with_raw_response.create(
                model="heavy",  # a named model answers: OpenAI's sampling fields taken as sent
                messages=SEA,
                max_completion_tokens=8,
                top_p=0.9,
                temperature=0.7,
                seed=7,
                user="end-user-1",
                n=1,
                stop="\n\n",
                extra_headers=NO_CACHE,
            )
            assert named.headers["x-laneway-path"] == "heavy"
            assert named.parse().usage.completion_tokens <= 8  # type: ignore[union-attr]
            with pytest.raises(openai.BadRequestError, match="gpt-4o"):
                await client.chat.completions.create(model="gpt-4o", messages=SEA)

            models = await client.models.list()
            ids = [m.id for m in models.data]
            assert ids[0] == "auto" and {"light", "heavy"} <= set(ids)
            assert (await client.models.retrieve("heavy")).id == "heavy"
            with pytest.raises(openai.NotFoundError):
                await client.models.retrieve("gpt-4o")


async def test_the_openai_sdk_streams_an_answer_with_its_usage(gateway: Started) -> None:
    async with gateway() as server:
        client = sdk(server)
        async with client.chat.completions.with_streaming_response.create(
            model="auto",
            messages=SEA,
            max_tokens=24,
            stream=True,
            stream_options={"include_usage": True},
            extra_headers=NO_CACHE,
        ) as response:
            assert response.headers["content-type"].startswith("text/event-stream")
            assert response.headers["x-laneway-path"] in ("light", "heavy")
            chunks = [chunk async for chunk in await response.parse()]
    first, *middle, finish, usage = chunks
    assert first.choices[0].delta.role == "assistant"
    text = "".join(c.choices[0].delta.content or "" for c in middle)
    assert text and len(middle) >= 2, "the answer came in pieces"
    assert finish.choices[0].finish_reason in ("stop", "length")
    assert usage.choices == [] and usage.usage is not None
    assert usage.usage.completion_tokens > 0
    assert {c.id for c in chunks} == {first.id} and first.model == response.headers[
        "x-laneway-model"
    ]


async def test_keys_limits_and_laneways_errors_reach_the_sdk_as_its_own_exceptions(
    gateway: Started, tmp_path: Path
) -> None:
    keys = tmp_path / "keys.json"
    good, _ = add_key(keys, "acme", rpm=None, tpm=None)
    tight, _ = add_key(keys, "tight", rpm=1, tpm=None)
    thrifty, _ = add_key(keys, "thrifty", rpm=None, tpm=1)
    # conftest gives tenant "tiny" a burst of 2 in laneway's own limiter (Redis).
    tiny, _ = add_key(keys, "tiny", rpm=None, tpm=None)
    async with gateway(keys_file=keys) as server:
        hello = [{"role": "user", "content": "Hello!"}]
        with pytest.raises(openai.AuthenticationError) as unknown:
            await sdk(server, "lw-not-a-key").chat.completions.create(model="auto", messages=hello)
        assert unknown.value.code == "invalid_api_key"
        with pytest.raises(openai.AuthenticationError):
            await sdk(server, "lw-not-a-key").models.list()

        client = sdk(server, good)
        assert (await client.chat.completions.create(model="auto", messages=hello)).choices
        with pytest.raises(openai.BadRequestError) as many:
            await client.chat.completions.create(model="auto", messages=hello, n=2)
        assert many.value.code == "INF-400" and many.value.param == "n"
        with pytest.raises(openai.BadRequestError, match="must not be empty"):
            await client.chat.completions.create(model="auto", messages=[])
        # laneway's own answer: a deadline that passed before the classifier saw it.
        with pytest.raises(openai.InternalServerError) as late:
            await client.chat.completions.create(
                model="auto", messages=SEA, extra_headers={**NO_CACHE, "X-Laneway-Deadline-Ms": "1"}
            )
        assert late.value.status_code == 503 and late.value.code == "INF-503"

        limited = sdk(server, tight)
        assert (await limited.chat.completions.create(model="auto", messages=hello)).choices
        with pytest.raises(openai.RateLimitError) as over:
            await limited.chat.completions.create(model="auto", messages=hello)
        assert over.value.code == "INF-429" and "tight" in over.value.message
        assert 1 <= int(over.value.response.headers["retry-after"]) <= 60
        assert (await client.chat.completions.create(model="auto", messages=hello)).choices, (
            "another key is not held back"
        )

        # Tokens per minute: counted once answered, so the next request waits.
        frugal = sdk(server, thrifty)
        spent = await frugal.chat.completions.create(
            model="auto", messages=SEA, max_tokens=4, extra_headers=NO_CACHE
        )
        assert spent.usage is not None and spent.usage.total_tokens > 1
        with pytest.raises(openai.RateLimitError, match="tokens in the last minute"):
            await frugal.chat.completions.create(model="auto", messages=hello)

        # The key's tenant reaches laneway: its own limiter refuses "tiny" with INF-429.
        small = sdk(server, tiny)
        answers = await asyncio.gather(
            *(small.chat.completions.create(model="auto", messages=hello) for _ in range(4)),
            return_exceptions=True,
        )
        refused = [a for a in answers if isinstance(a, openai.RateLimitError)]
        assert refused and all(a.code == "INF-429" for a in refused), answers
        assert all(int(a.response.headers["retry-after"]) >= 1 for a in refused)
        assert not [a for a in answers if isinstance(a, Exception) and a not in refused], answers


async def test_a_client_that_goes_away_cancels_its_request(
    gateway: Started, settings: Settings
) -> None:
    async with gateway() as server, aiohttp.ClientSession() as http:
        body = {
            "model": "auto",
            "messages": [
                {"role": "user", "content": "Write a very long story about a dragon and a knight."}
            ],
            "max_tokens": 400,
            "stream": True,
        }
        async with http.post(
            f"{server.base_url}/chat/completions", json=body, headers=NO_CACHE
        ) as response:
            assert response.status == 200
            request_id = response.headers["X-Laneway-Request-Id"]
            await response.content.readline()  # the first event: then hang up
            response.close()
        give_up = time.monotonic() + 60
        while True:
            found = [
                json.loads(r.value)
                for r in await read_topic(settings, settings.topic("results"))
                if r.key == request_id.encode()
            ]
            if found or time.monotonic() > give_up:
                break
            await asyncio.sleep(1)
    assert found, f"no result for {request_id}"
    assert found[0]["finish_reason"] == "cancelled"
    assert found[0]["error"]["code"] == "INF-503"


def _get(url: str) -> tuple[int, str]:
    try:
        with urllib.request.urlopen(url, timeout=2) as response:
            return response.status, response.read().decode()
    except OSError as exc:
        return getattr(exc, "code", 0), ""


def test_laneway_gateway_serves_curl_a_stream_and_its_metrics(
    settings: Settings, tmp_path: Path
) -> None:
    api, ops = free_port(), free_port()
    env = {
        **os.environ,
        "LANEWAY_KAFKA_BOOTSTRAP": settings.kafka.bootstrap,
        "LANEWAY_REDIS_URL": settings.redis.url,
        "LANEWAY_GATEWAY_PORT": str(api),
        "LANEWAY_HTTP_PORT": str(ops),
    }
    log_path = tmp_path / "gateway.log"
    with open(log_path, "w") as log:
        proc = subprocess.Popen(
            [sys.executable, "-m", "streams.cli.main", "gateway"],
            env=env,
            stdout=log,
            stderr=subprocess.STDOUT,
        )
    try:
        give_up = time.monotonic() + 60
        while _get(f"http://127.0.0.1:{ops}/readyz")[0] != 200:
            assert proc.poll() is None, log_path.read_text()
            assert time.monotonic() < give_up, "the gateway did not get ready"
            time.sleep(0.2)
        body = {"model": "auto", "messages": SEA, "max_tokens": 16, "stream": True}
        curl = subprocess.run(
            [
                "curl",
                "-sN",
                "--max-time",
                "120",
                f"http://127.0.0.1:{api}/v1/chat/completions",
                "-H",
                "Content-Type: application/json",
                "-H",
                "X-Laneway-Cache: bypass",
                "-d",
                json.dumps(body),
            ],
            capture_output=True,
            text=True,
            check=True,
        )
        events = [line[6:] for line in curl.stdout.splitlines() if line.startswith("data: ")]
        assert events[-1] == "[DONE]", curl.stdout[-500:]
        chunks: list[dict[str, Any]] = [json.loads(e) for e in events[:-1]]
        assert chunks[0]["choices"][0]["delta"]["role"] == "assistant"
        assert chunks[-1]["choices"][0]["finish_reason"] in ("stop", "length")
        assert "".join(c["choices"][0]["delta"].get("content", "") for c in chunks)

        status, metrics = _get(f"http://127.0.0.1:{ops}/metrics")
        assert status == 200
        counted = 'laneway_gateway_requests_total{endpoint="/v1/chat/completions",status="200"}'
        assert counted in metrics
        assert "laneway_gateway_time_to_first_byte_seconds_count" in metrics
        assert _get(f"http://127.0.0.1:{ops}/healthz")[0] == 200
    finally:
        proc.terminate()
        proc.wait(30)
    text = log_path.read_text()
    assert "no API keys configured" in text and "OpenAI API on" in text
    assert proc.returncode == 0, text[-2000:]
