"""Keys land on the partitions Kafka's Java client picks (vectors from Kafka's own tests)."""

import pytest

from strom.client.partitioner import murmur2, partition_for_key


@pytest.mark.parametrize(
    ("key", "partition"),
    [(b"", 681), (b"a", 524), (b"ab", 434), (b"abc", 107), (b"123456789", 566), (b"\x00 ", 742)],
)
def test_matches_kafka_default_partitioner(key: bytes, partition: int) -> None:
    assert partition_for_key(key, 1000) == partition


def test_hash_is_32_bit_and_handles_high_bytes() -> None:
    for key in (b"\xa4", b"\x81" * 1000, b"\xff\xff\xff"):
        assert 0 <= murmur2(key) <= 0xFFFFFFFF


def test_bad_partition_count_is_a_clear_error() -> None:
    with pytest.raises(ValueError, match="num_partitions"):
        partition_for_key(b"k", 0)
