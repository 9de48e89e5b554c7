"""A real, short bench run writes a result file that validates against
benchmarks/result.schema.json, with its figures and its curve."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import jsonschema

from streams.bench.results import SCHEMA_FILE


def test_the_backend_bench_writes_a_result_file_that_validates(tmp_path: Path) -> None:
    out = tmp_path / "result.json"
    argv = ["bench", "backend", "--models", "smollm2-135m", "--batch-sizes", "1,2"]
    argv += ["--max-tokens", "4", "--result", str(out)]
    env = {k: v for k, v in os.environ.items() if not k.startswith("LANEWAY_")}
    done = subprocess.run(
        [sys.executable, "-m", "streams.cli.main", *argv],
        capture_output=True,
        text=True,
        env={**env, "LANEWAY_BACKEND_N_THREADS": "1"},
        timeout=600,
    )
    assert done.returncode == 0, done.stdout[-2000:] + done.stderr[-2000:]
    assert f"result: {out}" in done.stdout
    result = json.loads(out.read_text())
    jsonschema.Draft202012Validator(json.loads(SCHEMA_FILE.read_text())).validate(result)
    assert result["benchmark"] == "backend"
    # The command to measure the same again: where the file went is left out.
    assert result["command"] == "laneway " + " ".join(argv[:-2])
    assert result["cpu"]["cores"] == os.cpu_count()
    figures = result["figures"]
    assert figures["smollm2_135m_batch1_inflight1_tokens_per_s"]["value"] > 0
    assert figures["smollm2_135m_batch2_refill_tokens_per_s"]["unit"] == "tokens/s"
    curve = result["series"]["tokens_per_s_vs_batch"]
    assert [x for x, _ in curve["points"]] == [1, 2] and all(y > 0 for _, y in curve["points"])
