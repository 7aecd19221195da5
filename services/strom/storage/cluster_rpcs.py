"""Cluster-level RPCs any storage node answers from its etcd view: Metadata, FindCoordinator,
and InitProducerId (DESIGN §3, §6).

InitProducerId hands out producer ids from blocks the active controller reserves
(:mod:`strom.storage.producer_ids`) and bumps epochs; FindCoordinator answers from the view of
the coordinator shard owners (:mod:`strom.coordinator.lookup`).
"""

from __future__ import annotations

import contextlib
import logging
from typing import Any

import grpc

from strom.api import common_pb2, metadata_pb2, storage_pb2
from strom.coordinator.lookup import find_coordinator
from strom.errors import ErrorCode, error_name
from strom.grpc_options import MAX_BATCH_BYTES
from strom.storage import metrics
from strom.storage.producer_ids import ProducerIdUnavailableError
from strom.storage.request_quota import counted_request
from strom.storage.rpc_base import StorageCore, _node, _timed

log = logging.getLogger("strom.storage.servicer")
pb = storage_pb2
E = ErrorCode


class ClusterRpcs(StorageCore):
    """Metadata, InitProducerId, FindCoordinator."""

    @_timed("Metadata")
    @counted_request
    async def Metadata(
        self, request: pb.MetadataRequest, context: grpc.aio.ServicerContext
    ) -> pb.MetadataResponse:
        view = self.view
        with view.lock:
            cluster = view.cluster
            nodes = {i: v.value for i, v in view.nodes.items()}
            controller = view.controller.value if view.controller else None
            topics = {} if request.skip_topics else {n: v.value for n, v in view.topics.items()}
            # Named topics: their partitions only (a client asking for one topic must not pay
            # for a scan of every partition in the cluster); none named: all of them.
            by_topic: dict[str, list[tuple[int, metadata_pb2.PartitionState]]] = {}
            if request.topics and not request.skip_topics:
                for name in set(request.topics):
                    of_topic = view.topic_partitions_locked(name)
                    by_topic[name] = [(p, v.value) for p, v in of_topic.items()]
            elif not request.skip_topics:
                for (t, p), v in view.partitions.items():
                    by_topic.setdefault(t, []).append((p, v.value))
        resp = pb.MetadataResponse(cluster_id=cluster.cluster_id if cluster else "")
        resp.nodes.extend(_node(nodes[i]) for i in sorted(nodes))
        if controller is not None:
            resp.controller.CopyFrom(
                common_pb2.Node(
                    node_id=controller.controller_id, host=controller.host, port=controller.port
                )
            )
        else:
            resp.controller.node_id = -1
        if request.skip_topics:
            return resp
        names = sorted(set(request.topics)) if request.topics else sorted(topics)
        for name in names:
            meta = topics.get(name)
            mt = resp.topics.add(name=name)
            if meta is None or meta.deleting:
                mt.error_code = E.UNKNOWN_TOPIC_OR_PARTITION  # type: ignore[assignment]
                mt.error_message = f"unknown topic {name}"
                continue
            mt.topic_id = meta.topic_id
            mt.is_internal = meta.internal
            limit = meta.configs.get("max.message.bytes")
            if limit:
                with contextlib.suppress(ValueError):  # (validated when it was set)
                    # (as applied: a value stored before the bound is applied as the bound)
                    mt.max_message_bytes = min(int(limit), MAX_BATCH_BYTES)
            for p, s in sorted(by_topic.get(name, ()), key=lambda x: x[0]):
                if s.topic_id and meta.topic_id and s.topic_id != meta.topic_id:
                    continue  # a leftover of an earlier topic with this name
                mp = mt.partitions.add(
                    partition=p,
                    leader=s.leader,
                    leader_epoch=s.leader_epoch,
                    replicas=s.replicas,
                    isr=s.isr,
                    offline_replicas=[r for r in s.replicas if r not in nodes],
                )
                if s.leader < 0:
                    mp.error_code = E.LEADER_NOT_AVAILABLE  # type: ignore[assignment]
                    mp.error_message = f"{name}-{p} has no leader"
        return resp

    @_timed("InitProducerId")
    @counted_request
    async def InitProducerId(
        self, request: pb.InitProducerIdRequest, context: Any
    ) -> pb.InitProducerIdResponse:
        """A new producer id at epoch 0 (producer_id -1), or the next epoch of the given id
        (a new id at epoch 0 when the epoch would pass 32767). Any node answers."""
        resp = pb.InitProducerIdResponse(producer_id=-1, producer_epoch=-1)

        def fail(code: int, message: str) -> pb.InitProducerIdResponse:
            resp.error_code = code  # type: ignore[assignment]
            resp.error_message = message
            metrics.INIT_PRODUCER_ID.labels(error_name(code)).inc()
            return resp

        if request.HasField("transactional_id"):
            return fail(
                E.INVALID_REQUEST,
                "a transactional producer gets its producer id from its transaction "
                "coordinator (CoordinatorService.InitProducerId): leave transactional_id unset "
                "here",
            )
        if self.producer_ids is None:
            return fail(E.UNKNOWN_SERVER_ERROR, "this node does not hand out producer ids")
        try:
            # An unset id means a new id: proto3's default 0 would bump producer 0 for every
            # caller that left them out (two callers got the same id and
            # epoch, and the second one's records were dropped as the first one's retries).
            # An unset epoch is 0: senders built before the fields were optional (an old
            # coordinator reloading a shard, an old producer's bump) put no epoch 0 on the
            # wire, and were refused INVALID_REQUEST (rolling upgrade).
            got = await self.producer_ids.init(
                request.producer_id if request.HasField("producer_id") else -1,
                request.producer_epoch if request.HasField("producer_epoch") else 0,
            )
        except ValueError as exc:
            return fail(E.INVALID_REQUEST, str(exc))
        except ProducerIdUnavailableError as exc:
            return fail(exc.code, exc.message)
        except Exception as exc:
            log.error("InitProducerId failed", exc_info=exc)
            return fail(E.UNKNOWN_SERVER_ERROR, f"{type(exc).__name__}: {exc}")
        resp.producer_id = got.producer_id
        resp.producer_epoch = got.epoch
        metrics.INIT_PRODUCER_ID.labels("new" if got.new_id else "bump").inc()
        return resp

    @_timed("FindCoordinator")
    @counted_request
    async def FindCoordinator(
        self, request: pb.FindCoordinatorRequest, context: grpc.aio.ServicerContext
    ) -> pb.FindCoordinatorResponse:
        """The shard owner of each group from this node's etcd view (``coordinators/<s>``);
        COORDINATOR_NOT_AVAILABLE while a shard has no owner."""
        return find_coordinator(self.view, request)
