import pytest
from pydantic import ValidationError

from schemas.messages import Lane
from schemas.settings import KafkaSettings, LimitsSettings, Settings


def test_env_prefixes(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("LANEWAY_KAFKA_BOOTSTRAP", "broker:9093")
    monkeypatch.setenv("LANEWAY_REDIS_URL", "redis://cache:6379/1")
    monkeypatch.setenv("LANEWAY_BULK_MAX_BATCH_SIZE", "64")
    monkeypatch.setenv("LANEWAY_HTTP_PORT", "9999")
    settings = Settings()
    assert settings.kafka.bootstrap == "broker:9093"
    assert settings.redis.url == "redis://cache:6379/1"
    assert settings.lane(Lane.BULK).max_batch_size == 64
    assert settings.http_port == 9999


def test_lanes_trade_latency_for_batch_size() -> None:
    settings = Settings()
    realtime, medium, bulk = (settings.lane(lane) for lane in Lane)
    assert realtime.max_batch_size < medium.max_batch_size < bulk.max_batch_size
    assert realtime.max_wait_ms < medium.max_wait_ms < bulk.max_wait_ms


def test_topic_names_follow_prefix(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("LANEWAY_KAFKA_TOPIC_PREFIX", "lw")
    settings = Settings()
    assert settings.topic("requests") == "lw.requests"
    assert settings.lane_topic(Lane.MEDIUM) == "lw.lane.medium"
    assert settings.request_limits().reply_prefix == "lw.replies"


def test_settings_are_frozen_and_checked() -> None:
    settings = Settings()
    with pytest.raises(ValidationError):
        settings.http_port = 1
    with pytest.raises(ValidationError, match="max_tokens_min=9 > max_tokens_max=3"):
        LimitsSettings(max_tokens_min=9, max_tokens_max=3)


def test_sasl_password_is_secret(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("LANEWAY_KAFKA_SASL_MECHANISM", "PLAIN")
    monkeypatch.setenv("LANEWAY_KAFKA_SASL_USERNAME", "u")
    monkeypatch.setenv("LANEWAY_KAFKA_SASL_PASSWORD", "hunter2")
    settings = Settings()
    assert "hunter2" not in repr(settings)
    assert settings.kafka.client_options()["sasl_plain_password"] == "hunter2"


def test_tls_settings_reach_aiokafka_and_faust() -> None:
    import ssl

    from streams.kafka.faust_transport import _broker_options as _faust_broker_options

    plain = KafkaSettings()
    assert "ssl_context" not in plain.client_options()
    tls = KafkaSettings(security_protocol="SASL_SSL", sasl_mechanism="PLAIN", sasl_username="u")
    assert isinstance(tls.client_options()["ssl_context"], ssl.SSLContext)
    credentials = _faust_broker_options(Settings(kafka=tls))["broker_credentials"]
    assert credentials.protocol.name == "SASL_SSL"
    only_tls = _faust_broker_options(Settings(kafka=KafkaSettings(security_protocol="SSL")))
    assert only_tls["broker_credentials"].protocol.name == "SSL"
