"""Client quotas: per-principal rates of produced bytes, fetched bytes and requests on one
storage node, enforced by throttling (Kafka's model): a request over its principal's quota is
answered, but only after a delay that brings the principal back to its rate, and the answer
says how long it was held (``throttle_time_ms``). Nothing is dropped.

Token buckets with one second of burst: each kind of quota refills at its rate; a request
takes what it used (bytes, or 1 request); a bucket below zero means the principal is ahead of
its rate by that much, which is the delay. Quotas come from etcd (``quotas/<principal>``,
``User:*`` being the default for principals without their own).
"""

from __future__ import annotations

import contextvars
import threading
import time
from collections.abc import Callable, Mapping
from dataclasses import dataclass

from strom.api import metadata_pb2 as md

#: A throttled answer waits at most this long (a client's request timeout is longer).
MAX_THROTTLE_S = 30.0
DEFAULT_PRINCIPAL = "User:*"


@dataclass
class _Bucket:
    rate: float
    tokens: float
    at: float

    def take(self, amount: float, now: float) -> float:
        """Take ``amount``; the seconds until the bucket is back at zero (0 if it is not
        negative)."""
        self.tokens = min(self.rate, self.tokens + (now - self.at) * self.rate)  # 1 s burst
        self.at = now
        self.tokens -= amount
        return -self.tokens / self.rate if self.tokens < 0 else 0.0


class QuotaManager:
    """The quotas in force and each principal's buckets (thread-safe)."""

    KINDS = ("produce", "fetch", "requests")

    def __init__(self, clock: Callable[[], float] = time.monotonic) -> None:
        self.clock = clock
        self._lock = threading.Lock()
        self._quotas: dict[str, md.ClientQuota] = {}
        self._buckets: dict[tuple[str, str], _Bucket] = {}

    @property
    def active(self) -> bool:
        return bool(self._quotas)

    def replace(self, quotas: Mapping[str, md.ClientQuota]) -> None:
        with self._lock:
            self._quotas = dict(quotas)
            self._buckets.clear()

    def _rate(self, principal: str, kind: str) -> float:
        q = self._quotas.get(principal) or self._quotas.get(DEFAULT_PRINCIPAL)
        if q is None:
            return 0.0
        if kind == "produce":
            return q.produce_bytes_per_second
        if kind == "fetch":
            return q.fetch_bytes_per_second
        return q.requests_per_second

    def throttle(self, principal: str, kind: str, nbytes: int) -> float:
        """Account one request of ``kind`` ("produce" or "fetch") that moved ``nbytes``;
        the seconds to hold its answer back (0: within quota)."""
        if not self._quotas:
            return 0.0
        now = self.clock()
        delay = 0.0
        with self._lock:
            for k, amount in ((kind, nbytes), ("requests", 1)):
                rate = self._rate(principal, k)
                if rate <= 0:
                    continue
                b = self._buckets.get((principal, k))
                if b is None:
                    b = self._buckets[(principal, k)] = _Bucket(rate, rate, now)
                delay = max(delay, b.take(amount, now))
        return min(delay, MAX_THROTTLE_S)


#: The node's quotas (kept current from etcd by :func:`strom.security.follow`).
QUOTAS = QuotaManager()

#: Set while a handler calls the node's own Produce on a caller's behalf (RecordService): the
#: caller was charged where its request arrived, and the gathered call mixes callers, so the
#: inner call is not charged again (to whichever caller's context it happened to run in).
CHARGED_BY_CALLER: contextvars.ContextVar[bool] = contextvars.ContextVar(
    "strom_quota_charged_by_caller", default=False
)
