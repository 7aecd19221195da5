"""The node's liveness in etcd: ``nodes/<id>`` bound to a lease that a thread keeps alive.

Every method blocks (the etcd client is synchronous); the node calls them through
``asyncio.to_thread``.

Duplicate node ids: two live processes with one id would write the same data dir and
confuse every leader, so the second one must refuse to start. But a process restarted right
after a crash finds its previous life's key still there until that lease expires (up to the
session timeout). :meth:`NodeRegistration.register` tells the two apart by watching the
holder's lease: if its TTL goes *up* the holder is refreshing it (alive: refuse); if the key
is still there after the TTL it had when first seen, plus a margin, the holder is alive too;
if the key vanishes, the holder was dead and this process takes the id.
"""

from __future__ import annotations

import contextlib
import logging
import threading
import time
import uuid
from collections.abc import Callable
from typing import Any

from strom import __version__
from strom.api import metadata_pb2 as md
from strom.clock import wall_ms
from strom.metadata import KeepAlive, MetadataStore, MetadataUnavailableError, decode

log = logging.getLogger("strom.storage.registration")


class NodeIdInUseError(RuntimeError):
    """Another live process is registered with this node id."""


class AddressInUseError(NodeIdInUseError):
    """Another live node is registered at the address this one advertises: clients and
    followers would reach that node for this one's partitions."""


