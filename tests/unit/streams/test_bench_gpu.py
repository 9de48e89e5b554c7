"""The GPU bench's arithmetic and report, without a backend."""

from __future__ import annotations

import argparse

import pytest

from schemas.errors import DeadlineExceeded
from streams.bench.gpu import _sizes, format_table, prompts, summarize
from workers.backends.base import Generation, Outcome


def test_prompts_are_all_different() -> None:
    assert len(set(prompts(40) + prompts(40, offset=40))) == 80


def test_a_row_counts_requests_tokens_and_errors() -> None:
    outcomes: list[Outcome] = [
        Generation("a", 5, 10),
        Generation("b", 5, 30),
        DeadlineExceeded("late"),
    ]
    row = summarize(3, [0.5, 1.5], outcomes)
    assert (row.requests, row.errors, row.batches) == (3, 1, 2)
    assert row.seconds == 2.0 and row.batch_p50_ms == 1000.0
    assert row.requests_per_s == 1.0 and row.tokens_per_s == 20.0
    assert row.mean_completion_tokens == 20.0


def test_the_table_says_what_batching_gained() -> None:
    one = summarize(1, [1.0], [Generation("a", 1, 10)])
    eight = summarize(8, [1.0], [Generation("a", 1, 10)] * 8)
    table = format_table([one, eight], "title")
    assert table.splitlines()[0] == "title"
    assert "batch 8 generates 8.0x the tokens per second of batch 1" in table


def test_batch_sizes_must_be_positive() -> None:
    assert _sizes("1,8,32") == [1, 8, 32]
    with pytest.raises(argparse.ArgumentTypeError):
        _sizes("0,8")
