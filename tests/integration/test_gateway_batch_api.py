"""The gateway's second half on the session stack, driven by OpenAI's own
Python SDK: the Batch API (files, batches, cancel, tenants), feedback onto
its topic, the live roll-out state in ``/v1/models``, and per-key limits
that two gateways share through Redis."""

from __future__ import annotations

import asyncio
import json
import time
import uuid
from collections.abc import AsyncIterator, Callable
from contextlib import AbstractAsyncContextManager, asynccontextmanager
from pathlib import Path
from typing import Any

import aiohttp
import openai
import pytest
from openai import AsyncOpenAI
from openai.types import Batch

from schemas.settings import Settings
from streams.gateway.batch_shapes import BatchRecord
from streams.gateway.batch_store import BatchStore
from streams.gateway.keys import add_key
from streams.gateway.server import GatewayServer
from streams.rollout.state import RolloutStore, VersionRollout, field_name

from .conftest import read_topic

Started = Callable[..., AbstractAsyncContextManager[GatewayServer]]
SEA = [{"role": "user", "content": "Describe the sea in one sentence."}]
FINAL = ("completed", "failed", "expired", "cancelled")


@pytest.fixture
def gateway(settings: Settings) -> Started:
    """``gateway(keys_file=...)``: a gateway on the session stack, its
    batch leases short so that a sweep comes every second."""

    @asynccontextmanager
    async def start(
        keys_file: Path | None = None, submit_rps: float | None = None
    ) -> AsyncIterator[GatewayServer]:
        options = settings.gateway.model_copy(
            update={"port": 0, "keys_file": keys_file, "batch_lease_s": 3.0}
        )
        update: dict[str, Any] = {"gateway": options}
        if submit_rps is not None:  # a slow submission, to stop or cancel half-way
            update["batch"] = settings.batch.model_copy(update={"submit_rps": submit_rps})
        async with GatewayServer(settings.model_copy(update=update)) as server:
            yield server

    return start


def sdk(server: GatewayServer, key: str = "anything") -> AsyncOpenAI:
    return AsyncOpenAI(base_url=server.base_url, api_key=key, max_retries=0, timeout=120)


def batch_file(lines: list[tuple[str, list[dict[str, str]], int]]) -> bytes:
    rows = [
        {
            "custom_id": custom_id,
            "method": "POST",
            "url": "/v1/chat/completions",
            "body": {"model": "auto", "messages": messages, "max_tokens": max_tokens},
        }
        for custom_id, messages, max_tokens in lines
    ]
    return "".join(json.dumps(row) + "\n" for row in rows).encode()


async def wait_final(client: AsyncOpenAI, batch_id: str, timeout_s: float = 300) -> Batch:
    """Poll the batch until its status is final (at most ``timeout_s``)."""
    give_up = time.monotonic() + timeout_s
    while True:
        batch = await client.batches.retrieve(batch_id)
        if batch.status in FINAL:
            return batch
        assert time.monotonic() < give_up, f"batch {batch_id} still {batch.status}: {batch}"
        await asyncio.sleep(0.5)


