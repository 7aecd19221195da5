"""The API contract (protos/strom/v1) and its generated stubs (services/strom/api).

* the committed stubs match the .proto files (scripts/gen_protos.py --check);
* every message, field, enum, enum value, oneof, service and method has a comment;
* the stubs load in the same process as etcd3 without descriptor-pool clashes;
* a few round trips show the messages work the way the services will use them.
"""

from __future__ import annotations

import pickle
import re
import subprocess
import sys
import textwrap
from collections.abc import Iterator
from concurrent import futures
from pathlib import Path

import grpc
import pytest
from google.protobuf import descriptor_pb2, json_format

from strom.api import (
    common_pb2,
    controller_pb2,
    controller_pb2_grpc,
    coordinator_pb2,
    coordinator_pb2_grpc,
    metadata_pb2,
    records_pb2,
    records_pb2_grpc,
    storage_pb2,
    storage_pb2_grpc,
)

ROOT = Path(__file__).resolve().parents[2]
PROTO_ROOT = ROOT / "protos"
PROTO_FILES = sorted((PROTO_ROOT / "strom" / "v1").glob("*.proto"))
STUB_MODULES = [
    "common_pb2",
    "metadata_pb2",
    "storage_pb2",
    "storage_pb2_grpc",
    "controller_pb2",
    "controller_pb2_grpc",
    "coordinator_pb2",
    "coordinator_pb2_grpc",
    "records_pb2",
    "records_pb2_grpc",
]


# ---------------------------------------------------------------------------------------------
# (a) staleness


def test_generated_stubs_are_not_stale() -> None:
    proc = subprocess.run(
        [sys.executable, str(ROOT / "scripts" / "gen_protos.py"), "--check"],
        cwd=ROOT,
        capture_output=True,
        text=True,
        timeout=120,
        check=False,
    )
    assert proc.returncode == 0, (
        "services/strom/api is stale; run `make protos`.\n" + proc.stdout + proc.stderr
    )


# ---------------------------------------------------------------------------------------------
# (b) every element is documented


@pytest.fixture(scope="module")
def descriptor_set(tmp_path_factory: pytest.TempPathFactory) -> descriptor_pb2.FileDescriptorSet:
    """The .proto files compiled with source info (comments and their locations)."""
    assert PROTO_FILES, "no .proto files found"
    out = tmp_path_factory.mktemp("protos") / "strom.fds"
    proc = subprocess.run(
        [
            sys.executable,
            "-m",
            "grpc_tools.protoc",
            f"-I{PROTO_ROOT}",
            "--include_source_info",
            f"--descriptor_set_out={out}",
            *map(str, PROTO_FILES),
        ],
        capture_output=True,
        text=True,
        timeout=120,
        check=False,
    )
    assert proc.returncode == 0, proc.stderr
    return descriptor_pb2.FileDescriptorSet.FromString(out.read_bytes())


# Field numbers of FileDescriptorProto / DescriptorProto / ... used in SourceCodeInfo paths.
_FILE_MESSAGE, _FILE_ENUM, _FILE_SERVICE = 4, 5, 6
_MSG_FIELD, _MSG_NESTED, _MSG_ENUM, _MSG_ONEOF = 2, 3, 4, 8
_ENUM_VALUE = 2
_SERVICE_METHOD = 2


def _enum_elements(
    enum: descriptor_pb2.EnumDescriptorProto, path: tuple[int, ...], name: str
) -> Iterator[tuple[tuple[int, ...], str]]:
    yield path, f"enum {name}"
    for i, value in enumerate(enum.value):
        yield (*path, _ENUM_VALUE, i), f"enum value {name}.{value.name}"


def _message_elements(
    msg: descriptor_pb2.DescriptorProto, path: tuple[int, ...], name: str
) -> Iterator[tuple[tuple[int, ...], str]]:
    if msg.options.map_entry:  # synthesized for map<,> fields; documented by the field
        return
    yield path, f"message {name}"
    for i, field in enumerate(msg.field):
        yield (*path, _MSG_FIELD, i), f"field {name}.{field.name}"
    for i, oneof in enumerate(msg.oneof_decl):
        members = [f for f in msg.field if f.HasField("oneof_index") and f.oneof_index == i]
        if all(f.proto3_optional for f in members):  # synthetic oneof of an `optional` field
            continue
        yield (*path, _MSG_ONEOF, i), f"oneof {name}.{oneof.name}"
    for i, nested in enumerate(msg.nested_type):
        yield from _message_elements(nested, (*path, _MSG_NESTED, i), f"{name}.{nested.name}")
    for i, enum in enumerate(msg.enum_type):
        yield from _enum_elements(enum, (*path, _MSG_ENUM, i), f"{name}.{enum.name}")


