"""The Producer is split by what each module holds (strom.client.producer, producer_buffer,
producer_bulk, producer_txn, sender, produce_answers, sequences, add_partitions,
produce_overdue, bulk, record_checks); what users see must not follow the split:
the names they import from ``strom.client.producer`` and ``strom.client.sender``, the
attributes each of the sender's mixins says it takes from the Producer, and the logger name
they filter the sender's lines on."""

from __future__ import annotations

import logging

import pytest

from strom import Producer
from strom.client.add_partitions import AddPartitions
from strom.client.produce_answers import ProduceAnswers
from strom.client.produce_overdue import OverdueRequests
from strom.client.producer_buffer import ProducerBuffer
from strom.client.producer_bulk import BulkSend
from strom.client.producer_txn import ProducerTransactions
from strom.client.sender import SenderLoop
from strom.client.sequences import Sequences

MIXINS = (
    ProducerTransactions,
    BulkSend,
    ProducerBuffer,
    SenderLoop,
    ProduceAnswers,
    Sequences,
    AddPartitions,
    OverdueRequests,
)


def test_the_public_names_still_import_from_the_producer_module() -> None:
    from strom.client import producer

    for name in producer.__all__:
        assert getattr(producer, name) is not None
    from strom.client import producer_buffer
    from strom.client.producer import (  # noqa: F401  (the documented import paths)
        NO_WAIT,
        BatchMetadata,
        BulkFuture,
        ProducerCallbackError,
        WouldBlockError,
        request_too_large,
        space_wait_until,
    )

    # The same objects, not copies: strom.aio's ``except WouldBlockError`` and its
    # ``space_wait_until(NO_WAIT)`` go through strom.client.producer, and the deadline the
    # block sets must be the one the buffer's wait reads.
    assert producer.WouldBlockError is producer_buffer.WouldBlockError
    assert producer.space_wait_until is producer_buffer.space_wait_until
    assert producer.NO_WAIT == producer_buffer.NO_WAIT


def test_the_producers_public_methods_keep_their_signatures_and_docs() -> None:
    """help(Producer) lists the same calls: the ones that moved into mixins are still the
    Producer's, with their docstrings."""
    for name in (
        "send",
        "send_batch",
        "flush",
        "close",
        "metrics",
        "partitions_for",
        "transaction",
        "init_transactions",
        "begin_transaction",
        "send_offsets_to_transaction",
        "commit_transaction",
        "prepare_transaction",
        "abort_transaction",
    ):
        method = getattr(Producer, name)
        assert method.__doc__, name


def test_the_senders_names_still_import_from_the_sender_module() -> None:
    from strom.client import produce_answers, sender

    for name in sender.__all__:
        assert getattr(sender, name) is not None
    assert sender.request_too_large is produce_answers.request_too_large
    assert sender.RETRY_LOG_INTERVAL_S == produce_answers.RETRY_LOG_INTERVAL_S
    # The coordinator's and the storage nodes' producers take these timers from the sender.
    from strom.client import produce_overdue

    assert sender.OVERDUE_GRACE_S == produce_overdue.OVERDUE_GRACE_S
    assert sender.OVERDUE_RECHECK_S == produce_overdue.OVERDUE_RECHECK_S
    assert sender._Outstanding is produce_overdue._Outstanding


def test_every_attribute_a_mixin_declares_is_one_a_producer_has() -> None:
    """The mixins' annotations are their contract with ``Producer.__init__``: a name
    declared there but no longer set (renamed, dropped) would fail only on the path that
    reads it."""
    assert all(issubclass(Producer, m) for m in MIXINS)
    with Producer("127.0.0.1:1", max_block_ms=0) as p:
        for mixin in MIXINS:
            missing = [a for a in mixin.__annotations__ if not hasattr(p, a)]
            assert not missing, f"{mixin.__name__} declares {missing}, which a Producer lacks"


def test_the_sender_logs_under_the_producers_logger(caplog: pytest.LogCaptureFixture) -> None:
    """Users filter on "strom.client.producer": the sender's lines (here: a node without
    ProduceStream, so unary calls) keep that name though they come from strom.client.sender,
    and so do its mixins' (strom.client.produce_answers, strom.client.sequences)."""
    from strom.client import produce_answers, produce_overdue, sequences

    with Producer("127.0.0.1:1", max_block_ms=0) as p, caplog.at_level(logging.INFO):
        p._no_streams("127.0.0.1:1")
    (record,) = [r for r in caplog.records if "has no ProduceStream" in r.getMessage()]
    assert record.name == "strom.client.producer"
    assert produce_answers.log.name == sequences.log.name == "strom.client.producer"
    assert produce_overdue.log.name == "strom.client.producer"
