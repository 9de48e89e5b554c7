"""Produce batches go to the partition the producer's own partitioner picks."""

from __future__ import annotations

import random

from aiokafka.partitioner import DefaultPartitioner
from aiokafka.partitioner import murmur2 as aiokafka_murmur2

from streams.kafka.batches import murmur2, partition_of


def test_murmur2_is_aiokafkas() -> None:
    rng = random.Random(3)
    for length in [*range(0, 17), 36, 64, 255]:
        for _ in range(50):
            data = rng.randbytes(length)
            assert murmur2(data) == aiokafka_murmur2(data), data
    assert murmur2(b"21") == aiokafka_murmur2(b"21")


def test_partition_of_agrees_with_the_default_partitioner() -> None:
    default = DefaultPartitioner()
    rng = random.Random(7)
    hashes: dict[bytes, int] = {}
    for count in (1, 3, 4, 12):
        partitions = list(range(count))
        for _ in range(500):
            key = rng.randbytes(rng.randint(0, 40))
            want = default(key, partitions, partitions)
            assert partition_of(key, partitions, partitions, hashes) == want
            assert partition_of(key, partitions, partitions, hashes) == want  # from the memo


def test_a_record_without_a_key_goes_to_an_available_partition() -> None:
    for _ in range(50):
        assert partition_of(None, [0, 1, 2, 3], [2], {}) == 2
