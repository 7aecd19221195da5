"""The etcd key layout of DESIGN §3, in one place, so no service spells a key by hand."""

from __future__ import annotations

from dataclasses import dataclass
from urllib.parse import quote


@dataclass(frozen=True)
class Keys:
    """Keys of one cluster: everything lives under ``/strom/<cluster>/``."""

    cluster_name: str

    @property
    def root(self) -> str:
        return f"/strom/{self.cluster_name}/"

    @property
    def cluster(self) -> str:
        return self.root + "cluster"

    @property
    def controller(self) -> str:
        return self.root + "controller"

    @property
    def producer_ids(self) -> str:
        return self.root + "producer_ids"

    @property
    def node_configs(self) -> str:
        """Dynamic configs every storage node applies (the replication throttle rates)."""
        return self.root + "node_configs"

    @property
    def nodes_prefix(self) -> str:
        return self.root + "nodes/"

    def node(self, node_id: int) -> str:
        return f"{self.nodes_prefix}{node_id}"

    @property
    def topics_prefix(self) -> str:
        return self.root + "topics/"

    def topic(self, name: str) -> str:
        return self.topics_prefix + name

    @property
    def partitions_prefix(self) -> str:
        return self.root + "partitions/"

    def partitions_of(self, topic: str) -> str:
        return f"{self.partitions_prefix}{topic}/"

    def partition(self, topic: str, partition: int) -> str:
        return f"{self.partitions_prefix}{topic}/{partition}"

    @property
    def coordinators_prefix(self) -> str:
        return self.root + "coordinators/"

    def coordinator(self, shard: int) -> str:
        return f"{self.coordinators_prefix}{shard}"

    @property
    def acls_prefix(self) -> str:
        return self.root + "acls/"

    def acl(self, acl_id: str) -> str:
        """One ACL binding (its id: a hash of the binding)."""
        return f"{self.acls_prefix}{acl_id}"

    @property
    def quotas_prefix(self) -> str:
        return self.root + "quotas/"

    def quota(self, principal: str) -> str:
        """A principal's client quota (the principal URL-quoted: it may hold '/')."""
        return f"{self.quotas_prefix}{quote(principal, safe='')}"

    @property
    def coordinator_members_prefix(self) -> str:
        """Live coordinator processes, one lease-bound key per incarnation (shards are
        spread over them: a coordinator owning no shard is still counted)."""
        return self.root + "coordinator_members/"

    def coordinator_member(self, incarnation_id: str) -> str:
        return f"{self.coordinator_members_prefix}{incarnation_id}"

    @property
    def txn_coordinators_prefix(self) -> str:
        return self.root + "txn_coordinators/"

    def txn_coordinator(self, shard: int) -> str:
        """Owner of shard ``shard`` of ``__transaction_state`` (lease-bound)."""
        return f"{self.txn_coordinators_prefix}{shard}"

    def parse_partition(self, key: str) -> tuple[str, int] | None:
        """``.../partitions/<topic>/<p>`` → (topic, p); topic names cannot hold '/'."""
        if not key.startswith(self.partitions_prefix):
            return None
        rest = key[len(self.partitions_prefix) :]
        topic, _, p = rest.rpartition("/")
        if not topic or not p.isdigit():
            return None
        return topic, int(p)
