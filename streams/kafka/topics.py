"""Topic registry: every topic laneway uses, with its partition count,
created before any consumer starts (``laneway topics create``).

Tansu auto-creates unknown topics with 4 partitions, and faust refuses
tables whose changelog partitions do not match the source, so nothing is
left to auto-creation: faust's own internal topics are listed here too.
"""

from __future__ import annotations

import asyncio
import logging
from dataclasses import dataclass

from aiokafka.admin import AIOKafkaAdminClient, NewTopic
from aiokafka.errors import KafkaConnectionError, TopicAlreadyExistsError

from schemas.messages import Lane
from schemas.settings import Settings

__all__ = ["TopicSpec", "create_topics", "retry_topic", "topic_specs", "wait_for_broker"]

log = logging.getLogger(__name__)


@dataclass(frozen=True, slots=True)
class TopicSpec:
    name: str
    partitions: int
    purpose: str


def retry_topic(settings: Settings, lane: Lane) -> str:
    """Where a lane's requests wait for another attempt (``workers.retry``)."""
    return settings.topic(f"retry.{lane.value}")


def topic_specs(settings: Settings, extra_reply_topics: tuple[str, ...] = ()) -> list[TopicSpec]:
    """Every topic of one deployment, in creation order."""
    n = settings.kafka.partitions
    t = settings.topic
    specs = [
        TopicSpec(t("requests"), n, "client requests (InferenceRequest)"),
        *(TopicSpec(settings.lane_topic(lane), n, f"{lane} lane (RoutedRequest)") for lane in Lane),
        *(
            TopicSpec(retry_topic(settings, lane), n, f"{lane} requests waiting to be retried")
            for lane in Lane
        ),
        TopicSpec(settings.replies_topic, n, "default reply topic (InferenceResult)"),
        TopicSpec(t("results"), n, "every terminal result (InferenceResult)"),
        TopicSpec(t("quality"), n, "quality events (QualityEvent)"),
        TopicSpec(t("feedback"), n, "client feedback (Feedback)"),
        TopicSpec(
            t("cancels"), n, "requests whose answer the client no longer wants (CancelRequest)"
        ),
        TopicSpec(t("dlq"), 1, "records nobody could process, with error headers"),
        TopicSpec(t("batch.jobs"), n, "offline batch job events"),
        TopicSpec(t("shadow"), n, "shadow versions' answers, never sent to clients"),
        # faust's internal topic: the leader assignor. Same partition count as
        # the sources, so faust's co-partitioning checks are satisfied.
        TopicSpec(f"{settings.app_id}-__assignor-__leader", n, "faust leader election"),
        # The quality loop is its own faust app (``laneway router``): its
        # leader topic and the changelog of its path-statistics table.
        TopicSpec(f"{settings.app_id}-router-__assignor-__leader", n, "faust leader election"),
        TopicSpec(
            f"{settings.app_id}-router-path-stats-changelog", n, "path statistics (faust table)"
        ),
    ]
    specs.extend(TopicSpec(name, n, "client reply topic") for name in extra_reply_topics)
    return specs


async def wait_for_broker(settings: Settings, timeout_s: float = 30.0) -> None:
    """Wait until the broker answers a metadata request."""
    loop = asyncio.get_running_loop()
    give_up = loop.time() + timeout_s
    while True:
        admin = AIOKafkaAdminClient(**settings.kafka.client_options())
        try:
            await admin.start()
            await admin.list_topics()
            return
        except KafkaConnectionError:
            if loop.time() > give_up:
                raise
            await asyncio.sleep(0.2)
        finally:
            await admin.close()


async def create_topics(
    settings: Settings, extra_reply_topics: tuple[str, ...] = ()
) -> list[TopicSpec]:
    """Create every missing topic; an existing one is left as it is, but a
    partition count that differs from the registry is logged."""
    specs = topic_specs(settings, extra_reply_topics)
    admin = AIOKafkaAdminClient(**settings.kafka.client_options())
    await admin.start()
    try:
        existing = set(await admin.list_topics())
        missing = [s for s in specs if s.name not in existing]
        for spec in missing:
            try:
                await admin.create_topics(
                    [
                        NewTopic(
                            spec.name,
                            num_partitions=spec.partitions,
                            replication_factor=settings.kafka.replication_factor,
                        )
                    ]
                )
            except TopicAlreadyExistsError:
                pass
        present = [s for s in specs if s.name in existing]
        if present:
            described = await admin.describe_topics([s.name for s in present])
            counts = {d["topic"]: len(d["partitions"]) for d in described}
            for spec in present:
                if counts.get(spec.name, spec.partitions) != spec.partitions:
                    log.warning(
                        "topic %s has %s partitions, registry says %s",
                        spec.name,
                        counts[spec.name],
                        spec.partitions,
                    )
        return specs
    finally:
        await admin.close()
