"""Synchronous RPC plumbing: bootstrap addresses, cached metadata, leader and controller
routing with retries.

Why its own layer: every client (CLI, Producer, Consumer, Admin, Spark executors) has to find
the cluster from a list of addresses that may be partly down, follow NOT_CONTROLLER redirects
to the active controller, and refresh metadata when a leader moves. Doing it once here keeps
those rules identical everywhere.
"""

from __future__ import annotations

import os
import queue
import socket
import threading
import time
from collections.abc import Callable, Collection, Sequence
from typing import Any, Literal, NamedTuple, TypeVar

import grpc

from strom.api import (
    common_pb2,
    controller_pb2,
    controller_pb2_grpc,
    storage_pb2,
    storage_pb2_grpc,
)
from strom.argtypes import host_problem
from strom.client import forks
from strom.client.metadata import MetadataCache, node_address
from strom.errors import (
    COORDINATOR_REFRESH_CODES,
    AuthenticationError,
    AuthorizationError,
    BrokerNotAvailableError,
    CoordinatorNotAvailableError,
    InvalidConfigError,
    StromError,
    UnsupportedVersionError,
    error_for,
    is_retriable,
)
from strom.grpc_options import GRPC_OPTIONS
from strom.security.channel import ChannelSecurity, client_security

T = TypeVar("T")
NONE = common_pb2.ErrorCode.NONE
NOT_CONTROLLER = common_pb2.ErrorCode.NOT_CONTROLLER
BOOTSTRAP_ENV = "STROM_BOOTSTRAP"


def parse_bootstrap(spec: str | Sequence[str] | None) -> list[str]:
    """``"h1:9092,h2:9092"`` or a list → ["h1:9092", "h2:9092"]; falls back to $STROM_BOOTSTRAP."""
    if spec is None or spec == "" or spec == []:
        spec = os.environ.get(BOOTSTRAP_ENV, "")
    items = spec.split(",") if isinstance(spec, str) else [s for x in spec for s in x.split(",")]
    out = []
    for raw in items:
        item = raw.strip()
        if not item:
            continue
        host, sep, port = item.rpartition(":")
        if not sep or not host or not port.isdigit() or not 0 < int(port) < 65536:
            raise ValueError(f"bootstrap address {raw!r} is not HOST:PORT")
        problem = host_problem(host)
        if problem:
            raise ValueError(f"bootstrap address {raw!r}: {host!r} {problem}")
        out.append(item)
    if not out:
        raise ValueError(
            "no bootstrap address: pass one (HOST:PORT[,HOST:PORT]: the clients' first argument, "
            f"the CLI's --bootstrap) or set {BOOTSTRAP_ENV}"
        )
    return out


#: gRPC statuses that retrying cannot fix: the caller is not who it must be, or may not.
REFUSED_CODES = frozenset({grpc.StatusCode.UNAUTHENTICATED, grpc.StatusCode.PERMISSION_DENIED})


#: The codes a refusal's ``strom-error-bin`` trailer may carry (the resource refused).
_AUTHORIZATION_CODES = frozenset(
    {
        common_pb2.TOPIC_AUTHORIZATION_FAILED,
        common_pb2.GROUP_AUTHORIZATION_FAILED,
        common_pb2.CLUSTER_AUTHORIZATION_FAILED,
        common_pb2.TRANSACTIONAL_ID_AUTHORIZATION_FAILED,
    }
)


def refused(exc: grpc.RpcError) -> StromError:
    """The error for a call the server refused to authenticate or authorize: for an ACL
    refusal, the subclass of AuthorizationError its trailer names (a group, cluster,
    transactional id or topic refused: Kafka's four authorization exceptions)."""
    if exc.code() == grpc.StatusCode.UNAUTHENTICATED:
        return AuthenticationError(exc.details() or "the server did not accept the credentials")
    details = exc.details() or "the server's ACLs refused the request"
    code = _trailer_code(exc)
    if code in _AUTHORIZATION_CODES:
        return error_for(code, details)
    return AuthorizationError(details)


def _trailer_code(exc: grpc.RpcError) -> int | None:
    """The ErrorCode of a call's ``strom-error-bin`` trailer, if it has one."""
    trailers = getattr(exc, "trailing_metadata", None)
    try:
        for key, value in (trailers() if callable(trailers) else None) or ():
            if key == "strom-error-bin":
                return int(common_pb2.Error.FromString(value).code)
    except Exception:  # a trailer that does not parse: the status alone says it
        return None
    return None


