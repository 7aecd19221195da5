"""Admin-request validation (strom.controller.validation) and topic config semantics
(strom.controller.configs): each failure maps to the right ErrorCode with a message that names
what is wrong. Pure and fast."""

from __future__ import annotations

import pytest

from strom.api import controller_pb2 as pb
from strom.controller.configs import apply_config_ops, describe_topic_configs
from strom.controller.validation import (
    MAX_PARTITIONS,
    colliding_topic,
    is_internal_topic,
    resolve_partition_count,
    resolve_replication_factor,
    validate_assignments,
    validate_new_topic,
    validate_partition_increase,
    validate_topic_configs,
    validate_topic_name,
)
from strom.errors import ErrorCode, StromError
from strom.log.config import CONFIG_KEYS

E = ErrorCode


def _code(fn, *args, **kwargs) -> tuple[int, str]:  # type: ignore[no-untyped-def]
    with pytest.raises(StromError) as info:
        fn(*args, **kwargs)
    assert info.value.code is not None
    return info.value.code, info.value.message


# -- names ------------------------------------------------------------------------------------


@pytest.mark.parametrize("name", ["a", "orders", "a.b_c-D9", "x" * 249, "..a", "_x", "a__"])
def test_valid_names(name: str) -> None:
    validate_topic_name(name)


@pytest.mark.parametrize(
    ("name", "fragment"),
    [
        ("", "empty"),
        (".", "cannot be '.'"),
        ("..", "cannot be '..'"),
        ("x" * 250, "250 characters long; at most 249"),
        ("a b", "invalid characters ' '"),
        ("a/b", "invalid characters '/'"),
        ("caf\u00e9", "invalid characters '\u00e9'"),
        ("a:b:c", "invalid characters ':'"),
        ("__consumer_offsets", "reserved for strom's internal topics"),
    ],
)
def test_invalid_names(name: str, fragment: str) -> None:
    code, message = _code(validate_topic_name, name)
    assert code == E.INVALID_TOPIC
    assert fragment in message


def test_internal_names_need_the_flag() -> None:
    validate_topic_name("__consumer_offsets", allow_internal=True)
    assert is_internal_topic("__consumer_offsets") and not is_internal_topic("_x")


def test_collisions_between_dot_and_underscore() -> None:
    assert colliding_topic("a.b", ["a_b", "c"]) == "a_b"
    assert colliding_topic("a_b", ["a.b"]) == "a.b"
    assert colliding_topic("a.b", ["a.b", "ab"]) is None


# -- counts -----------------------------------------------------------------------------------


def test_partition_counts() -> None:
    assert resolve_partition_count(-1, 3) == 3
    assert resolve_partition_count(5, 3) == 5
    assert resolve_partition_count(MAX_PARTITIONS, 1) == MAX_PARTITIONS
    for bad in (0, -2):
        code, message = _code(resolve_partition_count, bad, 1)
        assert code == E.INVALID_PARTITIONS and str(bad) in message
    code, message = _code(resolve_partition_count, MAX_PARTITIONS + 1, 1)
    assert code == E.INVALID_PARTITIONS and "maximum" in message


def test_replication_factors() -> None:
    assert resolve_replication_factor(-1, 2) == 2
    assert resolve_replication_factor(3, 2) == 3
    for bad in (0, -5, 1000):
        code, _ = _code(resolve_replication_factor, bad, 1)
        assert code == E.INVALID_REPLICATION_FACTOR


def test_partition_increase() -> None:
    validate_partition_increase("t", 3, 4)
    for bad in (3, 2):
        code, message = _code(validate_partition_increase, "t", 3, bad)
        assert code == E.INVALID_PARTITIONS and "has 3 partitions" in message
    code, _ = _code(validate_partition_increase, "t", 3, MAX_PARTITIONS + 1)
    assert code == E.INVALID_PARTITIONS


# -- configs ----------------------------------------------------------------------------------


def test_configs_are_normalised_and_errors_name_the_key() -> None:
    assert validate_topic_configs(
        {"retention.ms": " 1000 ", "unclean.leader.election.enable": "TRUE"}
    ) == {
        "retention.ms": "1000",
        "unclean.leader.election.enable": "true",
    }
    code, message = _code(validate_topic_configs, {"retention.ms": "soon"})
    assert code == E.INVALID_CONFIG and "retention.ms" in message
    code, message = _code(validate_topic_configs, {"no.such.key": "1"})
    assert code == E.INVALID_CONFIG and "no.such.key" in message
    code, message = _code(validate_topic_configs, {"cleanup.policy": "shred"})
    assert code == E.INVALID_CONFIG and "cleanup.policy" in message


