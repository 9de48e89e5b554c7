import pytest
from prometheus_client import CollectorRegistry, Counter, start_http_server

from schemas.errors import DeadlineExceeded, RateLimited
from schemas.messages import InferenceResult, Timings
from streams.bench.burst import QUESTIONS, burst_workload
from streams.bench.compare import compare_row
from streams.bench.drive import (
    CLIENTS,
    SIMPLE_PROMPTS,
    Sample,
    format_table,
    mixed_workload,
    overload_workload,
    summarize,
)
from streams.bench.overload import format_steps, step_row
from streams.cli.main import build_parser
from streams.devstack.embedded import free_port
from streams.devstack.supervisor import metric_total


def test_mixed_workload_shape() -> None:
    work = mixed_workload(100, 8)
    assert len(work) == 100 and all(r["max_tokens"] == 8 for r in work)
    assert sum(r["prompt"] in ("Hello!", "thanks", "ping", "help") for r in work) == 40
    assert sum("batch_id" in r for r in work) == 20


def test_overload_workload_asks_for_realtime_on_one_in_ten_simple_requests() -> None:
    work = overload_workload(100, 8, deadline_ms=20_000, urgent_deadline_ms=3_000)
    urgent = [r for r in work if r["deadline_ms"] == 3_000]
    assert len(urgent) == 10
    assert all("batch_id" not in r and r["prompt"] in SIMPLE_PROMPTS for r in urgent)
    assert all(r["deadline_ms"] == 20_000 for r in work if r not in urgent)
    assert all(r["metadata"] == {"cache": "bypass, no-store"} for r in work)


def test_summary_per_lane_and_path() -> None:
    samples = [
        Sample("realtime", "rules", "ok", 10.0, 1, 1.0),
        Sample("realtime", "rules", "ok", 30.0, 1, 2.0),
        Sample("bulk", "light", "error", 500.0, 4, 2.0),
    ]
    rows = summarize(samples, started_at=0.0)
    by = {(r.lane, r.path): r for r in rows}
    assert by[("realtime", "rules")].count == 2 and by[("realtime", "rules")].p99_ms == 30.0
    assert by[("bulk", "light")].errors == 1 and by[("bulk", "light")].mean_batch == 4
    assert by[("all", "all")].throughput_rps == 1.5
    assert rows[-1].lane == "all" and "realtime" in format_table(rows)


def test_overload_step_counts_every_outcome() -> None:
    ok = InferenceResult(id="a", status="ok", lane="realtime")
    degraded = InferenceResult(id="b", status="ok", lane="medium", degraded=True)
    limited = InferenceResult.failure("c", RateLimited("shed", 100))
    expired = InferenceResult.failure("d", DeadlineExceeded("late"))
    row = step_row(2.0, 3.0, [(ok, 12.0), (degraded, 50.0), (limited, 1.0), (expired, 9.0)], 1)
    assert (row.sent, row.ok, row.degraded, row.limited, row.expired, row.lost) == (
        5,
        1,
        1,
        1,
        1,
        1,
    )
    assert row.realtime_p99_ms == 12.0
    assert "2x" in format_steps([row])


def test_overload_step_counts_the_model_answers_per_lane() -> None:
    def answer(rid: str, lane: str, path: str) -> InferenceResult:
        return InferenceResult(id=rid, status="ok", lane=lane, path=path)

    answered = [
        (answer("a", "realtime", "light"), 1.0),
        (answer("b", "realtime", "rules"), 1.0),  # not a model's
        (answer("c", "realtime", "cache"), 1.0),
        (answer("d", "medium", "heavy"), 1.0),
        (answer("e", "medium", "light"), 1.0),
        (InferenceResult.failure("f", DeadlineExceeded("late"), lane="bulk"), 1.0),
    ]
    row = step_row(1.0, 1.0, answered, 0)
    assert row.model_answers == (1, 2, 0)
    assert format_steps([row]).splitlines()[-1].endswith(" 1/2/0")


