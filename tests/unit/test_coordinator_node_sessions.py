"""The coordinator's record of live storage node registrations (strom.coordinator.node_sessions),
which fences the group members a node runs for RecordService streams once its registration
ends."""

from __future__ import annotations

from strom.coordinator.node_sessions import NodeSessions
from strom.metadata import WatchEvent
from strom.metadata.view import RESYNC

PREFIX = "/strom/c/nodes/"


def put(node: int) -> WatchEvent:
    return WatchEvent(f"{PREFIX}{node}", b"x", 1)


def delete(node: int) -> WatchEvent:
    return WatchEvent(f"{PREFIX}{node}", None, 2)


def test_a_registration_keeps_its_session_until_it_ends() -> None:
    s = NodeSessions()
    s.update(PREFIX, [RESYNC], {1: "a", 2: "b"})
    one, two = s.session_of(1, "a"), s.session_of(2, "b")
    assert one is not None and two is not None and one != two
    assert s.session_of(1, "b") is None and s.session_of(3, "a") is None
    s.update(PREFIX, [put(1)], {1: "a", 2: "b"})  # a state change (RUNNING): same session
    assert s.live() == {1: one, 2: two}
    s.update(PREFIX, [delete(2)], {1: "a"})  # lease expired
    assert s.live() == {1: one} and s.session_of(2, "b") is None
    s.update(PREFIX, [put(2)], {1: "a", 2: "c"})  # restarted: a new incarnation
    new_two = s.session_of(2, "c")
    assert new_two is not None and new_two != two


def test_a_node_that_lost_its_lease_and_registered_again_is_a_new_session() -> None:
    """Same incarnation (the process re-registers under a new lease after a hang), but the
    delete in between ends the session its members were seen under, even in one batch."""
    s = NodeSessions()
    s.update(PREFIX, [RESYNC], {1: "a"})
    before = s.session_of(1, "a")
    s.update(PREFIX, [delete(1), put(1)], {1: "a"})
    after = s.session_of(1, "a")
    assert before is not None and after is not None and after != before


def test_a_resync_ends_what_the_view_no_longer_shows() -> None:
    s = NodeSessions()
    s.update(PREFIX, [RESYNC], {1: "a", 2: "b"})
    one = s.session_of(1, "a")
    s.update(PREFIX, [RESYNC], {1: "a"})
    assert s.live() == {1: one}
    s.update(PREFIX, [WatchEvent("/strom/c/nodes_extra", None, 3)], {1: "a"})
    assert s.live() == {1: one}
