"""``laneway bench pipeline``: how much of a backend's speed survives
Kafka and the lane worker.

The same requests (different prompts, greedy, the same ``max_tokens``) run
twice, side by side in one run: first on the backend called directly, in
batches of the lane's size with two in flight as a lane worker keeps them
(``streams.bench.backend.direct_rates``); then through the pipeline,
as a plain aiokafka producer at default settings puts them, already routed,
on the bulk lane of an embedded stack whose one bulk worker serves that
model, and a plain consumer reads the replies. Pipeline efficiency is the
pipeline's tokens/s over the direct tokens/s. The classifier is left out on
purpose, with the router and batch tracker (``laneway bench classifier``
measures it): this is the worker's share, and they would take CPU from it.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import tempfile
import time
import uuid
from pathlib import Path

from aiokafka import AIOKafkaConsumer, AIOKafkaProducer

from schemas.messages import AnswerPath, InferenceRequest, InferenceResult, Lane, RoutedRequest
from schemas.settings import Settings
from streams.bench.backend import Rate, bench_prompts, direct_rates, format_rates
from streams.bench.classifier import cpu_seconds
from streams.bench.results import BenchRun, Figure
from streams.devstack.supervisor import Stack

__all__ = ["HELP", "add_arguments", "run"]

HELP = "one model called directly, then through Kafka and a bulk worker: efficiency"


def add_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("-n", "--requests", type=int, default=120)
    parser.add_argument("--max-tokens", type=int, default=16)
    parser.add_argument(
        "--path", choices=["light", "heavy"], default="heavy", help="which model answers"
    )
    parser.add_argument("--batch", type=int, default=8, help="the bulk lane's batch size")


MODELS = {"light": AnswerPath.LIGHT, "heavy": AnswerPath.HEAVY}


def _child_env(settings: Settings, path: AnswerPath, model: str, batch: int) -> dict[str, str]:
    """One bulk worker that serves ``model`` on ``path`` in batches of ``batch``."""
    return {
        "LANEWAY_APP_ID": f"pipeline-{uuid.uuid4().hex[:6]}",
        "LANEWAY_REDIS_KEY_PREFIX": f"pipeline-{uuid.uuid4().hex[:6]}",
        "LANEWAY_CACHE_ENABLED": "false",
        f"LANEWAY_BACKEND_{path.value.upper()}_MODEL": model,
        "LANEWAY_BULK_PATHS": json.dumps([path.value]),
        "LANEWAY_BULK_MAX_BATCH_SIZE": str(batch),
        "LANEWAY_BULK_MAX_WAIT_MS": "200",
        "LANEWAY_BULK_NICE": "0",  # alone on the machine: the same priority as the direct run
        "LANEWAY_BACKEND_LLAMACPP_MAX_SEQUENCES": str(
            max(settings.backend.llamacpp_max_sequences, 2 * batch)
        ),
        "LANEWAY_FLOW_ENABLED": "false",
        "LANEWAY_LOG_LEVEL": "WARNING",
    }


async def _through_kafka(
    settings: Settings,
    path: AnswerPath,
    model: str,
    prompts: list[str],
    max_tokens: int,
    batch: int,
    worker_pid: int | None,
) -> Rate:
    """The requests through Kafka and the bulk worker (process ``worker_pid``,
    whose CPU time the rate counts; ``None``: not counted)."""
    reply_to = f"{settings.replies_topic}.pipeline-{uuid.uuid4().hex[:6]}"
    lane_topic = settings.lane_topic(Lane.BULK)
    # Plain clients at default settings, as a user's would be.
    producer = AIOKafkaProducer(bootstrap_servers=settings.kafka.bootstrap)
    consumer = AIOKafkaConsumer(
        reply_to, bootstrap_servers=settings.kafka.bootstrap, auto_offset_reset="earliest"
    )
    await producer.start()
    await consumer.start()
    try:

        def routed(rid: str, prompt: str) -> bytes:
            now = int(time.time() * 1000)
            request = InferenceRequest(
                id=rid, prompt=prompt, max_tokens=max_tokens, batch_id="pipeline"
            )
            return (
                RoutedRequest(
                    request=request,
                    lane=Lane.BULK,
                    path=path,
                    reply_to=reply_to,
                    produced_at_ms=now,
                    routed_at_ms=now,
                )
                .model_dump_json()
                .encode()
            )

        async def run(tag: str, batch_prompts: list[str]) -> tuple[list[InferenceResult], float]:
            ids = {f"{tag}-{i}" for i in range(len(batch_prompts))}
            started = time.perf_counter()
            for i, prompt in enumerate(batch_prompts):
                rid = f"{tag}-{i}"
                await producer.send(lane_topic, routed(rid, prompt), key=rid.encode())
            await producer.flush()
            results: dict[str, InferenceResult] = {}
            deadline = time.monotonic() + 600
            while ids - results.keys() and time.monotonic() < deadline:
                polled = await consumer.getmany(timeout_ms=500)
                for records in polled.values():
                    for record in records:
                        result = InferenceResult.model_validate_json(record.value)
                        if result.id in ids:
                            results.setdefault(result.id, result)
            return list(results.values()), time.perf_counter() - started

        await run("warm", prompts[:2])  # the reply topic's metadata, the first decode
        cpu_before = cpu_seconds(worker_pid)
        results, seconds = await run(f"run-{uuid.uuid4().hex[:4]}", prompts)
        cpu_after = cpu_seconds(worker_pid)
    finally:
        await consumer.stop()
        await producer.stop()
    tokens = sum(r.usage.completion_tokens for r in results if r.usage is not None)
    errors = len(prompts) - sum(r.status == "ok" for r in results)
    sizes = sorted(r.timings.batch_size for r in results)
    queued = sorted(r.timings.queue_ms for r in results)
    if results:
        print(
            f"through Kafka: batch sizes the worker ran {sizes[0]}..{sizes[-1]} (median "
            f"{sizes[len(sizes) // 2]}); time in the lane before a batch ran, median "
            f"{queued[len(queued) // 2]:.0f} ms"
        )
    cpu = cpu_after - cpu_before if cpu_before is not None and cpu_after is not None else 0.0
    return Rate(f"{model} kafka", batch, 2, len(prompts), tokens, seconds, cpu, errors)


def run(settings: Settings, args: argparse.Namespace) -> BenchRun:
    path = MODELS[args.path]
    model = (
        settings.backend.heavy_model if path == AnswerPath.HEAVY else settings.backend.light_model
    )
    batch = args.batch
    prompts = bench_prompts(args.requests)
    direct = asyncio.run(
        direct_rates(settings.backend, model, [batch], prompts, args.max_tokens, "llamacpp", (2,))
    )[0]
    log_dir = Path(tempfile.mkdtemp(prefix="laneway-pipeline-"))
    with open(log_dir / "stack.log", "w") as out:
        stack = Stack(
            settings,
            use_external_redis=False,
            http_port_base=None,
            lanes=(Lane.BULK,),
            out=out,
            log_dir=log_dir,
            child_env=_child_env(settings, path, model, batch),
            workers_only=True,
        )
        try:
            stack.start(ready_timeout_s=300)
            piped = asyncio.run(
                _through_kafka(
                    stack.settings,
                    path,
                    model,
                    prompts,
                    args.max_tokens,
                    batch,
                    stack.child(f"worker-{Lane.BULK}").pid,
                )
            )
        finally:
            stack.stop()
    tokens = piped.tokens_per_s / direct.tokens_per_s if direct.tokens_per_s else 0.0
    requests = piped.requests_per_s / direct.requests_per_s if direct.requests_per_s else 0.0
    print(
        f"\nlaneway bench pipeline: {len(prompts)} different prompts on {model} ({path}), "
        f"greedy, max_tokens {args.max_tokens}, batches of {batch} with two in flight; "
        "first called directly, then through Kafka and one bulk worker (stack log: "
        f"{log_dir / 'stack.log'})"
    )
    print(format_rates([direct, piped]))
    print(f"pipeline efficiency: {tokens:.0%} of direct tokens/s, {requests:.0%} of requests/s")
    figures = {
        "direct_tokens_per_s": Figure(direct.tokens_per_s, "tokens/s", f"{model} called directly"),
        "pipeline_tokens_per_s": Figure(
            piped.tokens_per_s, "tokens/s", f"{model} through Kafka and a bulk worker"
        ),
        "tokens_efficiency": Figure(tokens, "ratio", "pipeline tokens/s over direct"),
        "requests_efficiency": Figure(requests, "ratio", "pipeline requests/s over direct"),
    }
    return BenchRun(1 if direct.errors or piped.errors else 0, figures)
