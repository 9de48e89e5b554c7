"""The deployment files checked for real, against the schemas the tools that
read them use: every Kubernetes object against Kubernetes' own OpenAPI
schemas (kubernetes-validate's, strict: an unknown field is an error, as
``kubectl apply --validate=strict`` has it), KEDA's objects against KEDA's
CRD, and the compose file against the Compose Specification's schema (both
vendored in compose/schemas/, README there names their source).

There is no cluster and no Docker engine on the dev machines; with these,
a mistyped field, a wrong type or a missing required field fails here."""

from __future__ import annotations

import copy
import json
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import jsonschema
import kubernetes_validate
import pytest
import yaml

COMPOSE = Path(__file__).resolve().parents[2] / "compose"
K8S = COMPOSE / "k8s"
SCHEMAS = COMPOSE / "schemas"

KUBERNETES_VERSION = "1.33.0"
"""The Kubernetes release the manifests are checked against: recent, and
one whose schemas the kubernetes-validate wheel ships."""


def _objects() -> Iterator[tuple[str, dict[str, Any]]]:
    for path in sorted(K8S.rglob("*.yaml")):
        for i, doc in enumerate(yaml.safe_load_all(path.read_text())):
            if doc:
                yield f"{path.relative_to(K8S)}#{i}:{doc.get('kind')}", doc


OBJECTS = list(_objects())
CORE = [(name, doc) for name, doc in OBJECTS if not doc["apiVersion"].startswith("keda.sh/")]
KEDA = [(name, doc) for name, doc in OBJECTS if doc["apiVersion"].startswith("keda.sh/")]


def test_there_is_something_to_check() -> None:
    kinds = {doc["kind"] for _, doc in OBJECTS}
    assert {"Deployment", "Service", "ConfigMap", "HorizontalPodAutoscaler"} <= kinds
    assert {"PodDisruptionBudget", "ScaledObject", "CronJob", "Job"} <= kinds


@pytest.mark.parametrize(("name", "doc"), CORE, ids=[name for name, _ in CORE])
def test_every_kubernetes_object_validates(name: str, doc: dict[str, Any]) -> None:
    try:
        kubernetes_validate.validate(doc, KUBERNETES_VERSION, strict=True)
    except kubernetes_validate.ValidationError as exc:
        pytest.fail(f"{name}: {exc.message} at {'.'.join(map(str, exc.path))}")


def _strict(schema: Any) -> Any:
    """The CRD's schema with unknown fields refused wherever it lists the
    fields (the API server prunes them silently; strict field validation,
    and this test, refuse them): a typo in a KEDA key fails here."""
    if isinstance(schema, dict):
        out = {k: _strict(v) for k, v in schema.items()}
        if (
            "properties" in out
            and "additionalProperties" not in out
            and not out.get("x-kubernetes-preserve-unknown-fields")
        ):
            out["additionalProperties"] = False
        return out
    if isinstance(schema, list):
        return [_strict(v) for v in schema]
    return schema


def _keda_schema(version: str) -> dict[str, Any]:
    crd = yaml.safe_load((SCHEMAS / "keda.sh_scaledobjects.yaml").read_text())
    found = next(v for v in crd["spec"]["versions"] if v["name"] == version)
    schema = _strict(copy.deepcopy(found["schema"]["openAPIV3Schema"]))
    # Every object carries metadata; the API server checks it, not the CRD.
    schema["properties"]["metadata"] = {"type": "object"}
    return schema  # type: ignore[no-any-return]


@pytest.mark.parametrize(("name", "doc"), KEDA, ids=[name for name, _ in KEDA])
def test_every_keda_object_validates_against_kedas_crd(name: str, doc: dict[str, Any]) -> None:
    assert doc["kind"] == "ScaledObject"
    validator = jsonschema.Draft7Validator(_keda_schema(doc["apiVersion"].split("/")[1]))
    problems = [
        f"{'.'.join(map(str, e.absolute_path))}: {e.message}" for e in validator.iter_errors(doc)
    ]
    assert not problems, f"{name}: {problems}"


def test_the_keda_check_refuses_a_mistyped_field() -> None:
    """The strict copy of the CRD catches what pruning would hide."""
    doc = KEDA[0][1]
    bad = copy.deepcopy(doc)
    bad["spec"]["maxReplicas"] = bad["spec"].pop("maxReplicaCount")
    validator = jsonschema.Draft7Validator(_keda_schema("v1alpha1"))
    assert any("maxReplicas" in e.message for e in validator.iter_errors(bad))


