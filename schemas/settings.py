"""One frozen settings object per process, built once in ``main()`` and
passed down. Every field reads an environment variable; the sub-settings
each own a prefix (``LANEWAY_KAFKA_BOOTSTRAP``, ``LANEWAY_REDIS_URL``,
``LANEWAY_REALTIME_MAX_BATCH_SIZE``, ...). Nothing below ``main()`` reads the
environment.
"""

from __future__ import annotations

import ssl
from pathlib import Path
from typing import Any, Literal

from pydantic import BaseModel, ConfigDict, Field, SecretStr, field_validator, model_validator
from pydantic_settings import BaseSettings, SettingsConfigDict

from schemas.backends import BackendName
from schemas.messages import AnswerPath, Lane, RequestLimits

__all__ = [
    "BackendSettings",
    "BatchSettings",
    "CacheSettings",
    "ClassifierSettings",
    "DriftSettings",
    "FlowSettings",
    "GatewaySettings",
    "KafkaSettings",
    "LaneSettings",
    "LimitsSettings",
    "PrewarmSettings",
    "RateLimitSettings",
    "RedisSettings",
    "RolloutSettings",
    "RoutingSettings",
    "RulesSettings",
    "SessionSettings",
    "Settings",
    "StreamSettings",
    "StudentSettings",
    "TenantLimit",
    "TracingSettings",
    "TuneSettings",
]


def _config(prefix: str) -> SettingsConfigDict:
    return SettingsConfigDict(env_prefix=prefix, frozen=True, extra="ignore")


class KafkaSettings(BaseSettings):
    model_config = _config("LANEWAY_KAFKA_")

    bootstrap: str = "127.0.0.1:9092"
    """Comma-separated ``host:port`` list of the Kafka-protocol brokers."""
    topic_prefix: str = "laneway"
    """Every topic name starts with this (``laneway.requests``, ...)."""
    partitions: int = Field(default=4, ge=1)
    """Partitions of the request, lane and output topics (and faust's changelogs)."""
    replication_factor: int = Field(default=1, ge=1)
    """Replication factor of the topics laneway creates (`laneway topics`): 1 on
    the embedded broker; 3 on a production Kafka cluster."""
    enable_idempotence: bool = False
    """Idempotent producer. On for Apache Kafka; Tansu's memory engine rejects
    InitProducerId, so the embedded default keeps it off."""
    security_protocol: Literal["PLAINTEXT", "SSL", "SASL_PLAINTEXT", "SASL_SSL"] = "PLAINTEXT"
    """How the Kafka clients connect: PLAINTEXT, SSL, SASL_PLAINTEXT or
    SASL_SSL (aiokafka's ``security_protocol``)."""
    sasl_mechanism: str | None = None
    """SASL mechanism (PLAIN, SCRAM-SHA-256, SCRAM-SHA-512) for the SASL
    protocols; unset: none."""
    sasl_username: str | None = None
    """SASL user name, with ``sasl_password``."""
    sasl_password: SecretStr | None = None
    """SASL password; kept out of logs and reprs."""
    ssl_cafile: str | None = None
    """CA bundle for SSL/SASL_SSL; the system's trust store when unset."""
    ssl_certfile: str | None = None
    """Client certificate (mutual TLS)."""
    ssl_keyfile: str | None = None
    """Client private key for SSL client authentication, with ``ssl_certfile``."""
    request_timeout_ms: int = Field(default=30_000, ge=1_000)
    """How long a Kafka request (metadata, fetch, produce) may take before the
    client gives up on it and retries (aiokafka's ``request_timeout_ms``)."""
    produce_timeout_ms: int = Field(default=5_000, ge=1_000)
    """How long a worker's produce waits for its acknowledgement before it
    fails and ``deliver`` sends the record again (a duplicate at worst, which
    readers drop by id). The embedded Tansu broker now and then answers a
    produce with NotLeaderForPartition until the request times out, then
    takes the resend at once: with the 30 s request timeout that stalled a
    lane for 30 s."""
    fetch_max_wait_ms: int = Field(default=20, ge=1, le=10_000)
    """Longest the broker may hold an empty fetch. Bounds how late a consumer
    sees a new record on a quiet topic; lower costs idle polling."""
    client_id: str | None = Field(default=None, pattern=r"^[A-Za-z0-9._-]{1,200}$")
    """The SDK's client id, and so its reply topic ``<prefix>.replies.<id>``.
    Unset: ``client-<host>-<program>``, the same for every run of a program on
    a host, so that restarts reuse one reply topic instead of leaving one
    behind each."""

    def ssl_context(self) -> ssl.SSLContext | None:
        """The TLS context for SSL/SASL_SSL, else ``None``."""
        if self.security_protocol not in ("SSL", "SASL_SSL"):
            return None
        context = ssl.create_default_context(cafile=self.ssl_cafile)
        if self.ssl_certfile:
            context.load_cert_chain(self.ssl_certfile, self.ssl_keyfile)
        return context

    def client_options(self) -> dict[str, object]:
        """Connection options shared by every aiokafka client."""
        options: dict[str, object] = {
            "bootstrap_servers": self.bootstrap,
            "security_protocol": self.security_protocol,
            "request_timeout_ms": self.request_timeout_ms,
        }
        context = self.ssl_context()
        if context is not None:
            options["ssl_context"] = context
        if self.sasl_mechanism:
            options["sasl_mechanism"] = self.sasl_mechanism
            options["sasl_plain_username"] = self.sasl_username
            options["sasl_plain_password"] = (
                self.sasl_password.get_secret_value() if self.sasl_password else None
            )
        return options


