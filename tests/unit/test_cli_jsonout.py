"""The CLI's ``--json`` form of protobuf answers."""

from __future__ import annotations

import json

from strom.api import coordinator_pb2 as cpb
from strom.cli.jsonout import message_json


def test_zero_fields_are_printed_and_64_bit_integers_are_numbers() -> None:
    """Partition 0, offset 0 and lag 0 are values a script reads, not absent keys, and a
    64-bit offset is a number (json_format alone leaves out the first and quotes the second)."""
    big = 2**60 + 1  # beyond a double's exact range: still exact
    g = cpb.DescribedGroup(
        group_id="g",
        offsets=[
            cpb.GroupPartitionOffset(topic="t", partition=0, committed_offset=0, lag=0),
            cpb.GroupPartitionOffset(topic="t", partition=1, committed_offset=big, lag=5),
        ],
    )
    d = json.loads(message_json(g))
    assert d["offsets"][0]["partition"] == 0
    assert d["offsets"][0]["committed_offset"] == 0 and d["offsets"][0]["lag"] == 0
    assert d["offsets"][1]["committed_offset"] == big
    assert d["members"] == [] and d["error_code"] == "NONE"


def test_describe_json_gives_the_replica_count_a_reassignment_changed() -> None:
    """``topics describe --json``: ``metadata.replication_factor`` is the count the text
    shows (the first partition's replicas, not counting those being added), the count chosen
    at creation kept as ``created_replication_factor`` (found from outside: the JSON still
    said 2 after a move to 3 replicas)."""
    from strom.api import controller_pb2
    from strom.api import metadata_pb2 as md
    from strom.cli.topic_listing import _topic_dict

    t = controller_pb2.TopicDescription(
        name="a2", metadata=md.TopicMetadata(name="a2", partition_count=1, replication_factor=2)
    )
    p = controller_pb2.PartitionDescription(
        partition=0, state=md.PartitionState(replicas=[1, 2, 3], leader=1, isr=[1, 2, 3])
    )
    d = _topic_dict(t, [p], 1)
    assert d["metadata"]["replication_factor"] == 3
    assert d["metadata"]["created_replication_factor"] == 2
    moving = controller_pb2.PartitionDescription(
        partition=0,
        state=md.PartitionState(replicas=[4, 1, 2], leader=1, isr=[1, 2], adding_replicas=[4]),
    )
    assert _topic_dict(t, [moving], 1)["metadata"]["replication_factor"] == 2