class NodeRegistration:
    """Registers, updates and removes ``nodes/<node_id>`` under this process's lease."""

    def __init__(
        self,
        store: MetadataStore,
        *,
        node_id: int,
        host: str,
        port: int,
        metrics_port: int,
        rack: str | None,
        session_timeout_s: int,
    ) -> None:
        self.store = store
        self.key = store.keys.node(node_id)
        self.session_timeout_s = session_timeout_s
        self.incarnation_id = str(uuid.uuid4())
        self.value = md.NodeRegistration(
            node_id=node_id,
            host=host,
            port=port,
            metrics_port=max(metrics_port, 0),
            incarnation_id=self.incarnation_id,
            start_time_ms=wall_ms(),
            state=md.NODE_STATE_STARTING,
            software_version=__version__,
        )
        if rack:
            self.value.rack = rack
        self.lease: Any = None
        self.keepalive: KeepAlive | None = None
        self._lock = threading.Lock()
        self._closed = False

    # -- registering -----------------------------------------------------------------------

    def register(self, on_lost: Callable[[], None], *, deadline_s: float = 30.0) -> None:
        """Create the key under a new lease; raise :class:`NodeIdInUseError` if a live
        process holds the id. etcd being unreachable is retried until ``deadline_s``."""
        end = time.monotonic() + deadline_s
        self._check_address(end)
        first_ttl: int | None = None
        first_seen = 0.0
        last_ttl: int | None = None
        while True:
            try:
                if self._try_create(on_lost):
                    return
                holder = self._holder()
            except MetadataUnavailableError:
                if time.monotonic() > end:
                    raise
                time.sleep(0.2)
                continue
            if holder is None:
                continue  # gone between our create and our look: try again at once
            reg, lease_ttl = holder
            who = (
                f"node id {self.value.node_id} is already registered by a live process "
                f"({reg.host}:{reg.port}, incarnation {reg.incarnation_id})"
            )
            if lease_ttl is None:
                raise NodeIdInUseError(f"{who}; its key has no lease, delete {self.key} by hand")
            now = time.monotonic()
            if first_ttl is None:
                first_ttl, first_seen = lease_ttl, now
                log.info(
                    "node id %d is registered by incarnation %s; waiting up to %ss to see "
                    "whether that process is still alive",
                    self.value.node_id,
                    reg.incarnation_id,
                    max(first_ttl, 0) + 2,
                )
            elif last_ttl is not None and lease_ttl > last_ttl and last_ttl >= 0:
                raise NodeIdInUseError(who)  # its lease was refreshed: the holder lives
            # etcd revokes expired leases on a ~500 ms tick, so allow some slack past the TTL.
            if now - first_seen > max(first_ttl, 0) + 2.0:
                raise NodeIdInUseError(who)
            last_ttl = lease_ttl
            time.sleep(0.1)

    def _check_address(self, end: float) -> None:
        """Refuse to register at an address another node id holds (two hosts started with
        the default ``--listen 0.0.0.0:9092`` both advertise 127.0.0.1:9092 where their names
        do not resolve to their own addresses; a copied
        config's ``--advertise``). A holder that stays registered past its session timeout
        (a dead one's key is gone by then) is alive. ."""
        address = (self.value.host, self.value.port)
        give_up = time.monotonic() + self.session_timeout_s + 2.0
        while True:
            try:
                _, regs = self.store.get_prefix(self.store.keys.nodes_prefix, md.NodeRegistration)
            except MetadataUnavailableError:
                if time.monotonic() > end:
                    raise
                time.sleep(0.2)
                continue
            holder = next(
                (
                    v.value
                    for v in regs.values()
                    if v.value.node_id != self.value.node_id
                    and (v.value.host, v.value.port) == address
                ),
                None,
            )
            if holder is None:
                return
            if time.monotonic() > give_up:
                raise AddressInUseError(
                    f"node {holder.node_id} is registered at {address[0]}:{address[1]}, the "
                    f"address node {self.value.node_id} advertises: give each node its own "
                    "(--advertise HOST:PORT with this host's name; without it a wildcard "
                    "--listen advertises this host's name, or 127.0.0.1 where that does not "
                    "resolve to this host's own address)"
                )
            time.sleep(0.2)

    def _try_create(self, on_lost: Callable[[], None]) -> bool:
        lease = self.store.grant_lease(self.session_timeout_s)
        with self._lock:
            value = md.NodeRegistration()
            value.CopyFrom(self.value)
        if self.store.create(self.key, value, lease=lease):
            with self._lock:
                closed = self._closed
                if not closed:
                    self.lease = lease
                    self.keepalive = self.store.keep_alive(lease, on_lost)
            if closed:  # close() ran meanwhile (a re-registration racing shutdown)
                with contextlib.suppress(MetadataUnavailableError):
                    self.store._call(lease.revoke)
            return True
        with contextlib.suppress(MetadataUnavailableError):
            self.store._call(lease.revoke)
        return False

    def _holder(self) -> tuple[md.NodeRegistration, int | None] | None:
        """The registration holding our key and its lease's remaining TTL (None: no lease)."""
        # The wrapper has no call returning a key's lease; use its client with its error
        # mapping (MetadataStore._call) rather than widening the shared API for one caller.
        raw, meta = self.store._call(self.store.client.get, self.key)
        if raw is None:
            return None
        reg = decode(raw, md.NodeRegistration)
        if not meta.lease_id:
            return reg, None
        info = self.store._call(self.store.client.get_lease_info, meta.lease_id)
        return reg, int(info.TTL)

    def live(self) -> bool:
        """Whether this process holds a registration it keeps alive: a keepalive whose lease
        is not surely expired (strom.metadata.KeepAlive.surely_expired)."""
        ka = self.keepalive
        return ka is not None and not ka.surely_expired()

    def _holds_key(self, lease: Any) -> bool:
        """Whether our key stands in etcd under ``lease`` (blocking, one read)."""
        raw, meta = self.store._call(self.store.client.get, self.key)
        return raw is not None and meta.lease_id == lease.id

    def reregister(self, on_lost: Callable[[], None]) -> None:
        """After the lease was lost (etcd unreachable for longer than the TTL): take the key
        again under a new lease. Raises :class:`NodeIdInUseError` if another process took
        the id meanwhile (this process is then a zombie and must stop).

        A call while the current lease's keepalive has not reported it lost first asks etcd:
        if the key still stands under that lease, the registration is kept as it is. The
        node's watchdog calls this when its view lacks the key, and a view behind etcd must
        not make the node drop a live registration (its new key would then have to wait
        for the old lease to run out, the node missing from etcd all that while)."""
        with self._lock:
            if self._closed:
                return
            current, lease = self.keepalive, self.lease
        if current is not None and not current.lost and self._holds_key(lease):
            return
        with self._lock:
            if self._closed or self.keepalive is not current:
                return
            old = self.keepalive
            self.keepalive = None
        if old is not None:
            old.stop(revoke=False)
        if self._try_create(on_lost):
            log.warning("node %d re-registered with a new lease", self.value.node_id)
            return
        holder = self._holder()
        if holder is not None and holder[0].incarnation_id == self.incarnation_id:
            # Our own key, but under a lease this process does not keep alive: the lost one,
            # not yet deleted (etcd revokes expired leases on a tick, later under load), or
            # one of an attempt whose reply was lost. Returning here left the node without a
            # registration for good once that lease ran out (seen at 11,790 partitions on a
            # loaded machine); the caller retries until the key is gone and ours again.
            raise MetadataUnavailableError(
                f"node {self.value.node_id}: the previous registration is still expiring"
            )
        raise NodeIdInUseError(
            f"node id {self.value.node_id} was taken by another process while this one "
            "was cut off from etcd"
        )

    # -- updating and leaving --------------------------------------------------------------

    def set_state(self, state: int) -> None:
        """Publish a lifecycle state (STARTING -> RUNNING -> SHUTTING_DOWN) under our lease."""
        with self._lock:
            self.value.state = state  # type: ignore[assignment]
            value = md.NodeRegistration()
            value.CopyFrom(self.value)
            lease = self.lease
        if lease is None or self._closed:
            return
        self.store.put(self.key, value, lease=lease)

    def close(self) -> None:
        """Stop the keepalive and revoke the lease: the key disappears at once, so the
        controller sees the node gone without waiting for the session timeout."""
        with self._lock:
            self._closed = True
            ka, self.keepalive = self.keepalive, None
        if ka is not None:
            ka.stop(revoke=True)