def older_node(exc: grpc.RpcError, address: str, method: str) -> UnsupportedVersionError | None:
    """The error for a node that answered ``method`` with gRPC's UNIMPLEMENTED, else None.

    A strom node answers UNIMPLEMENTED only for an RPC it does not have: it runs an older
    version than this client (a rolling upgrade not finished). Retrying cannot help, and
    "UNKNOWN_SERVER_ERROR ... UNIMPLEMENTED Method not found!" did not say so (found from
    outside: `strom transactions producers` against an old node)."""
    if exc.code() != grpc.StatusCode.UNIMPLEMENTED:
        return None
    return UnsupportedVersionError(
        f"the node at {address} does not know {method}: it runs an older strom version than "
        "this client"
    )


def unreachable(exc: grpc.RpcError) -> str:
    """The last connection error inside gRPC's UNAVAILABLE details ("Socket closed",
    "Connection refused", "Tls handshake failed (...): CERTIFICATE_VERIFY_FAILED ..."),
    else the status name."""
    detail = exc.details() or ""
    last = detail.rsplit("last error: ", 1)[-1]
    last = last.split(": ", 2)[-1] if last.startswith(("UNAVAILABLE: ", "UNKNOWN: ")) else last
    return last.strip() or exc.code().name


def tls_handshake_failed(exc: grpc.RpcError) -> bool:
    """The call failed because TLS could not be set up: the server's certificate is not
    trusted, or the server refused ours. Retrying the same settings cannot help."""
    return "handshake failed" in (exc.details() or "").lower()


#: What the last pass over the nodes that found none answering saw, with what to check; None
#: once one answered. The CLI's ``--timeout`` names it when it fires, so its message keeps
#: the hint the full minute of retries would have given.
_last_unanswered: str | None = None


def last_unanswered() -> str | None:
    """What this process's last failed pass over the nodes saw (see ``_last_unanswered``)."""
    return _last_unanswered


def _tls_hint(exc: grpc.RpcError) -> str:
    """What to check after a failed TLS handshake. WRONG_VERSION_NUMBER is a plaintext
    listener answering a TLS client (STROM_SSL_* left exported), where a hint about CAs
    would send the user the wrong way."""
    if "WRONG_VERSION_NUMBER" in (exc.details() or ""):
        return (
            "the server does not speak TLS: it is a plaintext listener; drop --ssl-cafile, "
            "--ssl-certfile and --ssl-keyfile (or unset STROM_SSL_CAFILE, STROM_SSL_CERTFILE "
            "and STROM_SSL_KEYFILE) to reach it"
        )
    return (
        "check --ssl-cafile is the CA that signed the servers' certificates, and that the "
        "client certificate is valid and signed by a CA they trust"
    )


def _all_closed(errors: Sequence[str]) -> bool:
    """Every one of these unreachable-node lines is a connection the node closed."""
    return all(e.endswith("Socket closed") for e in errors)


def connection_hint(security: ChannelSecurity) -> str:
    """What to check when every node closes the connection at once, as a TLS listener does
    to a plaintext client or (with mTLS) to one without a certificate, or with one it does
    not accept: the client checks its certificate's dates and key itself
    (:meth:`ChannelSecurity.from_files`), but not who signed it, and the server does not say
    why it closed the connection."""
    if not security.tls:
        return (
            "; if the cluster requires TLS, pass --ssl-cafile (or set STROM_SSL_CAFILE, or "
            "ssl_cafile=)"
        )
    if security.cert is None:
        return (
            "; if the cluster requires client certificates (mTLS), pass --ssl-certfile and "
            "--ssl-keyfile (or set STROM_SSL_CERTFILE and STROM_SSL_KEYFILE, or "
            "ssl_certfile= and ssl_keyfile=)"
        )
    return (
        "; if the cluster requires client certificates (mTLS), it refused this one: check "
        "that it is signed by a CA the servers trust (their --tls-ca) and valid by their "
        "clock (not expired)"
    )


_addr = node_address

