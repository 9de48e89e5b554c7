"""The ``laneway`` command. Settings are built once here, from the
environment (``LANEWAY_*``) plus the command's flags, and passed down."""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import logging
import signal
import sys
import time
from collections.abc import Callable, Iterator, Sequence
from pathlib import Path
from typing import Any

from schemas.messages import Lane
from schemas.settings import Settings
from streams.ops import OpsServer, ProcessState
from streams.tools.logs import configure_logging

__all__ = ["main"]

log = logging.getLogger("laneway")


def _parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(prog="laneway", description=__doc__)
    parser.add_argument("--bootstrap", help="Kafka bootstrap (overrides LANEWAY_KAFKA_BOOTSTRAP)")
    sub = parser.add_subparsers(dest="command", required=True)

    topics = sub.add_parser("topics", help="manage the topic registry")
    topics.add_argument("action", choices=["create", "list"])

    schema = sub.add_parser("schema", help="export the JSON Schema of every wire message")
    schema.add_argument(
        "--out", default=None, help="folder to write to (default: the package's schemas/json)"
    )

    top = sub.add_parser("top", help="a live view of a running stack (lanes, paths, cache, flow)")
    top.add_argument("--once", action="store_true", help="print one snapshot and exit")
    top.add_argument("--json", action="store_true", help="with --once: the snapshot as JSON")
    top.add_argument("--interval", type=float, default=1.0, help="seconds between reads")
    top.add_argument("--window", type=float, default=30.0, help="seconds rates cover (live)")
    top.add_argument(
        "--metrics",
        action="append",
        metavar="URL",
        help="a process's /metrics address, repeatable (default: those of `laneway up`)",
    )
    top.add_argument(
        "--http-port-base", type=int, default=9400, help="the `laneway up` port base to read"
    )
    sub.add_parser("classifier", help="run the classifier agent (faust)")
    sub.add_parser("router", help="run the quality loop that keeps the route statistics (faust)")

    worker = sub.add_parser("worker", help="run one lane worker")
    worker.add_argument("--lane", required=True, choices=[lane.value for lane in Lane])
    worker.add_argument(
        "--drain-s", type=float, default=30.0, help="grace for the batch in flight on SIGTERM"
    )

    up = sub.add_parser("up", help="embedded broker + Redis + classifier + workers, supervised")
    up.add_argument(
        "--kafka-port", type=int, default=None, help="embedded broker port (default: free)"
    )
    up.add_argument(
        "--redis-port", type=int, default=None, help="embedded Valkey port (default: free)"
    )
    up.add_argument(
        "--http-port-base", type=int, default=9400, help="classifier port; workers follow"
    )
    up.add_argument(
        "--gateway-port",
        type=int,
        default=None,
        help="the OpenAI-compatible API's port (default: LANEWAY_GATEWAY_PORT, 8080; 0: free)",
    )
    up.add_argument("--no-gateway", action="store_true", help="start no HTTP gateway")
    _add_log_arguments(up)

    ask = sub.add_parser("ask", help="ask one question through a running stack")
    ask.add_argument("prompt")
    ask.add_argument("--lane", choices=[lane.value for lane in Lane])
    ask.add_argument("--deadline-ms", type=int)
    ask.add_argument("--max-tokens", type=int, default=64)
    ask.add_argument("--timeout-s", type=float, default=120.0)
    ask.add_argument(
        "--stream", action="store_true", help="print the answer as it is generated, then its result"
    )

    from streams.tools.distill_cli import add_distill_parser

    add_distill_parser(sub)

    bench = sub.add_parser("bench", help="drive a mixed workload and print latency/throughput")
    bench.add_argument("-n", "--requests", type=int, default=120)
    _add_log_arguments(bench)
    bench.add_argument(
        "--embedded", action="store_true", help="start an embedded stack for the run"
    )
    bench.add_argument("--max-tokens", type=int, default=16)
    bench.add_argument("--concurrency", type=int, default=16, help="requests in flight at once")
    bench.add_argument("--overload", action="store_true", help="offer 1x/2x/3x capacity, open loop")
    bench.add_argument(
        "--stream",
        action="store_true",
        help="the mix with stream: true: time to first token beside the total, per lane and path",
    )
    bench.add_argument(
        "--stream-cost",
        action="store_true",
        help="model answers' tokens/s streamed against not streamed, alternated on one stack",
    )
    bench.add_argument(
        "--rounds", type=int, default=2, help="--stream-cost: legs of each kind, alternated"
    )
    bench.add_argument(
        "--lane",
        choices=[lane.value for lane in Lane],
        default="medium",
        help="--stream-cost: the lane its requests ask for",
    )
    bench.add_argument(
        "--client",
        choices=["sdk", "plain"],
        default="sdk",
        help="the mix, --overload, --compare: the SDK, or plain aiokafka at default settings",
    )
    bench.add_argument(
        "--compare",
        action="store_true",
        help="hybrid engine vs every request on the heavy path, two embedded stacks in one run",
    )
    bench.add_argument(
        "--burst",
        type=int,
        metavar="N",
        help="four questions N times each at once, with and without decode marks, "
        "two embedded stacks in one run",
    )
    bench.add_argument(
        "--realtime-workers",
        type=int,
        default=1,
        metavar="N",
        help="--embedded: N realtime workers in one group (LANEWAY_KAFKA_PARTITIONS split them)",
    )
    bench.add_argument("--window-s", type=float, default=15.0, help="--overload: seconds per step")
    bench.add_argument(
        "--deadline-ms", type=int, default=20_000, help="--overload: request deadline"
    )
    bench.add_argument(
        "--settle-s", type=float, default=5.0, help="--overload: pause between steps"
    )
    bench.add_argument(
        "--classifier",
        action="store_true",
        help="one classifier process alone: rule, exact-cache and semantic answers per second",
    )
    bench.add_argument(
        "--batch",
        type=int,
        metavar="N",
        help="an N-line batch job: its throughput, and realtime p99 without and with it",
    )
    bench.add_argument(
        "--rt-rps", type=float, default=2.0, help="--batch: realtime requests per second"
    )
    bench.add_argument(
        "--backend",
        choices=["llamacpp"],
        help="call the backend directly, no Kafka: tokens/s per batch size of each CPU model",
    )
    bench.add_argument(
        "--batch-sizes", default="1,2,4,8,16", help="--backend: batch sizes, comma-separated"
    )
    bench.add_argument(
        "--modes",
        default="invariant",
        help="--backend llamacpp: invariant and/or fast (LANEWAY_BACKEND_LLAMACPP_BATCH_INVARIANT)",
    )
    bench.add_argument(
        "--models",
        default="",
        help="--backend: which wheel-shipped models, comma-separated (default: all)",
    )
    bench.add_argument(
        "--pipeline",
        action="store_true",
        help="one model called directly, then through Kafka and a bulk worker: efficiency",
    )
    bench.add_argument(
        "--path",
        choices=["light", "heavy"],
        default="heavy",
        help="--pipeline, --stream-cost: which model",
    )
    bench.add_argument(
        "--pipeline-batch", type=int, default=8, help="--pipeline: the bulk lane's batch size"
    )
    from streams.tools.bench_router import add_router_arguments

    add_router_arguments(bench)

    prewarm = sub.add_parser(
        "prewarm", help="refresh the cache entries of the most asked questions (nightly)"
    )
    prewarm.add_argument("--top", type=int, help="at most this many (LANEWAY_PREWARM_TOP)")
    prewarm.add_argument("--min-count", type=int, help="asked at least this often")
    prewarm.add_argument("--days", type=int, help="ranked over this many days")
    prewarm.add_argument("--json", action="store_true", help="print the report as JSON")

    demo = sub.add_parser(
        "demo", help="start the embedded stack, ask a question on every lane, stop"
    )
    _add_log_arguments(demo)

    from streams.jobs.commands import add_batch_parser

    add_batch_parser(sub)
    from streams.tools.models_cli import add_models_parser

    add_models_parser(sub)
    from streams.gateway.cli import add_gateway_parser, add_keys_parser

    add_gateway_parser(sub)
    add_keys_parser(sub)
    from streams.doctor.cli import add_doctor_parser

    add_doctor_parser(sub)
    check = sub.add_parser("check", help="load every configured model and run one inference each")
    check.add_argument(
        "--path", action="append", help="a model path to check (repeatable); default: every path"
    )
    check.add_argument("--json", action="store_true")
    return parser


