"""Client quotas: per-principal rates of produced bytes, fetched bytes and requests on one
storage node, enforced by throttling (Kafka's model): a request over its principal's quota is
answered, but only after a delay that brings the principal back to its rate, and the answer
says how long it was held (``throttle_time_ms``). Nothing is dropped.

Token buckets with one second of burst: each kind of quota refills at its rate; a request
takes what it used (bytes, or 1 request); a bucket below zero means the principal is ahead of
its rate by that much, which is the delay. Quotas come from etcd (``quotas/<principal>``,
``User:*`` being the default): each kind is resolved on its own, as Kafka does, so a
principal's own entry that sets only a produce rate keeps the default's fetch and request
rates.
"""

from __future__ import annotations

import contextvars
import threading
import time
from collections.abc import Callable, Iterable, Mapping
from dataclasses import dataclass

from strom.api import metadata_pb2 as md
from strom.security.principal import ANONYMOUS, canonical_principal

#: A throttled answer waits at most this long (a client's request timeout is longer). What a
#: principal owes beyond it is not forgiven: its next requests wait it out before they are
#: served (:meth:`QuotaManager.owed`).
MAX_THROTTLE_S = 30.0
#: A fetch by a principal with a fetch quota reads at most this many seconds of its rate
#: (Kafka's getMaxValueInQuotaWindow: ten one-second samples), so that one answer cannot
#: put it further ahead than its hold can bring it back.
FETCH_WINDOW_S = 10.0
DEFAULT_PRINCIPAL = "User:*"
#: Each kind of quota's field of ``ClientQuota``.
_FIELDS = {
    "produce": "produce_bytes_per_second",
    "fetch": "fetch_bytes_per_second",
    "requests": "requests_per_second",
}


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
        self._services: frozenset[str] = frozenset()

    @property
    def active(self) -> bool:
        return bool(self._quotas)

    def set_service_principals(self, principals: Iterable[str]) -> None:
        """The principals the cluster's own services authenticate as (the subject of the
        service's own certificate under mTLS, its ``--client-token-file`` token's
        principal): never charged, as Kafka never throttles inter-broker traffic or its
        coordinators' writes. A ``User:*`` default throttled the
        coordinator's appends to ``__consumer_offsets`` (a commit took 2.8 s instead of
        20-60 ms) and a node forwarding a caller's records to the leader (20 KB took
        19.7 s); the caller is charged where its call arrived. Only an authenticated
        principal can be one: ``User:ANONYMOUS`` (everyone, without authentication) and
        ``User:*`` never are, so a client cannot claim the exemption."""
        keep = {canonical_principal(p) for p in principals}
        self._services = frozenset(keep - {ANONYMOUS, DEFAULT_PRINCIPAL, ""})

    def exempt(self, principal: str) -> bool:
        """Whether ``principal``'s requests are never charged (a service's own)."""
        return principal in self._services

    def replace(self, quotas: Mapping[str, md.ClientQuota]) -> None:
        """Put ``quotas`` in force. A principal's debt is kept: each bucket whose rate is
        still set is brought up to now at its old rate and goes on at its new one: any etcd
        change, even one any principal can cause, would otherwise forgive every debt. Only
        a bucket whose rate is gone (no limit any more) is dropped."""
        now = self.clock()
        with self._lock:
            self._quotas = _by_canonical_principal(quotas.values())
            for key, b in list(self._buckets.items()):
                rate = self._rate(*key)
                if rate <= 0:
                    del self._buckets[key]
                elif rate != b.rate:
                    b.take(0, now)  # what it earned so far, at the rate it had
                    b.rate = rate
                    b.tokens = min(b.tokens, rate)  # (one second of burst at the new rate)

    def _rate(self, principal: str, kind: str) -> float:
        """``principal``'s rate of ``kind``: its own entry's, else ``User:*``'s, kind by kind
        (the own entry was taken as a whole, so a principal given
        only a produce rate fetched unthrottled past a ``User:*`` fetch rate); 0: none."""
        field = _FIELDS[kind]
        for name in (principal, DEFAULT_PRINCIPAL):
            q = self._quotas.get(name)
            if q is not None and getattr(q, field) > 0:
                return float(getattr(q, field))
        return 0.0

    def fetch_limit(self, principal: str) -> int:
        """The most record bytes one fetch by ``principal`` reads: :data:`FETCH_WINDOW_S` of
        its fetch rate (0: no fetch quota, no bound). Nothing
        bounded a request, so Fetch(max_bytes=50 MiB) at 10,000 B/s moved 1.9 MB per
        answer held the capped 30 s, 6.4x the quota. The node still answers at least one
        batch (min_one), so a consumer always progresses."""
        if principal in self._services:
            return 0
        with self._lock:
            rate = self._rate(principal, "fetch")
        return 0 if rate <= 0 else max(1, int(rate * FETCH_WINDOW_S))

    def owed(self, principal: str, kind: str) -> float:
        """Seconds until ``principal`` is back at its rates of ``kind`` and of requests (0:
        it is not ahead): how long its next request of ``kind`` waits before it is served.
        An answer is held at most :data:`MAX_THROTTLE_S`, and what a request put the
        principal ahead of its rate beyond that would otherwise be forgiven (found from
        outside: a large request, or many in flight, passed at their size per 30 s)."""
        if not self._quotas or principal in self._services:
            return 0.0
        now = self.clock()
        owed = 0.0
        with self._lock:
            for k in (kind, "requests"):
                b = self._buckets.get((principal, k))
                if b is not None:
                    owed = max(owed, b.take(0, now))
        return owed

    def throttle(self, principal: str, kind: str, nbytes: int) -> float:
        """Account one request of ``kind`` ("produce" or "fetch") that moved ``nbytes``;
        the seconds to hold its answer back (0: within quota), at most
        :data:`MAX_THROTTLE_S` (the rest stays owed: see :meth:`owed`)."""
        if not self._quotas or principal in self._services:
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


def _by_canonical_principal(quotas: Iterable[md.ClientQuota]) -> dict[str, md.ClientQuota]:
    """``quotas`` by principal as the services derive a certificate's: an entry an older
    controller stored as typed (``User:CN=a, O=b``) applies to ``User:CN=a,O=b``; where
    both spellings are stored, the canonical one's entry wins."""
    out: dict[str, md.ClientQuota] = {}
    for q in quotas:
        principal = canonical_principal(q.principal)
        if principal not in out or q.principal == principal:
            out[principal] = q
    return out


#: The node's quotas (kept current from etcd by :func:`strom.security.follow`).
QUOTAS = QuotaManager()

#: Set while a handler calls the node's own Produce on a caller's behalf (RecordService): the
#: caller was charged where its request arrived, and the gathered call mixes callers, so the
#: inner call is not charged again (to whichever caller's context it happened to run in).
CHARGED_BY_CALLER: contextvars.ContextVar[bool] = contextvars.ContextVar(
    "strom_quota_charged_by_caller", default=False
)
