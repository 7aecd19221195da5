"""Replication is split by side (strom.storage.replica_fetchers: the follower's fetchers;
strom.storage.isr: the leader's ISR management; strom.storage.controller_client); what others
see must not follow the split: the names they import from ``strom.storage.replication`` and
the logger name operators filter replication's lines on."""

from __future__ import annotations

import logging

import pytest

from strom.storage import controller_client, isr, replica_fetchers, replication


def test_the_public_names_still_import_from_the_replication_module() -> None:
    homes = (replica_fetchers, isr, controller_client)
    for name in replication.__all__:
        found = [getattr(m, name) for m in homes if name in vars(m)]
        assert found and all(getattr(replication, name) is f for f in found), name
    from strom.storage.replication import (  # noqa: F401  (the import paths kept)
        ControllerClient,
        IsrManager,
        ReplicaFetchers,
        divergence_truncation_offset,
        refresh_replication_gauges,
        running_nodes,
    )


def test_both_sides_log_under_the_replication_logger(caplog: pytest.LogCaptureFixture) -> None:
    """Operators filter on "strom.storage.replication": the follower's and the leader's lines
    keep that name though they come from modules of their own."""
    for module in (replica_fetchers, isr, controller_client):
        assert module.log.name == "strom.storage.replication", module.__name__
    caplog.set_level(logging.DEBUG, logger="strom.storage.replication")
    replica_fetchers._log_fetch_failure(3, "10.0.0.3:9092", 1, 1, ConnectionResetError("x"))
    (record,) = caplog.records
    assert record.name == "strom.storage.replication"