def _add_log_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument(
        "-v",
        "--verbose",
        action="store_true",
        help="show every process's log on the console instead of short status lines",
    )
    parser.add_argument(
        "--log-file",
        type=Path,
        default=None,
        help="where the processes' logs go (default: ~/.cache/laneway/logs/<command>-<time>.log)",
    )


def _log_path(args: argparse.Namespace) -> Path | None:
    """Where ``up``/``demo`` write their processes' logs; ``None`` with ``-v``
    (they go to the console)."""
    if args.verbose:
        return None
    if args.log_file is not None:
        return Path(args.log_file)
    stamp = time.strftime("%Y%m%d-%H%M%S")
    return Path.home() / ".cache" / "laneway" / "logs" / f"{args.command}-{stamp}.log"


def _quiet(settings: Settings, args: argparse.Namespace) -> Path | None:
    """Unless ``-v``: this process's log joins its children's in the log
    file, and the console keeps status lines, warnings and errors."""
    path = _log_path(args)
    if path is not None:
        configure_logging(settings.log_level, settings.log_format, args.command, path)
    return path


def main(argv: Sequence[str] | None = None) -> int:
    args = _parser().parse_args(argv)
    settings = Settings()
    if args.bootstrap:
        settings = settings.model_copy(
            update={"kafka": settings.kafka.model_copy(update={"bootstrap": args.bootstrap})}
        )
    configure_logging(settings.log_level, settings.log_format, args.command)
    return int(_COMMANDS[args.command](settings, args) or 0)


