import json
from dataclasses import replace

import pytest
from prometheus_client import REGISTRY

from schemas.messages import AnswerPath, InferenceRequest, InferenceResult, Lane, RoutedRequest
from schemas.settings import FlowSettings, RoutingSettings, Settings
from streams.classify.classifier import SourceRecord, classify_record
from streams.classify.flow import (
    FlowController,
    LaneFull,
    Shed,
    apply_level,
    realtime_full,
    spills,
)
from streams.classify.policy import Decision
from streams.routing.features import Complexity
from streams.rules.engine import RuleBook
from streams.stores.backlog import DrainRate
from streams.stores.workerboard import Serving


def controller() -> FlowController:
    return FlowController(enter=(10, 20, 40), exit=(5, 10, 20), hold_s=3)


def test_levels_rise_at_once_with_pressure() -> None:
    flow = controller()
    assert flow.update(9, 0) == 0
    assert flow.update(10, 1) == 1
    assert flow.update(45, 2) == 3


def test_levels_fall_one_step_per_calm_hold() -> None:
    flow = controller()
    flow.update(45, 0)
    assert flow.update(19, 1) == 3  # below exit[2]=20, but not for hold_s yet
    assert flow.update(19, 3) == 3
    assert flow.update(19, 4) == 2  # calm for 3 s: one step down
    assert flow.update(19, 5) == 2  # 19 is not below exit[1]=10
    assert flow.update(4, 6) == 2
    assert flow.update(4, 9) == 1
    assert flow.update(4, 12) == 0


def test_no_flapping_between_the_marks() -> None:
    flow = controller()
    flow.update(10, 0)
    for t in range(1, 20):
        assert flow.update(7 if t % 2 else 9, t) == 1  # between exit 5 and enter 10


def test_a_spike_during_the_hold_restarts_it() -> None:
    flow = controller()
    flow.update(10, 0)
    flow.update(1, 1)
    flow.update(8, 2)  # not calm
    assert flow.update(1, 3) == 1
    assert flow.update(1, 5) == 1
    assert flow.update(1, 6) == 0


def test_marks_are_checked() -> None:
    with pytest.raises(ValueError, match="exit mark must be below"):
        FlowController(enter=(10, 20), exit=(10, 5), hold_s=1)


def req(prompt: str) -> InferenceRequest:
    return InferenceRequest(id="r", prompt=prompt)


def test_level_one_moves_medium_work_to_light_but_not_complex_work() -> None:
    plain = Decision(Lane.MEDIUM, AnswerPath.HEAVY, Complexity.MODERATE)
    moved = apply_level(plain, 1, 100)
    assert isinstance(moved, Decision)
    assert moved.path is AnswerPath.LIGHT and moved.requested_path is AnswerPath.HEAVY
    hard = Decision(Lane.MEDIUM, AnswerPath.HEAVY, Complexity.COMPLEX)
    assert apply_level(hard, 1, 100) == hard


def test_level_two_sheds_bulk_and_level_three_keeps_realtime_light() -> None:
    shed = apply_level(Decision(Lane.BULK, AnswerPath.LIGHT), 2, 1234)
    assert shed == Shed("bulk intake paused (load level 2)", 1234)
    realtime_hard = Decision(Lane.REALTIME, AnswerPath.HEAVY, Complexity.COMPLEX)
    assert apply_level(realtime_hard, 2, 1) == realtime_hard
    three = apply_level(realtime_hard, 3, 1)
    assert isinstance(three, Decision) and three.path is AnswerPath.LIGHT
    assert apply_level(Decision(Lane.REALTIME, AnswerPath.RULES), 3, 1).path is AnswerPath.RULES  # type: ignore[union-attr]