# -- manual assignments -----------------------------------------------------------------------


def test_assignments_valid() -> None:
    got = validate_assignments(
        [(1, [2, 3]), (0, [1, 2])], first_partition=0, count=2, live_nodes={1, 2, 3}
    )
    assert got == [[1, 2], [2, 3]]
    got = validate_assignments(
        [(3, [1])], first_partition=3, count=1, live_nodes={1}, replication_factor=1
    )
    assert got == [[1]]


@pytest.mark.parametrize(
    ("assignments", "fragment"),
    [
        ([(0, [1, 2])], "no assignment for partition(s) 1"),
        ([(0, [1]), (0, [2]), (1, [1])], "partition 0 is assigned twice"),
        ([(0, [1]), (5, [2])], "outside the expected range"),
        ([(0, []), (1, [1])], "partition 0 has no replicas"),
        ([(0, [1, 1]), (1, [1, 2])], "lists node 1 more than once"),
        ([(0, [1, 9]), (1, [1, 2])], "names node 9, which is not a live node"),
        ([(0, [1, 2]), (1, [1])], "partition 1 has 1 replicas but 2 are expected"),
    ],
)
def test_assignments_invalid(assignments: list, fragment: str) -> None:
    code, message = _code(
        validate_assignments, assignments, first_partition=0, count=2, live_nodes={1, 2, 3}
    )
    assert code == E.INVALID_REPLICA_ASSIGNMENT
    assert fragment in message


def test_assignments_of_new_partitions_say_keys_are_partition_numbers() -> None:
    """Found from outside: growing a topic from 1 to 3 partitions with {0: [3], 1: [2]}
    (0-based among the new ones) was refused with the range alone; the error now says the
    keys are the new partitions' own numbers."""
    code, message = _code(
        validate_assignments,
        [(0, [3]), (1, [2])],
        first_partition=1,
        count=2,
        live_nodes={1, 2, 3},
        replication_factor=1,
    )
    assert code == E.INVALID_REPLICA_ASSIGNMENT
    assert "outside the expected range 1..2" in message
    assert "already has partitions 0..0" in message and "by its partition number" in message


def test_assignments_must_match_the_topic_rf() -> None:
    code, message = _code(
        validate_assignments,
        [(2, [1])],
        first_partition=2,
        count=1,
        live_nodes={1, 2},
        replication_factor=2,
    )
    assert code == E.INVALID_REPLICA_ASSIGNMENT and "2 are expected" in message


# -- whole CreateTopics items -----------------------------------------------------------------


def test_new_topic_defaults_and_overrides() -> None:
    t = validate_new_topic(
        "t",
        -1,
        -1,
        [],
        {"retention.ms": "5"},
        live_nodes={1},
        default_partitions=4,
        default_replication_factor=2,
    )
    assert (t.num_partitions, t.replication_factor, t.configs) == (4, 2, {"retention.ms": "5"})
    assert t.assignments is None and not t.internal
    t = validate_new_topic("t", -1, -1, [(0, [2, 1])], {}, live_nodes={1, 2})
    assert (t.num_partitions, t.replication_factor, t.assignments) == (1, 2, [[2, 1]])
    t = validate_new_topic("__x", 1, 1, [], {}, live_nodes={1}, allow_internal=True)
    assert t.internal


def test_new_topic_errors_in_order() -> None:
    assert _code(validate_new_topic, "a b", 0, 0, [], {}, live_nodes={1})[0] == E.INVALID_TOPIC
    assert _code(validate_new_topic, "t", 0, 1, [], {}, live_nodes={1})[0] == E.INVALID_PARTITIONS
    assert (
        _code(validate_new_topic, "t", 1, 0, [], {}, live_nodes={1})[0]
        == E.INVALID_REPLICATION_FACTOR
    )
    code, message = _code(validate_new_topic, "t", 2, -1, [(0, [1])], {}, live_nodes={1})
    assert code == E.INVALID_REQUEST and "must be -1" in message
    code, message = _code(validate_new_topic, "t", 1, 1, [], {"segment.bytes": "1"}, live_nodes={1})
    assert code == E.INVALID_CONFIG and "segment.bytes" in message


