"""Consumer groups end to end (issue: consumer groups): real etcd, controller, storage node and
group coordinator processes, members driven by :mod:`strom.client.group_member`.

One cluster serves the module; every test uses its own topic and group. The coordinator runs
with a short heartbeat interval and session timeout so that rebalances take a fraction of a
second; every wait is on a condition, never a fixed sleep. The SIGKILL test runs last.
"""

from __future__ import annotations

import json
import os
import queue
import subprocess
import sys
import threading
import time
import urllib.request
from collections.abc import Callable, Iterator
from concurrent.futures import Future
from pathlib import Path
from typing import Any

import pytest

from strom import CommitFailedError
from strom.api import (
    common_pb2,
    coordinator_pb2,
    coordinator_pb2_grpc,
    storage_pb2,
)
from strom.client.admin import Admin
from strom.client.cluster import ClusterClient
from strom.client.consumer import Consumer
from strom.client.group_admin import GroupDescription, GroupState
from strom.client.group_member import make_group
from strom.client.types import OffsetAndMetadata, TopicPartition
from strom.devcluster.cluster import LocalCluster
from strom.devcluster.procs import wait_for
from strom.errors import (
    FencedMemberEpochError,
    GroupIdNotFoundError,
    GroupSubscribedToTopicError,
    InvalidGroupIdError,
    InvalidRequestError,
    NonEmptyGroupError,
    StromError,
    TopicDeletionInProgressError,
    UnknownMemberIdError,
    is_retriable,
)
from strom.record import encode_batch
from tests.conftest import create_topic

pytestmark = pytest.mark.integration
E = common_pb2.ErrorCode


class GroupConsumer(Consumer):
    """The Consumer with the group hook wired (what consumer.py's ``_make_group`` will do)."""

    def _make_group(self):  # type: ignore[no-untyped-def]
        return make_group(self)


@pytest.fixture(scope="module")
def cluster(tmp_path_factory: pytest.TempPathFactory) -> Iterator[LocalCluster]:
    root: Path = tmp_path_factory.mktemp("groups")
    c = LocalCluster(
        root / "c",
        nodes=1,
        controllers=1,
        coordinators=1,
        coordinator_args=[
            "--group-heartbeat-interval-ms",
            "200",
            "--group-session-timeout-ms",
            "2000",
            "--offsets-partitions",
            "4",
            "--lag-metrics-interval-s",
            "0.2",
        ],
    )
    try:
        c.start()
        yield c
    finally:
        c.kill()


@pytest.fixture(scope="module")
def client(cluster: LocalCluster) -> Iterator[ClusterClient]:
    with ClusterClient(cluster.bootstrap, retry_s=20) as c:
        yield c


def produce(client: ClusterClient, topic: str, partition: int, n: int) -> None:
    req = storage_pb2.ProduceRequest(acks=-1, timeout_ms=10_000)
    req.topics.add(topic=topic).partitions.add(
        partition=partition,
        records=encode_batch([f"{topic}-{partition}-{i}".encode() for i in range(n)]),
        current_leader_epoch=-1,
    )

    def retriable(resp: storage_pb2.ProduceResponse) -> bool:
        code = resp.topics[0].partitions[0].error_code
        return code != E.NONE and is_retriable(code)  # e.g. the replica is still being created

    resp = client.with_leader(topic, partition, lambda s: s.Produce(req, timeout=10), retriable)
    assert resp.topics[0].partitions[0].error_code == E.NONE


class Member:
    """A consumer polling on its own thread (a consumer is single-threaded), exposing what it
    owns and what it read. :meth:`call` runs a call on that thread: from another, a commit
    while the thread polls is refused (ConcurrentModificationError)."""

    def __init__(self, cluster: LocalCluster, group: str, topics: list[str], **kw: object):
        self.consumer = GroupConsumer(
            cluster.bootstrap, group_id=group, auto_offset_reset="earliest", **kw
        )
        self.consumer.subscribe(topics)
        self.owned: set[TopicPartition] = set()
        self.ever_owned: set[TopicPartition] = set()
        self.values: list[bytes] = []
        self._stop = threading.Event()
        self._calls: queue.SimpleQueue[tuple[Callable[[Consumer], Any], Future[Any]]] = (
            queue.SimpleQueue()
        )
        self._thread = threading.Thread(target=self._run, daemon=True)
        self._thread.start()

    def call(self, fn: Callable[[Consumer], Any], timeout: float = 30) -> Any:
        """``fn(consumer)`` on the polling thread, between two polls; its result."""
        done: Future[Any] = Future()
        self._calls.put((fn, done))
        return done.result(timeout)

    def _run(self) -> None:
        while not self._stop.is_set():
            while not self._calls.empty():
                fn, done = self._calls.get()
                try:
                    done.set_result(fn(self.consumer))
                except BaseException as exc:  # (raised by call())
                    done.set_exception(exc)
            records = self.consumer.poll(50)
            self.values.extend(r.value for r in records if r.value is not None)
            self.owned = self.consumer.assignment()
            self.ever_owned |= self.owned

    def close(self) -> None:
        self._stop.set()
        self._thread.join(10)
        self.consumer.close()


def coordinator_stub(
    cluster: LocalCluster, client: ClusterClient, group: str
) -> coordinator_pb2_grpc.CoordinatorServiceStub:
    resp = client.storage(cluster.nodes[0].address).FindCoordinator(
        storage_pb2.FindCoordinatorRequest(keys=[group]), timeout=5
    )
    c = resp.coordinators[0]
    assert c.error_code == E.NONE, c.error_message
    assert f"{c.node.host}:{c.node.port}" == cluster.coordinators[0].address
    return coordinator_pb2_grpc.CoordinatorServiceStub(
        client.channel(f"{c.node.host}:{c.node.port}")
    )


