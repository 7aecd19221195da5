"""The wrapper around etcd that every strom service uses for cluster metadata.

Why a wrapper: the etcd client is synchronous, its errors are many, its watches die when etcd
restarts, and its leases need keeping alive. Here every call turns client failures into one
:class:`MetadataUnavailableError`, watches resume from the last revision they delivered (so no
event is lost or repeated across an etcd restart), leases are refreshed by a thread that
reports loss, and values are protobuf messages stored as JSON (``etcdctl get`` stays
readable). Services call the blocking methods through ``asyncio.to_thread``.
"""

from __future__ import annotations

import contextlib
import logging
import queue
import threading
import time
from collections.abc import Callable, Iterable, Sequence
from dataclasses import dataclass
from typing import Any, TypeVar

import etcd3
import etcd3.exceptions
import grpc
from etcd3 import Endpoint, MultiEndpointEtcd3Client, etcdrpc
from etcd3.etcdrpc import kv_pb2
from google.protobuf import json_format
from google.protobuf.message import Message

from strom.grpc_options import DNS_MIN_RESOLUTION_INTERVAL_MS
from strom.lograte import LogLimiter
from strom.metadata import metrics
from strom.metadata.keys import Keys
from strom.security.config import etcd as etcd_security

log = logging.getLogger("strom.metadata")
M = TypeVar("M", bound=Message)

_CLIENT_ERRORS: tuple[type[BaseException], ...] = (
    etcd3.exceptions.Etcd3Exception,
    grpc.RpcError,
    ValueError,  # the client raises it when its channel is closed under it
)


#: gRPC options of every etcd channel strom makes. etcd gives the leases it restores after an
#: outage only their TTL (2 s) and about a second more, so a channel retries within a second
#: whatever the outage lasted (gRPC's default backoff grows to 120 s), and gives each attempt
#: 2 s (``min_reconnect_backoff_ms`` is that least connect timeout). An etcd member restarted
#: under its DNS name at a new IP is looked up again within a second (DNS_OPTIONS says why).
CHANNEL_OPTIONS: tuple[tuple[str, int], ...] = (
    ("grpc.initial_reconnect_backoff_ms", 250),
    ("grpc.max_reconnect_backoff_ms", 1000),
    ("grpc.min_reconnect_backoff_ms", 2000),
    ("grpc.dns_min_time_between_resolutions_ms", DNS_MIN_RESOLUTION_INTERVAL_MS),
)


#: How often a service says again that etcd still does not answer (the first failure is
#: logged at once; the end of the outage too).
OUTAGE_LOG_INTERVAL_S = 30.0


class EtcdOutage:
    """Whether etcd answers a store's lease keep-alives and watches, told to the operator:
    the first failure is one WARNING naming etcd's endpoints and what failed, repeated at
    most every :data:`OUTAGE_LOG_INTERVAL_S`, and the first answer after it one INFO with how
    long etcd was out, as Kafka logs its ZooKeeper session's disconnect and reconnect.
    Thread-safe: keepers and watches each run in a thread of their own."""

    def __init__(self, endpoints: Sequence[tuple[str, int]]) -> None:
        self.where = ",".join(f"{h}:{p}" for h, p in endpoints)
        self._limiter = LogLimiter(OUTAGE_LOG_INTERVAL_S)

    @property
    def down(self) -> bool:
        """Whether the last keep-alive or watch that reached a verdict found etcd silent."""
        return self._limiter.active("etcd")

    def failed(self, what: str, exc: BaseException) -> None:
        """``what`` (a lease keep-alive, a watch on a prefix) did not reach etcd."""
        first = not self._limiter.active("etcd")
        left_out = self._limiter.occurred("etcd")
        if left_out is None:
            return
        fields = {"etcd": self.where, "failed": what}
        if first:
            log.warning(
                "etcd at %s does not answer (%s: %s); retrying",
                self.where,
                what,
                exc,
                extra={"fields": fields},
            )
        else:
            log.warning(
                "etcd at %s still does not answer (%s: %s; %d more failures since the last "
                "such line); retrying",
                self.where,
                what,
                exc,
                left_out,
                extra={"fields": fields},
            )

    def answered(self, what: str) -> None:
        """``what`` reached etcd: an outage that was logged ends here."""
        ended = self._limiter.ended("etcd")
        if ended is None:
            return
        out_s, _ = ended
        log.info(
            "etcd at %s answers again (%s) after %.1fs without an answer",
            self.where,
            what,
            out_s,
            extra={"fields": {"etcd": self.where, "outage_s": round(out_s, 3)}},
        )