def test_classifier_sheds_and_degrades_by_level() -> None:
    settings = Settings(routing=RoutingSettings(exploration=0.0))
    now = 1_700_000_000_000

    def classify(body: dict[str, object], level: int):  # type: ignore[no-untyped-def]
        record = SourceRecord(json.dumps(body).encode(), None, now, "laneway.requests", 0, 1)
        return classify_record(record, now_ms=now, settings=settings, rules=RuleBook(), level=level)

    bulk = classify({"id": "b", "prompt": "Name a colour", "batch_id": "x"}, 2)
    assert bulk.outcome == "shed"
    result = InferenceResult.model_validate_json(bulk.records[0].value)
    assert result.error is not None and result.error.code == "INF-429"
    assert result.error.retry_after_ms == settings.flow.shed_retry_after_ms

    medium = classify({"id": "m", "prompt": "Tell me about " + "Paris " * 40}, 1)
    routed = RoutedRequest.model_validate_json(medium.records[0].value)
    assert routed.path == "light" and routed.requested_path == "heavy"
    assert classify({"id": "m", "prompt": "Tell me about " + "Paris " * 40}, 0).outcome == "routed"


def test_a_forced_path_is_never_moved_but_bulk_is_still_shed() -> None:
    forced = Decision(Lane.MEDIUM, AnswerPath.HEAVY, Complexity.SIMPLE, forced=True)
    assert apply_level(forced, 3, 1) == forced
    assert isinstance(apply_level(Decision(Lane.BULK, AnswerPath.HEAVY, forced=True), 2, 1), Shed)


def test_a_full_realtime_lane_refuses_model_requests_fast() -> None:
    """At its backlog mark realtime sheds with a short retry hint, at any
    level; other lanes and forced paths are left alone."""
    flow = FlowSettings(realtime_max_backlog=16, realtime_retry_after_ms=700)
    assert realtime_full(15, flow) is None
    full = realtime_full(16, flow)
    assert full == LaneFull(Lane.REALTIME, 16, 700)
    assert realtime_full(10_000, FlowSettings(realtime_max_backlog=None)) is None
    light = Decision(Lane.REALTIME, AnswerPath.LIGHT, lane_asked=True)
    assert apply_level(light, 0, 5_000, full) == Shed(
        "realtime lane full (16 requests waiting); retry shortly", 700
    )
    assert spills(light, full) is None, "the client asked for realtime: refused, not moved"
    # Put on realtime by the classifier, not the client: it goes to medium.
    chosen = Decision(Lane.REALTIME, AnswerPath.LIGHT)
    assert spills(chosen, full) is Lane.MEDIUM
    assert spills(chosen, None) is None, "not full: it stays"
    assert apply_level(chosen, 0, 5_000) == chosen
    medium = Decision(Lane.MEDIUM, AnswerPath.HEAVY, Complexity.COMPLEX)
    assert spills(medium, full) is None
    assert apply_level(medium, 0, 5_000, full) == medium
    forced = Decision(Lane.REALTIME, AnswerPath.HEAVY, forced=True)
    assert spills(forced, full) is None
    assert apply_level(forced, 0, 5_000, full) == forced


def test_a_full_realtime_lane_still_answers_by_rules() -> None:
    from streams.classify.classifier import Admitted, admit, route
    from streams.classify.policy import Found
    from streams.classify.router import SmartRouter
    from streams.routing.registry import builtin_registry
    from streams.rules.engine import RuleBook

    settings = Settings()
    router = SmartRouter(builtin_registry(settings.backend), settings.routing)
    full = realtime_full(100, settings.flow)
    now = 1_000_000

    def classified(prompt: str, found: Found) -> str:
        raw = json.dumps({"id": "r", "prompt": prompt, "lane": "realtime"}).encode()
        admitted = admit(SourceRecord(raw, None, now, "t", 0, 0), now_ms=now, settings=settings)
        assert isinstance(admitted, Admitted)
        out = route(
            admitted, found, now_ms=now, settings=settings, router=router, full=lambda _: full
        )
        return out.outcome

    greeting = RuleBook().answer("hello")
    assert classified("hello", Found(rule=greeting)) == "answered"
    assert classified("What is the capital of France?", Found()) == "shed"


