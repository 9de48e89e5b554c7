"""``laneway models ...``: model versions and their roll-out.

    laneway models list [--json]                    versions, state, share, live workers, stats
    laneway models canary PATH VERSION --share 0.1  a share of the path's traffic
    laneway models shadow PATH VERSION [--share S]  a copy of (a share of) its requests
    laneway models promote PATH VERSION             the active version; the old one retires
    laneway models rollback PATH                    every canary of the path back to 0%
    laneway models report [--json]                  shadow answers against the active ones
    laneway models report --routers [--json]        shadow routers' decisions against those taken
    laneway models register PATH VERSION --adapter DIR [--state shadow|canary] [--share S]
                                                    a new version with a LoRA adapter (a student)

Router versions (``streams.rollout.routers``) take ``router`` as PATH:
``laneway models canary router lr-2 --share 0.1``, ``shadow router lr-2``,
``promote router lr-2`` (or ``promote router rule``), ``rollback router``;
``list`` shows them after the models.

Changes go to the roll-out state in Redis (``streams.rollout.state``),
computed from the registry file (``LANEWAY_ROUTING_MODELS_FILE``) with the
live state laid over it, and reach every classifier within
``LANEWAY_ROLLOUT_REFRESH_S``. An unknown path or version, or a share out
of range, is refused with the reason and exit code 2; a Redis that cannot
be read or written, exit code 1.

``register`` writes the registry file itself (``streams.rollout.register``;
no Redis): the new version copies the path's active one with the adapter,
as a shadow (or a canary at share 0), and every process loads it at its
next start. A student whose ``student.json`` says ``offered: false`` is
refused with its reason (exit code 2) unless ``--force``. ``list`` shows a
student's provenance under its row.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import sys
import time
from pathlib import Path
from typing import Any

from aiokafka import AIOKafkaConsumer, TopicPartition
from pydantic import ValidationError
from redis.exceptions import RedisError

from schemas.errors import LanewayError
from schemas.messages import AnswerPath, InferenceResult
from schemas.settings import Settings
from schemas.student import StudentProvenance
from streams.rollout import routers as router_rollout
from streams.rollout import state
from streams.rollout.register import (
    RegisterError,
    new_version,
    provenance_line,
    read_student,
    registry_text,
    write_registry,
)
from streams.rollout.report import aggregate, format_reports, pair
from streams.rollout.rollback import RouterRecord
from streams.routing.registry import (
    ModelEntry,
    ModelRegistry,
    RegistryError,
    builtin_registry,
    load_registry,
)
from streams.routing.stats import PathStats
from streams.stores.workerboard import WorkerBoard

__all__ = ["cmd", "run_models", "subparser_init"]


def subparser_init(subparsers: Any) -> argparse.ArgumentParser:
    models: argparse.ArgumentParser = subparsers.add_parser(
        "models", help="model versions: list, canary, shadow, promote, rollback"
    )
    actions = models.add_subparsers(dest="models_command", required=True)
    listing = actions.add_parser("list", help="versions, state, share, live workers, stats")
    listing.add_argument("--json", action="store_true")
    for name, what in (
        ("promote", "make VERSION the path's active version (the old one retires)"),
        ("canary", "give VERSION a share of the path's traffic"),
        ("shadow", "give VERSION a copy of the path's requests, answers recorded only"),
    ):
        action = actions.add_parser(name, help=what)
        action.add_argument("path", help="a model path, or 'router' for the router versions")
        action.add_argument("version", help="a registry version, or a router version ('rule', ...)")
        if name == "canary":
            action.add_argument("--share", type=float, required=True, help="0..1, e.g. 0.1")
        if name == "shadow":
            action.add_argument("--share", type=float, default=None, help="0..1 (default: all)")
    register = actions.add_parser(
        "register",
        help="add a version with a LoRA adapter (a student) to the registry file",
        description="Add VERSION of PATH to the registry file (LANEWAY_ROUTING_MODELS_FILE; "
        "created from the built-in registry when missing): the path's active version with "
        "the adapter, as a shadow or a canary at share 0. Processes load it at their next "
        "start; then move it on with shadow, canary and promote.",
    )
    register.add_argument("path", help="the model path the adapter was trained for (light)")
    register.add_argument("version", help="the new version's label, unique within the path")
    register.add_argument(
        "--adapter",
        type=Path,
        required=True,
        help="a `laneway distill student --out` directory, or an adapter file or PEFT directory",
    )
    register.add_argument("--state", choices=("shadow", "canary"), default="shadow")
    register.add_argument(
        "--share", type=float, default=None, help="0..1 (shadow default: all; canary: 0)"
    )
    register.add_argument(
        "--model", default=None, help="the base model (default: the student's, else the active's)"
    )
    register.add_argument(
        "--force",
        action="store_true",
        help="register a student not offered for promotion, or an adapter without student.json",
    )
    back = actions.add_parser("rollback", help="every canary of PATH back to share 0")
    back.add_argument("path", help="a model path, or 'router' for the router versions")
    report = actions.add_parser("report", help="shadow answers against the active answers")
    report.add_argument("--json", action="store_true")
    report.add_argument("--timeout-s", type=float, default=10.0, help="longest read of the topics")
    report.add_argument("--no-embed", action="store_true", help="exact match only, no MiniLM")
    report.add_argument(
        "--routers", action="store_true", help="shadow router versions' decisions instead"
    )
    return models


def cmd(args: argparse.Namespace) -> int:
    from streams.cli.common import settings_of

    return run_models(settings_of(args), args)


def run_models(settings: Settings, args: argparse.Namespace) -> int:
    if args.models_command == "register":
        return run_register(settings, args)
    try:
        registry = load_registry(settings.routing.models_file, settings.backend)
    except RegistryError as exc:
        print(f"laneway models: {exc}", file=sys.stderr)
        return 2
    try:
        return asyncio.run(_run(settings, args, registry))
    except state.RolloutError as exc:
        print(f"laneway models {args.models_command}: {exc}", file=sys.stderr)
        return 2
    except (RedisError, OSError) as exc:
        print(f"laneway models {args.models_command}: Redis: {exc}", file=sys.stderr)
        return 1


async def _run(settings: Settings, args: argparse.Namespace, registry: ModelRegistry) -> int:
    if args.models_command == "report" and not args.routers:
        return await _report(settings, args)
    redis = settings.redis.client()
    try:
        if args.models_command == "report":
            return await _report_routers(settings, redis, as_json=args.json)
        store = state.RolloutStore(redis, settings.redis.key_prefix)
        overrides = await store.read()
        router_overrides = await store.read_kind(router_rollout.ROUTER_KIND)
        if overrides is None or router_overrides is None:
            raise RedisError(f"cannot read {store.key}")
        catalog = router_rollout.RouterCatalog(settings.routing)
        catalog.scan()
        router_live = {
            v: r for (name, v), r in router_overrides.items() if name == router_rollout.ROUTER_NAME
        }
        routers = catalog.view(router_live)
        if args.models_command == "list":
            live = state.apply(registry, overrides)
            rows = await _router_rows(settings, redis, routers, router_live)
            return await _list(settings, redis, live, overrides, rows, as_json=args.json)
        if args.path == router_rollout.ROUTER_SUBJECT:
            return await _change_router(store, routers, args, enabled=catalog.enabled)
        live = state.apply(registry, overrides)
        now_ms = int(time.time() * 1000)
        command = args.models_command
        if command == "promote":
            changes = state.promote(live, args.path, args.version, now_ms=now_ms)
        elif command == "canary":
            changes = state.canary(live, args.path, args.version, args.share, now_ms=now_ms)
        elif command == "shadow":
            changes = state.shadow(live, args.path, args.version, args.share, now_ms=now_ms)
        else:
            changes = state.rollback(live, args.path, now_ms=now_ms)
        await store.write(changes)
        for (path, version), change in sorted(changes.items()):
            share = "" if change.share is None else f" share {change.share:g}"
            print(f"{path} {version}: {change.state}{share}")
        return 0
    finally:
        await redis.aclose()


async def _change_router(
    store: state.RolloutStore,
    routers: router_rollout.RouterView,
    args: argparse.Namespace,
    *,
    enabled: bool,
) -> int:
    now_ms = int(time.time() * 1000)
    versions = routers.versions
    command = args.models_command
    if not enabled and command != "rollback":
        raise state.RolloutError(
            "no learned router versions: set LANEWAY_ROUTING_LEARNED_ROUTER_DIR "
            f"(a directory of artifacts); the known ones are {[v.version for v in versions]}"
        )
    if command == "promote":
        changes = router_rollout.promote_router(versions, args.version, now_ms=now_ms)
    elif command == "canary":
        changes = router_rollout.canary_router(versions, args.version, args.share, now_ms=now_ms)
    elif command == "shadow":
        changes = router_rollout.shadow_router(versions, args.version, args.share, now_ms=now_ms)
    else:
        changes = router_rollout.rollback_router(versions, now_ms=now_ms)
    await store.write(
        {(router_rollout.ROUTER_NAME, v): r for v, r in changes.items()},
        kind=router_rollout.ROUTER_KIND,
    )
    for version, change in sorted(changes.items()):
        share = "" if change.share is None else f" share {change.share:g}"
        print(f"router {version}: {change.state}{share}")
    return 0


async def _list(
    settings: Settings,
    redis: Any,
    live: ModelRegistry,
    overrides: state.Overrides,
    router_rows: list[dict[str, Any]],
    *,
    as_json: bool,
) -> int:
    board = WorkerBoard(redis, settings.redis.key_prefix, stale_s=3 * settings.worker_heartbeat_s)
    cards = await board.live() or []
    raw = await redis.hgetall(f"{settings.redis.key_prefix}:route:versions")
    stats: dict[str, PathStats] = {}
    for name, value in raw.items():
        try:
            stats[name.decode() if isinstance(name, bytes) else name] = PathStats.from_json(value)
        except (ValueError, TypeError, KeyError):
            continue
    rows: list[dict[str, Any]] = []
    for entry in live.models:
        workers = sorted(
            f"{card.lane}:{card.worker_id}"
            for card in cards
            for p in card.paths
            if p.path == entry.model_path and p.version == entry.version
        )
        record = stats.get(f"{entry.path}:{entry.version}")
        change = overrides.get((entry.model_path, entry.version))
        rows.append(
            {
                "path": entry.path,
                "version": entry.version,
                "model": f"{entry.backend}:{entry.name}",
                "state": entry.state,
                "share": _share(live, entry),
                "workers": workers,
                "events": len(record.outcomes) if record else 0,
                "success_rate": record.success_rate if record else None,
                "latency_ms": record.latency_ms if record and record.outcomes else None,
                "quality": record.quality if record else None,
                "set_by": change.by if change else "file",
                "reason": change.reason if change else None,
                "adapter": None if entry.adapter is None else str(entry.adapter),
                "student": _student_of(entry),
            }
        )
    rows += router_rows
    if as_json:
        print(json.dumps(rows, indent=2))
        return 0
    print(
        f"{'path':6} {'version':12} {'model':28} {'state':8} {'share':>6} {'workers':>7} "
        f"{'events':>6} {'success':>7} {'latency':>8}  set by"
    )
    for row in rows:
        success = "-" if row["success_rate"] is None else f"{row['success_rate']:.0%}"
        latency = "-" if row["latency_ms"] is None else f"{row['latency_ms']:.0f}ms"
        note = str(row["set_by"]) + (f": {row['reason']}" if row["reason"] else "")
        print(
            f"{row['path']:6} {row['version']:12} {row['model']:28} {row['state']:8} "
            f"{row['share']:6.0%} {len(row['workers']):7} {row['events']:6} {success:>7} "
            f"{latency:>8}  {note}"
            + (f"  heavy {row['heavy_share']:.0%}" if row.get("heavy_share") is not None else "")
        )
        if row.get("adapter"):
            student = row.get("student")
            about = (
                provenance_line(StudentProvenance.model_validate(student))
                if student
                else "no student.json beside it"
            )
            print(f"{'':6} adapter {row['adapter']}: {about}")
    return 0


def _student_of(entry: ModelEntry) -> dict[str, Any] | None:
    """The provenance beside ``entry``'s adapter, as ``list --json`` shows
    it (``None``: no adapter, or none beside it; unreadable: its error)."""
    if entry.adapter is None:
        return None
    try:
        student = read_student(entry.adapter)
    except RegisterError as exc:
        return {"error": str(exc)}
    return None if student is None else student.model_dump(mode="json")


def run_register(settings: Settings, args: argparse.Namespace) -> int:
    """``laneway models register``: 0 when the version was added to the
    file, 2 when it is refused (the reason on stderr)."""
    from workers.models import resolve_adapter

    file = settings.routing.models_file

    def refuse(reason: str) -> int:
        print(f"laneway models register: {reason}", file=sys.stderr)
        return 2

    if file is None:
        return refuse(
            "no registry file to add the version to: set LANEWAY_ROUTING_MODELS_FILE (every "
            "process must read the same file; a missing one is created from the built-in models)"
        )
    if args.share is not None and not 0 <= args.share <= 1:
        return refuse(f"--share {args.share} is outside 0..1")
    old = file.read_text() if file.is_file() else None
    try:
        registry = load_registry(file if old is not None else None, settings.backend)
        path = AnswerPath(args.path)
        adapter = args.adapter.resolve()
        student = read_student(adapter)
        entry = new_version(
            registry,
            path,
            args.version,
            adapter,
            student,
            state=args.state,
            share=args.share,
            model=args.model,
            force=args.force,
        )
        resolve_adapter(entry.backend, adapter)  # the file its backend will load is there
        text = registry_text(old, builtin_registry(settings.backend), entry)
        write_registry(file, text)
    except (RegistryError, ValueError) as exc:
        return refuse(str(exc))
    except LanewayError as exc:
        return refuse(exc.message)
    except OSError as exc:
        return refuse(f"{file}: {exc}")
    share = "" if entry.share is None else f" share {entry.share:g}"
    model = f"{entry.backend}:{entry.name}"
    print(f"{entry.path} {entry.version}: {entry.state}{share} ({model} + {adapter})")
    if student is not None:
        print(f"  {provenance_line(student)}")
    print(
        f"  added to {file}{' (created from the built-in models)' if old is None else ''}; "
        f"processes load it at their next start (restart the {entry.path} workers and the "
        f"classifiers), then: laneway models canary {entry.path} {entry.version} --share 0.05"
    )
    return 0


async def _router_rows(
    settings: Settings,
    redis: Any,
    routers: router_rollout.RouterView,
    overrides: dict[str, state.VersionRollout],
) -> list[dict[str, Any]]:
    """One row per router version, as the models' rows (path ``router``)."""
    raw = await redis.hgetall(f"{settings.redis.key_prefix}:route:routers")
    records: dict[str, RouterRecord] = {}
    for name, value in raw.items():
        try:
            records[name.decode() if isinstance(name, bytes) else name] = RouterRecord.from_json(
                value
            )
        except (ValueError, TypeError, KeyError):
            continue
    canaries = sum(v.traffic_share for v in routers.versions if v.state == "canary")
    rows: list[dict[str, Any]] = []
    for entry in routers.versions:
        record = records.get(entry.version)
        stats = record.stats if record else None
        share = max(0.0, 1 - canaries) if entry.state == "active" else entry.traffic_share
        if entry.state == "retired":
            share = 0.0
        change = overrides.get(entry.version)
        source = entry.source or ("feature rule" if entry.version == "rule" else "no artifact")
        rows.append(
            {
                "path": router_rollout.ROUTER_SUBJECT,
                "version": entry.version,
                "model": Path(source).name if entry.source else source,
                "state": entry.state,
                "share": share,
                "workers": [],
                "events": len(stats.outcomes) if stats else 0,
                "success_rate": stats.success_rate if stats else None,
                "latency_ms": stats.latency_ms if stats and stats.outcomes else None,
                "quality": stats.quality if stats else None,
                "heavy_share": record.heavy_share if record else None,
                "loaded": entry.version == router_rollout.RULE_VERSION
                or routers.learned(entry.version) is not None,
                "set_by": change.by if change else "default",
                "reason": change.reason if change else None,
            }
        )
    return rows