class RedisSettings(BaseSettings):
    model_config = _config("LANEWAY_REDIS_")

    def client(self) -> Any:
        """An asyncio Redis client with this process's timeouts: a
        ``redis.asyncio.cluster.RedisCluster`` with ``cluster`` set (``url``
        names any node; the client learns the others), else a plain one."""
        from redis.asyncio.retry import Retry
        from redis.backoff import NoBackoff
        from redis.exceptions import ConnectionError as RedisConnectionError

        # One immediate retry on a broken connection: after a Redis
        # restart the pooled connections are stale, and the first command
        # on each would fail though Redis is back. Timeouts are not
        # retried: a slow Redis must not cost twice its timeout. On a
        # cluster the retry also refreshes the slot map, so a command after
        # a failover finds the promoted replica.
        retry = Retry(NoBackoff(), 1, supported_errors=(RedisConnectionError,))
        if self.cluster:
            from redis.asyncio.cluster import RedisCluster

            return RedisCluster.from_url(
                self.url,
                socket_timeout=self.timeout_s,
                socket_connect_timeout=self.timeout_s,
                retry=retry,
            )
        import redis.asyncio as aioredis

        return aioredis.from_url(
            self.url,
            socket_timeout=self.timeout_s,
            socket_connect_timeout=self.timeout_s,
            retry=retry,
        )

    url: str = "redis://127.0.0.1:6379/0"
    """Redis or Valkey URL; ``laneway up`` starts an embedded Valkey when unset."""
    cluster: bool = False
    """Talk to a Redis (or Valkey) Cluster: ``url`` names any of its nodes.
    Every key carries a hash tag (``streams.stores.keyspace``), so each
    script and transaction stays in one slot (``docs/redis-cluster.md``)."""
    key_prefix: str = "laneway"
    """Starts every key. No braces: hash tags are the key layout's own."""
    timeout_s: float = Field(default=0.5, gt=0)
    """Socket timeout: a slow or absent Redis never holds up a batch for longer."""
    result_ttl_s: int = Field(default=3600, ge=1)
    """How long a worker keeps each produced result for replay after a redelivery."""

    @field_validator("key_prefix")
    @classmethod
    def _no_hash_tag(cls, prefix: str) -> str:
        if "{" in prefix or "}" in prefix:
            raise ValueError(
                f"key_prefix {prefix!r} holds a brace: braces mark Redis Cluster hash "
                "tags, which the key layout sets itself"
            )
        return prefix


class TenantLimit(BaseModel):
    model_config = ConfigDict(frozen=True, extra="forbid")

    rps: float = Field(gt=0)
    """Sustained requests per second."""
    burst: int = Field(ge=1)
    """Requests that may arrive at once after a quiet spell."""


class RateLimitSettings(BaseSettings):
    """Per-tenant token buckets in Redis, checked by the classifier."""

    model_config = _config("LANEWAY_RATELIMIT_")

    enabled: bool = True
    """Per-tenant rate limits in the classifier (token buckets in Redis);
    false: no request is refused for its rate."""
    default: TenantLimit = TenantLimit(rps=50.0, burst=100)
    """Limit of a tenant not listed in ``tenants`` (and of requests without one)."""
    tenants: dict[str, TenantLimit] = Field(default_factory=dict)
    """Per-tenant limits, e.g. ``LANEWAY_RATELIMIT_TENANTS='{"acme": {"rps": 5, "burst": 10}}'``."""
    fail_open: bool = True
    """When Redis cannot be reached: admit (True) or refuse with INF-429 (False)."""

    def limit_for(self, tenant: str | None) -> TenantLimit:
        return self.tenants.get(tenant or "", self.default)


class FlowSettings(BaseSettings):
    """Degradation under load (``streams.classify.flow``)."""

    model_config = _config("LANEWAY_FLOW_")

    enabled: bool = True
    """Degradation under load: false keeps every request on its lane and path
    whatever the backlog."""
    enter: tuple[int, int, int] = (32, 64, 128)
    """Records waiting on the lanes at which levels 1, 2 and 3 begin."""
    exit: tuple[int, int, int] = (16, 32, 64)
    """Backlog below which a level may be left (after ``hold_s``)."""
    p95_enter_ms: tuple[int, int, int] = (10_000, 20_000, 40_000)
    """p95 latency of the realtime or medium lane (from the quality stream) at
    which levels 1, 2 and 3 begin; the higher of the two pressures sets the level."""
    p95_exit_ms: tuple[int, int, int] = (5_000, 10_000, 20_000)
    """p95 latency below which a level may be left (after ``hold_s``), per level."""
    hold_s: float = Field(default=5.0, ge=0)
    """How long a load level holds before it may be left, so the system does
    not flap at a threshold."""
    interval_s: float = Field(default=1.0, gt=0)
    """How often workers report their backlog (at least: they also report
    when a batch starts or ends) and the classifier re-reads it for its load
    levels."""
    gate_interval_s: float = Field(default=0.2, gt=0)
    """How often the classifier re-reads the realtime lane's backlog for its
    gate (``RealtimeGate``); between reads it estimates."""
    shed_retry_after_ms: int = Field(default=5_000, ge=1)
    """The ``retry_after_ms`` of a request shed under load (INF-429): when the
    client should ask again."""
    realtime_max_backlog: int | None = Field(default=16, ge=1)
    """Realtime model requests waiting on the realtime lane at which new ones
    are refused at once (INF-429, ``realtime_retry_after_ms``) instead of
    queueing past their deadline; rule and cache answers are still given.
    ``None``: realtime is never refused."""
    realtime_max_wait_ms: int | None = Field(default=1_000, ge=1)
    """How long the realtime lane's waiting model requests may take its
    workers to reach (waiting / the records they answer a busy second)
    before new ones are refused at once like past ``realtime_max_backlog``.
    Where the workers' capacity is known (their heartbeat cards), only the
    requests queued behind the round they run count: that round is the one
    ``realtime_max_batches`` keeps for the requests that ask for realtime.
    ``None``: only the count mark."""
    realtime_max_batches: float | None = Field(default=2.0, gt=0)
    """How many times over the realtime lane's model requests (running and
    waiting) may fill what its live workers run at once (each worker's
    ``max_batch_size`` x ``max_inflight_batches``, from its heartbeat card)
    before new ones that asked for realtime are refused at once like past
    ``realtime_max_backlog``. At 2 the lane holds the round running and a
    full one waiting, so a request let in waits at most for the running
    batch; at 1 it holds one round, and a burst past one batch is refused,
    on an idle lane as well. A mark in the workers' own batches does not
    depend on how fast the machine is, where ``realtime_max_wait_ms`` is one
    machine's figure. ``None``: no such mark."""
    realtime_spill_batches: float | None = Field(default=1.0, gt=0)
    """The same mark, lower, for the model requests the classifier put on
    realtime by itself (simple work sent without a lane or a tight
    deadline): past it they go to medium, and the room up to
    ``realtime_max_batches`` is kept for the requests that asked for
    realtime. ``None``: they spill only when the lane is full."""
    realtime_retry_after_ms: int = Field(default=1_000, ge=1)
    """The ``retry_after_ms`` of a realtime model request refused at one of the
    realtime marks (INF-429)."""
    realtime_steer: bool = True
    """Write each realtime model request to a partition of the realtime
    worker with the most room that serves its path, and judge the marks
    above per worker, where the workers' heartbeat cards list the
    partitions they hold (``streams.classify.gate``). ``False``: records go
    where their key hashes and the marks judge the lane's sums."""

    @model_validator(mode="after")
    def _hysteresis(self) -> FlowSettings:
        for enter, exit in ((self.enter, self.exit), (self.p95_enter_ms, self.p95_exit_ms)):
            if any(x >= e for e, x in zip(enter, exit, strict=True)):
                raise ValueError(f"every exit mark must be below its enter mark: {enter} {exit}")
        spill, refuse = self.realtime_spill_batches, self.realtime_max_batches
        if spill is not None and refuse is not None and spill > refuse:
            raise ValueError(
                f"realtime_spill_batches ({spill}) must not be above "
                f"realtime_max_batches ({refuse})"
            )
        return self


