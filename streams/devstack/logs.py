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
from pathlib import Path
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


def configure_logging(
    level: str, fmt: LogFormat, process: str, log_file: Path | None = None
) -> None:
    """Set up the root logger once for the whole process (faust is told not
    to override it). ``log_file``: the log goes there, and the console gets
    warnings and errors only (``laneway up`` and ``demo`` keep it quiet)."""
    formatter = JsonFormatter(process) if fmt == "json" else logging.Formatter(TEXT_FORMAT)
    console = logging.StreamHandler(sys.stderr)
    console.setFormatter(formatter)
    handlers: list[logging.Handler] = [console]
    if log_file is not None:
        console.setLevel(logging.WARNING)
        log_file.parent.mkdir(parents=True, exist_ok=True)
        to_file = logging.FileHandler(log_file)
        to_file.setFormatter(formatter)
        handlers.append(to_file)
    logging.basicConfig(level=level, handlers=handlers, force=True)
