"""The ports local clusters draw: the whole range below the kernel's ephemeral ports, or
the slice STROM_DEV_PORTS names (each parallel test worker gets its own, so two never race
for one port), and a clear error for a malformed value."""

from __future__ import annotations

import pytest

from strom.devcluster import procs


def test_free_ports_stay_in_the_slice_named(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv(procs.PORTS_ENV, "23000-23019")
    ports = {procs.free_port() for _ in range(15)}
    assert all(23000 <= p <= 23019 for p in ports), ports
    assert len(ports) == 15  # none handed out twice


def test_without_the_variable_the_whole_range(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.delenv(procs.PORTS_ENV, raising=False)
    assert procs.port_range() == procs._PORT_RANGE


@pytest.mark.parametrize("bad", ["20000", "a-b", "30000-20000", "80-90", "20000-70000"])
def test_a_malformed_slice_is_named(monkeypatch: pytest.MonkeyPatch, bad: str) -> None:
    monkeypatch.setenv(procs.PORTS_ENV, bad)
    with pytest.raises(ValueError, match=procs.PORTS_ENV):
        procs.port_range()


def test_each_test_worker_has_a_slice_of_its_own() -> None:
    """tests/conftest.py gives each pytest-xdist worker a disjoint slice, none outside xdist."""
    from tests.conftest import worker_ports

    assert worker_ports("", 1) is None and worker_ports("gw0", 1) is None
    slices = [worker_ports(f"gw{i}", 2) for i in range(2)]
    assert slices == ["20000-25999", "26000-31999"]
    for text in slices:
        low, high = (int(x) for x in text.split("-"))  # type: ignore[union-attr]
        assert procs._PORT_RANGE[0] <= low <= high <= procs._PORT_RANGE[1]
