"""The decide / compare-and-swap / retry loop (strom.controller.cas), against a fake
versioned store: a dict whose every write bumps a revision, as etcd's mod_revision does."""

from __future__ import annotations

import pytest

from strom.controller.cas import commit_with_retry
from strom.errors import ErrorCode, RequestTimedOutError, UnknownTopicOrPartitionError


class FakeStore:
    """Keys with a mod_revision; ``txn`` writes only if every compared revision still holds."""

    def __init__(self) -> None:
        self.revision = 0
        self.data: dict[str, tuple[int, int]] = {}  # key -> (mod_revision, value)
        self.commits = 0

    def get(self, key: str) -> tuple[int, int] | None:
        return self.data.get(key)

    def put(self, key: str, value: int) -> None:
        self.revision += 1
        self.data[key] = (self.revision, value)

    def txn(self, key: str, expected_revision: int, value: int) -> bool:
        current = self.data.get(key)
        if (current[0] if current else 0) != expected_revision:
            return False
        self.put(key, value)
        self.commits += 1
        return True


def increment(store: FakeStore, key: str, *, interfere: int = 0, attempts: int = 5):
    """Add one to ``key``; another writer bumps it during the first ``interfere`` attempts."""
    rounds = {"decide": 0}

    def decide() -> tuple[int, int]:
        rounds["decide"] += 1
        current = store.get(key)
        rev, value = current if current else (0, 0)
        if rounds["decide"] <= interfere:
            store.put(key, value + 100)  # someone else writes between our read and commit
        return rev, value + 1

    def commit(decision: tuple[int, int]) -> bool:
        rev, new = decision
        return store.txn(key, rev, new)

    result = commit_with_retry(decide, commit, attempts=attempts, gave_up=f"{key} kept changing")
    return result, rounds["decide"]


def test_commits_first_time_without_conflict() -> None:
    store = FakeStore()
    store.put("k", 7)
    (_, new), rounds = increment(store, "k")
    assert new == 8 and rounds == 1
    assert store.get("k") == (2, 8) and store.commits == 1


def test_conflict_rereads_and_decides_again() -> None:
    store = FakeStore()
    store.put("k", 1)
    (_, new), rounds = increment(store, "k", interfere=2)
    # Two interfering writes made the value 101 then 201; the third round read 201.
    assert rounds == 3 and new == 202
    assert store.get("k")[1] == 202 and store.commits == 1


def test_gives_up_after_the_bound_with_request_timed_out() -> None:
    store = FakeStore()
    store.put("k", 1)
    with pytest.raises(RequestTimedOutError) as info:
        increment(store, "k", interfere=10, attempts=4)
    assert info.value.code == ErrorCode.REQUEST_TIMED_OUT
    assert info.value.message == "k kept changing"
    assert store.commits == 0  # nothing of ours was written


def test_decide_error_ends_the_loop_at_once() -> None:
    calls = {"decide": 0, "commit": 0}

    def decide() -> int:
        calls["decide"] += 1
        raise UnknownTopicOrPartitionError("topic 't' does not exist")

    def commit(_: int) -> bool:
        calls["commit"] += 1
        return True

    with pytest.raises(UnknownTopicOrPartitionError):
        commit_with_retry(decide, commit, attempts=5, gave_up="unused")
    assert calls == {"decide": 1, "commit": 0}


def test_commit_error_propagates_without_retry() -> None:
    class Fenced(Exception):
        pass

    calls = {"decide": 0}

    def decide() -> int:
        calls["decide"] += 1
        return 1

    def commit(_: int) -> bool:
        raise Fenced()

    with pytest.raises(Fenced):
        commit_with_retry(decide, commit, attempts=5, gave_up="unused")
    assert calls["decide"] == 1


def test_a_decision_needing_no_write_commits_trivially() -> None:
    # A validate-only request: decide checks, commit writes nothing and reports success.
    store = FakeStore()
    result = commit_with_retry(lambda: "checked", lambda _: True, attempts=1, gave_up="unused")
    assert result == "checked" and store.commits == 0


def test_attempts_must_be_positive() -> None:
    with pytest.raises(ValueError, match="attempts must be at least 1"):
        commit_with_retry(lambda: 1, lambda _: True, attempts=0, gave_up="unused")
