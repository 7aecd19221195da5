"""The controller's read RPCs about the cluster and its topics: DescribeCluster, ListTopics,
DescribeTopics (DESIGN §3).

Reads come from the :class:`~strom.metadata.ClusterView`, which follows etcd by watch; every
write waits until the view shows it, so a caller that describes right after creating sees
what it created. Any controller, active or not, could answer from its view, but only the
active one does, so a client sees one controller's picture at a time.
"""

from __future__ import annotations

from strom.api import controller_pb2 as pb
from strom.controller.core import ControllerCore, Leadership, rpc
from strom.controller.validation import is_internal_topic
from strom.errors import ErrorCode

E = ErrorCode


class DescriptionRpcs(ControllerCore):
    """DescribeCluster, ListTopics and DescribeTopics."""

    @rpc(write=False, controller_epoch=-1)
    async def DescribeCluster(
        self,
        lead: Leadership,
        request: pb.DescribeClusterRequest,
        response: pb.DescribeClusterResponse,
    ) -> None:
        view = self._live_view
        with view.lock:
            response.cluster_id = view.cluster.cluster_id if view.cluster else ""
            response.nodes.extend(v.value for _, v in sorted(view.nodes.items()))
            if request.include_coordinators:
                response.coordinator_shards.extend(
                    v.value for _, v in sorted(view.coordinators.items())
                )
                response.transaction_shards.extend(
                    v.value for _, v in sorted(view.txn_coordinators.items())
                )
        response.controller_epoch = lead.epoch

    @rpc(write=False)
    async def ListTopics(
        self, lead: Leadership, request: pb.ListTopicsRequest, response: pb.ListTopicsResponse
    ) -> None:
        with self._live_view.lock:
            topics = [v.value for _, v in sorted(self.view.topics.items())]
        for t in topics:
            internal = t.internal or is_internal_topic(t.name)
            if t.deleting or (internal and not request.include_internal):
                continue
            response.topics.add(
                name=t.name,
                topic_id=t.topic_id,
                partition_count=t.partition_count,
                internal=internal,
            )

    @rpc(write=False)
    async def DescribeTopics(
        self,
        lead: Leadership,
        request: pb.DescribeTopicsRequest,
        response: pb.DescribeTopicsResponse,
    ) -> None:
        view = self._live_view
        with view.lock:
            names = list(request.topics) or sorted(
                n for n, v in view.topics.items() if not v.value.deleting
            )
            live = set(view.nodes)
            for name in names:
                desc = response.topics.add(name=name)
                topic = view.topics.get(name)
                if topic is None or topic.value.deleting:
                    desc.error_code = E.UNKNOWN_TOPIC_OR_PARTITION
                    desc.error_message = f"topic {name!r} does not exist"
                    continue
                meta = topic.value
                desc.metadata.CopyFrom(meta)
                for p in range(meta.partition_count):
                    v = view.partitions.get((name, p))
                    part = desc.partitions.add(partition=p)
                    if v is None:
                        continue  # not written yet (or lost): an empty state says so
                    part.state.CopyFrom(v.value)
                    part.offline_replicas.extend(r for r in v.value.replicas if r not in live)
