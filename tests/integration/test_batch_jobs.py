"""Offline batch jobs on the real stack: files submitted through the CLI and
the SDK, counted by the stack's ``batch-tracker`` child from
``laneway.results``. Prompts are mostly rule answers (the classifier answers
them at once) with a few for the bulk lane's model, so a 200-line file
finishes in seconds on two cores."""

from __future__ import annotations

import asyncio
import json
import os
import signal
import sys
import time
import uuid
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from schemas.jobs import BatchJob, BatchJobEvent, BatchJobStatus
from schemas.settings import Settings
from streams.client import LanewayClient
from streams.jobs.jsonl import request_id
from streams.jobs.progress import get_job
from streams.jobs.results import write_results
from streams.jobs.store import JobStore
from streams.jobs.submit import submit_file
from tests.integration.conftest import CHILD_ENV, read_topic

S = BatchJobStatus
RULE_PROMPTS = ["Hello!", "Thanks a lot!", "What are your opening hours?", "hi there"]
MODEL_PROMPT = "Name one colour."
LONG_PROMPT = "Write a long story about a dragon."
"""A model answer that 4 tokens cut short: its output line says ``length``."""


def line(custom_id: str, prompt: str, max_tokens: int = 4) -> dict[str, Any]:
    return {"custom_id": custom_id, "body": {"prompt": prompt, "max_tokens": max_tokens}}


def write_jsonl(path: Path, rows: list[Any]) -> Path:
    path.write_text(
        "".join((r if isinstance(r, str) else json.dumps(r)) + "\n" for r in rows), encoding="utf-8"
    )
    return path


def cli_env(settings: Settings, **extra: str) -> dict[str, str]:
    return {
        **os.environ,
        **CHILD_ENV,
        "LANEWAY_KAFKA_BOOTSTRAP": settings.kafka.bootstrap,
        "LANEWAY_REDIS_URL": settings.redis.url,
        "LANEWAY_LOG_LEVEL": "WARNING",
        **extra,
    }


@dataclass
class Ran:
    returncode: int
    stdout: str
    stderr: str


async def cli(settings: Settings, *args: str, **env: str) -> Ran:
    """``laneway *args`` against the stack, as a user would run it."""
    proc = await asyncio.create_subprocess_exec(
        sys.executable,
        "-m",
        "streams.cli.main",
        *args,
        env=cli_env(settings, **env),
        stdout=asyncio.subprocess.PIPE,
        stderr=asyncio.subprocess.PIPE,
    )
    out, err = await asyncio.wait_for(proc.communicate(), 120)
    assert proc.returncode is not None
    return Ran(proc.returncode, out.decode(), err.decode())


def fast(settings: Settings, **batch: Any) -> Settings:
    """Submit at 40/s (a fresh tenant's bucket holds 50/s)."""
    options = settings.batch.model_copy(update={"submit_rps": 40.0, **batch})
    return settings.model_copy(update={"batch": options})


async def until_final(settings: Settings, job_id: str, timeout_s: float = 90.0) -> BatchJob:
    give_up = time.monotonic() + timeout_s
    while True:
        job = await get_job(settings, job_id)
        assert job is not None
        if job.final:
            return job
        assert time.monotonic() < give_up, f"job still {job.status}: {job.counts}"
        await asyncio.sleep(0.3)


def read_jsonl(path: Path) -> list[dict[str, Any]]:
    return [json.loads(x) for x in path.read_text(encoding="utf-8").splitlines()]