def _file_elements(
    fd: descriptor_pb2.FileDescriptorProto,
) -> Iterator[tuple[tuple[int, ...], str]]:
    for i, msg in enumerate(fd.message_type):
        yield from _message_elements(msg, (_FILE_MESSAGE, i), msg.name)
    for i, enum in enumerate(fd.enum_type):
        yield from _enum_elements(enum, (_FILE_ENUM, i), enum.name)
    for i, service in enumerate(fd.service):
        yield (_FILE_SERVICE, i), f"service {service.name}"
        for j, method in enumerate(service.method):
            yield (_FILE_SERVICE, i, _SERVICE_METHOD, j), f"rpc {service.name}.{method.name}"


def test_every_proto_element_has_a_comment(
    descriptor_set: descriptor_pb2.FileDescriptorSet,
) -> None:
    missing: list[str] = []
    checked = 0
    for fd in descriptor_set.file:
        locations = {tuple(loc.path): loc for loc in fd.source_code_info.location}
        for path, what in _file_elements(fd):
            checked += 1
            loc = locations.get(path)
            comment = (loc.leading_comments + loc.trailing_comments).strip() if loc else ""
            if not comment:
                missing.append(f"{fd.name}: {what}")
    assert checked > 300, f"only {checked} elements found; is the walker broken?"
    assert not missing, "undocumented proto elements:\n  " + "\n  ".join(missing)


def test_error_codes_state_whether_they_are_retriable(
    descriptor_set: descriptor_pb2.FileDescriptorSet,
) -> None:
    (common,) = [fd for fd in descriptor_set.file if fd.name == "strom/v1/common.proto"]
    (index,) = [i for i, e in enumerate(common.enum_type) if e.name == "ErrorCode"]
    locations = {tuple(loc.path): loc for loc in common.source_code_info.location}
    vague = []
    for i, value in enumerate(common.enum_type[index].value):
        if value.name == "NONE":
            continue
        comment = locations[(_FILE_ENUM, index, _ENUM_VALUE, i)].leading_comments
        if len(re.findall(r"Retriable: (yes|no)", comment)) != 1:
            vague.append(value.name)
    assert not vague, f"ErrorCode comments without exactly one 'Retriable: yes|no': {vague}"


#: Every generated message module of strom's protos.
MODULES = (common_pb2, metadata_pb2, storage_pb2, controller_pb2, coordinator_pb2, records_pb2)


def test_enum_values_are_prefixed_except_error_codes() -> None:
    """proto3 enum values share the package namespace; prefixes keep them from colliding."""
    for module in MODULES:
        for enum in module.DESCRIPTOR.enum_types_by_name.values():
            if enum.full_name == "strom.v1.ErrorCode":
                continue
            prefix = re.sub(r"(?<!^)(?=[A-Z])", "_", enum.name).upper() + "_"
            for value in enum.values:
                assert value.name.startswith(prefix), f"{enum.name}.{value.name} lacks {prefix}"


def test_descriptor_names_stay_under_strom_v1() -> None:
    for module in MODULES:
        assert module.DESCRIPTOR.name.startswith("strom/v1/"), module.DESCRIPTOR.name
        assert module.DESCRIPTOR.package == "strom.v1"


def test_every_proto_names_its_go_and_java_packages() -> None:
    """Found from outside: no .proto set go_package (protoc-gen-go refuses such a file) or the
    Java options, so every Go or Java user had to patch the files. Java's outer classes are
    named *Proto: storage.proto's message Coordinator would clash with coordinator.proto's
    default outer class in one package."""
    for module in MODULES:
        opts = module.DESCRIPTOR.GetOptions()
        stem = Path(module.DESCRIPTOR.name).stem
        assert opts.go_package == "strom/gen/go/strom/v1;stromv1", module.DESCRIPTOR.name
        assert opts.java_package == "strom.v1" and opts.java_multiple_files
        assert opts.java_outer_classname == stem.capitalize() + "Proto"


