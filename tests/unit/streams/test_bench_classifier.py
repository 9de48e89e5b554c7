"""``laneway bench classifier``'s pure parts: the workload and the table."""

from __future__ import annotations

import itertools
import os

import pytest

from schemas.messages import AnswerPath, InferenceResult
from streams.bench.classifier import (
    PHASES,
    Counted,
    PhaseRow,
    counted,
    cpu_seconds,
    expected_kind,
    format_rows,
    format_stages,
    lag_figures,
    phase_requests,
    stage_figures,
)
from streams.bench.lag import pace
from streams.cli.main import build_parser
from streams.devstack.embedded import free_port


def test_each_phase_has_unique_ids_and_its_own_prompts() -> None:
    bodies = {phase: phase_requests(phase, 10, "t") for phase in PHASES}
    ids = [b["id"] for phase in PHASES for b in bodies[phase]]
    assert len(ids) == len(set(ids)) == 30
    assert bodies["rules"][0]["prompt"] == "Hello!"
    assert {b["prompt"] for b in bodies["semantic"]} & {
        b["prompt"] for b in bodies["exact"]
    } == set()


def test_answers_count_only_when_they_came_the_way_the_phase_measures() -> None:
    def result(path: AnswerPath, model: str) -> InferenceResult:
        return InferenceResult(id="x", status="ok", output="o", path=path, model=model)

    assert expected_kind("rules", result(AnswerPath.RULES, "rules:greeting"))
    assert expected_kind("exact", result(AnswerPath.CACHE, "cache:exact:m"))
    assert not expected_kind("semantic", result(AnswerPath.CACHE, "cache:exact:m"))
    assert expected_kind("semantic", result(AnswerPath.CACHE, "cache:semantic:m"))


def test_the_table_shows_rates_and_cpu_per_request() -> None:
    row = PhaseRow("this", "rules", 100, 100, 100, 0.05, cpu_s=0.02)
    assert row.rps == 2000.0 and row.cpu_us == 200.0
    table = format_rows([row, PhaseRow("baseline", "exact", 10, 9, 9, 1.0)])
    assert "2000.0" in table and "200" in table and table.splitlines()[-1].endswith("-")


def test_cpu_seconds_of_this_process() -> None:
    spent = cpu_seconds(os.getpid())
    assert spent is None or spent > 0
    assert cpu_seconds(-1) is None
    assert cpu_seconds(None) is None


def test_the_command_line_reaches_it() -> None:
    args = build_parser().parse_args(["bench", "classifier", "-n", "5000"])
    assert args.mode == "classifier" and args.requests == 5000


def test_a_share_of_the_requests_carries_a_batch_id_evenly_spread() -> None:
    bodies = phase_requests("rules", 100, "t", batch_share=0.1)
    batched = [i for i, b in enumerate(bodies) if "batch_id" in b]
    assert len(batched) == 10 and {bodies[i]["batch_id"] for i in batched} == {"t-batch"}
    assert all(b - a == 10 for a, b in itertools.pairwise(batched))
    assert not any("batch_id" in b for b in phase_requests("rules", 50, "t"))
    assert all("batch_id" in b for b in phase_requests("exact", 7, "t", batch_share=1.0))


def test_a_follower_pace_is_its_time_to_catch_up_over_the_classifiers() -> None:
    assert pace(4.0, 0.8) == 1.2
    assert pace(4.0, -0.01) == 1.0  # done before the last reply was read
    assert pace(4.0, None) is None and pace(0.0, 1.0) is None
    row = PhaseRow("this", "rules", 100, 100, 100, 2.0, router_behind_s=0.5)
    assert row.router_pace == 1.25 and row.tracker_pace is None
    line = format_rows([row]).splitlines()[-1]
    assert line.split()[-2:] == ["1.25", "-"]
    figures = lag_figures([row])
    assert figures["rules_router_pace"].value == 1.25
    assert figures["rules_tracker_pace"].value is None


def test_the_batch_share_is_checked_on_the_command_line() -> None:
    args = build_parser().parse_args(["bench", "classifier", "--lag", "--batch-share", "0.25"])
    assert args.lag and args.batch_share == 0.25
    for bad in ("1.5", "-0.1", "some"):
        with pytest.raises(SystemExit):
            build_parser().parse_args(["bench", "classifier", "--batch-share", bad])


def test_the_mean_batch_is_records_taken_over_batches_taken() -> None:
    row = PhaseRow("this", "rules", 1000, 1000, 1000, 0.5, batches=8, taken=1000)
    assert row.mean_batch == 125.0
    assert PhaseRow("baseline", "rules", 10, 10, 10, 1.0, batches=2).mean_batch is None
    assert PhaseRow("this", "rules", 10, 10, 10, 1.0, batches=0, taken=0).mean_batch is None
    figures = stage_figures([row])
    assert figures["rules_batch"].value == 125.0


def test_the_time_per_request_is_broken_down_by_stage_and_what_is_left() -> None:
    stages = {"decode": 0.01, "lookups": 0.02, "route": 0.03, "produce": 0.01, "deliver": 0.05}
    row = PhaseRow("this", "rules", 1000, 1000, 1000, 0.1, stages=stages)
    us = row.stage_us()
    assert us is not None
    assert us["decode"] == pytest.approx(10.0) and us["route"] == pytest.approx(30.0)
    assert us["left"] == pytest.approx(100.0 - 70.0) and us["deliver"] == pytest.approx(50.0)
    table = format_stages([row, PhaseRow("baseline", "rules", 10, 10, 10, 1.0)])
    (line,) = table.splitlines()[2:]  # the baseline has no stages: left out
    assert line.split()[:5] == ["this", "rules", "100.0", "10.0", "10%"]
    assert format_stages([PhaseRow("baseline", "rules", 10, 10, 10, 1.0)]) == ""
    figures = stage_figures([row])
    assert figures["rules_left_us"].value == 30.0 and figures["rules_lookups_us"].unit == "us"


def test_counters_read_from_the_metrics_are_taken_per_phase() -> None:
    before = Counted(10, 1000, {"decode": 1.0, "route": 2.0})
    after = Counted(18, 2000, {"decode": 1.5, "route": 2.25, "lookups": 0.5})
    phase = after.since(before)
    assert phase.batches == 8 and phase.taken == 1000
    assert phase.stages == {"decode": 0.5, "route": 0.25, "lookups": 0.5}
    assert Counted().since(before) == Counted()  # a classifier without them
    assert counted(free_port()) == Counted()  # nothing answers there