class LaneSettings(BaseSettings):
    """How one lane's workers batch. Realtime is small and short, bulk large and long."""

    model_config = _config("LANEWAY_LANE_")

    max_batch_size: int = Field(default=8, ge=1, le=1024)
    """Most requests run together in one batch."""
    max_wait_ms: int = Field(default=50, ge=0, le=60_000)
    """Longest a batch waits to fill after its first request arrives."""
    paths: tuple[AnswerPath, ...] | None = Field(default=None, min_length=1)
    """The model paths this lane's workers load and serve (the rules path is
    always served), by their registry names. Unset: realtime the cheapest
    path of the model registry (built-in: ``light``), bulk the most capable
    (``heavy``), medium every path that serves the lane (both); see
    ``streams.routing.registry.worker_paths``. The router sends a lane only
    the paths that a live worker on it announces (``streams.stores.workerboard``)."""
    nice: int = Field(default=5, ge=0, le=19)
    """CPU priority of the lane's worker processes (``os.nice``): on a shared
    CPU the realtime worker (0) is scheduled ahead of medium (5) and bulk
    (10), so bulk load takes the cores realtime leaves free."""
    max_inflight_batches: int = Field(default=2, ge=1, le=64)
    """Batches a worker runs at once. The next batch is collected while one
    runs, and a backend that batches continuously (llama.cpp, vLLM) lets its
    requests join the running decode; offsets are still committed in order."""
    tune_tolerance: float = Field(default=0.05, ge=0, lt=1)
    """How a kept batch-size tuning (``laneway check --tune``,
    ``workers.tune``) is read for this lane: the candidate with the fewest
    sequences at once (batch size x batches in flight) whose tokens/s is
    within this share of the best one's. 0: the best tokens/s whatever it
    costs in latency; the default 0.05 does not pay a larger batch (each
    answer's tokens come slower) for a gain within a noisy machine's
    measuring error."""


class RealtimeLaneSettings(LaneSettings):
    """One small model: realtime answers come from the fast path."""

    model_config = _config("LANEWAY_REALTIME_")
    nice: int = Field(default=0, ge=0, le=19)
    max_batch_size: int = Field(default=2, ge=1, le=1024)
    """Two: a step of four sequences made every realtime answer slower, and
    at 3x load the realtime p99 was about twice its 1x with batches of four
    (``laneway bench overload --embedded``, README)."""
    max_wait_ms: int = Field(default=10, ge=0, le=60_000)
    max_inflight_batches: int = Field(default=1, ge=1, le=64)
    """One batch at a time: a second one in the decoder nearly tripled the
    realtime inference p99 at 3x load (``laneway bench overload --embedded``)."""
    tune_tolerance: float = Field(default=0.25, ge=0, lt=1)
    """Realtime prefers latency: of the tuned candidates, the one with the
    fewest sequences at once whose tokens/s is within 25% of the best (a
    realtime answer's tokens come about as fast as the sequences decoded
    beside it let them)."""


class MediumLaneSettings(LaneSettings):
    model_config = _config("LANEWAY_MEDIUM_")
    max_batch_size: int = Field(default=8, ge=1, le=1024)
    max_wait_ms: int = Field(default=50, ge=0, le=60_000)


class BulkLaneSettings(LaneSettings):
    """One capable model: bulk work is not in a hurry."""

    model_config = _config("LANEWAY_BULK_")
    nice: int = Field(default=10, ge=0, le=19)
    max_batch_size: int = Field(default=32, ge=1, le=1024)
    max_wait_ms: int = Field(default=500, ge=0, le=60_000)


class LimitsSettings(BaseSettings):
    model_config = _config("LANEWAY_LIMITS_")

    max_text_bytes: int = Field(default=64 * 1024, ge=1)
    """Largest prompt (or sum of message contents) in UTF-8 bytes."""
    max_tokens_min: int = Field(default=1, ge=1)
    """Smallest ``max_tokens`` a request may ask for."""
    max_tokens_max: int = Field(default=4096, ge=1)
    """Largest ``max_tokens`` a request may ask for; more is INF-400."""
    max_id_chars: int = Field(default=128, ge=1)
    """Longest request id accepted; a longer one is INF-400."""
    max_record_bytes: int = Field(default=256 * 1024, ge=1024)
    """Records larger than this are refused before JSON decoding."""
    tenant_reply_topics: bool = False
    """Confine a request that names a tenant to ``<prefix>.replies.<tenant>[.*]``."""

    @model_validator(mode="after")
    def _range(self) -> LimitsSettings:
        if self.max_tokens_min > self.max_tokens_max:
            raise ValueError(
                f"max_tokens_min={self.max_tokens_min} > max_tokens_max={self.max_tokens_max}"
            )
        return self