def balanced(members: list[Member], partitions: int) -> bool:
    owned = [m.owned for m in members]
    union = set().union(*owned)
    per = partitions // len(members)
    return (
        len(union) == partitions
        and sum(len(o) for o in owned) == partitions
        and all(len(o) in (per, per + 1) for o in owned)
    )


def test_members_split_partitions_and_take_over_when_one_leaves(
    cluster: LocalCluster, client: ClusterClient
) -> None:
    create_topic(cluster, "split", 6)
    members = [Member(cluster, "g-split", ["split"]) for _ in range(3)]
    try:
        wait_for(lambda: balanced(members, 6), timeout=20, what="3 members with 2 partitions each")
        assert all(len(m.owned) == 2 for m in members)
        stub = coordinator_stub(cluster, client, "g-split")
        desc = stub.DescribeGroups(
            coordinator_pb2.DescribeGroupsRequest(group_ids=["g-split"]), timeout=5
        ).groups[0]
        assert desc.error_code == E.NONE and len(desc.members) == 3
        assert desc.state == coordinator_pb2.GROUP_STATE_STABLE

        members.pop(0).close()  # leaves the group gracefully (epoch -1)
        wait_for(lambda: balanced(members, 6), timeout=20, what="2 members with 3 each")
        assert sorted(len(m.owned) for m in members) == [3, 3]
    finally:
        for m in members:
            m.close()


def test_an_auto_commit_due_at_a_rebalance_commits_what_the_member_kept(
    cluster: LocalCluster, client: ClusterClient
) -> None:
    """A member busy past its auto-commit interval while another joins: its next poll
    revokes some partitions and auto-commits the others. The auto-commit used the partitions
    owned before the revocation and poll() raised KeyError (found from outside)."""
    create_topic(cluster, "busy", 4)
    for p in range(4):
        produce(client, "busy", p, 3)
    c1 = GroupConsumer(
        cluster.bootstrap,
        group_id="g-busy",
        auto_offset_reset="earliest",
        auto_commit_interval_ms=100,
    )
    other: Member | None = None
    try:
        c1.subscribe(["busy"])
        got: list[bytes] = []

        def owns_all_and_read_all() -> bool:
            got.extend(r.value for r in c1.poll(50) if r.value is not None)
            return len(c1.assignment()) == 4 and len(got) == 12

        wait_for(owns_all_and_read_all, timeout=20, what="c1 owning and reading 4 partitions")
        other = Member(cluster, "g-busy", ["busy"])  # joins while c1 is not polling
        member = c1._group
        wait_for(
            lambda: member._target is not None and member._target != member._owned,
            timeout=20,
            what="c1's new, smaller assignment",
        )
        wait_for(
            lambda: time.monotonic() >= member._next_auto_commit,
            timeout=5,
            what="an auto-commit due",
        )
        assert c1.poll(50) == []  # revokes two, auto-commits the two kept: no KeyError
        kept = c1.assignment()
        assert len(kept) == 2
        wait_for(
            lambda: all(
                (m := c1.committed({tp}).get(tp)) is not None and m.offset == 3 for tp in kept
            ),
            timeout=20,
            what="the kept partitions' positions committed",
        )
        wait_for(lambda: len(other.owned) == 2, timeout=20, what="the other member's two")
    finally:
        if other is not None:
            other.close()
        c1.close()


def test_pattern_subscription_and_the_rebalance_listener(
    cluster: LocalCluster, client: ClusterClient
) -> None:
    create_topic(cluster, "rx-a", 1)
    create_topic(cluster, "rx-b", 2)
    calls: list[tuple[str, list[TopicPartition]]] = []

    class Listener:
        def on_partitions_assigned(self, parts: list[TopicPartition]) -> None:
            calls.append(("assigned", parts))

        def on_partitions_revoked(self, parts: list[TopicPartition]) -> None:
            calls.append(("revoked", parts))

    consumer = GroupConsumer(cluster.bootstrap, group_id="g-rx")
    try:
        consumer.subscribe(pattern=r"rx-.*", listener=Listener())
        want = {TopicPartition("rx-a", 0), TopicPartition("rx-b", 0), TopicPartition("rx-b", 1)}

        def assigned() -> bool:
            consumer.poll(100)  # the assignment is applied on the application's thread
            return consumer.assignment() == want

        wait_for(assigned, timeout=15, what="both topics assigned through the regex")
        assert calls == [("assigned", sorted(want))]
        # The topics the pattern matched (found from outside: subscription() was empty).
        assert consumer.subscription() == {"rx-a", "rx-b"}
    finally:
        consumer.close()
    assert calls[-1] == ("revoked", sorted(want))  # close gives the partitions up


def test_new_partitions_are_picked_up_and_a_static_member_gets_its_own_back(
    cluster: LocalCluster, client: ClusterClient
) -> None:
    from strom.client import Admin

    create_topic(cluster, "grow", 2)
    a = Member(cluster, "g-grow", ["grow"], group_instance_id="a")
    b = Member(cluster, "g-grow", ["grow"], group_instance_id="b")
    try:
        wait_for(lambda: balanced([a, b], 2), timeout=15, what="2 partitions split")
        with Admin(cluster.bootstrap) as admin:
            admin.create_partitions("grow", 4)
        wait_for(lambda: balanced([a, b], 4), timeout=15, what="the new partitions assigned")
        mine = set(b.owned)
        a.ever_owned = set(a.owned)
        b.close()  # a static member's leave keeps its partitions for the session timeout
        b = Member(cluster, "g-grow", ["grow"], group_instance_id="b")
        wait_for(lambda: b.owned == mine, timeout=10, what="the static member's partitions back")
        assert a.ever_owned.isdisjoint(mine)  # nobody took them meanwhile
    finally:
        a.close()
        b.close()


