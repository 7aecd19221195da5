"""What every area of the Admin client calls through: the controller, the partition leaders.

:class:`AdminCalls` is the base of the mixins :class:`strom.client.admin.Admin` is made of
(one module per area: topics, configs, cluster, records, transactions, reassignments,
groups). It holds the helpers they share, so that no area imports another: the open check,
the servers' share of an attempt's budget, a controller call with the client's timeouts, and
the fan-out of a request to each partition's leader with its retries.
"""

from __future__ import annotations

import time
from collections.abc import Callable, Iterable, Mapping
from typing import Any, TypeVar

import grpc

from strom.client import forks
from strom.client.admin_requests import NONE, partition_error, raise_partial, with_context
from strom.client.cluster import ClusterClient, attempt_timeout, older_node
from strom.client.types import TopicPartition
from strom.errors import BrokerNotAvailableError, StromError, UnknownServerError, is_retriable

T = TypeVar("T")


class AdminCalls:
    """The connection and the call helpers the Admin client's areas share.

    Every attribute is set by ``Admin.__init__`` (``_forked_from`` by
    :func:`strom.client.forks.track`); the annotations say which ones the helpers use.
    """

    # -- set by Admin.__init__ -------------------------------------------------------------
    request_timeout_ms: int
    default_api_timeout_ms: int
    _client: ClusterClient
    _closed: bool
    _forked_from: int

    # The servers' own waits (e.g. for a deletion to reach every replica) get part of an
    # attempt's budget, so they answer before this client's deadline cuts the attempt.
    @property
    def _server_wait_ms(self) -> int:
        return max(1, self.request_timeout_ms * 4 // 5)

    def _ensure_open(self) -> None:
        if self._forked_from:
            raise forks.error(self)
        if self._closed:
            raise StromError("the Admin client is closed")

    def _controller(self, method: str, request: Any) -> Any:
        self._ensure_open()
        return self._client.controller_call(
            method,
            request,
            timeout_s=self.request_timeout_ms / 1000,
            retry_s=self.default_api_timeout_ms / 1000,
        )

    def _per_leader(
        self,
        wanted: Mapping[TopicPartition, int],
        method: str,
        request: Callable[[Mapping[TopicPartition, int]], Any],
        results: Callable[[Any], Iterable[tuple[TopicPartition, int, str, T]]],
    ) -> dict[TopicPartition, T]:
        """Send one request per partition leader (concurrently), and retry the partitions
        whose leader moved, is not known yet or did not answer, until the call's overall
        timeout; raise the first partition that still failed, in the caller's order, as a
        PartialResultError that also carries every partition's result or error.

        Each attempt gets ``request_timeout_ms`` (or what is left of the overall timeout): a
        leader that hangs is given up on in time to ask the metadata again and retry at the
        replica that took over."""
        self._ensure_open()
        client = self._client
        attempt_s = self.request_timeout_ms / 1000
        deadline = time.monotonic() + self.default_api_timeout_ms / 1000
        done: dict[TopicPartition, T] = {}
        failed: dict[TopicPartition, StromError] = {}
        pending = dict(wanted)
        refresh = False
        while pending:
            last_round = time.monotonic() >= deadline
            retry: dict[TopicPartition, StromError] = {}
            groups: dict[str, dict[TopicPartition, int]] = {}
            # One metadata lookup per topic (an unknown topic fails all its partitions at once).
            topic_errors: dict[str, StromError] = {}
            for topic in dict.fromkeys(tp.topic for tp in pending):
                try:
                    # Fills the client's metadata cache (strom.client.metadata).
                    client.topic_metadata(topic, refresh=refresh)
                except StromError as exc:
                    topic_errors[topic] = exc
            for tp, arg in pending.items():
                error = topic_errors.get(tp.topic)
                if error is None:
                    try:
                        addr = client.leader_of(tp.topic, tp.partition)
                    except StromError as exc:
                        error = exc
                    else:
                        groups.setdefault(addr, {})[tp] = arg
                        continue
                err = with_context(error, f"{tp.topic}-{tp.partition}")
                if error.retriable and not last_round:
                    retry[tp] = err
                else:
                    failed[tp] = err
            timeout = attempt_timeout(attempt_s, deadline)
            calls = {
                addr: getattr(client.storage(addr), method).future(request(group), timeout=timeout)
                for addr, group in groups.items()
            }
            for addr, call in calls.items():
                group = groups[addr]
                try:
                    resp = call.result()
                except grpc.RpcError as exc:
                    code = exc.code()
                    transient = code in (
                        grpc.StatusCode.UNAVAILABLE,
                        grpc.StatusCode.DEADLINE_EXCEEDED,
                    )
                    cls = BrokerNotAvailableError if transient else UnknownServerError
                    old = older_node(exc, addr, method)
                    for tp in group:
                        if old is not None:
                            err = with_context(old, f"{tp.topic}-{tp.partition}")
                        else:
                            err = cls(
                                f"{tp.topic}-{tp.partition}: {method} at leader {addr} failed: "
                                f"{code.name} {exc.details() or ''}".rstrip()
                            )
                        if transient and not last_round:
                            retry[tp] = err
                        else:
                            failed[tp] = err
                    continue
                answered: set[TopicPartition] = set()
                for tp, code, message, value in results(resp):
                    if tp not in group:
                        continue
                    answered.add(tp)
                    if code == NONE:
                        done[tp] = value
                    elif is_retriable(code) and not last_round:
                        retry[tp] = partition_error(code, message, tp)
                    else:
                        failed[tp] = partition_error(code, message, tp)
                for tp in group.keys() - answered:
                    failed[tp] = UnknownServerError(
                        f"{tp.topic}-{tp.partition}: leader {addr} did not answer for it"
                    )
            pending = {tp: wanted[tp] for tp in retry}
            if pending:
                if time.monotonic() >= deadline:
                    failed.update(retry)
                    break
                refresh = True
                time.sleep(0.1)
        raise_partial(wanted, done, failed)
        return {tp: done[tp] for tp in wanted}
