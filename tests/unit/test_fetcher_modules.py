"""The consumer's fetch engine is split by what each module holds (strom.client.fetcher: the
positions and buffers; fetch_answers: an answer's parsing and checks; fetch_state: what is
kept per answer and per partition; fetch_claims: what a request in flight holds;
fetch_workers: the node workers and their requests; fetch_filing: what an answer means per
partition; fetch_follow: the application's own Fetch; fetch_overdue: the metadata thread
and hung leaders). Code outside it must not follow the split: the consumer, the Spark
connector and users import these names from ``strom.client.fetcher``, and filter its log
lines on that logger name."""

from __future__ import annotations

import logging
import subprocess
import sys

import pytest

from strom import Consumer
from strom.client.fetch_filing import AnswerFiling
from strom.client.fetch_follow import InlineFetch
from strom.client.fetch_overdue import OverdueFetches
from strom.client.fetch_workers import FetchWorkers
from strom.client.fetcher import Fetcher

MIXINS = (InlineFetch, FetchWorkers, AnswerFiling, OverdueFetches)


def test_the_public_names_still_import_from_the_fetcher_module() -> None:
    from strom.client import fetch_answers, fetch_state, fetcher

    for name in fetcher.__all__:
        assert getattr(fetcher, name) is not None
    # The same objects, not copies: an isinstance check or an except clause written against
    # either path catches the other's.
    assert fetcher.FetchWireError is fetch_answers.FetchWireError
    assert fetcher.parse_fetch_response is fetch_answers.parse_fetch_response
    assert fetcher.aborted_batches is fetch_answers.aborted_batches
    assert fetcher.CompletedFetch is fetch_state.CompletedFetch
    assert fetcher.PartitionState is fetch_state.PartitionState
    assert fetcher.CONSUMER_SCHEMA is fetch_state.CONSUMER_SCHEMA


def test_the_moved_constants_still_import_from_the_fetcher_module() -> None:
    """The Spark connector reads FETCH_METHOD and the OVERDUE_* timers from here, and tests
    the split sizes: the same values as where they live now."""
    from strom.client import fetch_filing, fetch_follow, fetch_overdue, fetch_workers, fetcher

    assert fetcher.FETCH_METHOD == fetch_workers.FETCH_METHOD
    assert fetcher.SPLIT_REQUEST_BYTES == fetch_workers.SPLIT_REQUEST_BYTES
    assert fetcher.MAX_WORKERS_PER_NODE == fetch_workers.MAX_WORKERS_PER_NODE
    assert fetcher.STORAGE_ERRORS_RAISED_AFTER == fetch_filing.STORAGE_ERRORS_RAISED_AFTER
    assert fetcher.OVERDUE_GRACE_S == fetch_overdue.OVERDUE_GRACE_S
    assert fetcher.OVERDUE_RECHECK_S == fetch_overdue.OVERDUE_RECHECK_S
    assert fetcher.FOLLOW_WINDOW == fetch_follow.FOLLOW_WINDOW
    assert fetcher.INLINE_GRACE_S == fetch_follow.INLINE_GRACE_S


def test_every_attribute_a_mixin_declares_is_one_a_fetcher_has() -> None:
    """The mixins' annotations are their contract with ``Fetcher.__init__``: a name declared
    there but no longer set (renamed, dropped) would fail only on the path that reads it."""
    assert all(issubclass(Fetcher, m) for m in MIXINS)
    with Consumer("127.0.0.1:1") as consumer:  # (connects to nothing until asked)
        f = consumer._fetcher
        for mixin in MIXINS:
            missing = [a for a in mixin.__annotations__ if not hasattr(f, a)]
            assert not missing, f"{mixin.__name__} declares {missing}, which a Fetcher lacks"


def test_the_fetch_modules_log_under_the_fetchers_logger(
    caplog: pytest.LogCaptureFixture,
) -> None:
    """Users and docs filter on "strom.client.fetcher": a worker's line (here: a Fetch that
    stayed unanswered past its wait) keeps that name though it comes from fetch_overdue, and
    so do the other parts' loggers."""
    from strom.client import fetch_follow, fetch_overdue, fetch_workers, fetcher
    from strom.client.fetch_claims import _Outstanding

    class Client:
        def demote(self, address: str) -> None:
            pass

    class Leaders:
        def mark_stale(self, topic: str) -> None:
            pass

    with Consumer("127.0.0.1:1") as consumer:
        f = consumer._fetcher
        f._client = Client()  # type: ignore[assignment]
        f._leaders = Leaders()  # type: ignore[assignment]
        f._outstanding.add(_Outstanding("127.0.0.1:1", [], 0.0))
        with caplog.at_level(logging.DEBUG, logger="strom.client.fetcher"), f._lock:
            f._overdue(1.0)
    (record,) = [r for r in caplog.records if "no Fetch answer from" in r.getMessage()]
    assert record.name == "strom.client.fetcher"
    names = {m.log.name for m in (fetcher, fetch_follow, fetch_overdue, fetch_workers)}
    assert names == {"strom.client.fetcher"}


def test_the_fetch_modules_import_on_their_own() -> None:
    """No import cycle: each module loads first in a fresh interpreter."""
    for module in (
        "fetch_answers",
        "fetch_state",
        "fetch_claims",
        "fetch_workers",
        "fetch_filing",
        "fetch_follow",
        "fetch_overdue",
        "fetcher",
    ):
        done = subprocess.run(
            [sys.executable, "-c", f"import strom.client.{module}"],
            capture_output=True,
            text=True,
            timeout=60,
        )
        assert done.returncode == 0, done.stderr