class RoutingSettings(BaseSettings):
    """Request classification and the smart router (``streams.routing.features``,
    ``streams.classify.router``)."""

    model_config = _config("LANEWAY_ROUTING_")

    light_max_prompt_tokens: int = Field(default=48, ge=1)
    """Prompts estimated above this many tokens are too complex for the light model."""
    realtime_max_deadline_ms: int = Field(default=3_000, ge=1)
    """A request whose deadline is at most this goes to the realtime lane."""
    rules_enabled: bool = True
    """Answer from the rule book in the classifier; false: rules never answer
    (every request goes to the cache and the models)."""
    deep_dialogue: int = Field(default=6, ge=0)
    """Conversations longer than this many turns are at least moderately complex."""
    tenant_tiers: dict[str, Literal["free", "standard", "premium"]] = Field(default_factory=dict)
    """Tier per tenant (``{"acme": "premium"}``); premium work rides the realtime lane."""
    w_lat: float = Field(default=0.4, ge=0)
    """Weight of the normalised latency in the router's score (the formula at ``w_fail``)."""
    w_cost: float = Field(default=0.3, ge=0)
    """Weight of the normalised cost in the router's score (the formula at ``w_fail``)."""
    w_fail: float = Field(default=0.3, ge=0)
    """``score = w_lat*latency_norm + w_cost*cost_norm + w_fail*(1-success_rate)``; lowest wins."""
    min_success_rate: float = Field(default=0.8, ge=0, le=1)
    """A path below this windowed success rate is passed over while another
    eligible path is healthy (exploration still samples it)."""
    exploration: float = Field(default=0.05, ge=0, le=1)
    """Share of model-path requests sent to a random eligible path, so a
    recovered path is tried again and its statistics stay current."""
    models_file: Path | None = None
    """Model registry YAML (name, version, backend, path, lane, cost per 1k
    tokens, max batch); the built-in registry of the two embedded models when unset."""
    weights_refresh_s: float = Field(default=1.0, gt=0)
    """How often a classifier re-reads the route weights the quality agent publishes."""
    ewma_alpha: float = Field(default=0.2, gt=0, le=1)
    """Weight of the newest latency sample in a path's moving average."""
    success_window: int = Field(default=50, ge=1)
    """Terminal results per path over which the success rate is counted."""
    feedback_weight: float = Field(default=0.5, ge=0, le=1)
    """How much a -1 feedback lowers a path's quality (a failed result counts 1)."""
    feedback_wait_s: float = Field(default=60.0, ge=0)
    """How long feedback that came before the quality loop knew its answer
    (a fast client) waits to be joined, tried again every second, before it
    is dropped and counted (``laneway_feedback_unmatched_total``)."""
    force_path: AnswerPath | None = None
    """Send every request to one model path, skipping cache, rules and the
    router (a single-path baseline; ``laneway bench`` compares against it)."""
    learned_router: Path | None = None
    """A learned router artifact (``laneway distill train``, one JSON file):
    one more signal beside latency, cost and failure. Unset: routing exactly
    as without it."""
    w_learned: float = Field(default=1.0, ge=0)
    """Weight of the learned term: the light path's score gains
    ``w_learned * (logit(threshold) - logit(p))``. At 1 the live latency/cost
    difference of the two paths (~0.3-0.5 on the embedded models) moves the
    calibrated threshold by about that much in logit units. 0 turns the
    learned router off (routing as without an artifact)."""
    learned_router_dir: Path | None = None
    """A directory of learned router artifacts (``*.json``, each with its own
    ``version``): the router versions ``laneway models canary|shadow|promote
    router VERSION`` can roll out, beside ``rule`` (no learned router). Every
    classifier re-lists it on its roll-out timer. ``learned_router`` (if set)
    is the active one until the roll-out state says otherwise."""
    learned_max_complexity: Literal["simple", "moderate", "complex"] = "complex"
    """The learned router judges requests up to this complexity class (every
    model serving the lane competes for them); above it the registry's
    ``max_complexity`` rule alone decides."""


class RolloutSettings(BaseSettings):
    """Model versions: canary, shadow and automatic rollback (``streams.rollout``)."""

    model_config = _config("LANEWAY_ROLLOUT_")

    refresh_s: float = Field(default=2.0, gt=0)
    """How often a classifier re-reads the roll-out state in Redis (and the
    versions live workers serve): a ``laneway models`` change reaches every
    replica within this."""
    auto_rollback: bool = True
    """The quality loop drains a canary worse than its active version to 0%."""
    min_events: int = Field(default=20, ge=1)
    """Outcomes a canary needs since its share was set before it is judged."""
    success_margin: float = Field(default=0.1, ge=0, le=1)
    """Rolled back when its success rate is below the active version's by more."""
    latency_margin: float = Field(default=0.5, ge=0)
    """Rolled back when its latency is above the active version's by more
    than this ratio (0.5: 50% slower)."""
    feedback_margin: float = Field(default=0.2, ge=0, le=1)
    """Rolled back when its feedback quality (0..1) is below the active
    version's by more."""
    router_heavy_margin: float = Field(default=0.25, ge=0, le=1)
    """A canary router is also rolled back when the share of its requests
    that went heavy is above the active router's by more (cost)."""


class ClassifierSettings(BaseSettings):
    """How the classifier takes its records (``streams.classify.batch``)."""

    model_config = _config("LANEWAY_CLASSIFIER_")

    batch_max: int = Field(default=256, ge=1, le=10_000)
    """Most request records classified together: one Redis round trip, one
    embedding call and one gathered produce per batch."""
    batch_wait_ms: int = Field(default=10, ge=1, le=1_000)
    """Longest one poll of the request topic waits when nothing is fetched
    yet. A batch is what the consumer holds when the classifier asks
    (``streams.kafka.intake``): under load it grows by itself while the
    batch before is classified, and a lone request is taken the moment it
    is fetched, so this wait adds no latency to it."""
    settle_s: float = Field(default=10.0, gt=0, le=300)
    """On a rebalance or stop, longest the classifier waits for the batches
    in flight to be acknowledged before it commits and lets the partitions
    go. A batch still unacknowledged then commits nothing: the partitions'
    next owner reads it again (at-least-once)."""


