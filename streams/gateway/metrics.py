"""The gateway's Prometheus metrics (served on ``/metrics`` with the rest)."""

from __future__ import annotations

from prometheus_client import Counter, Histogram

__all__ = [
    "BATCH_SUBMISSIONS",
    "FEEDBACK",
    "REQUESTS",
    "REQUEST_SECONDS",
    "TIME_TO_FIRST_BYTE",
    "TOKENS",
]

REQUESTS = Counter(
    "laneway_gateway_requests_total",
    "HTTP requests the gateway answered, by endpoint and status",
    ["endpoint", "status"],
)
REQUEST_SECONDS = Histogram(
    "laneway_gateway_request_seconds",
    "HTTP requests: from receipt to the last byte of the answer, by endpoint and status",
    ["endpoint", "status"],
    buckets=(0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1, 2.5, 5, 10, 30, 60, 120),
)
TIME_TO_FIRST_BYTE = Histogram(
    "laneway_gateway_time_to_first_byte_seconds",
    "Streamed (SSE) answers: from receipt of the request to its first byte sent",
    ["endpoint"],
    buckets=(0.01, 0.02, 0.04, 0.06, 0.08, 0.1, 0.15, 0.2, 0.3, 0.5, 0.75, 1, 1.5, 2, 3, 5, 10, 30),
)
TOKENS = Counter(
    "laneway_gateway_tokens_total",
    "Tokens (prompt + completion) of answers the gateway passed on, counted against tenants",
    ["tenant"],
)
FEEDBACK = Counter(
    "laneway_gateway_feedback_total",
    "Verdicts on answers (POST /v1/feedback) produced onto the feedback topic",
)
BATCH_SUBMISSIONS = Counter(
    "laneway_gateway_batch_submissions_total",
    "Batch submissions a replica ran, by how they ended "
    "(submitted, resumed, cancelled, failed, interrupted)",
    ["outcome"],
)
