"""The CLI finds its stack (issue 30): through the current-stack file a
command reaches the stack's Kafka and Redis with nothing but (at most) the
bootstrap exported, `laneway status` says what it reached, and a command
pointed at a Redis where nothing of the stack is alive fails fast instead
of waiting the job's whole window."""

from __future__ import annotations

import json
import os
import subprocess
import sys
import time
from collections.abc import Iterator
from pathlib import Path

import pytest
import redis

from streams.devstack.embedded import EmbeddedRedis, free_port
from streams.devstack.stackfile import write_stack_file
from streams.devstack.supervisor import Stack
from tests.integration.conftest import CHILD_ENV

RULE_PROMPTS = ["Hello!", "Thanks a lot!", "What are your opening hours?", "hi there"]


@pytest.fixture(scope="module")
def other_redis() -> Iterator[EmbeddedRedis]:
    """Another Redis on this machine, where nothing of the stack runs (never
    the machine's own on 6379)."""
    valkey = EmbeddedRedis(free_port())
    valkey.start()
    try:
        yield valkey
    finally:
        valkey.stop()


def laneway(*argv: str, timeout_s: float = 120, **env: str) -> subprocess.CompletedProcess[str]:
    """``laneway argv`` with no LANEWAY_* variable but the stack's test
    tuning (``CHILD_ENV``) and ``env``."""
    clean = {k: v for k, v in os.environ.items() if not k.startswith("LANEWAY_")}
    return subprocess.run(
        [sys.executable, "-m", "streams.cli.main", *argv],
        capture_output=True,
        text=True,
        env={**clean, **CHILD_ENV, "LANEWAY_LOG_LEVEL": "WARNING", **env},
        timeout=timeout_s,
    )


def jobs_file(tmp_path: Path, n: int) -> Path:
    rows = [
        {"custom_id": f"r-{i}", "body": {"prompt": RULE_PROMPTS[i % 4], "max_tokens": 4}}
        for i in range(n)
    ]
    path = tmp_path / "in.jsonl"
    path.write_text("".join(json.dumps(r) + "\n" for r in rows))
    return path


def test_submit_wait_on_a_redis_with_no_tracker_fails_fast_and_writes_nothing(
    stack: Stack, other_redis: EmbeddedRedis, tmp_path: Path
) -> None:
    """The issue's scenario: the stack has its own Valkey; the command is
    pointed at another Redis (there the default one on 6379)."""
    started = time.monotonic()
    done = laneway(
        "batch",
        "submit",
        str(jobs_file(tmp_path, 4)),
        "--wait",
        LANEWAY_KAFKA_BOOTSTRAP=stack.settings.kafka.bootstrap,
        LANEWAY_REDIS_URL=other_redis.url,
        LANEWAY_STACK_FILE=str(tmp_path / "no-stack.json"),
    )
    assert done.returncode == 3, done.stderr
    assert time.monotonic() - started < 60
    assert "no batch tracker is alive on the Redis at" in done.stderr
    assert redis.Redis.from_url(other_redis.url).dbsize() == 0, "no job was written there"


def test_submit_without_wait_where_no_tracker_counts_is_submitted_with_a_warning(
    stack: Stack, other_redis: EmbeddedRedis, tmp_path: Path
) -> None:
    done = laneway(
        "batch",
        "submit",
        str(jobs_file(tmp_path, 2)),
        LANEWAY_KAFKA_BOOTSTRAP=stack.settings.kafka.bootstrap,
        LANEWAY_REDIS_URL=other_redis.url,
        LANEWAY_STACK_FILE=str(tmp_path / "no-stack.json"),
    )
    assert done.returncode == 0, done.stderr
    assert "warning: no batch tracker is alive on the Redis at" in done.stderr
    assert "a tracker started later counts it" in done.stderr
    assert done.stdout.strip().startswith("batch_"), done.stdout
    assert redis.Redis.from_url(other_redis.url).dbsize() > 0, "the job was written"


