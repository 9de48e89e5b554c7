"""Wire models: JSON, UTF-8, ``schema_version: 1`` (see CONTRACT.md; their JSON
Schema is exported by ``schemas.wire_schema`` to ``schemas/json/``).

Models are strict at the edge (``extra="forbid"``) and immutable once built.
Size limits that operators tune live in settings and are applied by
``parse_request``; the models only carry the shape.
"""

from __future__ import annotations

import json
import re
from enum import StrEnum
from typing import Annotated, Any, ClassVar, Literal, TypeGuard

from pydantic import (
    BaseModel,
    BeforeValidator,
    ConfigDict,
    Field,
    GetCoreSchemaHandler,
    GetJsonSchemaHandler,
    ValidationError,
    field_validator,
    model_validator,
)
from pydantic.json_schema import JsonSchemaValue
from pydantic_core import PydanticCustomError, core_schema

from schemas.errors import ErrorCode, InvalidRequest, LanewayError

__all__ = [
    "AUTO_MODEL",
    "UNSUPPORTED_FIELDS",
    "AnswerPath",
    "CancelRequest",
    "ChatMessage",
    "ErrorInfo",
    "Feedback",
    "FinishReason",
    "InferenceRequest",
    "InferenceResult",
    "Lane",
    "QualityEvent",
    "RequestLimits",
    "ResultChunk",
    "RoutedRequest",
    "StreamOptions",
    "Timings",
    "Usage",
    "describe_errors",
    "parse_request",
    "peek_reply_address",
    "peek_routed_address",
]


class Lane(StrEnum):
    REALTIME = "realtime"
    MEDIUM = "medium"
    BULK = "bulk"


class AnswerPath(str):
    """A way to answer a request: ``cache`` and ``rules`` (answered in the
    classifier), or a *model path*, named by the model registry
    (``streams.routing.registry``): the built-in registry has ``light``
    (SmolLM2-135M) and ``heavy`` (Gemma-3-270M), and a registry file may name
    more (a third model is one more entry). On the wire a path is a string
    of 1-32 lowercase letters, digits, ``_`` and ``-``, starting with a
    letter.

    A ``str``: it compares, hashes and serialises as its name. Instances are
    shared per name (``AnswerPath("light") is AnswerPath.LIGHT``) for the first
    ``_SHARED_MAX`` names seen, so a stream of odd names cannot grow the table."""

    __slots__ = ()

    CACHE: ClassVar[AnswerPath]
    RULES: ClassVar[AnswerPath]
    LIGHT: ClassVar[AnswerPath]
    """The built-in registry's cheap path (also the path a learned router
    judges, and where flow control moves heavy work under load)."""
    HEAVY: ClassVar[AnswerPath]
    """The built-in registry's capable path."""

    PATTERN: ClassVar[str] = r"^[a-z][a-z0-9_-]{0,31}$"
    _SHARED: ClassVar[dict[str, AnswerPath]] = {}
    _SHARED_MAX: ClassVar[int] = 256

    def __new__(cls, name: str) -> AnswerPath:
        shared = cls._SHARED.get(name)
        if shared is not None:
            return shared
        if not isinstance(name, str) or _PATH_NAME.fullmatch(name) is None:
            raise ValueError(
                f"not a path name: {name!r} (1-32 of a-z, 0-9, _ and -, starting with a letter)"
            )
        made = super().__new__(cls, name)
        if len(cls._SHARED) < cls._SHARED_MAX:
            cls._SHARED[str(name)] = made
        return made

    @property
    def value(self) -> str:
        """The name as a plain ``str`` (as an enum member's ``value`` was)."""
        return str.__str__(self)

    @property
    def is_model(self) -> bool:
        """A model path (not ``cache`` or ``rules``): a worker's backend answers it."""
        return self not in ("cache", "rules")

    @classmethod
    def valid(cls, name: object) -> TypeGuard[str]:
        """``name`` is a path's name."""
        return isinstance(name, str) and _PATH_NAME.fullmatch(name) is not None

    @classmethod
    def names_model(cls, name: object) -> TypeGuard[str]:
        """``name`` is a model path's name (valid, and not cache or rules)."""
        return cls.valid(name) and name not in ("cache", "rules")

    def __repr__(self) -> str:
        return f"AnswerPath({self.value!r})"

    def __str__(self) -> str:
        return self.value

    def __format__(self, spec: str) -> str:
        return format(self.value, spec)

    def __reduce__(self) -> tuple[type[AnswerPath], tuple[str]]:
        return (AnswerPath, (self.value,))

    @classmethod
    def __get_pydantic_core_schema__(
        cls, source: Any, handler: GetCoreSchemaHandler
    ) -> core_schema.CoreSchema:
        return core_schema.no_info_after_validator_function(
            cls,
            core_schema.str_schema(pattern=cls.PATTERN),
            serialization=core_schema.plain_serializer_function_ser_schema(
                str.__str__, return_schema=core_schema.str_schema()
            ),
        )

    @classmethod
    def __get_pydantic_json_schema__(
        cls, schema: core_schema.CoreSchema, handler: GetJsonSchemaHandler
    ) -> JsonSchemaValue:
        out = handler(schema)
        out["description"] = (
            "cache, rules, or a model path named by the model registry "
            "(the built-in registry's are light and heavy)"
        )
        out["examples"] = ["cache", "rules", "light", "heavy"]
        return out


