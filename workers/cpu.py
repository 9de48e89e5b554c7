"""Which CPU this is: the first processor's model name, family and model
number, and a slug of them for file names. A benchmark result file records
it (``streams.bench.results``), and a kept batch-size tuning is keyed by it
(``workers.tune``): a figure measured on one CPU says little of another.
"""

from __future__ import annotations

import os
import re
from collections.abc import Mapping
from pathlib import Path
from typing import Any

__all__ = ["cpu_info", "cpu_slug"]


def cpu_info(cpuinfo: Path = Path("/proc/cpuinfo")) -> dict[str, Any]:
    """The first CPU's ``model name``, ``cpu family`` and ``model`` from
    ``cpuinfo``, and ``os.cpu_count()`` (unknown parts: ``None``)."""
    fields: dict[str, str] = {}
    try:
        text = cpuinfo.read_text()
    except OSError:
        text = ""
    for line in text.splitlines():
        if not line.strip():
            if fields:
                break  # the first processor's block is enough
            continue
        key, _, value = line.partition(":")
        fields.setdefault(key.strip(), value.strip())

    def number(key: str) -> int | None:
        value = fields.get(key, "")
        return int(value) if value.isdigit() else None

    return {
        "model": fields.get("model name") or "unknown",
        "family": number("cpu family"),
        "model_number": number("model"),
        "cores": os.cpu_count() or 1,
    }


def cpu_slug(cpu: Mapping[str, Any]) -> str:
    """The CPU model lower-cased, non-alphanumerics as ``-``; with
    ``-f<family>m<model>`` when the model string names no model number
    (``Intel(R) Xeon(R) Processor`` is many CPUs)."""
    slug = re.sub(r"[^a-z0-9]+", "-", str(cpu.get("model", "unknown")).lower()).strip("-")
    generic = not re.search(r"\d", slug)
    if generic and cpu.get("family") is not None and cpu.get("model_number") is not None:
        slug += f"-f{cpu['family']}m{cpu['model_number']}"
    return slug or "unknown"
