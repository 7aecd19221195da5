"""Metrics of the etcd client every service uses (labelled by the process's role).

Observed in :meth:`strom.metadata.store.MetadataStore._call`, the one place every etcd
request passes through, and in the lease keep-alive thread. etcd traffic is control-plane
only (registrations, watches, admin writes), so a timer per call costs nothing that matters.
"""

from __future__ import annotations

import threading
import time
from collections.abc import Callable
from typing import Any

from prometheus_client import Counter, Histogram

from strom.service import metrics as service_metrics

ETCD_REQUEST = Histogram(
    "strom_metadata_etcd_request_seconds",
    "Time of an etcd request made by this service, by operation (failed ones included)",
    ["service", "op"],
    buckets=(0.0005, 0.001, 0.0025, 0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1.0, 2.5, 5.0),
)
ETCD_ERRORS = Counter(
    "strom_metadata_etcd_errors",
    "etcd requests that failed (unreachable, timed out, refused), by operation",
    ["service", "op"],
)
KEEPALIVE_FAILURES = Counter(
    "strom_metadata_lease_keepalive_failures",
    "Lease refreshes that did not reach etcd (retried every 250 ms until the lease expires)",
    ["service"],
)
LEASES_LOST = Counter(
    "strom_metadata_leases_lost",
    "Leases etcd reported expired (to a refresh, a write on the lease or its revocation) "
    "or that surely expired (no refresh reached etcd for the whole TTL), each lease once: "
    "the registration, election or shard keys on them are gone",
    ["service"],
)
WATCH_RESETS = Counter(
    "strom_metadata_watch_resets",
    "Watches whose next revision etcd no longer has (compacted: it fell behind etcd's "
    "history; history_lost: etcd's revision went back, its data wiped or restored from an "
    "older backup), so their owner took a new snapshot (each reset counted once, however "
    "many tries its snapshot takes)",
    ["service", "reason"],
)

#: etcd3 client method names -> the operation names used as label values.
_OPS = {
    "get": "get",
    "get_response": "get",
    "get_prefix_response": "range",
    "put": "put",
    "delete": "delete",
    "delete_prefix": "delete",
    "transaction": "txn",
    "lease": "lease_grant",
    "revoke_lease": "lease_revoke",
    "revoke": "lease_revoke",
    "refresh": "lease_keepalive",
    "_create_watch": "watch",
}

_children: dict[tuple[str, str], tuple[Any, Any]] = {}


def op_name(fn: Callable[..., Any]) -> str:
    name = getattr(fn, "__name__", "other")
    return _OPS.get(name, name)


def _child(op: str) -> tuple[Any, Any]:
    key = (service_metrics.SERVICE, op)
    c = _children.get(key)
    if c is None:
        c = _children[key] = (ETCD_REQUEST.labels(*key), ETCD_ERRORS.labels(*key))
    return c


def observe(op: str, started: float, failed: bool) -> None:
    """Record one etcd request that began at ``started`` (``time.perf_counter()``)."""
    hist, errors = _child(op)
    hist.observe(time.perf_counter() - started)
    if failed:
        errors.inc()


def keepalive_failed() -> None:
    KEEPALIVE_FAILURES.labels(service_metrics.SERVICE).inc()


#: Lease ids already counted lost (several places can learn of one loss: the keeper's
#: refresh, a write on the lease, revoking it), oldest first.
_lost_ids: dict[int, None] = {}
_lost_lock = threading.Lock()


def lease_lost(lease_id: int | None = None) -> None:
    """Count a lost lease, once per lease id (None: count it)."""
    if lease_id is not None:
        with _lost_lock:
            if lease_id in _lost_ids:
                return
            _lost_ids[lease_id] = None
            if len(_lost_ids) > 1000:
                del _lost_ids[next(iter(_lost_ids))]
    LEASES_LOST.labels(service_metrics.SERVICE).inc()


def watch_reset(reason: str) -> None:
    WATCH_RESETS.labels(service_metrics.SERVICE, reason).inc()


def init_service() -> None:
    """Create this role's lease and watch reset series at 0, so dashboards show them before
    anything fails."""
    KEEPALIVE_FAILURES.labels(service_metrics.SERVICE)
    LEASES_LOST.labels(service_metrics.SERVICE)
    for reason in ("compacted", "history_lost"):
        WATCH_RESETS.labels(service_metrics.SERVICE, reason)