_PATH_NAME = re.compile(AnswerPath.PATTERN)
AnswerPath.CACHE = AnswerPath("cache")
AnswerPath.RULES = AnswerPath("rules")
AnswerPath.LIGHT = AnswerPath("light")
AnswerPath.HEAVY = AnswerPath("heavy")


class WireModel(BaseModel):
    model_config = ConfigDict(extra="forbid", frozen=True)


class ChatMessage(WireModel):
    role: Literal["system", "user", "assistant"]
    content: str


class StreamOptions(WireModel):
    include_usage: bool = False
    """Accepted as OpenAI's: the last chunk on Kafka always carries
    ``usage``; the HTTP gateway sends its usage chunk only when asked."""


StopText = Annotated[str, Field(min_length=1, max_length=64)]
StopList = Annotated[list[StopText], Field(max_length=4)]


def _one_or_list(value: object) -> object:
    """OpenAI's ``stop`` may be one string: a list of it."""
    return [value] if isinstance(value, str) else value


AUTO_MODEL = "auto"
"""The ``model`` that leaves the choice to laneway's router (as no ``model`` does)."""

UNSUPPORTED_FIELDS: dict[str, str] = {
    "response_format": "structured output",
    "tools": "tool calls",
    "tool_choice": "tool calls",
    "parallel_tool_calls": "tool calls",
    "functions": "function calls",
    "function_call": "function calls",
    "logprobs": "log probabilities",
    "top_logprobs": "log probabilities",
    "logit_bias": "logit bias",
    "presence_penalty": "presence and frequency penalties",
    "frequency_penalty": "presence and frequency penalties",
    "modalities": "audio output",
    "audio": "audio output",
    "prediction": "predicted outputs",
    "reasoning_effort": "reasoning models",
    "service_tier": "service tiers",
    "store": "stored completions",
    "web_search_options": "web search",
    "prompt_cache_key": "prompt caching keys",
    "safety_identifier": "safety identifiers",
    "verbosity": "verbosity",
}
"""Fields of OpenAI's chat completion request that laneway does not
implement, and what they are for: a request that carries one is refused
(INF-400) with a message naming it, rather than served as if it were not
there."""


def _refused(message: str, **values: object) -> PydanticCustomError:
    """A validation error whose message names its field itself (``describe_errors``
    prints it as it is)."""
    return PydanticCustomError("laneway_refused", message, dict(values))


