"""strom_controller_failover_seconds times real failovers only: from a node leaving to the
partition states the active controller committed for it, within one active term
(strom.controller.reconcile)."""

from __future__ import annotations

import asyncio
import time
from typing import Any

from prometheus_client import REGISTRY

from strom.controller.activation import ActiveRole


def _failovers() -> float:
    return REGISTRY.get_sample_value("strom_controller_failover_seconds_count") or 0.0


def _controller(lead: object) -> Any:
    """An active controller's role with etcd left out: ``commits`` is what each
    reconciliation pass commits."""
    r: Any = ActiveRole.__new__(ActiveRole)
    r.controller_id = 1
    r._election = object()
    r._leadership = lead
    r._prober = None
    r._stopping = False
    r._reconcile_wanted = asyncio.Event()
    r._node_gone_at = None
    r._reconcile_topics = set()
    r._follow_active = lambda: None
    r.commits = 0

    def one_pass(lead: object, exclude: Any, topics: Any) -> int:
        r._stopping = True  # one pass, then the loop ends
        return r.commits

    r._reconcile_sync = one_pass
    return r


async def _run_one_pass(r: Any) -> None:
    r._write_lock = asyncio.Lock()
    r._stopping = False
    await r._reconcile_loop(r._leadership)


def test_a_node_left_in_an_earlier_term_is_not_timed_in_the_next() -> None:
    """Found from outside: a controller that lost leadership while a node-left wake-up was
    queued kept its time into its next active term, whose first pass observed the whole
    standby time (94 s where failovers took 6-21 ms)."""
    r = _controller(object())
    r._reconcile_wanted_now(time.monotonic())  # a node left; no pass ran yet
    asyncio.run(r._lose(r._election, "election key deleted"))
    # Some time later, active again: activation's pass commits (a partition left by the
    # node while no controller was active), which is not the earlier term's failover.
    r._leadership = object()
    r._reconcile_wanted_now()
    r.commits = 3
    before = _failovers()
    asyncio.run(_run_one_pass(r))
    assert _failovers() == before


def test_a_node_left_wake_up_run_after_the_term_ended_is_dropped_at_activation() -> None:
    r = _controller(None)
    r._reconcile_wanted_now(time.monotonic())  # queued by the watch thread while active
    r._leadership = object()
    r._new_term()  # what activation does before its first pass
    r._reconcile_wanted_now()
    r.commits = 3
    before = _failovers()
    asyncio.run(_run_one_pass(r))
    assert _failovers() == before


def test_only_a_pass_that_committed_changes_is_a_failover() -> None:
    r = _controller(object())
    before = _failovers()
    r._reconcile_wanted_now(time.monotonic())  # a node without replicas left
    r.commits = 0
    asyncio.run(_run_one_pass(r))
    assert _failovers() == before
    r._reconcile_wanted_now(time.monotonic())  # a node holding leaderships left
    r.commits = 2
    asyncio.run(_run_one_pass(r))
    assert _failovers() == before + 1
