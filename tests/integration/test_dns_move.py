"""A storage node restarted under the same DNS name at a new IP (what a Kubernetes StatefulSet
pod does: it keeps its stable name, not its IP) is reached by a peer's cached channel within
about a second of serving again.

Found from outside: the services' cached channels (strom.security.channel.ChannelCache: a node
forwarding ProduceRecords to a partition's leader, the coordinator's appends, a node's calls to
the controller) kept dialling the old IP for ~30 s: gRPC looks a name up again when a
connection breaks, but that look-up (the peer just died) still finds the old IP, and the next
one waits out ``grpc.dns_min_time_between_resolutions_ms``, 30 s by default. A forwarded call
hung 26.5 s behind a leader back in ~4 s. strom's channels now look names up again at most a
second apart (strom.grpc_options.DNS_OPTIONS).

The name lives in /etc/hosts (a line of this test's own, removed in a ``finally``) and points
first to 127.0.0.2, then to 127.0.0.3: Linux's loopback answers on all of 127/8 without setup.
"""

from __future__ import annotations

import contextlib
import fcntl
import os
import tempfile
import time
import uuid
from collections.abc import Callable, Iterator
from pathlib import Path

import grpc
import pytest

from strom.api import records_pb2, records_pb2_grpc
from strom.client.admin import Admin
from strom.client.types import OffsetAndMetadata, TopicPartition
from strom.coordinator.offsets_log import CONSUMER_OFFSETS_TOPIC, shard_for_group
from strom.devcluster.cluster import LocalCluster, Member, grpc_serving
from strom.devcluster.procs import ManagedProcess, free_port, wait_for
from strom.errors import ErrorCode, StromError
from tests.conftest import create_topic

pytestmark = pytest.mark.integration
rp = records_pb2

HOSTS = Path("/etc/hosts")
#: Serialises this module's edits of /etc/hosts between test workers (each edits only its own
#: line, but a read-modify-write racing another would drop the other's line).
HOSTS_LOCK = Path(tempfile.gettempdir()) / "strom-tests-etc-hosts.lock"
#: How soon after the moved node serves again a call forwarded to it by another node must go
#: through. New: about a second (the channel's next look-up); old: 17-29 s (gRPC's 30 s
#: between look-ups, counted from the look-up made when the node died or the channel's first).
BOUND_S = 12.0


def _hosts_writable() -> bool:
    return os.access(HOSTS, os.W_OK)


class HostsEntry:
    """This test's own line ``<ip> <name>`` of /etc/hosts, rewritten whole each time (a
    resolver reading the file meanwhile sees the old or the new file, never half of one);
    other lines are left as they are."""

    def __init__(self, name: str) -> None:
        self.name = name

    def point(self, ip: str | None) -> None:
        """``name`` resolves to ``ip`` from now on (None: the line is removed)."""
        with open(HOSTS_LOCK, "a") as lock:
            fcntl.flock(lock, fcntl.LOCK_EX)
            text = HOSTS.read_text()
            lines = [line for line in text.splitlines() if line.split()[1:] != [self.name]]
            if ip is not None:
                lines.append(f"{ip} {self.name}")
            self._write("".join(f"{line}\n" for line in lines))

    def _write(self, text: str) -> None:
        """Replace the file atomically (a temporary file renamed over it); where /etc/hosts is
        a bind mount (a container's), which a rename cannot replace, rewrite it in place."""
        tmp = HOSTS.with_name(f".hosts.{self.name}")
        try:
            tmp.write_text(text)
            os.chmod(tmp, HOSTS.stat().st_mode & 0o7777)
            os.replace(tmp, HOSTS)
        except OSError:
            tmp.unlink(missing_ok=True)
            with open(HOSTS, "r+") as f:
                f.write(text)
                f.truncate()


@contextlib.contextmanager
def hosts_entry(name: str) -> Iterator[HostsEntry]:
    entry = HostsEntry(name)
    try:
        yield entry
    finally:
        entry.point(None)


class Moving:
    """A strom process of ``cluster`` listening on ``<ip>:<port>`` (the ip given at each
    start) and advertising ``<name>:<port>``: storage node 2 (one data dir across its
    starts) or, with ``kind="controller"``, controller 9."""

    def __init__(
        self, cluster: LocalCluster, name: str, tmp_path: Path, kind: str = "storage-node"
    ) -> None:
        self.cluster, self.name, self.kind = cluster, name, kind
        self.port = free_port()
        if kind == "storage-node":
            self.ident = 2
            self.args = ["--node-id", "2", "--data-dir", str(tmp_path / "node-2")]
        else:
            self.ident = 9
            self.args = ["--controller-id", "9", *cluster.controller_args]
        self.process: ManagedProcess | None = None

    def start(self, ip: str) -> None:
        argv = [
            *(self.cluster.python, "-m", "strom.cli.main", self.kind, *self.args),
            *("--listen", f"{ip}:{self.port}", "--advertise", f"{self.name}:{self.port}"),
            *("--metrics-port", "-1", "--etcd", self.cluster.etcd.endpoint),
            *("--cluster", self.cluster.cluster_name),
        ]
        what = f"{self.kind} {self.ident}"
        log = self.cluster.root / f"{self.kind}-{self.ident}.log"
        self.process = ManagedProcess(what, argv, log).start()
        process = self.process

        def serving() -> bool:
            if not process.alive():
                raise process.exited(what)
            return grpc_serving(f"{ip}:{self.port}")

        wait_for(serving, timeout=60, what=f"{what} serving on {ip}:{self.port}")

    def kill(self) -> None:
        if self.process is not None:
            self.process.kill()


