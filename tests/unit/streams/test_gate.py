"""The realtime gate: the lane's count between the workers' reports, and
each worker judged by its own queue where its card says its partitions."""

from __future__ import annotations

from schemas.messages import AnswerPath, Lane
from schemas.settings import FlowSettings
from streams.classify.flow import LaneFull
from streams.classify.gate import RealtimeGate, RealtimeWorker, realtime_workers
from streams.stores.workerboard import PathCard, WorkerCard


def test_the_realtime_gate_judges_by_the_capacity_the_board_last_gave() -> None:
    now = [10_000]
    flow = FlowSettings(realtime_max_wait_ms=None, realtime_max_batches=1.0)
    gate = RealtimeGate(flow, clock_ms=lambda: now[0])
    gate.reported(2, 4.0, at_ms=10_000)
    gate.sent(2)
    assert gate.full() is None  # no card read yet: the count mark (16) alone
    gate.serving(4)
    assert gate.full() == LaneFull(Lane.REALTIME, 4, 1_000)
    now[0] = 10_250  # a record drained meanwhile, at 4 a second
    assert gate.full() is None
    gate.serving(None)  # the board cannot say: back to the other marks
    gate.sent(5)
    assert gate.waiting() == 8 and gate.full() is None


def test_the_realtime_gate_carries_the_count_between_reports() -> None:
    now = [10_000]
    gate = RealtimeGate(FlowSettings(realtime_max_wait_ms=2_000), clock_ms=lambda: now[0])
    gate.reported(3, 2.0, at_ms=10_000)
    assert gate.waiting() == 3 and gate.full() is None  # 1.5 s
    gate.sent(2)  # routed there since: 2.5 s
    assert gate.waiting() == 5 and gate.full() is not None
    now[0] = 11_000  # a second at 2 a second
    assert gate.waiting() == 3 and gate.full() is None
    gate.reported(10, 2.0, at_ms=9_500)  # an older report: the sends after it still count
    assert gate.waiting() == 10 + 2 - 3 and gate.full() is not None
    gate.reported(0, 2.0, at_ms=11_000)  # written after the sends: it counts them
    assert gate.waiting() == 0 and gate.full() is None
    gate.reported(40, None, at_ms=11_000)  # no rate: nothing drains, the count mark judges
    assert gate.waiting() == 40 and gate.full() is not None
    now[0] = 41_001  # no report for 30 s (Redis down, flow control off): fail open
    assert gate.full() is None


def test_a_gate_that_never_had_a_report_says_nothing_is_full() -> None:
    now = [0]
    gate = RealtimeGate(FlowSettings(), clock_ms=lambda: now[0])
    for _ in range(100):  # flow control off: sends, no reports
        now[0] += 1_000
        gate.sent(5)
    assert gate.full() is None and gate.waiting() <= 5 * 31  # what is older is forgotten


LIGHT = frozenset({AnswerPath.LIGHT})


def _two_workers(now: list[int]) -> RealtimeGate:
    """Worker "a" holds partitions 0 and 1, "b" partition 2 and 3; both run 4 at once."""
    flow = FlowSettings(
        realtime_max_backlog=None,
        realtime_max_wait_ms=None,
        realtime_max_batches=2.0,
        realtime_spill_batches=None,
    )
    gate = RealtimeGate(flow, clock_ms=lambda: now[0])
    gate.serving(8)
    gate.workers({"a": RealtimeWorker(4, (0, 1), LIGHT), "b": RealtimeWorker(4, (2, 3), LIGHT)})
    return gate


def test_a_request_goes_to_the_worker_with_room_and_the_lane_is_full_when_it_is() -> None:
    now = [10_000]
    gate = _two_workers(now)
    gate.reported(7, None, at_ms=10_000)  # the lane's sum: 7 of 16 slots
    gate.worker_reported("a", 7, None, at_ms=10_000)  # one short of its batch mark (8)
    gate.worker_reported("b", 0, None, at_ms=10_000)
    assert gate.full() is None
    sent = [gate.sent(path=AnswerPath.LIGHT) for _ in range(7)]
    assert set(sent) == {2, 3}, "b's partitions, in turn, until b waits as long as a"
    assert gate.full() is None and gate.waiting() == 14
    gate.sent(path=AnswerPath.LIGHT)
    gate.sent(path=AnswerPath.LIGHT)  # one each: both at their batch mark (8)
    assert gate.full() == LaneFull(Lane.REALTIME, 8, 1_000)