def test_two_groups_each_see_every_record(cluster: LocalCluster, client: ClusterClient) -> None:
    create_topic(cluster, "fanout", 3)
    for p in range(3):
        produce(client, "fanout", p, 40)
    everything = sorted(f"fanout-{p}-{i}".encode() for p in range(3) for i in range(40))
    a = [Member(cluster, "g-a", ["fanout"])]
    b = [Member(cluster, "g-b", ["fanout"]) for _ in range(2)]
    try:
        wait_for(
            lambda: (
                sorted(a[0].values) == everything
                and sorted(b[0].values + b[1].values) == everything
            ),
            timeout=20,
            what="both groups to read all 120 records",
        )
        a[0].close()  # auto-commit on close: group g-a has committed the end of each partition
        stub = coordinator_stub(cluster, client, "g-a")
        desc = stub.DescribeGroups(
            coordinator_pb2.DescribeGroupsRequest(group_ids=["g-a"], include_offsets=True),
            timeout=5,
        ).groups[0]
        assert desc.state == coordinator_pb2.GROUP_STATE_EMPTY
        assert {(o.partition, o.committed_offset, o.end_offset, o.lag) for o in desc.offsets} == {
            (p, 40, 40, 0) for p in range(3)
        }
        listed = stub.ListGroups(coordinator_pb2.ListGroupsRequest(), timeout=5)
        assert {"g-a", "g-b"} <= {g.group_id for g in listed.groups}
        produce(client, "fanout", 0, 5)  # g-a is gone: its lag grows, and the gauge shows it
        url = f"http://127.0.0.1:{cluster.coordinators[0].metrics_port}/metrics"
        gauge = 'strom_coordinator_consumer_lag{group="g-a",partition="0",topic="fanout"} 5.0'
        wait_for(
            lambda: gauge in urllib.request.urlopen(url, timeout=5).read().decode(),
            timeout=10,
            what="the lag gauge",
        )
    finally:
        for m in a + b:
            m.close()


def test_a_zombie_with_a_stale_epoch_cannot_commit(
    cluster: LocalCluster, client: ClusterClient
) -> None:
    create_topic(cluster, "zombie", 2)
    stub = coordinator_stub(cluster, client, "g-zombie")

    def beat(
        member: str, epoch: int, owned: list[int]
    ) -> coordinator_pb2.ConsumerGroupHeartbeatResponse:
        req = coordinator_pb2.ConsumerGroupHeartbeatRequest(
            group_id="g-zombie",
            member_id=member,
            member_epoch=epoch,
            subscribed_topic_names=["zombie"],
        )
        if owned:
            req.owned_topic_partitions.add(topic="zombie", partitions=owned)
        resp = stub.ConsumerGroupHeartbeat(req, timeout=5)
        assert resp.error_code == E.NONE, resp.error_message
        return resp

    def commit(member: str, epoch: int, offset: int) -> int:
        req = coordinator_pb2.OffsetCommitRequest(
            group_id="g-zombie", member_id=member, member_epoch=epoch
        )
        req.topics.add(topic="zombie").partitions.add(partition=0, committed_offset=offset)
        return stub.OffsetCommit(req, timeout=5).error_code

    z = beat("zombie", 0, [])
    z_epoch = z.member_epoch
    assert sorted(z.assignment.topic_partitions[0].partitions) == [0, 1]
    assert commit("zombie", z_epoch, 10) == E.NONE
    # Refused partitions say why in words (found from outside: just the code's name).
    req = coordinator_pb2.OffsetCommitRequest(
        group_id="g-zombie", member_id="zombie", member_epoch=z_epoch
    )
    req.topics.add(topic="zombie").partitions.add(
        partition=1, committed_offset=1, metadata="m" * 5000
    )
    req.topics.add(topic="zombie").partitions.add(partition=7, committed_offset=1)
    refused = stub.OffsetCommit(req, timeout=5)
    assert [r.partitions[0].error_message for r in refused.topics] == [
        "zombie-1: the commit's metadata is 5000 bytes, more than the 4096 kept",
        "there is no partition zombie-7",
    ]
    y = beat("other", 0, [])  # a second member: the zombie must give a partition up
    z = beat("zombie", z_epoch, [0, 1])
    kept = list(z.assignment.topic_partitions[0].partitions)
    assert len(kept) == 1 and z.member_epoch == z_epoch  # revoke first, same epoch
    z = beat("zombie", z_epoch, kept)  # revoked: the member moves to the new epoch
    assert z.member_epoch > z_epoch
    assert commit("zombie", z_epoch, 99) == E.STALE_MEMBER_EPOCH  # its old epoch is refused
    assert commit("zombie", z.member_epoch + 1, 99) == E.FENCED_MEMBER_EPOCH

    # The zombie stops heartbeating; the other member carries on until the session times out.
    y_epoch = y.member_epoch

    def zombie_gone() -> bool:
        nonlocal y_epoch
        y_epoch = beat("other", y_epoch, []).member_epoch
        desc = stub.DescribeGroups(
            coordinator_pb2.DescribeGroupsRequest(group_ids=["g-zombie"]), timeout=5
        ).groups[0]
        return [m.member_id for m in desc.members] == ["other"]

    wait_for(zombie_gone, timeout=15, interval=0.2, what="the zombie's session to expire")
    assert commit("zombie", z.member_epoch, 99) == E.UNKNOWN_MEMBER_ID
    fetched = stub.OffsetFetch(
        coordinator_pb2.OffsetFetchRequest(group_id="g-zombie", member_epoch=-1), timeout=5
    )
    assert fetched.error_code == E.NONE, fetched.error_message
    assert [(p.partition, p.committed_offset) for p in fetched.topics[0].partitions] == [(0, 10)]


def strom(*args: str, check: bool = True) -> subprocess.CompletedProcess[str]:
    proc = subprocess.run(
        [sys.executable, "-m", "strom.cli.main", *args],
        capture_output=True,
        text=True,
        timeout=60,
        env=dict(os.environ),
    )
    if check:
        assert proc.returncode == 0, proc.stderr
    return proc