async def test_a_batch_goes_from_a_file_to_its_output_for_its_tenant_alone(
    gateway: Started, tmp_path: Path
) -> None:
    keys = tmp_path / "keys.json"
    acme, _ = add_key(keys, "acme", rpm=None, tpm=None)
    other, _ = add_key(keys, "globex", rpm=None, tpm=None)
    data = batch_file(
        [
            ("hello-1", [{"role": "user", "content": "Hello!"}], 8),
            ("sea-2", SEA, 8),
            ("hello-3", [{"role": "user", "content": "Hello!"}], 8),
        ]
    )
    async with gateway(keys_file=keys) as server:
        client, stranger = sdk(server, acme), sdk(server, other)
        upload = await client.files.create(file=("questions.jsonl", data), purpose="batch")
        assert upload.object == "file" and upload.purpose == "batch"
        assert upload.bytes == len(data) and upload.filename == "questions.jsonl"
        assert (await client.files.retrieve(upload.id)).id == upload.id
        assert (await client.files.content(upload.id)).content == data

        batch = await client.batches.create(
            input_file_id=upload.id,
            endpoint="/v1/chat/completions",
            completion_window="24h",
            metadata={"team": "search"},
        )
        assert batch.status == "validating" and batch.metadata == {"team": "search"}
        assert batch.input_file_id == upload.id and batch.completion_window == "24h"

        done = await wait_final(client, batch.id)
        assert done.status == "completed", done
        assert done.request_counts is not None
        assert (done.request_counts.total, done.request_counts.completed) == (3, 3)
        assert done.output_file_id and done.error_file_id is None
        assert done.completed_at and done.in_progress_at and done.created_at <= done.completed_at

        output = await client.files.content(done.output_file_id)
        lines = [json.loads(line) for line in output.text.splitlines()]
        assert [line["custom_id"] for line in lines] == ["hello-1", "sea-2", "hello-3"]
        for line in lines:
            assert line["error"] is None and line["id"].startswith("batch_req_")
            response = line["response"]
            assert response["status_code"] == 200 and response["request_id"]
            body = response["body"]
            assert body["object"] == "chat.completion"
            assert body["choices"][0]["message"]["content"]
        assert lines[0]["response"]["body"]["choices"][0]["message"]["content"] == (
            "Hello! How can I help you today?"
        )
        assert (await client.files.retrieve(done.output_file_id)).bytes == len(output.content)
        listed = await client.batches.list(limit=10)
        assert batch.id in [b.id for b in listed.data]

        # Another tenant sees none of it: as if it did not exist.
        with pytest.raises(openai.NotFoundError):
            await stranger.batches.retrieve(batch.id)
        with pytest.raises(openai.NotFoundError):
            await stranger.batches.cancel(batch.id)
        with pytest.raises(openai.NotFoundError):
            await stranger.files.retrieve(upload.id)
        with pytest.raises(openai.NotFoundError):
            await stranger.files.content(done.output_file_id)
        with pytest.raises(openai.NotFoundError):
            await stranger.batches.create(
                input_file_id=upload.id, endpoint="/v1/chat/completions", completion_window="24h"
            )
        assert batch.id not in [b.id for b in (await stranger.batches.list()).data]

        # The same file twice is two batches, as on OpenAI.
        again = await client.batches.create(
            input_file_id=upload.id, endpoint="/v1/chat/completions", completion_window="24h"
        )
        assert again.id != batch.id
        assert (await wait_final(client, again.id)).status == "completed"
        assert (await client.files.delete(upload.id)).deleted
        with pytest.raises(openai.NotFoundError):
            await client.files.retrieve(upload.id)


async def test_bad_files_and_batches_are_refused_as_the_sdks_own_errors(gateway: Started) -> None:
    async with gateway() as server:
        client = sdk(server)
        good = json.dumps(
            {
                "custom_id": "a",
                "method": "POST",
                "url": "/v1/chat/completions",
                "body": {"messages": SEA},
            }
        )
        data = (good + "\nnot json\n" + good + "\n").encode()
        with pytest.raises(openai.BadRequestError) as bad:
            await client.files.create(file=("bad.jsonl", data), purpose="batch")
        assert bad.value.code == "invalid_batch_file"
        assert (
            "line 2: not JSON" in bad.value.message and "line 3: custom_id 'a'" in bad.value.message
        )
        with pytest.raises(openai.BadRequestError, match="purpose"):
            await client.files.create(file=("ok.jsonl", good.encode()), purpose="fine-tune")
        upload = await client.files.create(file=("ok.jsonl", good.encode()), purpose="batch")
        with pytest.raises(openai.BadRequestError, match="endpoint"):
            await client.batches.create(
                input_file_id=upload.id,
                endpoint="/v1/embeddings",
                completion_window="24h",
            )
        with pytest.raises(openai.NotFoundError):
            await client.batches.create(
                input_file_id="file-nothing",
                endpoint="/v1/chat/completions",
                completion_window="24h",
            )
        with pytest.raises(openai.NotFoundError):
            await client.batches.retrieve("batch_nothing")