async def test_a_200_line_file_completes_in_input_order_with_errors_by_line(
    settings: Settings, tmp_path: Path
) -> None:
    tenant = f"t{uuid.uuid4().hex[:8]}"
    rows: list[Any] = []
    bad_lines = {17: "{broken", 60: {"custom_id": "c-3"}, 121: line("c-5", "again"), 190: [1]}
    for n in range(1, 201):
        if n in bad_lines:
            rows.append(bad_lines[n])
            continue
        prompt = {50: MODEL_PROMPT, 150: LONG_PROMPT}.get(n, RULE_PROMPTS[n % len(RULE_PROMPTS)])
        rows.append(line(f"c-{n}", prompt))
    path = write_jsonl(tmp_path / "in.jsonl", rows)

    refused = await cli(settings, "batch", "submit", str(path), "--tenant", tenant)
    assert refused.returncode == 2, refused.stderr
    for n in bad_lines:
        assert f"in.jsonl:{n}: " in refused.stderr
    assert "nothing was submitted" in refused.stderr
    assert "c-5' repeats line 5" in refused.stderr

    started = time.monotonic()
    job = await submit_file(fast(settings), path.read_bytes(), tenant=tenant, skip_invalid=True)
    assert job.counts.total == 196 and job.counts.invalid == 4 and job.counts.produced == 196
    job = await until_final(settings, job.id)
    seconds = time.monotonic() - started
    assert job.status is S.COMPLETED, job
    assert (job.counts.done, job.counts.failed) == (196, 0)

    again = await cli(settings, "batch", "submit", str(path), "--tenant", tenant, "--skip-invalid")
    assert again.returncode == 0, again.stderr
    assert again.stdout.strip().splitlines()[-1] == job.id  # the same job, not a new one
    assert (await get_job(settings, job.id)) == job

    out = tmp_path / "out.jsonl"
    written = await cli(settings, "batch", "results", job.id, "-o", str(out))
    assert written.returncode == 0, written.stderr
    results = read_jsonl(out)
    expected = [f"c-{n}" for n in range(1, 201) if n not in bad_lines]
    assert [r["custom_id"] for r in results] == expected
    assert all(r["error"] is None and r["response"] is not None for r in results)
    # (a 4-token answer of the tiny heavy model can be blank; a rule's never is)
    assert all(r["response"]["output"] for r in results if r["custom_id"] not in ("c-50", "c-150"))
    models = {r["custom_id"]: r["response"]["model"] for r in results}
    reasons = {r["custom_id"]: r["response"]["finish_reason"] for r in results}
    assert reasons["c-4"] == "stop" and reasons["c-150"] == "length"
    assert models["c-4"].startswith("rules:")
    assert not models["c-50"].startswith("rules:")  # a model's answer (or its cache entry)
    errors = read_jsonl(tmp_path / "out.errors.jsonl")
    assert [e["line"] for e in errors] == sorted(bad_lines)
    assert all(e["error"]["code"] == "invalid_line" for e in errors)

    status = await cli(settings, "batch", "status", job.id, "--json")
    assert BatchJob.model_validate_json(status.stdout) == job
    listing = await cli(settings, "batch", "list")
    assert job.id in listing.stdout and "completed" in listing.stdout

    events = [
        BatchJobEvent.model_validate_json(r.value)
        for r in await read_topic(settings, settings.topic("batch.jobs"))
        if r.key == job.id.encode()
    ]
    moves = [(e.previous, e.job.status) for e in events]
    assert moves == [
        (None, S.VALIDATING),
        (S.VALIDATING, S.IN_PROGRESS),
        (S.IN_PROGRESS, S.FINALIZING),
        (S.FINALIZING, S.COMPLETED),
    ]
    print(f"200-line file: {seconds:.1f} s from submit to completed")


async def test_cancel_mid_run_stops_what_has_not_started(
    settings: Settings, tmp_path: Path
) -> None:
    tenant = f"t{uuid.uuid4().hex[:8]}"
    rows = [line(f"k-{n}", RULE_PROMPTS[n % 4]) for n in range(120)]
    data = write_jsonl(tmp_path / "in.jsonl", rows).read_bytes()
    slow = fast(settings, submit_rps=10.0)
    submitting = asyncio.create_task(submit_file(slow, data, tenant=tenant))
    redis = settings.redis.client()
    try:
        store = JobStore(redis, settings.redis.key_prefix)
        job_id = None
        give_up = time.monotonic() + 30
        while job_id is None or (await store.get(job_id)).counts.produced < 10:  # type: ignore[union-attr]
            assert time.monotonic() < give_up
            ids = [j.id for j in await store.list_jobs() if j.tenant == tenant]
            job_id = ids[0] if ids else None
            await asyncio.sleep(0.1)
    finally:
        await redis.aclose()
    cancelled = await cli(settings, "batch", "cancel", job_id)
    assert cancelled.returncode == 0, cancelled.stderr
    assert (
        cancelled.stdout.startswith(f"cancelled {job_id}: ")
        and "never produced" in cancelled.stdout
    )
    stopped = await asyncio.wait_for(submitting, 10)
    assert stopped.status is S.CANCELLED
    assert 10 <= stopped.counts.produced < 120
    assert (await cli(settings, "batch", "cancel", job_id)).returncode == 1  # nothing left
    await asyncio.sleep(3)  # what was produced runs, and is counted
    job = await get_job(settings, job_id)
    assert job is not None and job.status is S.CANCELLED
    assert job.counts.done + job.counts.failed == job.counts.produced
    summary = await write_results(settings, job_id, tmp_path / "out.jsonl")
    rows_out = read_jsonl(tmp_path / "out.jsonl")
    assert [r["custom_id"] for r in rows_out] == [f"k-{n}" for n in range(120)]
    assert summary.missing == 120 - job.counts.produced
    assert {r["error"]["code"] for r in rows_out if r["error"]} == {"batch_cancelled"}