class MetadataUnavailableError(Exception):
    """etcd could not be reached or did not answer in time (retriable)."""


class LeaseLostError(MetadataUnavailableError):
    """etcd answered that the lease a request names does not exist (NOT_FOUND "requested
    lease not found"): it expired or was revoked, and the keys on it are gone.

    Not an etcd fault: it is counted in ``strom_metadata_leases_lost_total``, not in
    ``strom_metadata_etcd_errors_total`` (StromEtcdErrors would page for a lapsed
    lease). A subclass, so code
    that handles etcd trouble in general handles it too, and :meth:`MetadataStore.retry`
    still retries it: a retried call may read a lease renewed meanwhile (a storage node's
    state write takes the lease of its re-registration)."""


class EtcdNoSpaceError(MetadataUnavailableError):
    """etcd refused a write because it is out of space: its NOSPACE alarm is raised
    (RESOURCE_EXHAUSTED "etcdserver: mvcc: database space exceeded", the database reached
    its --quota-backend-bytes), and it refuses every write until an operator frees space and
    clears the alarm. Reads, deletes and lease keepalives still work.

    The controller answers METADATA_STORE_FULL (not retriable: retrying cannot help) with
    this error's message, and the store logs it at most once a minute. A subclass all the
    same, so the services' background work goes on retrying as when etcd is down, and
    resumes once the alarm is cleared."""


#: Monotonic time of the last log line about etcd's NOSPACE alarm, and writes refused since.
_no_space_logged_at: float | None = None
_no_space_refused = 0
_no_space_lock = threading.Lock()
#: At most one such line a minute per process (a service), whatever the number of writes.
NO_SPACE_LOG_INTERVAL_S = 60.0


def _is_no_space(exc: BaseException) -> bool:
    if not isinstance(exc, grpc.RpcError) or not callable(getattr(exc, "code", None)):
        return False
    return exc.code() == grpc.StatusCode.RESOURCE_EXHAUSTED and "space exceeded" in (
        exc.details() or ""
    )


def _no_space(exc: BaseException) -> EtcdNoSpaceError:
    """The error for a write etcd refused for lack of space; logs one line a minute."""
    global _no_space_logged_at, _no_space_refused
    err = EtcdNoSpaceError(
        f"etcd is out of space: its NOSPACE alarm is raised ({_describe(exc)}) and it "
        "refuses every write until an operator frees space and clears the alarm: compact "
        "its history (etcdctl compact <current revision>), defragment it (etcdctl defrag "
        "--cluster), then etcdctl alarm disarm; or raise its --quota-backend-bytes"
    )
    with _no_space_lock:
        _no_space_refused += 1
        now = time.monotonic()
        if _no_space_logged_at is not None and now - _no_space_logged_at < NO_SPACE_LOG_INTERVAL_S:
            return err
        refused, _no_space_logged_at, _no_space_refused = _no_space_refused, now, 0
    log.error("%s (writes refused since the last such line: %d)", err, refused)
    return err


def _describe(exc: BaseException) -> str:
    """One line for a client error: a gRPC error's status code and details (its ``str`` is
    a multi-line dump of the call's debug string), else the exception's name and text."""
    if isinstance(exc, grpc.RpcError) and callable(getattr(exc, "code", None)):
        code = exc.code()
        return f"{getattr(code, 'name', code)}: {exc.details()}"
    return f"{type(exc).__name__}: {exc}"


def _is_lease_not_found(exc: BaseException) -> bool:
    if not isinstance(exc, grpc.RpcError) or not callable(getattr(exc, "code", None)):
        return False
    return exc.code() == grpc.StatusCode.NOT_FOUND and "lease not found" in (exc.details() or "")


def _lease_id(lease: Any) -> int | None:
    return None if lease is None else int(getattr(lease, "id", lease))


def parse_endpoints(spec: str | Sequence[str]) -> list[tuple[str, int]]:
    """``"host:port,host2:port2"`` (or a list of them) → [(host, port), ...]."""
    items = spec.split(",") if isinstance(spec, str) else list(spec)
    out: list[tuple[str, int]] = []
    for raw in items:
        item = raw.strip()
        if not item:
            continue
        item = item.removeprefix("http://")
        host, sep, port = item.rpartition(":")
        if not sep or not host or not port.isdigit():
            raise ValueError(f"etcd endpoint {raw!r} is not HOST:PORT")
        out.append((host, int(port)))
    if not out:
        raise ValueError("no etcd endpoint given (expected HOST:PORT[,HOST:PORT...])")
    return out