def test_groups_describe_shows_a_partition_pending_revocation_without_a_committed_offset(
    make_cluster: Callable[..., LocalCluster],
) -> None:
    """Found from outside: a partition its member must still give up, with no committed
    offset, was neither in describe's table nor on the member's line, though nobody else may
    consume it yet. Two members by raw heartbeats (the first keeps both partitions it was
    told to give one of), nothing committed. Its own cluster with the default 45 s session
    timeout, so the members stay while the CLI runs."""
    cluster = make_cluster(nodes=1, controllers=1, coordinators=1)
    create_topic(cluster, "revoking", 2)
    b = ("-b", cluster.bootstrap)
    with ClusterClient(cluster.bootstrap, retry_s=20) as client:
        stub = coordinator_stub(cluster, client, "g-revoking")

        def beat(member: str, epoch: int, owned: list[int]) -> Any:
            req = coordinator_pb2.ConsumerGroupHeartbeatRequest(
                group_id="g-revoking",
                member_id=member,
                member_epoch=epoch,
                subscribed_topic_names=["revoking"],
            )
            if owned:
                req.owned_topic_partitions.add(topic="revoking", partitions=owned)
            resp = stub.ConsumerGroupHeartbeat(req, timeout=5)
            assert resp.error_code == E.NONE, resp.error_message
            return resp

        first = beat("first", 0, [])
        assert sorted(first.assignment.topic_partitions[0].partitions) == [0, 1]
        beat("second", 0, [])
        told = beat("first", first.member_epoch, [0, 1])  # told to give one up; keeps both
        (kept,) = told.assignment.topic_partitions[0].partitions
    revoking = 1 - kept
    got = json.loads(strom("groups", "describe", "g-revoking", "--json", *b).stdout)
    rows = {(o["partition"], o.get("member_id", ""), o["committed_offset"]) for o in got["offsets"]}
    assert rows == {(kept, "first", -1), (revoking, "first", -1)}
    (member,) = [m for m in got["members"] if m["member_id"] == "first"]
    pending = member["partitions_pending_revocation"]["topic_partitions"]
    assert [(tp["topic"], tp["partitions"]) for tp in pending] == [("revoking", [revoking])]
    text = strom("groups", "describe", "g-revoking", *b).stdout
    table = [line.split() for line in text.splitlines() if line.startswith("revoking ")]
    assert sorted(table) == [
        ["revoking", "0", "-", "0", "0", "first"],
        ["revoking", "1", "-", "0", "0", "first"],
    ]
    (line,) = [line for line in text.splitlines() if line.startswith("member first ")]
    assert line.endswith(f": revoking-{kept}, revoking-{revoking} (revoking)")


def test_the_groups_cli_lists_describes_resets_and_deletes(
    cluster: LocalCluster, client: ClusterClient
) -> None:
    create_topic(cluster, "cli", 2)
    for p in range(2):
        produce(client, "cli", p, 10)
    b = ("-b", cluster.bootstrap)
    dry = strom("groups", "reset-offsets", "g-cli", "--topic", "cli", "--to-latest", *b).stdout
    assert "dry run" in dry and dry.count(" 10") >= 2
    assert strom("groups", "describe", "g-cli", *b, check=False).returncode == 1  # not yet
    out = strom(
        "groups", "reset-offsets", "g-cli", "--topic", "cli", "--to-latest", "--execute", *b
    ).stdout
    assert "reset 2 offsets" in out
    strom(
        "groups", "reset-offsets", "g-cli", "--topic", "cli:0", "--shift-by", "-3", "--execute", *b
    )
    desc = strom("groups", "describe", "g-cli", *b).stdout
    rows = [line.split() for line in desc.splitlines() if line.startswith("cli ")]
    assert rows == [["cli", "0", "7", "10", "3", "-"], ["cli", "1", "10", "10", "0", "-"]]
    # --json prints every field, zeros included, and offsets as numbers (found from
    # outside: partition 0 had no "partition" key, lag 0 none at all, offsets were strings).
    got = json.loads(strom("groups", "describe", "g-cli", "--json", *b).stdout)
    offsets = sorted(got["offsets"], key=lambda o: o["partition"])
    assert [(o["partition"], o["committed_offset"], o["lag"]) for o in offsets] == [
        (0, 7, 3),
        (1, 10, 0),
    ]
    assert got["members"] == [] and isinstance(got["group_epoch"], int)
    assert "g-cli\tEmpty" in strom("groups", "list", *b).stdout
    # One spelling of the state everywhere (describe --json said "GROUP_STATE_EMPTY").
    listed = json.loads(strom("groups", "list", "--json", *b).stdout)
    assert {"group": "g-cli", "state": "Empty", "members": 0} in listed
    assert got["state"] == "Empty"
    # Kafka's --all-groups: every group, a JSON list; text: one block per group.
    every = json.loads(strom("groups", "describe", "--all-groups", "--json", *b).stdout)
    assert {g["group_id"]: g["state"] for g in every}["g-cli"] == "Empty"
    assert {g["group_id"] for g in every} == {g["group"] for g in listed}
    assert "group g-cli: Empty" in strom("groups", "describe", "--all-groups", *b).stdout
    both = strom("groups", "describe", "g-cli", "g-cli", "--json", *b).stdout
    assert [g["group_id"] for g in json.loads(both)] == ["g-cli"]  # named twice: once, a list
    usage = strom("groups", "describe", *b, check=False)
    assert usage.returncode == 2 and "--all-groups" in usage.stderr
    # A partition named twice is one row (it was printed twice).
    twice = strom("groups", "reset-offsets", "g-cli", "--topic", "cli:0,0", "--to-latest", *b)
    assert [line.split()[:2] for line in twice.stdout.splitlines()].count(["cli", "0"]) == 1
    # Bad input names the flag (found from outside: int() and fromisoformat() messages, and
    # an empty list after the colon meant every partition).
    for args, message in [
        (["--topic", "cli:x", "--to-latest"], "after the colon comes a list of partition"),
        (["--topic", "cli:", "--to-latest"], "after the colon comes a list of partition"),
        (["--topic", "cli:0,,1", "--to-latest"], "after the colon comes a list of partition"),
        (["--topic", "cli", "--to-datetime", "garbage"], "--to-datetime 'garbage' is not an"),
    ]:
        bad = strom("groups", "reset-offsets", "g-cli", *args, *b, check=False)
        assert bad.returncode != 0 and message in bad.stderr, bad.stderr
        assert "Traceback" not in bad.stderr

    member = Member(cluster, "g-cli", ["cli"])
    try:
        wait_for(lambda: len(member.owned) == 2, timeout=15, what="the member's assignment")
        busy = strom(
            "groups",
            "reset-offsets",
            "g-cli",
            "--topic",
            "cli",
            "--to-earliest",
            "--execute",
            *b,
            check=False,
        )
        assert busy.returncode == 1 and "active members" in busy.stderr
        # It resumed from the reset offsets: 7..9 of partition 0, nothing of partition 1.
        want = [b"cli-0-7", b"cli-0-8", b"cli-0-9"]
        wait_for(lambda: sorted(member.values) == want, timeout=10, what="the 3 records left")
    finally:
        member.close()
    assert "deleted group g-cli" in strom("groups", "delete", "g-cli", *b).stdout
    assert "g-cli" not in strom("groups", "list", *b).stdout
    # A failure goes to stderr (it was printed on stdout, among the deleted groups).
    gone = strom("groups", "delete", "g-cli", *b, check=False)
    assert gone.returncode == 1 and gone.stdout == ""
    assert gone.stderr.startswith("strom groups: error: group g-cli: ")


