"""Which storage nodes registered and which left, told in the active controller's log.

An operator needs to know which node left, why, and how much it led, and when it came back.
Kafka's controller logs each broker's fencing and registration; so does this one: "node N
(host:port) left: its lease expired ...; M partitions led by it" and "node N registered
(host:port, rack, incarnation)".

The registrations are compared as the cluster view holds them after each change of a node
key (or a resync), not event by event: a resync after a watch outage tells who left
meanwhile just the same. Node changes are rare; nothing here runs per request.
"""

from __future__ import annotations

import logging
from collections.abc import Callable, Mapping
from dataclasses import dataclass

from strom.api import metadata_pb2 as md

log = logging.getLogger("strom.controller")


@dataclass(frozen=True)
class NodeChange:
    """One node that registered (``left`` False) or left, with its registration."""

    node_id: int
    registration: md.NodeRegistration
    left: bool


def diff_nodes(
    known: Mapping[int, md.NodeRegistration], now: Mapping[int, md.NodeRegistration]
) -> list[NodeChange]:
    """The nodes that left (in ``known``, not in ``now``, or back as another incarnation)
    and registered (new in ``now``, or a new incarnation), by node id."""
    out: list[NodeChange] = []
    for node_id in sorted(set(known) | set(now)):
        before, after = known.get(node_id), now.get(node_id)
        same = (
            before is not None
            and after is not None
            and before.incarnation_id == after.incarnation_id
        )
        if same:
            continue
        if before is not None:
            out.append(NodeChange(node_id, before, left=True))
        if after is not None:
            out.append(NodeChange(node_id, after, left=False))
    return out


def _address(reg: md.NodeRegistration) -> str:
    return f"{reg.host}:{reg.port}"


class NodeChanges:
    """Remembers the registered nodes and logs each registration and departure."""

    def __init__(self) -> None:
        self.known: dict[int, md.NodeRegistration] = {}
        self._seeded = False
        #: Incarnations whose lease this controller is revoking (its prober found the node's
        #: port refusing connections): their departure is that fencing, not an expiry.
        self._fencing: dict[int, str] = {}

    def fencing(self, node_id: int, incarnation_id: str) -> None:
        """This controller is about to revoke the lease of ``node_id``'s incarnation."""
        self._fencing[node_id] = incarnation_id

    def not_fencing(self, node_id: int) -> None:
        """The revoke did not happen (etcd did not answer, the node is shutting down)."""
        self._fencing.pop(node_id, None)

    def observe(
        self,
        now: Mapping[int, md.NodeRegistration],
        *,
        led_by: Callable[[int], int],
        controlled: Callable[[int, md.NodeRegistration], bool],
        report: bool,
    ) -> list[NodeChange]:
        """Take the nodes registered ``now``; log what changed when ``report`` (the active
        controller does; a standby only keeps track). The first call only takes note (the
        nodes a starting controller finds are not news). ``led_by(node)``: how many
        partitions name it leader; ``controlled(node, registration)``: whether it left in a
        controlled shutdown (else its lease expired or was revoked)."""
        changes = diff_nodes(self.known, now) if self._seeded else []
        self.known = {i: r for i, r in now.items()}
        fenced = {
            c.node_id
            for c in changes
            if c.left and self._fencing.get(c.node_id) == c.registration.incarnation_id
        }
        for node_id in [n for n in self._fencing if n in fenced or n not in now]:
            self._fencing.pop(node_id, None)
        self._seeded = True
        if report:
            for change in changes:
                if change.left:
                    self._log_left(
                        change, led_by(change.node_id), controlled, change.node_id in fenced
                    )
                else:
                    self._log_registered(change)
        return changes

    @staticmethod
    def _log_left(
        change: NodeChange,
        led: int,
        controlled: Callable[[int, md.NodeRegistration], bool],
        fenced: bool,
    ) -> None:
        reg = change.registration
        clean = controlled(change.node_id, reg)
        if clean:
            why = "it deregistered (controlled shutdown)"
        elif fenced:
            why = "this controller revoked its lease (its port refused connections: it died)"
        else:
            why = (
                "its lease expired or was revoked without a controlled shutdown (the process "
                "died, hung, or lost etcd)"
            )
        log.info(
            "node %d (%s) left: %s; %d partitions led by it",
            change.node_id,
            _address(reg),
            why,
            led,
            extra={
                "fields": {
                    "node": change.node_id,
                    "address": _address(reg),
                    "incarnation": reg.incarnation_id,
                    "controlled": clean,
                    "fenced": fenced and not clean,
                    "partitions_led": led,
                }
            },
        )

    @staticmethod
    def _log_registered(change: NodeChange) -> None:
        reg = change.registration
        rack = reg.rack if reg.HasField("rack") else "-"
        log.info(
            "node %d registered (%s, rack %s, incarnation %s, version %s)",
            change.node_id,
            _address(reg),
            rack,
            reg.incarnation_id,
            reg.software_version or "?",
            extra={
                "fields": {
                    "node": change.node_id,
                    "address": _address(reg),
                    "rack": rack,
                    "incarnation": reg.incarnation_id,
                }
            },
        )