async def _report_routers(settings: Settings, redis: Any, *, as_json: bool) -> int:
    """Per shadow router version: how often its decision agreed with the
    one taken, and the heavy share of each."""
    counts = await router_rollout.read_tally(
        redis, router_rollout.tally_key(settings.redis.key_prefix)
    )
    rows: list[dict[str, Any]] = []
    for version, c in sorted(counts.items()):
        n = c.get("n", 0)
        rows.append(
            {
                "router_version": version,
                "decisions": n,
                "agreement": c.get("agree", 0) / n if n else None,
                "shadow_heavy_share": c.get("heavy", 0) / n if n else None,
                "taken_heavy_share": c.get("live_heavy", 0) / n if n else None,
            }
        )
    if as_json:
        print(json.dumps(rows, indent=2))
        return 0
    if not rows:
        print("no shadow router decisions recorded")
        return 0
    print(f"{'router':24} {'decisions':>9} {'agree':>6} {'heavy':>6} {'taken':>6} {'diff':>6}")
    for row in rows:
        if not row["decisions"]:
            continue
        diff = row["shadow_heavy_share"] - row["taken_heavy_share"]
        print(
            f"{row['router_version']:24} {row['decisions']:9} {row['agreement']:6.0%} "
            f"{row['shadow_heavy_share']:6.0%} {row['taken_heavy_share']:6.0%} {diff:+6.0%}"
        )
    return 0


