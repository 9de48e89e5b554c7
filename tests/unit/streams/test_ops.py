"""``/healthz`` tells a wedged event loop from a live one."""

from __future__ import annotations

import asyncio
import threading
import time
import urllib.error
import urllib.request

from streams.ops import OpsServer, ProcessState, heartbeat


def get(port: int, path: str) -> tuple[int, str]:
    try:
        with urllib.request.urlopen(f"http://127.0.0.1:{port}{path}", timeout=2) as response:
            return response.status, response.read().decode()
    except urllib.error.HTTPError as exc:
        return exc.code, exc.read().decode()


def test_health_follows_the_last_beat() -> None:
    now = [100.0]
    state = ProcessState(stall_s=5.0, clock=lambda: now[0])
    assert state.health() == (True, "ok")  # starting: no beat yet
    state.beat()
    now[0] += 4.9
    assert state.health() == (True, "ok")
    now[0] += 0.2
    alive, why = state.health()
    assert not alive and "no heartbeat for 5s" in why
    state.beat()
    assert state.health() == (True, "ok")
    state.alive = False
    assert state.health() == (False, "dead")


async def test_healthz_fails_while_the_loop_is_wedged_and_recovers() -> None:
    state = ProcessState(stall_s=0.3)
    ops = OpsServer("127.0.0.1", 0, state).start()
    beats = asyncio.create_task(heartbeat(state, interval_s=0.05))
    try:
        await asyncio.sleep(0.1)
        assert await asyncio.to_thread(get, ops.port, "/healthz") == (200, "ok\n")
        seen: list[tuple[int, str]] = []
        probe = threading.Thread(
            target=lambda: (time.sleep(0.6), seen.append(get(ops.port, "/healthz")))
        )
        probe.start()
        time.sleep(1.0)  # the loop is wedged: no await, no beat  # noqa: ASYNC251
        probe.join()
        assert seen[0][0] == 503 and "event loop stalled" in seen[0][1]
        await asyncio.sleep(0.1)  # the loop runs again, and beats
        assert await asyncio.to_thread(get, ops.port, "/healthz") == (200, "ok\n")
    finally:
        beats.cancel()
        ops.close()