class CacheSettings(BaseSettings):
    """The response cache the classifier checks first (``streams.cache.response``)."""

    model_config = _config("LANEWAY_CACHE_")

    enabled: bool = True
    """Answer repeated questions from the Redis response cache (exact, and
    semantic by embedding); false: the cache is neither read nor written."""
    ttl_s: int = Field(default=86_400, ge=1)
    """Lifetime of a cached answer (one day); answers about a moving time get
    ``relative_time_ttl_s``."""
    relative_time_ttl_s: int = Field(default=3_600, ge=1)
    """Lifetime of an answer to a question about a time that moves on
    ("today", "tomorrow", "now", "the latest", "this week":
    ``streams.cache.keys.time_relative``), at most ``ttl_s``: kept a day,
    the answer to "what is on today" would be served tomorrow."""
    semantic: bool = True
    """Also answer paraphrases: nearest cached prompt by embedding above ``threshold``."""
    threshold: float = Field(default=0.93, gt=0, le=1)
    """Cosine similarity a semantic hit needs. Measured with all-MiniLM-L6-v2:
    "a large animal that lives in the sea" / "a big animal living in the sea"
    0.972, but "... large ..." / "... small ..." 0.908, so 0.9 would be too loose."""
    max_entries: int = Field(default=10_000, ge=1)
    """Bound of the semantic index (oldest entries leave it first)."""
    per_tenant: bool = False
    """Keep each tenant's cache entries apart."""
    sync_interval_s: float = Field(default=1.0, gt=0)
    """How often the semantic index picks up entries other processes wrote."""
    evict_at_feedback: float | None = Field(default=-0.5, ge=-1, le=1)
    """Client feedback at or below this score evicts the cache entry the
    answer came from or was stored under; unset (``null``) never evicts."""
    claim_ttl_s: float = Field(default=60.0, ge=0)
    """How long a lane worker's mark on a question it is decoding holds
    (``workers.claims``): another worker with the same question meanwhile
    waits for that answer instead of decoding it again. Longer than a
    batch's decode; ``0``: no marks, every worker decodes its own copy."""


class RulesSettings(BaseSettings):
    """The rules engine (``streams.rules.engine``)."""

    model_config = _config("LANEWAY_RULES_")

    file: Path | None = None
    """YAML rule file; the built-in small-talk rules when unset."""
    reload_interval_s: float = Field(default=1.0, gt=0)
    """How often the rule file is checked for changes (hot reload)."""


class SessionSettings(BaseSettings):
    """Conversation history per ``session_id`` (``streams.stores.sessions``)."""

    model_config = _config("LANEWAY_SESSION_")

    enabled: bool = True
    """Keep conversation history per ``session_id`` in Redis, so a turn
    carries the turns before it."""
    max_tokens: int = Field(default=512, ge=0)
    """History kept per session, oldest turns trimmed first (estimated tokens)."""
    ttl_s: int = Field(default=3_600, ge=1)
    """A session is forgotten this long after its last turn (each turn
    refreshes it)."""


class PrewarmSettings(BaseSettings):
    """Hot questions and the nightly cache pre-warm (``streams.cache.prewarm``)."""

    model_config = _config("LANEWAY_PREWARM_")

    track: bool = True
    """The classifier counts cacheable questions per day in Redis."""
    track_max: int = Field(default=10_000, ge=10)
    """Distinct questions kept per day; the least asked leave first."""
    flush_interval_s: float = Field(default=5.0, gt=0)
    """How often the classifier adds its counts to Redis (one round trip)."""
    days: int = Field(default=7, ge=1, le=62)
    """History the pre-warm ranks questions over (daily counts expire after it)."""
    top: int = Field(default=200, ge=1)
    """At most this many hot questions are warmed per run."""
    min_count: int = Field(default=3, ge=1)
    """Asked fewer times than this over ``days``: not hot."""
    refresh_below_s: int = Field(default=21_600, ge=0)
    """An entry with more time to live than this is left alone."""
    concurrency: int = Field(default=8, ge=1)
    """Pre-warm requests in flight at once (they ride the bulk lane)."""
    timeout_s: float = Field(default=900.0, gt=0)
    """How long one pre-warm request may take before it counts as failed."""


class DriftSettings(BaseSettings):
    """Feature drift against a baseline (``streams.classify.drift``)."""

    model_config = _config("LANEWAY_DRIFT_")

    enabled: bool = True
    """Watch the request features for drift (PSI) against a baseline and emit
    ``drift`` quality events."""
    baseline_size: int = Field(default=500, ge=10)
    """The first this many requests form the baseline distribution."""
    window: int = Field(default=500, ge=10)
    """Most recent requests compared against it."""
    threshold: float = Field(default=0.2, gt=0)
    """PSI above which a drift quality event is emitted (0.1 minor, 0.25 major)."""
    interval_s: float = Field(default=30.0, gt=0)
    """How often the classifier compares the recent window with the baseline."""


class StudentSettings(BaseSettings):
    """``laneway distill student``: the light model fine-tuned on the heavy
    model's answers (``streams.distill.student``); each is also a flag."""

    model_config = _config("LANEWAY_DISTILL_STUDENT_")

    min_rows: int = Field(default=50, ge=1)
    """Fewer distinct training prompts than this: the student is refused."""
    held_out: float = Field(default=0.2, ge=0, lt=1)
    """Share of prompts kept out of training, where agreement is measured."""
    steps: int = Field(default=60, ge=1)
    """Optimiser steps (batches of ``batch_size`` pairs)."""
    batch_size: int = Field(default=8, ge=1)
    rank: int = Field(default=8, ge=1)
    """LoRA rank; alpha is twice it."""
    lr: float = Field(default=1e-3, gt=0)
    max_new_tokens: int = Field(default=64, ge=1)
    """Longest answer generated on a held-out prompt."""
    agree_at: float = Field(default=0.75, ge=0, le=1)
    """Answer cosine that counts as agreeing with the teacher (as ``distill train``)."""


