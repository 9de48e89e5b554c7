"""W3C traceparent: parsing, children, and the header on produced records."""

from __future__ import annotations

import dataclasses

import pytest

from streams.kafka.envelopes import Outbound
from streams.kafka.tracing import (
    TRACEPARENT,
    TraceParent,
    child_header,
    child_of,
    new_trace,
    parse,
    read,
    traced,
)

VALID = "00-4bf92f3577b34da6a3ce929d0e0e4736-00f067aa0ba902b7-01"


def test_parses_a_valid_header() -> None:
    assert parse(VALID) == TraceParent("4bf92f3577b34da6a3ce929d0e0e4736", "00f067aa0ba902b7", "01")
    assert parse(VALID.encode()) == parse(VALID)
    assert parse(VALID).format() == VALID  # type: ignore[union-attr]


@pytest.mark.parametrize(
    "value",
    [
        None,
        "",
        "garbage",
        VALID.upper(),  # hex is lowercase on the wire
        "00-00000000000000000000000000000000-00f067aa0ba902b7-01",  # zero trace id
        "00-4bf92f3577b34da6a3ce929d0e0e4736-0000000000000000-01",  # zero parent id
        "ff-4bf92f3577b34da6a3ce929d0e0e4736-00f067aa0ba902b7-01",  # forbidden version
        VALID + "-extra",  # version 00 is exactly 55 characters
        VALID[:-1],
        "00-4bf92f3577b34da6a3ce929d0e0e473-600f067aa0ba902b7-01",  # fields misplaced
        "00_4bf92f3577b34da6a3ce929d0e0e4736_00f067aa0ba902b7_01",
        b"\xff\xfe",
    ],
)
def test_rejects_invalid_headers(value: str | bytes | None) -> None:
    assert parse(value) is None


def test_a_later_version_is_read_by_its_first_fields() -> None:
    later = "cc" + VALID[2:]
    assert parse(later + "-what-comes-next") == parse(VALID)
    assert parse(later + "x") is None  # more must follow a dash


def test_child_keeps_trace_and_flags_with_a_new_span() -> None:
    parent = TraceParent("4bf92f3577b34da6a3ce929d0e0e4736", "00f067aa0ba902b7", "00")
    child = parent.child()
    assert (child.trace_id, child.flags) == (parent.trace_id, parent.flags)
    assert child.span_id != parent.span_id
    assert parse(child.format()) == child


def test_read_finds_the_header_in_any_spelling() -> None:
    headers = [("laneway-attempt", b"2"), ("TraceParent", VALID.encode())]
    assert read(headers) == parse(VALID)
    assert read(None) is None
    assert read([("laneway-attempt", b"2")]) is None


def test_no_or_an_invalid_header_starts_a_new_sampled_trace() -> None:
    for headers in (None, [], [(TRACEPARENT, b"nonsense")]):
        started = child_of(headers)
        assert parse(started.format()) == started
        assert started.flags == "01"
    assert new_trace().trace_id != new_trace().trace_id


def test_child_header_of_a_valid_parent() -> None:
    name, value = child_header([(TRACEPARENT, VALID.encode())])
    child = parse(value)
    assert name == TRACEPARENT and child is not None
    assert child.trace_id == "4bf92f3577b34da6a3ce929d0e0e4736"
    assert child.span_id != "00f067aa0ba902b7"


def test_traced_replaces_any_traceparent_and_keeps_other_headers() -> None:
    header = (TRACEPARENT, VALID.encode())
    records = [
        Outbound("t", b"k", b"v"),
        Outbound("t", b"k", b"v", (("laneway-attempt", b"2"), ("traceparent", b"old")), 3),
    ]
    out = traced(records, header)
    assert out[0].headers == (header,)
    assert out[1].headers == (("laneway-attempt", b"2"), header)
    assert [(r.topic, r.key, r.value) for r in out] == [("t", b"k", b"v")] * 2
    assert [r.partition for r in out] == [None, 3]
    # traced builds each Outbound field by field: a new field must be added there
    assert [f.name for f in dataclasses.fields(Outbound)] == [
        "topic",
        "key",
        "value",
        "headers",
        "partition",
    ]
