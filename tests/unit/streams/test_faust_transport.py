from pathlib import Path

import pytest
from aiokafka import AIOKafkaConsumer

from schemas.settings import KafkaSettings, Settings
from streams.classify.app import build_app
from streams.kafka.faust_transport import faust_datadir
from streams.ops import ProcessState
from streams.quality.loop import build_quality_app


async def test_aiokafka_still_reads_the_fetch_wait_attribute_we_set() -> None:
    # streams.kafka.faust_transport sets this private attribute before start();
    # an aiokafka upgrade that renames it must fail here, not in production.
    consumer = AIOKafkaConsumer(fetch_max_wait_ms=7)
    assert consumer._fetch_max_wait_ms == 7


def test_faust_apps_use_the_tuned_transport() -> None:
    settings = Settings(kafka=KafkaSettings(bootstrap="127.0.0.1:1", fetch_max_wait_ms=9))
    app = build_quality_app(settings, ProcessState())
    assert type(app.transport).Consumer.__name__ == "TunedConsumer"
    assert app.boot_strategy._should_enable_kafka_consumer()
    assert app.conf.topic_allow_declare is False
    assert [str(url) for url in app.conf.broker] == ["kafka://127.0.0.1:1"]
    # In-memory tables: no check of a held offset against the changelog's
    # listed end, which the embedded broker gives one short (the router
    # replica that took over a killed one's partitions crashed on it).
    assert app.conf.recovery_consistency_check is False


def test_the_classifier_reads_its_topic_itself() -> None:
    # streams.kafka.intake reads the request topic: faust's consumer must not
    # also join the group (it would take partitions and never process them).
    settings = Settings(kafka=KafkaSettings(bootstrap="127.0.0.1:1", fetch_max_wait_ms=9))
    app = build_app(settings, ProcessState())
    assert not app.boot_strategy._should_enable_kafka_consumer()
    assert not list(app.boot_strategy.kafka_consumer())
    assert not app.agents
    assert [str(url) for url in app.conf.broker] == ["kafka://127.0.0.1:1"]


def test_printed_redis_urls_hide_the_password() -> None:
    from streams.devstack.supervisor import without_password

    assert without_password("redis://:s3cret@cache:6379/0") == "redis://:***@cache:6379/0"
    assert without_password("redis://user:s3cret@cache/1") == "redis://user:***@cache/1"
    assert without_password("redis://127.0.0.1:6379/0") == "redis://127.0.0.1:6379/0"


def test_faust_leaves_no_data_directory_in_the_working_directory(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.chdir(tmp_path)
    settings = Settings(kafka=KafkaSettings(bootstrap="127.0.0.1:1"))
    app = build_quality_app(settings, ProcessState())
    app._create_directories()  # what faust does as the app starts
    assert list(tmp_path.iterdir()) == []
    assert app.conf.datadir == faust_datadir() and app.conf.appdir.is_dir()
