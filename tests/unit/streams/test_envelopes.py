import asyncio

from aiokafka.errors import MessageSizeTooLargeError, TopicAuthorizationFailedError

from schemas.messages import AnswerPath, InferenceRequest, InferenceResult, Lane, RoutedRequest
from schemas.settings import Settings
from streams.kafka.envelopes import Outbound, deliver, refused_for_good

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


def _lane_record(**request: object) -> Outbound:
    routed = RoutedRequest(
        request=InferenceRequest(id="big-1", prompt="x", **request),  # type: ignore[arg-type]
        lane=Lane.BULK,
        path=AnswerPath.HEAVY,
        reply_to="laneway.replies.c1",
        produced_at_ms=1,
        routed_at_ms=2,
    )
    return Outbound("laneway.lane.bulk", b"big-1", routed.model_dump_json().encode())


def test_a_lane_record_refused_for_good_goes_to_the_dlq_and_its_client_hears_why() -> None:
    record = _lane_record(batch_id="job-7")
    out = refused_for_good(record, MessageSizeTooLargeError(), SETTINGS)
    assert [o.topic for o in out] == [
        "laneway.dlq",
        "laneway.replies.c1",
        "laneway.results",
        "laneway.quality",
    ]
    headers = dict(out[0].headers)
    assert out[0].value == record.value
    assert headers["laneway-error-code"] == b"INF-400"
    assert headers["laneway-source-topic"] == b"laneway.lane.bulk"
    reply = InferenceResult.model_validate_json(out[1].value)
    assert reply.id == "big-1" and reply.status == "error" and reply.error is not None
    assert reply.error.code == "INF-400" and "bytes on laneway.lane.bulk" in reply.error.message
    assert reply.batch_id == "job-7"  # a batch job counts it as one of its results


def test_what_the_dlq_refuses_keeps_its_headers_and_then_is_given_up() -> None:
    dlq = Outbound("laneway.dlq", b"k", b"v" * 10, (("laneway-error", b"why"),))
    (emptied,) = refused_for_good(dlq, MessageSizeTooLargeError(), SETTINGS)
    assert emptied.value == b"" and dict(emptied.headers)["laneway-error"] == b"why"
    assert "laneway-dlq-value-dropped" in dict(emptied.headers)
    assert refused_for_good(emptied, MessageSizeTooLargeError(), SETTINGS) == []
    result = Outbound("laneway.results", b"k", b'{"id": "r"}')
    (only,) = refused_for_good(result, TopicAuthorizationFailedError(), SETTINGS)
    assert only.topic == "laneway.dlq" and dict(only.headers)["laneway-error-code"] == b"INF-502"


def test_a_cancelled_request_has_no_quality_event() -> None:
    from schemas.errors import DeadlineExceeded
    from streams.kafka.envelopes import terminal_records

    failed = InferenceResult.failure("r", DeadlineExceeded("cancelled by the client"))
    cancelled = failed.model_copy(update={"finish_reason": "cancelled"})
    topics = [
        [
            r.topic
            for r in terminal_records(
                x, reply_to="laneway.replies", tenant=None, now_ms=1, settings=SETTINGS
            )
        ]
        for x in (failed, cancelled)
    ]
    assert topics == [
        ["laneway.replies", "laneway.results", "laneway.quality"],
        ["laneway.replies", "laneway.results"],
    ]
