"""Replication throttles for reassignments (Kafka's KIP-73, DESIGN §6 "Replication
throttles"): a pure engine, no gRPC or etcd.

A move copies a partition's whole log to its new replicas; untuned it copies as fast as the
leader can read, and the produce and fetch latency of everything else on those nodes pays
(acks=all p99 went 22 -> 283 ms during a 600 MB move). Kafka's answer,
followed here: the topic configs ``leader.replication.throttled.replicas`` /
``follower.replication.throttled.replicas`` list the replicas (``partition:node``, or ``*``)
whose replication is throttled, and a per-node rate (``leader.replication.throttled.rate``,
``follower.replication.throttled.rate``, bytes/s) bounds it. strom keeps the two rates as
cluster-wide dynamic node configs (the ``node_configs`` etcd key, Kafka's default broker
entity): every node applies the same rate to its own throttled traffic.

The leader side is a :class:`TokenBucket` per node across every throttled partition it
leads: an answer to a follower that is not in the ISR of a partition throttled on this node
carries only whole batches the bucket allows (at least one while it holds any tokens, so a
move always progresses; none while it is in debt), and what was sent is charged. Kafka's
rule for in-sync followers is kept: a follower in the ISR is never throttled, so a
throttle cannot push a replica out of the ISR, nor slow acks=all.
"""

from __future__ import annotations

import time
from collections.abc import Callable, Mapping
from functools import lru_cache

from strom.log.config import throttled_replicas_problem
from strom.log.errors import ConfigError

LEADER_RATE = "leader.replication.throttled.rate"
FOLLOWER_RATE = "follower.replication.throttled.rate"

#: The rates among the cluster-wide dynamic node configs (stored in etcd's ``node_configs``;
#: all of them: strom.service.node_configs) and their meaning.
RATE_CONFIGS: dict[str, str] = {
    LEADER_RATE: "bytes/s each node sends, as leader, to the replicas its topics' "
    "leader.replication.throttled.replicas list (followers not in the ISR); unset: no limit",
    FOLLOWER_RATE: "bytes/s each node fetches for the replicas its topics' "
    "follower.replication.throttled.replicas list (while not in the ISR); unset: no limit",
}

#: The most a rate may be: Kafka's LONG (its default, Long.MAX_VALUE, means unthrottled).
MAX_RATE = (1 << 63) - 1

#: Seconds of the rate a full bucket holds: an idle bucket lets this much go at once.
BURST_S = 1.0


def parse_rate(name: str, raw: object) -> int:
    """A throttle rate in bytes/s (an integer >= 1); ConfigError naming the config otherwise.
    0 is refused: it would stop every move for good (delete the config for no limit)."""
    text = str(raw).strip()
    if isinstance(raw, bool) or not text.isascii() or not text.isdigit():
        raise ConfigError(
            f"config '{name}' has invalid value {raw!r}: expected a number of bytes per "
            "second (ASCII digits, >= 1)"
        )
    value = int(text)
    if not 1 <= value <= MAX_RATE:
        raise ConfigError(
            f"config '{name}' has invalid value {raw!r}: must be between 1 and {MAX_RATE} "
            "bytes/s (delete it for no limit)"
        )
    return value


@lru_cache(maxsize=4096)
def _throttled_here(value: str, node_id: int) -> frozenset[int] | None:
    """Partitions a list throttles on ``node_id`` (None: all of them). Cached: the fetch
    path asks per partition of every follower fetch, with few distinct values."""
    text = value.strip()
    if text == "*":
        return None
    if not text or throttled_replicas_problem(text):
        return frozenset()
    out = set()
    for item in text.split(","):
        p, _, n = item.partition(":")
        if int(n) == node_id:
            out.add(int(p))
    return frozenset(out)


def is_throttled(value: str, partition: int, node_id: int) -> bool:
    """Whether a throttled-replicas list names ``partition`` on ``node_id`` (Kafka reads the
    leader list with the leader's id and the follower list with the follower's)."""
    if not value:
        return False
    here = _throttled_here(value, node_id)
    return here is None or partition in here


class TokenBucket:
    """Bytes per second across every throttled partition of one side of a node.

    ``rate`` None is no limit. A full bucket holds :data:`BURST_S` of the rate; what was
    sent is charged after the fact and may put the bucket in debt (a batch is never split),
    which the refill pays off before anything more goes, so the rate holds on average.
    """

    def __init__(self, rate: int | None = None, clock: Callable[[], float] = time.monotonic):
        self._clock = clock
        self.rate: int | None = None
        self._tokens = 0.0
        self._at = clock()
        self.set_rate(rate)

    @property
    def capacity(self) -> float:
        return max(float(self.rate or 0) * BURST_S, 1.0)

    def set_rate(self, rate: int | None) -> None:
        """A new rate from now on; a first limit starts with a full bucket, a change keeps
        what is owed (a debt is still paid) but never more than the new capacity."""
        self._refill()
        first = self.rate is None
        self.rate = rate
        if rate is None:
            self._tokens = 0.0
        elif first:
            self._tokens = self.capacity
        else:
            self._tokens = min(self._tokens, self.capacity)

    def _refill(self) -> None:
        now = self._clock()
        if self.rate is not None and now > self._at:
            self._tokens = min(self._tokens + (now - self._at) * self.rate, self.capacity)
        self._at = now

    def available(self) -> int | None:
        """Bytes that may go now (0: in debt or empty); None when there is no limit."""
        if self.rate is None:
            return None
        self._refill()
        return max(int(self._tokens), 0)

    def record(self, n: int) -> None:
        """Charge ``n`` bytes that went (nothing to charge without a limit)."""
        if self.rate is None or n <= 0:
            return
        self._refill()
        self._tokens -= n

    def wait_s(self) -> float:
        """Seconds until at least one byte may go (0 now, or without a limit)."""
        if self.rate is None:
            return 0.0
        self._refill()
        if self._tokens >= 1:
            return 0.0
        return (1 - self._tokens) / self.rate


class ReplicationQuotas:
    """A node's two buckets (leader: what it sends to throttled followers; follower: what
    it fetches for its throttled replicas), set from the cluster's dynamic node configs."""

    def __init__(self, clock: Callable[[], float] = time.monotonic) -> None:
        self.leader = TokenBucket(None, clock)
        self.follower = TokenBucket(None, clock)

    def apply(self, configs: Mapping[str, str]) -> bool:
        """Take the rates from stored node configs (one that does not parse counts as
        unset: a node must never fail on another writer's value); whether one changed."""
        changed = False
        for bucket, name in ((self.leader, LEADER_RATE), (self.follower, FOLLOWER_RATE)):
            rate: int | None = None
            if name in configs:
                try:
                    rate = parse_rate(name, configs[name])
                except ConfigError:
                    rate = None
            if rate != bucket.rate:
                bucket.set_rate(rate)
                changed = True
        return changed
