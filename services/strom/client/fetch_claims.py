"""What a consumer's Fetch in flight holds: the partitions claimed into it (``_Claim``), and a
worker's request as the metadata thread watches it (``_Outstanding``).

Shared by the parts of :class:`strom.client.fetcher.Fetcher`: the workers
(strom.client.fetch_workers) and the application's own Fetch (strom.client.fetch_follow)
claim partitions, the answer's filing checks the claims still hold, and the metadata thread
(strom.client.fetch_overdue) releases them from a request a hung leader holds. A module of
its own so that those parts import these from one place and not from each other.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from strom.client.fetch_state import PartitionState


@dataclass(frozen=True, slots=True, eq=False)
class _Claim:
    """A partition a worker took into its next request, as it was when taken. The partition
    holds it (``PartitionState.claim``) while the request may still file an answer for it."""

    part: PartitionState
    generation: int
    fetch_offset: int
    leader_epoch: int


@dataclass(slots=True, eq=False)
class _Outstanding:
    """A worker's Fetch in flight, watched by the metadata thread (``Fetcher._overdue``):
    past ``due`` the leaders of its partitions are looked up again, and the partitions whose
    leader moved away from ``address`` are released from it."""

    address: str
    claims: list[_Claim]
    #: When it is overdue (then: when to look its leaders up again).
    due: float
    #: Its leaders were asked for since it became overdue (release what moved).
    checked: bool = False
    #: Cancels its stream (None while not on a stream: a unary call cannot be cancelled
    #: from another thread, and simply ends at its deadline).
    cancel: Any = None