#: The longest one lookup call (Metadata while looking for the active controller between
#: attempts, FindCoordinator) may take: the answer is small (nodes and controller, or a
#: coordinator's address), so a node that takes longer is hung, and the next one is asked
#: instead.
DISCOVERY_TIMEOUT_S = 5.0

#: How long a lookup (Metadata, FindCoordinator) waits for the node it asked before asking
#: the next one as well (the first answer wins). A node answers both from memory in
#: milliseconds; one that has not answered in this time is hung or overloaded, and a client
#: (a producer's sender, a group consumer's first poll, an admin call with a short timeout)
#: must not wait out a whole attempt on it while other nodes could answer (Kafka sends
#: metadata requests to the least-loaded node).
LOOKUP_HEDGE_S = 0.5

#: The shortest deadline an attempt is given, so that the last attempt before the overall
#: deadline still has time to reach a server that answers at once.
MIN_ATTEMPT_S = 0.05


def attempt_timeout(timeout_s: float, deadline: float) -> float:
    """An attempt's deadline: ``timeout_s`` or what is left until ``deadline`` (the call's),
    whichever is less (never below :data:`MIN_ATTEMPT_S`). Every client call that retries
    uses it, so each attempt at a server that hangs ends in time for the call to go on to
    the server that took over (DESIGN §8) instead of spending the call's budget on it."""
    return max(MIN_ATTEMPT_S, min(timeout_s, deadline - time.monotonic()))


#: Why an admin call failed when the storage nodes answer but name no active controller.
NO_CONTROLLER = (
    "the storage nodes know of no active controller (every controller is down, or one is "
    "being elected); producing and consuming go on, but admin requests need a controller"
)


class Hedged(NamedTuple):
    """What one hedged pass over the nodes (:meth:`ClusterClient._ask_hedged`) got."""

    #: The first answer accepted; None when no node gave one.
    answer: Any
    #: The calls that failed, in the order they ended, and the nodes they went to.
    errors: list[grpc.RpcError]
    failed: list[str]
    #: The nodes that answered with something not accepted (the next node was asked).
    declined: list[str]

    def raise_refusal(self) -> None:
        """Raise what a failure no other node can mend means: the server refused the
        caller (the error for that refusal), or TLS could not be set up with it
        (AuthenticationError with what to check). A hedged pass stops at either."""
        for addr, exc in zip(self.failed, self.errors, strict=True):
            if exc.code() in REFUSED_CODES:
                raise refused(exc) from None
            if tls_handshake_failed(exc):
                raise AuthenticationError(
                    f"TLS with {addr} failed: {unreachable(exc)} ({_tls_hint(exc)})"
                ) from None

    def failures(self) -> list[str]:
        """One ``address: what its dialling met`` line per failed call."""
        return [f"{a}: {unreachable(e)}" for a, e in zip(self.failed, self.errors, strict=True)]


