"""``laneway up``'s supervisor on real processes."""

from __future__ import annotations

import io
from pathlib import Path

import pytest

from schemas.settings import Settings
from streams.devstack.supervisor import Stack


def test_a_stack_that_cannot_start_leaves_nothing_running() -> None:
    out = io.StringIO()
    # Every child refuses this setting (partitions must be >= 1) and exits.
    stack = Stack(
        Settings(), http_port_base=None, out=out, child_env={"LANEWAY_KAFKA_PARTITIONS": "0"}
    )
    with pytest.raises(RuntimeError, match="exited with 1 while starting"):
        stack.start(ready_timeout_s=60)
    assert not any(child.alive() for child in stack.children)
    assert stack.broker._proc is None  # stopped and reaped
    assert "greater than or equal to 1" in out.getvalue()  # the child said why


def test_a_failed_start_shows_why_on_a_quiet_console(tmp_path: Path) -> None:
    out = io.StringIO()
    log_path = tmp_path / "up.log"
    stack = Stack(
        Settings(),
        http_port_base=None,
        out=out,
        log_path=log_path,
        child_env={"LANEWAY_KAFKA_PARTITIONS": "0"},
    )
    with pytest.raises(RuntimeError, match="exited with 1 while starting") as failed:
        stack.start(ready_timeout_s=60)
    console = out.getvalue()
    assert "failed to start" in console
    assert "greater than or equal to 1" in console  # the end of the child's output
    assert f"full logs: {log_path}" in console
    # Whichever child died first (the others may be stopped before they print
    # anything), every line it wrote is in the file under its name.
    dead = str(failed.value).split(" exited with", 1)[0]
    assert f"[{dead}] " in log_path.read_text()


def test_the_console_of_a_started_stack_is_a_few_status_lines(stack: Stack) -> None:
    console = stack.out.getvalue()  # type: ignore[attr-defined]
    start = console.split("ready in", 1)[0].splitlines()
    assert len(start) <= 20, console
    assert "\x1b" not in console  # no escape codes: no spinners, no colours
    for child in stack.children:
        assert f"{child.name} ready (" in console
    assert stack.log_path is not None
    log = stack.log_path.read_text()
    assert "[worker-medium]" in log  # the children's own output went to the file
    assert len(log.splitlines()) > 5 * len(start)
