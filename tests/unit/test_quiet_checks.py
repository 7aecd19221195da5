"""How often a consumer checks the leaders of partitions whose fetches come back empty
(strom.client.fetch_overdue): once per QUIET_RECHECK_S per consumer, taking along every
partition quiet for half of it. Found from outside: each partition kept its own phase (set by
when its own answers came), so 40 partitions with a record now and then cost ~20 Metadata
calls per 5 s, and 50 idle consumers 2,120 a minute where ~600 were documented. A pure test of
the check's choice, on a fake clock."""

from __future__ import annotations

import itertools
import random
from dataclasses import dataclass
from typing import Any

from strom.client.fetch_overdue import QUIET_RECHECK_S, OverdueFetches
from strom.client.types import TopicPartition


@dataclass
class _Part:
    tp: TopicPartition
    quiet_since: float | None = None
    paused: bool = False


@dataclass
class _Leader:
    address: str


class _Leaders:
    def get(self, tp: TopicPartition) -> _Leader:
        return _Leader(f"n{tp.partition % 3}")

    def node_addresses(self) -> set[str]:
        return {"n0", "n1", "n2", "n3"}


class _Consumer(OverdueFetches):
    def __init__(self, partitions: int) -> None:  # (no threads: only the choice is tested)
        self.parts = {
            TopicPartition("t", p): _Part(TopicPartition("t", p)) for p in range(partitions)
        }  # type: ignore[misc]
        self._leaders: Any = _Leaders()


def test_staggered_quiet_partitions_cost_one_check_per_bound() -> None:
    rng = random.Random(7)
    c = _Consumer(40)
    checks: list[float] = []
    now = 0.0
    step = 0.05
    while now < 60.0:
        # A record to a random partition every 0.25 s: its phase starts again.
        if round(now / step) % 5 == 0:
            c.parts[TopicPartition("t", rng.randrange(40))].quiet_since = None
        for part in c.parts.values():  # every other answer is empty
            if part.quiet_since is None:
                part.quiet_since = now + rng.random() * 0.01
        due = c._quiet_due is None or c._quiet_due <= now
        if due and c._quiet_check(now) is not None:
            checks.append(now)
        now += step
    gaps = [b - a for a, b in itertools.pairwise(checks)]
    assert gaps and min(gaps) >= QUIET_RECHECK_S - 1e-9, gaps
    assert len(checks) <= 60.0 / QUIET_RECHECK_S + 1  # (it was ~20 per bound)


def test_a_quiet_partition_is_checked_within_one_and_a_half_bounds() -> None:
    c = _Consumer(2)
    a, b = c.parts.values()
    a.quiet_since = 0.0
    assert c._quiet_check(QUIET_RECHECK_S) is not None  # a's check
    b_quiet = b.quiet_since = QUIET_RECHECK_S * 1.01  # quiet just after it: left for later
    taken: Any = None
    now = QUIET_RECHECK_S
    while taken is None or b.tp not in taken[2]:
        now += 0.05
        assert now < 10 * QUIET_RECHECK_S, "b was never checked"
        if c._quiet_due is not None and c._quiet_due <= now:
            taken = c._quiet_check(now)
    assert now - b_quiet <= 1.5 * QUIET_RECHECK_S + 0.05, now - b_quiet


def test_a_paused_partition_is_not_checked() -> None:
    c = _Consumer(1)
    (part,) = c.parts.values()
    part.quiet_since, part.paused = 0.0, True
    assert c._quiet_check(2 * QUIET_RECHECK_S) is None
