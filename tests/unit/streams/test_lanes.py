"""The lane decided in one place: ``decide_route`` keeps what each step
decided, and the record ``route`` builds from it is never rewritten."""

import json

from schemas.messages import AnswerPath, InferenceRequest, Lane
from schemas.settings import RoutingSettings, Settings
from streams.classify.classifier import Admitted, SourceRecord, admit, route
from streams.classify.flow import LaneFull, Shed
from streams.classify.lanes import decide_route
from streams.classify.policy import Found
from streams.classify.router import SmartRouter
from streams.routing.registry import builtin_registry
from streams.rules.engine import RuleBook

SETTINGS = Settings(routing=RoutingSettings(exploration=0.0))
ROUTER = SmartRouter(builtin_registry(SETTINGS.backend), SETTINGS.routing)
NOW = 1_000_000
ASKED = "What is the capital of France?"  # simple work: the classifier puts it on realtime
SPILL_FULL = LaneFull(Lane.REALTIME, waiting=50, retry_after_ms=200)


def request(**body: object) -> InferenceRequest:
    return InferenceRequest.model_validate({"id": "r", "prompt": ASKED, **body})


def test_each_step_is_kept_when_a_request_spills_to_medium() -> None:
    asked: list[AnswerPath] = []
    placed: list[AnswerPath] = []

    def full(path: AnswerPath) -> LaneFull:
        asked.append(path)
        return SPILL_FULL

    def place(path: AnswerPath) -> int:
        placed.append(path)
        return 3

    routing = decide_route(
        request(),
        Found(),
        settings=SETTINGS,
        router=ROUTER,
        registry=ROUTER.registry,
        stats={},
        full=full,
        place=place,
    )
    assert routing.chosen.lane is Lane.REALTIME and asked == [routing.chosen.path]
    assert routing.lane_full == SPILL_FULL
    assert routing.spilled is not None and routing.spilled.lane is Lane.MEDIUM
    assert routing.spilled.spilled_from is Lane.REALTIME
    assert routing.taken == routing.spilled == routing.decision
    assert routing.partition is None and placed == [], "only a realtime request is placed"


def test_a_request_routed_to_realtime_gets_the_gates_partition_in_its_record() -> None:
    placed: list[AnswerPath] = []

    def place(path: AnswerPath) -> int:
        placed.append(path)
        return 3

    raw = json.dumps({"id": "r", "prompt": ASKED, "lane": "realtime"}).encode()
    admitted = admit(SourceRecord(raw, None, NOW, "t", 0, 0), now_ms=NOW, settings=SETTINGS)
    assert isinstance(admitted, Admitted)
    out = route(admitted, Found(), now_ms=NOW, settings=SETTINGS, router=ROUTER, place=place)
    assert out.outcome == "routed" and out.routing is not None
    assert out.routing.partition == 3 and placed == [out.routing.decision.path]
    assert out.records[0].topic == SETTINGS.lane_topic(Lane.REALTIME)
    assert out.records[0].partition == 3


def test_an_answer_given_here_stops_at_the_first_step() -> None:
    greeting = RuleBook().answer("hello")
    routing = decide_route(
        request(prompt="hello"),
        Found(rule=greeting),
        settings=SETTINGS,
        router=ROUTER,
        registry=ROUTER.registry,
        stats={},
        full=lambda path: SPILL_FULL,
        place=lambda path: 3,
    )
    assert routing.answered and routing.chosen.path is AnswerPath.RULES
    assert routing.taken == routing.chosen and routing.lane_full is None
    assert routing.partition is None


def test_a_shed_keeps_the_decision_it_shed() -> None:
    routing = decide_route(
        request(lane="bulk"),
        Found(),
        settings=SETTINGS,
        router=ROUTER,
        registry=ROUTER.registry,
        stats={},
        level=2,
    )
    assert isinstance(routing.taken, Shed)
    assert routing.decision is routing.chosen and routing.decision.lane is Lane.BULK