# ---------------------------------------------------------------------------------------------
# (c) coexistence with etcd3's descriptors


@pytest.mark.parametrize("etcd_first", [True, False], ids=["etcd3-first", "strom-first"])
def test_stubs_import_alongside_etcd3(etcd_first: bool) -> None:
    strom_imports = "\n".join(f"from strom.api import {m}" for m in STUB_MODULES)
    imports = f"import etcd3\n{strom_imports}" if etcd_first else f"{strom_imports}\nimport etcd3"
    script = imports + textwrap.dedent(
        """
        from google.protobuf import descriptor_pool
        pool = descriptor_pool.Default()
        for name in ("rpc.proto", "kv.proto", "auth.proto", "strom/v1/common.proto",
                     "strom/v1/metadata.proto", "strom/v1/storage.proto",
                     "strom/v1/controller.proto", "strom/v1/coordinator.proto",
                     "strom/v1/records.proto"):
            pool.FindFileByName(name)
        etcd3.etcdrpc.RangeRequest(key=b"/strom/x").SerializeToString()
        storage_pb2.ProduceRequest(acks=-1).SerializeToString()
        print("ok")
        """
    )
    proc = subprocess.run(
        [sys.executable, "-c", script],
        cwd=ROOT,
        capture_output=True,
        text=True,
        timeout=60,
        check=False,
    )
    assert proc.returncode == 0 and proc.stdout.strip() == "ok", proc.stdout + proc.stderr


# ---------------------------------------------------------------------------------------------
# (d) round trips and shape


def test_error_codes_exist() -> None:
    E = common_pb2.ErrorCode
    assert E.NONE == 0
    for name in (
        "UNKNOWN_SERVER_ERROR",
        "NOT_LEADER_OR_FOLLOWER",
        "FENCED_LEADER_EPOCH",
        "UNKNOWN_LEADER_EPOCH",
        "OFFSET_OUT_OF_RANGE",
        "CORRUPT_MESSAGE",
        "MESSAGE_TOO_LARGE",
        "NOT_ENOUGH_REPLICAS",
        "NOT_ENOUGH_REPLICAS_AFTER_APPEND",
        "REQUEST_TIMED_OUT",
        "OUT_OF_ORDER_SEQUENCE",
        "DUPLICATE_SEQUENCE",
        "INVALID_PRODUCER_EPOCH",
        "UNKNOWN_PRODUCER_ID",
        "NOT_CONTROLLER",
        "NOT_COORDINATOR",
        "COORDINATOR_LOAD_IN_PROGRESS",
        "COORDINATOR_NOT_AVAILABLE",
        "UNKNOWN_MEMBER_ID",
        "FENCED_MEMBER_EPOCH",
        "STALE_MEMBER_EPOCH",
        "UNKNOWN_TOPIC_OR_PARTITION",
        "TOPIC_ALREADY_EXISTS",
        "INVALID_CONFIG",
        "INVALID_PARTITION_EPOCH",
        "STORAGE_ERROR",
    ):
        assert E.Value(name) > 0, name
    values = [v.number for v in common_pb2.DESCRIPTOR.enum_types_by_name["ErrorCode"].values]
    assert len(values) == len(set(values)), "duplicate ErrorCode numbers"


def test_produce_request_round_trips_batch_bytes() -> None:
    batch = bytes(range(256)) * 4  # stands in for concatenated record batches
    req = storage_pb2.ProduceRequest(
        acks=-1,
        timeout_ms=30_000,
        topics=[
            storage_pb2.ProduceTopicData(
                topic="orders",
                partitions=[
                    storage_pb2.ProducePartitionData(
                        partition=3, records=batch, current_leader_epoch=-1
                    )
                ],
            )
        ],
    )
    parsed = storage_pb2.ProduceRequest.FromString(req.SerializeToString())
    assert parsed == req
    assert parsed.topics[0].partitions[0].records == batch
    assert parsed.topics[0].partitions[0].current_leader_epoch == -1


