"""The consumer-group engine is split by what each module holds (strom.coordinator.group,
group_types, group_reconciliation, group_offsets, group_persistence); what others see must
not follow the split: the names they import from ``strom.coordinator.group``, and the
fields and methods the mixins say they take from ``ConsumerGroup``."""

from __future__ import annotations

from strom.coordinator import group, group_types
from strom.coordinator.group import ConsumerGroup
from strom.coordinator.group_offsets import GroupOffsets
from strom.coordinator.group_persistence import GroupPersistence
from strom.coordinator.group_reconciliation import GroupReconciliation
from strom.coordinator.group_types import GroupFields

MIXINS = (GroupReconciliation, GroupOffsets, GroupPersistence)


def test_the_public_names_still_import_from_the_group_module() -> None:
    import strom.coordinator as coordinator

    for name in group.__all__:
        assert getattr(group, name) is not None
    for name in ("GroupState", "MemberState", "GroupConfig", "Member", "HeartbeatResult"):
        assert getattr(group, name) is getattr(group_types, name) is getattr(coordinator, name)
    for name in ("ExpiredMember", "ExpireResult", "OffsetsResult", "JOIN_GROUP_MEMBER_EPOCH"):
        assert getattr(group, name) is getattr(group_types, name)
    assert callable(group.compile_subscription_regex)


def test_every_field_the_mixins_declare_is_one_a_group_has() -> None:
    """The mixins' declared fields (:class:`GroupFields`) are their contract with
    ``ConsumerGroup.__init__``: a name declared there but no longer set (renamed, dropped)
    would fail only on the path that reads it."""
    assert all(issubclass(ConsumerGroup, m) and issubclass(m, GroupFields) for m in MIXINS)
    g = ConsumerGroup("g", now_ms=0)
    missing = [a for a in GroupFields.__annotations__ if not hasattr(g, a)]
    assert not missing, f"GroupFields declares {missing}, which a ConsumerGroup lacks"


def test_the_methods_the_mixins_call_on_the_group_exist() -> None:
    """What the mixins declare under ``TYPE_CHECKING`` (the group's own methods they call)
    is there at run time, on the group and not only as a stub."""
    for name in ("_known_topics", "subscribed_topics", "all_subscribed_topics", "_metadata_record"):
        assert callable(getattr(ConsumerGroup, name))
    g = ConsumerGroup("g", now_ms=0)
    assert g.all_subscribed_topics() == frozenset()
    again = ConsumerGroup.from_snapshot(g.snapshot(), now_ms=1)
    assert isinstance(again, ConsumerGroup) and again.snapshot() == g.snapshot()
