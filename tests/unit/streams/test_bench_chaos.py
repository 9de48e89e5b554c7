"""``laneway bench chaos``'s counting, without a stack: the traffic mix,
each fault window's p99, and how replies are tallied against CONTRACT.md's
delivery promise (at least one; a second only as the same result)."""

import pytest

from schemas.errors import RateLimited
from schemas.messages import InferenceResult
from streams.bench.chaos import (
    FAULTS,
    Chaos,
    FaultWindow,
    Sent,
    bench_run,
    chaos_request,
    parse_faults,
    tally,
    window_p99,
)
from streams.bench.results import build_result, validate_result
from streams.cli.main import build_parser


def test_the_mix_is_rules_cache_and_models_on_every_lane() -> None:
    requests = [chaos_request(i, 4) for i in range(100)]
    kinds = [kind for kind, _ in requests]
    assert (kinds.count("rule"), kinds.count("cache"), kinds.count("model")) == (40, 30, 30)
    models = [r for kind, r in requests if kind == "model"]
    assert all(r["metadata"] == {"cache": "bypass, no-store"} for r in models)
    assert sum(r.get("lane") == "realtime" for r in models) == 10
    assert sum(r.get("lane") == "medium" for r in models) == 10
    assert sum(r.get("batch_id") == "chaos" for r in models) == 10
    assert len({r["prompt"] for kind, r in requests if kind == "cache"}) <= 5  # asked again


def test_faults_are_named_in_order_and_checked() -> None:
    assert parse_faults("redis-primary, classifier") == ("redis-primary", "classifier")
    assert parse_faults(",".join(FAULTS)) == FAULTS
    with pytest.raises(ValueError, match="unknown fault 'broker'"):
        parse_faults("classifier,broker")


def sent(rid: str, at: float, latency_s: float | None, status: str = "ok") -> Sent:
    answered = None if latency_s is None else at + latency_s
    return Sent(rid, "rule", at, answered, status if answered is not None else "")


def test_a_window_p99_counts_what_was_sent_in_it() -> None:
    requests = [sent(f"r{i}", i * 0.1, 0.05) for i in range(100)] + [sent("slow", 5.0, 3.0)]
    assert window_p99(requests, 0.0, 5.0) == pytest.approx(50.0)
    assert window_p99(requests, 5.0, 6.0) == pytest.approx(3000.0)
    assert window_p99(requests, 20.0, 30.0) is None


def result(rid: str, output: str = "pong") -> InferenceResult:
    return InferenceResult(id=rid, status="ok", output=output)


def test_duplicates_are_counted_and_judged_by_the_contract() -> None:
    requests = {
        "a": sent("a", 1.0, 0.1),
        "b": sent("b", 2.0, 0.1),
        "c": sent("c", 3.0, 0.1, status="error"),
        "d": sent("d", 4.0, None),
    }
    requests["c"].code = "INF-429"
    windows = [FaultWindow("worker-medium", 1.5, 3.5, 2.0)]
    replies = [
        result("a"),
        result("b"),
        result("b"),
        result("b"),
        InferenceResult.failure("c", RateLimited("shed", 100)),
        result("warm-1"),
    ]
    counted = tally(requests, replies, windows, also_known={"warm-1"})
    assert (counted.sent, counted.answered, counted.lost) == (4, 3, 1)
    assert counted.errors == {"INF-429": 1}
    assert (counted.duplicates, counted.duplicate_ids) == (2, 1)
    assert counted.duplicates_by_window == {"worker-medium": 1}
    assert counted.unknown == 0 and counted.conflicting == 0
    assert not counted.within_contract, "a lost request breaks the promise"
    del requests["d"]
    assert tally(requests, replies, windows, also_known={"warm-1"}).within_contract
    # A reply nobody asked for, or two copies that disagree: not within it.
    stranger = tally(requests, [*replies, result("z")])
    assert stranger.unknown == 2 and not stranger.within_contract  # warm-1 and z
    differ = tally(requests, [*replies, result("a", "something else")], also_known={"warm-1"})
    assert differ.conflicting == 1 and not differ.within_contract


def test_the_result_file_has_a_figure_and_a_series_per_fault() -> None:
    requests = {f"r{i}": sent(f"r{i}", i * 0.5, 0.2) for i in range(40)}
    windows = [
        FaultWindow("redis-primary", 5.0, 10.0, 1.5),
        FaultWindow("worker-stop", 10.0, 20.0, 12.0),
    ]
    chaos = Chaos(
        tally(requests, [result(r) for r in requests], windows),
        FaultWindow("before", 0.0, 5.0, 0.0),
        windows,
        requests,
        {"classifier": 1},
    )
    run = bench_run(chaos)
    assert run.exit_code == 0
    assert run.figures["lost"].value == 0 and run.figures[
        "p99_worker_stop_ms"
    ].value == pytest.approx(200.0)
    assert run.figures["back_redis_primary_s"].value == 1.5
    assert len(run.series["latency_worker_stop"].points) == 20
    result_file = build_result("chaos", "laneway bench chaos", run, commit="abc1234")
    validate_result(result_file)


def test_the_mode_is_registered() -> None:
    args = build_parser().parse_args(["bench", "chaos", "--faults", "classifier", "--rate", "2"])
    assert args.mode == "chaos" and args.faults == "classifier" and args.rate == 2
