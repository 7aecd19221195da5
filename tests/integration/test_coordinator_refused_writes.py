"""An append of the coordinator that the storage node refuses for good (not a lost
leadership) is answered with what was refused, logged once, and the shard serves again once
the cause is gone (``strom.coordinator.shard_writes``, ``AppendRefused``).

Real processes: etcd, a controller, a storage node and a coordinator.
"""

from __future__ import annotations

from collections.abc import Callable
from pathlib import Path

import pytest

from strom import Admin, Consumer, OffsetAndMetadata, TopicPartition
from strom.devcluster.cluster import LocalCluster
from strom.devcluster.procs import wait_for
from strom.errors import CoordinatorLoadInProgressError, StromError, UnknownServerError
from tests.conftest import create_topic

pytestmark = pytest.mark.integration


def test_a_write_the_leader_refuses_is_answered_with_the_refusal_not_as_loading(
    make_cluster: Callable[..., LocalCluster],
) -> None:
    """An append of the coordinator that the leader refuses for good is no lost leadership:
    the commit fails at once with UNKNOWN_SERVER_ERROR naming the refusal (it used to fail
    REQUEST_TIMED_OUT, and its retries met COORDINATOR_LOAD_IN_PROGRESS "still loading" for
    the whole timeout); while the shard's own fence is refused, LOAD_IN_PROGRESS says why;
    once the cause is gone, the shard serves again. An operator shrinking the internal
    topic's ``max.message.bytes`` (its configs other than cleanup.policy may be altered) makes
    such refusals for real."""
    c = make_cluster(
        nodes=1,
        controllers=1,
        coordinator_args=["--offsets-partitions", "1", "--transaction-state-partitions", "1"],
    )
    create_topic(c, "refused")
    tp = TopicPartition("refused", 0)
    admin = Admin(c.bootstrap)
    consumer = Consumer(c.bootstrap, group_id="refused-group", enable_auto_commit=False)
    try:
        consumer.assign([tp])
        consumer.commit({tp: OffsetAndMetadata(1)}, timeout_ms=60_000)
        admin.alter_configs("__consumer_offsets", set={"max.message.bytes": 1024})

        def big_commit_refused() -> StromError | None:
            try:
                consumer.commit({tp: OffsetAndMetadata(2, "m" * 2000)}, timeout_ms=60_000)
            except StromError as exc:
                return exc
            return None  # the node has not applied the new limit yet

        refused = wait_for(big_commit_refused, timeout=60, what="the oversized commit refused")
        assert isinstance(refused, UnknownServerError), refused
        assert "MESSAGE_TOO_LARGE" in refused.message and "max.message.bytes" in refused.message
        # The shard reloads and serves again: a commit that fits goes through.
        consumer.commit({tp: OffsetAndMetadata(3)}, timeout_ms=60_000)
        assert consumer.committed([tp], timeout_ms=30_000)[tp].offset == 3

        # Too small for the shard's fence batch: the refused commit reloads the shard, whose
        # load is refused in turn; requests meanwhile hear why it still loads.
        admin.alter_configs("__consumer_offsets", set={"max.message.bytes": 64})
        wait_for(
            lambda: isinstance(big_commit_refused(), UnknownServerError),
            timeout=60,
            what="a commit refused under max.message.bytes=64",
        )
        with pytest.raises(CoordinatorLoadInProgressError, match="MESSAGE_TOO_LARGE"):
            consumer.commit({tp: OffsetAndMetadata(4)}, timeout_ms=3000)
        admin.alter_configs("__consumer_offsets", delete=["max.message.bytes"])
        consumer.commit({tp: OffsetAndMetadata(5)}, timeout_ms=60_000)
        assert consumer.committed([tp], timeout_ms=30_000)[tp].offset == 5
        # Logged once per refusal (the second after a write went through), not once per
        # refused write or load attempt.
        (coordinator,) = c.coordinators
        logged = Path(coordinator.log_path).read_text(errors="replace").count("refused coordinator")
        assert logged == 2
    finally:
        consumer.close()
        admin.close()
