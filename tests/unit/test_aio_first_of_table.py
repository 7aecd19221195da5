"""``strom.aio``'s give-back of a cancelled ``poll_arrow``: each partition's first offset."""

from __future__ import annotations

import struct

import pyarrow as pa
import pytest

from strom import aio
from strom.client.types import TopicPartition


def test_first_offsets_of_a_table_with_unaligned_columns_print_no_arrow_warning(
    capfd: pytest.CaptureFixture[str],
) -> None:
    """Found from outside: every cancelled ``poll_arrow`` printed Arrow's "An input buffer
    was poorly aligned" (its group_by over the fetcher's zero-copy columns, which need not
    be 8-byte aligned). The first offsets are now read without Acero."""
    offsets = [5, 3, 9, 4]
    unaligned = pa.py_buffer(b"\0" + struct.pack("<4q", *offsets))[1:]
    table = pa.table(
        {
            "topic": ["a", "a", "b", "b"],
            "partition": pa.array([0, 0, 1, 1], pa.int32()),
            "offset": pa.Array.from_buffers(pa.int64(), 4, [None, unaligned]),
        }
    )
    assert aio._first_of_table(table) == {TopicPartition("a", 0): 3, TopicPartition("b", 1): 4}
    assert aio._first_of_table(table.slice(0, 0)) == {}
    assert "poorly aligned" not in capfd.readouterr().err
