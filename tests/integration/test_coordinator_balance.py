"""Coordinators spread the shards between them again after one restarts.

Found from outside: a coordinator took free shards only up to a share of the coordinators it
saw *owning* shards, and nothing was ever moved. When one of two coordinators restarted, the
other took every shard, and the restarted one, seeing no free shard, owned nothing for good:
after a rolling restart one coordinator served every group. Coordinators now register
themselves (``coordinator_members/``) and one holding more than its share hands shards over.
"""

from __future__ import annotations

import json
import signal
import time
from collections import Counter
from collections.abc import Callable

import pytest

from strom import Consumer, OffsetAndMetadata, TopicPartition
from strom.cli.admin import _ranges
from strom.devcluster.cluster import LocalCluster
from strom.devcluster.procs import wait_for
from tests.conftest import create_topic, member_metric
from tests.integration.test_cluster_cli import strom

pytestmark = pytest.mark.integration

SHARDS = 6


def _loaded_per_owner(cluster: LocalCluster) -> Counter[str]:
    shards = cluster.coordinator_shards() or {}
    return Counter(addr for addr, epoch in shards.values() if addr and epoch >= 0)


def _balanced(cluster: LocalCluster) -> bool:
    per = _loaded_per_owner(cluster)
    want = {m.address: SHARDS // 2 for m in cluster.coordinators}
    return dict(per) == want


def test_a_restarted_coordinator_gets_its_share_of_the_shards_back(
    make_cluster: Callable[..., LocalCluster],
) -> None:
    cluster = make_cluster(
        nodes=1,
        controllers=1,
        coordinators=2,
        coordinator_args=[
            "--offsets-partitions",
            str(SHARDS),
            "--transaction-state-partitions",
            "2",
        ],
    )
    wait_for(lambda: _balanced(cluster), timeout=60, what="the shards spread over both")
    create_topic(cluster, "bal", 1, 1)
    tp = TopicPartition("bal", 0)
    groups = [f"g{i}" for i in range(12)]  # spread over the shards by their hash
    for n, group in enumerate(groups):
        with Consumer(cluster.bootstrap, group_id=group, enable_auto_commit=False) as c:
            c.commit({tp: OffsetAndMetadata(100 + n, "")})

    first, second = cluster.coordinators
    assert first.process is not None
    first.process.stop()
    wait_for(
        lambda: _loaded_per_owner(cluster) == {second.address: SHARDS},
        timeout=60,
        what="the other coordinator to take every shard",
    )
    first.start()
    cluster.wait_serving(first)
    # Back, it gets half of them again (before, it owned nothing for good).
    wait_for(lambda: _balanced(cluster), timeout=60, what="the shards spread over both again")
    assert member_metric(second, "strom_coordinator_shard_hand_overs_total", kind="group") >= 1
    for n, group in enumerate(groups):  # nothing committed was lost on the way
        with Consumer(cluster.bootstrap, group_id=group, enable_auto_commit=False) as c:
            assert c.committed(tp).offset == 100 + n, group
    # The CLI shows who owns what (its --json listed no shard at all before).
    text = strom("cluster", "describe", "-b", cluster.bootstrap).stdout.decode()
    lines = [line for line in text.splitlines() if line.startswith("Coordinator ")]
    assert len(lines) == 2 and all("group shards=" in line for line in lines), text
    described = json.loads(strom("cluster", "describe", "--json", "-b", cluster.bootstrap).stdout)
    assert len(described["coordinator_shards"]) == SHARDS
    assert len(described["transaction_shards"]) == 2


def test_shard_lists_print_as_ranges() -> None:
    assert _ranges([]) == "-"
    assert _ranges([0, 1, 2, 5]) == "0-2,5"
    assert _ranges([3]) == "3"
    assert _ranges([1, 3, 4]) == "1,3-4"


def test_hand_overs_paused_for_a_hung_taker_resume_once_it_registers_again(
    make_cluster: Callable[..., LocalCluster],
) -> None:
    """A shard handed to a coordinator that hung is taken back after FREE_GRACE_S, and hand-
    overs pause (60 s) rather than send more to it; once that coordinator registers again
    (its lease ran out while it was stopped) they resume, so it gets its share within
    seconds. Found in CI: the resumed one owned nothing for the whole pause, and a test
    waiting for the shards to spread timed out."""
    cluster = make_cluster(
        nodes=1,
        controllers=1,
        coordinators=1,
        coordinator_args=["--offsets-partitions", str(SHARDS)],
    )
    first = cluster.coordinators[0]
    wait_for(lambda: _loaded_per_owner(cluster)[first.address] == SHARDS, timeout=60, what="all")
    added = cluster.add_coordinator()
    assert added.process is not None
    added.process.signal(signal.SIGSTOP)  # registered, serving, and now taking nothing
    try:
        wait_for(
            lambda: "taken by nobody" in first.log_path.read_text(errors="replace"),
            timeout=30,
            what="a shard handed to the hung coordinator taken back",
        )
    finally:
        added.process.signal(signal.SIGCONT)
    resumed = time.monotonic()
    wait_for(lambda: _balanced(cluster), timeout=60, what="the shards spread over both again")
    took = time.monotonic() - resumed
    assert took < 20, f"the resumed coordinator got its share {took:.1f} s later (paused 60 s)"