def test_a_committed_offset_past_the_log_end_shows_a_negative_lag(
    cluster: LocalCluster, client: ClusterClient
) -> None:
    """Found from outside: a committed offset past the log end (records deleted, a reset past
    the end, the topic created again) showed lag 0, like a caught-up group, though the
    group's next fetch there gets OFFSET_OUT_OF_RANGE and resets. Lag is log end minus
    committed, as Kafka's tool computes it, negative here, in the text, the JSON and the
    Admin's description, and named on stderr; the coordinator's gauge says how far past."""
    create_topic(cluster, "past", 2)
    for p in range(2):
        produce(client, "past", p, 10)
    t0, t1 = TopicPartition("past", 0), TopicPartition("past", 1)
    with Admin(cluster.bootstrap) as admin:
        admin.alter_group_offsets("g-past", {t0: 25, t1: 4})
        desc = admin.describe_groups(["g-past"], include_offsets=True)["g-past"]
    assert {(o.topic_partition, o.end_offset, o.lag) for o in desc.offsets} == {
        (t0, 10, -15),
        (t1, 10, 6),
    }
    b = ("-b", cluster.bootstrap)
    text = strom("groups", "describe", "g-past", *b)
    rows = sorted(line.split() for line in text.stdout.splitlines() if line.startswith("past "))
    assert rows == [["past", "0", "25", "10", "-15", "-"], ["past", "1", "4", "10", "6", "-"]]
    assert "g-past past-0: committed offset 25 is past the log end 10 (lag -15)" in text.stderr
    got = json.loads(strom("groups", "describe", "g-past", "--json", *b).stdout)
    assert sorted((o["partition"], o["lag"]) for o in got["offsets"]) == [(0, -15), (1, 6)]
    url = f"http://127.0.0.1:{cluster.coordinators[0].metrics_port}/metrics"
    past = 'strom_coordinator_consumer_offset_past_end{group="g-past",partition="0",topic="past"}'
    lag = 'strom_coordinator_consumer_lag{group="g-past",partition="0",topic="past"} 0.0'
    wait_for(
        lambda: (
            {f"{past} 15.0", lag}
            <= set(urllib.request.urlopen(url, timeout=5).read().decode().splitlines())
        ),
        timeout=10,
        what="the past-end gauge",
    )


