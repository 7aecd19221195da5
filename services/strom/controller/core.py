"""What every controller concern shares: the fenced write, the request wrapper, and
read-your-writes (DESIGN §2, §3).

The concern modules (topics_admin, configs_admin, descriptions, isr, elections,
reassignment, producer_ids, reconcile, acls, activation) are mixins over
:class:`ControllerCore`, joined into one servicer in :mod:`strom.controller.service`; they
share one write lock, one store, one view and one leadership, so they share one object.

Why writes are safe with a deposed controller still running: every etcd transaction the
active controller commits (:meth:`ControllerCore._txn`) also compares the ``controller``
key's mod_revision with the one it wrote when it won. Once its lease expires (or it resigns)
that key is gone or someone else's, so its late writes fail as a whole and it steps down,
whatever it believes about its lease.
"""

from __future__ import annotations

import asyncio
import contextlib
import functools
import logging
from collections.abc import Awaitable, Callable, Iterable
from dataclasses import dataclass
from typing import Any, TypeVar

from google.protobuf.message import Message

from strom.api import common_pb2, controller_pb2
from strom.api import metadata_pb2 as md
from strom.controller.metrics import ADMIN_REQUESTS
from strom.controller.node_changes import NodeChanges
from strom.controller.prober import NodeProber
from strom.errors import ErrorCode, StromError, error_name
from strom.metadata import (
    ClusterView,
    Election,
    EtcdNoSpaceError,
    MetadataStore,
    MetadataUnavailableError,
)

log = logging.getLogger("strom.controller")
R = TypeVar("R", bound=Message)
E = ErrorCode

#: How long a write waits for the controller's own view to show it before answering
#: (read-your-writes). Clients must give an attempt well more than this (the CLI does, see
#: strom.cli.admin.controller_client): an attempt cut off just before the answer is retried,
#: and a retried CreateTopics then finds the topic it created.
VIEW_WAIT_S = 10.0


class Fenced(Exception):
    """This controller's election key changed under it: it is no longer the active one."""


class LeaseLapsed(Exception):
    """No renewal of this controller's election lease was answered within its TTL: a standby
    may be active, so admin calls are refused (NOT_CONTROLLER, which sends clients looking
    for the controller) rather than served from a view that may be stale. It does not step
    down: if etcd was down for everyone it may still hold the key once etcd is back."""


@dataclass(frozen=True)
class Leadership:
    """What this controller holds while active."""

    create_revision: int
    #: mod_revision of the controller key after this controller rewrote it; every write
    #: transaction compares it (the fencing token).
    mod_revision: int
    epoch: int
    elected_ms: int


def rack_of(node: md.NodeRegistration) -> str | None:
    """A node's rack, or None if it registered without one."""
    return node.rack if node.HasField("rack") else None


#: An RPC's body: fills ``response`` in place as the active controller ``lead``.
RpcBody = Callable[..., Awaitable[None]]


def rpc(*, write: bool, with_context: bool = False, **initial: Any) -> Callable[[RpcBody], Any]:
    """Make ``body(self, lead, request, response)`` the handler of the RPC it is named after:
    a fresh ``<Name>Response(**initial)``, the body run as the active controller by
    :meth:`ControllerCore._handle` (``write``: under the write lock), the response returned.
    ``with_context`` passes the gRPC context as a fifth argument.

    One wrapper for every RPC, so each concern module holds only what its RPCs decide.
    """

    def decorate(body: RpcBody) -> Any:
        name = body.__name__
        response_type = getattr(controller_pb2, f"{name}Response")

        @functools.wraps(body)
        async def handler(self: ControllerCore, request: Any, context: Any) -> Message:
            response = response_type(**initial)

            async def run(lead: Leadership) -> None:
                extra = (context,) if with_context else ()
                await body(self, lead, request, response, *extra)

            return await self._handle(name, response, run, write=write)

        return handler

    return decorate


def item_error(result: Any, exc: StromError) -> None:
    """Answer one item of a request (a topic, a resource) with the error it raised."""
    result.error_code = exc.code or E.UNKNOWN_SERVER_ERROR
    result.error_message = exc.message