def _share(live: ModelRegistry, entry: ModelEntry) -> float:
    """The part of its path's traffic a version gets: the active one has
    what the canaries leave (before the worker board narrows them)."""
    if entry.state != "active":
        return entry.traffic_share
    canaries = sum(m.traffic_share for m in live.versions(entry.model_path) if m.state == "canary")
    return max(0.0, 1.0 - canaries)


async def _report(settings: Settings, args: argparse.Namespace) -> int:
    shadows = await read_results(settings, settings.topic("shadow"), args.timeout_s)
    results = await read_results(settings, settings.topic("results"), args.timeout_s)
    similarity = None
    if not args.no_embed:
        from streams.cache.embedding import MiniLMEmbedder

        embedder = MiniLMEmbedder()

        def similarity(a: Any, b: Any) -> list[float]:
            left, right = embedder.embed(list(a)), embedder.embed(list(b))
            return [float(x) for x in (left * right).sum(axis=1)]

    reports = aggregate(pair(shadows, results), similarity)
    if args.json:
        print(json.dumps([r.as_dict() for r in reports], indent=2))
    else:
        print(format_reports(reports))
    return 0


async def read_results(settings: Settings, topic: str, timeout_s: float) -> list[InferenceResult]:
    """Every ``result`` on ``topic`` from the beginning up to its end now
    (at most ``timeout_s`` of reading), read without a consumer group."""
    consumer = AIOKafkaConsumer(enable_auto_commit=False, **settings.kafka.client_options())
    await consumer.start()
    try:
        partitions = consumer.partitions_for_topic(topic) or set()
        if not partitions:
            await consumer._client.force_metadata_update()
            partitions = consumer.partitions_for_topic(topic) or set()
        tps = [TopicPartition(topic, p) for p in sorted(partitions)]
        if not tps:
            return []
        consumer.assign(tps)
        await consumer.seek_to_beginning(*tps)
        ends = await consumer.end_offsets(tps)
        out: list[InferenceResult] = []
        loop = asyncio.get_running_loop()
        give_up = loop.time() + timeout_s
        while loop.time() < give_up:
            if all([await consumer.position(tp) >= ends[tp] for tp in tps]):
                break
            polled = await consumer.getmany(timeout_ms=200)
            for records in polled.values():
                for record in records:
                    try:
                        out.append(InferenceResult.model_validate_json(record.value or b""))
                    except ValidationError:
                        continue
        return out
    finally:
        await consumer.stop()
