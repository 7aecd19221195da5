"""What each RPC needs: the (operation, resource type, name) checks of every method of every
strom service, and the responses that are filtered instead of refused.

Kafka's table, applied to strom's RPCs. A request naming several topics (or groups) needs the
permission on each; a missing one refuses the whole request with PERMISSION_DENIED naming it.
Listing calls (Metadata, ListTopics, ListGroups, ListTransactions, DescribeTopics naming no
topic) are answered with what the principal may DESCRIBE; answers that name topics in passing
(OffsetFetch, DescribeGroups, DescribeTransactions) leave out, or mark, those it may not
DESCRIBE. Calls strom's own services make to
each other (follower fetches, AlterPartition, markers, ...) need CLUSTER_ACTION, which their
principals get by being super users.

:data:`RULES` must name every method of every service: the interceptor refuses a method it
has no rule for, and a unit test walks the service descriptors, so a new RPC cannot slip in
unchecked.
"""

from __future__ import annotations

from collections.abc import Callable, Iterable
from typing import Any

from google.protobuf.message import DecodeError

from strom.api import records_pb2
from strom.errors import ErrorCode
from strom.grpc_options import MAX_PRODUCE_RECORDS_REQUEST_BYTES
from strom.security.acl import CLUSTER, SOME, Authorizer, Op, Res
from strom.storage.replica_claims import is_follower_fetch, is_replica_list_offsets
from strom.storage.wire import top_level_string

Check = tuple[Op, Res, str]
#: request -> the checks it needs (empty: any authenticated principal).
Rule = Callable[[Any], Iterable[Check]]
#: (authorizer, principal, request, response): remove what the principal may not see from
#: the response (in place).
Filter = Callable[[Authorizer, str, Any, Any], None]

S, C, K, R = (
    "/strom.v1.StorageService/",
    "/strom.v1.ControllerService/",
    "/strom.v1.CoordinatorService/",
    "/strom.v1.RecordService/",
)


def _topics(op: Op) -> Rule:
    return lambda req: [(op, Res.TOPIC, t.topic) for t in req.topics]


def _names(op: Op, res: Res, field: str) -> Rule:
    return lambda req: [(op, res, n) for n in getattr(req, field)]


def _cluster(op: Op) -> Rule:
    return lambda req: [(op, Res.CLUSTER, CLUSTER)]


def _anyone(req: Any) -> Iterable[Check]:
    return ()


def is_fetch_grant(req: Any) -> bool:
    """A FetchStream request that only grants a followed fetch more answers (storage.proto,
    FetchRequest.follow_answers): no topics, so it reads nothing and needs no permission."""
    return not req.topics and req.follow_answers > 0 and not req.follow


def _produce(req: Any) -> Iterable[Check]:
    """WRITE on each topic (and on the transactional id when one is named); an internal
    ``__`` topic also needs CLUSTER_ACTION: only strom's own coordinators write those
    (service.headers.INTERNAL_TOPICS_METADATA_KEY), and with ACLs on the header alone must
    not let a client with WRITE on ``*`` in."""
    out: list[Check] = [(Op.WRITE, Res.TOPIC, t.topic) for t in req.topics]
    if any(t.topic.startswith("__") for t in req.topics):
        out.append((Op.CLUSTER_ACTION, Res.CLUSTER, CLUSTER))
    # A transactional producer's batches: WRITE on its transactional id too (Kafka's rule;
    # Topic WRITE alone opened a transaction no coordinator knew of,
    # holding read_committed readers for good). Transactional batches without an id are
    # refused by the log (strom.log: Log.append).
    if req.transactional_id:
        out.append((Op.WRITE, Res.TRANSACTIONAL_ID, req.transactional_id))
    return out


def _fetch(req: Any) -> Iterable[Check]:
    """A follower's fetch (strom.storage.replica_claims: ``replica_id >= 0`` with its
    incarnation) needs CLUSTER_ACTION, as Kafka's: strom's own nodes only. Anything else is
    a consumer's and needs READ on each topic; ``replica_id >= 0``
    alone was the claim, so a client in another language that left it unset (0) was refused
    for want of CLUSTER_ACTION instead of read as a consumer."""
    if is_fetch_grant(req):
        return []
    if is_follower_fetch(req):
        return [(Op.CLUSTER_ACTION, Res.CLUSTER, CLUSTER)]
    return [(Op.READ, Res.TOPIC, t.topic) for t in req.topics]