def encode(msg: Message) -> str:
    """Protobuf → the JSON stored in etcd (field names as in the .proto)."""
    return json_format.MessageToJson(
        msg,
        preserving_proto_field_name=True,
        always_print_fields_with_no_presence=True,
        indent=None,
        sort_keys=True,
    )


def decode(data: bytes | str, cls: type[M]) -> M:
    """Stored JSON → protobuf; unknown fields from newer writers are ignored."""
    return json_format.Parse(data, cls(), ignore_unknown_fields=True)


@dataclass(frozen=True)
class Versioned:
    """A value read from etcd with the revisions needed for compare-and-swap."""

    key: str
    value: Any
    mod_revision: int
    create_revision: int


@dataclass(frozen=True)
class WatchEvent:
    """One change: ``value`` is None for a delete."""

    key: str
    value: bytes | None
    mod_revision: int


class MetadataStore:
    """Blocking access to one cluster's keys in etcd."""

    def __init__(
        self, endpoints: str | Sequence[str], cluster: str, *, timeout: float = 5.0
    ) -> None:
        self.endpoints = parse_endpoints(endpoints)
        #: Outages of etcd as this store's keep-alives and watches see them (logged).
        self.outage = EtcdOutage(self.endpoints)
        self.keys = Keys(cluster)
        self.timeout = timeout
        tls = etcd_security()
        creds = tls.credentials()
        #: gRPC channel credentials for etcd (None: plaintext); the lease keepalives' own
        #: client needs them too.
        self.creds = creds
        self.client = MultiEndpointEtcd3Client(
            [
                Endpoint(
                    h,
                    p,
                    secure=creds is not None,
                    creds=creds,
                    time_retry=0.5,
                    opts=list(CHANNEL_OPTIONS),
                )
                for h, p in self.endpoints
            ],
            timeout=timeout,
            failover=True,
        )
        self._closed = False

    def close(self) -> None:
        self._closed = True
        with contextlib.suppress(Exception):
            self.client.close()

    def _call(self, fn: Callable[..., Any], *args: Any, **kwargs: Any) -> Any:
        started = time.perf_counter()
        try:
            result = fn(*args, **kwargs)
        except _CLIENT_ERRORS as exc:
            if _is_lease_not_found(exc):  # etcd answered: the lease is gone
                metrics.observe(metrics.op_name(fn), started, failed=False)
                raise LeaseLostError(f"etcd lease expired: {_describe(exc)}") from None
            metrics.observe(metrics.op_name(fn), started, failed=True)
            if _is_no_space(exc):
                raise _no_space(exc) from exc
            raise MetadataUnavailableError(f"etcd unavailable: {_describe(exc)}") from exc
        metrics.observe(metrics.op_name(fn), started, failed=False)
        return result

    def retry(self, fn: Callable[[], Any], *, deadline_s: float) -> Any:
        """Call ``fn`` until it stops raising :class:`MetadataUnavailableError` or time runs out.

        :class:`EtcdNoSpaceError` is raised at once: only an operator ends it."""
        end = time.monotonic() + deadline_s
        delay = 0.05
        while True:
            try:
                return fn()
            except EtcdNoSpaceError:
                raise
            except MetadataUnavailableError:
                if time.monotonic() + delay > end or self._closed:
                    raise
                time.sleep(delay)
                delay = min(delay * 2, 0.5)

    # -- reads -----------------------------------------------------------------------------

    def get(self, key: str, cls: type[M]) -> Versioned | None:
        value, meta = self._call(self.client.get, key)
        if value is None:
            return None
        return Versioned(key, decode(value, cls), meta.mod_revision, meta.create_revision)

    def get_prefix(self, prefix: str, cls: type[M]) -> tuple[int, dict[str, Versioned]]:
        """All keys under ``prefix`` and the store revision of that snapshot."""
        resp = self._call(self.client.get_prefix_response, prefix)
        out: dict[str, Versioned] = {}
        for kv in resp.kvs:
            key = kv.key.decode()
            out[key] = Versioned(key, decode(kv.value, cls), kv.mod_revision, kv.create_revision)
        return resp.header.revision, out

    def get_prefix_cached(
        self, prefix: str, cls: type[M], cache: dict[str, tuple[int, M]], *, whole: bool = True
    ) -> tuple[int, dict[str, Versioned]]:
        """:meth:`get_prefix`, decoding only values whose mod_revision ``cache`` does not hold.

        Decoding the stored JSON costs far more than the read (about 0.1 ms a partition state
        on a busy machine): a controller that re-reads every partition on each change spent
        most of a 1,000-partition failover parsing states that had not changed. ``cache``
        (key -> (mod_revision, message)) is replaced by what this read saw (``whole``: the
        cache holds this prefix only), or, with ``whole=False`` (a narrower prefix of what the
        cache holds), updated with it; callers get copies, so they may change them."""
        resp = self._call(self.client.get_prefix_response, prefix)
        out: dict[str, Versioned] = {}
        seen: dict[str, tuple[int, M]] = {}
        for kv in resp.kvs:
            key = kv.key.decode()
            hit = cache.get(key)
            fresh = hit is not None and hit[0] == kv.mod_revision
            msg = hit[1] if fresh else decode(kv.value, cls)  # type: ignore[index]
            seen[key] = (kv.mod_revision, msg)
            value = cls()
            value.CopyFrom(msg)
            out[key] = Versioned(key, value, kv.mod_revision, kv.create_revision)
        if whole:
            cache.clear()
        else:  # keys under the prefix that are gone
            for key in [k for k in cache if k.startswith(prefix) and k not in seen]:
                del cache[key]
        cache.update(seen)
        return resp.header.revision, out

    def get_prefix_raw(self, prefix: str) -> tuple[int, list[WatchEvent]]:
        """All keys under ``prefix`` undecoded (as put events) and the snapshot revision."""
        resp = self._call(self.client.get_prefix_response, prefix)
        items = [WatchEvent(kv.key.decode(), kv.value, kv.mod_revision) for kv in resp.kvs]
        return resp.header.revision, items

    def revision(self) -> int:
        resp = self._call(self.client.get_response, self.keys.cluster)
        return int(resp.header.revision)

    # -- writes ----------------------------------------------------------------------------

    def put(self, key: str, msg: Message, *, lease: Any = None) -> None:
        try:
            self._call(self.client.put, key, encode(msg), lease=lease)
        except LeaseLostError:
            metrics.lease_lost(_lease_id(lease))
            raise

    def create(self, key: str, msg: Message, *, lease: Any = None) -> bool:
        """Write ``key`` only if it does not exist; True if this call created it."""
        t = self.client.transactions
        try:
            ok, _ = self._call(
                self.client.transaction,
                compare=[t.create(key) == 0],
                success=[t.put(key, encode(msg), lease=lease)],
                failure=[],
            )
        except LeaseLostError:
            metrics.lease_lost(_lease_id(lease))
            raise
        return bool(ok)

    def cas(self, key: str, msg: Message, expected_mod_revision: int) -> bool:
        """Write ``key`` only if its mod_revision is still ``expected_mod_revision``
        (0: only if absent). This is what fences a deposed writer."""
        return self.txn([(key, expected_mod_revision)], puts=[(key, msg)])

    def txn(
        self,
        compares: Iterable[tuple[str, int]],
        *,
        puts: Iterable[tuple[str, Message]] = (),
        deletes: Iterable[str] = (),
        delete_prefixes: Iterable[str] = (),
    ) -> bool:
        """One atomic transaction: all ``compares`` (key, mod_revision; 0 = absent) hold,
        then every put and delete applies; otherwise nothing does."""
        t = self.client.transactions
        cmp = [t.mod(k) == rev if rev else t.create(k) == 0 for k, rev in compares]
        ops = [t.put(k, encode(m)) for k, m in puts]
        ops += [t.delete(k) for k in deletes]
        ops += [
            t.delete(p, range_end=etcd3.utils.prefix_range_end(etcd3.utils.to_bytes(p)))
            for p in delete_prefixes
        ]
        ok, _ = self._call(self.client.transaction, compare=cmp, success=ops, failure=[])
        return bool(ok)

    def delete(self, key: str) -> bool:
        return bool(self._call(self.client.delete, key))

    def delete_prefix(self, prefix: str) -> None:
        self._call(self.client.delete_prefix, prefix)

    def delete_if_owner(self, key: str, create_revision: int) -> bool:
        """Delete ``key`` only if it is still the incarnation created at ``create_revision``."""
        t = self.client.transactions
        ok, _ = self._call(
            self.client.transaction,
            compare=[t.create(key) == create_revision],
            success=[t.delete(key)],
            failure=[],
        )
        return bool(ok)

    # -- leases, watches, elections --------------------------------------------------------

    def grant_lease(self, ttl_s: int) -> Any:
        """A new lease, carrying ``sent_at``: etcd starts its TTL after this monotonic time
        (the keeper's :meth:`KeepAlive.may_have_expired` counts from it)."""
        sent = time.monotonic()
        lease = self._call(self.client.lease, ttl_s)
        lease.sent_at = sent
        return lease

    def revoke_lease_if(self, key: str, cls: type[M], predicate: Callable[[M], bool]) -> bool:
        """Revoke the lease ``key`` is bound to (deleting the key and everything else on that
        lease), but only while its value satisfies ``predicate`` (e.g. is still the same
        incarnation). True if a lease was revoked."""
        value, meta = self._call(self.client.get, key)
        if value is None or not meta.lease_id or not predicate(decode(value, cls)):
            return False
        self._call(self.client.revoke_lease, meta.lease_id)
        return True

    def keep_alive(self, lease: Any, on_lost: Callable[[], None]) -> KeepAlive:
        return KeepAlive(self, lease, on_lost)

    def watch_prefix(
        self,
        prefix: str,
        start_revision: int,
        callback: Callable[[list[WatchEvent], int], None],
        on_reset: Callable[[], int | None] | None = None,
    ) -> Watch:
        """Deliver every change under ``prefix`` from ``start_revision`` on, in order.

        When etcd no longer has the changes to resume from (compacted away, or its history
        lost: its data wiped or restored from an older backup), ``on_reset``
        takes a new snapshot and may return its revision: the watch goes on after it (else
        after etcd's revision read just before ``on_reset``)."""
        return Watch(self, prefix, start_revision, callback, on_reset)