def test_the_admin_lists_describes_alters_and_deletes_groups(
    cluster: LocalCluster, client: ClusterClient
) -> None:
    """Found from outside: the Admin had no group operations (Kafka's AdminClient has list,
    describe, list/alter/delete offsets and delete); only the CLI did them, by raw gRPC. A
    group made by altering its offsets, then joined by two members: describe shows them and
    what each owns, offset changes and deletion are refused while they are in, and work once
    they have left; lag is the end offsets minus list_group_offsets."""
    create_topic(cluster, "adm", 2)
    for p in range(2):
        produce(client, "adm", p, 10)
    t0, t1, other = TopicPartition("adm", 0), TopicPartition("adm", 1), TopicPartition("x", 0)
    with Admin(cluster.bootstrap) as admin:
        admin.alter_group_offsets("g-adm", {t0: 3, t1: OffsetAndMetadata(5, "note")})
        committed = admin.list_group_offsets("g-adm")
        assert committed == {t0: OffsetAndMetadata(3), t1: OffsetAndMetadata(5, "note")}
        assert admin.list_group_offsets("g-adm", [t1, other]) == {
            t1: OffsetAndMetadata(5, "note"),
            other: None,  # asked for, nothing committed
        }
        ends = admin.list_offsets({tp: "latest" for tp in committed})
        lag = {tp: ends[tp].offset - om.offset for tp, om in committed.items() if om and ends[tp]}
        assert lag == {t0: 7, t1: 5}
        (listed,) = [g for g in admin.list_groups() if g.group_id == "g-adm"]
        assert (listed.state, listed.member_count) == (GroupState.EMPTY, 0)
        assert "g-adm" in {g.group_id for g in admin.list_groups(["Empty"])}
        assert "g-adm" not in {g.group_id for g in admin.list_groups([GroupState.STABLE])}

        members = [Member(cluster, "g-adm", ["adm"]) for _ in range(2)]
        try:
            wait_for(lambda: balanced(members, 2), timeout=20, what="both members' partitions")

            def stable() -> GroupDescription | None:
                d = admin.describe_groups(["g-adm"], include_offsets=True)["g-adm"]
                return d if d.state == GroupState.STABLE and len(d.members) == 2 else None

            want = sorted(
                [f"adm-0-{i}".encode() for i in range(3, 10)]
                + [f"adm-1-{i}".encode() for i in range(5, 10)]
            )
            # They start from the altered offsets.
            wait_for(
                lambda: sorted(v for m in members for v in m.values) == want,
                timeout=20,
                what="the records after the altered offsets",
            )
            desc = wait_for(stable, timeout=20, what="a stable group of two")
            assert desc.group_id == "g-adm" and desc.assignor and not desc.is_empty
            owners = {m.consumer._group.member_id: m.owned for m in members}  # type: ignore[union-attr]
            assert {d.member_id: set(d.assignment) for d in desc.members} == owners
            for d in desc.members:
                assert d.subscribed_topics == ("adm",) and d.member_epoch > 0
            by_tp = {o.topic_partition: o for o in desc.offsets}
            assert {tp: by_tp[tp].member_id in owners for tp in (t0, t1)} == {t0: True, t1: True}
            assert all(by_tp[tp].end_offset == 10 for tp in (t0, t1))

            # Refused while the members are in, naming the group; nothing changes.
            with pytest.raises(NonEmptyGroupError, match="'g-adm' has active members"):
                admin.alter_group_offsets("g-adm", {t0: 0})
            with pytest.raises(NonEmptyGroupError, match="g-adm"):
                admin.delete_groups(["g-adm"])
            with pytest.raises(GroupSubscribedToTopicError, match=r"'g-adm'.*adm-0|adm-0.*g-adm"):
                admin.delete_group_offsets("g-adm", [t0])
        finally:
            for m in members:
                m.close()
        # Left (closing commits what they read): the group is empty, its offsets theirs.
        wait_for(
            lambda: admin.describe_groups(["g-adm"])["g-adm"].is_empty,
            timeout=20,
            what="the members gone",
        )
        assert {tp: om.offset for tp, om in admin.list_group_offsets("g-adm").items() if om} == {
            t0: 10,
            t1: 10,
        }
        admin.alter_group_offsets("g-adm", {t0: 2})
        assert admin.list_group_offsets("g-adm", [t0]) == {t0: OffsetAndMetadata(2)}
        admin.delete_group_offsets("g-adm", [t0])
        assert admin.list_group_offsets("g-adm").keys() == {t1}

        # Several groups: the first failure, named, with the others listed; the rest done.
        admin.alter_group_offsets("g-adm-2", {t0: 1})
        with pytest.raises(GroupIdNotFoundError, match=r"'g-nope'.*also failed: g-nope-2"):
            admin.describe_groups(["g-nope", "g-adm", "g-nope-2"])
        with pytest.raises(GroupIdNotFoundError, match="g-nope"):
            admin.delete_groups(["g-adm", "g-nope", "g-adm-2"])
        listed_ids = {g.group_id for g in admin.list_groups()}
        assert "g-adm" not in listed_ids and "g-adm-2" not in listed_ids
        with pytest.raises(GroupIdNotFoundError, match="g-adm"):
            admin.describe_groups(["g-adm"])
        assert admin.list_group_offsets("g-adm") == {}  # an unknown group has none

        # Bad input: a clear error naming what was wrong, before anything is sent.
        for call, error, message in [
            (lambda: admin.describe_groups("g-adm"), InvalidRequestError, "list of group ids"),
            (lambda: admin.list_group_offsets(""), InvalidGroupIdError, "non-empty string"),
            (lambda: admin.alter_group_offsets("g", {t0: -1}), InvalidRequestError, "adm-0"),
            (lambda: admin.alter_group_offsets("g", {("adm", -1): 0}), InvalidRequestError, "-1"),
            (lambda: admin.list_groups(["bogus"]), InvalidRequestError, "unknown group state"),
        ]:
            with pytest.raises(error, match=message):
                call()


def test_the_aio_admin_has_the_group_operations(
    cluster: LocalCluster, client: ClusterClient
) -> None:
    """strom.aio.Admin wraps the sync one: the group calls are coroutines there too."""
    import asyncio

    from strom import aio

    async def run() -> tuple[list[str], dict[TopicPartition, OffsetAndMetadata | None]]:
        async with aio.Admin(cluster.bootstrap) as admin:
            await admin.alter_group_offsets("g-aio-adm", {TopicPartition("adm-aio", 0): 4})
            listed = [g.group_id for g in await admin.list_groups()]
            offsets = await admin.list_group_offsets("g-aio-adm")
            await admin.delete_groups(["g-aio-adm"])
            return listed, offsets

    create_topic(cluster, "adm-aio", 1)
    produce(client, "adm-aio", 0, 5)
    listed, offsets = asyncio.run(run())
    assert "g-aio-adm" in listed
    assert offsets == {TopicPartition("adm-aio", 0): OffsetAndMetadata(4)}


