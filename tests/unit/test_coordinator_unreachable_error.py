"""What the clients of a shard whose storage nodes do not answer its coordinator are told
(``CoordinatorCore._raise_not_loaded``).

Found from outside: a coordinator cut from every storage node answered
COORDINATOR_LOAD_IN_PROGRESS "shard 1 is still loading" for the whole cut, which hides the
cause and keeps a client on that coordinator. It is COORDINATOR_NOT_AVAILABLE now (retriable;
the client looks its coordinator up again), naming the nodes unreachable and what follows.
"""

from __future__ import annotations

import time
from types import SimpleNamespace

import pytest

from strom.coordinator.core import CoordinatorCore
from strom.coordinator.shards import Shard, ShardKind
from strom.errors import CoordinatorLoadInProgressError, CoordinatorNotAvailableError, ErrorCode


def _shard(unreachable: str | None) -> Shard:
    kind = ShardKind(
        name="group",
        topic="__consumer_offsets",
        partitions=2,
        replication_factor=3,
        key=lambda keys, s: f"coordinators/{s}",
        owners=lambda view: {},
        new_state=lambda: None,  # type: ignore[arg-type,return-value]
    )
    shard = Shard(1, kind)
    shard.unserved_since = time.monotonic() - 4
    shard.unreachable = unreachable
    return shard


def _core(others: set[str]) -> SimpleNamespace:
    return SimpleNamespace(coordinator_id=3, _other_coordinators=lambda: others)


def test_with_another_coordinator_the_answer_says_the_shard_is_given_up() -> None:
    shard = _shard("DEADLINE_EXCEEDED: Deadline Exceeded")
    with pytest.raises(CoordinatorNotAvailableError) as info:
        CoordinatorCore._raise_not_loaded(_core({"other"}), shard)  # type: ignore[arg-type]
    msg = info.value.message
    assert info.value.code == ErrorCode.COORDINATOR_NOT_AVAILABLE and info.value.retriable
    assert "coordinator 3 cannot reach the storage nodes for __consumer_offsets-1" in msg
    assert "not served for 4 s" in msg and "DEADLINE_EXCEEDED" in msg
    assert "gives the shard up to another coordinator" in msg


def test_alone_the_answer_says_it_keeps_retrying() -> None:
    with pytest.raises(CoordinatorNotAvailableError) as info:
        CoordinatorCore._raise_not_loaded(_core(set()), _shard("UNAVAILABLE: refused"))  # type: ignore[arg-type]
    assert "no other coordinator runs to take the shard over" in info.value.message


def test_a_shard_loading_for_another_reason_gets_the_loading_answer() -> None:
    with pytest.raises(CoordinatorLoadInProgressError, match="shard 1 is still loading"):
        CoordinatorCore._raise_not_loaded(_core({"other"}), _shard(None))  # type: ignore[arg-type]