def _list_offsets(req: Any) -> Iterable[Check]:
    """DESCRIBE on each topic; the log-end view of a replica (``replica_id >= 1``: offsets
    not replicated or committed yet) also needs CLUSTER_ACTION, as a follower's fetch does.
    Any principal with DESCRIBE saw the log end by naming a
    node id."""
    out: list[Check] = [(Op.DESCRIBE, Res.TOPIC, t.topic) for t in req.topics]
    if is_replica_list_offsets(req):
        out.append((Op.CLUSTER_ACTION, Res.CLUSTER, CLUSTER))
    return out


def _find_coordinator(req: Any) -> Iterable[Check]:
    """DESCRIBE on each key. ``all_shards`` (no keys) needs nothing more than being
    authenticated: it tells only where the coordinators are, as Metadata tells where the
    storage nodes are, and listing groups or transactions is filtered per group or id."""
    res = Res.TRANSACTIONAL_ID if req.key_type == 1 else Res.GROUP
    return [(Op.DESCRIBE, res, k) for k in req.keys]


def _group(op: Op, extra: Rule | None = None) -> Rule:
    def rule(req: Any) -> Iterable[Check]:
        out: list[Check] = [(op, Res.GROUP, req.group_id)]
        if extra is not None:
            out.extend(extra(req))
        return out

    return rule


def _txn(op: Op, extra: Rule | None = None) -> Rule:
    def rule(req: Any) -> Iterable[Check]:
        out: list[Check] = [(op, Res.TRANSACTIONAL_ID, req.transactional_id)]
        if extra is not None:
            out.extend(extra(req))
        return out

    return rule


def _configs(op: Op) -> Rule:
    def rule(req: Any) -> Iterable[Check]:
        out: list[Check] = []
        for r in req.resources:
            if r.resource_type == 1:  # a topic
                out.append((op, Res.TOPIC, r.resource_name))
                if op is Op.ALTER and r.resource_name.startswith("__"):  # as _produce
                    out.append((Op.CLUSTER_ACTION, Res.CLUSTER, CLUSTER))
            else:  # a node's static config
                out.append((op, Res.CLUSTER, CLUSTER))
        return out

    return rule


def _init_producer_id(req: Any) -> Iterable[Check]:
    """A transactional id needs WRITE on it; an idempotent producer id needs WRITE on some
    topic (Kafka's KIP-679). It needed nothing, so any authenticated principal could
    have producer ids handed out (and the active controller write etcd for each 1,000)."""
    if req.HasField("transactional_id"):
        return [(Op.WRITE, Res.TRANSACTIONAL_ID, req.transactional_id)]
    return [(Op.WRITE, Res.TOPIC, SOME)]


def _create_topics(req: Any) -> Iterable[Check]:
    """CREATE on each topic; an internal ``__`` name also needs CLUSTER_ACTION, as
    :func:`_produce`: only strom's coordinators create those (with the header
    service.headers.INTERNAL_TOPICS_METADATA_KEY). CREATE on ``*`` and
    the header made ``__`` topics that no client could write and nobody could delete."""
    out: list[Check] = [(Op.CREATE, Res.TOPIC, t.name) for t in req.topics]
    if any(t.name.startswith("__") for t in req.topics):
        out.append((Op.CLUSTER_ACTION, Res.CLUSTER, CLUSTER))
    return out


def _parsed(message: type[Any], req: Any) -> Any:
    """A RecordService request as a message: its handlers take the raw bytes (they parse
    them to name what is malformed), so the interceptor gets bytes. One that does not parse
    is None: the handler refuses it (INVALID_ARGUMENT) without acting on it."""
    if not isinstance(req, (bytes, bytearray, memoryview)):
        return req
    try:
        return message.FromString(bytes(req))
    except DecodeError:
        return None


