"""The consumer's fetch engine is split by what each module holds (strom.client.fetcher: the
threads and positions; fetch_answers: an answer's parsing and checks; fetch_state: what is
kept per answer and per partition). Code outside it must not follow the split: the consumer,
the Spark connector and users import these names from ``strom.client.fetcher``."""

from __future__ import annotations

import subprocess
import sys


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


def test_the_fetch_modules_import_on_their_own() -> None:
    """No import cycle: each module loads first in a fresh interpreter."""
    for module in ("fetch_answers", "fetch_state", "fetcher"):
        done = subprocess.run(
            [sys.executable, "-c", f"import strom.client.{module}"],
            capture_output=True,
            text=True,
            timeout=60,
        )
        assert done.returncode == 0, done.stderr
