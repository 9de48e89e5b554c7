"""The rules engine inside the running classifier: a rule that reads an
order from Redis, and a rule file edited while the stack runs."""

from __future__ import annotations

import asyncio
import uuid

from schemas.messages import AnswerPath
from schemas.settings import Settings
from streams.client import LanewayClient
from tests.integration.conftest import RULES_FILE


async def test_an_order_status_rule_answers_from_redis(
    client: LanewayClient, settings: Settings
) -> None:
    order = str(uuid.uuid4().int % 10**8 + 10**7)  # 8 digits, unique
    redis = settings.redis.client()
    await redis.hset(
        f"{settings.redis.key_prefix}:orders:{order}",
        mapping={"status": "shipped", "eta": "Friday"},
    )
    found = await client.ask(f"Where is my order {order}?", timeout_s=30)
    assert (found.status, found.path, found.model) == ("ok", AnswerPath.RULES, "rules:order_status")
    assert found.output == f"Order {order} is shipped. Expected delivery: Friday."
    missing = await client.ask(f"Where is my order {int(order) + 1}?", timeout_s=30)
    assert missing.path == AnswerPath.RULES and missing.output is not None
    assert missing.output.startswith(f"I couldn't find order {int(order) + 1}.")


async def test_an_edited_rule_file_is_picked_up_and_a_broken_one_is_not(
    client: LanewayClient,
) -> None:
    original = RULES_FILE.read_text()
    try:
        RULES_FILE.write_text(
            original.replace("answer: pong", 'answer: "pong, from the edited file"')
        )
        answer = None
        for _ in range(20):
            answer = await client.ask("ping", timeout_s=30)
            if answer.output == "pong, from the edited file":
                break
            await asyncio.sleep(0.5)
        assert answer is not None and answer.output == "pong, from the edited file"

        RULES_FILE.write_text(original + "\n  - name: [broken\n")
        await asyncio.sleep(2.5)  # two reload checks
        kept = await client.ask("ping", timeout_s=30)
        assert kept.output == "pong, from the edited file"  # the last good set
    finally:
        RULES_FILE.write_text(original)
