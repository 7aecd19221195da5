"""``strom topics ...`` and ``strom cluster describe``: admin over the controller RPCs."""

from __future__ import annotations

import argparse
import json
from typing import Any

from google.protobuf import json_format

from strom.api import common_pb2, controller_pb2, metadata_pb2
from strom.client.cluster import ClusterClient
from strom.errors import error_for

NONE = common_pb2.ErrorCode.NONE


def _kv(items: list[str] | None, what: str) -> dict[str, str]:
    out: dict[str, str] = {}
    for item in items or []:
        key, sep, value = item.partition("=")
        if not sep or not key:
            raise ValueError(f"{what} {item!r} is not KEY=VALUE")
        out[key.strip()] = value.strip()
    return out


def _check(results: Any, name_field: str = "name") -> None:
    failed = [r for r in results if r.error_code != NONE]
    if failed:
        first = failed[0]
        raise error_for(
            first.error_code, f"{getattr(first, name_field)}: {first.error_message}".strip(": ")
        )


def add_topics_parser(sub: Any, common: argparse.ArgumentParser) -> None:
    topics = sub.add_parser("topics", help="create, list, describe, alter, delete topics")
    tsub = topics.add_subparsers(dest="topics_cmd", metavar="ACTION")
    tsub.required = True
    c = tsub.add_parser("create", parents=[common], help="create a topic")
    c.add_argument("topic")
    c.add_argument("--partitions", type=int, default=-1, help="default: cluster default (1)")
    c.add_argument(
        "--replication-factor",
        type=int,
        default=-1,
        help="default: cluster default (min(3, nodes))",
    )
    c.add_argument("--config", action="append", metavar="KEY=VALUE", help="topic config")
    c.add_argument("--validate-only", action="store_true")
    tsub.add_parser("list", parents=[common], help="list topics").add_argument(
        "--internal", action="store_true", help="include internal topics"
    )
    d = tsub.add_parser("describe", parents=[common], help="describe topics (all by default)")
    d.add_argument("topics", nargs="*")
    d.add_argument("--json", action="store_true")
    rm = tsub.add_parser("delete", parents=[common], help="delete topics and their data")
    rm.add_argument("topics", nargs="+")
    a = tsub.add_parser("alter", parents=[common], help="change configs or add partitions")
    a.add_argument("topic")
    a.add_argument("--set", action="append", metavar="KEY=VALUE", help="set a config")
    a.add_argument("--delete", action="append", metavar="KEY", help="reset a config")
    a.add_argument("--partitions", type=int, help="new (larger) partition count")
    e = tsub.add_parser(
        "elect-leaders",
        parents=[common],
        help="move leadership to preferred replicas (or --unclean: elect any live replica)",
    )
    e.add_argument("topics", nargs="*", help="default: every topic")
    e.add_argument(
        "--unclean",
        action="store_true",
        help="for partitions without a leader, elect a live replica out of the ISR (may lose data)",
    )
    r = tsub.add_parser(
        "reassign", parents=[common], help="move a partition to other replicas, or cancel a move"
    )
    r.add_argument("topic")
    r.add_argument("--partition", type=int, required=True)
    r.add_argument("--replicas", metavar="ID,ID,...", help="target replicas, preferred first")
    r.add_argument("--cancel", action="store_true", help="cancel the move in progress")


def add_cluster_parser(sub: Any, common: argparse.ArgumentParser) -> None:
    cl = sub.add_parser("cluster", help="cluster information")
    csub = cl.add_subparsers(dest="cluster_cmd", metavar="ACTION")
    csub.required = True
    d = csub.add_parser("describe", parents=[common], help="cluster id, controller, nodes")
    d.add_argument("--json", action="store_true")


