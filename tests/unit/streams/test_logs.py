"""Log lines as log shippers read them (``LANEWAY_LOG_FORMAT=json``)."""

from __future__ import annotations

import json
import logging
import sys

from streams.devstack.logs import JsonFormatter


def _record(message: str, *args: object, exc: bool = False) -> logging.LogRecord:
    info = None
    if exc:
        try:
            raise ValueError("boom")
        except ValueError:
            info = sys.exc_info()
    return logging.LogRecord("laneway.worker", logging.WARNING, __file__, 1, message, args, info)


def test_a_json_line_holds_time_level_logger_message_and_process() -> None:
    line = json.loads(JsonFormatter("worker").format(_record("batch of %d failed: %s", 8, "é")))
    assert line["level"] == "WARNING" and line["logger"] == "laneway.worker"
    assert line["message"] == "batch of 8 failed: é" and line["process"] == "worker"
    assert line["ts"].endswith("Z") and "T" in line["ts"]
    assert "exc" not in line


def test_an_exception_stays_inside_its_one_line() -> None:
    text = JsonFormatter("classifier").format(_record("failed", exc=True))
    assert "\n" not in text
    assert "ValueError: boom" in json.loads(text)["exc"]
