"""``laneway up``'s supervisor on real processes."""

from __future__ import annotations

import io

import pytest

from schemas.settings import Settings
from streams.tools.supervisor import Stack


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