class InferenceRequest(WireModel):
    schema_version: Literal[1] = 1
    id: str = Field(min_length=1)
    tenant: str | None = None
    session_id: str | None = None
    prompt: str | None = None
    messages: list[ChatMessage] | None = None
    max_tokens: int = 128
    temperature: float = Field(default=0.0, ge=0.0, le=2.0)
    deadline_ms: int | None = Field(default=None, ge=1)
    stop: Annotated[
        StopList | None,
        BeforeValidator(_one_or_list, json_schema_input_type=StopText | StopList | None),
    ] = None
    """Up to 4 strings that end the answer (not included in it); one string
    is a list of it (as OpenAI's ``stop``)."""
    seed: int | None = Field(default=None, ge=0, le=2**63 - 1)
    """Seeds the sampling at ``temperature > 0`` (unset = 0)."""
    model: str | None = Field(default=None, min_length=1, max_length=128)
    """The model to answer (OpenAI's ``model``): a model path of the model
    registry (``light``), a model's name (``smollm2-135m``, or
    ``llamacpp:smollm2-135m`` as results name it), or ``auto`` (as unset:
    the router chooses). The classifier checks it against its registry
    (INF-400 naming the models there are) and sends a named model's
    requests down its path: neither the router nor a rule answers them."""
    top_p: float | None = Field(default=None, gt=0.0, le=1.0)
    """Nucleus sampling at ``temperature > 0``: only the most likely tokens
    whose probabilities add up to ``top_p`` are drawn (unset = 1: all)."""
    max_completion_tokens: int | None = None
    """OpenAI's newer name for ``max_tokens``: sets it (both given must agree)."""
    user: str | None = Field(default=None, min_length=1, max_length=256)
    """The end user the request is for (OpenAI's ``user``), as the client
    names them: carried with the request, not used by laneway."""
    n: Literal[1] | None = None
    """Answers to generate: 1 (laneway answers one; anything else is refused)."""
    lane: Lane | None = None
    reply_to: str | None = None
    batch_id: str | None = None
    metadata: dict[str, Any] = Field(default_factory=dict)
    stream: bool = False
    """Send the answer as ``result_chunk`` records on ``reply_to`` while it
    is generated, before the terminal ``result`` (CONTRACT.md, Streaming)."""
    stream_options: StreamOptions | None = None

    @field_validator("n", mode="before")
    @classmethod
    def _one_answer(cls, value: object) -> object:
        if value is not None and (type(value) is not int or value != 1):
            raise _refused("n={n}: laneway answers n=1 only", n=json.dumps(value))
        return value

    @model_validator(mode="after")
    def _one_of_prompt_or_messages(self) -> InferenceRequest:
        if (self.prompt is None) == (self.messages is None):
            raise ValueError("exactly one of 'prompt' or 'messages' must be set")
        if self.messages is not None and not self.messages:
            raise ValueError("'messages' must not be empty")
        if self.stream_options is not None and not self.stream:
            raise ValueError("'stream_options' is only allowed with 'stream': true")
        newer = self.max_completion_tokens
        if newer is not None and newer != self.max_tokens:
            self._take_max_completion_tokens(newer)
        return self

    def _take_max_completion_tokens(self, newer: int) -> None:
        """``max_completion_tokens`` sets ``max_tokens`` (OpenAI's two names
        of one setting); given both, they must agree. Done after validation,
        in place (the model is frozen once this returns): a ``before``
        validator would make pydantic build the whole record as Python
        objects before validating it, on every request."""
        if "max_tokens" in self.model_fields_set:
            raise _refused(
                "max_tokens={older} and max_completion_tokens={newer} disagree: give one "
                "(max_completion_tokens is OpenAI's newer name for max_tokens)",
                older=self.max_tokens,
                newer=newer,
            )
        object.__setattr__(self, "max_tokens", newer)
        self.model_fields_set.add("max_tokens")

    def text_bytes(self) -> int:
        """UTF-8 size of the text a model would read."""
        if self.prompt is not None:
            return len(self.prompt.encode())
        return sum(len(m.content.encode()) for m in self.messages or ())

    def user_text(self) -> str:
        """The text the request asks about: the prompt, or the last user turn."""
        if self.prompt is not None:
            return self.prompt
        users = [m.content for m in self.messages or () if m.role == "user"]
        return users[-1] if users else ""

    def chat(self) -> list[ChatMessage]:
        """The request as an OpenAI-style chat list."""
        if self.messages is not None:
            return list(self.messages)
        return [ChatMessage(role="user", content=self.prompt or "")]

    def partition_key(self) -> bytes:
        return (self.session_id or self.id).encode()

    def named_model(self) -> str | None:
        """The model the client named, ``None`` when it left the choice to
        the router (no ``model``, or ``auto``)."""
        return None if self.model is None or self.model == AUTO_MODEL else self.model


class RequestLimits(WireModel):
    """Edge limits; filled from ``Settings.limits``."""

    max_text_bytes: int = 64 * 1024
    max_tokens_min: int = 1
    max_tokens_max: int = 4096
    max_id_chars: int = 128
    reply_prefix: str = "laneway.replies"
    tenant_reply_topics: bool = False
    """A request that names its tenant may only reply to that tenant's topic
    (``<prefix>.<tenant>`` or below it), so tenants cannot read each other."""