def test_the_kubernetes_check_refuses_a_mistyped_field() -> None:
    deployment = next(doc for _, doc in CORE if doc["kind"] == "Deployment")
    bad = copy.deepcopy(deployment)
    bad["spec"]["strategy"]["rollingUpdate"]["maxSurges"] = 0
    with pytest.raises(kubernetes_validate.ValidationError):
        kubernetes_validate.validate(bad, KUBERNETES_VERSION, strict=True)


def _compose() -> dict[str, Any]:
    return yaml.safe_load((COMPOSE / "docker-compose.yml").read_text())  # type: ignore[no-any-return]


def test_the_compose_file_validates_against_the_compose_specification() -> None:
    schema = json.loads((SCHEMAS / "compose-spec.json").read_text())
    validator = jsonschema.Draft7Validator(schema)
    problems = [
        f"{'.'.join(map(str, e.absolute_path))}: {e.message}"
        for e in validator.iter_errors(_compose())
    ]
    assert not problems, problems


def _container(doc: dict[str, Any]) -> dict[str, Any]:
    return next(c for c in doc["spec"]["template"]["spec"]["containers"] if c["name"] == "worker")


def test_the_gpu_worker_follows_the_article() -> None:
    """§3.2: a GPU in the limits (requests equal), 20% of its memory free,
    under 70% of the KV cache's sequences, a rollout that needs no spare
    GPU, and a startup probe that outlasts a cold load."""
    doc = next(d for n, d in CORE if n.startswith("gpu/") and d["kind"] == "Deployment")
    container = _container(doc)
    resources = container["resources"]
    assert resources["limits"]["nvidia.com/gpu"] == 1
    assert resources["requests"] == resources["limits"]
    env = {e["name"]: e.get("value") for e in container["env"]}
    assert env["LANEWAY_BACKEND_HEAVY"] == "vllm"
    assert float(env["LANEWAY_BACKEND_VLLM_GPU_MEMORY_UTILIZATION"]) == 0.8
    assert float(env["LANEWAY_BACKEND_VLLM_KV_CONCURRENCY_SHARE"]) <= 0.7
    rolling = doc["spec"]["strategy"]["rollingUpdate"]
    assert (rolling["maxSurge"], rolling["maxUnavailable"]) == (0, 1)
    startup = container["startupProbe"]
    assert startup["httpGet"]["path"] == "/readyz"  # /healthz answers before the load blocks
    assert startup["periodSeconds"] * startup["failureThreshold"] >= 600
    # A reloaded engine blocks the loop as long as a load: /healthz waits that out.
    assert float(env["LANEWAY_LOOP_STALL_S"]) >= 300


def test_the_gpu_worker_scales_on_gpu_utilisation_and_lag() -> None:
    scaled = next(d for n, d in KEDA if n.startswith("gpu/"))
    spec = scaled["spec"]
    assert spec["scaleTargetRef"]["name"] == "worker-gpu"
    triggers = {t["type"]: t for t in spec["triggers"]}
    assert set(triggers) == {"prometheus", "kafka"}
    assert "DCGM_FI_DEV_GPU_UTIL" in triggers["prometheus"]["metadata"]["query"]
    assert triggers["kafka"]["metadata"]["consumerGroup"] == "laneway.worker.medium"
    assert spec["minReplicaCount"] >= 1  # a cold load is too slow to start from zero


def test_the_cpu_workers_keep_their_autoscaling() -> None:
    hpa = next(d for _, d in CORE if d["kind"] == "HorizontalPodAutoscaler")
    assert hpa["spec"]["metrics"][0]["resource"]["name"] == "cpu"
    cpu_keda = [n for n, _ in KEDA if n.startswith("keda/")]
    assert len(cpu_keda) == 3


def test_the_compose_gpu_worker_reserves_a_gpu_and_takes_the_medium_lane() -> None:
    services = _compose()["services"]
    gpu = services["worker-gpu"]
    assert gpu["profiles"] == ["gpu"]
    devices = gpu["deploy"]["resources"]["reservations"]["devices"]
    assert devices == [{"driver": "nvidia", "count": 1, "capabilities": ["gpu"]}]
    assert gpu["environment"]["LANEWAY_BACKEND_HEAVY"] == "vllm"
    assert gpu["command"][:3] == ["worker", "--lane", "medium"]
    # With the gpu profile, no CPU worker stays in the medium lane's group.
    gpu_env = (COMPOSE / "gpu.env").read_text()
    assert "LANEWAY_CPU_MEDIUM_REPLICAS=0" in gpu_env
    assert "LANEWAY_CPU_MEDIUM_REPLICAS" in str(services["worker-medium"]["deploy"]["replicas"])