def test_a_member_out_of_the_group_cannot_commit_as_an_anonymous_consumer(
    cluster: LocalCluster, client: ClusterClient
) -> None:
    """Found from outside: a member that left after max_poll_interval_ms (or was fenced)
    committed with epoch -1 and no member id, which a group without members takes from
    anyone: its stale offsets rewound the group after its successor had left, and its
    group_metadata() let a zombie's transactional offsets in. It now carries its last
    identity, which the coordinator refuses (Kafka's CommitFailedException)."""
    create_topic(cluster, "expelled", 1)
    tp = TopicPartition("expelled", 0)
    stalled = GroupConsumer(
        cluster.bootstrap,
        group_id="g-expelled",
        auto_offset_reset="earliest",
        max_poll_interval_ms=1000,
    )
    stalled.subscribe(["expelled"])
    reader: Member | None = None
    try:

        def joined() -> bool:
            stalled.poll(50)
            return len(stalled.assignment()) == 1

        wait_for(joined, timeout=15, what="join")
        member = stalled.group_metadata()
        assert member.member_id and member.member_epoch > 0
        reader = Member(cluster, "g-expelled", ["expelled"])
        wait_for(lambda: len(reader.owned) == 1, timeout=15, what="the stalled member's share")
        reader.close()
        reader = None
        # The group has no members now; its offset is 7, committed by its last reader.
        with GroupConsumer(cluster.bootstrap, group_id="g-expelled") as simple:
            simple.commit({tp: OffsetAndMetadata(7)})
        out = stalled.group_metadata()
        assert out.member_id == member.member_id and out.member_epoch >= member.member_epoch
        with pytest.raises(StromError):
            stalled.commit({tp: OffsetAndMetadata(0)})
        with GroupConsumer(cluster.bootstrap, group_id="g-expelled") as check:
            got = check.committed([tp])[tp]
            assert got is not None and got.offset == 7
    finally:
        if reader is not None:
            reader.close()
        stalled.close()


def test_a_commit_after_max_poll_interval_raises_commit_failed_error(
    cluster: LocalCluster,
) -> None:
    """Found from outside: a commit after max_poll_interval_ms expelled the member raised
    UnknownMemberIdError only, and code ported from Kafka catches CommitFailedException
    (kafka-python's CommitFailedError). It is now a strom.CommitFailedError as well, sync
    or async, and still the coordinator's own class."""
    create_topic(cluster, "commit-failed", 1)
    tp = TopicPartition("commit-failed", 0)
    stalled = GroupConsumer(
        cluster.bootstrap,
        group_id="g-commit-failed",
        auto_offset_reset="earliest",
        max_poll_interval_ms=1000,
    )
    stalled.subscribe(["commit-failed"])
    try:

        def joined() -> bool:
            stalled.poll(50)
            return len(stalled.assignment()) == 1

        wait_for(joined, timeout=15, what="join")
        with Admin(cluster.bootstrap) as admin:
            # The application stops polling: past max_poll_interval_ms the member leaves.
            wait_for(
                lambda: not admin.describe_groups(["g-commit-failed"])["g-commit-failed"].members,
                timeout=30,
                what="the stalled member out of the group",
            )
        with pytest.raises(CommitFailedError) as caught:
            stalled.commit({tp: OffsetAndMetadata(3)})
        assert isinstance(caught.value, UnknownMemberIdError | FencedMemberEpochError)
        assert type(caught.value).__name__ in {"UnknownMemberIdError", "FencedMemberEpochError"}
        got: Future[BaseException | None] = Future()
        stalled.commit_async({tp: OffsetAndMetadata(3)}, lambda _, exc: got.set_result(exc))
        assert isinstance(got.result(30), CommitFailedError)
    finally:
        stalled.close()


def test_a_member_that_stops_polling_leaves_and_rejoins_on_its_next_poll(
    cluster: LocalCluster, client: ClusterClient
) -> None:
    """Found from outside: heartbeats run on their own thread, so an application that stopped
    calling poll() kept its partitions for good. Past max_poll_interval_ms the member leaves
    (its partitions move to the members that read) and its next poll rejoins (Kafka)."""
    create_topic(cluster, "stalled", 2)
    lost: list[list[TopicPartition]] = []

    class Listener:
        def on_partitions_lost(self, parts: list[TopicPartition]) -> None:
            lost.append(parts)

    stalled = GroupConsumer(
        cluster.bootstrap,
        group_id="g-stalled",
        auto_offset_reset="earliest",
        max_poll_interval_ms=1000,
    )
    stalled.subscribe(["stalled"], listener=Listener())

    def polled_until(cond: Callable[[], bool]) -> Callable[[], bool]:
        def check() -> bool:
            stalled.poll(50)
            return cond()

        return check

    reader: Member | None = None
    try:
        wait_for(polled_until(lambda: len(stalled.assignment()) == 2), timeout=15, what="join")
        reader = Member(cluster, "g-stalled", ["stalled"])
        wait_for(
            polled_until(lambda: len(stalled.assignment()) == 1 and len(reader.owned) == 1),
            timeout=15,
            what="the partitions split between the two",
        )
        # The application stops polling: the reader gets both partitions.
        wait_for(lambda: len(reader.owned) == 2, timeout=15, what="the stalled member's share")
        # Its next poll reports its partition lost and rejoins: the two split them again.
        wait_for(
            polled_until(lambda: len(stalled.assignment()) == 1 and len(reader.owned) == 1),
            timeout=15,
            what="the stalled member back in the group",
        )
        assert len(lost) == 1 and len(lost[0]) == 1
    finally:
        if reader is not None:
            reader.close()
        stalled.close()