def _produce_records(req: Any) -> Iterable[Check]:
    """WRITE on the call's topic, read from the request's top level only.

    Parsing the whole request here, on the event loop and before
    the handler's checks, made the record API's size limit moot with ACLs on: a 120 MB call
    held the node for 9 s and cost it its etcd lease. A call above the limit is refused by
    the handler before it does anything, so it needs no check here; any other call's topic is
    read from the wire format (its records are one length-delimited field, skipped), and
    parsed in full only when that read cannot be sure."""
    if isinstance(req, (bytes, bytearray, memoryview)):
        if len(req) > MAX_PRODUCE_RECORDS_REQUEST_BYTES:
            return ()
        topic = top_level_string(req, 1)
        if topic is not None:
            return [(Op.WRITE, Res.TOPIC, topic)]
    msg = _parsed(records_pb2.ProduceRecordsRequest, req)
    return () if msg is None else [(Op.WRITE, Res.TOPIC, msg.topic)]


def _subscribe(req: Any) -> Iterable[Check]:
    msg = _parsed(records_pb2.SubscribeRequest, req)
    if msg is None:
        return ()
    out: list[Check] = [(Op.READ, Res.TOPIC, t) for t in msg.topics]
    out += [(Op.READ, Res.TOPIC, p.topic) for p in msg.partitions]
    if msg.group_id:
        out.append((Op.READ, Res.GROUP, msg.group_id))
    return out


RULES: dict[str, Rule] = {
    # StorageService
    S + "Produce": _produce,
    S + "Fetch": _fetch,
    # The streams: checked per request on the stream (strom.security.interceptor).
    S + "ProduceStream": _produce,
    S + "FetchStream": _fetch,
    S + "ListOffsets": _list_offsets,
    S + "OffsetForLeaderEpoch": _topics(Op.DESCRIBE),
    S + "DeleteRecords": _topics(Op.DELETE),
    S + "Metadata": _anyone,  # filtered: see FILTERS
    S + "InitProducerId": _init_producer_id,
    S + "FindCoordinator": _find_coordinator,
    S + "WriteTxnMarkers": _cluster(Op.CLUSTER_ACTION),
    S + "DescribeProducers": _topics(Op.READ),  # as Kafka
    # ControllerService
    C + "CreateTopics": _create_topics,
    C + "DeleteTopics": _names(Op.DELETE, Res.TOPIC, "topics"),
    C + "CreatePartitions": lambda req: [(Op.ALTER, Res.TOPIC, t.name) for t in req.topics],
    C + "DescribeConfigs": _configs(Op.DESCRIBE),
    C + "AlterConfigs": _configs(Op.ALTER),
    C + "DescribeCluster": _cluster(Op.DESCRIBE),
    C + "ListTopics": _anyone,  # filtered
    # Named topics: DESCRIBE on each; none named (every topic): filtered, see FILTERS.
    C + "DescribeTopics": _names(Op.DESCRIBE, Res.TOPIC, "topics"),
    C + "AlterPartition": _cluster(Op.CLUSTER_ACTION),
    C + "ElectLeaders": _cluster(Op.ALTER),
    C + "AlterPartitionReassignments": _cluster(Op.ALTER),
    C + "ListPartitionReassignments": _cluster(Op.DESCRIBE),
    C + "ControlledShutdown": _cluster(Op.CLUSTER_ACTION),
    C + "AllocateProducerIds": _cluster(Op.CLUSTER_ACTION),
    C + "CreateAcls": _cluster(Op.ALTER),
    C + "DescribeAcls": _cluster(Op.DESCRIBE),
    C + "DeleteAcls": _cluster(Op.ALTER),
    C + "AlterClientQuotas": _cluster(Op.ALTER),
    C + "DescribeClientQuotas": _cluster(Op.DESCRIBE),
    # CoordinatorService
    # A regex is resolved to the topics the member may DESCRIBE by the coordinator
    # (ConsumerGroup.subscribed_topics); named topics need DESCRIBE here, as Kafka checks.
    K + "ConsumerGroupHeartbeat": _group(
        Op.READ, _names(Op.DESCRIBE, Res.TOPIC, "subscribed_topic_names")
    ),
    K + "OffsetCommit": _group(Op.READ, _topics(Op.READ)),
    # Offsets, members' assignments and transactions name topics: those the principal may
    # not DESCRIBE are taken out of the answers (FILTERS).
    K + "OffsetFetch": _group(Op.DESCRIBE),
    K + "ListGroups": _anyone,  # filtered
    K + "DescribeGroups": _names(Op.DESCRIBE, Res.GROUP, "group_ids"),
    K + "DeleteGroups": _names(Op.DELETE, Res.GROUP, "group_ids"),
    # READ on each topic too, as Kafka's OffsetDelete (DELETE on the
    # group alone deleted the offsets of topics the principal could not even describe).
    K + "DeleteOffsets": _group(Op.DELETE, _topics(Op.READ)),
    K + "FindCoordinator": _find_coordinator,
    K + "InitProducerId": _init_producer_id,
    K + "AddPartitionsToTxn": _txn(Op.WRITE, _topics(Op.WRITE)),
    K + "AddOffsetsToTxn": lambda req: [
        (Op.WRITE, Res.TRANSACTIONAL_ID, req.transactional_id),
        (Op.READ, Res.GROUP, req.group_id),
    ],
    K + "EndTxn": _txn(Op.WRITE),
    K + "DescribeTransactions": _names(Op.DESCRIBE, Res.TRANSACTIONAL_ID, "transactional_ids"),
    K + "ListTransactions": _anyone,  # filtered
    K + "TxnOffsetCommit": lambda req: [
        (Op.WRITE, Res.TRANSACTIONAL_ID, req.transactional_id),
        (Op.READ, Res.GROUP, req.group_id),
        *((Op.READ, Res.TOPIC, t.topic) for t in req.topics),
    ],
    K + "CompleteTxnOffsets": _cluster(Op.CLUSTER_ACTION),
    # RecordService (record-level gRPC for every language): the node acts for the caller with
    # its own identity, so the caller's rights are checked here, at the door.
    R + "ProduceRecords": _produce_records,
    R + "Subscribe": _subscribe,
    # The subscription id (a random UUID the Subscribe stream handed out) is the capability.
    R + "CommitOffsets": _anyone,
}


