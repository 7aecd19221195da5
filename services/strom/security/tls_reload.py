"""A service's TLS files, read again when they change: certificates rotate without a restart.

Why: on Kubernetes a certificate is renewed by updating the Secret the pod mounts
(cert-manager renews at two thirds of its life). A service that read ``--tls-cert``,
``--tls-key`` and ``--tls-ca`` only at start kept serving, and dialling the other services
with, the old certificate until it expired; from then on every new connection failed, and
only a rolling restart helped. Now the listener takes the files in force at each new
connection (gRPC's dynamic server credentials ask :meth:`TlsFiles.server_config` before
every handshake), and channels to other services are made again with them
(:class:`strom.security.channel.ChannelCache`).

The files are looked at (``stat``) at most once a second. A changed set is read and checked
like the files at start (the key is the certificate's, the certificate is valid now); a set
that fails is not used and the files in force stay. One that still fails at the next look, a
second later (not a certificate copied a moment before its key), is logged once and counted in
``strom_service_tls_reload_errors_total``. A certificate that is not valid *yet* (its
issuer's clock a few seconds ahead of ours) is not refused for good: it is logged once and
taken at the first look once it is valid.
``strom_service_tls_certificate_expiry_timestamp_seconds`` is the end of the validity of the
certificate in force, for the alert that warns before it expires.
"""

from __future__ import annotations

import logging
import os
import threading
import time
from collections.abc import Callable
from datetime import UTC, datetime
from pathlib import Path

import grpc
from prometheus_client import Counter, Gauge

from strom.security.channel import _read
from strom.service import metrics as service_metrics

log = logging.getLogger("strom.security")

RELOAD_ERRORS = Counter(
    "strom_service_tls_reload_errors",
    "Changed versions of --tls-cert, --tls-key or --tls-ca that were not used, each counted "
    "once: unreadable, not PEM, a key that is not the certificate's, a certificate not valid "
    "now; the files in force stay and the log says why",
    ["service"],
)
CERT_EXPIRY = Gauge(
    "strom_service_tls_certificate_expiry_timestamp_seconds",
    "When the certificate this service serves and dials with (--tls-cert, as last read) "
    "stops being valid, in seconds since the epoch",
    ["service"],
)

ETCD_CERT_EXPIRY = Gauge(
    "strom_service_etcd_certificate_expiry_timestamp_seconds",
    "When the client certificate this service presents to etcd (--etcd-cert) stops being "
    "valid, in seconds since the epoch; read at start only, so a renewed one counts (and is "
    "used) after a restart",
    ["service"],
)

Files = tuple[bytes, bytes, bytes | None]
Check = Callable[[bytes, bytes, bytes | None], None]

#: How often the files are looked at, at most (seconds).
POLL_INTERVAL_S = 1.0


def _not_after(cert_pem: bytes) -> datetime:
    from cryptography import x509

    return x509.load_pem_x509_certificate(cert_pem).not_valid_after_utc