async def test_a_cancelled_batch_stops_and_says_what_never_ran(gateway: Started) -> None:
    long_story = [{"role": "user", "content": "Write a long story about a lighthouse keeper."}]
    data = batch_file([(f"story-{i}", long_story, 64) for i in range(40)])
    async with gateway() as server:
        client = sdk(server)
        upload = await client.files.create(file=("stories.jsonl", data), purpose="batch")
        batch = await client.batches.create(
            input_file_id=upload.id, endpoint="/v1/chat/completions", completion_window="24h"
        )
        cancelling = await client.batches.cancel(batch.id)
        assert cancelling.status in ("cancelling", "cancelled") and cancelling.cancelling_at
        done = await wait_final(client, batch.id, timeout_s=120)
        assert done.status == "cancelled" and done.cancelled_at
        counts = done.request_counts
        assert counts is not None and counts.completed + counts.failed < 40, counts
        assert done.error_file_id, "the lines that never ran are in the error file"
        errors = [
            json.loads(line)
            for line in (await client.files.content(done.error_file_id)).text.splitlines()
        ]
        missing = [e for e in errors if e["error"]["code"] == "batch_cancelled"]
        assert missing and all(e["response"] is None for e in missing)
        assert {e["custom_id"] for e in errors} <= {f"story-{i}" for i in range(40)}
        again = await client.batches.cancel(batch.id)
        assert again.status == "cancelled", "cancelling twice changes nothing"


async def wait_produced(client: AsyncOpenAI, batch_id: str, at_least: int) -> Batch:
    """Poll until the submission produced ``at_least`` requests (60 s at most)."""
    give_up = time.monotonic() + 60
    while True:
        batch = await client.batches.retrieve(batch_id)
        if batch.model_extra["laneway"]["produced"] >= at_least:  # type: ignore[index]
            return batch
        assert time.monotonic() < give_up, f"batch {batch_id} produced too little: {batch}"
        await asyncio.sleep(0.2)


HELLOS = batch_file([(f"hi-{i}", [{"role": "user", "content": "Hello!"}], 8) for i in range(30)])


async def test_a_restarted_gateway_resumes_a_submission_where_it_stopped(
    gateway: Started,
) -> None:
    async with gateway(submit_rps=5) as first:
        client = sdk(first)
        upload = await client.files.create(file=("hellos.jsonl", HELLOS), purpose="batch")
        batch = await client.batches.create(
            input_file_id=upload.id, endpoint="/v1/chat/completions", completion_window="24h"
        )
        stopped = await wait_produced(client, batch.id, 3)
    assert stopped.status == "in_progress"
    produced = stopped.model_extra["laneway"]["produced"]  # type: ignore[index]
    assert produced < 30, "stopped half-way"
    async with gateway(submit_rps=50) as second:
        client = sdk(second)
        done = await wait_final(client, batch.id, timeout_s=180)
        assert done.status == "completed", done
        assert done.request_counts is not None and done.request_counts.completed == 30
        assert done.output_file_id
        output = await client.files.content(done.output_file_id)
        ids = [json.loads(line)["custom_id"] for line in output.text.splitlines()]
        assert ids == [f"hi-{i}" for i in range(30)], "each line once, in input order"


async def test_a_batch_cancelled_half_way_keeps_what_ran(gateway: Started) -> None:
    async with gateway(submit_rps=4) as server:
        client = sdk(server)
        upload = await client.files.create(file=("hellos.jsonl", HELLOS), purpose="batch")
        batch = await client.batches.create(
            input_file_id=upload.id, endpoint="/v1/chat/completions", completion_window="24h"
        )
        await wait_produced(client, batch.id, 4)
        await client.batches.cancel(batch.id)
        done = await wait_final(client, batch.id, timeout_s=120)
        assert done.status == "cancelled"
        give_up = time.monotonic() + 60
        while True:  # what was produced before the cancel still runs and is counted
            counts = done.request_counts
            assert counts is not None
            if counts.completed + counts.failed >= done.model_extra["laneway"]["produced"]:  # type: ignore[index]
                break
            assert time.monotonic() < give_up, f"produced requests never answered: {done}"
            await asyncio.sleep(0.5)
            done = await client.batches.retrieve(batch.id)
        assert counts is not None and counts.total == 30 and 4 <= counts.completed < 30
        assert done.output_file_id and done.error_file_id
        ran = (await client.files.content(done.output_file_id)).text.splitlines()
        never = (await client.files.content(done.error_file_id)).text.splitlines()
        assert len(ran) == counts.completed and len(ran) + len(never) == 30
        assert all(json.loads(e)["error"]["code"] == "batch_cancelled" for e in never)