class BackendSettings(BaseSettings):
    """Which backend serves each model path, and how it is reached."""

    model_config = _config("LANEWAY_BACKEND_")

    light: BackendName = "llamacpp"
    """Backend kind of the built-in registry's light path (one of
    ``schemas.backends.BACKEND_KINDS``)."""
    light_model: str = "smollm2-135m"
    """The light path's model: a wheel model's name (``smollm2-135m``,
    ``gemma3-270m``), a ``.gguf`` file, or the served model's name for the
    openai and vllm backends."""
    heavy: BackendName = "llamacpp"
    """Backend kind of the built-in registry's heavy path."""
    heavy_model: str = "gemma3-270m"
    """The heavy path's model, named as ``light_model``."""
    model_dir: Path = Path.home() / ".cache" / "laneway" / "models"
    """Where models assembled from wheels (Gemma's chunks) are written once."""
    n_threads: int = Field(default=1, ge=1)
    """llama.cpp threads per model. Three lane workers share the machine: on 2
    cores, 1 thread each gave 3x the throughput of 2 each (``laneway bench``)."""
    n_ctx: int = Field(default=2048, ge=256)
    """Context length per sequence, in tokens (prompt plus answer); a prompt
    that leaves no room to answer is INF-400."""
    system_prompt: str = "You are a helpful assistant. Answer briefly and accurately."
    """Put in front of requests that bring no system message of their own ("" = none)."""
    repeat_penalty: float = Field(default=1.1, ge=1.0, le=2.0)
    """llama.cpp repetition penalty; small models loop without one."""
    llamacpp_max_sequences: int = Field(default=8, ge=1, le=64)
    """Sequences the llama.cpp backend decodes together, each with a KV cache
    of ``n_ctx`` tokens of its own (the context holds ``n_ctx`` times this
    plus one, the shared prompt prefix's); more requests wait for one to
    finish. On 2 cores of an AMD EPYC one llama.cpp step cost Gemma-3-270M
    2.3x as much CPU for 2 sequences as for 1, 4.5x for 8, 8x for 16
    (less on a Xeon with AVX512-VNNI: see the README): batching pays when
    many answers are long (``laneway bench backend``)."""
    llamacpp_max_batch_tokens: int = Field(default=8192, ge=16)
    """Token budget of the sequences decoded together: their prompts plus
    ``max_tokens`` may not add up to more; a request waits until it fits. A
    ``max_tokens`` larger than the room its prompt leaves (in this budget and
    in ``n_ctx``) is shortened to it; a prompt that leaves none is INF-400."""
    llamacpp_batch_invariant: bool = True
    """A greedy answer does not depend on what it was batched with: separate
    KV caches per sequence and weights without llama.cpp's repacked kernels.
    ``false``: one unified KV cache and the repacked kernels, faster at batch
    (``laneway bench backend --modes invariant,fast``) while a
    greedy answer may change with its batch-mates. On a CPU with AMX the
    repacked kernels crash this llama.cpp, so there ``false`` gives the
    unified cache alone (``workers.backends.llama_batch.extra_buffers_work``)."""
    openai_base_url: str = "http://127.0.0.1:8000/v1"
    """An OpenAI-compatible server, e.g. ``vllm serve`` or ``llama_cpp.server``."""
    openai_api_key: SecretStr = SecretStr("none")
    """API key sent to the OpenAI-compatible server (``Authorization: Bearer``)."""
    openai_timeout_s: float = Field(default=60.0, gt=0)
    """Longest an OpenAI-compatible server may take to answer one request."""
    vllm_gpu_memory_utilization: float = Field(default=0.8, gt=0, le=1)
    """Share of the GPU's memory the in-process vLLM engine may take (weights +
    KV cache). 0.8 keeps 20% free for bursts, as the source article asks:
    activations of long prefills, CUDA graphs, the allocator's fragmentation
    and whatever else runs on the GPU (docs/operations-gpu.md)."""
    vllm_max_model_len: int | None = Field(default=4096, ge=64)
    """Longest prompt plus answer, in tokens, that the vLLM engine accepts; it
    also sizes the KV cache. ``None`` = the model's own context length, which
    for a long-context model may not fit in ``vllm_gpu_memory_utilization``."""
    vllm_model_dir: Path | None = None
    """A local Hugging Face model directory (``config.json``, tokenizer,
    ``*.safetensors``) for the vllm backend, or a folder of them named after
    the models (``<dir>/<model>``). Unset: ``model`` itself must be a local
    directory or a Hub id (which vLLM would download)."""
    vllm_max_num_seqs: int | None = Field(default=None, ge=1)
    """Requests the vLLM engine schedules at once (its ``max_num_seqs``;
    unset: vLLM's default). A registry entry's ``max_batch`` sets it per model."""
    vllm_kv_concurrency_share: float = Field(default=0.7, gt=0, le=1)
    """At most this share of the sequences vLLM's KV cache holds at full
    length (its reported KV cache tokens / ``vllm_max_model_len``) run at
    once, as the source article asks (under 70%): the rest is room for
    sequences longer than the average, so a burst of long prompts does not
    make vLLM preempt (and recompute) running ones
    (``workers.backends.vllm_headroom``)."""
    vllm_enforce_eager: bool = False
    """Run the vLLM model eagerly: no torch.compile and no CUDA graphs, so it
    loads in seconds but decodes slower (the GPU tests use it; serve without)."""
    breaker_failures: int = Field(default=5, ge=1)
    """Failed batches within ``breaker_window_s`` that open a backend's circuit."""
    breaker_window_s: float = Field(default=30.0, gt=0)
    """Window over which failed batches are counted towards
    ``breaker_failures``."""
    breaker_cooldown_s: float = Field(default=10.0, gt=0)
    """How long an open circuit waits before one probe batch is let through."""
    load_retry_s: float = Field(default=30.0, ge=0)
    """After a failed model load, requests get INF-502 until this much time has passed."""


class TuneSettings(BaseSettings):
    """Batch sizes measured on the machine that runs them (``workers.tune``,
    ``laneway check --tune``): a CPU model's tokens/s at each candidate batch
    size and number of batches in flight, kept per model and CPU, and used
    by a lane worker at start for its lane's ``max_batch_size`` and
    ``max_inflight_batches`` and the model's llama.cpp sequences. What is
    set explicitly wins: a registry entry's ``max_batch``,
    ``LANEWAY_BACKEND_LLAMACPP_MAX_SEQUENCES``, a lane's
    ``LANEWAY_<LANE>_MAX_BATCH_SIZE`` / ``_MAX_INFLIGHT_BATCHES``."""

    model_config = _config("LANEWAY_TUNE_")

    dir: Path = Path.home() / ".cache" / "laneway" / "tune"
    """Where tunings are kept: ``<dir>/<cpu-slug>/<model>.json``."""
    use_kept: bool = True
    """A lane worker uses the kept tuning of its model on this CPU, when one
    matches (the same model file, CPU, ``n_threads`` and batch mode). ``false``:
    the lane's settings as they are."""
    at_start: bool = False
    """A lane worker with no matching kept tuning for a CPU model measures
    one at start (``batch_sizes`` x ``inflight`` x ``seconds_per_candidate``,
    plus the model load) and keeps it. Off: start stays fast, and the lane's
    settings are used until ``laneway check --tune`` keeps one."""
    batch_sizes: tuple[int, ...] = Field(default=(1, 2, 4, 8, 16), min_length=1)
    """Candidate batch sizes."""
    inflight: tuple[int, ...] = Field(default=(1, 2), min_length=1)
    """Candidate numbers of batches in flight (a lane's ``max_inflight_batches``)."""
    seconds_per_candidate: float = Field(default=4.0, gt=0, le=600)
    """How long each candidate sends new batches (each of its callers runs
    at least one): the whole tuning takes about this times the number of
    candidates, plus the last batches' tail."""
    max_tokens: int = Field(default=32, ge=1, le=4096)
    """Tokens each measured answer may have: about a short answer's."""

    @field_validator("batch_sizes", "inflight")
    @classmethod
    def _positive(cls, values: tuple[int, ...]) -> tuple[int, ...]:
        if min(values) < 1:
            raise ValueError(f"every candidate must be at least 1: {values}")
        return tuple(sorted(set(values)))


