"""``laneway demo`` (what ``make run`` runs): start the embedded stack, ask
sample questions that land on every lane and path, print the answers, stop."""

from __future__ import annotations

import asyncio
import signal
import sys
from pathlib import Path
from typing import Any

from schemas.settings import Settings
from streams.client import LanewayClient, result_summary
from streams.devstack.supervisor import Stack, recorded

__all__ = ["SAMPLES", "run_demo"]

SAMPLES: list[tuple[str, dict[str, Any]]] = [
    ("Hello!", {}),  # a rule owns it: answered by the classifier
    ("What is the capital of France?", {"deadline_ms": 20_000}),  # short: light model, realtime
    ("Explain why the sky is blue.", {}),  # reasoning: heavy model, medium lane
    ("What colours are on the flag of France?", {"batch_id": "demo-batch"}),  # bulk lane
]


async def _ask_all(settings: Settings) -> int:
    failures = 0
    async with LanewayClient(settings.kafka, client_id="demo") as client:
        results = await asyncio.gather(
            *(
                client.ask(prompt, max_tokens=48, timeout_s=120, **fields)
                for prompt, fields in SAMPLES
            )
        )
    for (prompt, _), result in zip(SAMPLES, results, strict=True):
        print(f"\n> {prompt}\n{result_summary(result)}", flush=True)
        failures += result.status != "ok"
    return failures


def run_demo(settings: Settings, log_path: Path | None, stack_file: Path) -> int:
    """``log_path``: where the stack's logs go (``None``: on the console);
    ``stack_file``: where the stack is recorded while it runs."""
    stack = Stack(
        settings,
        use_external_redis="url" in settings.redis.model_fields_set,
        http_port_base=None,
        log_path=log_path,
    )
    signal.signal(signal.SIGTERM, lambda signum, frame: sys.exit(128 + signum))
    with recorded(stack, stack_file, replace=False):
        failures = asyncio.run(_ask_all(stack.settings))
    print(f"\ndemo finished: {len(SAMPLES) - failures}/{len(SAMPLES)} answered ok", file=sys.stderr)
    return 1 if failures else 0