async def test_a_batch_a_dead_replica_left_is_submitted_by_another(
    gateway: Started, settings: Settings
) -> None:
    """A batch accepted by a replica that died before submitting it (its
    record written, no lease held) is taken by the next replica's sweep."""
    data = batch_file([("left-1", [{"role": "user", "content": "Hello!"}], 8)])
    async with gateway() as server:
        client = sdk(server)
        upload = await client.files.create(file=("left.jsonl", data), purpose="batch")
        record = BatchRecord(
            id=f"batch_{uuid.uuid4().hex[:24]}",
            tenant="",
            input_file_id=upload.id,
            endpoint="/v1/chat/completions",
            completion_window="24h",
            window_s=86_400,
            created_at=int(time.time()),
            lines=1,
        )
        redis = settings.redis.client()
        try:
            await BatchStore(redis, settings.redis.key_prefix, retention_s=600).create(record)
        finally:
            await redis.aclose()
        done = await wait_final(client, record.id, timeout_s=120)
        assert done.status == "completed" and done.output_file_id


async def test_feedback_lands_on_the_feedback_topic(gateway: Started, settings: Settings) -> None:
    async with gateway() as server, aiohttp.ClientSession() as http:
        answer = await sdk(server).chat.completions.create(
            model="auto", messages=[{"role": "user", "content": "Hello!"}]
        )
        url = f"{server.base_url}/feedback"
        async with http.post(
            url, json={"id": answer.id, "thumbs": "down", "comment": "too short"}
        ) as response:
            assert response.status == 200, await response.text()
            said = await response.json()
        request_id = answer.id.removeprefix("chatcmpl-")
        assert said == {
            "object": "feedback",
            "schema_version": 1,
            "request_id": request_id,
            "score": -1.0,
            "comment": "too short",
        }
        async with http.post(url, json={"id": answer.id, "score": 3}) as refused:
            assert refused.status == 400
            assert (await refused.json())["error"]["param"] == "score"
    give_up = time.monotonic() + 30
    while True:
        found = [
            json.loads(r.value)
            for r in await read_topic(settings, settings.topic("feedback"))
            if r.key == request_id.encode()
        ]
        if found or time.monotonic() > give_up:
            break
        await asyncio.sleep(0.5)
    assert found == [
        {"schema_version": 1, "request_id": request_id, "score": -1.0, "comment": "too short"}
    ]


async def test_models_show_each_versions_live_roll_out_state(
    gateway: Started, settings: Settings
) -> None:
    async with gateway() as server:
        client = sdk(server)
        heavy = await client.models.retrieve("heavy")
        versions: list[dict[str, Any]] = heavy.model_extra["laneway"]["versions"]  # type: ignore[index]
        assert [v["state"] for v in versions].count("active") == 1
        active = next(v for v in versions if v["state"] == "active")
        assert active["traffic_share"] == 1.0 and active["name"]

    # A live override (what `laneway models ...` writes) shows at the next read.
    redis = settings.redis.client()
    store = RolloutStore(redis, settings.redis.key_prefix)
    try:
        field = field_name("heavy", active["version"])
        live = VersionRollout("active", None, at_ms=1234, by="cli")
        await redis.hset(store.key, field, live.to_json())
        async with gateway() as server:
            heavy = await sdk(server).models.retrieve("heavy")
            shown = heavy.model_extra["laneway"]["versions"]  # type: ignore[index]
            assert next(v for v in shown if v["version"] == active["version"])["since_ms"] == 1234
    finally:
        await redis.hdel(store.key, field)
        await redis.aclose()


async def test_two_gateways_share_one_limit_per_key(gateway: Started, tmp_path: Path) -> None:
    keys = tmp_path / "keys.json"
    key, _ = add_key(keys, f"shared-{uuid.uuid4().hex[:6]}", rpm=3, tpm=None)
    hello = [{"role": "user", "content": "Hello!"}]
    async with gateway(keys_file=keys) as one, gateway(keys_file=keys) as two:
        assert one.port != two.port
        first, second = sdk(one, key), sdk(two, key)
        assert (await first.chat.completions.create(model="auto", messages=hello)).choices
        assert (await second.chat.completions.create(model="auto", messages=hello)).choices
        assert (await first.chat.completions.create(model="auto", messages=hello)).choices
        for client in (second, first):
            with pytest.raises(openai.RateLimitError) as over:
                await client.chat.completions.create(model="auto", messages=hello)
            assert over.value.code == "INF-429" and "3/3 requests" in over.value.message
            assert 1 <= int(over.value.response.headers["retry-after"]) <= 60