def run_topics(args: argparse.Namespace, out: Any) -> int:
    with ClusterClient(args.bootstrap) as client:
        cmd = args.topics_cmd
        if cmd == "create":
            req = controller_pb2.CreateTopicsRequest(
                topics=[
                    controller_pb2.CreatableTopic(
                        name=args.topic,
                        num_partitions=args.partitions,
                        replication_factor=args.replication_factor,
                        configs=_kv(args.config, "config"),
                    )
                ],
                validate_only=args.validate_only,
            )
            resp = client.controller_call("CreateTopics", req)
            _check(resp.topics)
            t = resp.topics[0]
            verb = "would create" if args.validate_only else "created"
            print(
                f"{verb} topic {t.name} ({t.num_partitions} partitions, replication factor "
                f"{t.replication_factor})",
                file=out,
            )
        elif cmd == "list":
            resp = client.controller_call(
                "ListTopics", controller_pb2.ListTopicsRequest(include_internal=args.internal)
            )
            for t in sorted(resp.topics, key=lambda t: t.name):
                print(t.name, file=out)
        elif cmd == "describe":
            resp = client.controller_call(
                "DescribeTopics", controller_pb2.DescribeTopicsRequest(topics=args.topics)
            )
            _check(resp.topics)
            if args.json:
                print(
                    json.dumps(
                        [
                            json_format.MessageToDict(t, preserving_proto_field_name=True)
                            for t in resp.topics
                        ],
                        indent=2,
                    ),
                    file=out,
                )
            else:
                for t in sorted(resp.topics, key=lambda t: t.name):
                    _print_topic(t, out)
        elif cmd == "delete":
            resp = client.controller_call(
                "DeleteTopics", controller_pb2.DeleteTopicsRequest(topics=args.topics)
            )
            _check(resp.topics)
            for t in resp.topics:
                print(f"deleted topic {t.name}", file=out)
        elif cmd == "alter":
            if args.partitions is None and not args.set and not args.delete:
                raise ValueError("nothing to alter: give --set, --delete or --partitions")
            if args.set or args.delete:
                entries = [
                    controller_pb2.AlterableConfig(
                        name=k, op=controller_pb2.ALTER_CONFIG_OP_SET, value=v
                    )
                    for k, v in _kv(args.set, "--set").items()
                ]
                entries += [
                    controller_pb2.AlterableConfig(name=k, op=controller_pb2.ALTER_CONFIG_OP_DELETE)
                    for k in args.delete or []
                ]
                resp = client.controller_call(
                    "AlterConfigs",
                    controller_pb2.AlterConfigsRequest(
                        resources=[
                            controller_pb2.AlterConfigsResource(
                                resource_type=controller_pb2.RESOURCE_TYPE_TOPIC,
                                resource_name=args.topic,
                                configs=entries,
                            )
                        ]
                    ),
                )
                _check(resp.results, "resource_name")
                print(f"altered configs of topic {args.topic}", file=out)
            if args.partitions is not None:
                resp = client.controller_call(
                    "CreatePartitions",
                    controller_pb2.CreatePartitionsRequest(
                        topics=[
                            controller_pb2.CreatePartitionsTopic(
                                name=args.topic, count=args.partitions
                            )
                        ]
                    ),
                )
                _check(resp.topics)
                print(f"topic {args.topic} now has {args.partitions} partitions", file=out)
        elif cmd == "elect-leaders":
            _elect_leaders(client, args, out)
        elif cmd == "reassign":
            _reassign(client, args, out)
    return 0


def _elect_leaders(client: ClusterClient, args: argparse.Namespace, out: Any) -> None:
    partitions: list[common_pb2.TopicPartition] = []
    if args.topics:
        resp = client.controller_call(
            "DescribeTopics", controller_pb2.DescribeTopicsRequest(topics=args.topics)
        )
        _check(resp.topics)
        partitions = [
            common_pb2.TopicPartition(topic=t.name, partition=p)
            for t in resp.topics
            for p in range(t.metadata.partition_count)
        ]
    kind = (
        controller_pb2.ELECTION_TYPE_UNCLEAN
        if args.unclean
        else (controller_pb2.ELECTION_TYPE_PREFERRED)
    )
    resp = client.controller_call(
        "ElectLeaders",
        controller_pb2.ElectLeadersRequest(election_type=kind, partitions=partitions),
    )
    skipped = (common_pb2.ErrorCode.ELECTION_NOT_NEEDED,)
    elected = 0
    for r in sorted(resp.partitions, key=lambda r: (r.topic, r.partition)):
        if r.error_code == NONE:
            elected += 1
            print(f"{r.topic}-{r.partition}: leader {r.leader} (epoch {r.leader_epoch})", file=out)
        elif r.error_code not in skipped:
            name = common_pb2.ErrorCode.Name(r.error_code)
            print(f"{r.topic}-{r.partition}: {name} {r.error_message}".rstrip(), file=out)
    print(f"elected {elected} leader(s)", file=out)


