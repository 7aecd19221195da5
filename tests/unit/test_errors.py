"""strom.errors mirrors strom.v1.ErrorCode: every code has an entry, flags match common.proto."""

from __future__ import annotations

import pickle
import re
import subprocess
import sys
from pathlib import Path

import pytest
from google.protobuf import descriptor_pb2

from strom import errors
from strom.api import common_pb2

E = common_pb2.ErrorCode
ALL_CODES = [v.number for v in common_pb2.DESCRIPTOR.enum_types_by_name["ErrorCode"].values]
ROOT = Path(__file__).resolve().parents[2]


def test_every_error_code_has_an_entry_and_an_exception() -> None:
    assert set(errors.ERRORS) == set(ALL_CODES)
    for code in ALL_CODES:
        info = errors.ERRORS[code]
        assert isinstance(info.retriable, bool)
        assert info.description
        if code != E.NONE:
            assert errors.EXCEPTIONS[code].default_code == code
    assert E.NONE not in errors.EXCEPTIONS


@pytest.mark.parametrize(
    ("code", "retriable"),
    [
        (E.NOT_LEADER_OR_FOLLOWER, True),
        (E.FENCED_LEADER_EPOCH, True),
        (E.NOT_ENOUGH_REPLICAS, True),
        (E.REQUEST_TIMED_OUT, True),
        (E.NOT_CONTROLLER, True),
        (E.NOT_COORDINATOR, True),
        (E.COORDINATOR_LOAD_IN_PROGRESS, True),
        (E.UNKNOWN_TOPIC_OR_PARTITION, True),
        (E.OFFSET_OUT_OF_RANGE, False),
        (E.CORRUPT_MESSAGE, False),
        (E.MESSAGE_TOO_LARGE, False),
        (E.INVALID_PRODUCER_EPOCH, False),
        (E.OUT_OF_ORDER_SEQUENCE, False),
        (E.FENCED_MEMBER_EPOCH, False),
        (E.TOPIC_ALREADY_EXISTS, False),
        (E.INVALID_CONFIG, False),
    ],
)
def test_retriable_flags(code: int, retriable: bool) -> None:
    assert errors.is_retriable(code) is retriable
    assert errors.error_for(code).retriable is retriable


def test_flags_match_the_proto_comments(tmp_path: Path) -> None:
    """Each ErrorCode comment in common.proto says 'Retriable: yes|no'; the table must agree."""
    out = tmp_path / "common.fds"
    subprocess.run(
        [
            sys.executable,
            "-m",
            "grpc_tools.protoc",
            f"-I{ROOT / 'protos'}",
            "--include_source_info",
            f"--descriptor_set_out={out}",
            str(ROOT / "protos" / "strom" / "v1" / "common.proto"),
        ],
        check=True,
        capture_output=True,
        timeout=120,
    )
    (fd,) = descriptor_pb2.FileDescriptorSet.FromString(out.read_bytes()).file
    (index,) = [i for i, e in enumerate(fd.enum_type) if e.name == "ErrorCode"]
    comments = {tuple(loc.path): loc.leading_comments for loc in fd.source_code_info.location}
    mismatched = []
    for i, value in enumerate(fd.enum_type[index].value):
        if value.name == "NONE":
            continue
        match = re.search(r"Retriable: (yes|no)", comments[(5, index, 2, i)])
        assert match, f"{value.name} has no 'Retriable:' in its comment"
        if (match.group(1) == "yes") != errors.ERRORS[value.number].retriable:
            mismatched.append(value.name)
    assert not mismatched, f"strom.errors disagrees with common.proto on: {mismatched}"


def test_error_for_returns_the_specific_exception() -> None:
    exc = errors.error_for(E.NOT_LEADER_OR_FOLLOWER, "leader is node 2")
    assert type(exc) is errors.NotLeaderError
    assert isinstance(exc, errors.StromError)
    assert exc.code == E.NOT_LEADER_OR_FOLLOWER
    assert exc.message == "leader is node 2"
    assert str(exc) == "NOT_LEADER_OR_FOLLOWER: leader is node 2"
    assert exc.name == "NOT_LEADER_OR_FOLLOWER"

    # No message: the table's description stands in.
    exc = errors.error_for(E.TOPIC_ALREADY_EXISTS)
    assert type(exc) is errors.TopicAlreadyExistsError
    assert exc.message == errors.ERRORS[E.TOPIC_ALREADY_EXISTS].description

    for code, cls in [
        (E.OFFSET_OUT_OF_RANGE, errors.OffsetOutOfRangeError),
        (E.CORRUPT_MESSAGE, errors.CorruptMessageError),
        (E.MESSAGE_TOO_LARGE, errors.MessageTooLargeError),
        (E.NOT_ENOUGH_REPLICAS, errors.NotEnoughReplicasError),
        (E.REQUEST_TIMED_OUT, errors.RequestTimedOutError),
        (E.UNKNOWN_TOPIC_OR_PARTITION, errors.UnknownTopicOrPartitionError),
        (E.INVALID_CONFIG, errors.InvalidConfigError),
        (E.NOT_CONTROLLER, errors.NotControllerError),
        (E.NOT_COORDINATOR, errors.NotCoordinatorError),
        (E.FENCED_LEADER_EPOCH, errors.FencedLeaderEpochError),
        (E.INVALID_PRODUCER_EPOCH, errors.InvalidProducerEpochError),
        (E.OUT_OF_ORDER_SEQUENCE, errors.OutOfOrderSequenceError),
        (E.FENCED_MEMBER_EPOCH, errors.FencedMemberEpochError),
        (E.UNKNOWN_MEMBER_ID, errors.UnknownMemberIdError),
        (E.INVALID_REQUEST, errors.InvalidRequestError),
    ]:
        assert type(errors.error_for(code)) is cls


