"""The deployment files (compose/) parse, and the KEDA scalers watch the
consumer groups and topics the lane workers really use: there is no
cluster on the dev machines, so this is what keeps them from drifting."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
import yaml

from schemas.messages import Lane
from schemas.settings import Settings

COMPOSE = Path(__file__).resolve().parents[2] / "compose"


def _documents(path: Path) -> list[dict]:  # type: ignore[type-arg]
    return [doc for doc in yaml.safe_load_all(path.read_text()) if doc]


@pytest.mark.parametrize("path", sorted(COMPOSE.rglob("*.y*ml")), ids=lambda p: p.name)
def test_every_yaml_file_parses(path: Path) -> None:
    assert _documents(path)


def test_the_grafana_dashboard_parses() -> None:
    for path in COMPOSE.rglob("*.json"):
        json.loads(path.read_text())


def test_each_lane_scales_on_the_lag_of_its_own_workers() -> None:
    config = next(
        doc
        for doc in _documents(COMPOSE / "k8s" / "01-configmap.yaml")
        if doc.get("kind") == "ConfigMap"
    )["data"]
    settings = Settings(app_id=config["LANEWAY_APP_ID"])
    scaled = {
        doc["metadata"]["name"]: doc
        for doc in _documents(COMPOSE / "k8s" / "keda" / "worker-scaledobjects.yaml")
    }
    assert set(scaled) == {f"worker-{lane}" for lane in Lane}
    for lane in Lane:
        spec = scaled[f"worker-{lane}"]["spec"]
        kafka = next(t for t in spec["triggers"] if t["type"] == "kafka")["metadata"]
        assert kafka["consumerGroup"] == f"{settings.app_id}.worker.{lane}"
        assert kafka["topic"] == settings.lane_topic(lane)
        assert kafka["bootstrapServers"] == config["LANEWAY_KAFKA_BOOTSTRAP"]
        assert spec["scaleTargetRef"]["name"] == f"worker-{lane}"
        assert spec["maxReplicaCount"] <= int(config["LANEWAY_KAFKA_PARTITIONS"])
        assert spec["minReplicaCount"] >= 1  # a model load is too slow to start from zero
