"""The Producer is split by what each module holds (strom.client.producer, sender, bulk,
record_checks); what users see must not follow the split: the names they import from
``strom.client.producer`` and the logger name they filter the sender's lines on."""

from __future__ import annotations

import logging

import pytest

from strom import Producer


def test_the_public_names_still_import_from_the_producer_module() -> None:
    from strom.client import producer

    for name in producer.__all__:
        assert getattr(producer, name) is not None
    from strom.client.producer import (  # noqa: F401  (the documented import paths)
        NO_WAIT,
        BatchMetadata,
        BulkFuture,
        ProducerCallbackError,
        WouldBlockError,
        request_too_large,
        space_wait_until,
    )


def test_the_sender_logs_under_the_producers_logger(caplog: pytest.LogCaptureFixture) -> None:
    """Users filter on "strom.client.producer": the sender's lines (here: a node without
    ProduceStream, so unary calls) keep that name though they come from strom.client.sender."""
    with Producer("127.0.0.1:1", max_block_ms=0) as p, caplog.at_level(logging.INFO):
        p._no_streams("127.0.0.1:1")
    (record,) = [r for r in caplog.records if "has no ProduceStream" in r.getMessage()]
    assert record.name == "strom.client.producer"