class ControllerCore:
    """State and plumbing every concern mixin uses; the attributes are set in
    :meth:`strom.controller.service.ControllerService.__init__`."""

    controller_id: int
    advertise_host: str
    advertise_port: int
    metrics_port: int
    session_timeout_s: int
    default_partitions: int
    default_replication_factor: int
    max_txn_ops: int
    producer_id_block_size: int
    auto_leader_rebalance: bool
    fast_failure_detection: bool
    incarnation_id: str
    store: MetadataStore | None
    view: ClusterView | None
    _election: Election | None
    _leadership: Leadership | None
    _stopping: bool
    _write_lock: asyncio.Lock | None
    _prober: NodeProber | None
    _active_prober: NodeProber | None
    #: Nodes in a controlled shutdown (node id -> incarnation) not yet SHUTTING_DOWN in etcd.
    _shutting_down: dict[int, str]
    _node_changes: NodeChanges

    @property
    def active(self) -> bool:
        return self._leadership is not None and not self._stopping

    @property
    def _live_view(self) -> ClusterView:
        """The cluster view (set in start(), before any RPC is served)."""
        assert self.view is not None
        return self.view

    async def _restart_election(self, election: Election, reason: str) -> None:
        raise NotImplementedError  # strom.controller.activation.ActiveRole

    def acting_as_active(self) -> bool:
        raise NotImplementedError  # strom.controller.activation.ActiveRole

    #: Whether the refusals of the current lapse were logged (one line a lapse, not a request).
    _lapse_logged: bool = False

    def _check_acting(self) -> None:
        """Raise :class:`LeaseLapsed` while holding a leadership whose lease lapsed unheard."""
        if self._leadership is None:
            return
        if self.acting_as_active():
            if self._lapse_logged:
                self._lapse_logged = False
                log.info(
                    "controller %d: etcd renewed its election lease again; serving admin "
                    "requests as the active controller",
                    self.controller_id,
                )
            return
        if not self._lapse_logged:
            self._lapse_logged = True
            log.warning(
                "controller %d: etcd has not renewed its election lease for over %d s (cut off "
                "from etcd, or etcd is down); answering admin requests NOT_CONTROLLER until it "
                "does (a standby that reaches etcd takes over meanwhile)",
                self.controller_id,
                self.session_timeout_s,
            )
        raise LeaseLapsed()

    @contextlib.asynccontextmanager
    async def _locked(self) -> Any:
        assert self._write_lock is not None
        async with self._write_lock:
            yield

    def _controller_node(self) -> common_pb2.Node:
        """The active controller as this process knows it (node_id -1 = unknown)."""
        if self.active and self.acting_as_active():
            return common_pb2.Node(
                node_id=self.controller_id, host=self.advertise_host, port=self.advertise_port
            )
        info = self.view.controller_info() if self.view is not None else None
        if info is None or info.incarnation_id == self.incarnation_id:
            # Our own key while we are not active: stale (fenced, resigning) or we are still
            # activating; either way the caller should look again shortly.
            return common_pb2.Node(node_id=-1)
        return common_pb2.Node(node_id=info.controller_id, host=info.host, port=info.port)

    async def _handle(
        self,
        rpc: str,
        response: R,
        body: Callable[[Leadership], Awaitable[None]],
        *,
        write: bool,
    ) -> R:
        """Run ``body`` as the active controller and fill the whole-request fields.

        ``body`` fills ``response`` in place, so items already handled keep their results
        when a later item fails the whole request (NOT_CONTROLLER, REQUEST_TIMED_OUT).
        """
        resp: Any = response
        lead = self._leadership
        try:
            if lead is None or self._stopping:
                raise Fenced()
            self._check_acting()
            if write:
                async with self._locked():
                    lead = self._leadership
                    if lead is None or self._stopping:
                        raise Fenced()
                    self._check_acting()  # the lock may have been held long (etcd slow)
                    await body(lead)
            else:
                await body(lead)
        except LeaseLapsed:
            self._not_controller(resp, lapsed=True)
        except Fenced:
            election = self._election
            if lead is not None and self._leadership is lead and election is not None:
                # A write found the election key changed: step down before answering, so the
                # answer names the new controller (from the view), not this one.
                async with self._locked():
                    if self._leadership is lead:
                        await self._restart_election(election, "fenced by a newer controller")
            self._not_controller(resp, lapsed=False)
        except EtcdNoSpaceError as exc:  # only an operator ends it: no use retrying
            resp.error_code = E.METADATA_STORE_FULL
            resp.error_message = str(exc)
        except MetadataUnavailableError as exc:
            if lead is not None and not self.acting_as_active():
                # The lease lapsed while the body waited for etcd: a standby may be active.
                self._not_controller(resp, lapsed=True)
            else:
                resp.error_code = E.REQUEST_TIMED_OUT
                resp.error_message = f"etcd did not answer: {exc}"
        except StromError as exc:  # a whole-request problem raised by the body
            resp.error_code = exc.code if exc.code is not None else E.UNKNOWN_SERVER_ERROR
            resp.error_message = exc.message
        except Exception as exc:
            log.exception("%s failed", rpc)
            resp.error_code = E.UNKNOWN_SERVER_ERROR
            resp.error_message = f"{type(exc).__name__}: {exc}"
        resp.controller.CopyFrom(self._controller_node())
        ADMIN_REQUESTS.labels(rpc, error_name(self._result_code(resp))).inc()
        return response

    def _not_controller(self, resp: Any, *, lapsed: bool) -> None:
        """Answer NOT_CONTROLLER, naming the active controller if this one knows it."""
        resp.error_code = E.NOT_CONTROLLER
        active = self._controller_node()
        why = (
            f"; etcd has not renewed its election lease for over {self.session_timeout_s} s "
            "(it may have expired: cut off from etcd, or etcd is down)"
            if lapsed
            else ""
        )
        resp.error_message = (
            f"controller {self.controller_id} is not the active controller"
            + why
            + (
                f"; the active one is {active.node_id} at {active.host}:{active.port}"
                if active.node_id >= 0
                else "; no active controller is known right now"
            )
        )

    @staticmethod
    def _result_code(resp: Any) -> int:
        if resp.error_code != E.NONE:
            return int(resp.error_code)
        for field in ("topics", "results", "partitions"):
            for item in getattr(resp, field, ()):
                if getattr(item, "error_code", E.NONE) != E.NONE:
                    return int(item.error_code)
        return E.NONE

    def _txn(
        self,
        lead: Leadership,
        compares: Iterable[tuple[str, int]],
        *,
        puts: Iterable[tuple[str, Message]] = (),
        deletes: Iterable[str] = (),
        delete_prefixes: Iterable[str] = (),
    ) -> bool:
        """A write fenced by our election key (blocking). False = a compare of ours failed.

        Raises:
            Fenced: the election key is no longer the one we wrote.
        """
        assert self.store is not None
        store = self.store
        ok = store.txn(
            [(store.keys.controller, lead.mod_revision), *compares],
            puts=puts,
            deletes=deletes,
            delete_prefixes=delete_prefixes,
        )
        if ok:
            return True
        current = store.get(store.keys.controller, md.ControllerInfo)
        if current is None or current.mod_revision != lead.mod_revision:
            raise Fenced()
        return False

    async def _await_view(self, predicate: Callable[[], bool], what: str) -> None:
        """Wait until the view reflects a write we committed (read-your-writes)."""
        assert self.view is not None
        if not await asyncio.to_thread(self.view.wait_for, predicate, VIEW_WAIT_S):
            log.warning("the cluster view did not show %s within %gs", what, VIEW_WAIT_S)

    async def _await_partition_epochs(
        self, committed: dict[tuple[str, int], int], what: str = "committed partition states"
    ) -> None:
        """Wait until the view shows each partition at (at least) its committed epoch."""
        if not committed:
            return
        view = self._live_view
        await self._await_view(
            lambda: all(
                (v := view.partitions.get(tp)) is not None and v.value.partition_epoch >= e
                for tp, e in committed.items()
            ),
            what,
        )

    def _topic_visible(self, name: str) -> md.TopicMetadata | None:
        """A topic as clients see it: absent while being deleted."""
        assert self.view is not None
        topic = self.view.topic(name)
        return None if topic is None or topic.deleting else topic

    async def _nodes(self) -> dict[int, md.NodeRegistration]:
        """Registered nodes, read from etcd (a node that just registered counts)."""
        assert self.store is not None
        store = self.store
        _, items = await asyncio.to_thread(
            store.get_prefix, store.keys.nodes_prefix, md.NodeRegistration
        )
        return {v.value.node_id: v.value for v in items.values()}

    @staticmethod
    def _stale_incarnation(
        nodes: dict[int, md.NodeRegistration], node_id: int, incarnation_id: str
    ) -> str | None:
        """Why a request from ``node_id`` in ``incarnation_id`` is stale, or None if current."""
        node = nodes.get(node_id)
        if node is None:
            return f"node {node_id} is not registered"
        if node.incarnation_id != incarnation_id:
            return f"incarnation {incarnation_id!r} of node {node_id} is not the registered one"
        return None
