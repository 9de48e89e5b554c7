"""``laneway models`` against real Redis (no stack): the roll-out state it
writes, what a classifier's board reads back, the errors it gives, and the
rollback drain that only one quality-loop replica wins."""

from __future__ import annotations

import argparse
import asyncio
import json
from pathlib import Path

import pytest
import redis.asyncio as aioredis

from schemas.messages import AnswerPath
from schemas.settings import Settings
from streams.cli.main import build_parser
from streams.cli.models import run_models
from streams.rollout.board import RolloutBoard
from streams.rollout.state import RolloutStore, VersionRollout
from streams.routing.registry import load_registry

REGISTRY = """\
models:
  - {name: smollm2-135m, version: q4_1, backend: llamacpp, path: light}
  - {name: gemma3-270m, version: q4_k_m, backend: llamacpp, path: heavy}
  - {name: smollm2-135m, version: smol, state: canary, backend: llamacpp, path: heavy}
"""


@pytest.fixture
def settings(redis_url: str, prefix: str, tmp_path: Path) -> Settings:
    models = tmp_path / "models.yaml"
    models.write_text(REGISTRY)
    base = Settings()
    return base.model_copy(
        update={
            "redis": base.redis.model_copy(update={"url": redis_url, "key_prefix": prefix}),
            "routing": base.routing.model_copy(update={"models_file": models}),
        }
    )


async def cli(settings: Settings, *args: str) -> int:
    """The command as ``laneway models ARGS`` runs it (its own event loop)."""
    parsed: argparse.Namespace = build_parser().parse_args(["models", *args])
    return await asyncio.to_thread(run_models, settings, parsed)


async def test_a_cli_change_reaches_a_classifiers_board(
    settings: Settings, redis_client: aioredis.Redis, capsys: pytest.CaptureFixture[str]
) -> None:
    registry = load_registry(settings.routing.models_file, settings.backend)
    board = RolloutBoard(redis_client, settings.redis.key_prefix, registry)
    assert (await board.refresh()).registry.version(AnswerPath.HEAVY, "smol").traffic_share == 0.0  # type: ignore[union-attr]

    assert await cli(settings, "canary", "heavy", "smol", "--share", "0.25") == 0
    view = await board.refresh()
    assert view.registry.version(AnswerPath.HEAVY, "smol").traffic_share == 0.25  # type: ignore[union-attr]

    assert await cli(settings, "rollback", "heavy") == 0
    assert (await board.refresh()).registry.version(AnswerPath.HEAVY, "smol").traffic_share == 0.0  # type: ignore[union-attr]

    assert await cli(settings, "promote", "heavy", "smol") == 0
    promoted = (await board.refresh()).registry
    assert promoted.for_path(AnswerPath.HEAVY).version == "smol"  # type: ignore[union-attr]
    assert promoted.version(AnswerPath.HEAVY, "q4_k_m").state == "retired"  # type: ignore[union-attr]

    capsys.readouterr()
    assert await cli(settings, "list", "--json") == 0
    rows = {r["version"]: r for r in json.loads(capsys.readouterr().out)}
    assert (rows["smol"]["state"], rows["q4_k_m"]["state"]) == ("active", "retired")
    assert rows["q4_1"]["set_by"] == "file" and rows["smol"]["workers"] == []


async def test_unknown_paths_and_versions_are_refused_with_what_exists(
    settings: Settings, capsys: pytest.CaptureFixture[str]
) -> None:
    assert await cli(settings, "canary", "heavy", "v9", "--share", "0.1") == 2
    assert "path heavy has no version 'v9': it has ['q4_k_m', 'smol']" in capsys.readouterr().err
    assert await cli(settings, "promote", "medium", "smol") == 2
    assert "unknown path 'medium'" in capsys.readouterr().err
    assert await cli(settings, "rollback", "light") == 2
    assert "no canary with traffic" in capsys.readouterr().err


async def test_only_one_replica_drains_a_canary(
    settings: Settings, redis_client: aioredis.Redis
) -> None:
    assert await cli(settings, "canary", "heavy", "smol", "--share", "0.5") == 0
    store = RolloutStore(redis_client, settings.redis.key_prefix)
    first = await store.drain(AnswerPath.HEAVY, "smol", "success rate 0%", now_ms=1)
    second = await store.drain(AnswerPath.HEAVY, "smol", "success rate 0%", now_ms=2)
    assert (first, second) == (True, False)
    live = (await store.read() or {})[(AnswerPath.HEAVY, "smol")]
    assert (live.share, live.by, live.reason, live.at_ms) == (0.0, "rollback", "success rate 0%", 1)


async def test_another_kind_of_version_shares_the_hash_without_touching_the_models(
    settings: Settings, redis_client: aioredis.Redis
) -> None:
    """A learned router's versions can go out through the same state."""
    store = RolloutStore(redis_client, settings.redis.key_prefix)
    await store.write({("learned", "r7"): VersionRollout("canary", 0.1)}, kind="router")
    assert await store.read() == {}  # the models' view is unchanged
    assert await store.read_kind("router") == {("learned", "r7"): VersionRollout("canary", 0.1)}
    assert await store.drain("learned", "r7", "worse", now_ms=3, kind="router")
    drained = (await store.read_kind("router") or {})[("learned", "r7")]
    assert (drained.share, drained.by) == (0.0, "rollback")