def test_fetch_response_diverging_epoch_has_presence() -> None:
    part = storage_pb2.FetchPartitionResponse(partition=0, high_watermark=10)
    assert not part.HasField("diverging_epoch")
    part.diverging_epoch.CopyFrom(common_pb2.EpochEndOffset(epoch=2, end_offset=7))
    parsed = storage_pb2.FetchPartitionResponse.FromString(part.SerializeToString())
    assert parsed.HasField("diverging_epoch") and parsed.diverging_epoch.end_offset == 7


def test_partition_state_json_round_trip() -> None:
    """etcd stores metadata as JSON; the write/read conventions of metadata.proto round-trip."""
    state = metadata_pb2.PartitionState(
        replicas=[2, 0, 1],
        leader=-1,
        leader_epoch=0,
        isr=[2, 0],
        partition_epoch=5,
        adding_replicas=[],
        removing_replicas=[1],
        leader_recovery_state=metadata_pb2.LEADER_RECOVERY_STATE_RECOVERING,
        topic_id="0b4a8a34-5c5c-4e0e-9b1f-3f7f2b9b8c11",
    )
    text = json_format.MessageToJson(
        state,
        preserving_proto_field_name=True,
        always_print_fields_with_no_presence=True,
        indent=None,
    )
    assert '"leader": -1' in text and '"leader_epoch": 0' in text
    back = json_format.Parse(text, metadata_pb2.PartitionState())
    assert back == state
    # A newer writer may add fields; older readers must still parse.
    newer = text[:-1] + ', "some_future_field": 42}'
    back = json_format.Parse(newer, metadata_pb2.PartitionState(), ignore_unknown_fields=True)
    assert back == state


def test_topic_metadata_json_keeps_configs_and_int64() -> None:
    topic = metadata_pb2.TopicMetadata(
        topic_id="7d2c",
        name="orders",
        partition_count=6,
        replication_factor=3,
        configs={"retention.ms": "604800000", "cleanup.policy": "delete"},
        created_ms=1_700_000_000_000,
    )
    text = json_format.MessageToJson(topic, preserving_proto_field_name=True)
    assert json_format.Parse(text, metadata_pb2.TopicMetadata()) == topic


def test_group_record_keys_are_deterministic_and_typed() -> None:
    c = coordinator_pb2

    def key(**kind: object) -> bytes:
        return c.GroupRecordKey(**kind).SerializeToString(deterministic=True)

    offset = key(offset_commit=c.OffsetCommitKey(group_id="g", topic="t", partition=0))
    assert offset == key(offset_commit=c.OffsetCommitKey(group_id="g", topic="t", partition=0))
    kinds = {
        offset,
        key(group_metadata=c.GroupMetadataKey(group_id="g")),
        key(target_assignment_metadata=c.TargetAssignmentMetadataKey(group_id="g")),
        key(member_metadata=c.MemberMetadataKey(group_id="g", member_id="m")),
        key(target_assignment_member=c.TargetAssignmentMemberKey(group_id="g", member_id="m")),
        key(current_member_assignment=c.CurrentMemberAssignmentKey(group_id="g", member_id="m")),
    }
    assert len(kinds) == 6, "keys of different kinds collided"
    parsed = c.GroupRecordKey.FromString(offset)
    assert parsed.WhichOneof("kind") == "offset_commit"
    assert parsed.offset_commit.topic == "t"


def test_controller_responses_carry_not_controller_redirect() -> None:
    """Every ControllerService response starts with error_code, error_message, controller."""
    service = controller_pb2.DESCRIPTOR.services_by_name["ControllerService"]
    assert len(service.methods) >= 14
    for method in service.methods:
        fields = method.output_type.fields_by_number
        got = [(n, fields[n].name) for n in (1, 2, 3) if n in fields]
        assert got == [(1, "error_code"), (2, "error_message"), (3, "controller")], method.name
        assert fields[3].message_type.full_name == "strom.v1.Node"