async def test_a_killed_submitter_resumes_with_no_duplicate_result(
    settings: Settings, tmp_path: Path
) -> None:
    tenant = f"t{uuid.uuid4().hex[:8]}"
    rows = [line(f"r-{n}", RULE_PROMPTS[n % 4]) for n in range(80)]
    path = write_jsonl(tmp_path / "in.jsonl", rows)
    args = [sys.executable, "-m", "streams.cli.main", "batch", "submit", str(path)]
    args += ["--tenant", tenant]
    env = cli_env(settings, LANEWAY_BATCH_SUBMIT_RPS="10")
    proc = await asyncio.create_subprocess_exec(
        *args, env=env, stdout=asyncio.subprocess.DEVNULL, stderr=asyncio.subprocess.DEVNULL
    )
    redis = settings.redis.client()
    try:
        store = JobStore(redis, settings.redis.key_prefix)
        give_up = time.monotonic() + 60
        job = None
        while job is None or job.counts.produced < 20:
            assert time.monotonic() < give_up and proc.returncode is None
            ids = [j.id for j in await store.list_jobs() if j.tenant == tenant]
            job = await store.get(ids[0]) if ids else None
            await asyncio.sleep(0.05)
        proc.send_signal(signal.SIGKILL)
        await proc.wait()
        killed = await store.get(job.id)
        assert killed is not None and 20 <= killed.counts.produced < 80
        # As if killed between a chunk's acknowledgement and its count: the
        # restarted submitter produces those five requests again.
        await redis.hset(store.key(job.id), "produced", killed.counts.produced - 5)
        resumed = await cli(settings, "batch", "submit", str(path), "--tenant", tenant, "--wait")
        assert resumed.returncode == 0, resumed.stderr
        assert resumed.stdout.strip().splitlines()[-1] == job.id
        assert "ETA" in resumed.stderr and "done 80" in resumed.stderr  # the progress bar
        final = await until_final(settings, job.id)
        assert final.status is S.COMPLETED
        assert (final.counts.done, final.counts.failed, final.counts.produced) == (80, 0, 80)
        assert await redis.hlen(store.key(job.id, "results")) == 80
    finally:
        await redis.aclose()
    produced = [
        json.loads(r.value)["id"]
        for r in await read_topic(settings, settings.topic("requests"))
        if b'"batch_id":"' + job.id.encode() in r.value
    ]
    assert len(produced) > 80 and set(produced) == {request_id(job.id, f"r-{n}") for n in range(80)}
    await write_results(settings, job.id, tmp_path / "out.jsonl")
    out = [r["custom_id"] for r in read_jsonl(tmp_path / "out.jsonl")]
    assert out == [f"r-{n}" for n in range(80)]


