"""The pre-warm's arithmetic and its refusal of settings that cannot work."""

import pytest

from schemas.errors import RateLimited
from schemas.messages import AnswerPath, InferenceResult
from schemas.settings import CacheSettings, PrewarmSettings, Settings
from streams.cache.hot_questions import HotQuestion
from streams.cache.prewarm import (
    PrewarmReport,
    _moves_on,
    _tally,
    coverage,
    format_report,
    prewarm,
)

HOT = [HotQuestion("a", 6, "{}"), HotQuestion("b", 3, "{}"), HotQuestion("c", 1, "{}")]


def test_coverage_weighs_questions_by_how_often_they_are_asked() -> None:
    assert coverage(HOT, {"a"}) == 0.6
    assert coverage(HOT, {"a", "b", "c"}) == 1.0
    assert coverage([], set()) == 1.0


def test_results_are_tallied_by_what_answered_them() -> None:
    def ok(path: AnswerPath) -> InferenceResult:
        return InferenceResult(id="x", status="ok", output="y", path=path)

    shed = InferenceResult.failure("x", RateLimited("bulk paused", retry_after_ms=500))
    due = [HotQuestion(k, 3, "{}") for k in "abcde"]
    report = PrewarmReport(day="20261203")
    results = [
        ok(AnswerPath.LIGHT),
        ok(AnswerPath.HEAVY),
        ok(AnswerPath.RULES),
        shed,
        TimeoutError(),
    ]
    answered = _tally(report, due, results)
    assert [h.key for h in answered] == ["a", "b"]
    assert report.by_rules == 1 and report.failed == {"INF-429": 1, "timeout": 1}
    assert "failed: INF-429 1, timeout 1" in format_report(report)


async def test_a_refresh_floor_above_the_cache_lifetime_is_refused() -> None:
    settings = Settings(
        cache=CacheSettings(ttl_s=3_600), prewarm=PrewarmSettings(refresh_below_s=21_600)
    )
    with pytest.raises(ValueError, match="must be below LANEWAY_CACHE_TTL_S"):
        await prewarm(settings)


def test_answers_come_back_on_the_tenants_own_topic_where_it_must() -> None:
    from schemas.settings import LimitsSettings
    from streams.cache.prewarm import _reply_topic

    acme = HotQuestion("k", 3, '{"prompt": "hi", "tenant": "acme"}')
    anyone = HotQuestion("k", 3, '{"prompt": "hi"}')
    strict = Settings(limits=LimitsSettings(tenant_reply_topics=True))
    assert _reply_topic(strict, acme, "laneway.replies.prewarm") == "laneway.replies.acme"
    assert _reply_topic(strict, anyone, "laneway.replies.prewarm") == "laneway.replies.prewarm"
    assert _reply_topic(Settings(), acme, "laneway.replies.prewarm") == "laneway.replies.prewarm"


def test_questions_about_a_time_that_moves_on_are_not_warmed() -> None:
    assert _moves_on(HotQuestion("k", 9, '{"prompt": "What is on the menu today?"}'))
    assert _moves_on(HotQuestion("k", 9, '{"messages": [{"role": "user", "content": "now?"}]}'))
    assert not _moves_on(HotQuestion("k", 9, '{"prompt": "What are your opening hours?"}'))
    assert not _moves_on(HotQuestion("k", 9, "{}"))  # no question to read: not dropped here
    report = PrewarmReport(day="20261207", hot=4, time_relative=2)
    assert "2 about a time that moves on, left to traffic" in format_report(report)
    assert report.as_dict()["time_relative"] == 2
