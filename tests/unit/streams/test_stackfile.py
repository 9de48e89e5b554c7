"""The current-stack file: written by `laneway up`, read by every other
command below the environment, ignored when its supervisor is gone."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

from schemas.settings import Settings
from streams.cli.main import load_settings
from streams.devstack.stackfile import (
    CurrentStack,
    apply_stack,
    find_stack,
    remove_stack_file,
    stack_file_path,
    write_stack_file,
)


def record(pid: int | None = None, **fields: object) -> CurrentStack:
    values: dict[str, object] = {
        "kafka_bootstrap": "127.0.0.1:39092",
        "redis_url": "redis://:s3cret@127.0.0.1:36379/0",
        "metrics": {"classifier": 41000, "worker-realtime": 41001},
        "gateway_url": "http://127.0.0.1:48080/v1",
        "pid": os.getpid() if pid is None else pid,
        "started_at": 1_800_000_000.0,
        **fields,
    }
    return CurrentStack.model_validate(values)


def dead_pid() -> int:
    """The id of a process that has exited (and been reaped)."""
    done = subprocess.run(
        [sys.executable, "-c", "import os; print(os.getpid())"],
        check=True,
        capture_output=True,
        text=True,
    )
    return int(done.stdout)


def test_the_file_is_where_the_environment_says_else_in_the_users_cache() -> None:
    assert stack_file_path({"LANEWAY_STACK_FILE": "/tmp/x/stack.json"}) == Path("/tmp/x/stack.json")
    assert stack_file_path({}) == Path.home() / ".cache" / "laneway" / "stack.json"


def test_a_written_stack_is_read_back_and_only_its_owner_may_read_it(tmp_path: Path) -> None:
    path = tmp_path / "deep" / "stack.json"
    write_stack_file(path, record())
    assert path.stat().st_mode & 0o777 == 0o600, "the Redis URL may hold a password"
    assert json.loads(path.read_text())["schema"] == "laneway.stack/1"
    found = find_stack(path)
    assert found.stack == record() and found.note is None
    assert found.stack.metrics_urls() == [
        "http://127.0.0.1:41000/metrics",
        "http://127.0.0.1:41001/metrics",
    ]


def test_no_file_is_no_stack_and_no_note(tmp_path: Path) -> None:
    found = find_stack(tmp_path / "stack.json")
    assert found.stack is None and found.note is None


def test_a_stale_file_is_ignored_with_a_one_line_note(tmp_path: Path) -> None:
    path = tmp_path / "stack.json"
    gone = dead_pid()
    write_stack_file(path, record(pid=gone))
    found = find_stack(path)
    assert found.stack is None
    assert found.note is not None and "stale" in found.note and str(gone) in found.note
    assert "\n" not in found.note


def test_a_file_that_is_not_a_stack_is_ignored_with_a_note(tmp_path: Path) -> None:
    path = tmp_path / "stack.json"
    path.write_text('{"kafka": 1}')
    found = find_stack(path)
    assert found.stack is None and found.note is not None and "not a laneway stack" in found.note


def test_the_stack_fills_what_the_environment_left_unset(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    stack = record(topic_prefix="t1", redis_key_prefix="k1")
    applied = apply_stack(Settings(), stack)
    assert applied.kafka.bootstrap == stack.kafka_bootstrap
    assert applied.redis.url == stack.redis_url
    assert (applied.kafka.topic_prefix, applied.redis.key_prefix) == ("t1", "k1")
    # The case: only the bootstrap is exported; Redis still comes from the stack.
    monkeypatch.setenv("LANEWAY_KAFKA_BOOTSTRAP", "10.0.0.9:9092")
    only_kafka = apply_stack(Settings(), stack)
    assert only_kafka.kafka.bootstrap == "10.0.0.9:9092", "the environment wins"
    assert only_kafka.redis.url == stack.redis_url
    monkeypatch.setenv("LANEWAY_REDIS_URL", "redis://10.0.0.9:6379/0")
    assert apply_stack(Settings(), stack).redis.url == "redis://10.0.0.9:6379/0"
    assert apply_stack(Settings(), None) == Settings()


def test_a_stack_on_a_redis_cluster_tells_the_commands_so(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    assert not apply_stack(Settings(), record()).redis.cluster, "an old file: one Redis"
    stack = record(redis_cluster=True)
    assert apply_stack(Settings(), stack).redis.cluster
    monkeypatch.setenv("LANEWAY_REDIS_CLUSTER", "false")
    assert not apply_stack(Settings(), stack).redis.cluster, "the environment wins"


def test_a_command_builds_its_settings_from_the_file_env_and_flags(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    import argparse

    path = tmp_path / "stack.json"
    monkeypatch.setenv("LANEWAY_STACK_FILE", str(path))
    write_stack_file(path, record())
    args = load_settings(argparse.Namespace(bootstrap=None))
    assert args.settings.redis.url == record().redis_url and args.current_stack == record()
    flagged = load_settings(argparse.Namespace(bootstrap="10.1.1.1:9092"))
    assert flagged.settings.kafka.bootstrap == "10.1.1.1:9092", "a flag wins over the file"
    own = load_settings(argparse.Namespace(bootstrap=None), uses_stack=False)
    assert own.settings == Settings() and own.current_stack is None, "up starts its own"
    write_stack_file(path, record(pid=dead_pid()))
    stale = load_settings(argparse.Namespace(bootstrap=None))
    assert stale.settings == Settings() and stale.current_stack is None
    assert "stale" in capsys.readouterr().err


def test_a_stack_removes_its_own_file_never_a_newer_stacks(tmp_path: Path) -> None:
    path = tmp_path / "stack.json"
    write_stack_file(path, record(pid=os.getpid() + 1))
    assert not remove_stack_file(path, os.getpid()) and path.exists()
    write_stack_file(path, record())
    assert remove_stack_file(path, os.getpid()) and not path.exists()
    assert not remove_stack_file(path, os.getpid()), "nothing left to remove"
