"""Deterministic answers from the rule book; no model. Lets a lane serve
rule-owned intents (and gives a model-free backend for load tests)."""

from __future__ import annotations

from collections.abc import Sequence

from schemas.errors import BackendUnavailable
from schemas.settings import BackendSettings
from streams.rules.engine import RuleBook
from workers.backends.base import Generation, GenerationInput, Outcome

__all__ = ["RulesBackend"]


class RulesBackend:
    kind = "rules"

    def __init__(self, model: str, settings: BackendSettings) -> None:
        self.model = model or "rules"
        self._book = RuleBook()

    async def load(self) -> None:
        return None

    async def infer_batch(self, inputs: Sequence[GenerationInput]) -> list[Outcome]:
        outcomes: list[Outcome] = []
        for item in inputs:
            users = [m.content for m in item.messages if m.role == "user"]
            answer = self._book.answer(users[-1] if users else "")
            if answer is None:
                outcomes.append(BackendUnavailable("no rule owns this request"))
            else:
                outcomes.append(Generation(answer.text, prompt_tokens=0, completion_tokens=0))
        return outcomes

    async def check_health(self) -> bool:
        return True

    async def close(self) -> None:
        return None