def test_simple_work_the_classifier_put_on_a_full_realtime_lane_goes_to_medium() -> None:
    from streams.classify.app import observe_outcomes
    from streams.classify.classifier import Admitted, Classified, admit, route
    from streams.classify.policy import Found
    from streams.classify.router import SmartRouter
    from streams.routing.registry import builtin_registry

    # No exploration: on medium both paths are eligible, and 5% of the
    # routes would take the other one at random.
    routing = RoutingSettings(tenant_tiers={"vip": "premium"}, exploration=0.0)
    settings = Settings(routing=routing)
    router = SmartRouter(builtin_registry(settings.backend), settings.routing)
    now = 1_000_000

    def classified(
        full: LaneFull | None, serving: Serving | None = None, **asked: object
    ) -> Classified:
        body = {"id": "r", "prompt": "What is the capital of France?", **asked}
        raw = json.dumps(body).encode()
        admitted = admit(SourceRecord(raw, None, now, "t", 0, 0), now_ms=now, settings=settings)
        assert isinstance(admitted, Admitted)
        return route(
            admitted,
            Found(),
            now_ms=now,
            settings=settings,
            router=router,
            full=lambda _: full,
            serving=serving,
        )

    def lane_of(full: LaneFull | None, serving: Serving | None = None, **asked: object) -> str:
        out = classified(full, serving, **asked)
        if out.outcome == "shed":
            assert out.result is not None and out.result.error is not None
            return out.result.error.code.value
        (record,) = out.records
        routed = RoutedRequest.model_validate_json(record.value)
        return f"{routed.lane.value} {routed.path.value}"

    full = realtime_full(100, settings.flow)
    assert lane_of(None) == "realtime light"  # simple work: realtime, while it has room
    # Past the spill mark, short of the refusal mark: the room left is kept
    # for the requests that asked for realtime.
    keeping = realtime_full(2, settings.flow, capacity=2)
    assert keeping is not None and not keeping.asked_too
    assert lane_of(keeping) == "medium light"
    assert lane_of(keeping, lane="realtime") == "realtime light"
    assert lane_of(keeping, deadline_ms=2_000) == "realtime light"
    spilled = classified(keeping)
    assert spilled.decision is not None and spilled.decision.spilled_from is Lane.REALTIME
    # ... and counted for the operator.
    before = REGISTRY.get_sample_value(
        "laneway_spilled_total", {"from_lane": "realtime", "to_lane": "medium"}
    )
    observe_outcomes([spilled])
    after = REGISTRY.get_sample_value(
        "laneway_spilled_total", {"from_lane": "realtime", "to_lane": "medium"}
    )
    assert after == (before or 0.0) + 1
    # A premium tenant shares that room, and spills past it instead of a refusal.
    assert lane_of(keeping, tenant="vip") == "realtime light"
    assert lane_of(full, tenant="vip") == "medium light"
    assert lane_of(full) == "medium light"  # full: the classifier's choice spills
    assert lane_of(full, lane="realtime") == "INF-429"  # the client asked for it
    assert lane_of(full, deadline_ms=2_000) == "INF-429"  # a deadline only realtime keeps
    # The spilled request takes a path medium's live workers serve, not realtime's.
    split: Serving = {
        Lane.REALTIME: frozenset({AnswerPath.LIGHT}),
        Lane.MEDIUM: frozenset({AnswerPath.HEAVY}),
    }
    assert lane_of(None, split) == "realtime light"
    assert lane_of(full, split) == "medium heavy"


def test_realtime_is_full_when_its_waiting_would_take_too_long_to_reach() -> None:
    flow = FlowSettings(realtime_max_backlog=16, realtime_max_wait_ms=2_000)
    assert realtime_full(7, flow, 4.0) is None  # 1.75 s of work ahead
    assert realtime_full(8, flow, 4.0) == LaneFull(Lane.REALTIME, 8, 1_000)  # 2 s
    assert realtime_full(15, flow, None) is None  # no rate known: the count mark alone
    assert realtime_full(16, flow, 100.0) is not None
    assert realtime_full(15, FlowSettings(realtime_max_wait_ms=None), 0.5) is None


