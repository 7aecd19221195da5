"""Server-side assignors (strom.coordinator.assignors): exactly-once coverage, eligibility,
balance, stickiness on joins and leaves, determinism, and Kafka's range semantics."""

from __future__ import annotations

import random
import time
from collections.abc import Mapping

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from strom.coordinator.assignors import (
    ASSIGNORS,
    DEFAULT_ASSIGNOR,
    Assignment,
    MemberSpec,
    RangeAssignor,
    UniformAssignor,
    get_assignor,
)
from strom.errors import ErrorCode, UnsupportedAssignorError

uniform = UniformAssignor()
range_ = RangeAssignor()


def _owners(result: Mapping[str, Assignment]) -> dict[tuple[str, int], list[str]]:
    out: dict[tuple[str, int], list[str]] = {}
    for mid, by_topic in result.items():
        for t, ps in by_topic.items():
            assert ps == sorted(set(ps)), "partitions must be ascending, no duplicates"
            for p in ps:
                out.setdefault((t, p), []).append(mid)
    return out


def _count(a: Assignment) -> int:
    return sum(len(ps) for ps in a.values())


def _check_valid(
    members: list[MemberSpec], topics: Mapping[str, int], result: Mapping[str, Assignment]
) -> None:
    assert set(result) == {m.member_id for m in members}
    subs = {m.member_id: m.topics for m in members}
    owners = _owners(result)
    for t, n in topics.items():
        subscribed = any(t in m.topics for m in members)
        for p in range(n):
            got = owners.get((t, p), [])
            if subscribed:
                assert len(got) == 1, f"{t}-{p} assigned to {got}"
                assert t in subs[got[0]], f"{t}-{p} given to non-subscriber {got[0]}"
            else:
                assert got == []
    for t, p in owners:
        assert t in topics and 0 <= p < topics[t]


def _specs(
    subs: Mapping[str, set[str]], current: Mapping[str, Assignment] | None = None
) -> list[MemberSpec]:
    current = current or {}
    return [
        MemberSpec(mid, frozenset(ts), current.get(mid, {})) for mid, ts in sorted(subs.items())
    ]


topics_st = st.dictionaries(
    st.sampled_from(["a", "b", "c", "d"]), st.integers(0, 12), min_size=1, max_size=4
)
member_ids_st = st.lists(
    st.text("mnopqrstuvwxyz0123456789", min_size=1, max_size=6), min_size=1, max_size=9, unique=True
)


@settings(max_examples=60, deadline=None)
@given(topics=topics_st, ids=member_ids_st, data=st.data())
def test_every_subscribed_partition_assigned_exactly_once(
    topics: dict[str, int], ids: list[str], data: st.DataObject
) -> None:
    names = [*sorted(topics), "missing"]
    subs = {
        mid: set(data.draw(st.lists(st.sampled_from(names), max_size=len(names)))) for mid in ids
    }
    for assignor in (uniform, range_):
        first = assignor.assign(_specs(subs), topics)
        _check_valid(_specs(subs), topics, first)
        # and again from a random (even invalid) current assignment
        junk = {
            mid: {t: data.draw(st.lists(st.integers(-1, 14), max_size=5)) for t in names}
            for mid in ids
        }
        second = assignor.assign(_specs(subs, junk), topics)
        _check_valid(_specs(subs, junk), topics, second)


@settings(max_examples=60, deadline=None)
@given(topics=topics_st, ids=member_ids_st, data=st.data())
def test_uniform_is_balanced_with_equal_subscriptions(
    topics: dict[str, int], ids: list[str], data: st.DataObject
) -> None:
    sub = set(data.draw(st.lists(st.sampled_from(sorted(topics)), min_size=1)))
    subs = {mid: sub for mid in ids}
    # From scratch, and from an arbitrary (unbalanced) current assignment.
    junk = {
        mid: {t: data.draw(st.lists(st.integers(0, 12), max_size=12)) for t in sub} for mid in ids
    }
    for current in ({}, junk):
        result = uniform.assign(_specs(subs, current), topics)
        _check_valid(_specs(subs, current), topics, result)
        counts = [_count(result[mid]) for mid in ids]
        assert max(counts) - min(counts) <= 1, counts
        total = sum(topics[t] for t in sub)
        assert sum(counts) == total


