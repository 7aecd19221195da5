"""Bounds on the identifiers and numbers a coordinator stores from a request.

Group ids, member ids and instance ids are kept in ``__consumer_offsets`` records, in memory
for as long as the group lives, and printed by ``strom groups``: control characters or
100 000-character ids would be stored and printed raw. Such a value is a malformed request:
INVALID_REQUEST naming the field. The bounds are far above anything the clients make:
KIP-848 member ids are UUIDs (36 characters), Spark's group ids a prefix and a UUID, and
people's group names short.

The empty group id keeps its own answer (INVALID_GROUP_ID, Kafka's, from the shard lookup).
"""

from __future__ import annotations

from strom.controlchars import CONTROL as _CONTROL
from strom.errors import InvalidRequestError

#: The longest group id (or group.instance.id) taken, in characters.
MAX_GROUP_ID_CHARS = 1024
#: The longest member id taken (KIP-848's are UUIDs: 36 characters).
MAX_MEMBER_ID_CHARS = 255


def check_id(value: str, field: str, limit: int) -> None:
    """Refuse an identifier longer than ``limit`` characters or holding a control
    character (INVALID_REQUEST naming ``field``). Empty passes: whether it may be empty is
    the caller's rule."""
    if len(value) > limit:
        raise InvalidRequestError(f"{field} is {len(value)} characters long, more than {limit}")
    bad = _CONTROL.search(value)
    if bad is not None:
        raise InvalidRequestError(
            f"{field} {value[:64]!r} holds the control character {bad.group()!r} at {bad.start()}"
        )


def check_group_id(group_id: str, field: str = "group_id") -> None:
    """A group id as stored: at most :data:`MAX_GROUP_ID_CHARS`, no control characters."""
    check_id(group_id, field, MAX_GROUP_ID_CHARS)


def check_rebalance_timeout(rebalance_timeout_ms: int) -> None:
    """ConsumerGroupHeartbeat's rebalance_timeout_ms: 0 (proto3's "not sent") and -1
    (KIP-848's "unchanged since the last heartbeat") take the default; a positive value is
    the member's max.poll.interval.ms; anything below -1 is malformed."""
    if rebalance_timeout_ms < -1:
        raise InvalidRequestError(
            f"rebalance_timeout_ms={rebalance_timeout_ms} is negative (-1 or 0: the default; "
            "else the member's max.poll.interval.ms)"
        )