async def test_an_openai_batch_file_runs_through_the_sdk(
    client: LanewayClient, settings: Settings, tmp_path: Path
) -> None:
    tenant = f"t{uuid.uuid4().hex[:8]}"
    rows = [
        {
            "custom_id": f"request-{n}",
            "method": "POST",
            "url": "/v1/chat/completions",
            "body": {
                "model": "gpt-4o-mini",
                "messages": [
                    {"role": "system", "content": "You are a helpful assistant."},
                    {"role": "user", "content": prompt},
                ],
                "max_tokens": 4,
            },
        }
        for n, prompt in enumerate([*RULE_PROMPTS, MODEL_PROMPT])
    ]
    job = await client.submit_batch(rows, settings=fast(settings), tenant=tenant)
    assert job.format == "openai" and job.counts.produced == 5
    final = await until_final(settings, job.id)
    assert final.status is S.COMPLETED and final.counts.done == 5
    assert await client.batch_status(job.id, settings=settings) == final
    await write_results(settings, job.id, tmp_path / "out.jsonl")
    out = read_jsonl(tmp_path / "out.jsonl")
    assert [r["custom_id"] for r in out] == [f"request-{n}" for n in range(5)]
    for row in out:
        assert row["error"] is None and row["response"]["status_code"] == 200
        assert row["response"]["body"]["choices"][0]["message"]["role"] == "assistant"


async def test_requests_any_producer_writes_with_a_batch_id_are_counted(
    client: LanewayClient, settings: Settings
) -> None:
    batch_id = f"native-{uuid.uuid4().hex[:8]}"
    futures = [
        await client.submit({"id": f"{batch_id}-{n}", "prompt": p, "batch_id": batch_id})
        for n, p in enumerate(RULE_PROMPTS)
    ]
    await asyncio.wait_for(asyncio.gather(*futures), 30)
    give_up = time.monotonic() + 20
    while True:
        job = await get_job(settings, batch_id)
        if job is not None and job.counts.done == 4 and job.counts.total == 4:
            break
        assert time.monotonic() < give_up, job
        await asyncio.sleep(0.2)
    assert job.source == "kafka" and job.status is S.IN_PROGRESS  # until its window ends


async def test_a_job_whose_window_passes_expires_keeping_what_finished(
    settings: Settings, tmp_path: Path
) -> None:
    tenant = f"t{uuid.uuid4().hex[:8]}"
    rows = [line(f"e-{n}", RULE_PROMPTS[n]) for n in range(3)]
    rows += [
        {
            "custom_id": f"e-{n}",
            "body": {
                "prompt": f"Write a long story about a kite, part {n}.",
                "max_tokens": 64,
                "metadata": {"cache": "bypass"},
            },
        }
        for n in range(3, 40)
    ]
    data = write_jsonl(tmp_path / "in.jsonl", rows).read_bytes()
    job = await submit_file(fast(settings, max_inflight=8), data, tenant=tenant, window_s=3)
    assert job.counts.produced < 40  # production stopped with the window
    final = await until_final(settings, job.id, timeout_s=60)
    assert final.status is S.EXPIRED
    assert final.counts.done >= 3  # the rule answers came at once
    await asyncio.sleep(2)  # what was still on the lane ends with INF-503
    await write_results(settings, job.id, tmp_path / "out.jsonl")
    out = read_jsonl(tmp_path / "out.jsonl")
    assert [r["custom_id"] for r in out] == [f"e-{n}" for n in range(40)]
    assert all(r["error"] is None for r in out[:3])
    codes = {r["error"]["code"] for r in out if r["error"]}
    assert "batch_expired" in codes and codes <= {"batch_expired", "INF-503"}


async def test_requests_shed_with_inf_429_are_sent_again_and_complete(
    settings: Settings, tmp_path: Path
) -> None:
    """Tenant ``tiny`` may send 2 at once, then one per 10 s (CHILD_ENV); a
    submitter that does not know it sends 4 at once: 2 or more get INF-429,
    and the tracker sends them again when their retry_after_ms has passed."""
    tag = uuid.uuid4().hex[:6]
    rows = [line(f"s-{n}", f"{RULE_PROMPTS[n]} ({tag})") for n in range(4)]
    data = write_jsonl(tmp_path / "in.jsonl", rows).read_bytes()
    unaware = fast(settings).model_copy(
        update={"ratelimit": settings.ratelimit.model_copy(update={"enabled": False})}
    )
    job = await submit_file(unaware, data, tenant="tiny")
    final = await until_final(settings, job.id, timeout_s=100)
    assert final.status is S.COMPLETED
    assert (final.counts.done, final.counts.failed) == (4, 0)
    await write_results(settings, job.id, tmp_path / "out.jsonl")
    assert [r["error"] for r in read_jsonl(tmp_path / "out.jsonl")] == [None] * 4