def _topics(settings: Settings, args: argparse.Namespace) -> int:
    from streams.kafka.topics import create_topics, topic_specs, wait_for_broker

    if args.action == "list":
        for spec in topic_specs(settings):
            print(f"{spec.name:40} {spec.partitions:3}  {spec.purpose}")
        return 0

    async def create() -> None:
        await wait_for_broker(settings)
        for spec in await create_topics(settings):
            print(f"{spec.name} ({spec.partitions} partitions)")

    asyncio.run(create())
    return 0


@contextlib.contextmanager
def _ops_endpoints(settings: Settings) -> Iterator[ProcessState]:
    """/metrics, /healthz and /readyz for the life of a long-running process."""
    state = ProcessState(stall_s=settings.loop_stall_s)
    ops = (
        OpsServer(settings.http_host, settings.http_port, state).start()
        if settings.http_port
        else None
    )
    try:
        yield state
    finally:
        if ops is not None:
            ops.close()


def _classifier(settings: Settings, args: argparse.Namespace) -> int:
    from streams.classify.app import build_app

    return _run_faust(settings, build_app)


def _router(settings: Settings, args: argparse.Namespace) -> int:
    from streams.quality.loop import build_quality_app

    return _run_faust(settings, build_quality_app)


def _run_faust(settings: Settings, build: Callable[[Settings, ProcessState], Any]) -> int:
    """Serve the ops endpoints and run a faust app until it is stopped."""
    import faust

    with _ops_endpoints(settings) as state:
        app = build(settings, state)
        worker = faust.Worker(app, loglevel=settings.log_level, override_logging=False)
        worker.spinner = None  # escape codes in a log file or a pipe help no one
        worker.execute_from_commandline()  # returns through SystemExit on stop
    return 0


def _worker(settings: Settings, args: argparse.Namespace) -> int:
    from workers.serve import serve_lane

    with _ops_endpoints(settings) as state:
        asyncio.run(serve_lane(settings, Lane(args.lane), state, args.drain_s))
    return 0


def _up(settings: Settings, args: argparse.Namespace) -> int:
    from streams.tools.supervisor import Stack

    stack = Stack(
        settings,
        kafka_port=args.kafka_port,
        redis_port=args.redis_port,
        use_external_redis="url" in settings.redis.model_fields_set,
        http_port_base=args.http_port_base,
        log_path=_quiet(settings, args),
        gateway_port=None
        if args.no_gateway
        else (settings.gateway.port if args.gateway_port is None else args.gateway_port),
    )
    # Until run() takes over signals, SIGTERM unwinds through start()'s cleanup.
    signal.signal(signal.SIGTERM, _exit_on_sigterm)
    try:
        stack.start()
        print("laneway is up; Ctrl-C stops it", flush=True)
        stack.run()
    finally:
        stack.stop()
    return 0


def _exit_on_sigterm(signum: int, frame: object) -> None:
    raise SystemExit(128 + signum)


def _top(settings: Settings, args: argparse.Namespace) -> int:
    from streams.tools.top import default_urls, run_top

    urls = args.metrics or default_urls(args.http_port_base)
    with contextlib.suppress(KeyboardInterrupt):
        return asyncio.run(
            run_top(
                settings,
                urls,
                once=args.once,
                as_json_output=args.json,
                interval_s=args.interval,
                window_s=args.window,
            )
        )
    return 0


def _ask(settings: Settings, args: argparse.Namespace) -> int:
    from streams.client import LanewayClient, result_summary

    async def ask() -> int:
        async with LanewayClient(settings.kafka) as client:
            fields = {"max_tokens": args.max_tokens}
            if args.lane:
                fields["lane"] = args.lane
            if args.deadline_ms:
                fields["deadline_ms"] = args.deadline_ms
            if not args.stream:
                result = await client.ask(args.prompt, timeout_s=args.timeout_s, **fields)
                print(result_summary(result))
                return 0 if result.status == "ok" else 1
            final = None
            async for delta in client.stream(args.prompt, timeout_s=args.timeout_s, **fields):
                if delta.restart:
                    print("\n[the answer was restarted by another attempt]", flush=True)
                print(delta.text, end="", flush=True)
                final = delta.result
            print()
            assert final is not None  # the stream ends with its result
            print(result_summary(final).splitlines()[0], f"finish={final.finish_reason}")
            return 0 if final.status == "ok" else 1

    return asyncio.run(ask())


