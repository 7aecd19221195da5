"""One attempt of a client's call to a coordinator, given up once the key moved (DESIGN §8).

A coordinator that hangs (SIGSTOP, a long GC pause, a partition) keeps its connections open
and answers nothing; a standby takes its shards over once its etcd lease ends, a few seconds
later. A call that waited for its attempt's timeout (half of ``request_timeout_ms`` or all
of it: 15 to 30 s by default) stalled that long although the key had a live owner within
seconds. :func:`call_leaving_moved` is the consumer's overdue-Fetch rule
(``strom.client.fetcher.OVERDUE_GRACE_S``) for unary coordinator calls: the transactional
producer's calls (``strom.client.transactions``) and a consumer group member's heartbeats,
commits and offset lookups (``strom.client.group_member``) use it, so both follow a takeover
the same way.
"""

from __future__ import annotations

import logging
import threading
import time
from collections.abc import Sequence
from typing import Any

from strom.client.cluster import MIN_ATTEMPT_S, ClusterClient
from strom.errors import StromError

log = logging.getLogger("strom.client.coordinator_calls")

#: How long a coordinator call may go unanswered before its key's coordinator is looked up
#: again (DESIGN §8, as the consumer's ``strom.client.fetcher.OVERDUE_GRACE_S``), the same for
#: every method: a coordinator that serves a shard answers EndTxn after one write to
#: ``__transaction_state`` (its markers are written after the answer), TxnOffsetCommit and
#: OffsetCommit after one write to ``__consumer_offsets``, Add*ToTxn and a heartbeat the same,
#: OffsetFetch once the shard's pending writes are durable (a read_committed lookup of an
#: offset a transaction still completes is answered UNSTABLE_OFFSET_COMMIT at once, not held),
#: so a second without an answer means a slow or hung coordinator. Calls that may
#: legitimately take longer (InitProducerId and Add*ToTxn wait up to the coordinator's
#: ``COMPLETION_WAIT_S`` for the previous transaction's markers; any write waits for its
#: in-sync replicas) cost no more than a FindCoordinator per second for it: only an owner that
#: is now another coordinator makes the call leave the one it asked; a slow owner is waited
#: for up to the attempt's timeout. So a longer grace for some method would only delay
#: leaving a hung one.
OVERDUE_GRACE_S = 1.0
#: How often an unanswered call's coordinator is looked up again after that (a hung
#: coordinator's shards are taken over once its etcd lease ends, a few seconds).
OVERDUE_RECHECK_S = 1.0
#: The longest one of those lookups may take (a hedged FindCoordinator, answered from the
#: nodes' memory): it runs while the call waits, so it must not hold it much past an answer.
OVERDUE_LOOKUP_S = 1.0
#: How often a call waiting for its answer looks whether its caller stopped.
_STOP_POLL_S = 0.25


class CoordinatorMoved(Exception):
    """An attempt was given up on: its coordinator did not answer within the grace and the
    key is now owned by ``address`` (see :func:`call_leaving_moved`)."""

    def __init__(self, address: str, waited_s: float) -> None:
        super().__init__(address)
        self.address = address
        self.waited_s = waited_s


class CallAbandoned(Exception):
    """An attempt was given up on because its caller stopped (``stop`` was set): a closing
    client does not wait on a coordinator that may never answer."""


def call_leaving_moved(
    client: ClusterClient,
    method: Any,
    req: Any,
    *,
    addr: str,
    key: str,
    key_type: int,
    timeout_s: float,
    deadline: float,
    metadata: Sequence[tuple[str, str]] | None = None,
    stop: threading.Event | None = None,
) -> Any:
    """One attempt of a unary coordinator call (``method``, a stub's multi-callable, asking
    ``addr``): its answer, or the gRPC error it ended with (after ``timeout_s``).

    While it is unanswered :data:`OVERDUE_GRACE_S` after it was sent, the key's coordinator
    is looked up again every :data:`OVERDUE_RECHECK_S` (a short hedged FindCoordinator):
    once another coordinator owns the key, the attempt is cancelled and
    :class:`CoordinatorMoved` raised, so the caller goes on there within seconds of the
    takeover instead of after the whole attempt. While the owner is the same the attempt goes
    on: a slow answer is not a hang. While no owner is known (between the hung one's lease
    ending and the takeover, or no node answered the lookup) it goes on too: there is
    nowhere else to ask yet, and cancelling would only lose an answer that may still come;
    the next recheck finds the new owner. An answer that comes meanwhile wins. ``addr`` is
    not demoted (``ClusterClient.demote``): that orders the storage nodes asked for lookups,
    and a coordinator is not one of them; the caller forgets it (its next attempt goes to the
    new owner). ``stop`` set meanwhile abandons the attempt (:class:`CallAbandoned`).

    The caller must make a resend safe: an attempt given up on counts as one that got no
    answer (the old coordinator may have applied it before it lost the shard, and the new
    owner replayed whatever it wrote), exactly as after the attempt's timeout."""
    sent = time.monotonic()
    fut = method.future(req, timeout=timeout_s, metadata=metadata)
    done = threading.Event()
    fut.add_done_callback(lambda _: done.set())
    check_at = sent + OVERDUE_GRACE_S
    while not fut.done():
        if stop is not None and stop.is_set():
            fut.cancel()
            raise CallAbandoned()
        now = time.monotonic()
        if now < check_at:
            done.wait(min(_STOP_POLL_S, check_at - now) if stop is not None else check_at - now)
            continue
        owner = _owner_now(client, key, key_type, deadline)
        check_at = max(check_at + OVERDUE_RECHECK_S, time.monotonic())
        if owner is not None and owner != addr and fut.cancel():
            raise CoordinatorMoved(owner, time.monotonic() - sent)
    return fut.result()  # (raises the attempt's grpc.RpcError)


def _owner_now(client: ClusterClient, key: str, key_type: int, deadline: float) -> str | None:
    """The key's coordinator as the nodes know it now (a short hedged lookup), or None when
    none is known (no owner between a lease's end and a takeover, no node answered, a
    refusal: the unanswered attempt is then waited for as before)."""
    timeout = min(OVERDUE_LOOKUP_S, max(deadline - time.monotonic(), MIN_ATTEMPT_S))
    try:
        return client.find_coordinator(key, key_type, timeout_s=timeout)
    except StromError as exc:
        log.debug("looking up the coordinator of %r again failed: %s", key, exc)
        return None


__all__ = [
    "OVERDUE_GRACE_S",
    "OVERDUE_LOOKUP_S",
    "OVERDUE_RECHECK_S",
    "CallAbandoned",
    "CoordinatorMoved",
    "call_leaving_moved",
]