def test_a_topic_deleted_and_created_again_does_not_inherit_the_groups_offsets(
    cluster: LocalCluster, client: ClusterClient
) -> None:
    """Found from outside: the committed offsets outlived `strom topics delete`, so a group
    resumed a new topic of the same name at the old offset (50 of 80 records skipped) and
    describe listed the deleted topic for good. Kafka drops a deleted topic's offsets."""
    create_topic(cluster, "recreated", 1)
    produce(client, "recreated", 0, 50)
    b = ("-b", cluster.bootstrap)
    strom("groups", "reset-offsets", "g-recreated", "--topic", "recreated", "--to-latest",
          "--execute", *b)  # fmt: skip

    def offsets() -> list[tuple[str, int]]:
        got = json.loads(strom("groups", "describe", "g-recreated", "--json", *b).stdout)
        return [(o["topic"], o["committed_offset"]) for o in got["offsets"]]

    assert offsets() == [("recreated", 50)]
    with Admin(cluster.bootstrap) as admin:
        admin.delete_topic("recreated")
    wait_for(lambda: offsets() == [], timeout=15, what="the deleted topic's offsets dropped")

    def created() -> bool:
        try:
            create_topic(cluster, "recreated", 1)
        except TopicDeletionInProgressError:
            return False
        return True

    wait_for(created, timeout=30, what="the topic created again")
    produce(client, "recreated", 0, 80)
    member = Member(cluster, "g-recreated", ["recreated"])
    try:
        wait_for(lambda: len(member.values) >= 80, timeout=20, what="all 80 records")
        assert member.values[0] == b"recreated-0-0"
    finally:
        member.close()


def test_committed_offsets_survive_a_coordinator_sigkill(
    cluster: LocalCluster, client: ClusterClient
) -> None:
    create_topic(cluster, "durable", 2)
    # No auto-commit: only the commits below may change the group's offsets.
    member = Member(cluster, "g-durable", ["durable"], enable_auto_commit=False)
    tp0, tp1 = TopicPartition("durable", 0), TopicPartition("durable", 1)
    try:
        wait_for(lambda: member.owned == {tp0, tp1}, timeout=15, what="the member's assignment")
        member.call(
            lambda c: c.commit({tp0: OffsetAndMetadata(5, "five"), tp1: OffsetAndMetadata(7)})
        )
        assert member.consumer.committed(tp0) == OffsetAndMetadata(5, "five")
        before = cluster.wait_coordinators_ready()

        coord = cluster.coordinators[0]
        assert coord.process is not None
        coord.process.kill()
        # Its shards' keys outlive it until its lease expires: `groups list` cannot reach
        # them, says so on stderr and exits 2, and --json stays valid JSON (found from
        # outside: the warning followed the JSON array on stdout, exit status 0).
        down = strom("groups", "list", "--json", "-b", cluster.bootstrap, check=False)
        assert down.returncode == 2, down.stderr
        assert "incomplete" in down.stderr and "incomplete" not in down.stdout
        assert isinstance(json.loads(down.stdout), list)
        coord.start()
        cluster.wait_serving(coord)

        def refenced() -> bool:
            # The dead process's keys live until its lease expires; then the new one takes
            # every shard over, replays it and publishes a bumped producer epoch.
            now = cluster.coordinator_shards() or {}
            return bool(now) and all(now[s][1] > before[s][1] for s in before)

        wait_for(refenced, timeout=30, what="every shard taken over with a bumped epoch")
        cluster.wait_coordinators_ready()

        # The member kept heartbeating through the takeover: same partitions, and its epoch
        # (replayed from the log) still lets it commit.
        def commits() -> bool:
            member.call(lambda c: c.commit({tp0: OffsetAndMetadata(6, "six")}))
            return True

        wait_for(commits, timeout=15, what="a commit through the new coordinator")
        assert member.owned == {tp0, tp1}
    finally:
        member._stop.set()
        member._thread.join(10)
        member.consumer.close(autocommit=False)

    again = GroupConsumer(cluster.bootstrap, group_id="g-durable")
    try:
        got = again.committed([tp0, tp1])
        assert got == {tp0: OffsetAndMetadata(6, "six"), tp1: OffsetAndMetadata(7)}
    finally:
        again.close()


def test_a_stopping_coordinator_hands_its_shards_over(
    cluster: LocalCluster, client: ClusterClient
) -> None:
    """SIGTERM revokes the shard lease: a second coordinator takes every shard over and the
    groups' offsets are still there (runs after the SIGKILL test, which left g-durable)."""
    second = cluster.add_coordinator()
    first = cluster.coordinators[0]
    assert first.process is not None
    first.process.stop()

    def moved() -> bool:
        shards = cluster.coordinator_shards() or {}
        return bool(shards) and all(
            addr == second.address and epoch >= 0 for addr, epoch in shards.values()
        )

    wait_for(moved, timeout=15, what="every shard owned by the second coordinator")
    again = GroupConsumer(cluster.bootstrap, group_id="g-durable")
    try:
        tp0 = TopicPartition("durable", 0)
        assert again.committed(tp0) == OffsetAndMetadata(6, "six")
    finally:
        again.close()


def test_commits_made_while_iterating_cover_only_the_records_handed_out(
    cluster: LocalCluster, client: ClusterClient
) -> None:
    """``for r in consumer: process(r); consumer.commit()`` commits through ``r``, not through
    the rest of the poll behind it (found from outside: the commit covered the whole poll, so
    a crash after the first record lost up to max_poll_records of them); a close after some
    ``next(consumer)`` auto-commits what they returned. kafka-python's iterator does so."""
    create_topic(cluster, "iter-commit", 1)
    produce(client, "iter-commit", 0, 50)
    tp = TopicPartition("iter-commit", 0)
    kw = {"auto_offset_reset": "earliest"}
    with Consumer(cluster.bootstrap, group_id="iter-c", enable_auto_commit=False, **kw) as c:
        c.subscribe(["iter-commit"])
        for n, rec in enumerate(c, 1):
            c.commit()
            assert c.committed(tp).offset == rec.offset + 1
            if n == 3:
                break
        # The loop left early: the next one starts after what it handed out.
        assert next(iter(c)).offset == 3
    with Consumer(cluster.bootstrap, group_id="iter-n", **kw) as c:  # auto-commit on close
        c.subscribe(["iter-commit"])
        assert [next(c).offset for _ in range(5)] == [0, 1, 2, 3, 4]
    with Consumer(cluster.bootstrap, group_id="iter-n", enable_auto_commit=False) as c:
        assert c.committed(tp).offset == 5