def _bench(settings: Settings, args: argparse.Namespace) -> int:
    from streams.tools.bench import run_bench

    if args.router:
        from streams.tools.bench_router import run_router_bench

        return run_router_bench(settings, args)

    if args.compare or args.burst or args.embedded:  # the stacks it starts log to a file
        args.log_file = _quiet(settings, args)

    if args.compare:
        from streams.tools.bench_compare import compare

        return compare(settings, args)

    if args.burst:
        from streams.tools.bench_burst import burst

        return burst(settings, args)

    if args.classifier:
        from streams.tools.bench_classifier import run_classifier_bench

        return run_classifier_bench(settings, args)

    if args.backend:
        from streams.tools.bench_backend import run_backend_bench

        return run_backend_bench(settings, args)

    if args.pipeline:
        from streams.tools.bench_pipeline import run_pipeline_bench

        return run_pipeline_bench(settings, args)

    if args.batch:
        from streams.tools.bench_batch import run_batch_bench

        return run_batch_bench(settings, args)

    if args.stream_cost:
        from streams.tools.bench_stream import stream_cost

        return stream_cost(settings, args)

    return run_bench(settings, args)


def _prewarm(settings: Settings, args: argparse.Namespace) -> int:
    import json

    from streams.cache.prewarm import format_report, prewarm

    chosen = {"top": args.top, "min_count": args.min_count, "days": args.days}
    options = settings.prewarm.model_copy(
        update={name: value for name, value in chosen.items() if value is not None}
    )
    try:
        report = asyncio.run(prewarm(settings.model_copy(update={"prewarm": options})))
    except ValueError as exc:
        print(f"laneway prewarm: {exc}", file=sys.stderr)
        return 2
    print(json.dumps(report.as_dict()) if args.json else format_report(report))
    return 1 if report.failed else 0


def _schema(settings: Settings, args: argparse.Namespace) -> int:
    from schemas.wire_schema import SCHEMA_DIR, export

    for path in export(Path(args.out) if args.out else SCHEMA_DIR):
        print(path)
    return 0


def _batch(settings: Settings, args: argparse.Namespace) -> int:
    if args.batch_command == "tracker":
        from streams.jobs.tracker import serve_tracker

        with _ops_endpoints(settings) as state:
            asyncio.run(serve_tracker(settings, state))
        return 0
    from streams.jobs.commands import run_batch

    return run_batch(settings, args)


def _distill(settings: Settings, args: argparse.Namespace) -> int:
    from streams.tools.distill_cli import run_distill

    return run_distill(settings, args)


def _models(settings: Settings, args: argparse.Namespace) -> int:
    from streams.tools.models_cli import run_models

    return run_models(settings, args)


def _check(settings: Settings, args: argparse.Namespace) -> int:
    from workers.check import run_check

    return run_check(settings, args.path, as_json=args.json)


def _gateway(settings: Settings, args: argparse.Namespace) -> int:
    from streams.gateway.cli import gateway_settings
    from streams.gateway.server import serve_gateway

    settings = gateway_settings(settings, args)
    with _ops_endpoints(settings) as state:
        asyncio.run(serve_gateway(settings, state))
    return 0


def _keys(settings: Settings, args: argparse.Namespace) -> int:
    from streams.gateway.cli import run_keys

    return run_keys(settings, args)


def _doctor(settings: Settings, args: argparse.Namespace) -> int:
    from streams.doctor.cli import run_doctor

    return run_doctor(settings, args)


def _demo(settings: Settings, args: argparse.Namespace) -> int:
    from streams.tools.demo import run_demo

    return run_demo(settings, _quiet(settings, args))


_COMMANDS = {
    "topics": _topics,
    "classifier": _classifier,
    "router": _router,
    "worker": _worker,
    "up": _up,
    "top": _top,
    "ask": _ask,
    "bench": _bench,
    "prewarm": _prewarm,
    "demo": _demo,
    "schema": _schema,
    "batch": _batch,
    "check": _check,
    "models": _models,
    "distill": _distill,
    "gateway": _gateway,
    "keys": _keys,
    "doctor": _doctor,
}

if __name__ == "__main__":
    sys.exit(main())
