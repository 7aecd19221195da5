"""strom.client.downgrades: a node found lacking a feature is marked for a while only."""

from __future__ import annotations

from strom.client.downgrades import Downgrades


def test_a_marked_node_is_tried_again_after_the_recheck_time() -> None:
    now = [100.0]
    d = Downgrades(recheck_s=300, clock=lambda: now[0])
    assert "n1:1" not in d
    d.add("n1:1")
    assert "n1:1" in d and "n2:1" not in d
    now[0] += 299.9
    assert "n1:1" in d
    now[0] += 0.1
    assert "n1:1" not in d  # expired: the feature is tried again
    d.add("n1:1")  # still old: marked again, from now
    now[0] += 299.9
    assert "n1:1" in d
