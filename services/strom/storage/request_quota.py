"""The request quota (``requests_per_second``) for a storage node's RPCs that move no record
bytes: Metadata, InitProducerId, FindCoordinator, ListOffsets, OffsetForLeaderEpoch,
DeleteRecords and DescribeProducers. Produce and Fetch count their request with their bytes
(:func:`strom.storage.rpc_base._throttle`).

Only Produce and Fetch were counted, so a principal with a 2/s
request quota made 20 InitProducerId calls (each may take a producer id from a block the
controller reserves in etcd) in 0.5 s. Kafka's request quota covers every request; so does
this one now, with the model the byte quotas use: a call of a principal still ahead of its
rate waits, before it is served, until it has paid (a call that gives up meanwhile has had
nothing done and is not charged), then counts one request, and its answer is held while the
principal is over its rate (at most quotas.MAX_THROTTLE_S). The services' own calls are not
charged (QuotaManager.exempt).
"""

from __future__ import annotations

import functools
from collections.abc import Awaitable, Callable
from typing import Any, TypeVar

from strom.security import QUOTAS
from strom.storage.rpc_base import _throttle, _wait_out_debt

R = TypeVar("R")

Handler = Callable[[Any, Any, Any], Awaitable[R]]


def counted_request(handler: Handler[R]) -> Handler[R]:
    """``handler`` (a unary RPC method) counted against its caller's request quota."""

    @functools.wraps(handler)
    async def counted(self: Any, request: Any, context: Any) -> R:
        if not QUOTAS.active:
            return await handler(self, request, context)
        waited = await _wait_out_debt("requests")
        response = await handler(self, request, context)
        await _throttle("requests", 0, waited, context)  # never past the call's deadline
        return response

    return counted
