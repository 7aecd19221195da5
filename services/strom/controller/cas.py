"""Decide, commit with compare-and-swap, retry on conflict: the one loop behind every
controller write that depends on what it read (DESIGN §2).

Each attempt reads the keys it will change, decides from what it read, and commits with a
transaction that compares those keys' mod_revisions. If anything changed in between, the
commit fails as a whole and wrote nothing, so the only sound move is to read and decide
again, never to patch the old decision. The bound keeps a key that never stops changing from
holding the controller's single write lock: the caller answers REQUEST_TIMED_OUT and the
client retries. This module knows nothing of etcd or gRPC: ``decide`` and ``commit`` do.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import TypeVar

from strom.errors import RequestTimedOutError

T = TypeVar("T")


def commit_with_retry(
    decide: Callable[[], T],
    commit: Callable[[T], bool],
    *,
    attempts: int,
    gave_up: str,
) -> T:
    """Run ``decide`` then ``commit(decision)`` until a commit succeeds; return that decision.

    Args:
        decide: reads the current state and returns what to write. It starts from scratch on
            every attempt (a caller filling a response clears it first). Whatever it raises
            (an invalid request, a missing key) ends the loop at once.
        commit: writes the decision with compare-and-swap; False means a compare failed
            (someone else wrote in between) and nothing was written. Whatever it raises
            (fenced, store unreachable) ends the loop.
        attempts: how many read-decide-commit rounds at the most (>= 1).
        gave_up: the message of the error raised when every attempt conflicted.

    Raises:
        RequestTimedOutError: ``attempts`` commits in a row lost their compare.
    """
    if attempts < 1:
        raise ValueError(f"attempts must be at least 1, not {attempts}")
    for _ in range(attempts):
        decision = decide()
        if commit(decision):
            return decision
    raise RequestTimedOutError(gave_up)
