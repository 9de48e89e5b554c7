"""How a laneway process logs: text lines for people, or one JSON object
per line for log shippers (``LANEWAY_LOG_FORMAT=json``), at
``LANEWAY_LOG_LEVEL``.

A JSON line holds ``ts`` (UTC, ISO 8601 with milliseconds), ``level``,
``logger``, ``message``, ``process`` (the ``laneway`` command that runs,
e.g. ``worker`` or ``classifier``) and, for an exception, ``exc``.
"""

from __future__ import annotations

import json
import logging
import sys
from datetime import UTC, datetime
from typing import Literal

__all__ = ["TEXT_FORMAT", "JsonFormatter", "configure_logging"]

TEXT_FORMAT = "%(asctime)s %(levelname)-7s %(name)s: %(message)s"

LogFormat = Literal["text", "json"]


class JsonFormatter(logging.Formatter):
    def __init__(self, process: str) -> None:
        super().__init__()
        self._process = process

    def format(self, record: logging.LogRecord) -> str:
        ts = datetime.fromtimestamp(record.created, UTC)
        line: dict[str, object] = {
            "ts": ts.isoformat(timespec="milliseconds").replace("+00:00", "Z"),
            "level": record.levelname,
            "logger": record.name,
            "message": record.getMessage(),
            "process": self._process,
        }
        if record.exc_info:
            line["exc"] = self.formatException(record.exc_info)
        return json.dumps(line, ensure_ascii=False)


def configure_logging(level: str, fmt: LogFormat, process: str) -> None:
    """Set up the root logger once for the whole process (faust is told not
    to override it)."""
    handler = logging.StreamHandler(sys.stderr)
    formatter = JsonFormatter(process) if fmt == "json" else logging.Formatter(TEXT_FORMAT)
    handler.setFormatter(formatter)
    logging.basicConfig(level=level, handlers=[handler], force=True)