@settings(max_examples=60, deadline=None)
@given(topics=topics_st, ids=member_ids_st, data=st.data())
def test_uniform_leave_moves_only_the_leavers_partitions(
    topics: dict[str, int], ids: list[str], data: st.DataObject
) -> None:
    sub = set(sorted(topics))
    subs = {mid: sub for mid in ids}
    before = uniform.assign(_specs(subs), topics)
    leaver = data.draw(st.sampled_from(ids))
    rest = {mid: sub for mid in ids if mid != leaver}
    after = uniform.assign(_specs(rest, before), topics)
    _check_valid(_specs(rest), topics, after)
    for mid in rest:
        for t, ps in before[mid].items():
            assert set(ps) <= set(after[mid].get(t, [])), f"{mid} lost {t} partitions"
    if rest:
        counts = [_count(after[mid]) for mid in rest]
        assert max(counts) - min(counts) <= 1


@settings(max_examples=60, deadline=None)
@given(topics=topics_st, ids=member_ids_st, new=st.text("abcdefghijkl", min_size=1, max_size=6))
def test_uniform_join_moves_only_what_balance_requires(
    topics: dict[str, int], ids: list[str], new: str
) -> None:
    sub = set(topics)
    subs = {mid: sub for mid in ids}
    before = uniform.assign(_specs(subs), topics)
    joined = {**subs, new: sub}
    after = uniform.assign(_specs(joined, before), topics)
    _check_valid(_specs(joined), topics, after)
    total = sum(topics.values())
    n = len(joined)
    # Old members only give partitions away (never to each other), and the newcomer gets no
    # more than its fair share: so every moved partition was needed for balance.
    for mid in ids:
        for t, ps in after[mid].items():
            assert set(ps) <= set(before[mid].get(t, []))
    moved = sum(_count(before[mid]) - _count(after[mid]) for mid in ids)
    assert moved == _count(after[new])
    assert total // n <= _count(after[new]) <= -(-total // n)


@settings(max_examples=50, deadline=None)
@given(topics=topics_st, ids=member_ids_st, data=st.data())
def test_deterministic_whatever_the_input_order(
    topics: dict[str, int], ids: list[str], data: st.DataObject
) -> None:
    names = sorted(topics)
    subs = {mid: set(data.draw(st.lists(st.sampled_from(names), min_size=1))) for mid in ids}
    for assignor in (uniform, range_):
        first = assignor.assign(_specs(subs), topics)
        specs = _specs(subs, first)
        again = assignor.assign(list(reversed(specs)), dict(reversed(list(topics.items()))))
        assert again == assignor.assign(specs, topics)
        shuffled = specs[:]
        random.Random(7).shuffle(shuffled)
        assert assignor.assign(shuffled, topics) == again


@settings(max_examples=50, deadline=None)
@given(topics=topics_st, ids=member_ids_st, data=st.data())
def test_uniform_is_stable_when_nothing_changes(
    topics: dict[str, int], ids: list[str], data: st.DataObject
) -> None:
    names = sorted(topics)
    subs = {mid: set(data.draw(st.lists(st.sampled_from(names), min_size=1))) for mid in ids}
    first = uniform.assign(_specs(subs), topics)
    assert uniform.assign(_specs(subs, first), topics) == first


def test_uniform_members_beyond_partition_count_are_idle() -> None:
    subs = {f"m{i}": {"t"} for i in range(5)}
    result = uniform.assign(_specs(subs), {"t": 4})
    counts = sorted(_count(a) for a in result.values())
    assert counts == [0, 1, 1, 1, 1]
    assert sum(1 for a in result.values() if a == {}) == 1