def _filter_metadata(auth: Authorizer, principal: str, req: Any, resp: Any) -> None:
    """Topics the principal may not DESCRIBE: left out of a listing of every topic; named
    with TOPIC_AUTHORIZATION_FAILED (and no partitions) when asked for by name, as Kafka
    answers, so the client says what is missing instead of "unknown topic"."""
    named = bool(req.topics)
    keep = []
    for t in resp.topics:
        if auth.allowed(principal, Op.DESCRIBE, Res.TOPIC, t.name):
            keep.append(t)
        elif named:
            t.error_code = ErrorCode.TOPIC_AUTHORIZATION_FAILED
            t.error_message = f"{principal} is not allowed DESCRIBE on topic {t.name!r}"
            del t.partitions[:]
            t.topic_id = ""
            keep.append(t)
    del resp.topics[:]
    resp.topics.extend(keep)


def _filter_list_topics(auth: Authorizer, principal: str, req: Any, resp: Any) -> None:
    keep = [t for t in resp.topics if auth.allowed(principal, Op.DESCRIBE, Res.TOPIC, t.name)]
    del resp.topics[:]
    resp.topics.extend(keep)


def _filter_describe_topics(auth: Authorizer, principal: str, req: Any, resp: Any) -> None:
    """Every topic (no names in the request): only those the principal may DESCRIBE, as
    ListTopics answers (a principal with no grants got every topic's
    configs, replicas and ids). Named topics were each checked before the call."""
    if not req.topics:
        _filter_list_topics(auth, principal, req, resp)


def _filter_groups(auth: Authorizer, principal: str, req: Any, resp: Any) -> None:
    keep = [g for g in resp.groups if auth.allowed(principal, Op.DESCRIBE, Res.GROUP, g.group_id)]
    del resp.groups[:]
    resp.groups.extend(keep)


def _filter_transactions(auth: Authorizer, principal: str, req: Any, resp: Any) -> None:
    keep = [
        t
        for t in resp.transactions
        if auth.allowed(principal, Op.DESCRIBE, Res.TRANSACTIONAL_ID, t.transactional_id)
    ]
    del resp.transactions[:]
    resp.transactions.extend(keep)


