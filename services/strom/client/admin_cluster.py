"""The Admin client's calls on the cluster as a whole: the configs every node shares and the
cluster's description (nodes, controller, coordinators), mixed into
:class:`strom.client.admin.Admin` as :class:`ClusterAdmin`.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping

from strom.api import controller_pb2, metadata_pb2
from strom.client.admin_calls import AdminCalls
from strom.client.admin_requests import NONE, config_entries, config_strings, node_of
from strom.client.admin_types import (
    ClusterDescription,
    ConfigEntry,
    ConfigValue,
    Node,
    NodeInfo,
    NodeState,
)
from strom.client.kwnames import bool_option
from strom.errors import InvalidConfigError, error_for

_NODE_STATES = {
    metadata_pb2.NODE_STATE_RUNNING: NodeState.RUNNING,
    metadata_pb2.NODE_STATE_SHUTTING_DOWN: NodeState.SHUTTING_DOWN,
}


class ClusterAdmin(AdminCalls):
    """The cluster-wide node configs and the cluster's description (nodes, controller)."""

    def describe_node_configs(self, *, documentation: bool = False) -> dict[str, ConfigEntry]:
        """The cluster's dynamic configs (Kafka's default broker configs): the replication
        throttle rates every storage node applies, ``leader.replication.throttled.rate`` and
        ``follower.replication.throttled.rate`` (bytes/s; ``value`` None when unset: no
        limit), and the run-time log levels every service follows, ``log.level`` (None:
        each process's start level) and any ``log.level.<logger>`` set."""
        resp = self._controller(
            "DescribeConfigs",
            controller_pb2.DescribeConfigsRequest(
                resources=[
                    controller_pb2.DescribeConfigsResource(
                        resource_type=controller_pb2.RESOURCE_TYPE_NODE, resource_name=""
                    )
                ],
                include_documentation=bool_option("documentation", documentation),
            ),
        )
        out: dict[str, ConfigEntry] = {}
        for r in resp.results:
            if r.error_code != NONE:
                raise error_for(r.error_code, r.error_message or None)
            out.update(config_entries(r.configs))
        return out

    def alter_node_configs(
        self,
        set: Mapping[str, ConfigValue] | None = None,  # shadows the builtin: Kafka's op name
        delete: Iterable[str] | None = None,
        *,
        validate_only: bool = False,
    ) -> None:
        """Change the cluster's dynamic configs, all or nothing: the replication throttle
        rates of reassignments (``leader.replication.throttled.rate``,
        ``follower.replication.throttled.rate``, bytes/s >= 1; ``delete`` removes a limit;
        which replicas they apply to is the topics' ``*.replication.throttled.replicas``,
        ``alter_configs``), and the log levels of every running service, as Kafka's dynamic
        broker loggers: ``log.level`` (the root logger) and ``log.level.<logger>`` (one
        logger and those under it), ``"debug"``, ``"info"``, ``"warning"`` or ``"error"``;
        ``delete`` puts back the level each process started at. An unknown name or bad
        value raises InvalidConfigError."""
        ops: list[controller_pb2.AlterableConfig] = []
        for key, value in config_strings(set).items():
            ops.append(
                controller_pb2.AlterableConfig(
                    name=key, op=controller_pb2.ALTER_CONFIG_OP_SET, value=value
                )
            )
        if isinstance(delete, str):
            delete = [delete]
        for key in delete or []:
            if not isinstance(key, str) or not key:
                raise InvalidConfigError(f"config names must be non-empty strings, not {key!r}")
            ops.append(
                controller_pb2.AlterableConfig(name=key, op=controller_pb2.ALTER_CONFIG_OP_DELETE)
            )
        resp = self._controller(
            "AlterConfigs",
            controller_pb2.AlterConfigsRequest(
                resources=[
                    controller_pb2.AlterConfigsResource(
                        resource_type=controller_pb2.RESOURCE_TYPE_NODE,
                        resource_name="",
                        configs=ops,
                    )
                ],
                validate_only=bool_option("validate_only", validate_only),
            ),
        )
        for r in resp.results:
            if r.error_code != NONE:
                raise error_for(r.error_code, r.error_message or None)

    def describe_cluster(self, *, include_coordinators: bool = False) -> ClusterDescription:
        """Cluster id, active controller and live storage nodes (with rack and state); with
        ``include_coordinators``, the coordinator owning each consumer-group shard."""
        resp = self._controller(
            "DescribeCluster",
            controller_pb2.DescribeClusterRequest(
                include_coordinators=bool_option("include_coordinators", include_coordinators)
            ),
        )
        nodes = tuple(
            NodeInfo(
                node_id=n.node_id,
                host=n.host,
                port=n.port,
                rack=n.rack if n.HasField("rack") else None,
                state=_NODE_STATES.get(n.state, NodeState.STARTING),
                metrics_port=n.metrics_port,
                software_version=n.software_version,
                start_time_ms=n.start_time_ms,
                incarnation_id=n.incarnation_id,
            )
            for n in sorted(resp.nodes, key=lambda n: n.node_id)
        )
        coordinators = {
            s.shard: Node(s.coordinator_id, s.host, s.port)
            for s in sorted(resp.coordinator_shards, key=lambda s: s.shard)
        }
        return ClusterDescription(
            cluster_id=resp.cluster_id,
            controller=node_of(resp.controller if resp.HasField("controller") else None),
            controller_epoch=resp.controller_epoch,
            nodes=nodes,
            coordinators=coordinators,
        )
