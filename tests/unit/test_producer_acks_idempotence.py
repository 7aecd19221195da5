"""Idempotence needs acks='all' (Kafka's rule): by default the producer is idempotent exactly
when acks='all', and asking for idempotence with fewer acknowledgements is refused.

Found from outside: with acks=1 the producer was idempotent by default; a leader change
truncated a record the old leader had acknowledged (acks=1 allows that), and every later batch
of the partition was refused OUT_OF_ORDER_SEQUENCE until the producer was closed, while
``flush()`` returned as if all was well."""

from __future__ import annotations

import pytest

from strom import Producer

NOWHERE = "127.0.0.1:1"  # nothing is sent: only the settings are looked at


@pytest.mark.parametrize(
    ("acks", "idempotence", "expected"),
    [
        ("all", None, True),
        (-1, None, True),
        ("all", False, False),
        ("all", True, True),
        (1, None, False),
        (0, None, False),
        (1, False, False),
    ],
)
def test_idempotence_follows_acks(
    acks: int | str, idempotence: bool | None, expected: bool
) -> None:
    p = Producer(NOWHERE, acks=acks, enable_idempotence=idempotence)
    try:
        assert p.idempotent is expected
    finally:
        p.close(timeout=1)


@pytest.mark.parametrize("acks", [1, 0])
def test_idempotence_with_fewer_acks_is_refused_with_the_reason(acks: int) -> None:
    with pytest.raises(ValueError, match="enable_idempotence=True needs acks='all'"):
        Producer(NOWHERE, acks=acks, enable_idempotence=True)
