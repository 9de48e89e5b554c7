"""``laneway doctor`` on the real stack, with one fault injected for each
step of the article's flow, and the doctor naming each:

- a slow backend for one path: both model paths are served by a real
  llama.cpp server (``llama_cpp.server``, SmolLM2) through a proxy of the
  test's own, which holds the heavy path's requests 10 s once the fault is
  on (the light path's go straight through);
- a version promoted mid-window: heavy ``v2`` made active with the roll-out
  operations ``laneway models promote`` runs, its requests then routed to it;
- drifted inputs: ten plain questions form the classifier's drift baseline,
  then ten about code drift from it.

The doctor runs as an operator runs it (``laneway doctor``, a subprocess),
its window cut where the faults began.
"""

from __future__ import annotations

import asyncio
import json
import os
import subprocess
import sys
import time
import urllib.error
import urllib.request
import uuid
from collections.abc import Iterator
from http.server import BaseHTTPRequestHandler

import pytest

from schemas.messages import AnswerPath, InferenceRequest, Lane, QualityEvent, RoutedRequest
from schemas.settings import Settings
from streams.client import LanewayClient
from streams.devstack.embedded import free_port
from streams.devstack.supervisor import Stack
from streams.rollout import state
from streams.routing.registry import load_registry

from .conftest import own_stack, produce_to_lane, read_topic
from .servers import LocalHttpServer, llama_cpp_server

REGISTRY = """\
models:
  - {name: smollm2-light, version: "1", backend: openai, path: light, max_complexity: simple}
  - {name: smollm2-heavy-1, version: v1, backend: openai, path: heavy}
  - {name: smollm2-heavy-2, version: v2, state: canary, share: 0, backend: openai, path: heavy}
"""

HEAVY_DELAY_S = 10.0


class SlowProxy:
    """A real HTTP proxy in front of the OpenAI-compatible server: requests
    for a model named in ``slow`` wait ``delay_s`` first (the fault), and
    every request reaches the server with the one model it serves."""

    def __init__(self, upstream: str, served: str) -> None:
        self.slow: tuple[str, ...] = ()
        self.delay_s = 0.0
        proxy = self

        class Handler(BaseHTTPRequestHandler):
            def do_GET(self) -> None:
                self._forward(None)

            def do_POST(self) -> None:
                body = json.loads(self.rfile.read(int(self.headers.get("Content-Length", 0))))
                if proxy.slow and str(body.get("model", "")).startswith(proxy.slow):
                    time.sleep(proxy.delay_s)
                body["model"] = served
                self._forward(json.dumps(body).encode())

            def _forward(self, data: bytes | None) -> None:
                request = urllib.request.Request(
                    upstream.rstrip("/") + self.path.removeprefix("/v1"),
                    data=data,
                    headers={"Content-Type": "application/json"},
                )
                try:
                    with urllib.request.urlopen(request, timeout=120) as response:
                        status, payload = response.status, response.read()
                except urllib.error.HTTPError as exc:
                    status, payload = exc.code, exc.read()
                self.send_response(status)
                self.send_header("Content-Type", "application/json")
                self.send_header("Content-Length", str(len(payload)))
                self.end_headers()
                self.wfile.write(payload)

            def log_message(self, format: str, *args: object) -> None:
                pass

        self._server = LocalHttpServer(Handler)

    @property
    def base_url(self) -> str:
        return f"{self._server.url}/v1"

    def close(self) -> None:
        self._server.close()


@pytest.fixture(scope="module")
def proxy() -> Iterator[SlowProxy]:
    with llama_cpp_server(free_port()) as upstream:
        slow = SlowProxy(upstream, "smollm2")
        try:
            yield slow
        finally:
            slow.close()