def parse_request(raw: bytes, limits: RequestLimits) -> InferenceRequest:
    """Decode and validate one request record, or raise ``InvalidRequest``
    with a message that says what to fix."""
    try:
        request = InferenceRequest.model_validate_json(raw)
    except ValidationError as exc:
        raise InvalidRequest(f"invalid request: {describe_errors(exc)}") from exc
    if len(request.id) > limits.max_id_chars:
        raise InvalidRequest(f"id is {len(request.id)} characters, limit {limits.max_id_chars}")
    size = request.text_bytes()
    if size > limits.max_text_bytes:
        raise InvalidRequest(f"request text is {size} bytes, limit {limits.max_text_bytes}")
    if not limits.max_tokens_min <= request.max_tokens <= limits.max_tokens_max:
        raise InvalidRequest(
            f"max_tokens={request.max_tokens} outside "
            f"{limits.max_tokens_min}..{limits.max_tokens_max}"
        )
    if request.reply_to is not None and not _is_reply_topic(request.reply_to, limits.reply_prefix):
        raise InvalidRequest(
            f"reply_to={request.reply_to!r} must be {limits.reply_prefix!r} "
            f"or start with {limits.reply_prefix + '.'!r}"
        )
    if limits.tenant_reply_topics and request.tenant is not None:
        own = f"{limits.reply_prefix}.{request.tenant}"
        reply_to = request.reply_to or limits.reply_prefix
        if reply_to != own and not reply_to.startswith(own + "."):
            raise InvalidRequest(
                f"tenant {request.tenant!r} may only reply to {own!r} or below it, "
                f"not reply_to={reply_to!r}"
            )
    return request


_TOPIC_CHARS = re.compile(r"[A-Za-z0-9._-]+")
_TOPIC_MAX = 249  # Kafka's limit on a topic name


def _encodable(text: str) -> bool:
    try:
        text.encode()
    except UnicodeEncodeError:
        return False
    return True


def _is_reply_topic(topic: str, prefix: str) -> bool:
    """``prefix`` itself, or ``prefix.<name>`` that Kafka accepts as a topic."""
    if len(topic) > _TOPIC_MAX or not _TOPIC_CHARS.fullmatch(topic):
        return False
    return topic == prefix or (topic.startswith(prefix + ".") and len(topic) > len(prefix) + 1)


def describe_errors(exc: ValidationError, limit: int = 5) -> str:
    """``field: what is wrong`` for the first ``limit`` problems, without
    the values (a prompt never lands in an error message or a header). A
    field of OpenAI's that laneway does not implement is named as such
    (``UNSUPPORTED_FIELDS``); a message that names its field itself is
    given as it is."""
    problems = [_problem(e) for e in exc.errors()]
    more = f"; and {len(problems) - limit} more" if len(problems) > limit else ""
    return "; ".join(problems[:limit]) + more


def _problem(error: Any) -> str:
    where = ".".join(str(p) for p in error["loc"]) or "record"
    if error["type"] == "laneway_refused":
        return str(error["msg"])
    if error["type"] == "extra_forbidden":
        if len(error["loc"]) == 1 and error["loc"][0] in UNSUPPORTED_FIELDS:
            what = UNSUPPORTED_FIELDS[error["loc"][0]]
            return f"{where} is not supported by laneway ({what})"
        return f"{where}: not a field of this message (unknown fields are refused)"
    return f"{where}: {error['msg']}"


def peek_reply_address(raw: bytes, limits: RequestLimits) -> tuple[str, str] | None:
    """Best effort for a record that failed validation: its id and a safe
    reply topic, so the client still hears why. ``None`` when the id cannot be
    read. A foreign ``reply_to`` is never used: the default reply topic is."""
    data = _json_object(raw)
    return None if data is None else _address_of(data, limits)


def peek_routed_address(raw: bytes, limits: RequestLimits) -> tuple[str, str] | None:
    """``peek_reply_address`` for a lane record a worker cannot read (one
    written by a newer classifier, say): the id of its request and its
    ``reply_to``, held to the same rules."""
    data = _json_object(raw)
    request = data.get("request") if data is not None else None
    if data is None or not isinstance(request, dict):
        return None
    return _address_of({**request, "reply_to": data.get("reply_to")}, limits)


def _json_object(raw: bytes) -> dict[str, object] | None:
    try:
        data = json.loads(raw)
    except (ValueError, UnicodeDecodeError, RecursionError):
        return None
    return data if isinstance(data, dict) else None


