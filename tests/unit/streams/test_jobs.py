"""Batch jobs without services: JSONL validation, ids, the status machine,
output lines and the progress bar."""

from __future__ import annotations

import json

import pytest

from schemas.errors import RateLimited
from schemas.jobs import FINAL, BatchCounts, BatchJob, BatchJobStatus
from schemas.messages import InferenceResult, RequestLimits, Usage
from streams.jobs.jsonl import job_id_for, parse_jsonl, parse_window, request_id
from streams.jobs.progress import Rate, format_bar
from streams.jobs.results import output_line
from streams.jobs.state import TRANSITIONS, can_move, due_status

S = BatchJobStatus
LIMITS = RequestLimits()


def jsonl(*rows: object) -> bytes:
    return b"\n".join(r if isinstance(r, bytes) else json.dumps(r).encode() for r in rows) + b"\n"


def test_valid_lines_keep_their_order_and_line_numbers() -> None:
    data = jsonl(
        {"custom_id": "a", "body": {"prompt": "Hello!", "max_tokens": 8}},
        b"",
        {"custom_id": "b", "body": {"messages": [{"role": "user", "content": "Hi"}]}},
    )
    parsed = parse_jsonl(data, LIMITS)
    assert parsed.errors == []
    assert [(ln.line, ln.custom_id) for ln in parsed.lines] == [(1, "a"), (3, "b")]
    assert parsed.lines[0].body == {"prompt": "Hello!", "max_tokens": 8}
    assert parsed.format == "laneway"


def test_every_bad_line_is_reported_with_its_number() -> None:
    data = jsonl(
        {"custom_id": "ok", "body": {"prompt": "fine"}},
        b"{not json",
        {"custom_id": "", "body": {"prompt": "x"}},
        {"custom_id": "none", "body": {}},
        {
            "custom_id": "both",
            "body": {"prompt": "x", "messages": [{"role": "user", "content": "y"}]},
        },
        {"custom_id": "big", "body": {"prompt": "x", "max_tokens": 10**6}},
        {"custom_id": "ok", "body": {"prompt": "again"}},
        {"custom_id": "extra", "body": {"prompt": "x", "lane": "realtime"}},
        [1, 2],
        {"custom_id": "hot", "body": {"prompt": "x", "temperature": 5}},
    )
    parsed = parse_jsonl(data, LIMITS)
    assert [ln.custom_id for ln in parsed.lines] == ["ok"]
    by_line = {e.line: e.message for e in parsed.errors}
    assert sorted(by_line) == [2, 3, 4, 5, 6, 7, 8, 9, 10]
    assert "not JSON" in by_line[2]
    assert "custom_id" in by_line[3]
    assert "prompt" in by_line[4] and "prompt" in by_line[5]
    assert "max_tokens" in by_line[6]
    assert by_line[7] == "custom_id 'ok' repeats line 1"
    assert "lane" in by_line[8]
    assert "object" in by_line[9]
    assert "temperature" in by_line[10]
    assert {e.line: e.custom_id for e in parsed.errors}[7] == "ok"


def test_openai_lines_are_accepted_unchanged() -> None:
    line = {
        "custom_id": "request-1",
        "method": "POST",
        "url": "/v1/chat/completions",
        "body": {
            "model": "gpt-4o-mini",
            "messages": [
                {"role": "developer", "content": "You are terse."},
                {"role": "user", "content": [{"type": "text", "text": "Hello"}]},
            ],
            "max_completion_tokens": 16,
            "stop": "\n",
        },
    }
    parsed = parse_jsonl(jsonl(line), LIMITS)
    assert parsed.errors == []
    assert parsed.format == "openai"
    assert parsed.lines[0].body == {
        "messages": [
            {"role": "system", "content": "You are terse."},
            {"role": "user", "content": "Hello"},
        ],
        "max_tokens": 16,
        "stop": ["\n"],
    }


