"""FindCoordinator from an etcd view, the coordinator CLI flags and small service helpers."""

from __future__ import annotations

import argparse
from types import SimpleNamespace

import pytest

from strom.api import coordinator_pb2, storage_pb2
from strom.api import metadata_pb2 as md
from strom.coordinator.cli import add_arguments
from strom.coordinator.group_rpcs import _assignment_pb, _client_host
from strom.coordinator.lookup import find_coordinator, shard_count
from strom.coordinator.offsets_log import ShardState, shard_for_group
from strom.coordinator.shard_ownership import FENCE_KEY
from strom.errors import ErrorCode as E
from strom.metadata import ClusterView, Keys, Versioned


def _view(partitions: int | None, owners: dict[int, str]) -> ClusterView:
    view = ClusterView(SimpleNamespace(keys=Keys("t")))  # type: ignore[arg-type]
    if partitions is not None:
        meta = md.TopicMetadata(name="__consumer_offsets", partition_count=partitions)
        view.topics["__consumer_offsets"] = Versioned("k", meta, 1, 1)
    for shard, addr in owners.items():
        host, port = addr.split(":")
        owner = md.CoordinatorShardOwner(shard=shard, coordinator_id=7, host=host, port=int(port))
        view.coordinators[shard] = Versioned(f"c/{shard}", owner, 1, 1)
    return view


def _ask(view: ClusterView, *keys: str, **kw: object) -> storage_pb2.FindCoordinatorResponse:
    return find_coordinator(view, storage_pb2.FindCoordinatorRequest(keys=list(keys)), **kw)  # type: ignore[arg-type]


def test_the_owner_of_the_groups_shard_is_the_answer() -> None:
    view = _view(4, {s: f"10.0.0.{s}:9094" for s in range(4)})
    resp = _ask(view, "orders", "billing")
    assert [c.key for c in resp.coordinators] == ["orders", "billing"]
    for c in resp.coordinators:
        shard = shard_for_group(c.key, 4)
        assert c.error_code == E.NONE and c.shard == shard
        assert (c.node.node_id, c.node.host, c.node.port) == (7, f"10.0.0.{shard}", 9094)


def test_unowned_shards_and_a_missing_topic_are_not_available() -> None:
    shard = shard_for_group("g", 4)
    view = _view(4, {s: "h:1" for s in range(4) if s != shard})
    (c,) = _ask(view, "g").coordinators
    assert c.error_code == E.COORDINATOR_NOT_AVAILABLE and c.node.node_id == -1
    assert c.shard == shard
    (c,) = _ask(_view(None, {}), "g").coordinators
    assert c.error_code == E.COORDINATOR_NOT_AVAILABLE and c.shard == -1
    assert shard_count(_view(None, {}), 8) == 8 and shard_count(view) == 4


def test_all_shards_answers_every_shard_with_its_owner_or_none() -> None:
    """What `strom groups list` fans out to without DescribeCluster (found from outside: that
    needed DESCRIBE on the cluster, though ListGroups answers per group)."""
    view = _view(3, {0: "h:1", 2: "h:2"})
    every = storage_pb2.FindCoordinatorRequest(all_shards=True)
    resp = find_coordinator(view, every)
    assert [(c.shard, c.error_code, c.node.port) for c in resp.coordinators] == [
        (0, E.NONE, 1),
        (1, E.COORDINATOR_NOT_AVAILABLE, 0),
        (2, E.NONE, 2),
    ]
    assert resp.coordinators[1].node.node_id == -1
    assert not find_coordinator(_view(None, {}), every).coordinators  # no coordinator ran yet
    # Keys with it: a clear refusal per key, not a silent choice of one of the two.
    mixed = find_coordinator(view, storage_pb2.FindCoordinatorRequest(all_shards=True, keys=["g"]))
    assert [(c.key, c.error_code) for c in mixed.coordinators] == [("g", E.INVALID_REQUEST)]
    assert "name no keys" in mixed.coordinators[0].error_message


def test_bad_keys_are_refused_per_key() -> None:
    view = _view(2, {0: "h:1", 1: "h:1"})
    resp = _ask(view, "", "ok")
    assert [c.error_code for c in resp.coordinators] == [E.INVALID_GROUP_ID, E.NONE]
    txn = find_coordinator(
        view,
        storage_pb2.FindCoordinatorRequest(
            key_type=storage_pb2.COORDINATOR_TYPE_TRANSACTION, keys=["", "t"]
        ),
    )
    # Transactional ids live in __transaction_state, which this view does not have yet.
    assert [c.error_code for c in txn.coordinators] == [
        E.INVALID_REQUEST,
        E.COORDINATOR_NOT_AVAILABLE,
    ]


def test_transactional_ids_are_found_in_the_transaction_state_shards() -> None:
    view = _view(2, {0: "g:1", 1: "g:1"})
    meta = md.TopicMetadata(name="__transaction_state", partition_count=3)
    view.topics["__transaction_state"] = Versioned("k", meta, 1, 1)
    for shard in range(3):
        owner = md.CoordinatorShardOwner(shard=shard, coordinator_id=9, host="tx", port=shard)
        view.txn_coordinators[shard] = Versioned(f"t/{shard}", owner, 1, 1)
    (c,) = find_coordinator(
        view,
        storage_pb2.FindCoordinatorRequest(
            key_type=storage_pb2.COORDINATOR_TYPE_TRANSACTION, keys=["pipeline-1"]
        ),
    ).coordinators
    assert c.error_code == E.NONE and c.shard == shard_for_group("pipeline-1", 3)
    assert (c.node.host, c.node.port) == ("tx", c.shard)


def test_coordinator_flags_have_kafka_like_defaults() -> None:
    parser = argparse.ArgumentParser()
    add_arguments(parser)
    args = parser.parse_args(["--etcd", "127.0.0.1:2379"])
    assert args.listen == "0.0.0.0:9094" and args.metrics_port == 9104
    assert args.offsets_partitions == 8 and args.group_session_timeout_ms == 45_000
    with pytest.raises(SystemExit):
        parser.parse_args(["--etcd", "127.0.0.1:2379", "--session-timeout-s", "1"])


def test_service_helpers() -> None:
    assert _client_host("ipv4:127.0.0.1:5555") == "127.0.0.1"
    assert _client_host("ipv6:[::1]:5555") == "::1"
    assert _client_host(None) == ""
    a = _assignment_pb({"b": [2, 0], "a": [1], "empty": []})
    assert [(tp.topic, list(tp.partitions)) for tp in a.topic_partitions] == [
        ("a", [1]),
        ("b", [0, 2]),
    ]
    assert isinstance(a, coordinator_pb2.Assignment)


def test_the_fence_record_is_skipped_on_replay() -> None:
    state = ShardState()
    state.apply(FENCE_KEY, b"anything")
    assert state.groups == {} and state.skipped == 1
