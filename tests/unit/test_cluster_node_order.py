"""The order in which ClusterClient asks nodes: one that failed or was slow is asked after
the others until it answers again (a hung node is not asked first by every lookup)."""

from __future__ import annotations

from strom.client.cluster import ClusterClient


def test_a_demoted_node_is_asked_last_until_it_answers_again() -> None:
    client = ClusterClient("n1:9092,n2:9092,n3:9092")
    try:
        assert client._candidates() == ["n1:9092", "n2:9092", "n3:9092"]
        client.demote("n1:9092")
        assert client._candidates() == ["n2:9092", "n3:9092", "n1:9092"]
        assert client.demoted("n1:9092") and not client.demoted("n2:9092")
        client.demote("n2:9092")  # the one that failed longest ago comes first of those
        assert client._candidates() == ["n3:9092", "n1:9092", "n2:9092"]
        client._promote("n1:9092")
        assert client._candidates() == ["n1:9092", "n3:9092", "n2:9092"]
    finally:
        client.close()