def test_uniform_heterogeneous_subscriptions() -> None:
    # m1 alone reads "x"; "y" is shared. Balance puts y's partitions on m2 and m3 mostly.
    subs = {"m1": {"x", "y"}, "m2": {"y"}, "m3": {"y"}}
    topics = {"x": 3, "y": 3}
    result = uniform.assign(_specs(subs), topics)
    _check_valid(_specs(subs), topics, result)
    assert result["m1"] == {"x": [0, 1, 2]}
    assert _count(result["m2"]) + _count(result["m3"]) == 3
    assert {_count(result["m2"]), _count(result["m3"])} == {1, 2}


def test_uniform_ignores_duplicate_claims_and_keeps_the_first() -> None:
    current = {"m1": {"t": [0, 1]}, "m2": {"t": [1, 2]}}
    result = uniform.assign(_specs({"m1": {"t"}, "m2": {"t"}}, current), {"t": 4})
    assert result == {"m1": {"t": [0, 1]}, "m2": {"t": [2, 3]}}


def test_range_matches_kafka() -> None:
    # Kafka's RangeAssignor docs: 2 consumers, 2 topics of 3 partitions each.
    subs = {"C0": {"t0", "t1"}, "C1": {"t0", "t1"}}
    result = range_.assign(_specs(subs), {"t0": 3, "t1": 3})
    assert result == {"C0": {"t0": [0, 1], "t1": [0, 1]}, "C1": {"t0": [2], "t1": [2]}}
    # Ranges are per topic over that topic's subscribers only.
    subs = {"a": {"t0"}, "b": {"t0", "t1"}, "c": {"t1"}}
    result = range_.assign(_specs(subs), {"t0": 5, "t1": 2})
    assert result == {"a": {"t0": [0, 1, 2]}, "b": {"t0": [3, 4], "t1": [0]}, "c": {"t1": [1]}}
    # Members beyond the partition count get nothing.
    subs = {f"m{i}": {"t"} for i in range(4)}
    result = range_.assign(_specs(subs), {"t": 2})
    assert result == {"m0": {"t": [0]}, "m1": {"t": [1]}, "m2": {}, "m3": {}}


@settings(max_examples=50, deadline=None)
@given(topics=topics_st, ids=member_ids_st)
def test_range_ranges_are_contiguous_and_sized_like_kafka(
    topics: dict[str, int], ids: list[str]
) -> None:
    subs = {mid: set(topics) for mid in ids}
    result = range_.assign(_specs(subs), topics)
    for t, n in topics.items():
        start = 0
        per, extra = divmod(n, len(ids))
        for i, mid in enumerate(sorted(ids)):
            size = per + (1 if i < extra else 0)
            assert result[mid].get(t, []) == list(range(start, start + size))
            start += size


def test_get_assignor() -> None:
    assert get_assignor(None).name == DEFAULT_ASSIGNOR == "uniform"
    assert get_assignor("range") is ASSIGNORS["range"]
    with pytest.raises(UnsupportedAssignorError) as exc:
        get_assignor("cooperative-sticky")
    assert exc.value.code == ErrorCode.UNSUPPORTED_ASSIGNOR


def test_uniform_is_fast_enough_for_large_groups() -> None:
    # Not a benchmark: a guard against an accidental quadratic blow-up.
    topics = {f"t{i}": 100 for i in range(10)}
    subs = {f"m{i:03d}": set(topics) for i in range(100)}
    t0 = time.perf_counter()
    first = uniform.assign(_specs(subs), topics)
    subs["m999"] = set(topics)
    second = uniform.assign(_specs(subs, first), topics)
    assert time.perf_counter() - t0 < 2.0
    counts = [_count(a) for a in second.values()]
    assert max(counts) - min(counts) <= 1
