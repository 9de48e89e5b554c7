"""What a lane worker reports to the backlog board."""

from __future__ import annotations

from schemas.messages import Lane
from workers.positions import reported_backlog


def test_realtime_counts_the_batch_it_runs_and_the_others_only_their_queue() -> None:
    assert reported_backlog(Lane.REALTIME, waiting=5, running=4) == 9
    assert reported_backlog(Lane.MEDIUM, waiting=5, running=16) == 5
    assert reported_backlog(Lane.BULK, waiting=0, running=64) == 0