def test_services_expose_the_designed_rpcs() -> None:
    def rpcs(module: object, name: str) -> set[str]:
        return set(module.DESCRIPTOR.services_by_name[name].methods_by_name)  # type: ignore[attr-defined]

    assert rpcs(storage_pb2, "StorageService") == {
        "Produce",
        "Fetch",
        "ProduceStream",
        "FetchStream",
        "ListOffsets",
        "OffsetForLeaderEpoch",
        "DeleteRecords",
        "Metadata",
        "InitProducerId",
        "FindCoordinator",
        "WriteTxnMarkers",
        "DescribeProducers",
    }
    assert {
        "CreateTopics",
        "DeleteTopics",
        "CreatePartitions",
        "DescribeConfigs",
        "AlterConfigs",
        "DescribeCluster",
        "ListTopics",
        "DescribeTopics",
        "AlterPartition",
        "ElectLeaders",
        "AlterPartitionReassignments",
        "ListPartitionReassignments",
        "ControlledShutdown",
        "AllocateProducerIds",
    } <= rpcs(controller_pb2, "ControllerService")
    assert {
        "ConsumerGroupHeartbeat",
        "OffsetCommit",
        "OffsetFetch",
        "ListGroups",
        "DescribeGroups",
        "DeleteGroups",
        "DeleteOffsets",
        "InitProducerId",
        "AddPartitionsToTxn",
        "AddOffsetsToTxn",
        "EndTxn",
        "DescribeTransactions",
        "ListTransactions",
        "TxnOffsetCommit",
        "CompleteTxnOffsets",
    } <= rpcs(coordinator_pb2, "CoordinatorService")
    assert rpcs(records_pb2, "RecordService") == {"ProduceRecords", "Subscribe", "CommitOffsets"}
    assert (
        records_pb2.DESCRIPTOR.services_by_name["RecordService"]
        .methods_by_name["Subscribe"]
        .server_streaming
    )
    for module, service in (
        (storage_pb2_grpc, "StorageService"),
        (controller_pb2_grpc, "ControllerService"),
        (coordinator_pb2_grpc, "CoordinatorService"),
        (records_pb2_grpc, "RecordService"),
    ):
        assert hasattr(module, f"{service}Stub")
        assert hasattr(module, f"add_{service}Servicer_to_server")


def test_messages_pickle_under_their_real_module() -> None:
    """Spark ships objects between processes by pickling; the module path must be importable."""
    msg = common_pb2.TopicPartition(topic="orders", partition=1)
    assert type(msg).__module__ == "strom.api.common_pb2"
    assert pickle.loads(pickle.dumps(msg)) == msg


def test_grpc_round_trip_through_generated_service() -> None:
    """A generated servicer and stub talk over a real (loopback) gRPC channel."""

    class Storage(storage_pb2_grpc.StorageServiceServicer):
        def Produce(
            self, request: storage_pb2.ProduceRequest, context: grpc.ServicerContext
        ) -> storage_pb2.ProduceResponse:
            topic = request.topics[0]
            part = topic.partitions[0]
            return storage_pb2.ProduceResponse(
                topics=[
                    storage_pb2.ProduceTopicResponse(
                        topic=topic.topic,
                        partitions=[
                            storage_pb2.ProducePartitionResponse(
                                partition=part.partition,
                                error_code=common_pb2.NOT_LEADER_OR_FOLLOWER,
                                base_offset=-1,
                                current_leader=common_pb2.LeaderAndEpoch(
                                    leader_id=2, leader_epoch=len(part.records)
                                ),
                            )
                        ],
                    )
                ]
            )

    server = grpc.server(futures.ThreadPoolExecutor(max_workers=2))
    storage_pb2_grpc.add_StorageServiceServicer_to_server(Storage(), server)
    port = server.add_insecure_port("127.0.0.1:0")
    server.start()
    try:
        with grpc.insecure_channel(f"127.0.0.1:{port}") as channel:
            stub = storage_pb2_grpc.StorageServiceStub(channel)
            resp = stub.Produce(
                storage_pb2.ProduceRequest(
                    acks=1,
                    topics=[
                        storage_pb2.ProduceTopicData(
                            topic="t",
                            partitions=[
                                storage_pb2.ProducePartitionData(partition=4, records=b"x" * 9)
                            ],
                        )
                    ],
                ),
                timeout=10,
            )
    finally:
        server.stop(None)
    result = resp.topics[0].partitions[0]
    assert result.partition == 4
    assert result.error_code == common_pb2.NOT_LEADER_OR_FOLLOWER
    assert (result.current_leader.leader_id, result.current_leader.leader_epoch) == (2, 9)
