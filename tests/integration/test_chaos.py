"""A short chaos run (``laneway bench chaos``): two classifiers, two routers,
two batch trackers and two medium workers over 8 partitions and a Valkey
Cluster, with traffic flowing while a medium worker is SIGKILLed, a router
is SIGKILLed, a Redis primary is killed and a worker is stopped past its
session timeout. Nothing is lost, the duplicates are what CONTRACT.md
allows (the same result, the same id), and only the killed processes were
restarted.

The full run, every kind of process in turn, is the benchmark
(docs/delivery.md, "Under faults")."""

from __future__ import annotations

from pathlib import Path

import pytest

from schemas.messages import Lane
from schemas.settings import Settings
from streams.bench.chaos import Plan, report, run_chaos

pytestmark = [pytest.mark.slow, pytest.mark.timeout(600)]

FAULTS = ("worker-medium", "router", "redis-primary", "worker-stop")
LANES = (Lane.REALTIME, Lane.MEDIUM, Lane.MEDIUM, Lane.BULK)
"""Two workers where the faults are (medium), one on the other lanes: each
worker loads its models while the rest start, on two shared cores."""
SMALL = {
    # One small model on both paths, and the exact cache only (no MiniLM to
    # load in every classifier and worker): the run is about delivery.
    "LANEWAY_BACKEND_HEAVY_MODEL": "smollm2-135m",
    "LANEWAY_CACHE_SEMANTIC": "false",
}


def test_replicas_under_faults_lose_nothing(tmp_path: Path) -> None:
    plan = Plan(
        FAULTS,
        rate=3.0,
        max_tokens=4,
        before_s=5.0,
        window_s=5.0,
        stop_s=12.0,
        restart_timeout_s=180.0,
        drain_timeout_s=120.0,
    )
    chaos = run_chaos(
        Settings(),
        plan,
        log_path=tmp_path / "chaos.log",
        lanes=LANES,
        env=SMALL,
        start_timeout_s=400.0,
    )
    print("\n" + report(chaos) + f"\nlog: {tmp_path / 'chaos.log'}")
    counted = chaos.tally
    assert [w.name for w in chaos.windows] == list(FAULTS)
    assert counted.sent > 0 and counted.lost == 0, f"lost {counted.lost} of {counted.sent}"
    assert counted.unknown == 0, "replies to requests never sent"
    assert counted.conflicting == 0, "copies of one id's result that disagree"
    assert counted.within_contract
    # The killed processes came back (the supervisor restarted them), and
    # nothing else fell over: the router replica that takes over the killed
    # one's partitions once crashed in faust's table recovery.
    assert chaos.restarts == {"worker-medium": 1, "router": 1}
    # Every kind of request went through, and most are answers, not errors.
    kinds = {s.kind for s in chaos.sent.values()}
    assert kinds == {"rule", "cache", "model"}
    assert sum(counted.errors.values()) <= counted.sent // 4, counted.errors