def test_ask_on_a_redis_with_no_worker_fails_fast(
    stack: Stack, other_redis: EmbeddedRedis, tmp_path: Path
) -> None:
    done = laneway(
        "ask",
        "What is the capital of France?",
        LANEWAY_KAFKA_BOOTSTRAP=stack.settings.kafka.bootstrap,
        LANEWAY_REDIS_URL=other_redis.url,
        LANEWAY_STACK_FILE=str(tmp_path / "no-stack.json"),
    )
    assert done.returncode == 3 and "no lane worker is alive" in done.stderr, done.stderr


def test_status_and_a_waited_job_find_the_stack_through_its_file(
    stack: Stack, other_redis: EmbeddedRedis, tmp_path: Path
) -> None:
    stack_file = tmp_path / "stack.json"
    write_stack_file(stack_file, stack.record())  # what `laneway up` does once ready
    status = laneway("status", "--json", LANEWAY_STACK_FILE=str(stack_file))
    report = json.loads(status.stdout)
    assert status.returncode == 0, status.stdout + status.stderr
    assert report["stack_found"] and report["stack_file"] == str(stack_file)
    parts = {p["name"]: p for p in report["parts"]}
    assert parts["kafka"]["address"] == stack.settings.kafka.bootstrap
    assert all(p["up"] for p in parts.values())
    assert parts["tracker"]["detail"] == "alive"
    assert report["workers"]["realtime"] >= 1 and report["workers"]["bulk"] >= 1

    # Only the bootstrap exported, as the user did: Redis comes from the file.
    done = laneway(
        "batch",
        "submit",
        str(jobs_file(tmp_path, 8)),
        "--wait",
        timeout_s=300,
        LANEWAY_KAFKA_BOOTSTRAP=stack.settings.kafka.bootstrap,
        LANEWAY_STACK_FILE=str(stack_file),
    )
    assert done.returncode == 0, done.stderr
    lines = done.stderr.strip().splitlines()
    assert lines and "8/8 done 8" in lines[-1] and "completed" in lines[-1], lines[-3:]
    assert "\r" not in done.stderr and "\x1b" not in done.stderr, "plain lines in a pipe"

    # A file whose supervisor is gone is ignored, with a note; the Redis
    # below it (the other one) has no tracker, so the wait is refused.
    write_stack_file(stack_file, stack.record().model_copy(update={"pid": 2**22 + 1}))
    stale = laneway(
        "batch",
        "submit",
        str(jobs_file(tmp_path, 2)),
        "--wait",
        LANEWAY_KAFKA_BOOTSTRAP=stack.settings.kafka.bootstrap,
        LANEWAY_REDIS_URL=other_redis.url,
        LANEWAY_STACK_FILE=str(stack_file),
    )
    assert stale.returncode == 3 and "is stale" in stale.stderr, stale.stderr


def test_up_records_its_stack_while_it_runs_and_removes_it_on_stop(tmp_path: Path) -> None:
    """``recorded`` is what ``laneway up`` and ``laneway demo`` run the stack
    in (here a stack of the broker and Valkey alone: no children)."""
    from schemas.settings import Settings
    from streams.devstack.stackfile import find_stack
    from streams.devstack.supervisor import recorded

    stack_file = tmp_path / "stack.json"
    bare = Stack(Settings(), http_port_base=None, lanes=(), workers_only=True)
    with recorded(bare, stack_file) as path:
        assert path == stack_file
        found = find_stack(stack_file).stack
        assert found is not None and found.pid == os.getpid()
        assert found.kafka_bootstrap == bare.settings.kafka.bootstrap
        assert found.redis_url == bare.settings.redis.url and found.gateway_url is None
        # A demo started beside it leaves the file to it.
        beside = Stack(Settings(), http_port_base=None, lanes=(), workers_only=True)
        with recorded(beside, stack_file, replace=False):
            assert find_stack(stack_file).stack == found
        assert find_stack(stack_file).stack == found, "the demo did not remove up's record"
    assert not stack_file.exists()