class BatchSettings(BaseSettings):
    """Offline batch jobs (``streams.jobs``, ``laneway batch``)."""

    model_config = _config("LANEWAY_BATCH_")

    submit_rps: float = Field(default=20.0, gt=0)
    """Most batch requests a submitter produces per second; never more than
    half the tenant's rate limit, so its interactive traffic keeps the rest."""
    max_inflight: int = Field(default=24, ge=0)
    """Most requests of one job produced but not yet answered (0: no bound).
    Keeps the bulk lane short, so a cancel stops nearly all unstarted work,
    and below the flow controller's first mark (``LANEWAY_FLOW_ENTER``, 32
    waiting records), so a batch alone never raises the load level that
    degrades or sheds interactive traffic."""
    window_s: int = Field(default=86_400, ge=1)
    """Completion window of a job (``--window``): what is not done by then
    ends ``INF-503`` and the job ``expired``."""
    max_lines: int = Field(default=50_000, ge=1)
    """Most lines one input file may have."""
    retention_s: int = Field(default=7 * 86_400, ge=60)
    """How long a finished job's state and results stay in Redis."""
    sweep_interval_s: float = Field(default=1.0, gt=0)
    """How often the tracker settles open jobs (completion, expiry)."""


class StreamSettings(BaseSettings):
    """Token streaming (``workers.streaming``): how a lane worker coalesces a
    streamed answer's pieces into ``result_chunk`` records."""

    model_config = _config("LANEWAY_STREAM_")

    flush_ms: float = Field(default=40.0, ge=0)
    """After a chunk is sent, the pieces that come within this long go into
    the next one (the first piece of an answer is sent at once): a batch of
    16 answers costs the broker at most 16 records per interval, not one
    per token."""
    max_pieces: int = Field(default=16, ge=1)
    """A chunk is sent early once this many pieces (about tokens) wait."""
    attempt_ttl_s: int = Field(default=86_400, ge=60)
    """How long Redis keeps the count of a request's streamed decodes
    (``<prefix>:stream:<id>``), which numbers each new ``attempt``."""
    cancel_window_s: float = Field(default=600.0, gt=0)
    """How long a lane worker remembers a cancelled request id
    (``<p>.cancels``): a cancelled request that reaches it later than this
    is answered as usual."""


class GatewaySettings(BaseSettings):
    """The OpenAI-compatible HTTP gateway (``laneway gateway``,
    ``streams.gateway``): an HTTP front of the request topic."""

    model_config = _config("LANEWAY_GATEWAY_")

    host: str = "127.0.0.1"
    """Address the OpenAI API listens on (``0.0.0.0``: every interface)."""
    port: int = Field(default=8080, ge=0, le=65535)
    """Port of the OpenAI API (``/v1``); 0 picks a free one. ``/metrics``,
    ``/healthz`` and ``/readyz`` are on ``LANEWAY_HTTP_PORT``, as in every
    laneway process."""
    keys_file: Path | None = None
    """The API keys (``laneway keys add``): a JSON file of sha256 hashes,
    each with its tenant and limits. Unset or without keys: any key (or none)
    is accepted as ``default_tenant``, and the gateway says so at start."""
    default_tenant: str | None = None
    """The tenant of requests while no keys are configured (unset: none)."""
    timeout_s: float = Field(default=120.0, gt=0, le=3_600)
    """Longest the gateway waits for a request's answer (for a stream: for
    its next piece) when the request names no deadline; then it answers 504
    and cancels the request."""
    deadline_grace_s: float = Field(default=5.0, ge=0, le=600)
    """A request with a deadline (``X-Laneway-Deadline-Ms``) is waited for
    that long plus this (laneway answers INF-503 itself at the deadline; the
    grace covers the trip back), never longer than ``timeout_s``."""
    client_id: str | None = Field(default=None, pattern=r"^[A-Za-z0-9._-]{1,200}$")
    """The gateway's client id and so its reply topic ``<prefix>.replies.<id>``.
    Unset: ``gateway-<host>-<random>``, new at each start, so replicas never
    share a reply topic (each replica's topic stays behind when it stops)."""
    max_body_bytes: int = Field(default=1024 * 1024, ge=1024)
    """Largest request body accepted (413 above)."""
    keys_reload_s: float = Field(default=2.0, gt=0)
    """How often the keys file is checked for changes (``laneway keys add``
    takes effect without a restart)."""
    files_max_bytes: int = Field(default=32 * 1024 * 1024, ge=1024)
    """Largest file ``POST /v1/files`` accepts (413 above). Files are kept
    in Redis, where every replica finds them: this bounds what one upload
    can take of its memory."""
    files_ttl_s: int = Field(default=7 * 86_400, ge=60)
    """How long an uploaded file stays in Redis (``expires_at`` of the File
    object); a batch's input must outlive its submission."""
    batch_submitters: int = Field(default=4, ge=1, le=64)
    """Batches one replica submits at once (each produces its lines at
    ``LANEWAY_BATCH_SUBMIT_RPS``); more wait their turn, ``validating``."""
    batch_lease_s: float = Field(default=30.0, ge=1)
    """A replica submitting a batch holds a lease on it in Redis, renewed
    at a third of this; a batch whose lease lapsed (its replica died) is
    resumed by the next replica that sweeps, at most this long after."""


