"""The layout's one hard rule: a lane worker imports the libraries under
``streams/`` (kafka, stores, cache, rules, ops), never a faust app."""

from __future__ import annotations

import subprocess
import sys


def test_workers_do_not_load_faust() -> None:
    code = (
        "import sys, workers.lane_worker, workers.serve, workers.retry;"
        "loaded = sorted(m for m in sys.modules if m == 'faust' or m.startswith('faust.'));"
        "print(loaded[:3]); sys.exit(1 if loaded else 0)"
    )
    done = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True)
    assert done.returncode == 0, f"workers load faust: {done.stdout} {done.stderr[-2000:]}"