class KeepAlive:
    """Refreshes a lease every third of its TTL in a daemon thread.

    ``on_lost`` runs once when etcd says the lease is gone (it expired while this process
    could not reach etcd): whoever owns keys under it must re-register or step down.
    Connection errors alone are retried, since etcd restores leases after a restart.

    The refreshes go through a client of their own whose calls time out after a third of the
    TTL (at least 0.5 s) and fail over to the next etcd member: with the store's 5 s timeout,
    one etcd member that stopped answering (paused, partitioned away) held the refresh past a
    2 s TTL, so every process talking to that member lost its lease at once — a single etcd
    fault looked like every storage node dying together.
    """

    def __init__(self, store: MetadataStore, lease: Any, on_lost: Callable[[], None]) -> None:
        self.store = store
        self.lease = lease
        self.ttl = int(lease.ttl)
        self._on_lost = on_lost
        self._stop = threading.Event()
        self.lost = False
        #: Whether the lease was counted lost as surely expired (before etcd could say so).
        self.counted_expired = False
        #: Successful refreshes so far (the first one also sets up the connection).
        self.refreshes = 0
        #: Refreshes that did not reach etcd so far.
        self.failures = 0
        #: Monotonic time of the last answer that the lease lives (at first: now, after the
        #: grant). etcd ends the lease at most ``ttl`` after it.
        self.alive_at = time.monotonic()
        #: Monotonic time the last refresh (at first: the grant) that etcd answered alive was
        #: *sent*: etcd restarts the TTL when it handles it, after this, so the lease lives at
        #: least ``ttl`` after it (see :meth:`may_have_expired`).
        self.renewed_from: float = getattr(lease, "sent_at", self.alive_at)
        self._short_timeout = max(self.ttl / 3.0, 0.5)
        # The first refresh also sets up the connection, which can be slow on a loaded
        # machine, but not so slow that it may outlast the lease: it runs a third of the TTL
        # after the grant and gets half the TTL, so a silent first member still leaves time
        # to fail over to the next one; the following refreshes get the short timeout.
        self._client = MultiEndpointEtcd3Client(
            [
                Endpoint(
                    h,
                    p,
                    secure=store.creds is not None,
                    creds=store.creds,
                    time_retry=0.5,
                    # A channel of its own: gRPC otherwise shares subchannels (and their
                    # reconnect backoff) with every channel of the process to that address.
                    opts=[("grpc.use_local_subchannel_pool", 1), *CHANNEL_OPTIONS],
                )
                for h, p in store.endpoints
            ],
            timeout=min(store.timeout, max(self.ttl / 2.0, self._short_timeout)),
            failover=True,
        )
        self._thread = threading.Thread(target=self._run, name=f"lease-{lease.id}", daemon=True)
        self._thread.start()

    def refresh(self) -> list[Any]:
        """One keepalive round trip (named like etcd3's Lease.refresh for the metrics)."""
        self._retry_an_endpoint()
        try:
            return list(self._client.refresh_lease(self.lease.id))
        finally:
            self._client.timeout = self._short_timeout

    def _retry_an_endpoint(self) -> None:
        """When every endpoint failed recently, make the one that failed first usable again:
        with none usable the client tries none (NoServerAvailableError), and the keeper's
        retries every 250 ms would miss the second or so etcd leaves a restored lease. The
        keeper paces its retries itself; failover to a member that has not failed is kept."""
        endpoints = list(self._client.endpoints.values())
        if endpoints and all(ep.is_failed() for ep in endpoints):
            min(endpoints, key=lambda ep: ep.last_failed).last_failed = 0

    def _run(self) -> None:
        interval = max(self.ttl / 3.0, 0.2)
        try:
            self._loop(interval)
        finally:
            with contextlib.suppress(Exception):
                self._client.close()

    def _loop(self, interval: float) -> None:
        while not self._stop.wait(interval):
            sent = time.monotonic()
            try:
                resps = self.store._call(self.refresh)
            except MetadataUnavailableError as exc:
                metrics.keepalive_failed()
                self.failures += 1
                self.store.outage.failed(f"keep-alive of lease {self.lease.id:x}", exc)
                if not self.counted_expired and self.surely_expired():
                    # Counted now, not when etcd can say so: a process cut off from etcd
                    # hears it only at the heal, and the loss (its keys gone, its leaderships
                    # moved) happened a TTL after the last refresh. Once per lease.
                    self.counted_expired = True
                    metrics.lease_lost(_lease_id(self.lease))
                    log.warning(
                        "lease %x surely expired: no refresh reached etcd for its %d s TTL",
                        self.lease.id,
                        self.ttl,
                    )
                interval = 0.25  # keep trying quickly until etcd is back
                continue
            self.store.outage.answered(f"keep-alive of lease {self.lease.id:x}")
            interval = max(self.ttl / 3.0, 0.2)
            if resps and resps[0].TTL > 0:
                self.refreshes += 1
                self.alive_at = time.monotonic()
                self.renewed_from = sent
            if not resps or resps[0].TTL <= 0:
                self.lost = True
                metrics.lease_lost(_lease_id(self.lease))
                log.warning("lease %x lost", self.lease.id)
                with contextlib.suppress(Exception):
                    self._on_lost()
                return

    def surely_expired(self) -> bool:
        """The lease is lost, or no refresh has succeeded for longer than its TTL, so etcd
        has ended it (unless an etcd leader change renewed it) even though this process has
        not heard so yet: it was paused (SIGSTOP, a long GC) or cannot reach etcd. Its keys
        are gone and others may own what they stood for."""
        return self.lost or time.monotonic() - self.alive_at > self.ttl

    def may_have_expired(self) -> bool:
        """The lease is lost, or etcd may have ended it: no refresh sent within its TTL has
        been answered alive. Until then it surely lives (etcd handled that refresh after it
        was sent), so nobody else can own what its keys stand for; after it, someone may.

        For deciding whether to go on acting on the lease's behalf (the active controller's
        answers, :meth:`strom.controller.activation.ActiveRole.acting_as_active`): it turns
        earlier than :meth:`surely_expired` by the last refresh's round trip, the stretch in
        which a standby may already have taken over."""
        return self.lost or time.monotonic() - self.renewed_from > self.ttl

    def stop(self, *, revoke: bool = True) -> None:
        self._stop.set()
        if revoke and not self.lost:
            try:
                self.store._call(self.lease.revoke)
            except LeaseLostError:
                # It expired before this keeper saw it: an active controller sees its
                # election key vanish first and resigns, stopping the keeper; count it.
                self.lost = True
                metrics.lease_lost(_lease_id(self.lease))
                log.warning("lease %x lost (found when revoking it)", self.lease.id)
            except Exception:
                pass