# skip is justified: the test must point a name of its own at loopback addresses, and only
# /etc/hosts does that without a DNS server; a non-root run (a developer's machine) cannot
# write it. CI and the project's machines run the tests as root.
@pytest.mark.skipif(not _hosts_writable(), reason="/etc/hosts is not writable (not root)")
def test_a_node_restarted_at_a_new_ip_under_its_name_is_reached_within_seconds(
    make_cluster: Callable[..., LocalCluster], tmp_path: Path
) -> None:
    """Node 1 forwards ProduceRecords calls for a partition that node 2 leads (through its
    cached channel to node 2's advertised name). Node 2 is killed, its name moved from
    127.0.0.2 to 127.0.0.3 and node 2 started there (same id, same data): node 1's forwarded
    calls go through within BOUND_S of node 2 serving (measured: 0.3 s; old code: 26.3 s)."""
    cluster = make_cluster(nodes=1, controllers=1, coordinators=0)
    name = f"strom-dns-{uuid.uuid4().hex[:12]}"
    node2 = Moving(cluster, name, tmp_path)
    topic = "dns-move"
    with hosts_entry(name) as hosts, grpc.insecure_channel(cluster.nodes[0].address) as ch:
        stub = records_pb2_grpc.RecordServiceStub(ch)

        def produce(value: bytes) -> int:
            """One call through node 1 (which forwards it to node 2): its error code."""
            req = rp.ProduceRecordsRequest(
                topic=topic,
                partition=0,
                acks=rp.ACKS_ALL,
                timeout_ms=2000,
                records=rp.RecordColumns(values=[value]),
            )
            resp = stub.ProduceRecords(req, timeout=10)
            codes = {resp.error_code, *(r.error_code for r in resp.results)}
            return max(codes)

        try:
            hosts.point("127.0.0.2")
            node2.start("127.0.0.2")
            with Admin(cluster.bootstrap) as admin:
                wait_for(
                    lambda: {n.node_id for n in admin.describe_cluster().nodes} == {1, 2},
                    timeout=30,
                    what="node 2 registered",
                )
                admin.create_topic(topic, replica_assignment=[[2]])
            wait_for(
                lambda: produce(b"before") == ErrorCode.NONE,
                timeout=60,
                what="a call forwarded to node 2 at 127.0.0.2",
            )
            node2.kill()
            # Node 1's channel lost its connection and looked the name up again, still
            # finding the old IP (as a Kubernetes DNS answers until the old pod is gone): a
            # call through node 1 now fails.
            wait_for(
                lambda: produce(b"down") != ErrorCode.NONE,
                timeout=30,
                what="a call through node 1 failing while node 2 is down",
            )
            hosts.point("127.0.0.3")
            node2.start("127.0.0.3")
            serving = time.monotonic()
            wait_for(
                lambda: produce(b"after") == ErrorCode.NONE,
                timeout=60,
                what="a call forwarded to node 2 at its new IP",
            )
            took = time.monotonic() - serving
            print(f"node 1 reached node 2 at its new IP {took:.2f} s after it served")
            assert took < BOUND_S, f"node 1 reached node 2 {took:.1f} s after it served"
        finally:
            node2.kill()