def test_overload_step_counts_realtime_refusals_apart_from_its_served_tail() -> None:
    """A refusal is fast by design: the served p99 leaves it out, and the
    realtime lane's share of 429s and 503s is counted on its own."""
    fast = InferenceResult(id="a", status="ok", lane="realtime")
    limited = InferenceResult.failure("b", RateLimited("full", 100), lane="realtime")
    expired = InferenceResult.failure("c", DeadlineExceeded("late"), lane="realtime")
    bulk = InferenceResult.failure("d", RateLimited("paused", 100), lane="bulk")
    answered = [(fast, 10.0)] * 3 + [(limited, 1.0)] * 96 + [(expired, 900.0), (bulk, 1.0)]
    row = step_row(3.0, 1.0, answered, 0)
    assert (row.limited, row.realtime_limited, row.expired, row.realtime_expired) == (97, 96, 1, 1)
    assert row.realtime_served_p99_ms == 900.0
    assert row.realtime_p99_ms < row.realtime_served_p99_ms
    assert format_steps([row]).splitlines()[-1].split()[5:7] == ["97/96", "1/1"]


def test_overload_step_splits_realtime_model_time_into_queue_and_inference() -> None:
    def answered(queue_ms: float, inference_ms: float) -> InferenceResult:
        timings = Timings(queue_ms=queue_ms, inference_ms=inference_ms)
        return InferenceResult(id="x", status="ok", lane="realtime", timings=timings)

    rule = InferenceResult(id="r", status="ok", lane="realtime")  # no inference: not counted
    row = step_row(
        1.0, 1.0, [(answered(300, 900), 1300.0), (answered(20, 400), 500.0), (rule, 5.0)], 0
    )
    assert (row.realtime_queue_p99_ms, row.realtime_inference_p99_ms) == (300.0, 900.0)
    assert format_steps([row]).splitlines()[-1].split()[-3:-1] == ["300", "900"]


def test_the_command_line_offers_every_client(capsys: pytest.CaptureFixture[str]) -> None:
    """Every mode that drives a stack offers the bench's clients, and only those."""
    for kind in CLIENTS:
        assert build_parser().parse_args(["bench", "mix", "--client", kind]).client == kind
    with pytest.raises(SystemExit):
        build_parser().parse_args(["bench", "mix", "--client", "nope"])
    offered = capsys.readouterr().err.rsplit("choose from ", 1)[1]
    assert offered.strip().rstrip(")") == ", ".join(repr(kind) for kind in CLIENTS)


def test_burst_workload_asks_each_question_n_times_the_first_copy_for_realtime() -> None:
    requests = burst_workload(6, max_tokens=64, realtime_deadline_ms=3_000)
    assert len(requests) == 6 * len(QUESTIONS)
    for prompt in QUESTIONS:
        copies = [r for r in requests if r["prompt"] == prompt]
        assert len(copies) == 6
        assert sum(r.get("deadline_ms") == 3_000 for r in copies) == 1
        assert all(r["temperature"] == 0.0 and r["max_tokens"] == 64 for r in copies)
    assert build_parser().parse_args(["bench", "burst", "6"]).copies == 6


def test_a_compare_row_counts_model_decodes_per_lane_not_cache_or_rules() -> None:
    def sample(lane: str, path: str) -> Sample:
        return Sample(lane, path, "ok", 10.0, 1, finished_at=1.0)

    samples = [
        sample("realtime", "light"),
        sample("realtime", "cache"),
        sample("medium", "light"),
        sample("medium", "heavy"),
        sample("medium", "cache"),
        sample("bulk", "rules"),
    ]
    row = compare_row("marks", samples, started=0.0, lost=0)
    assert row.decoded_by_lane == {"realtime": 1, "medium": 2}
    assert row.paths == {"light": 2, "heavy": 1, "cache": 2, "rules": 1}