def _reassign(client: ClusterClient, args: argparse.Namespace, out: Any) -> None:
    if args.cancel == bool(args.replicas):
        raise ValueError("give either --replicas ID,ID,... or --cancel")
    replicas: list[int] = []
    if args.replicas:
        try:
            replicas = [int(x) for x in args.replicas.split(",") if x.strip()]
        except ValueError:
            raise ValueError(f"--replicas {args.replicas!r} is not a list of node ids") from None
    resp = client.controller_call(
        "AlterPartitionReassignments",
        controller_pb2.AlterPartitionReassignmentsRequest(
            partitions=[
                controller_pb2.PartitionReassignment(
                    topic=args.topic,
                    partition=args.partition,
                    replicas=replicas,
                    cancel=args.cancel,
                )
            ]
        ),
    )
    _check(resp.partitions, "topic")
    if args.cancel:
        print(f"cancelled the reassignment of {args.topic}-{args.partition}", file=out)
    else:
        print(
            f"reassigning {args.topic}-{args.partition} to replicas {','.join(map(str, replicas))}",
            file=out,
        )


def _print_topic(t: Any, out: Any) -> None:
    md = t.metadata
    overrides = ", ".join(f"{k}={v}" for k, v in sorted(md.configs.items())) or "-"
    print(
        f"Topic: {t.name}\tTopicId: {md.topic_id}\tPartitions: {md.partition_count}\t"
        f"ReplicationFactor: {md.replication_factor}\tConfigs: {overrides}",
        file=out,
    )
    for p in sorted(t.partitions, key=lambda p: p.partition):
        s = p.state
        leader = str(s.leader) if s.leader >= 0 else "none"
        flags = []
        removing = set(s.removing_replicas)
        if any(r not in s.isr for r in s.replicas if r not in removing):
            flags.append("under-replicated")
        if s.leader < 0 or s.leader in p.offline_replicas:
            flags.append("offline")
        if s.adding_replicas or s.removing_replicas:
            flags.append(
                "reassigning: adding "
                + (",".join(map(str, s.adding_replicas)) or "-")
                + " removing "
                + (",".join(map(str, s.removing_replicas)) or "-")
            )
        if s.leader_recovery_state == metadata_pb2.LEADER_RECOVERY_STATE_RECOVERING:
            flags.append("recovering")
        print(
            f"\tPartition: {p.partition}\tLeader: {leader}\tEpoch: {s.leader_epoch}\t"
            f"Replicas: {','.join(map(str, s.replicas))}\t"
            f"Isr: {','.join(map(str, s.isr))}"
            + (f"\tOffline: {','.join(map(str, p.offline_replicas))}" if p.offline_replicas else "")
            + (f"\t({', '.join(flags)})" if flags else ""),
            file=out,
        )


def run_cluster(args: argparse.Namespace, out: Any) -> int:
    with ClusterClient(args.bootstrap) as client:
        resp = client.controller_call("DescribeCluster", controller_pb2.DescribeClusterRequest())
        if args.json:
            print(json_format.MessageToJson(resp, preserving_proto_field_name=True), file=out)
            return 0
        c = resp.controller
        print(f"Cluster: {resp.cluster_id}", file=out)
        print(f"Controller: {c.node_id} at {c.host}:{c.port}", file=out)
        for n in sorted(resp.nodes, key=lambda n: n.node_id):
            rack = n.rack if n.HasField("rack") else "-"
            print(
                f"Node {n.node_id}\t{n.host}:{n.port}\track={rack}\tstate={_state_name(n.state)}",
                file=out,
            )
    return 0


def _state_name(state: int) -> str:
    return metadata_pb2.NodeState.Name(state).removeprefix("NODE_STATE_").lower()
