"""Produce requests built at the protobuf wire level, so batch bytes are copied once.

Building ``ProduceRequest`` through the generated classes copies each batch's bytes into the
partition message, again into the topic message and again into the request (nested
constructors deep-copy), then serialises — four copies of every megabyte on the producer's
hot path. Protobuf's encoding is a concatenation of fields, so the request is assembled here
from the small fields (encoded by protobuf itself) and the raw batch bytes, joined once. The
node parses it with the same generated schema (see ``strom.storage.wire``).
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence

from strom.api import storage_pb2
from strom.protowire import encode_varint as varint

_LEN = 2
_REQ_TOPICS = bytes(((3 << 3) | _LEN,))  # ProduceRequest.topics
_TOPIC_NAME = bytes(((1 << 3) | _LEN,))  # ProduceTopicData.topic
_TOPIC_PARTS = bytes(((2 << 3) | _LEN,))  # ProduceTopicData.partitions
_TOPIC_ID = bytes(((3 << 3) | _LEN,))  # ProduceTopicData.topic_id
_PART_RECORDS = bytes(((2 << 3) | _LEN,))  # ProducePartitionData.records

PRODUCE_METHOD = "/strom.v1.StorageService/Produce"


def encode_produce_request(
    acks: int,
    timeout_ms: int,
    topics: Mapping[str | tuple[str, str], Sequence[tuple[int, int, Sequence[bytes]]]],
    transactional_id: str = "",
) -> bytes:
    """``topics``: name, or (name, topic id) to have the leader check the id, ->
    [(partition, current_leader_epoch, [batch bytes, ...])]."""
    parts: list[bytes] = [
        storage_pb2.ProduceRequest(
            acks=acks, timeout_ms=timeout_ms, transactional_id=transactional_id
        ).SerializeToString()
    ]
    for key, partitions in topics.items():
        name, topic_id = (key, "") if isinstance(key, str) else key
        raw_name = name.encode()
        topic_parts: list[bytes] = [_TOPIC_NAME, varint(len(raw_name)), raw_name]
        if topic_id:
            raw_id = topic_id.encode()
            topic_parts += [_TOPIC_ID, varint(len(raw_id)), raw_id]
        for partition, epoch, batches in partitions:
            head = storage_pb2.ProducePartitionData(
                partition=partition, current_leader_epoch=epoch
            ).SerializeToString()
            size = sum(len(b) for b in batches)
            rec_head = _PART_RECORDS + varint(size)
            body_len = len(head) + len(rec_head) + size
            topic_parts += [_TOPIC_PARTS, varint(body_len), head, rec_head, *batches]
        topic_len = sum(len(x) for x in topic_parts)
        parts += [_REQ_TOPICS, varint(topic_len), *topic_parts]
    return b"".join(parts)