class _WatchStream:
    """One gRPC Watch stream of etcd carrying one watch, and the means to end it."""

    def __init__(self, client: MultiEndpointEtcd3Client, request: Any) -> None:
        # The requests gRPC sends: the create request, then nothing until close() ends them
        # (which also ends gRPC's thread that waits for the next request).
        self._requests: queue.SimpleQueue[Any] = queue.SimpleQueue()
        self._requests.put(request)
        self.responses = etcdrpc.WatchStub(client.channel).Watch(
            iter(self._requests.get, None),
            credentials=client.call_credentials,
            metadata=client.metadata,
        )

    def close(self) -> None:
        self._requests.put(None)
        self.responses.cancel()


class Watch:
    """A prefix watch that survives etcd restarts by resuming after the last revision seen.

    Each watch has a gRPC stream of its own, read by its own thread, and is cancelled by
    ending that stream: etcd numbers watches per stream, so with the etcd3 client's shared
    Watcher (renewed on any timeout) cancelling one watch by id could remove another.
    """

    def __init__(
        self,
        store: MetadataStore,
        prefix: str,
        start_revision: int,
        callback: Callable[[list[WatchEvent], int], None],
        on_reset: Callable[[], int | None] | None,
    ) -> None:
        self.store = store
        self.prefix = prefix
        self.next_revision = start_revision
        self._callback = callback
        self._on_reset = on_reset
        self._lock = threading.Lock()
        self._stream: _WatchStream | None = None
        self._stopped = threading.Event()
        self._thread = threading.Thread(target=self._supervise, name=f"watch-{prefix}", daemon=True)
        self._thread.start()

    def _create_watch(self) -> tuple[_WatchStream, Any]:
        """Open a stream and create the watch on it from ``next_revision``: the stream and
        etcd's first answer (``created``; with ``compact_revision`` set if that revision is
        compacted away)."""
        key = etcd3.utils.to_bytes(self.prefix)
        request = etcdrpc.WatchRequest(
            create_request=etcdrpc.WatchCreateRequest(
                key=key,
                range_end=etcd3.utils.prefix_range_end(key),
                start_revision=self.next_revision,
            )
        )
        stream = _WatchStream(self.store.client, request)
        # An etcd that holds the connection without answering (paused) must not hold the
        # creation for ever: it is given the store's timeout, as other requests are.
        timer = threading.Timer(self.store.timeout, stream.close)
        timer.daemon = True
        timer.start()
        try:
            return stream, next(stream.responses)
        except StopIteration:  # etcd ended the stream without a word: as if unreachable
            stream.close()
            raise etcd3.exceptions.ConnectionFailedError() from None
        except grpc.RpcError as exc:
            stream.close()
            if exc.code() == grpc.StatusCode.CANCELLED and not self._stopped.is_set():
                raise etcd3.exceptions.WatchTimedOut() from None
            # As the client's own calls do: mark the endpoint failed, so that the next
            # attempt fails over to another etcd member.
            self.store.client._manage_grpc_errors(exc)
            raise
        finally:
            timer.cancel()

    def _deliver(self, raw_events: Iterable[Any]) -> None:
        events = []
        for ev in raw_events:
            value = None if ev.type == kv_pb2.Event.DELETE else ev.kv.value
            events.append(WatchEvent(ev.kv.key.decode(), value, ev.kv.mod_revision))
        with self._lock:
            fresh = [e for e in events if e.mod_revision >= self.next_revision]
            if fresh:
                self.next_revision = fresh[-1].mod_revision + 1
        if fresh:
            try:
                self._callback(fresh, fresh[-1].mod_revision)
            except Exception:  # a bug in a callback must not kill the watch
                log.exception("watch callback for %s failed", self.prefix)

    def _follow(self, stream: _WatchStream, first: Any) -> str | None:
        """Deliver the stream's events until it ends; the reason to reset if etcd no longer
        has the revision to resume from: ``compacted``, or ``history_lost`` when etcd's
        revision is below the last one delivered.

        An etcd restarted on an empty data dir (wiped, or restored from an older backup)
        accepts a watch from a future revision and stays silent until it gets there: the
        ``created`` answer's header revision below the last one delivered means etcd lost
        history (it never goes back otherwise), and the owner resyncs.

        etcd 3.4 answers a watch from a compacted revision with ``created`` and then a
        separate cancel naming the compaction: that is a reset, not a broken stream."""
        if first.created and first.header.revision < self.next_revision - 1:
            return "history_lost"
        resp = first
        try:
            while not self._stopped.is_set():
                if resp.compact_revision:
                    return "compacted"
                if resp.canceled:
                    return None
                if resp.events:
                    self._deliver(resp.events)
                resp = next(stream.responses)
        except (grpc.RpcError, StopIteration):
            pass  # the stream died (etcd down or restarted, or cancel()): re-watch
        except Exception:  # the thread must live on: the stream is made again
            log.exception("watch on %s failed", self.prefix)
        return None

    def _supervise(self) -> None:
        delay = 0.1
        while not self._stopped.is_set() and not self.store._closed:
            try:
                stream, first = self.store._call(self._create_watch)
            except MetadataUnavailableError as exc:
                if not self._stopped.is_set():
                    self.store.outage.failed(f"watch on {self.prefix}", exc)
                self._stopped.wait(delay)
                delay = min(delay * 2, 1.0)
                continue
            self.store.outage.answered(f"watch on {self.prefix}")
            with self._lock:
                if self._stopped.is_set():
                    stream.close()
                    return
                self._stream = stream
            delay = 0.1
            try:
                lost = self._follow(stream, first)
            finally:
                stream.close()
            if lost is not None:
                self._reset(lost)
            else:
                self._stopped.wait(0.1)

    def _reset(self, reason: str) -> None:
        """The revision to resume from is gone: the owner takes a new snapshot (``on_reset``,
        which may return the snapshot's revision) and the watch goes on after it.

        ``next_revision`` moves only once the snapshot is taken, and a snapshot that fails is
        retried until it succeeds (or the watch is cancelled): otherwise the watch would go on
        from a revision whose earlier changes its owner never saw."""
        metrics.watch_reset(reason)
        log.warning("watch on %s lost its place (%s): resyncing", self.prefix, reason)
        delay = 0.2
        while not self._stopped.is_set() and not self.store._closed:
            try:
                # Read before the snapshot: without a revision from on_reset, the watch
                # resumes after this one, which misses nothing (at worst repeats changes).
                current = self.store.revision()
                snapshot = self._on_reset() if self._on_reset is not None else None
            except MetadataUnavailableError as exc:
                log.warning("watch on %s cannot resync yet (retrying): %s", self.prefix, exc)
            except Exception:
                log.exception("resync of the watch on %s failed (retrying)", self.prefix)
            else:
                with self._lock:
                    self.next_revision = (snapshot if isinstance(snapshot, int) else current) + 1
                return
            self._stopped.wait(delay)
            delay = min(delay * 2, 5.0)

    def cancel(self) -> None:
        with self._lock:
            self._stopped.set()
            stream = self._stream
        if stream is not None:
            stream.close()