def test_openai_lines_that_cannot_run_say_why() -> None:
    base = {"custom_id": "x", "method": "POST", "url": "/v1/chat/completions"}
    rows = [
        {**base, "url": "/v1/embeddings", "body": {"input": "x"}},
        {**base, "method": "GET", "body": {"messages": [{"role": "user", "content": "x"}]}},
        {**base, "body": {"messages": [{"role": "user", "content": "x"}], "stream": True}},
        {**base, "body": {"messages": [{"role": "user", "content": "x"}], "tools": []}},
        {**base, "url": "/v1/completions", "body": {"messages": []}},
    ]
    errors = [e.message for e in parse_jsonl(jsonl(*rows), LIMITS).errors]
    assert len(errors) == 5
    assert "url" in errors[0] and "POST" in errors[1] and "stream" in errors[2]
    assert "tools" in errors[3] and "prompt" in errors[4]


def test_the_line_limit_is_an_error() -> None:
    rows = [{"custom_id": str(i), "body": {"prompt": "x"}} for i in range(5)]
    parsed = parse_jsonl(jsonl(*rows), LIMITS, max_lines=3)
    assert len(parsed.lines) == 3
    assert parsed.errors[0].line == 4 and "more than 3" in parsed.errors[0].message


def test_ids_are_deterministic() -> None:
    sha = parse_jsonl(b'{"custom_id": "a", "body": {"prompt": "x"}}\n', LIMITS).content_sha256
    job = job_id_for("acme", sha)
    assert job == job_id_for("acme", sha) != job_id_for("other", sha) != job_id_for(None, sha)
    assert job.startswith("batch_") and len(job) == 26
    rid = request_id(job, "a")
    assert rid == request_id(job, "a") != request_id(job, "b")
    assert rid.startswith(job + "-") and len(rid) <= 128


@pytest.mark.parametrize(
    ("text", "seconds"),
    [("24h", 86400), ("90m", 5400), ("3600", 3600), ("2d", 172800), ("1.5h", 5400)],
)
def test_windows(text: str, seconds: int) -> None:
    assert parse_window(text) == seconds


@pytest.mark.parametrize("text", ["", "soon", "-1h", "0s"])
def test_bad_windows(text: str) -> None:
    with pytest.raises(ValueError):
        parse_window(text)


def job(status: S, *, source: str = "file", now: int = 0, **counts: int) -> BatchJob:
    return BatchJob(
        id="batch_x",
        status=status,
        source=source,  # type: ignore[arg-type]
        counts=BatchCounts(**counts),
        created_at_ms=now,
        expires_at_ms=now + 1000,
    )


def test_final_statuses_lead_nowhere_and_the_rest_can_be_left() -> None:
    assert all(not TRANSITIONS[s] for s in FINAL)
    assert all(TRANSITIONS[s] for s in S if s not in FINAL)
    assert can_move(S.VALIDATING, S.IN_PROGRESS) and can_move(S.IN_PROGRESS, S.CANCELLED)
    assert not can_move(S.COMPLETED, S.CANCELLED)
    assert not can_move(S.IN_PROGRESS, S.COMPLETED)  # through finalizing
    assert not can_move(S.FINALIZING, S.CANCELLED)


def test_a_file_job_finishes_when_every_line_is_produced_and_answered() -> None:
    assert due_status(job(S.IN_PROGRESS, total=3, produced=3, done=2, failed=0), 10) is None
    assert due_status(job(S.IN_PROGRESS, total=3, produced=2, done=2, failed=1), 10) is None
    assert due_status(job(S.IN_PROGRESS, total=3, produced=3, done=2, failed=1), 10) is S.FINALIZING
    assert due_status(job(S.FINALIZING, total=3, produced=3, done=3), 10) is S.COMPLETED


def test_the_window_expires_a_job_with_pending_work() -> None:
    assert due_status(job(S.IN_PROGRESS, total=3, produced=3, done=1), 999) is None
    assert due_status(job(S.IN_PROGRESS, total=3, produced=3, done=1), 1000) is S.EXPIRED
    assert due_status(job(S.CANCELLED, total=3, produced=1, done=1), 5000) is None
    assert due_status(job(S.VALIDATING, total=3), 5000) is None
    # every request answered, the last one after the window (an INF-503 at its end)
    assert due_status(job(S.IN_PROGRESS, total=3, produced=3, done=1, failed=2), 1000) is S.EXPIRED


def test_a_kafka_job_ends_with_its_window() -> None:
    kafka = job(S.IN_PROGRESS, source="kafka", total=2, done=2)
    assert due_status(kafka, 10) is None
    assert due_status(kafka, 1000) is S.FINALIZING
    assert due_status(job(S.IN_PROGRESS, source="kafka", total=3, done=2), 1000) is S.EXPIRED