def test_the_stacks_a_bench_starts_log_to_a_file_unless_verbose() -> None:
    quiet = build_parser().parse_args(["bench", "burst", "2"])
    assert quiet.verbose is False and quiet.log_file is None  # then ~/.cache/laneway/logs
    loud = build_parser().parse_args(["bench", "compare", "-v", "--log-file", "/tmp/b.log"])
    assert loud.verbose is True and str(loud.log_file) == "/tmp/b.log"


def test_a_metric_is_summed_over_its_labels_from_a_process_metrics() -> None:
    registry = CollectorRegistry()
    stopped = Counter(
        "laneway_decodes_stopped_total", "decodes stopped", ["lane"], registry=registry
    )
    stopped.labels("medium").inc(2)
    stopped.labels("bulk").inc()
    port = free_port()
    server, thread = start_http_server(port, addr="127.0.0.1", registry=registry)
    try:
        assert metric_total(port, "laneway_decodes_stopped_total") == 3.0
        assert metric_total(port, "laneway_no_such_total") is None
    finally:
        server.shutdown()
        thread.join()
    assert metric_total(port, "laneway_decodes_stopped_total") is None, "no one answers"


def test_streamed_samples_put_time_to_first_token_beside_the_total() -> None:
    from streams.bench.drive import Sample, format_table, summarize

    samples = [
        Sample(
            "realtime",
            "light",
            "ok",
            latency_ms=400.0 + i,
            batch_size=1,
            finished_at=1.0,
            ttft_ms=50.0 + i,
        )
        for i in range(10)
    ] + [Sample("realtime", "rules", "ok", latency_ms=10.0, batch_size=1, finished_at=1.0)]
    rows = {(r.lane, r.path): r for r in summarize(samples, started_at=0.0)}
    light = rows[("realtime", "light")]
    assert light.ttft_p50_ms == 54.0 and light.ttft_p99_ms == 59.0 and light.p50_ms == 404.0
    assert rows[("realtime", "rules")].ttft_p50_ms is None
    table = format_table(list(rows.values()))
    assert "ttft p50" in table.splitlines()[0]


def test_a_stream_cost_leg_counts_the_tokens_of_its_answers_over_its_time() -> None:
    from streams.bench.drive import NO_CACHE, Sample
    from streams.bench.stream_cost import leg_of, model_workload

    samples = [
        Sample(
            "medium", "light", "ok", 100.0, 1, finished_at=12.0, completion_tokens=60, ttft_ms=20.0
        ),
        Sample(
            "medium", "light", "ok", 300.0, 1, finished_at=10.0, completion_tokens=40, ttft_ms=30.0
        ),
        Sample("medium", "light", "error", 5.0, 1, finished_at=11.0),
    ]
    leg = leg_of(samples, started=2.0, lost=0, streamed=True)
    assert (leg.answered, leg.errors, leg.tokens, leg.seconds) == (2, 1, 100, 10.0)
    assert leg.tokens_per_s == 10.0 and leg.ttft_p50_ms == 20.0
    assert leg.tokens_per_answer == 50.0 and leg.ttft_share == 0.2  # of the p50, 100 ms
    assert all(r["metadata"] == NO_CACHE for r in model_workload(10, 8))
    explain = model_workload(14, 64, "light", "realtime", "explain")
    assert all(r["prompt"].startswith(("Explain", "Describe", "Compare")) for r in explain)
    assert len({r["prompt"] for r in explain}) == 14, "every question asked once"


def test_stream_cost_rounds_alternate_abba_and_pair_by_kind() -> None:
    from streams.bench.stream_cost import Leg, leg_order, rounds_of

    order = [streamed for r in range(4) for streamed in leg_order(r)]
    assert order == [False, True, True, False, False, True, True, False]
    legs = [Leg(s, 1, 0, 0, 10, 1.0, 1.0, None) for s in order]
    assert all(not a.streamed and b.streamed for a, b in rounds_of(legs))
