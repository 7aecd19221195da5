"""``strom.aio``: the asyncio clients against a real local cluster."""

from __future__ import annotations

import asyncio

import pytest

from strom import aio
from strom.client.types import RecordMetadata, TopicPartition
from strom.devcluster.cluster import LocalCluster

pytestmark = pytest.mark.integration


@pytest.fixture(scope="module")
def bootstrap(one_node_cluster: LocalCluster) -> str:
    return one_node_cluster.bootstrap


def test_admin_producer_and_consumer_never_block_the_loop(bootstrap: str) -> None:
    async def main() -> None:
        ticks = 0

        async def ticker() -> None:  # proves the loop keeps running while clients wait
            nonlocal ticks
            while True:
                await asyncio.sleep(0.01)
                ticks += 1

        tick_task = asyncio.create_task(ticker())
        async with aio.Admin(bootstrap) as admin:
            await admin.create_topic("events", partitions=2, replication_factor=1)
            assert "events" in await admin.list_topics()
            desc = await admin.describe_topic("events")
            assert len(desc.partitions) == 2
        async with aio.Producer(bootstrap, acks="all") as producer:
            md = await producer.send_and_wait("events", b"one", partition=0)
            assert isinstance(md, RecordMetadata) and (md.partition, md.offset) == (0, 0)
            futures = [await producer.send("events", b"v%d" % i, partition=1) for i in range(50)]
            offsets = [(await f).offset for f in futures]
            assert offsets == list(range(50))
            chunks = await producer.send_batch(
                "events", [b"b%d" % i for i in range(100)], partition=0
            )
            assert sum(c.count for c in chunks) == 100
        async with aio.Consumer(bootstrap, auto_offset_reset="earliest") as consumer:
            await consumer.assign([TopicPartition("events", 0), TopicPartition("events", 1)])
            got = []
            async for record in consumer:
                got.append(record)
                if len(got) == 151:
                    break
            by_part = {p: [r.value for r in got if r.partition == p] for p in (0, 1)}
            assert by_part[0] == [b"one"] + [b"b%d" % i for i in range(100)]
            assert by_part[1] == [b"v%d" % i for i in range(50)]
            assert await consumer.end_offsets([TopicPartition("events", 1)]) == {
                TopicPartition("events", 1): 50
            }
            assert (await consumer.poll_arrow(timeout_ms=50)).num_rows == 0
        tick_task.cancel()
        assert ticks > 0

    asyncio.run(main())