def test_summed_over_the_lane_one_idle_worker_would_hide_anothers_queue() -> None:
    """Lane-wide, a's 9 waiting plus b's 0 is under the lane's batch mark (16);
    alone, a is past its own (8). The request goes to b, and nothing is full."""
    now = [10_000]
    gate = _two_workers(now)
    gate.reported(9, None, at_ms=10_000)
    gate.worker_reported("a", 9, None, at_ms=10_000)
    gate.worker_reported("b", 0, None, at_ms=10_000)
    assert gate.full() is None and gate.sent(path=AnswerPath.LIGHT) in (2, 3)
    gate.worker_reported("b", 9, None, at_ms=10_000)  # both past their own marks
    assert gate.full() == LaneFull(Lane.REALTIME, 9, 1_000)


def _light_and_heavy(light_waiting: int) -> RealtimeGate:
    """Worker "a" serves light (partitions 0 and 1) and has ``light_waiting``;
    "b" serves heavy (2 and 3) and is idle; both run 4 at once."""
    gate = _two_workers([10_000])
    gate.workers(
        {
            "a": RealtimeWorker(4, (0, 1), LIGHT),
            "b": RealtimeWorker(4, (2, 3), frozenset({AnswerPath.HEAVY})),
        }
    )
    gate.reported(light_waiting, None, at_ms=10_000)
    gate.worker_reported("a", light_waiting, None, at_ms=10_000)
    gate.worker_reported("b", 0, None, at_ms=10_000)
    return gate


def test_only_a_worker_serving_the_path_is_chosen() -> None:
    gate = _light_and_heavy(3)
    assert gate.sent(path=AnswerPath.LIGHT) in (0, 1)
    assert gate.sent(path=AnswerPath.HEAVY) in (2, 3)
    assert gate.sent(path=AnswerPath("other")) is None, (
        "no worker judged alone serves it: its key's"
    )


def test_the_lane_is_full_for_a_path_when_the_workers_serving_it_are() -> None:
    """The light worker at its batch mark (8), the heavy one idle: full for
    light, not for heavy, and not for a request of any path."""
    gate = _light_and_heavy(8)
    assert gate.full(AnswerPath.LIGHT) == LaneFull(Lane.REALTIME, 8, 1_000)
    assert gate.full(AnswerPath.HEAVY) is None
    assert gate.full() is None


def test_the_count_mark_stays_the_lanes() -> None:
    now = [10_000]
    flow = FlowSettings(realtime_max_backlog=10, realtime_max_wait_ms=None)
    gate = RealtimeGate(flow, clock_ms=lambda: now[0])
    gate.workers({"a": RealtimeWorker(8, (0,), LIGHT), "b": RealtimeWorker(8, (1,), LIGHT)})
    gate.reported(10, None, at_ms=10_000)
    gate.worker_reported("a", 5, None, at_ms=10_000)
    gate.worker_reported("b", 5, None, at_ms=10_000)
    assert gate.full() == LaneFull(Lane.REALTIME, 10, 1_000)


def test_without_a_fresh_report_of_its_own_a_worker_is_not_judged_alone() -> None:
    now = [10_000]
    gate = _two_workers(now)
    gate.reported(0, None, at_ms=10_000)
    assert gate.sent(path=AnswerPath.LIGHT) is None, "no worker reported yet: the key's partition"
    gate.worker_reported("a", 0, None, at_ms=10_000)
    assert gate.sent(path=AnswerPath.LIGHT) in (0, 1)
    gate.workers({"b": RealtimeWorker(4, (2, 3), LIGHT)})  # a's card is gone: it is forgotten
    gate.worker_reported("a", 0, None, at_ms=10_000)
    assert gate.sent(path=AnswerPath.LIGHT) is None
    gate.workers(None)  # the board cannot say
    assert gate.sent(path=AnswerPath.LIGHT) is None


def test_realtime_workers_are_those_that_serve_a_model_and_say_their_partitions() -> None:
    light = PathCard(AnswerPath.LIGHT, "llamacpp", "m", "cpu")
    cards = [
        WorkerCard("a", Lane.REALTIME, (light,), 8, 1, (0, 1)),
        WorkerCard("old", Lane.REALTIME, (light,), 8, 1),  # an older worker's card
        WorkerCard("idle", Lane.REALTIME, (), 8, 1, (2,)),  # its model is not loaded
        WorkerCard("m", Lane.MEDIUM, (light,), 8, 1, (3,)),
    ]
    assert realtime_workers(cards) == {"a": RealtimeWorker(8, (0, 1), LIGHT)}