class Election:
    """Leader election on one lease-bound key (the lowest create revision wins: the key
    exists only while its creator's lease lives).

    ``on_elected(create_revision)`` runs when this candidate wins; ``on_lost()`` when it
    loses leadership (lease expired). Candidates that lose keep campaigning.
    """

    def __init__(
        self,
        store: MetadataStore,
        key: str,
        value: Message,
        *,
        ttl_s: int,
        on_elected: Callable[[int], None],
        on_lost: Callable[[], None],
    ) -> None:
        self.store = store
        self.key = key
        self.value = value
        self.ttl_s = ttl_s
        self._on_elected = on_elected
        self._on_lost = on_lost
        self._stop = threading.Event()
        self._changed = threading.Event()
        self.leader = False
        self.create_revision = 0
        self._keepalive: KeepAlive | None = None
        self._thread = threading.Thread(target=self._run, name="election", daemon=True)
        self._watch: Watch | None = None
        #: A campaign (create the key, keep its lease alive) and resign() exclude each other:
        #: a campaign that created the key after resign() deleted it would leave a key no
        #: one will ever give up, held by a candidate its owner has dropped, and no candidate
        #: (the owner's next one included) could win until the process exits.
        self._campaign_lock = threading.Lock()

    def start(self) -> None:
        self._thread.start()

    def _lease_lost(self) -> None:
        if self.leader:
            self.leader = False
            with contextlib.suppress(Exception):
                self._on_lost()
        self._changed.set()

    def _run(self) -> None:
        rev = 0
        while not self._stop.is_set():
            try:
                rev = self.store.revision()
                break
            except MetadataUnavailableError:
                self._stop.wait(0.2)
        self._watch = self.store.watch_prefix(
            self.key, rev + 1, lambda evs, r: self._changed.set(), self._changed.set
        )
        while not self._stop.is_set():
            self._changed.clear()
            if not self.leader:
                try:
                    self._campaign_once()
                except MetadataUnavailableError:
                    self._stop.wait(0.2)
                    continue
            # Wake on any change of the key (deletion by expiry or resignation) or lease loss;
            # the timeout is a safety net for a missed event, not the mechanism.
            self._changed.wait(timeout=max(self.ttl_s, 1))

    def _campaign_once(self) -> None:
        lease = self.store.grant_lease(self.ttl_s)
        won = False
        with self._campaign_lock:
            if not self._stop.is_set() and self.store.create(self.key, self.value, lease=lease):
                current = self.store.get(self.key, type(self.value))
                self.create_revision = current.create_revision if current else 0
                self._keepalive = self.store.keep_alive(lease, self._lease_lost)
                self.leader = won = True
        if won:
            self._on_elected(self.create_revision)
        else:
            with contextlib.suppress(MetadataUnavailableError):
                self.store._call(lease.revoke)

    def resign(self) -> None:
        """Stop campaigning; if leading, delete the key so a standby takes over at once."""
        self._stop.set()
        self._changed.set()
        with self._campaign_lock:  # a campaign running now either finished or will not start
            if self._watch is not None:
                self._watch.cancel()
            if self.leader:
                self.leader = False
                with contextlib.suppress(MetadataUnavailableError):
                    self.store.delete_if_owner(self.key, self.create_revision)
            if self._keepalive is not None:
                self._keepalive.stop(revoke=True)