# skip is justified: as above (/etc/hosts is writable by root only).
@pytest.mark.skipif(not _hosts_writable(), reason="/etc/hosts is not writable (not root)")
def test_the_coordinator_reaches_a_shard_leader_restarted_at_a_new_ip_within_seconds(
    make_cluster: Callable[..., LocalCluster], tmp_path: Path
) -> None:
    """The group coordinator commits a group's offsets to its shard, a partition of
    __consumer_offsets that node 2 leads (through the coordinator's cached channel to node 2's
    name). Node 2 moves from 127.0.0.2 to 127.0.0.3: commits go through within BOUND_S of
    node 2 serving (the coordinator loads the shard again from it first). Measured: 1.0 s;
    old code: 23.8 s."""
    shards = 4
    cluster = make_cluster(
        nodes=1,
        controllers=1,
        coordinators=0,
        coordinator_args=[
            *("--offsets-partitions", str(shards), "--transaction-state-partitions", "1"),
        ],
    )
    name = f"strom-dns-{uuid.uuid4().hex[:12]}"
    node2 = Moving(cluster, name, tmp_path)
    topic = "dns-move-committed"
    tp = TopicPartition(topic, 0)
    with (
        hosts_entry(name) as hosts,
        Admin(cluster.bootstrap, request_timeout_ms=3000, default_api_timeout_ms=3000) as admin,
    ):
        try:
            hosts.point("127.0.0.2")
            node2.start("127.0.0.2")
            wait_for(
                lambda: {n.node_id for n in admin.describe_cluster().nodes} == {1, 2},
                timeout=30,
                what="node 2 registered",
            )
            admin.create_topic(topic, replica_assignment=[[1]])
            # Started with both nodes live, the coordinator spreads its shards over both
            # (replication factor 1: a shard led by node 2 has nowhere else to go).
            cluster.add_coordinator()

            def on_node2() -> list[int]:
                parts = admin.describe_topic(CONSUMER_OFFSETS_TOPIC).partitions
                if len(parts) != shards or any(p.leader < 0 for p in parts):
                    return []
                return [p.partition for p in parts if p.leader == 2]

            shard = wait_for(on_node2, timeout=60, what="a shard led by node 2")[0]
            group = next(
                g
                for g in (f"dns-move-{i}" for i in range(1000))
                if shard_for_group(g, shards) == shard
            )

            def committed(offset: int) -> bool:
                admin.alter_group_offsets(group, {tp: OffsetAndMetadata(offset)})
                return True

            def refused(offset: int) -> bool:
                try:
                    admin.alter_group_offsets(group, {tp: OffsetAndMetadata(offset)})
                except StromError:  # (the node's absence, as the coordinator says it)
                    return True
                return False

            wait_for(lambda: committed(1), timeout=60, what="a commit to node 2 at 127.0.0.2")
            node2.kill()
            wait_for(lambda: refused(2), timeout=30, what="a commit failing while node 2 is down")
            hosts.point("127.0.0.3")
            node2.start("127.0.0.3")
            serving = time.monotonic()
            wait_for(lambda: committed(3), timeout=60, what="a commit to node 2 at its new IP")
            took = time.monotonic() - serving
            print(f"the coordinator committed to node 2 at its new IP {took:.2f} s after it served")
            assert took < BOUND_S, f"the coordinator reached node 2 {took:.1f} s after it served"
        finally:
            node2.kill()


def _isrs_whole(admin: Admin, topic: str) -> bool:
    return all(len(p.isr) == 2 for p in admin.describe_topic(topic).partitions)


def _restart(cluster: LocalCluster, node: Member, admin: Admin, topic: str) -> float:
    """Kill ``node``, wait until it is out of every ISR of ``topic`` (so that its return is an
    ISR change the leaders must ask the controller for) and start it again on its address;
    when it served again."""
    assert node.process is not None
    node.process.kill()
    wait_for(
        lambda: all(node.ident not in p.isr for p in admin.describe_topic(topic).partitions),
        timeout=60,
        what=f"node {node.ident} out of every ISR",
    )
    node.start()
    cluster.wait_serving(node, timeout=60)
    return time.monotonic()


# skip is justified: as above (/etc/hosts is writable by root only).
@pytest.mark.skipif(not _hosts_writable(), reason="/etc/hosts is not writable (not root)")
def test_nodes_reach_the_controller_restarted_at_a_new_ip_within_seconds(
    make_cluster: Callable[..., LocalCluster], tmp_path: Path
) -> None:
    """The leaders' ISR changes (AlterPartition, through each node's cached channel to the
    active controller's name) reach a controller restarted at a new IP under its name: a
    follower restarted after the move is back in every ISR within BOUND_S of serving.
    Measured: 0.06 s; old code: 25.2 s (found from outside: 24 s)."""
    cluster = make_cluster(nodes=2, controllers=1, coordinators=0)
    name = f"strom-dns-{uuid.uuid4().hex[:12]}"
    controller = Moving(cluster, name, tmp_path, kind="controller")
    topic = create_topic(cluster, "dns-move-isr", partitions=4, replication_factor=2)
    follower = cluster.node(2)
    with hosts_entry(name) as hosts, Admin(cluster.bootstrap) as admin:

        def active(host: str) -> bool:
            c = admin.describe_cluster().controller
            return c is not None and (c.host, c.port) == (host, controller.port)

        try:
            hosts.point("127.0.0.2")
            controller.start("127.0.0.2")
            first = cluster.controllers[0]
            assert first.process is not None
            first.process.stop()  # controller 9 takes over
            wait_for(lambda: active(name), timeout=60, what="controller 9 active")
            # The nodes' channels to controller 9 (at 127.0.0.2) carry an ISR change each way.
            _restart(cluster, follower, admin, topic)
            wait_for(lambda: _isrs_whole(admin, topic), timeout=60, what="ISRs whole")
            controller.kill()
            hosts.point("127.0.0.3")
            controller.start("127.0.0.3")
            wait_for(lambda: active(name), timeout=60, what="controller 9 active again")
            serving = _restart(cluster, follower, admin, topic)
            wait_for(lambda: _isrs_whole(admin, topic), timeout=60, what="ISRs whole again")
            took = time.monotonic() - serving
            print(f"ISRs whole {took:.2f} s after the follower served (controller moved)")
            assert took < BOUND_S, f"ISRs whole {took:.1f} s after the follower served"
        finally:
            controller.kill()
