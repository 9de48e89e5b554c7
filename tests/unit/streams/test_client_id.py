"""The SDK's stable default client id (one reply topic per program and host)."""

from __future__ import annotations

import sys

import pytest

from schemas.settings import KafkaSettings
from streams.client import LanewayClient, default_client_id


def test_default_is_stable_and_a_legal_topic_name(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(sys, "argv", ["/usr/bin/my bot.py", "--x"])
    monkeypatch.setattr("socket.gethostname", lambda: "web-1.example.com")
    assert default_client_id() == "client-web-1-my-bot"
    assert default_client_id() == default_client_id()
    client = LanewayClient(KafkaSettings())
    assert client.reply_to == "laneway.replies.client-web-1-my-bot"


def test_a_setting_or_an_argument_wins() -> None:
    kafka = KafkaSettings(client_id="billing")
    assert LanewayClient(kafka).reply_to == "laneway.replies.billing"
    assert LanewayClient(kafka, client_id="other").client_id == "other"
    with pytest.raises(ValueError):
        KafkaSettings(client_id="no spaces")
