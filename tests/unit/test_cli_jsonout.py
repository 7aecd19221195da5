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