def test_output_lines() -> None:
    running = job(S.IN_PROGRESS, total=2)
    ok = InferenceResult(id="r1", status="ok", output="Hi!", model="rules:greeting", usage=Usage())
    row = output_line(running, 3, "a", "r1", ok)
    assert row["custom_id"] == "a" and row["line"] == 3 and row["error"] is None
    assert row["response"]["output"] == "Hi!"
    assert output_line(running, 4, "b", "r2", None)["error"]["code"] == "batch_pending"
    cancelled = job(S.CANCELLED, total=2)
    assert output_line(cancelled, 4, "b", "r2", None)["error"]["code"] == "batch_cancelled"
    openai = cancelled.model_copy(update={"format": "openai"})
    body = output_line(openai, 3, "a", "r1", ok)["response"]["body"]
    assert body["choices"][0]["message"] == {"role": "assistant", "content": "Hi!"}


def test_the_bar_shows_done_failed_pending_rate_and_eta() -> None:
    rate = Rate()
    assert rate.add(0.0, 0) == 0.0
    assert rate.add(2.0, 10) == 5.0
    line = format_bar(job(S.IN_PROGRESS, total=20, produced=15, done=8, failed=2), 5.0)
    assert "10/20 done 8 failed 2 pending 10" in line and "5.0/s" in line and "ETA 2s" in line
    assert line.startswith("[" + "#" * 12 + "x" * 3 + "-" * 15 + "]")


def test_the_tracker_reads_only_records_that_name_a_batch() -> None:
    from types import SimpleNamespace

    from streams.jobs.tracker import parse_records

    def rec(topic: str, value: bytes) -> SimpleNamespace:
        return SimpleNamespace(topic=topic, value=value)

    ok = InferenceResult(id="r1", status="ok", output="hi", batch_id="b1").model_dump_json()
    failed = InferenceResult(id="r2", status="error", batch_id="b1").model_dump_json()
    shed = InferenceResult.failure(
        "r4", RateLimited("shed", retry_after_ms=700), batch_id="b1"
    ).model_dump_json()
    plain = InferenceResult(id="r3", status="ok", output="hi").model_dump_json()
    records = [
        rec("p.results", ok.encode()),
        rec("p.results", failed.encode()),
        rec("p.results", plain.encode()),
        rec("p.results", b"not json"),
        rec("p.results", shed.encode()),
        rec("p.requests", b'{"id": "q1", "prompt": "x", "batch_id": "native"}'),
        rec("p.requests", b'{"id": "q2", "prompt": "x", "batch_id": null}'),
        rec("p.requests", b'{"id": 3, "batch_id": "native"}'),
    ]
    results, requests = parse_records(records, "p.results", 10_000)  # type: ignore[arg-type]
    assert [(j, r, out) for j, r, _, out in results] == [
        ("b1", "r1", True),
        ("b1", "r2", False),
        ("b1", "r4", 10_700),  # INF-429: sent again after its retry_after_ms
    ]
    assert results[0][2] == ok
    assert requests == [("native", "q1")]


def test_an_output_line_says_why_its_answer_ended() -> None:
    running = job(S.IN_PROGRESS, total=2)
    cut = InferenceResult(
        id="r1",
        status="ok",
        output="Once upon a",
        finish_reason="length",
        usage=Usage(prompt_tokens=9, completion_tokens=3),
    )
    row = output_line(running, 1, "a", "r1", cut)
    assert row["response"]["finish_reason"] == "length"
    assert row["response"]["usage"]["total_tokens"] == 12
    openai = running.model_copy(update={"format": "openai"})
    body = output_line(openai, 1, "a", "r1", cut)["response"]["body"]
    assert body["choices"][0]["finish_reason"] == "length"
    assert body["usage"] == {"prompt_tokens": 9, "completion_tokens": 3, "total_tokens": 12}
    older = cut.model_copy(update={"finish_reason": None})  # written before results said why
    assert (
        output_line(openai, 1, "a", "r1", older)["response"]["body"]["choices"][0]["finish_reason"]
        == "stop"
    )