@pytest.fixture(scope="module")
def doctor_stack(
    tmp_path_factory: pytest.TempPathFactory, proxy: SlowProxy
) -> Iterator[tuple[Stack, dict[str, str]]]:
    """A bulk-only stack whose model paths are the proxied server; yields it
    and the environment the CLI needs to reach it."""
    folder = tmp_path_factory.mktemp("doctor")
    (folder / "models.yaml").write_text(REGISTRY)
    prefix = f"doctor-{uuid.uuid4().hex[:8]}"
    env = {
        "LANEWAY_APP_ID": prefix,
        "LANEWAY_REDIS_KEY_PREFIX": prefix,
        "LANEWAY_ROUTING_MODELS_FILE": str(folder / "models.yaml"),
        "LANEWAY_ROUTING_EXPLORATION": "0",
        "LANEWAY_CACHE_ENABLED": "false",
        "LANEWAY_WORKER_HEARTBEAT_S": "1",
        "LANEWAY_BACKEND_OPENAI_BASE_URL": proxy.base_url,
        "LANEWAY_BULK_MAX_BATCH_SIZE": "8",
        "LANEWAY_BULK_MAX_WAIT_MS": "50",
        "LANEWAY_BULK_PATHS": '["light", "heavy"]',
        # The smallest drift baseline and window, judged twice a second.
        "LANEWAY_DRIFT_BASELINE_SIZE": "10",
        "LANEWAY_DRIFT_WINDOW": "10",
        "LANEWAY_DRIFT_INTERVAL_S": "0.5",
    }
    for stack in own_stack(folder, env, lanes=(Lane.BULK,)):
        running = stack.settings
        yield (
            stack,
            {
                **env,
                "LANEWAY_KAFKA_BOOTSTRAP": running.kafka.bootstrap,
                "LANEWAY_REDIS_URL": running.redis.url,
            },
        )


def settings_of(env: dict[str, str]) -> Settings:
    with pytest.MonkeyPatch.context() as patch:
        for name, value in env.items():
            patch.setenv(name, value)
        return Settings()


async def answered(settings: Settings, ids: set[str], timeout_s: float = 180.0) -> None:
    """Until every id of ``ids`` has its result on the results topic."""
    give_up = time.monotonic() + timeout_s
    while time.monotonic() < give_up:
        records = await read_topic(settings, settings.topic("results"), timeout_s=5.0)
        seen = {json.loads(r.value)["id"] for r in records}
        if ids <= seen:
            return
        await asyncio.sleep(0.5)
    pytest.fail(f"no result within {timeout_s:.0f} s for {sorted(ids - seen)[:5]}")


async def direct(
    settings: Settings, tag: str, path: AnswerPath, n: int, version: str | None
) -> None:
    """``n`` requests routed to ``path`` (and ``version``) on the bulk lane,
    as the classifier routes them; returns once all are answered."""
    ids = set()
    for i in range(n):
        prompt = f"Name a fruit, number {i}."
        request = InferenceRequest(id=f"{tag}-{i}", prompt=prompt, max_tokens=2)
        now = int(time.time() * 1000)
        routed = RoutedRequest(
            request=request,
            lane=Lane.BULK,
            path=path,
            reply_to=settings.replies_topic,
            produced_at_ms=now,
            routed_at_ms=now,
            version=version,
        )
        await produce_to_lane(settings, routed)
        ids.add(request.id)
    await answered(settings, ids)


async def through_classifier(settings: Settings, prompts: list[str], tag: str) -> None:
    async with LanewayClient(settings.kafka, client_id=f"doctor-{uuid.uuid4().hex[:6]}") as client:
        futures = [
            await client.submit({"id": f"{tag}-{i}", "prompt": p, "max_tokens": 2, "lane": "bulk"})
            for i, p in enumerate(prompts)
        ]
        await asyncio.wait_for(asyncio.gather(*futures), 300)


async def drift_alarmed(settings: Settings, timeout_s: float = 30.0) -> dict[str, float]:
    give_up = time.monotonic() + timeout_s
    while time.monotonic() < give_up:
        for record in await read_topic(settings, settings.topic("quality"), timeout_s=3.0):
            event = QualityEvent.model_validate_json(record.value)
            if event.kind == "drift" and event.drift:
                return event.drift
        await asyncio.sleep(0.5)
    pytest.fail(f"the classifier raised no drift alarm within {timeout_s:.0f} s")