class TracingSettings(BaseSettings):
    """Export of laneway's trace spans over OTLP/HTTP (``streams.kafka.otlp``,
    on OpenTelemetry's SDK): off, nothing recorded, unless an endpoint is
    configured (the trace context is carried on the records either way)."""

    model_config = _config("LANEWAY_TRACING_")

    otlp_endpoint: str | None = None
    """Base URL of an OTLP/HTTP collector (``http://collector:4318``); spans
    are POSTed to ``<it>/v1/traces``. Unset: ``OTEL_EXPORTER_OTLP_TRACES_ENDPOINT``
    (the full URL), else ``OTEL_EXPORTER_OTLP_ENDPOINT`` (``/v1/traces`` added)."""
    otel_traces_endpoint: str | None = Field(
        default=None, validation_alias="OTEL_EXPORTER_OTLP_TRACES_ENDPOINT"
    )
    """The OpenTelemetry standard variable: the full URL spans are POSTed to
    (used when ``otlp_endpoint`` is unset)."""
    otel_endpoint: str | None = Field(default=None, validation_alias="OTEL_EXPORTER_OTLP_ENDPOINT")
    """The OpenTelemetry standard variable: a collector's base URL;
    ``/v1/traces`` is added (used when the two above are unset)."""
    service_name: str = "laneway"
    """Stem of each process's ``service.name``: ``laneway-classifier``,
    ``laneway-worker-realtime``, ..."""
    queue_size: int = Field(default=2048, ge=1)
    """Spans waiting for export at most; past it the oldest are dropped."""
    flush_interval_s: float = Field(default=1.0, gt=0)
    """How often queued spans are sent (at once when 512 wait)."""
    export_timeout_s: float = Field(default=3.0, gt=0)
    """Longest one export may take, its retries of a transient failure included;
    also the bound of the last flush at shutdown."""

    @property
    def traces_url(self) -> str | None:
        """Where spans are POSTed, ``None``: not exported."""
        if self.otlp_endpoint:
            base = self.otlp_endpoint.rstrip("/")
            return base if base.endswith("/v1/traces") else f"{base}/v1/traces"
        if self.otel_traces_endpoint:
            return self.otel_traces_endpoint
        if self.otel_endpoint:
            return f"{self.otel_endpoint.rstrip('/')}/v1/traces"
        return None


class Settings(BaseSettings):
    """Everything one laneway process needs."""

    model_config = _config("LANEWAY_")

    app_id: str = "laneway"
    """faust application id and consumer-group stem."""
    max_attempts: int = Field(default=3, ge=1)
    """A lane record whose processing failed this often goes to the DLQ with an
    INF-502 result, so one poison record cannot stall a partition."""
    retry_backoff_ms: int = Field(default=500, ge=0)
    """First delay of a record parked on the retry topic; doubles per attempt."""
    retry_max_backoff_ms: int = Field(default=10_000, ge=0)
    """Longest delay of a record parked on the retry topic (the doubling
    stops here)."""
    http_host: str = "127.0.0.1"
    """Address the process's ops HTTP server (metrics, health) listens on;
    ``0.0.0.0`` in a container."""
    http_port: int = Field(default=9400, ge=0, le=65535)
    """Serves /metrics, /healthz and /readyz (0 disables)."""
    worker_heartbeat_s: float = Field(default=2.0, gt=0)
    """How often a lane worker announces its lane and paths in Redis; the
    classifier forgets a worker silent for three times this."""
    loop_stall_s: float = Field(default=30.0, gt=0)
    """``/healthz`` fails once the process's event loop has not run its
    once-a-second heartbeat for this long (a wedged loop, not a busy model:
    model calls run in threads)."""
    log_level: str = "INFO"
    """Python logging level of the process (DEBUG, INFO, WARNING, ERROR)."""
    log_format: Literal["text", "json"] = "text"
    """``json``: one JSON object per log line, for log shippers (``streams.devstack.logs``)."""
    kafka: KafkaSettings = Field(default_factory=KafkaSettings)
    redis: RedisSettings = Field(default_factory=RedisSettings)
    limits: LimitsSettings = Field(default_factory=LimitsSettings)
    routing: RoutingSettings = Field(default_factory=RoutingSettings)
    cache: CacheSettings = Field(default_factory=CacheSettings)
    classifier: ClassifierSettings = Field(default_factory=ClassifierSettings)
    rollout: RolloutSettings = Field(default_factory=RolloutSettings)
    rules: RulesSettings = Field(default_factory=RulesSettings)
    session: SessionSettings = Field(default_factory=SessionSettings)
    drift: DriftSettings = Field(default_factory=DriftSettings)
    prewarm: PrewarmSettings = Field(default_factory=PrewarmSettings)
    batch: BatchSettings = Field(default_factory=BatchSettings)
    ratelimit: RateLimitSettings = Field(default_factory=RateLimitSettings)
    flow: FlowSettings = Field(default_factory=FlowSettings)
    backend: BackendSettings = Field(default_factory=BackendSettings)
    tune: TuneSettings = Field(default_factory=TuneSettings)
    student: StudentSettings = Field(default_factory=StudentSettings)
    tracing: TracingSettings = Field(default_factory=TracingSettings)
    stream: StreamSettings = Field(default_factory=StreamSettings)
    gateway: GatewaySettings = Field(default_factory=GatewaySettings)
    realtime: LaneSettings = Field(default_factory=RealtimeLaneSettings)
    medium: LaneSettings = Field(default_factory=MediumLaneSettings)
    bulk: LaneSettings = Field(default_factory=BulkLaneSettings)

    @property
    def cache_in_use(self) -> bool:
        """The response cache is read and written: enabled, and no single
        forced path (the bench's baseline reads and writes none)."""
        return self.cache.enabled and self.routing.force_path is None

    def lane(self, lane: Lane) -> LaneSettings:
        return {Lane.REALTIME: self.realtime, Lane.MEDIUM: self.medium, Lane.BULK: self.bulk}[lane]

    def topic(self, name: str) -> str:
        """Full topic name: ``topic("requests") == "laneway.requests"``."""
        return f"{self.kafka.topic_prefix}.{name}"

    def lane_topic(self, lane: Lane) -> str:
        return self.topic(f"lane.{lane.value}")

    @property
    def replies_topic(self) -> str:
        return self.topic("replies")

    def request_limits(self) -> RequestLimits:
        return RequestLimits(
            max_text_bytes=self.limits.max_text_bytes,
            max_tokens_min=self.limits.max_tokens_min,
            max_tokens_max=self.limits.max_tokens_max,
            max_id_chars=self.limits.max_id_chars,
            reply_prefix=self.replies_topic,
            tenant_reply_topics=self.limits.tenant_reply_topics,
        )