def _address_of(data: dict[str, object], limits: RequestLimits) -> tuple[str, str] | None:
    request_id = data.get("id")
    if not isinstance(request_id, str) or not 0 < len(request_id) <= limits.max_id_chars:
        return None
    if not _encodable(request_id):
        return None
    reply_to = data.get("reply_to")
    prefix = limits.reply_prefix
    tenant = data.get("tenant")
    if limits.tenant_reply_topics and isinstance(tenant, str):
        prefix = f"{limits.reply_prefix}.{tenant}"  # never another tenant's topic
    if isinstance(reply_to, str) and _is_reply_topic(reply_to, prefix):
        return request_id, reply_to
    return request_id, limits.reply_prefix


class RoutedRequest(WireModel):
    """What the classifier puts on a lane topic."""

    schema_version: Literal[1] = 1
    request: InferenceRequest
    lane: Lane
    path: AnswerPath
    reply_to: str
    produced_at_ms: int
    routed_at_ms: int
    deadline_at_ms: int | None = None
    requested_path: AnswerPath | None = None
    """The path the policy chose, when flow control sent it down ``path`` instead."""
    history: list[ChatMessage] = Field(default_factory=list)
    """Earlier turns of the request's session, oldest first, put before its own."""
    explored: bool = False
    """The router sent it down a path other than the best-scored one, to
    keep measuring that path (``LANEWAY_ROUTING_EXPLORATION``)."""
    version: str | None = None
    """The registry version of ``path`` to run (``None``: the worker's active
    one), assigned stably by session, tenant or id (``streams.rollout``)."""
    shadow: bool = False
    """A copy for a shadow version: its answer goes to ``<p>.shadow`` only,
    never to the client, the results topic, the cache or the session."""
    router_version: str | None = None
    """The router version that chose ``path`` (``rule``: the feature rule;
    else a learned router artifact's ``version``), assigned stably by
    session, tenant or id (``streams.rollout.routers``); ``None``: not named."""

    def remaining_ms(self, now_ms: int) -> float | None:
        return None if self.deadline_at_ms is None else self.deadline_at_ms - now_ms


FinishReason = Literal["stop", "length", "error", "cancelled"]
"""Why an answer ended: ``stop`` (the model ended it, or a stop string
did), ``length`` (cut at ``max_tokens``, or at the room the context left),
``error`` (no answer: the result's ``error`` says why), ``cancelled`` (the
client withdrew the request: ``CancelRequest``)."""


class Usage(WireModel):
    prompt_tokens: int = 0
    completion_tokens: int = 0
    total_tokens: int = 0
    """``prompt_tokens + completion_tokens`` (filled in when not given)."""

    @model_validator(mode="before")
    @classmethod
    def _total(cls, data: Any) -> Any:
        if isinstance(data, dict) and "total_tokens" not in data:
            prompt, completion = data.get("prompt_tokens", 0), data.get("completion_tokens", 0)
            if isinstance(prompt, int) and isinstance(completion, int):
                return {**data, "total_tokens": prompt + completion}
        return data


class Timings(WireModel):
    queue_ms: float = 0.0
    inference_ms: float = 0.0
    total_ms: float = 0.0
    batch_size: int = 1


class ErrorInfo(WireModel):
    code: ErrorCode
    message: str
    retryable: bool
    retry_after_ms: int | None = None

    @classmethod
    def from_error(cls, error: LanewayError) -> ErrorInfo:
        return cls(
            code=error.code,
            message=error.message,
            retryable=error.retryable,
            retry_after_ms=getattr(error, "retry_after_ms", None),
        )


class InferenceResult(WireModel):
    schema_version: Literal[1] = 1
    id: str
    status: Literal["ok", "error"]
    output: str | None = None
    error: ErrorInfo | None = None
    lane: Lane | None = None
    path: AnswerPath | None = None
    model: str | None = None
    usage: Usage = Field(default_factory=Usage)
    timings: Timings = Field(default_factory=Timings)
    batch_id: str | None = None
    degraded: bool = False
    """Served by a fallback path, not the one the router chose."""
    requested_path: AnswerPath | None = None
    """The path the router chose, when ``degraded``."""
    explored: bool = False
    """The router chose the path to measure it, not for its score."""
    version: str | None = None
    """The registry version of ``path`` that answered (or failed)."""
    router_version: str | None = None
    """The router version that chose the path (copied from the routed request)."""
    finish_reason: FinishReason | None = None
    """Why the answer ended (``error`` on an error result); unset only in
    results written before laneway said so."""

    @model_validator(mode="before")
    @classmethod
    def _error_finishes(cls, data: Any) -> Any:
        if isinstance(data, dict) and data.get("status") == "error" and "finish_reason" not in data:
            return {**data, "finish_reason": "error"}
        return data

    @classmethod
    def failure(
        cls,
        request_id: str,
        error: LanewayError,
        *,
        lane: Lane | None = None,
        path: AnswerPath | None = None,
        model: str | None = None,
        timings: Timings | None = None,
        batch_id: str | None = None,
        explored: bool = False,
    ) -> InferenceResult:
        return cls(
            id=request_id,
            status="error",
            error=ErrorInfo.from_error(error),
            lane=lane,
            path=path,
            model=model,
            timings=timings or Timings(),
            batch_id=batch_id,
            explored=explored,
        )