def doctor(env: dict[str, str], stack: Stack, *args: str) -> tuple[int, str]:
    urls = [f"--metrics={c.name}=http://127.0.0.1:{c.http_port}/metrics" for c in stack.children]
    done = subprocess.run(
        [sys.executable, "-m", "streams.cli.main", "doctor", *urls, *args],
        env={**os.environ, **env},
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert done.returncode in (0, 1), done.stderr[-3000:]
    return done.returncode, done.stdout


PLAIN = [f"What is the capital of country number {i}?" for i in range(10)]
CODE = [f"Why does `for i in range({i}): print(i ** 2)` loop?" for i in range(10)]


@pytest.mark.slow  # about 90 s on 2 busy cores: a stack, a llama.cpp server, 44 requests
async def test_doctor_names_a_slow_path_a_promotion_and_drift(
    doctor_stack: tuple[Stack, dict[str, str]], proxy: SlowProxy
) -> None:
    stack, env = doctor_stack
    settings = settings_of(env)
    tag = uuid.uuid4().hex[:6]
    began = time.time()

    # The baseline: plain questions (the drift baseline), both paths at
    # their usual speed on version v1, then code questions (the drift).
    await through_classifier(settings, PLAIN, f"plain-{tag}")
    await direct(settings, f"light-a-{tag}", AnswerPath.LIGHT, 6, None)
    await direct(settings, f"heavy-a-{tag}", AnswerPath.HEAVY, 6, None)
    await through_classifier(settings, CODE, f"code-{tag}")
    drifted = await drift_alarmed(settings)  # features and their PSI

    # The faults: the heavy path's backend slows down, and v2 is promoted.
    faults_at = time.time()
    proxy.slow, proxy.delay_s = ("smollm2-heavy",), HEAVY_DELAY_S
    registry = load_registry(settings.routing.models_file, settings.backend)
    redis = settings.redis.client()
    try:
        store = state.RolloutStore(redis, settings.redis.key_prefix)
        live = state.apply(registry, await store.read() or {})
        await store.write(state.promote(live, "heavy", "v2", now_ms=int(faults_at * 1000)))
    finally:
        await redis.aclose()
    await direct(settings, f"light-b-{tag}", AnswerPath.LIGHT, 6, None)
    await direct(settings, f"heavy-b-{tag}", AnswerPath.HEAVY, 6, "v2")

    # The window ends now and its recent part begins where the faults did.
    until = time.time()
    recent, window = until - faults_at, until - began + 60
    args = [f"--until={until:.3f}", f"--recent={recent:.3f}s", f"--window={window:.0f}s"]
    # Judged on the absolute change: the fault adds 10 s to the heavy path,
    # while a busy test machine moved the baselines between 1 and 4 s. A
    # light path 4 s slower would be a fault too.
    args += ["--slower", "1.5", "--slower-ms", "4000", "--min-samples", "5"]
    code, out = doctor(env, stack, *args, "--json")
    assert code == 1, out
    report = json.loads(out)
    warns = [f for f in report["findings"] if f["level"] == "warn"]
    warned = {(f["step"], f["subject"]) for f in warns}
    lines = "\n".join(
        [f"{f['step']} {f['subject']}: {f['message']}" for f in report["findings"]]
        + [f"note: {note}" for note in report["notes"]]
    )

    # 1: the slow path, and not the other one.
    assert ("slower", "path heavy") in warned, lines
    assert ("slower", "path light") not in warned, lines
    # 3: the time went into the heavy path's inference on the bulk lane.
    assert ("time", "lane bulk/heavy inference") in warned, lines
    assert not [k for k in warned if k[0] == "time" and "light" in k[1]], lines
    # 4: the promotion, the version that now answers, and the drift.
    model = [f["message"] for f in warns if f["step"] == "model"]
    assert any("version v2 set active" in m for m in model), lines
    assert any("answered by version v2" in m and "v1" in m for m in model), lines
    drift = [m for m in model if m.startswith("drift")]
    assert len(drift) == 1 and all(f"{name} PSI" in drift[0] for name in drifted), lines
    # 2: every process answered and is ready; no GPU here, skipped cleanly.
    assert not [k for k in warned if k[0] == "resources"], lines
    gpu = [f["message"] for f in report["findings"] if f["subject"] == "gpu"]
    assert gpu and "no GPU visible" in gpu[0], lines
    assert report["gpus"] is None

    # The same as an operator reads it: the steps in order, one line each.
    code, text = doctor(env, stack, *args)
    print(f"\n{text}")  # what the operator would read (pytest -s)
    assert code == 1
    steps = [text.index(h) for h in ("1. what got", "2. resources", "3. where", "4. the model")]
    assert steps == sorted(steps), text
    assert "!! path heavy:" in text and "->" in text
