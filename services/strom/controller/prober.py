"""Fast detection of dead storage nodes for the active controller.

A node's liveness is its etcd lease, whose TTL cannot go below 2 s (etcd's floor for the default
election timeout), so failover driven by lease expiry alone takes 2-3 s. A process that dies
(SIGKILL, OOM, crash) closes its sockets at once, though: the active controller holds a gRPC
health ``Watch`` stream open to every registered node, and when a stream breaks it asks the node
directly a few times. Only a *refused* connection counts as proof of death (a slow or paused
node times out instead, and is left to its lease); then the controller revokes the lease the
node's registration is bound to, which is exactly what lease expiry would have done, only
sooner. A node that was alive after all re-registers under a new lease and rejoins as a follower.

Safety: a node is only judged after the controller reached it at least once, so a node that
advertises an address the controller cannot reach is never fenced by this path.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
from collections.abc import Awaitable, Callable

import grpc
from grpc_health.v1 import health_pb2, health_pb2_grpc

from strom.grpc_options import GRPC_OPTIONS
from strom.security import default_channel

log = logging.getLogger(__name__)

#: (node id, incarnation id of its registration) -> called when the node is proven dead.
OnDead = Callable[[int, str], Awaitable[None]]


class NodeProber:
    """Keeps one health stream per registered node while the controller is active."""

    def __init__(
        self,
        on_dead: OnDead,
        *,
        confirm_attempts: int = 3,
        confirm_interval_s: float = 0.05,
        check_timeout_s: float = 0.5,
        on_reached: Callable[[int, bool], None] | None = None,
        kind: str = "node",
    ) -> None:
        self.kind = kind  # what the probed processes are, for the log
        self.on_dead = on_dead
        #: (node id, True) when a probe's stream first delivers; (node id, False) when it ends.
        self.on_reached = on_reached
        self.confirm_attempts = confirm_attempts
        self.confirm_interval_s = confirm_interval_s
        self.check_timeout_s = check_timeout_s
        #: (node id, incarnation id) -> (address, task)
        self._probes: dict[tuple[int, str], tuple[str, asyncio.Task[None]]] = {}
        self._fencing: set[asyncio.Task[None]] = set()

    def update(self, nodes: dict[int, tuple[str, str]]) -> None:
        """Follow exactly ``nodes`` (node id -> (address, incarnation id));
        call on the event loop."""
        wanted = {(nid, rev): addr for nid, (addr, rev) in nodes.items()}
        for key, (addr, task) in list(self._probes.items()):
            if wanted.get(key) != addr or task.done():
                task.cancel()
                del self._probes[key]
        for key, addr in wanted.items():
            if key not in self._probes:
                task = asyncio.ensure_future(self._probe(key[0], key[1], addr))
                self._probes[key] = (addr, task)

    def stop(self) -> None:
        for _, task in self._probes.values():
            task.cancel()
        self._probes.clear()

    async def _probe(self, node_id: int, incarnation: str, address: str) -> None:
        reached = False
        while True:
            channel = default_channel().aio_channel(address, GRPC_OPTIONS)
            streaming = False
            try:
                stub = health_pb2_grpc.HealthStub(channel)
                call = stub.Watch(health_pb2.HealthCheckRequest(service=""))
                try:
                    async for _ in call:
                        if not streaming and self.on_reached is not None:
                            self.on_reached(node_id, True)
                        streaming = reached = True
                except grpc.RpcError as exc:
                    if exc.code() != grpc.StatusCode.UNAVAILABLE:
                        # e.g. UNIMPLEMENTED: nothing to learn from this node's health; stop.
                        log.info(
                            "health stream to %s %d ended: %s", self.kind, node_id, exc.code().name
                        )
                        return
                if streaming and self.on_reached is not None:
                    self.on_reached(node_id, False)
                if reached and await self._refused(address):
                    log.info(
                        "%s %d (%s) refuses connections: fencing it without waiting for "
                        "its lease to expire (unless it is shutting down)",
                        self.kind,
                        node_id,
                        address,
                    )
                    # Not awaited here: the lease's revocation removes the node from the view,
                    # which cancels this probe task; the fencing must outlive it.
                    task = asyncio.ensure_future(self.on_dead(node_id, incarnation))
                    self._fencing.add(task)
                    task.add_done_callback(self._fencing.discard)
                    return
            finally:
                with contextlib.suppress(Exception):
                    await channel.close()
            # Not reached yet, or it answered: watch again (the channel backs off by itself).
            # Soon after a stream that broke: a dying process can still accept a connection
            # in the moment before its listening socket closes, so the first check can be
            # inconclusive (reset rather than refused); look again before long.
            await asyncio.sleep(0.05 if streaming else 0.2)

    async def _refused(self, address: str) -> bool:
        """True when every confirmation attempt fails with UNAVAILABLE (connection refused).

        Each attempt uses a fresh channel: a channel whose connection just broke fails RPCs
        from its cached state without dialling again, which would prove nothing."""
        for i in range(self.confirm_attempts):
            if i:
                await asyncio.sleep(self.confirm_interval_s)
            channel = default_channel().aio_channel(address, GRPC_OPTIONS)
            try:
                await health_pb2_grpc.HealthStub(channel).Check(
                    health_pb2.HealthCheckRequest(service=""), timeout=self.check_timeout_s
                )
            except grpc.RpcError as exc:
                # UNAVAILABLE alone also covers a connection reset by a middlebox or a peer
                # that stalls its handshake; only the kernel's refusal proves the process gone.
                if exc.code() != grpc.StatusCode.UNAVAILABLE or (
                    "refused" not in (exc.details() or "").lower()
                ):
                    return False
            else:
                return False
            finally:
                with contextlib.suppress(Exception):
                    await channel.close()
        return True
