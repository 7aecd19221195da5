"""Produce answers for the topic rules of issue 9 item 4, through the real servicer and
partition manager (in-process harness of test_storage_servicer): INVALID_TIMESTAMP and
MESSAGE_TOO_LARGE name the partition, the config and the values; other partitions of the same
request are appended."""

from __future__ import annotations

import time
from pathlib import Path

from strom.errors import ErrorCode as E
from strom.record import encode_batch
from tests.unit.test_storage_servicer import (
    Harness,
    leader_state,
    produce_req,
    results,
    with_harness,
)


def test_produce_refusals_name_partition_config_and_values(tmp_path: Path) -> None:
    async def body(h: Harness) -> None:
        h.topic(
            "t",
            {0: leader_state(), 1: leader_state(), 2: leader_state()},
            **{"message.timestamp.before.max.ms": "60000", "max.message.bytes": "1024"},
        )
        await h.settle()
        now = int(time.time() * 1000)
        old = encode_batch([b"v"], timestamps=[now - 3_600_000])
        big = encode_batch([b"x" * 2000], timestamps=[now])
        ok = encode_batch([b"ok"], timestamps=[now])
        resp = results(
            await h.servicer.Produce(
                produce_req({("t", 0): old, ("t", 1): big, ("t", 2): ok}), None
            )
        )
        assert resp[("t", 0)].error_code == E.INVALID_TIMESTAMP
        msg = resp[("t", 0)].error_message
        assert msg.startswith("t-0: ") and "message.timestamp.before.max.ms=60000" in msg
        assert resp[("t", 1)].error_code == E.MESSAGE_TOO_LARGE
        assert resp[("t", 1)].error_message == (
            f"t-1: batch at byte 0 is {len(big)} bytes, more than the topic's "
            "max.message.bytes=1024"
        )
        assert resp[("t", 2)].error_code == E.NONE
        logs = {p: h.manager.partitions[("t", p)].log.log_end_offset for p in range(3)}
        assert logs == {0: 0, 1: 0, 2: 1}

    with_harness(tmp_path, body)