class TlsFiles:
    """The certificate, key and CA bundle in force, and where they are read from.

    ``check`` raises ValueError naming what is wrong with a set (the start's checks);
    ``generation`` grows by one each time a new set is taken. Thread-safe: gRPC asks for the
    server's configuration from its own threads."""

    def __init__(
        self,
        paths: tuple[str | Path, str | Path, str | Path | None],
        files: Files,
        check: Check,
        clock: Callable[[], float] = time.monotonic,
    ) -> None:
        self.paths = paths
        self._files = files
        self._check = check
        self._clock = clock
        self._lock = threading.Lock()
        self._stamp = self._stamp_now()
        #: A changed set that could not be used at the last look: refused (logged, counted)
        #: only if it is still the same at the next one, since a certificate copied before
        #: its key fails for a moment.
        self._suspect: tuple[object, ...] | None = None
        #: The last look left such a set: the next should come after POLL_INTERVAL_S, not
        #: whenever traffic or the idle service's timer brings it.
        self.look_again_soon = False
        #: Sets refused so far.
        self.refusals = 0
        self._next_look = clock() + POLL_INTERVAL_S
        #: A changed set whose certificate is not valid yet, and when it becomes valid (epoch
        #: seconds): looked at again from then on, and not logged again meanwhile.
        self._early: tuple[tuple[object, ...], float] | None = None
        self._served_generation = 0
        self.generation = 0
        self._on_change: list[Callable[[Files], None]] = []

    @property
    def files(self) -> Files:
        return self._files

    def on_change(self, callback: Callable[[Files], None]) -> None:
        """Call ``callback(files)`` after a new set was taken (with the lock held)."""
        self._on_change.append(callback)

    def init_metrics(self) -> None:
        """Create the service's series once its name is known (the error counter at 0, so
        that its first increase can fire an alert)."""
        if service_metrics.SERVICE:
            RELOAD_ERRORS.labels(service_metrics.SERVICE)
            self._set_expiry()

    def _set_expiry(self) -> None:
        if service_metrics.SERVICE:
            try:
                end = _not_after(self._files[0]).timestamp()
            except ValueError:
                return
            CERT_EXPIRY.labels(service_metrics.SERVICE).set(end)

    def _stamp_now(self) -> tuple[object, ...]:
        stamp: list[object] = []
        for path in self.paths:
            if path is None:
                stamp.append(None)
                continue
            try:
                st = os.stat(path)
            except OSError as exc:
                stamp.append(("unreadable", exc.errno))
            else:
                stamp.append((st.st_mtime_ns, st.st_size, st.st_ino, st.st_dev))
        return tuple(stamp)

    def maybe_reload(self) -> bool:
        """Take the files again if they changed since the last look (at most one look a
        second); True when a new set was taken now."""
        now = self._clock()
        if now < self._next_look:
            return False
        with self._lock:
            if now < self._next_look:
                return False
            self._next_look = now + POLL_INTERVAL_S
            self.look_again_soon = False
            stamp = self._stamp_now()
            if stamp == self._stamp:
                return False
            if self._early is not None and self._early[0] == stamp and time.time() < self._early[1]:
                return False  # the same set, still not valid
            files: Files | None = None
            try:
                files = self._read()
                self._check(*files)
            except ValueError as exc:
                if stamp != self._suspect:
                    self._suspect = stamp  # perhaps a write under way: look again
                    self.look_again_soon = True
                elif files is not None and (start := _not_before_ahead(files[0])) is not None:
                    self._not_valid_yet(stamp, start, str(exc))
                else:  # as bad a second later: not a write under way
                    self._stamp = stamp
                    self._refused(str(exc))
                return False
            self._early = None
            self._stamp = stamp
            if files == self._files:
                return False  # touched, not changed
            self._files = files
            self.generation += 1
            self._set_expiry()
            for callback in self._on_change:
                callback(files)
        end = _not_after(files[0])
        log.warning(
            "TLS files changed: serving and dialling with the new certificate of %s "
            "(valid until %s UTC) from now on",
            self.paths[0],
            f"{end:%Y-%m-%d %H:%M:%S}",
        )
        return True

    def _read(self) -> Files:
        cert_path, key_path, ca_path = self.paths
        cert = _read(cert_path, "--tls-cert")
        key = _read(key_path, "--tls-key")
        ca = _read(ca_path, "--tls-ca")
        assert cert is not None and key is not None
        return cert, key, ca

    def _not_valid_yet(self, stamp: tuple[object, ...], start: float, why: str) -> None:
        """A renewed certificate whose notBefore was a few seconds
        ahead (the issuer's clock) was refused and its stamp recorded, so the unchanged files
        were never read again and the service stayed on the old certificate until it expired
        (cert-manager does not renew again). The stamp is not recorded: the set is looked at
        again once it is valid, and logged once meanwhile."""
        if self._early is None or self._early[0] != stamp:
            log.warning(
                "TLS files changed but not used yet (the ones read before stay in force until "
                "the new certificate is valid, then it is taken): %s",
                why,
            )
        self._early = (stamp, start)

    def _refused(self, why: str) -> None:
        self.refusals += 1
        log.error("TLS files changed but not used (the ones read before stay in force): %s", why)
        if service_metrics.SERVICE:
            RELOAD_ERRORS.labels(service_metrics.SERVICE).inc()

    def server_config(self) -> grpc.ServerCertificateConfiguration | None:
        """gRPC's fetcher: the configuration to serve a new connection with when it changed
        since the last one (None: keep it). Never raises: gRPC would fail the handshake."""
        try:
            self.maybe_reload()
            if self._served_generation == self.generation:
                return None
            self._served_generation = self.generation
            return self.server_configuration()
        except Exception:  # a bug here must not refuse every connection
            log.exception("TLS files: cannot build the new server configuration")
            return None

    def server_configuration(self) -> grpc.ServerCertificateConfiguration:
        """The configuration of the files in force."""
        cert, key, ca = self._files
        return grpc.ssl_server_certificate_configuration([(key, cert)], root_certificates=ca)


def _not_before_ahead(cert_pem: bytes) -> float | None:
    """When the certificate becomes valid (epoch seconds), if that is still ahead, else None
    (also for one that does not parse)."""
    from cryptography import x509

    try:
        start = x509.load_pem_x509_certificate(cert_pem).not_valid_before_utc.timestamp()
    except ValueError:
        return None
    return start if time.time() < start else None


def init_etcd_metrics(cert_pem: bytes | None) -> None:
    """The etcd client certificate's end, for the alert that warns before it expires: etcd
    refuses the service once it has, and the service's own TLS gauge does not cover it."""
    if cert_pem is None or not service_metrics.SERVICE:
        return
    try:
        end = _not_after(cert_pem).timestamp()
    except ValueError:
        return
    ETCD_CERT_EXPIRY.labels(service_metrics.SERVICE).set(end)


def expiry_problem(cert_pem: bytes, now: datetime | None = None) -> str | None:
    """Why a certificate cannot be served now (expired, not valid yet), or None."""
    from cryptography import x509

    cert = x509.load_pem_x509_certificate(cert_pem)
    now = now or datetime.now(UTC)
    if now > cert.not_valid_after_utc:
        return f"the certificate expired on {cert.not_valid_after_utc:%Y-%m-%d %H:%M:%S} UTC"
    if now < cert.not_valid_before_utc:
        return (
            f"the certificate is not valid before {cert.not_valid_before_utc:%Y-%m-%d %H:%M:%S}"
            " UTC (is this machine's clock right?)"
        )
    return None