def test_none_is_not_an_error() -> None:
    errors.raise_for_error(E.NONE)
    with pytest.raises(ValueError):
        errors.error_for(E.NONE)
    with pytest.raises(errors.NotControllerError):
        errors.raise_for_error(E.NOT_CONTROLLER, "active controller is ctl-1:9093")


def test_unknown_code_from_a_newer_server() -> None:
    exc = errors.error_for(9999)
    assert type(exc) is errors.StromError
    assert exc.code == 9999 and not exc.retriable
    assert exc.name == "UNKNOWN_ERROR_CODE_9999"


def test_client_side_error_has_no_code() -> None:
    exc = errors.StromError("connection refused", retriable=True)
    assert exc.code is None and exc.retriable and exc.name == "CLIENT_ERROR"


def test_exceptions_pickle() -> None:
    """Spark executors and worker processes send exceptions back pickled."""
    for exc in (
        errors.error_for(E.FENCED_MEMBER_EPOCH, "epoch 7 < 9"),
        errors.error_for(9999, "future"),
        errors.StromError("client", retriable=True),
    ):
        back = pickle.loads(pickle.dumps(exc))
        assert type(back) is type(exc)
        assert (back.code, back.retriable, back.message) == (exc.code, exc.retriable, exc.message)


def test_a_commits_refusal_for_a_member_out_of_the_group_is_a_commit_failed_error() -> None:
    """Code ported from Kafka catches CommitFailedException (kafka-python's
    CommitFailedError); code written for strom catches the coordinator's own classes. The
    error a commit raises is both; other refusals are left as they are."""
    import strom

    assert strom.CommitFailedError is errors.CommitFailedError
    for code, cls in (
        (E.UNKNOWN_MEMBER_ID, errors.UnknownMemberIdError),
        (E.FENCED_MEMBER_EPOCH, errors.FencedMemberEpochError),
        (E.STALE_MEMBER_EPOCH, errors.StaleMemberEpochError),
    ):
        exc = errors.commit_failed_error(errors.error_for(code, "member m1 left"))
        assert isinstance(exc, errors.CommitFailedError) and isinstance(exc, cls)
        assert type(exc).__name__ == cls.__name__ and exc.code == code
        assert str(exc) == f"{errors.error_name(code)}: member m1 left"
        assert errors.commit_failed_error(exc) is exc
        assert type(errors.commit_failed_error(cls("again"))) is type(exc)  # one class
        back = pickle.loads(pickle.dumps(exc))
        assert type(back) is type(exc) and back.message == exc.message
    assert errors.EXCEPTIONS[E.UNKNOWN_MEMBER_ID] is errors.UnknownMemberIdError
    other = errors.error_for(E.COORDINATOR_NOT_AVAILABLE)
    assert errors.commit_failed_error(other) is other


def test_refresh_code_sets_are_error_codes() -> None:
    assert errors.METADATA_REFRESH_CODES.issubset(ALL_CODES)
    assert errors.COORDINATOR_REFRESH_CODES.issubset(ALL_CODES)
    assert all(errors.is_retriable(c) for c in errors.COORDINATOR_REFRESH_CODES)


def test_errors_the_clients_raise_on_their_own_are_in_strom_errors() -> None:
    """README: `strom.errors` has every class. GroupListingIncompleteError and
    ProducerCallbackError lived only in client modules (found from outside); they are the
    same classes there still, and a subclass inheriting a code is not the class raised for
    that code."""
    from strom.client.group_admin import GroupListingIncompleteError
    from strom.client.producer import ProducerCallbackError

    assert errors.GroupListingIncompleteError is GroupListingIncompleteError
    assert errors.ProducerCallbackError is ProducerCallbackError
    code = errors.ErrorCode.COORDINATOR_NOT_AVAILABLE
    assert errors.EXCEPTIONS[code] is errors.CoordinatorNotAvailableError
    incomplete = GroupListingIncompleteError("2 shards", groups=["g"], missing_shards=[3])
    assert incomplete.retriable and incomplete.code == code
    assert (incomplete.groups, incomplete.missing_shards) == (["g"], [3])
    assert isinstance(pickle.loads(pickle.dumps(incomplete)), GroupListingIncompleteError)
