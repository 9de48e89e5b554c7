"""The deployment files (compose/) parse, and the KEDA scalers watch the
consumer groups and topics the lane workers really use: there is no
cluster on the dev machines, so this is what keeps them from drifting."""

from __future__ import annotations

import json
import re
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


def _values_of(key: str, node: object) -> list[str]:
    """Every string value of ``key`` in a parsed JSON document, at any depth."""
    if isinstance(node, dict):
        found = [node[key]] if isinstance(node.get(key), str) else []
        return found + [v for child in node.values() for v in _values_of(key, child)]
    if isinstance(node, list):
        return [v for child in node for v in _values_of(key, child)]
    return []


def _exported_series() -> set[str]:
    """The series names the laneway processes' metrics export (each module
    that defines metrics registers them on import)."""
    import importlib

    from prometheus_client import REGISTRY

    for module in (
        "streams.ops",
        "streams.cache.response",
        "streams.classify.drift",
        "streams.quality.loop",
        "workers.execution",
        "workers.lane_worker",
    ):
        importlib.import_module(module)
    suffixes = {
        "counter": ("_total",),
        "histogram": ("_bucket", "_sum", "_count"),
        "summary": ("_sum", "_count", ""),
    }
    return {
        family.name + suffix
        for family in REGISTRY.collect()
        for suffix in suffixes.get(family.type, ("",))
    }


def test_every_series_the_grafana_dashboard_queries_is_exported() -> None:
    """A renamed metric leaves its panel empty without a word: no Grafana
    runs on the dev machines to show it."""
    exported = _exported_series()
    for path in (COMPOSE / "grafana").rglob("*.json"):
        queries = " ".join(_values_of("expr", json.loads(path.read_text())))
        queried = set(re.findall(r"\blaneway_[a-z0-9_]+", queries))
        assert queried, f"{path.name} queries no laneway series"
        assert queried <= exported, f"{path.name}: not exported: {sorted(queried - exported)}"


def test_the_gateway_is_deployed_behind_a_service_ready_only_when_it_serves() -> None:
    deployment, service = _documents(COMPOSE / "k8s" / "16-gateway.yaml")
    pod = deployment["spec"]["template"]["spec"]
    (container,) = pod["containers"]
    env = {e["name"]: e["value"] for e in container["env"]}
    settings = Settings(
        http_port=int(env["LANEWAY_HTTP_PORT"]),
        gateway={"port": int(env["LANEWAY_GATEWAY_PORT"]), "host": env["LANEWAY_GATEWAY_HOST"]},
    )
    ports = {p["name"]: p["containerPort"] for p in container["ports"]}
    assert container["args"] == ["gateway"]
    assert ports == {"http": settings.gateway.port, "metrics": settings.http_port}
    assert container["readinessProbe"]["httpGet"] == {"path": "/readyz", "port": "metrics"}
    # Keys from a Secret; without it the named file is missing and nothing gets in.
    keys = next(v for v in pod["volumes"] if v["name"] == "keys")
    mount = next(m for m in container["volumeMounts"] if m["name"] == "keys")
    assert env["LANEWAY_GATEWAY_KEYS_FILE"].startswith(mount["mountPath"] + "/")
    assert keys["secret"]["optional"] is True
    assert {p["name"]: p["targetPort"] for p in service["spec"]["ports"]} == {
        "http": "http",
        "metrics": "metrics",
    }
    assert service["spec"]["selector"] == deployment["spec"]["selector"]["matchLabels"]
    (compose,) = _documents(COMPOSE / "docker-compose.yml")
    gateway = compose["services"]["gateway"]
    assert gateway["command"] == ["gateway"]
    assert gateway["environment"]["LANEWAY_GATEWAY_PORT"] == "8080"
    assert "127.0.0.1:8080:8080" in gateway["ports"]


def test_the_distill_cronjob_exports_trains_and_registers_a_shadow_in_order() -> None:
    """Init containers run in order, the register container last; each
    ``$(STUDENT_RUN)`` is an env of its own container (Kubernetes expands
    it), and the register command parses as ``laneway models register``."""
    from streams.cli.main import build_parser

    docs = {doc["kind"]: doc for doc in _documents(COMPOSE / "k8s" / "21-distill-cronjob.yaml")}
    pod = docs["CronJob"]["spec"]["jobTemplate"]["spec"]["template"]["spec"]
    steps = [*pod["initContainers"], *pod["containers"]]
    assert [s["args"][:2] for s in steps] == [
        ["distill", "export"],
        ["distill", "student"],
        ["models", "register"],
    ]
    assert docs["CronJob"]["spec"]["jobTemplate"]["spec"]["backoffLimit"] == 0  # never trains twice
    for step in steps:
        if any("$(STUDENT_RUN)" in arg for arg in step["args"]):
            assert "STUDENT_RUN" in {e["name"] for e in step["env"]}, step["name"]
    rows = steps[0]["args"][steps[0]["args"].index("-o") + 1]
    assert steps[1]["args"][2] == rows  # `distill student SOURCE`: the export
    out = steps[1]["args"][steps[1]["args"].index("--out") + 1]
    register = steps[2]
    args = build_parser().parse_args(
        [a.replace("$(STUDENT_RUN)", "run-1") for a in register["args"]]
    )
    assert (args.path, args.version, args.state) == ("light", "run-1", "shadow")
    assert str(args.adapter) == out.replace("$(STUDENT_RUN)", "run-1")
    env = {e["name"]: e.get("value") for e in register["env"]}
    claim = docs["PersistentVolumeClaim"]["metadata"]["name"]
    (volume,) = [
        v["name"]
        for v in pod["volumes"]
        if v.get("persistentVolumeClaim", {}).get("claimName") == claim
    ]
    (mount,) = [m["mountPath"] for m in register["volumeMounts"] if m["name"] == volume]
    assert env["LANEWAY_ROUTING_MODELS_FILE"].startswith(mount + "/")
    assert str(args.adapter).startswith(mount + "/")