class _Describable:
    """Whether the principal may DESCRIBE a topic, asked once per name: one answer names a
    topic in many places (every member's assignment, every partition's offset)."""

    def __init__(self, auth: Authorizer, principal: str) -> None:
        self.auth, self.principal, self.known = auth, principal, {}

    def __call__(self, topic: str) -> bool:
        ok = self.known.get(topic)
        if ok is None:
            ok = self.known[topic] = self.auth.allowed(
                self.principal, Op.DESCRIBE, Res.TOPIC, topic
            )
        return ok


def _keep_topics(items: Any, ok: Callable[[str], bool], field: str = "topic") -> None:
    """Remove the entries of a repeated field whose topic the principal may not DESCRIBE."""
    keep = [x for x in items if ok(getattr(x, field))]
    if len(keep) != len(items):
        del items[:]
        items.extend(keep)


def _filter_offset_fetch(auth: Authorizer, principal: str, req: Any, resp: Any) -> None:
    """Committed offsets of topics the principal may not DESCRIBE (Kafka's OffsetFetch): a
    topic asked for by name answers TOPIC_AUTHORIZATION_FAILED on each partition, without
    its offset; the every-offset form (no topics named) leaves such topics out. Found from
    outside: DESCRIBE on the group showed every topic's name and committed offset."""
    ok = _Describable(auth, principal)
    if not req.topics:
        _keep_topics(resp.topics, ok)
        return
    for t in resp.topics:
        if ok(t.topic):
            continue
        for p in t.partitions:
            p.CopyFrom(  # nothing of the answer kept: offset, epoch, metadata
                type(p)(
                    partition=p.partition,
                    error_code=ErrorCode.TOPIC_AUTHORIZATION_FAILED,
                    error_message=f"{principal} is not allowed DESCRIBE on topic {t.topic!r}",
                    committed_offset=-1,
                    committed_leader_epoch=-1,
                )
            )


def _filter_describe_groups(auth: Authorizer, principal: str, req: Any, resp: Any) -> None:
    """A group's description without the topics the principal may not DESCRIBE: out of every
    member's subscribed names, assignment and target assignment, and out of the offsets.
    DESCRIBE on a group showed the names, offsets and log ends of every
    topic it consumed. (Kafka answers such a group with TOPIC_AUTHORIZATION_FAILED as a whole,
    KAFKA-18813; leaving the topics out keeps `strom groups describe` useful for what the
    principal may see.)"""
    ok = _Describable(auth, principal)
    for g in resp.groups:
        for m in g.members:
            names = [n for n in m.subscribed_topic_names if ok(n)]
            if len(names) != len(m.subscribed_topic_names):
                del m.subscribed_topic_names[:]
                m.subscribed_topic_names.extend(names)
            _keep_topics(m.assignment.topic_partitions, ok)
            _keep_topics(m.target_assignment.topic_partitions, ok)
        _keep_topics(g.offsets, ok)


def _filter_describe_transactions(auth: Authorizer, principal: str, req: Any, resp: Any) -> None:
    """A transaction's partitions without the topics the principal may not DESCRIBE, as
    Kafka's DescribeTransactions answers (DESCRIBE on the transactional
    id showed every topic the transaction wrote to), and its groups without those the
    principal may not DESCRIBE (Kafka's answer has no groups at all)."""
    ok = _Describable(auth, principal)
    for t in resp.transactions:
        _keep_topics(t.topics, ok)
        groups = [g for g in t.groups if auth.allowed(principal, Op.DESCRIBE, Res.GROUP, g)]
        if len(groups) != len(t.groups):
            del t.groups[:]
            t.groups.extend(groups)


FILTERS: dict[str, Filter] = {
    S + "Metadata": _filter_metadata,
    C + "ListTopics": _filter_list_topics,
    C + "DescribeTopics": _filter_describe_topics,
    K + "ListGroups": _filter_groups,
    K + "ListTransactions": _filter_transactions,
    K + "OffsetFetch": _filter_offset_fetch,
    K + "DescribeGroups": _filter_describe_groups,
    K + "DescribeTransactions": _filter_describe_transactions,
}

#: Services served without authentication (Kubernetes probes; the API's shape).
UNAUTHENTICATED_SERVICES = (
    "/grpc.health.v1.Health/",
    "/grpc.reflection.v1alpha.",
    "/grpc.reflection.v1.",
)
