import asyncio

from schemas.settings import Settings
from streams.kafka.envelopes import Outbound, deliver

SETTINGS = Settings()


class Broker:
    """Acks records, except that it refuses some topics, some times."""

    def __init__(self, refuse: dict[str, int]) -> None:
        self.refuse = refuse
        self.acked: list[Outbound] = []

    async def send(self, record: Outbound) -> asyncio.Future[object]:
        future: asyncio.Future[object] = asyncio.get_running_loop().create_future()
        if self.refuse.get(record.topic, 0) > 0:
            self.refuse[record.topic] -= 1
            future.set_exception(RuntimeError(f"{record.topic} refused"))
        else:
            self.acked.append(record)
            future.set_result(None)
        return future


async def test_a_refused_reply_topic_is_diverted_to_the_dlq() -> None:
    broker = Broker({"laneway.replies.gone": 99})
    records = [
        Outbound("laneway.replies.gone", b"r1", b"result"),
        Outbound("laneway.results", b"r1", b"result"),
    ]
    await deliver(records, broker.send, SETTINGS)
    topics = sorted(r.topic for r in broker.acked)
    assert topics == ["laneway.dlq", "laneway.results"]
    dlq = next(r for r in broker.acked if r.topic == "laneway.dlq")
    assert dlq.value == b"result"
    headers = dict(dlq.headers)
    assert headers["laneway-source-topic"] == b"laneway.replies.gone"
    assert b"refused" in headers["laneway-error"]


async def test_laneway_topics_are_retried_until_taken() -> None:
    broker = Broker({"laneway.lane.bulk": 2})
    await deliver([Outbound("laneway.lane.bulk", b"k", b"v")], broker.send, SETTINGS)
    assert [r.topic for r in broker.acked] == ["laneway.lane.bulk"]
    assert broker.refuse["laneway.lane.bulk"] == 0