def test_the_wait_mark_counts_what_waits_behind_the_round_running() -> None:
    """A realtime worker's report counts the records it is running too. Its
    workers' capacity known, the wait mark counts only those queued behind
    that round, so it does not refuse the second round the batch mark keeps
    for requests that ask for realtime (it did: two batches of 2 running at
    4 records a second read as a second of work, at the 1000 ms default)."""
    flow = FlowSettings(realtime_max_wait_ms=1_000, realtime_max_batches=2.0)
    spill = LaneFull(Lane.REALTIME, 4, 1_000, asked_too=False)
    assert realtime_full(4, flow, 4.0, capacity=4) == spill  # the round running, none queued
    assert realtime_full(7, flow, 4.0, capacity=4) == replace(spill, waiting=7)  # 0.75 s queued
    assert realtime_full(8, flow, 4.0, capacity=4) == LaneFull(Lane.REALTIME, 8, 1_000)
    slow = realtime_full(5, flow, 0.5, capacity=4)  # one queued, 2 s at this rate
    assert slow == LaneFull(Lane.REALTIME, 5, 1_000)
    assert realtime_full(4, flow, 4.0) == LaneFull(Lane.REALTIME, 4, 1_000)  # no capacity: all


def test_realtime_is_full_when_it_holds_what_its_live_workers_run_at_once() -> None:
    flow = FlowSettings(
        realtime_max_backlog=16, realtime_max_wait_ms=None, realtime_max_batches=1.0
    )
    assert realtime_full(3, flow, capacity=4) is None  # room in the next batch
    assert realtime_full(4, flow, capacity=4) == LaneFull(Lane.REALTIME, 4, 1_000)
    assert realtime_full(7, flow, capacity=8) is None  # a second worker doubles the room
    two_rounds = FlowSettings(realtime_max_batches=2.0, realtime_spill_batches=None)
    assert realtime_full(7, two_rounds, capacity=4) is None
    assert realtime_full(8, two_rounds, capacity=4) is not None
    # Capacity not known (no board, no live worker), or the mark off: the other marks judge.
    assert realtime_full(15, flow, capacity=None) is None
    assert realtime_full(15, flow, capacity=0) is None
    off = FlowSettings(realtime_max_batches=None, realtime_spill_batches=None)
    assert realtime_full(15, off, capacity=4) is None


def test_realtime_keeps_its_last_round_for_the_requests_that_asked_for_it() -> None:
    """Past ``realtime_spill_batches`` x capacity the lane is full only for
    the classifier's own picks; at ``realtime_max_batches`` for everyone."""
    flow = FlowSettings(realtime_max_wait_ms=None, realtime_max_batches=2.0)
    assert realtime_full(1, flow, capacity=2) is None
    assert realtime_full(2, flow, capacity=2) == LaneFull(Lane.REALTIME, 2, 1_000, asked_too=False)
    assert realtime_full(4, flow, capacity=2) == LaneFull(Lane.REALTIME, 4, 1_000)
    asked = Decision(Lane.REALTIME, AnswerPath.LIGHT, lane_asked=True)
    assert apply_level(asked, 0, 5_000, realtime_full(3, flow, capacity=2)) == asked
    assert isinstance(apply_level(asked, 0, 5_000, realtime_full(4, flow, capacity=2)), Shed)
    # Off, the classifier's picks spill only where everyone is refused.
    assert realtime_full(3, FlowSettings(realtime_spill_batches=None), capacity=2) is None
    with pytest.raises(ValueError, match="realtime_spill_batches"):
        FlowSettings(realtime_spill_batches=2.0, realtime_max_batches=1.0)


def test_a_drain_rate_counts_busy_time_once_and_skips_idle_time() -> None:
    rate = DrainRate(window_s=10.0)
    assert rate.per_s(0.0) is None
    rate.add(0.0, 2.0, 4)
    rate.add(1.0, 3.0, 4)  # in flight beside the first: 3 busy seconds, not 4
    assert rate.per_s(3.0) == pytest.approx(8 / 3)
    rate.add(7.0, 8.0, 2)  # after 4 idle seconds, which do not count
    assert rate.per_s(8.0) == pytest.approx(10 / 4)
    assert rate.per_s(12.5) == pytest.approx(6 / 3)  # the first batch left the window
    assert rate.per_s(30.0) is None
