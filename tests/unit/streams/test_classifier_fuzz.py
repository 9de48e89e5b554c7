"""Property: whatever bytes arrive on the request topic, the classifier
returns a decision (never raises), every record it rejects lands on the DLQ
with its original bytes, and every parseable request is routed or answered."""

import json

from hypothesis import given, settings
from hypothesis import strategies as st

from schemas.messages import InferenceResult
from schemas.settings import Settings
from streams.classify.classifier import SourceRecord, classify_record
from streams.rules.engine import RuleBook

SETTINGS = Settings()
RULES = RuleBook()
NOW = 1_700_000_000_000

json_values = st.recursive(
    st.none() | st.booleans() | st.integers() | st.floats(allow_nan=False) | st.text(max_size=20),
    lambda inner: (
        st.lists(inner, max_size=4) | st.dictionaries(st.text(max_size=10), inner, max_size=4)
    ),
    max_leaves=12,
)
field_values = {
    "id": st.text(max_size=140) | st.integers(),
    "prompt": st.text(max_size=200) | st.none() | st.integers(),
    "messages": st.none()
    | st.lists(
        st.fixed_dictionaries(
            {
                "role": st.sampled_from(["user", "system", "assistant", "tool"]),
                "content": st.text(max_size=40),
            }
        ),
        max_size=3,
    ),
    "max_tokens": st.integers(min_value=-5, max_value=5000),
    "temperature": st.floats(min_value=-1, max_value=3, allow_nan=False),
    "deadline_ms": st.none() | st.integers(min_value=-10, max_value=10_000),
    "lane": st.none() | st.sampled_from(["realtime", "medium", "bulk", "express"]),
    "reply_to": st.none()
    | st.sampled_from(["laneway.replies", "laneway.replies.a", "laneway.dlq", "x"]),
    "batch_id": st.none() | st.text(max_size=10),
    "tenant": st.none() | st.text(max_size=10),
    "schema_version": st.sampled_from([1, 1, 1, 2]),
}
mutated_requests = st.fixed_dictionaries({}, optional=field_values).map(
    lambda fields: json.dumps({"id": "req-1", "prompt": "What is 2+2?", **fields}).encode()
)
LANE_TOPICS = {"laneway.lane.realtime", "laneway.lane.medium", "laneway.lane.bulk"}


def check(raw: bytes, age_ms: int) -> None:
    record = SourceRecord(raw, b"k", NOW - age_ms, "laneway.requests", 0, 7)
    out = classify_record(record, now_ms=NOW, settings=SETTINGS, rules=RULES)
    topics = [r.topic for r in out.records]
    if out.outcome == "rejected":
        assert topics[0] == "laneway.dlq" and out.records[0].value == raw
        assert all(t.startswith("laneway.") and t != "laneway.requests" for t in topics)
    elif out.outcome == "routed":
        assert topics == [
            f"laneway.lane.{lane}"
            for lane in ("realtime", "medium", "bulk")
            if topics[0].endswith(lane)
        ]
    else:
        result = InferenceResult.model_validate_json(out.records[0].value)
        assert out.result == result
        assert topics[0].startswith("laneway.replies")
        assert topics[1:] == ["laneway.results", "laneway.quality"]


@settings(max_examples=1500, deadline=None)
@given(st.binary(max_size=300), st.integers(min_value=0, max_value=20_000))
def test_random_bytes(raw: bytes, age_ms: int) -> None:
    check(raw, age_ms)


@settings(max_examples=1500, deadline=None)
@given(mutated_requests, st.integers(min_value=0, max_value=20_000))
def test_mutated_requests(raw: bytes, age_ms: int) -> None:
    check(raw, age_ms)


@settings(max_examples=300, deadline=None)
@given(json_values)
def test_arbitrary_json(value: object) -> None:
    check(json.dumps(value).encode(), 0)