class ClusterClient:
    """Channels to the cluster's nodes and controller, shared by one process's clients.

    ``timeout_s`` bounds one attempt of an RPC and ``retry_s`` how long a call goes on
    retrying (Kafka's ``request.timeout.ms`` and ``default.api.timeout.ms``); in
    :meth:`controller_call` an attempt gets ``timeout_s`` or what is left of ``retry_s``,
    whichever is less, so the call ends by ``retry_s``.
    """

    def __init__(
        self,
        bootstrap: str | Sequence[str] | None,
        *,
        timeout_s: float = 10.0,
        retry_s: float = 15.0,
        client_id: str | None = None,
        security: ChannelSecurity | None = None,
        retry_backoff_s: float = 0.1,
        retry_backoff_max_s: float = 1.0,
    ) -> None:
        self.bootstrap = parse_bootstrap(bootstrap)
        #: TLS and token settings of every channel (default: STROM_SSL_* / STROM_TOKEN from
        #: the environment, else the process's: plaintext unless a service configured TLS).
        self.security = security or client_security()
        self.timeout_s = timeout_s
        self.retry_s = retry_s
        # Sent as the gRPC user agent, so a server (and its access logs) can tell which
        # application a connection belongs to, as Kafka's client.id does.
        self.client_id = client_id
        forks.track(self)
        self._channels: dict[str, grpc.Channel] = {}
        self._lock = threading.Lock()
        self._metadata: storage_pb2.MetadataResponse | None = None
        #: Addresses of the nodes the last Metadata answer listed (tried before bootstrap).
        self._known: list[str] = []
        #: Whether the bootstrap names were looked up after a pass nobody answered.
        self._resolvable_checked = False
        self._unresolvable: InvalidConfigError | None = None
        self._controller_addr: str | None = None
        #: Nodes that failed or were slow to answer Metadata (address -> when), asked after
        #: the others until they answer again: a hung node is not asked first every time.
        self._demoted: dict[str, float] = {}
        #: Passes over the nodes in a row, across calls, in which every node closed the
        #: connection (see :meth:`metadata`); 0 again once one answers.
        self._closed_passes = 0
        #: Topics, partition counts and leaders, shared by every client on this connection
        #: (Producer, Consumer, Admin, Spark tasks of one process): strom.client.metadata.
        self.cache = MetadataCache(
            self,
            metadata_timeout_s=min(timeout_s, 5.0),
            backoff_s=retry_backoff_s,
            backoff_max_s=retry_backoff_max_s,
        )

    def close(self) -> None:
        if self._forked_from:  # (the channels, and maybe this lock, are the parent's)
            self._channels = {}
            return
        with self._lock:
            for ch in self._channels.values():
                ch.close()
            self._channels.clear()

    def __enter__(self) -> ClusterClient:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    def channel(self, address: str) -> grpc.Channel:
        if self._forked_from:  # every call dials through here (strom.client.forks)
            raise forks.error(self)
        with self._lock:
            ch = self._channels.get(address)
            if ch is None:
                options = list(GRPC_OPTIONS)
                if self.client_id:
                    options.append(("grpc.primary_user_agent", self.client_id))
                ch = self.security.channel(address, options)
                self._channels[address] = ch
            return ch

    def forget_channel(self, address: str) -> None:
        """Dial ``address`` afresh next time. A channel whose peer died waits out its
        reconnect backoff (up to 1 s with strom.grpc_options; gRPC's default grows to 120 s)
        and fails calls meanwhile, even once a process is back on that address (a restarted
        controller that is now the active one). Closed
        at once: gRPC shares a subchannel, and its backoff, between open channels to the
        same target, so a new channel beside the old one would wait just the same. (A call
        still running on it ends CANCELLED and is retried like UNAVAILABLE.)"""
        with self._lock:
            ch = self._channels.pop(address, None)
        if ch is not None:
            ch.close()

    def storage(self, address: str) -> storage_pb2_grpc.StorageServiceStub:
        return storage_pb2_grpc.StorageServiceStub(self.channel(address))

    # -- metadata --------------------------------------------------------------------------

    def _candidates(self) -> list[str]:
        """The nodes to ask, in order: those the last Metadata answer listed, then the
        bootstrap list; nodes that lately failed or were slow to answer come last (the one
        that failed longest ago first among them), as Kafka's least-loaded node choice
        tries a node that just timed out last, so a hung node is not asked first by every
        lookup."""
        order = list(dict.fromkeys([*self._known, *self.bootstrap]))
        with self._lock:
            demoted = dict(self._demoted)
        if not demoted:
            return order
        healthy = [a for a in order if a not in demoted]
        return healthy + sorted((a for a in order if a in demoted), key=demoted.__getitem__)

    def _check_resolvable(self) -> None:
        """Raise at once when no bootstrap host resolves (before any node answered: only
        the bootstrap list is asked then), as Kafka's clients refuse "no resolvable bootstrap
        urls": retrying cannot help a name that does not exist. Checked once per client; a
        name that resolves (even to a host that does not answer yet) keeps the retries."""
        if self._resolvable_checked:
            if self._unresolvable is not None:
                raise self._unresolvable
            return
        self._resolvable_checked = True
        failures = []
        for address in self.bootstrap:
            host = address.rpartition(":")[0].strip("[]")
            try:
                socket.getaddrinfo(host, None)
            except (OSError, UnicodeError) as exc:  # socket.gaierror is an OSError
                failures.append(f"{host} ({getattr(exc, 'strerror', None) or exc})")
            else:
                return
        self._unresolvable = InvalidConfigError(
            "no bootstrap address resolves: " + ", ".join(failures), retriable=False
        )
        raise self._unresolvable

    def demote(self, address: str) -> None:
        """Ask ``address`` after the other nodes until it answers again (it failed a call,
        or did not answer in time)."""
        with self._lock:
            self._demoted[address] = time.monotonic()

    def demoted(self, address: str) -> bool:
        """Whether ``address`` failed lately and is asked after the other nodes."""
        return address in self._demoted

    def _promote(self, address: str) -> None:
        if self._demoted:
            with self._lock:
                self._demoted.pop(address, None)

    def _ask_hedged(
        self,
        candidates: Sequence[str],
        method: str,
        req: Any,
        timeout_s: float,
        accept: Callable[[Any], bool] | None = None,
    ) -> Hedged:
        """One pass of a lookup (StorageService ``method``: Metadata, FindCoordinator) over
        ``candidates``: the first node is asked; the next one too when it fails, answers
        with something ``accept`` refuses, or has not answered within
        :data:`LOOKUP_HEDGE_S`; the first accepted answer wins. A node that failed, or was
        still silent when another answered, is demoted (:meth:`demote`); one that answers is
        promoted again. The pass stops at a refusal or a failed TLS handshake (asking others
        cannot help; :meth:`Hedged.raise_refusal` raises it).

        Why hedged rather than one node after the other: a hung node (SIGSTOP, a long GC
        pause, a network partition) answers nothing, so only the attempt's deadline ends the
        call to it, and the caller (a producer's sender thread, a group consumer's first
        poll, an admin call with a few seconds' timeout) would wait all of it although the
        other nodes could answer at once."""
        answers: queue.SimpleQueue[tuple[str, grpc.Future]] = queue.SimpleQueue()
        waiting = list(candidates)
        asked: dict[str, grpc.Future] = {}
        out = Hedged(None, [], [], [])

        def ask_next() -> None:
            addr = waiting.pop(0)
            fut = getattr(self.storage(addr), method).future(req, timeout=timeout_s)
            asked[addr] = fut
            fut.add_done_callback(lambda f, a=addr: answers.put((a, f)))

        try:
            ask_next()
            pending = 1
            while pending:
                try:
                    addr, fut = answers.get(
                        timeout=LOOKUP_HEDGE_S if waiting else timeout_s + LOOKUP_HEDGE_S
                    )
                except queue.Empty:
                    if not waiting:
                        break  # (gRPC ends every call by its deadline: not expected)
                    ask_next()
                    pending += 1
                    continue
                pending -= 1
                outcome = self._settle(addr, fut, out, accept)
                if outcome == "answer":
                    for other, f in asked.items():
                        if not f.done():
                            self.demote(other)
                    return out._replace(answer=fut.result())
                if outcome == "stop":
                    break  # (raised by the caller: asking others cannot help)
                if waiting and pending == 0:
                    ask_next()
                    pending += 1
        finally:
            for f in asked.values():
                f.cancel()  # (no-op for those done)
        return out

    def _settle(
        self, addr: str, fut: grpc.Future, out: Hedged, accept: Callable[[Any], bool] | None
    ) -> Literal["answer", "next", "stop"]:
        """What ``addr``'s finished call means for the pass: the answer; or noted in ``out``
        as declined (it answered: promoted all the same) or failed (the node demoted), and
        the pass goes on, or stops at a failure no other node can mend."""
        exc = fut.exception()
        if exc is None:
            self._promote(addr)
            if accept is None or accept(fut.result()):
                return "answer"
            out.declined.append(addr)
            return "next"
        assert isinstance(exc, grpc.RpcError)
        self.demote(addr)
        out.errors.append(exc)
        out.failed.append(addr)
        return "stop" if exc.code() in REFUSED_CODES or tls_handshake_failed(exc) else "next"

    def metadata(
        self,
        topics: Sequence[str] | None = None,
        *,
        refresh: bool = True,
        retry_s: float | None = None,
        timeout_s: float | None = None,
        skip_topics: bool = False,
        avoid: Collection[str] = (),
    ) -> storage_pb2.MetadataResponse:
        """Cluster metadata from the first node that answers (known nodes, then bootstrap),
        trying them again for ``retry_s`` (default: the client's; 0 = one pass).
        ``skip_topics`` asks for the nodes and the controller only (a cheap lookup).
        ``avoid``: addresses not to ask (a node whose own view is in doubt: a consumer
        checking that a leader that only answers empty fetches still leads asks the others,
        see strom.client.fetch_overdue.QUIET_RECHECK_S); BrokerNotAvailableError when no
        other node is known. Compared as strings: a bootstrap alias of an avoided node (a
        k8s Service) is still asked and may answer with its stale view (accepted)."""
        if not refresh and self._metadata is not None and topics is None and not skip_topics:
            return self._metadata
        if avoid and not [a for a in self._candidates() if a not in avoid]:
            raise BrokerNotAvailableError(
                "no strom node to ask other than " + ", ".join(sorted(avoid))
            )
        global _last_unanswered
        req = storage_pb2.MetadataRequest(topics=list(topics or []), skip_topics=skip_topics)
        errors: list[str] = []
        deadline = time.monotonic() + (self.retry_s if retry_s is None else retry_s)
        while True:
            candidates = [a for a in self._candidates() if a not in avoid]
            done = self._ask_hedged(
                candidates, "Metadata", req, self.timeout_s if timeout_s is None else timeout_s
            )
            done.raise_refusal()
            errors.extend(done.failures())
            resp = done.answer
            if resp is not None:
                _last_unanswered = None
                self._closed_passes = 0
                if not topics and not skip_topics:
                    self._metadata = resp
                if resp.nodes:
                    self._known = [_addr(n) for n in resp.nodes]
                if resp.HasField("controller") and resp.controller.port:
                    self._controller_addr = _addr(resp.controller)
                return resp
            passed = errors[-len(candidates) :]
            closed = len(passed) == len(candidates) and _all_closed(passed)
            _last_unanswered = "; ".join(passed[-3:]) + (
                connection_hint(self.security) if closed else ""
            )
            # Counted on the client, not in this call: the admin calls look for the
            # controller with one pass per call (controller_call, retry_s=0), so a count of
            # this call's passes would never reach two.
            self._closed_passes = self._closed_passes + 1 if closed else 0
            if not self._known:
                self._check_resolvable()
            if self._closed_passes >= 2 and self.security.tls:
                # Every node, twice over, completed the TLS handshake and closed the
                # connection: how a server requiring client certificates (mTLS) refuses a
                # client without one, or with one it does not trust. Retrying the same
                # settings cannot help, so this ends at once as Kafka's SSL authentication
                # failure does.
                raise AuthenticationError(
                    "every strom node at " + ", ".join(candidates) + " closed the connection "
                    "after the TLS handshake" + connection_hint(self.security)
                )
            if time.monotonic() >= deadline:
                raise BrokerNotAvailableError(
                    "no strom node answered at "
                    + ", ".join(self._candidates())
                    + f" ({'; '.join(errors[-3:])})"
                    + (
                        connection_hint(self.security)
                        if errors and _all_closed(errors[-3:])
                        else ""
                    )
                )
            time.sleep(0.2)

    def find_coordinator(
        self,
        key: str,
        key_type: int = storage_pb2.COORDINATOR_TYPE_GROUP,
        *,
        timeout_s: float | None = None,
    ) -> str:
        """Address of the coordinator owning ``key`` (a group id, or a transactional id with
        COORDINATOR_TYPE_TRANSACTION): FindCoordinator on the first node that answers (one
        hedged pass, as Metadata: :meth:`_ask_hedged`). Raises CoordinatorNotAvailableError
        (retriable) while no coordinator owns the key's shard or no node answers, and the
        error for any other refusal."""
        req = storage_pb2.FindCoordinatorRequest(key_type=key_type, keys=[key])  # type: ignore[arg-type]
        done = self._ask_hedged(
            self._candidates(), "FindCoordinator", req, self._lookup_timeout(timeout_s)
        )
        done.raise_refusal()  # not "no coordinator yet": never retried
        what = "group" if key_type == storage_pb2.COORDINATOR_TYPE_GROUP else "transactional id"
        if done.answer is None:
            if not self._known:
                self._check_resolvable()
            last = "; ".join(done.failures()) or "no node answered"
            raise CoordinatorNotAvailableError(f"no coordinator for {what} {key!r}: {last}")
        c = done.answer.coordinators[0]
        if c.error_code == NONE:
            return _addr(c.node)
        if c.error_code not in COORDINATOR_REFRESH_CODES:
            raise error_for(c.error_code, c.error_message)
        last = c.error_message or "no coordinator"
        raise CoordinatorNotAvailableError(f"no coordinator for {what} {key!r}: {last}")

    def _lookup_timeout(self, timeout_s: float | None) -> float:
        """One FindCoordinator call's deadline: ``timeout_s`` (default: the client's), at
        most :data:`DISCOVERY_TIMEOUT_S` (a small answer from memory)."""
        return min(self.timeout_s if timeout_s is None else timeout_s, DISCOVERY_TIMEOUT_S)

    def coordinator_shards(
        self, key_type: int = storage_pb2.COORDINATOR_TYPE_GROUP
    ) -> dict[int, str | None]:
        """Every shard of the group (or transaction) coordinators and its owner's address,
        None for a shard without one right now: FindCoordinator(all_shards) on the first node
        that answers (one hedged pass: :meth:`_ask_hedged`), for listings that fan out to
        every coordinator. Unlike DescribeCluster it needs no DESCRIBE on the cluster (found
        from outside: `strom groups list` refused principals the ListGroups filter would
        have answered). BrokerNotAvailableError when no node answers.

        A node older than this client ignores all_shards and answers no entry at all, as a
        node of this version does before any coordinator ran. So an empty answer sends
        the question to the next node, and when every node that answered had nothing, to the
        controller's DescribeCluster (which older versions answer too, but which needs
        DESCRIBE on the cluster; it lists owned shards only). Empty when DescribeCluster has
        no shard either (no coordinator ran); CoordinatorNotAvailableError, saying the nodes
        may be older than this client, when it cannot be asked."""
        req = storage_pb2.FindCoordinatorRequest(key_type=key_type, all_shards=True)  # type: ignore[arg-type]
        done = self._ask_hedged(
            self._candidates(),
            "FindCoordinator",
            req,
            self._lookup_timeout(None),
            accept=lambda resp: bool(resp.coordinators),
        )
        done.raise_refusal()
        if done.answer is not None:
            return {
                c.shard: _addr(c.node) if c.error_code == NONE else None
                for c in done.answer.coordinators
            }
        if not done.declined:
            last = "; ".join(done.failures()) or "no node answered"
            raise BrokerNotAvailableError(f"no strom node answered FindCoordinator ({last})")
        return self._described_shards(key_type, done.declined)

    def _described_shards(self, key_type: int, empty: list[str]) -> dict[int, str | None]:
        """The owned shards in the controller's DescribeCluster, asked when the nodes
        ``empty`` answered FindCoordinator(all_shards) with none (see
        :meth:`coordinator_shards`)."""
        try:
            desc = self.controller_call(
                "DescribeCluster", controller_pb2.DescribeClusterRequest(include_coordinators=True)
            )
        except StromError as exc:
            raise CoordinatorNotAvailableError(
                "no coordinator shards found: "
                + ", ".join(empty)
                + " answered FindCoordinator(all_shards) with none, as nodes older than this "
                "client do (they ignore all_shards; or no coordinator has run yet), and the "
                f"controller's DescribeCluster, asked instead, failed: {exc}"
            ) from None
        txn = key_type == storage_pb2.COORDINATOR_TYPE_TRANSACTION
        owned = desc.transaction_shards if txn else desc.coordinator_shards
        return {o.shard: f"{o.host}:{o.port}" for o in owned}

    def topic_metadata(self, topic: str, *, refresh: bool = True) -> Any:
        """The topic's entry in the nodes' metadata (see :meth:`MetadataCache.topic`)."""
        return self.cache.topic(topic, refresh=refresh)

    def leader_of(self, topic: str, partition: int, *, refresh: bool = False) -> str:
        """Address of the partition's leader; raises a StromError naming the problem."""
        return self.cache.leader_of(topic, partition, refresh=refresh)

    def partition_count(self, topic: str) -> int:
        return len(self.topic_metadata(topic).partitions)

    # -- controller ------------------------------------------------------------------------

    def controller_call(
        self,
        method: str,
        request: Any,
        *,
        timeout_s: float | None = None,
        retry_s: float | None = None,
    ) -> Any:
        """Call a ControllerService RPC on the active controller, following NOT_CONTROLLER
        redirects and retrying while no controller is active, for up to ``retry_s`` overall
        (default: the client's), each attempt for up to ``timeout_s`` (default: the
        client's) or what is left of ``retry_s``.

        Why two budgets: a controller that hangs (SIGSTOP, a long GC pause, a network
        partition) answers nothing, so only an attempt's deadline ends the call to it; by
        then a standby has usually taken over (the election key's lease is a few seconds).
        An attempt that took the whole budget left no time to ask the new one (found from
        outside). Between attempts the nodes are asked which controller is active, each
        lookup for at most :data:`DISCOVERY_TIMEOUT_S`, so a hung node costs little. They are
        asked after every refusal without a hint and every retriable error too, never the
        same controller again on trust alone: a controller cut off from etcd refuses (or
        cannot write) while the nodes already name its successor.
        """
        attempt_s = self.timeout_s if timeout_s is None else timeout_s
        budget_s = self.retry_s if retry_s is None else retry_s
        deadline = time.monotonic() + budget_s
        last = ""
        unreached: StromError | None = None  # no node answered Metadata at all
        while True:
            addr = self._controller_addr
            if addr is None:
                try:
                    self.metadata(
                        skip_topics=True,
                        retry_s=0.0,
                        timeout_s=attempt_timeout(min(attempt_s, DISCOVERY_TIMEOUT_S), deadline),
                    )
                    unreached = None
                except (AuthenticationError, AuthorizationError, InvalidConfigError):
                    raise
                except StromError as exc:
                    last, unreached = str(exc), exc
                addr = self._controller_addr
                if addr is None and unreached is None:
                    last = NO_CONTROLLER
            if addr is not None:
                stub = controller_pb2_grpc.ControllerServiceStub(self.channel(addr))
                try:
                    resp = getattr(stub, method)(
                        request, timeout=attempt_timeout(attempt_s, deadline)
                    )
                except grpc.RpcError as exc:
                    if exc.code() in REFUSED_CODES:
                        raise refused(exc) from None
                    if (old := older_node(exc, f"controller {addr}", method)) is not None:
                        raise old from None  # not a controller to retry or look for again
                    last = f"controller {addr}: {exc.code().name} {exc.details() or ''}".strip()
                    self._controller_addr = None
                    if exc.code() == grpc.StatusCode.UNAVAILABLE:
                        self.forget_channel(addr)
                else:
                    if resp.error_code == NOT_CONTROLLER:
                        hint = resp.controller if resp.HasField("controller") else None
                        self._controller_addr = _addr(hint) if hint and hint.port else None
                        last = f"{addr} is not the active controller"
                    elif resp.error_code != NONE and is_retriable(resp.error_code):
                        # Ask the nodes again before the next attempt: the controller may be
                        # cut off from etcd ("etcd did not answer") while a standby that can
                        # reach it has taken over; kept, this address is all we would ask.
                        last = f"controller {addr}: {resp.error_message}"
                        self._controller_addr = None
                    else:
                        if resp.error_code != NONE:
                            raise error_for(resp.error_code, resp.error_message)
                        return resp
            if time.monotonic() >= deadline:
                if unreached is not None:
                    raise unreached
                raise BrokerNotAvailableError(
                    f"no active controller answered within {budget_s:g} s: "
                    + (last or NO_CONTROLLER)
                )
            time.sleep(0.1)

    def with_leader(
        self,
        topic: str,
        partition: int,
        call: Callable[[storage_pb2_grpc.StorageServiceStub], T],
        retriable: Callable[[T], bool],
    ) -> T:
        """Run ``call`` against the leader, refreshing metadata and retrying while the result
        says the leader moved (``retriable``) or the node is unreachable."""
        deadline = time.monotonic() + self.retry_s
        refresh = False
        while True:
            try:
                addr = self.leader_of(topic, partition, refresh=refresh)
            except StromError as exc:
                # A leader election in progress: wait for the new leader rather than fail.
                if not exc.retriable or time.monotonic() >= deadline:
                    raise
                refresh = True
                time.sleep(0.1)
                continue
            try:
                result = call(self.storage(addr))
            except grpc.RpcError as exc:
                if exc.code() not in (
                    grpc.StatusCode.UNAVAILABLE,
                    grpc.StatusCode.DEADLINE_EXCEEDED,
                ):
                    raise
                if time.monotonic() >= deadline:
                    raise BrokerNotAvailableError(
                        f"leader {addr} unreachable: {exc.code().name}"
                    ) from None
            else:
                if not retriable(result) or time.monotonic() >= deadline:
                    return result
            refresh = True
            time.sleep(0.1)