class ResultChunk(WireModel):
    """A piece of a streamed answer, on the request's ``reply_to`` before
    its terminal ``result`` (CONTRACT.md, Streaming). A model's decodes of
    a request are numbered ``attempt`` 1, 2, …, each from ``seq`` 0: a
    chunk of a higher attempt than the text a reader holds replaces that
    text. The classifier's answers (rules, cache) are attempt 0, one chunk.
    The last chunk of an attempt has ``finish_reason`` and ``usage``."""

    schema_version: Literal[1] = 1
    object: Literal["result_chunk"] = "result_chunk"
    """Tells a chunk from a ``result`` on a reply topic."""
    id: str
    attempt: int = Field(ge=0)
    seq: int = Field(ge=0)
    delta: str = ""
    """Text that follows the attempt's earlier chunks."""
    finish_reason: FinishReason | None = None
    usage: Usage | None = None
    lane: Lane | None = None
    path: AnswerPath | None = None
    model: str | None = None


class QualityEvent(WireModel):
    """One per terminal result (``kind="result"``), one per failed attempt on
    a path that a fallback then served (``"attempt"``), one per client
    feedback joined to its path (``"feedback"``), one per feature drift
    alarm (``"drift"``), one per canary the quality loop drained to 0%
    (``"rollback"``, with its ``reason``). The router's live record is built
    from these."""

    schema_version: Literal[1] = 1
    kind: Literal["result", "attempt", "feedback", "drift", "rollback"] = "result"
    id: str
    tenant: str | None = None
    lane: Lane | None = None
    path: AnswerPath | None = None
    model: str | None = None
    success: bool
    error_code: ErrorCode | None = None
    latency_ms: float
    prompt_tokens: int = 0
    completion_tokens: int = 0
    cost: float = 0.0
    cache_hit: bool = False
    ts_ms: int
    feedback: float | None = None
    """The client's score (-1..1), on ``feedback`` events."""
    drift: dict[str, float] | None = None
    """PSI per drifted feature, on ``drift`` events."""
    cache_key: str | None = None
    """The cache entry the answer came from, or was stored under: bad
    feedback on the answer evicts it."""
    version: str | None = None
    """The registry version of ``path`` the event is about."""
    reason: str | None = None
    """Why, on ``rollback`` events."""
    router_version: str | None = None
    """The router version that chose the path of the request the event is
    about; on a router's ``rollback`` event, the router version drained."""

    @classmethod
    def of(
        cls,
        result: InferenceResult,
        *,
        tenant: str | None,
        ts_ms: int,
        cache_key: str | None = None,
    ) -> QualityEvent:
        return cls(
            id=result.id,
            tenant=tenant,
            lane=result.lane,
            path=result.path,
            model=result.model,
            success=result.status == "ok",
            error_code=result.error.code if result.error else None,
            latency_ms=result.timings.total_ms,
            prompt_tokens=result.usage.prompt_tokens,
            completion_tokens=result.usage.completion_tokens,
            cache_hit=result.path == AnswerPath.CACHE,
            ts_ms=ts_ms,
            cache_key=cache_key,
            version=result.version,
            router_version=result.router_version,
        )


class CancelRequest(WireModel):
    """A client no longer wants the answer to request ``id`` (on
    ``<p>.cancels``): a worker decoding it stops, and its terminal result
    is INF-503 with ``finish_reason: cancelled``."""

    schema_version: Literal[1] = 1
    id: str = Field(min_length=1)


class Feedback(WireModel):
    """A client's verdict on one answer: +1 good, -1 bad, anything between."""

    schema_version: Literal[1] = 1
    request_id: str = Field(min_length=1)
    score: float = Field(ge=-1.0, le=1.0)
    comment: str | None = None
