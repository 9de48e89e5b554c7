"""A generation stopped because its answer is no longer wanted
(``workers.backends.base.until_unwanted``)."""

from __future__ import annotations

import asyncio

from schemas.errors import DeadlineExceeded
from workers.backends.base import STOPPED, until_unwanted


async def answer(after_s: float) -> str:
    await asyncio.sleep(after_s)
    return "answer"


async def test_work_that_ends_first_gives_its_answer() -> None:
    unwanted = asyncio.Event()
    assert await until_unwanted(answer(0.01), unwanted) == "answer"
    assert await until_unwanted(answer(0.0), None) == "answer"


async def test_work_no_longer_wanted_is_cancelled_and_answers_stopped() -> None:
    unwanted = asyncio.Event()
    work = asyncio.ensure_future(answer(10.0))
    asyncio.get_running_loop().call_later(0.01, unwanted.set)
    outcome = await until_unwanted(work, unwanted)
    assert isinstance(outcome, DeadlineExceeded) and outcome.message == STOPPED
    assert work.cancelled()


async def test_an_event_set_before_the_work_starts_stops_it_at_once() -> None:
    unwanted = asyncio.Event()
    unwanted.set()
    outcome = await until_unwanted(answer(10.0), unwanted)
    assert isinstance(outcome, DeadlineExceeded)
