"""``laneway bench pipeline``: how much of a backend's speed survives
Kafka and the lane worker.

The batch size is the one tuned for the model on this CPU (``laneway check
--tune``, ``workers.tune``; measured now and kept when none is), as the
bulk lane picks it; ``--batch`` names one instead. The same requests
(different prompts, greedy, the same ``max_tokens``) run twice, side by
side in one run: first on the backend called directly, in batches of that
size with that many in flight (``workers.measure.direct_rates``): the best
size called directly; then through the pipeline, as a plain aiokafka
producer at default settings puts them, already routed, on the bulk lane of
an embedded stack whose one bulk worker serves that model, and a plain
consumer reads the replies. That worker finds the kept tuning at start, as
any lane worker does, so the figure is "the lane worker at the tuned size
against the best size called directly" (target: 95%). Pipeline efficiency
is the pipeline's tokens/s over the direct tokens/s. The classifier is left
out on purpose, with the router and batch tracker (``laneway bench
classifier`` measures it): this is the worker's share, and they would take
CPU from it.
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
from workers.tune import keep, load_kept, tune_model

__all__ = ["HELP", "add_arguments", "run"]

HELP = (
    "one model called directly at its tuned batch size, then through Kafka and a bulk "
    "worker: efficiency"
)

TARGET = 0.95
"""The lane worker's tokens/s at the tuned size should be at least this
share of the best size called directly (issue 32)."""


def add_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("-n", "--requests", type=int, default=120)
    parser.add_argument("--max-tokens", type=int, default=16)
    parser.add_argument(
        "--path", choices=["light", "heavy"], default="heavy", help="which model answers"
    )
    parser.add_argument(
        "--batch",
        type=int,
        default=None,
        help="the bulk lane's batch size (default: the one tuned for the model on this CPU)",
    )
    parser.add_argument(
        "--inflight",
        type=int,
        default=None,
        help="batches in flight with --batch (default 2; tuned without --batch)",
    )


MODELS = {"light": AnswerPath.LIGHT, "heavy": AnswerPath.HEAVY}


def _child_env(
    settings: Settings, path: AnswerPath, model: str, batch: int, depth: int, tuned: bool
) -> dict[str, str]:
    """One bulk worker that serves ``model`` on ``path`` in batches of
    ``batch``, ``depth`` in flight: as the kept tuning sets them when
    ``tuned`` (the worker reads it at start), else set explicitly."""
    sizes = (
        {
            "LANEWAY_TUNE_USE_KEPT": "true",
            "LANEWAY_TUNE_AT_START": "false",
            "LANEWAY_TUNE_DIR": str(settings.tune.dir),
        }
        if tuned
        else {
            "LANEWAY_TUNE_USE_KEPT": "false",
            "LANEWAY_BULK_MAX_BATCH_SIZE": str(batch),
            "LANEWAY_BULK_MAX_INFLIGHT_BATCHES": str(depth),
            "LANEWAY_BACKEND_LLAMACPP_MAX_SEQUENCES": str(
                max(settings.backend.llamacpp_max_sequences, depth * batch)
            ),
        }
    )
    return {
        **sizes,
        "LANEWAY_APP_ID": f"pipeline-{uuid.uuid4().hex[:6]}",
        "LANEWAY_REDIS_KEY_PREFIX": f"pipeline-{uuid.uuid4().hex[:6]}",
        "LANEWAY_CACHE_ENABLED": "false",
        f"LANEWAY_BACKEND_{path.value.upper()}_MODEL": model,
        "LANEWAY_BULK_PATHS": json.dumps([path.value]),
        "LANEWAY_BULK_MAX_WAIT_MS": "200",
        "LANEWAY_BULK_NICE": "0",  # alone on the machine: the same priority as the direct run
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
    depth: int,
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
    if results and sizes[-1] > batch:
        print(
            f"through Kafka: the worker ran batches of up to {sizes[-1]}, not {batch}: "
            "it did not start with the tuning (its log says why)"
        )
    return Rate(f"{model} kafka", batch, depth, len(prompts), tokens, seconds, cpu, errors)


def _sizes(settings: Settings, model: str, args: argparse.Namespace) -> tuple[int, int, str]:
    """``(batch, in flight, where they come from)``: ``--batch``, else the
    kept tuning of ``model`` on this CPU as the bulk lane picks from it
    (measured now and kept when there is none)."""
    if args.batch is not None:
        return args.batch, args.inflight or 2, "given by --batch"
    tuning, where = load_kept(settings.tune.dir, model, settings.backend)
    if tuning is None:
        print(f"{model}: {where}; tuning it now (as `laneway check --tune` does)")
        tuning = asyncio.run(tune_model(settings.backend, model, settings.tune))
        where = f"measured now, kept at {keep(tuning, settings.tune.dir)}"
    pick, best = tuning.pick(settings.bulk.tune_tolerance), tuning.pick(0.0)
    return (
        pick.batch_size,
        pick.inflight,
        f"tuned on this CPU ({where}): {pick.tokens_per_s:.1f} tokens/s when tuned, "
        f"best {best.tokens_per_s:.1f} at {best.batch_size} x {best.inflight}, bulk "
        f"tolerance {settings.bulk.tune_tolerance:.0%}",
    )


def run(settings: Settings, args: argparse.Namespace) -> BenchRun:
    path = MODELS[args.path]
    model = (
        settings.backend.heavy_model if path == AnswerPath.HEAVY else settings.backend.light_model
    )
    if (args.batch is not None and args.batch < 1) or (
        args.inflight is not None and args.inflight < 1
    ):
        print("laneway bench: --batch and --inflight must be at least 1")
        return BenchRun(2)
    if args.inflight is not None and args.batch is None:
        print("laneway bench: --inflight goes with --batch (the tuning sets both)")
        return BenchRun(2)
    batch, depth, source = _sizes(settings, model, args)
    tuned = args.batch is None
    print(f"batch size {batch} x {depth} in flight, {source}")
    prompts = bench_prompts(args.requests)
    direct = asyncio.run(
        direct_rates(
            settings.backend, model, [batch], prompts, args.max_tokens, "llamacpp", (depth,)
        )
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
            child_env=_child_env(settings, path, model, batch, depth, tuned),
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
                    depth,
                    stack.child(f"worker-{Lane.BULK}").pid,
                )
            )
        finally:
            stack.stop()
    tokens = piped.tokens_per_s / direct.tokens_per_s if direct.tokens_per_s else 0.0
    requests = piped.requests_per_s / direct.requests_per_s if direct.requests_per_s else 0.0
    print(
        f"\nlaneway bench pipeline: {len(prompts)} different prompts on {model} ({path}), "
        f"greedy, max_tokens {args.max_tokens}, batches of {batch} with {depth} in flight "
        f"({'tuned' if tuned else '--batch'}); first called directly, then through Kafka and "
        f"one bulk worker (stack log: {log_dir / 'stack.log'})"
    )
    print(format_rates([direct, piped]))
    print(
        f"pipeline efficiency: {tokens:.0%} of direct tokens/s, {requests:.0%} of requests/s "
        f"(target for the tuned size: at least {TARGET:.0%})"
    )
    figures = {
        "batch_size": Figure(batch, "requests", f"the bulk lane's batch size ({source})"),
        "inflight_batches": Figure(depth, "batches", "batches in flight"),
        "direct_tokens_per_s": Figure(
            direct.tokens_per_s, "tokens/s", f"{model} called directly, {batch} x {depth}"
        ),
        "pipeline_tokens_per_s": Figure(
            piped.tokens_per_s, "tokens/s", f"{model} through Kafka and a bulk worker"
        ),
        "tokens_efficiency": Figure(tokens, "ratio", "pipeline tokens/s over direct"),
        "requests_efficiency": Figure(requests, "ratio", "pipeline requests/s over direct"),
    }
    return BenchRun(1 if direct.errors or piped.errors else 0, figures, notes=source)