# -- describe / alter configs -----------------------------------------------------------------


def test_describe_marks_defaults_and_overrides() -> None:
    entries = describe_topic_configs({"retention.ms": "1000"})
    assert [e.name for e in entries] == sorted(CONFIG_KEYS)
    by_name = {e.name: e for e in entries}
    assert by_name["retention.ms"].value == "1000"
    assert by_name["retention.ms"].source == pb.CONFIG_SOURCE_TOPIC
    assert by_name["cleanup.policy"].value == "delete"
    assert by_name["cleanup.policy"].source == pb.CONFIG_SOURCE_DEFAULT
    assert by_name["unclean.leader.election.enable"].value == "false"
    assert not by_name["cleanup.policy"].documentation
    some = describe_topic_configs({}, ["segment.ms", "nope"], include_documentation=True)
    assert [e.name for e in some] == ["segment.ms"] and some[0].documentation


def test_alter_set_delete_append_subtract() -> None:
    S, D, A, U = (
        pb.ALTER_CONFIG_OP_SET,
        pb.ALTER_CONFIG_OP_DELETE,
        pb.ALTER_CONFIG_OP_APPEND,
        pb.ALTER_CONFIG_OP_SUBTRACT,
    )
    cur = {"retention.ms": "1000", "segment.ms": "60000"}
    got = apply_config_ops(cur, [("retention.ms", S, "2000"), ("segment.ms", D, None)])
    assert got == {"retention.ms": "2000"}
    assert cur == {"retention.ms": "1000", "segment.ms": "60000"}  # input untouched
    # APPEND starts from the default when there is no override ("delete").
    assert apply_config_ops({}, [("cleanup.policy", A, "compact")]) == {
        "cleanup.policy": "delete,compact"
    }
    assert apply_config_ops(
        {"cleanup.policy": "delete,compact"}, [("cleanup.policy", U, "delete")]
    ) == {"cleanup.policy": "compact"}
    assert apply_config_ops({}, [("retention.ms", D, None)]) == {}


def test_alter_stores_cleanup_policy_without_repeats() -> None:
    """Found from outside: AlterConfigs SET cleanup.policy=compact,compact stored the repeat."""
    S, A = pb.ALTER_CONFIG_OP_SET, pb.ALTER_CONFIG_OP_APPEND
    assert apply_config_ops({}, [("cleanup.policy", S, "compact,compact")]) == {
        "cleanup.policy": "compact"
    }
    assert apply_config_ops({}, [("cleanup.policy", A, "compact,compact, delete")]) == {
        "cleanup.policy": "delete,compact"
    }


def test_alter_errors() -> None:
    S, A = pb.ALTER_CONFIG_OP_SET, pb.ALTER_CONFIG_OP_APPEND
    code, message = _code(apply_config_ops, {}, [("retention.ms", S, "x")])
    assert code == E.INVALID_CONFIG and "retention.ms" in message
    code, message = _code(apply_config_ops, {}, [("bogus", S, "1")])
    assert code == E.INVALID_CONFIG and "bogus" in message
    code, message = _code(apply_config_ops, {}, [("retention.ms", S, None)])
    assert code == E.INVALID_CONFIG and "needs a value" in message
    code, message = _code(apply_config_ops, {}, [("retention.ms", A, "1")])
    assert code == E.INVALID_CONFIG and "not a list" in message
    code, message = _code(
        apply_config_ops, {}, [("retention.ms", S, "1"), ("retention.ms", S, "2")]
    )
    assert code == E.INVALID_REQUEST and "more than once" in message
    code, _ = _code(apply_config_ops, {}, [("retention.ms", 9, "1")])
    assert code == E.INVALID_REQUEST
    # Subtracting every policy leaves an invalid empty value: all or nothing.
    code, message = _code(
        apply_config_ops,
        {"cleanup.policy": "delete"},
        [("cleanup.policy", pb.ALTER_CONFIG_OP_SUBTRACT, "delete")],
    )
    assert code == E.INVALID_CONFIG and "cleanup.policy" in message
